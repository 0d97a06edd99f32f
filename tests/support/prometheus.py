"""A real Prometheus and node exporter beside a test on this machine, as its own
processes: Debian's binaries from the nspawn hosts' package repository (the same
packages the monitoring role installs there), unpacked into the cache, not installed.

    with watching(textfile_dir, rules) as prom:   # node exporter's textfile collector
        prom.query('zenvllm_placement_ok == 0')

The node exporter reads only the textfile directory; Prometheus scrapes it every
second (labelled host="localhost", as the monitoring role labels a host) and evaluates
the given rules every second.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import subprocess
import tempfile
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import yaml
from support import engine, nspawn

PACKAGES = ("prometheus", "prometheus-node-exporter")


def unpacked() -> Path:
    """Debian's prometheus and node exporter, unpacked once per package version."""
    repo = nspawn.ensure_rootfs() / "srv" / "localrepo"
    debs = [next(repo.glob(f"{name}_*.deb")) for name in PACKAGES]
    dest = nspawn.cache_dir().parent / ("prometheus-" + "-".join(d.stem for d in debs))
    if not dest.is_dir():
        partial = Path(tempfile.mkdtemp(dir=dest.parent, prefix=".prometheus-"))
        for deb in debs:
            subprocess.run(["dpkg-deb", "-x", str(deb), str(partial)], check=True)
        partial.rename(dest)
    return dest


class Prometheus:
    def __init__(self, url: str):
        self.url = url

    def query(self, expr: str) -> list[dict]:
        query = urllib.parse.urlencode({"query": expr})
        with urllib.request.urlopen(f"{self.url}/api/v1/query?{query}", timeout=10) as reply:
            return json.loads(reply.read())["data"]["result"]

    def wait(self, expr: str, timeout: float) -> list[dict]:
        """Until the query has a result; its result."""
        deadline = time.monotonic() + timeout
        while not (found := self.query(expr)):
            assert time.monotonic() < deadline, f"Prometheus has no {expr} after {timeout} s"
            time.sleep(0.5)
        return found


@contextlib.contextmanager
def watching(textfiles: Path, rules: str) -> Iterator[Prometheus]:
    root = unpacked()
    with tempfile.TemporaryDirectory(prefix="zenvllm-prometheus-") as work:
        node_port, port = engine.free_port(), engine.free_port()
        (Path(work) / "rules.yml").write_text(rules)
        config = {
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "rule_files": [str(Path(work) / "rules.yml")],
            "scrape_configs": [
                {
                    "job_name": "node",
                    "static_configs": [
                        {"targets": [f"127.0.0.1:{node_port}"], "labels": {"host": "localhost"}}
                    ],
                }
            ],
        }
        (Path(work) / "prometheus.yml").write_text(yaml.safe_dump(config))
        log = open(Path(work) / "log", "w")  # noqa: SIM115 (both processes write it until the end)
        node = subprocess.Popen(
            [
                str(root / "usr/bin/prometheus-node-exporter"),
                "--collector.disable-defaults",
                "--collector.textfile",
                f"--collector.textfile.directory={textfiles}",
                f"--web.listen-address=127.0.0.1:{node_port}",
            ],
            stdout=log,
            stderr=log,
        )
        server = subprocess.Popen(
            [
                str(root / "usr/bin/prometheus"),
                f"--config.file={work}/prometheus.yml",
                f"--storage.tsdb.path={work}/data",
                f"--web.listen-address=127.0.0.1:{port}",
            ],
            stdout=log,
            stderr=log,
        )
        prom = Prometheus(f"http://127.0.0.1:{port}")
        try:
            deadline = time.monotonic() + 60
            while True:
                try:
                    prom.wait('up{job="node"} == 1', 1)
                    break
                except (OSError, AssertionError):
                    if time.monotonic() > deadline or server.poll() is not None:
                        log.flush()
                        raise AssertionError(Path(work, "log").read_text()[-3000:]) from None
                    time.sleep(0.5)
            yield prom
        finally:
            for process in (server, node):
                process.terminate()
                process.wait(30)
            log.close()
            shutil.rmtree(Path(work) / "data", ignore_errors=True)
