"""A client of a closed gateway: its generated key and CA from the controller's secrets;
and this machine's nginx left as a test found it."""

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


def key(deployment: str, client: str = "default") -> str:
    return (SECRETS / deployment / "keys" / client).read_text().strip()


def ca(deployment: str, host: str = "localhost") -> Path:
    return SECRETS / deployment / f"{host}-ca.pem"


def request(
    url: str,
    deployment: str,
    body: dict | None = None,
    api_key: str | None = "default",
    timeout: float = 120,
    host: str = "localhost",  # the gateway's inventory name (its CA's file)
) -> tuple[int, dict, dict]:
    """(status, headers, JSON body) of a request through the gateway; api_key is a
    client name, a literal "Bearer" value (starting with "literal:"), or None."""
    headers = {"Content-Type": "application/json"}
    if api_key is not None:
        value = (
            api_key.removeprefix("literal:")
            if api_key.startswith("literal:")
            else key(deployment, api_key)
        )
        headers["Authorization"] = f"Bearer {value}"
    data = json.dumps(body).encode() if body is not None else None
    context = ssl.create_default_context(cafile=str(ca(deployment, host)))
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
