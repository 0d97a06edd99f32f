"""Stand-in workload for the nspawn hosts: answers where vLLM would, nothing more.

The nspawn tier tests provisioning (units, env files, supervision, gateway) on
real systemd hosts; running the 2.6 GB vLLM image there, twice per host, does
not fit the CI budget, so this tiny server takes the container's place and
reports what the container received. Real vLLM behind the same roles is the
end-to-end test on the machine's own engine (tests/ansible/test_e2e.py).

    server.py [--model M] [--served-model-name N] --host H --port P [...]
    GET /health        200
    GET /standin/env   the VLLM_* environment and the uid, as JSON
"""

from __future__ import annotations

import argparse
import json
import os
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class Handler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        if self.path == "/health":
            self.reply(200, b"")
        elif self.path == "/standin/env":
            env = {k: v for k, v in os.environ.items() if k.startswith(("VLLM_CPU_", "HF_HUB"))}
            body = {"env": env, "uid": os.getuid(), "argv": self.server.argv}  # type: ignore[attr-defined]
            self.reply(200, json.dumps(body).encode(), "application/json")
        else:
            self.reply(404, b"not found\n")

    def reply(self, status: int, body: bytes, kind: str = "text/plain") -> None:
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args) -> None:  # quiet: the journal needs no access log
        pass


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    args, rest = parser.parse_known_args()
    server = ThreadingHTTPServer((args.host, args.port), Handler)
    server.argv = rest  # type: ignore[attr-defined]
    server.serve_forever()


if __name__ == "__main__":
    main()
