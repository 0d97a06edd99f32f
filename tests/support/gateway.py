"""A client of a closed gateway: its generated key and CA from the controller's secrets;
this machine's nginx left as a test found it, and what its error log says."""

from __future__ import annotations

import contextlib
import json
import ssl
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

from support.ansible_run import REPO

from zenvllm.bench.gateway import nginx_master, stop_nginx

SECRETS = REPO / ".cache" / "secrets"  # ZENVLLM_SECRETS_DIR of every test playbook
NGINX_ERROR_LOG = Path("/var/log/nginx/error.log")  # Debian's nginx, as the tiers use it


def key(deployment: str, client: str = "default", secrets: Path = SECRETS) -> str:
    return (secrets / deployment / "keys" / client).read_text().strip()


def ca(deployment: str, host: str = "localhost", secrets: Path = SECRETS) -> Path:
    return secrets / deployment / f"{host}-ca.pem"


def request(
    url: str,
    deployment: str,
    body: dict | None = None,
    api_key: str | None = "default",
    timeout: float = 120,
    host: str = "localhost",  # the gateway's inventory name (its CA's file)
    secrets: Path = SECRETS,  # the controller's key store (~/.config/zenvllm for an operator)
) -> tuple[int, dict, dict]:
    """(status, headers, JSON body) of a request through the gateway; api_key is a
    client name, a literal "Bearer" value (starting with "literal:"), or None."""
    headers = {"Content-Type": "application/json"}
    if api_key is not None:
        value = (
            api_key.removeprefix("literal:")
            if api_key.startswith("literal:")
            else key(deployment, api_key, secrets)
        )
        headers["Authorization"] = f"Bearer {value}"
    data = json.dumps(body).encode() if body is not None else None
    context = ssl.create_default_context(cafile=str(ca(deployment, host, secrets)))
    req = urllib.request.Request(url, data, headers)
    try:
        with urllib.request.urlopen(req, timeout=timeout, context=context) as reply:
            return reply.status, dict(reply.headers), json.loads(reply.read() or b"{}")
    except urllib.error.HTTPError as err:
        text = err.read()
        try:
            payload = json.loads(text or b"{}")
        except ValueError:
            payload = {"raw": text.decode(errors="replace")}
        return err.code, dict(err.headers), payload


@contextlib.contextmanager
def nginx_as_found() -> Iterator[None]:
    """nginx stopped again afterwards if it was not running before: deploy.yml starts it,
    and `absent` leaves it running (it may serve others by then)."""
    ran = nginx_master() is not None
    try:
        yield
    finally:
        if not ran:
            stop_nginx()


def error_log_size() -> int:
    return NGINX_ERROR_LOG.stat().st_size if NGINX_ERROR_LOG.exists() else 0


def replies_cut(since: int, port: int) -> list[str]:
    """The error log's lines, written after offset `since`, of replies from the instance
    on `port` that it closed or reset in the middle of their body ("while reading
    upstream"). nginx relays a reply as it comes, so it cannot retry one whose headers
    it has passed on: the client sees a reply cut short. Refusals and resets before the
    headers are retried, and logged with other words ("while connecting to upstream",
    "while reading response header from upstream")."""
    with NGINX_ERROR_LOG.open("rb") as log:
        log.seek(since)
        text = log.read(16 << 20).decode(errors="replace")
    upstream = f'upstream: "http://127.0.0.1:{port}/'
    return [
        line
        for line in text.splitlines()
        if " while reading upstream," in line and upstream in line
    ]
