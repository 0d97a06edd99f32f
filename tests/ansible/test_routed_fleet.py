"""A fleet behind one endpoint, for real: deploy.yml puts vLLM's router (and the
gateway in front of it) before real vLLM instances on two hosts, a systemd-nspawn
machine and this machine, and Prometheus beside them.

    fleet-a (nspawn, systemd)            this machine (the engine's restart policy)
      gateway :8443 -> router :30000 ---> vLLM 10.231.6.1:18301
                          \\-----------> vLLM 10.231.6.11:18301 (nftables: router only)
      Prometheus :9090, node exporter

The instances listen on their host's bridge address; the only way in is the
gateway's key over TLS. The model reaches both hosts through the play itself (the
instances role's delivery: rsync from the controller, verified against its
manifest). Each "host" gets its own half of this machine's CPUs (nspawn's CPU
affinity, taskset for the plays here), as real hosts have their own cores: an
instance (re)starting beside the other host's busy vLLM on a shared core was
starved for minutes. Under load, every instance of one host is killed and a
rolling update crosses both hosts: no request may fail. Prometheus must have
every target up, its rules loaded, and data for every panel of the dashboard under
every choice of its variables. Each killed instance's alert reaches a webhook
receiver here through the role's Alertmanager, then resolves. The status playbook shows the
fleet as one table, with the router's view. Then each host serves a model of its own
(the chat model on fleet-a, an embedding model here), each behind a router of its own
and both behind the one gateway, which routes by model; the chat model's instance
killed under embedding load fails no embedding. Last, the same fleet serves one copy cut
over both hosts (vLLM's pipeline parallel): the head behind the router, the firewall
closed to strangers on its store port, and the group healing by itself after a stage
hangs and after its host's packets vanish.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import shlex
import shutil
import signal
import socket
import ssl
import subprocess
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import yaml
from conftest import REPO, require, require_tool
from support import engine, gateway, role_template, scan
from support.ansible_run import ANSIBLE_DIR, changed_tasks, planner_zipapp, playbook
from support.embedding_model import ensure_embedding_model
from support.load import STEADY, BackgroundLoad, greedy_text
from support.tiny_model import ensure_tiny_model
from support.wheels import router_wheelhouse

from zenvllm.core import group_guard
from zenvllm.core.host import GIB
from zenvllm.core.memory import node_budget
from zenvllm.core.modelfiles import Marker, parse_marker
from zenvllm.core.policy import Policy
from zenvllm.core.topology import format_cpu_list, read_host
from zenvllm.runtime import group, modelsync

pytestmark = pytest.mark.ansible

IMAGE = "zenvllm/vllm-openai:0.32.0"
DEPLOYMENT = "zenvllm-fleet"
PORT = 18301
STEP_TIMEOUT = 20  # seconds: the pipeline's step timeout here (120 in a plan)
GATEWAY_PORT = 8443
ROUTER_METRICS = 29000  # the first model's router metrics, which the test reads
SECRET = "fleet-worker-key-7c41"
ROUTER_HOST = "fleet-a"
SSH_ARGS = "-o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null -o LogLevel=ERROR"
ROLLOUT_ENV = {"ZENVLLM_ROLLOUT": "2"}  # what the rolling update changes
EXACT = {"ignore_eos": True}  # the random tiny model may end early otherwise
MONITORING = ANSIBLE_DIR / "roles/zenvllm_monitoring"
DASHBOARD = MONITORING / "files/zenvllm-fleet.json"
# An instance unit that systemd restarted this often since boot is failing, not slow.
FAULT_RESTARTS = 5
FLEET_A_MODEL_DIR = "/var/lib/zenvllm-fleet-test/model/tiny-llama"  # inside fleet-a only
WEBHOOK_PORT = 18390  # the test's own receiver of Alertmanager's webhooks, on this machine


class Webhook:
    """An operator's receiver: every JSON body Alertmanager POSTs, in order."""

    def __init__(self, address: str):
        self.received: list[dict] = []
        received = self.received

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                received.append(json.loads(body))
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer((address, WEBHOOK_PORT), Handler)
        self.url = f"http://{address}:{WEBHOOK_PORT}/alerts"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def alerts(self, status: str, alertname: str, since: float, **labels) -> list[dict]:
        """The alerts of that name and labels, started since then, in notifications of
        that status."""
        after = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(since - 2))
        return [
            alert
            for message in list(self.received)
            if message.get("status") == status
            for alert in message.get("alerts", [])
            if alert["labels"].get("alertname") == alertname
            and all(alert["labels"].get(k) == v for k, v in labels.items())
            and alert["startsAt"] >= after
        ]

    def fired_and_resolved(self, alertname: str, since: float, **labels) -> tuple[dict, float]:
        """The alert as it fired, and when its resolution arrived."""
        deadline = time.monotonic() + 120
        while not (resolved := self.alerts("resolved", alertname, since, **labels)):
            assert time.monotonic() < deadline, f"no resolved {alertname}: {self.received[-4:]}"
            time.sleep(1)
        arrived = time.time()
        firing = self.alerts("firing", alertname, since, **labels)
        assert firing and firing[0]["startsAt"] == resolved[0]["startsAt"], self.received[-4:]
        return firing[0], arrived

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class Fleet:
    def __init__(self, machine, inventory, variables, here: str, here_cpus: str, webhook):
        self.machine, self.inventory, self.variables = machine, inventory, variables
        self.webhook = webhook
        self.here_cpus = here_cpus  # the CPUs the plays (and so the planner) here see
        self.router_address = machine.address
        self.here = here  # this machine's address on the bridge
        self.url = f"https://{machine.address}:{GATEWAY_PORT}"
        self.applied: dict = {}
        self.removed = False  # the last play run removed the deployment, and passed

    def ssh(self, command: str, check: bool = True) -> subprocess.CompletedProcess:
        return subprocess.run(
            [
                "ssh",
                *SSH_ARGS.split(),
                "-i",
                str(self.machine.key),
                f"root@{self.machine.address}",
                command,
            ],
            capture_output=True,
            text=True,
            timeout=300,
            check=check,
        )

    def deploy(self, *args, **extra):
        state = extra.get("zenvllm_state", "present")
        if state == "present" and "--check" not in args:
            self.applied = extra  # what the hosts now run: a re-run with it changes nothing
        run = playbook(
            "-i",
            str(self.inventory),
            *args,
            extra_vars={**self.variables, **extra},
            cpus=self.here_cpus,
        )
        if "--check" not in args:
            self.removed = state == "absent" and run.rc == 0 and run.failed() == 0
        return run

    def openai_client(self):
        """The official OpenAI client, through the gateway with its key and CA."""
        import openai

        return openai.OpenAI(
            base_url=f"{self.url}/v1",
            api_key=gateway.key(DEPLOYMENT),
            http_client=openai.DefaultHttpxClient(
                verify=ssl.create_default_context(cafile=self.cafile())
            ),
            max_retries=0,
        )

    def status(self):
        """The status playbook's run, and its table's row of each host's instance (the
        cells of a line of the printed YAML list)."""
        run = playbook(
            "-i",
            str(self.inventory),
            extra_vars=self.variables,
            playbook_file="playbooks/status.yml",
            cpus=self.here_cpus,
        )
        rows = {}
        for line in run.output.splitlines():
            cells = line.strip().removeprefix("- ").strip("'\",").split()
            if len(cells) == 11 and cells[1] == f"{DEPLOYMENT}-0":
                rows[cells[0]] = cells
        return run, rows

    def headers(self) -> dict:
        return {"Authorization": f"Bearer {gateway.key(DEPLOYMENT)}"}

    def cafile(self) -> str:
        return str(gateway.ca(DEPLOYMENT, ROUTER_HOST))

    def get(self, url: str, timeout: float = 10) -> tuple[int, str]:
        context = (
            ssl.create_default_context(cafile=self.cafile()) if url.startswith("https") else None
        )
        try:
            with urllib.request.urlopen(url, timeout=timeout, context=context) as reply:
                return reply.status, reply.read().decode()
        except urllib.error.HTTPError as err:
            return err.code, err.read().decode(errors="replace")

    def prometheus(self, path: str) -> dict:
        status, text = self.get(f"http://{self.router_address}:9090{path}")
        assert status == 200, text
        return json.loads(text)["data"]

    def query(self, expr: str) -> list:
        return self.prometheus(f"/api/v1/query?{urllib.parse.urlencode({'query': expr})}")["result"]

    def router_state(self, what: str) -> str:
        """What the router thought, for a failure's message."""
        keep = ("vllm_router_worker_health", "vllm_router_cb_state", "vllm_router_request_errors")
        metrics = [line for line in self.router_metrics().splitlines() if line.startswith(keep)]
        log = self.ssh(f"journalctl -u {DEPLOYMENT}-router -n 40 --no-pager", check=False).stdout
        return "\n".join([what, *metrics, log[-4000:]])

    def router_metrics(self, port: int = ROUTER_METRICS) -> str:
        """A router's metrics: the first model's on 29000, the next ones' on the next ports."""
        return self.get(f"http://{self.router_address}:{port}/metrics")[1]

    def load(
        self, requests: int, concurrency: int = 6, judged: bool = False, **kwargs
    ) -> BackgroundLoad:
        """Completions through the gateway; `judged`, each answer checked against the
        model's greedy text for the load's prompt, asked of the fleet first (as it serves
        now: in float32, support/load.py's greedy_text says why)."""
        headers, cafile = self.headers(), self.cafile()
        expect = greedy_text(self.url, "tiny-llama", 16, headers, cafile) if judged else None
        return BackgroundLoad(
            self.url,
            "tiny-llama",
            requests=requests,
            concurrency=concurrency,
            max_tokens=16,
            headers=self.headers(),
            cafile=self.cafile(),
            expect=expect,
            **kwargs,
        ).start()

    def containers(self, where: str) -> list[str]:
        ps = ["docker", "ps", "-q", "--filter", f"label=zenvllm.deployment={DEPLOYMENT}"]
        if where == "here":
            return engine.docker(*ps[1:]).stdout.split()
        return self.ssh(" ".join(ps)).stdout.split()

    def started(self, where: str) -> dict[str, str]:
        """Each instance container of one host and when it started."""
        names = self.containers(where)
        fmt = ["--format", "{{.Id}} {{.State.StartedAt}}"]
        if not names:
            return {}
        if where == "here":
            out = engine.docker("inspect", *fmt, *names).stdout
        else:
            out = self.ssh(f"docker inspect --format '{fmt[1]}' " + " ".join(names)).stdout
        return dict(line.split() for line in out.splitlines())

    def completion(self, timeout: float = 30) -> int:
        """One completion through the gateway: the HTTP status (0: no connection)."""
        try:
            status, _, _ = gateway.request(
                f"{self.url}/v1/completions",
                DEPLOYMENT,
                {"model": "tiny-llama", "prompt": "back", "max_tokens": 2, **EXACT},
                host=ROUTER_HOST,
                timeout=timeout,
            )
        except OSError:
            return 0
        return status

    def own_completion(self) -> str:
        """The HTTP status of a completion from fleet-a's vLLM itself, asked on fleet-a."""
        body = json.dumps({"model": "tiny-llama", "prompt": "hi", "max_tokens": 2})
        return self.ssh(
            f"curl -s -o /dev/null -w '%{{http_code}}' -m 30 -H 'Authorization: Bearer {SECRET}' "
            f"-H 'Content-Type: application/json' -d '{body}' "
            f"http://{self.router_address}:{PORT}/v1/completions",
            check=False,
        ).stdout

    def instance_verdict(self) -> str:
        """Why fleet-a's instance does not serve: still starting (slow) or a fault (its
        unit restarting or stopped), with the unit's state and its log's last lines."""
        unit = f"{DEPLOYMENT}-0"
        shown = self.ssh(
            f"systemctl show {unit} -p ActiveState -p SubState -p NRestarts "
            "-p ActiveEnterTimestampMonotonic; echo ---; cut -d' ' -f1 /proc/uptime; echo ---; "
            f"journalctl -b -u {unit} -o cat -n 12 --no-pager",
            check=False,
        ).stdout
        shown, uptime, log = [*shown.split("---\n", 2), "", ""][:3]
        log = log[-3000:]
        state = dict(ln.split("=", 1) for ln in shown.splitlines() if "=" in ln)
        restarts = int(state.get("NRestarts", "0") or 0)
        entered = int(state.get("ActiveEnterTimestampMonotonic", "0") or 0) / 1e6
        since = float(uptime or 0) - entered
        if state.get("SubState") == "running" and restarts == 0:
            return f"slow: one start of {unit}, running {since:.0f} s, not serving yet; log:\n{log}"
        if restarts >= FAULT_RESTARTS:  # a start that keeps failing: no use waiting on
            pytest.fail(f"fault: {unit} restarted {restarts} times since boot; log:\n{log}")
        return (
            f"fault: {unit} is {state.get('ActiveState')}/{state.get('SubState')} after "
            f"{restarts} restart(s) since boot; log:\n{log}"
        )

    def health_states(self) -> set[str]:
        """The engine's HEALTHCHECK status of every instance container, on both hosts."""
        inspect = "docker inspect --format '{{.State.Health.Status}}' "
        states = set()
        for where in (ROUTER_HOST, "here"):
            names = self.containers(where)
            if where == "here":
                out = engine.docker("inspect", "--format", "{{.State.Health.Status}}", *names)
            else:
                out = self.ssh(inspect + " ".join(names))
            states |= set(out.stdout.split())
        return states

    def health(self, port: int = ROUTER_METRICS) -> dict[str, bool]:
        """Each instance URL and whether the router (of that metrics port) counts it healthy."""
        found = {}
        for line in self.router_metrics(port).splitlines():
            if line.startswith("vllm_router_worker_health{"):
                found[line.split('worker="')[1].split('"')[0]] = line.endswith(" 1")
        return found

    def wait_router(self, healthy: bool, urls: list[str] | None = None, timeout=300) -> None:
        """Until the router counts these instances (all by default) healthy, or not."""
        deadline = time.monotonic() + timeout
        while True:
            seen = self.health()
            wanted = urls or list(seen)
            if seen and all(seen.get(url) is healthy for url in wanted):
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"the router's view after {timeout} s: {seen}")
            time.sleep(1)

    def wait_router_healthy(self) -> None:
        self.wait_router(True)


def save_image(work) -> str:
    if engine.docker("image", "inspect", IMAGE, check=False).returncode != 0:
        engine.build("vllm-openai", work / "build.log")
    return str(engine.image_archive(IMAGE))


def remove_here() -> None:
    """What the deployment leaves on this machine if a test stops half-way."""
    names = engine.docker(
        "ps", "-aq", "--filter", f"label=zenvllm.deployment={DEPLOYMENT}", check=False
    ).stdout.split()
    if names:
        engine.docker("rm", "--force", *names, check=False)
    table = f"{DEPLOYMENT}-firewall".replace("-", "_")
    if shutil.which("nft"):  # the role installs nftables
        subprocess.run(["nft", "delete", "table", "inet", table], capture_output=True, check=False)


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    require(os.geteuid() == 0, "nspawn hosts need root")
    require_tool("systemd-nspawn")
    require_tool("debootstrap")
    require(engine.engine_ready(), "no container engine answers on DOCKER_HOST (make engine)")
    from support.nspawn import ROUTED_FLEET
    from support.nspawn import fleet as nspawn_fleet

    work = tmp_path_factory.mktemp("fleet")
    archive = save_image(work)
    planner = planner_zipapp(work)
    here = ROUTED_FLEET.here
    cpus = sorted(os.sched_getaffinity(0))
    require(len(cpus) >= 2, f"two hosts need a CPU each; this machine gives {len(cpus)}")
    half = len(cpus) // 2
    router_cpus, here_cpus = (",".join(map(str, part)) for part in (cpus[:half], cpus[half:]))
    remove_here()
    with nspawn_fleet(
        [ROUTER_HOST], work, ROUTED_FLEET, cpus={ROUTER_HOST: router_cpus}
    ) as machines:
        machine = machines[0]
        webhook = Webhook(here)  # on the bridge, which exists from here on
        inventory = work / "inventory.yml"
        remote = {
            "ansible_host": machine.address,
            "ansible_user": "root",
            "ansible_ssh_private_key_file": str(machine.key),
            "ansible_ssh_common_args": SSH_ARGS,
            "zenvllm_image_source": "archive",
            "zenvllm_image_archive": archive,
            # Inside nspawn only net.* sysctls are writable.
            "zenvllm_host_sysctls": {"net.core.somaxconn": 4096},
            "zenvllm_host_shm_size": "2g",
            "zenvllm_gateway_tls_names": [f"IP:{machine.address}"],
            # On the machine's own disk: a work directory under /tmp is on the guest's
            # tmpfs there, which a reboot empties (its instance then never came back).
            "zenvllm_model_dir": FLEET_A_MODEL_DIR,
        }
        (work / "here").mkdir(exist_ok=True)  # the local host's own files go under it
        local = {
            "ansible_connection": "local",
            # Under the test's own directory: nothing of the machine's is touched.
            "zenvllm_model_dir": str(work / "model" / "tiny-llama"),
            "zenvllm_private_address": here,
            "zenvllm_docker_host": engine.engine_env()["DOCKER_HOST"],
            "zenvllm_image_source": "present",
            "zenvllm_instances_config_dir": str(work / "here" / "etc"),
            "zenvllm_instances_lib_dir": str(work / "here" / "lib"),
            "zenvllm_instances_seccomp_profile": str(work / "here" / "etc" / "seccomp-numa.json"),
            "zenvllm_instances_compile_cache_dir": str(work / "here" / "compile"),
            "zenvllm_instances_revisions_dir": str(work / "here" / "revisions" / DEPLOYMENT),
            # The gateway's files too: this host serves behind the router, and nothing of
            # the machine's default site and pair must be at stake (the tutorial's, beside
            # it in the other worker, lost both to the removal play once: CI, 60e39ff).
            "zenvllm_host_sysctl_file": str(work / "here" / "sysctl.conf"),
            "zenvllm_gateway_site_path": str(work / "here" / "site.conf"),
            "zenvllm_gateway_tls_dir": str(work / "here" / "tls"),
            # The shared machine's kernel settings and packages stay as they are.
            "zenvllm_host_manage_sysctls": False,
            "zenvllm_host_manage_shm": False,
            "zenvllm_monitoring_node_exporter": False,
        }
        inventory.write_text(
            yaml.safe_dump(
                {
                    "zenvllm": {
                        "hosts": {ROUTER_HOST: remote, "localhost": local},
                        # A group variable (not an extra one) that a host can override.
                        "vars": {"zenvllm_instances_max_model_len": 512},
                    },
                    "zenvllm_router": {"hosts": {ROUTER_HOST: None}},
                    "zenvllm_monitoring": {"hosts": {ROUTER_HOST: None}},
                }
            )
        )
        variables = {
            "ansible_python_interpreter": "/usr/bin/python3",
            "zenvllm_image": IMAGE,
            # Delivered by the instances role (rsync, verified), to both hosts.
            "zenvllm_model_src": str(ensure_tiny_model()),
            "zenvllm_instances_deployment": DEPLOYMENT,
            "zenvllm_instances_count": 1,
            "zenvllm_instances_kv_cache_gib": 1,
            "zenvllm_instances_base_port": PORT,
            "zenvllm_instances_serve_args": ["--enforce-eager"],
            "zenvllm_planner": str(planner),
            "zenvllm_instances_health_timeout": 600,
            "zenvllm_api_key": SECRET,
            "zenvllm_gateway_listen": f"0.0.0.0:{GATEWAY_PORT}",
            "zenvllm_router_wheelhouse": str(router_wheelhouse()),
            "zenvllm_monitoring_scrape_interval": "2s",
            "zenvllm_monitoring_evaluation_interval": "2s",
            # Alerts to the test's receiver, quickly: an instance down 5 s (a killed
            # one restarting takes longer) fires, and Alertmanager sends a group at once
            # and its resolution within 5 s.
            "zenvllm_monitoring_down_for": "5s",
            "zenvllm_monitoring_drift_for": "10s",
            "zenvllm_monitoring_alert_webhooks": [webhook.url],
            "zenvllm_monitoring_alert_group_wait": "1s",
            "zenvllm_monitoring_alert_group_interval": "5s",
            "zenvllm_verify_health_timeout": 600,
        }
        fleet = Fleet(machine, inventory, variables, here, here_cpus, webhook)
        yield fleet
        if not fleet.removed:  # test_absent_... removed it last, unless it failed or was left out
            fleet.deploy(zenvllm_state="absent")
        remove_here()
        webhook.close()
    os.unlink(archive)  # 3 GB: pytest keeps its temporary directories


def test_deploy_puts_both_hosts_behind_one_endpoint(fleet):
    start = time.monotonic()
    run = fleet.deploy()
    print(f"fleet deploy: {time.monotonic() - start:.0f} s")
    assert run.rc == 0 and run.failed() == 0, run.output[-6000:]
    assert SECRET not in run.output
    # The model reached both hosts through the instances role, verified file by file.
    here = yaml.safe_load(fleet.inventory.read_text())["zenvllm"]["hosts"]["localhost"]
    record = {
        ROUTER_HOST: fleet.ssh(f"cat {FLEET_A_MODEL_DIR}/.zenvllm-model").stdout,
        "here": (Path(here["zenvllm_model_dir"]) / ".zenvllm-model").read_text(),
    }
    wanted = Marker(modelsync.manifest_of(ensure_tiny_model()), {})
    assert {where: parse_marker(text, where) for where, text in record.items()} == {
        ROUTER_HOST: wanted,
        "here": wanted,
    }
    fleet.wait_router_healthy()

    # Distinct prompts: cache-aware routing has no prefix to follow and balances.
    def one(i: int) -> int:
        status, _, answer = gateway.request(
            f"{fleet.url}/v1/completions",
            DEPLOYMENT,
            {
                "model": "tiny-llama",
                "prompt": f"{i} " * (i % 7 + 1) + "tell",
                "max_tokens": 4,
                "ignore_eos": True,
            },
            host=ROUTER_HOST,
        )
        assert status == 200, answer
        return answer["usage"]["completion_tokens"]

    with ThreadPoolExecutor(6) as pool:
        assert list(pool.map(one, range(48))) == [4] * 48
    served = {
        line.split('worker="')[1].split('"')[0]: float(line.rsplit(" ", 1)[1])
        for line in fleet.router_metrics().splitlines()
        if line.startswith("vllm_router_processed_requests_total{")
    }
    hosts = {url.split("//")[1].rsplit(":", 1)[0] for url, n in served.items() if n > 0}
    assert hosts == {fleet.here, fleet.router_address}, served


def test_only_the_router_reaches_the_instances(fleet):
    # From this machine (not the router host) to fleet-a's instance: dropped.
    with pytest.raises(OSError):
        socket.create_connection((fleet.router_address, PORT), timeout=3).close()
    # The router host reaches it, and without the key vLLM refuses the API.
    health = fleet.ssh(
        f"curl -s -o /dev/null -w '%{{http_code}}' http://{fleet.router_address}:{PORT}/health"
    )
    assert health.stdout == "200"
    models = fleet.ssh(
        f"curl -s -o /dev/null -w '%{{http_code}}' http://{fleet.here}:{PORT}/v1/models"
    )
    assert models.stdout == "401"
    table = f"{DEPLOYMENT}-firewall".replace("-", "_")
    rules = fleet.ssh(f"nft list table inet {table}").stdout
    assert f"ip saddr {{ {fleet.router_address} }} accept" in rules or (
        f"ip saddr {fleet.router_address} accept" in rules
    ), rules
    listening = fleet.ssh("ss -Hltn").stdout
    assert f"{fleet.router_address}:{PORT} " in listening and f"127.0.0.1:{PORT} " not in listening
    # Nothing else of this host is closed: from the router host, the operator's own TCP
    # listener here answers and a UDP datagram arrives (the table once dropped every
    # packet but TCP to ports not zenvllm's: this machine's DNS replies among them).
    with (
        socket.create_server((fleet.here, 0)) as theirs,
        socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as datagrams,
    ):
        datagrams.bind((fleet.here, 0))
        datagrams.settimeout(15)
        tcp, udp = theirs.getsockname()[1], datagrams.getsockname()[1]
        fleet.ssh(
            'python3 -c "import socket; '
            f"socket.create_connection(('{fleet.here}', {tcp}), timeout=5).close(); "
            "socket.socket(socket.AF_INET, socket.SOCK_DGRAM)"
            f".sendto(b'theirs', ('{fleet.here}', {udp}))\""
        )
        assert datagrams.recvfrom(64)[0] == b"theirs"
    # The image's own HEALTHCHECK finds vLLM there too (it probes where vLLM listens).
    deadline = time.monotonic() + 90
    while (states := fleet.health_states()) != {"healthy"}:
        assert time.monotonic() < deadline, states
        time.sleep(3)


def test_the_openai_client_through_the_router(fleet):
    import openai

    client = fleet.openai_client()
    assert [m.id for m in client.models.list().data] == ["tiny-llama"]
    done = client.completions.create(
        model="tiny-llama", prompt="Hello", max_tokens=5, extra_body=EXACT
    )
    assert done.usage.completion_tokens == 5 and done.choices[0].finish_reason == "length"
    chunks = list(
        client.completions.create(
            model="tiny-llama",
            prompt="Hello",
            max_tokens=6,
            stream=True,
            stream_options={"include_usage": True},
            extra_body=EXACT,
        )
    )
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    usage = [c.usage for c in chunks if c.usage]
    assert len(chunks) >= 6 and text and usage[-1].completion_tokens == 6
    with ThreadPoolExecutor(8) as pool:
        answers = list(
            pool.map(
                lambda i: client.completions.create(
                    model="tiny-llama", prompt=f"n{i}", max_tokens=3, extra_body=EXACT
                ),
                range(16),
            )
        )
    assert [a.usage.completion_tokens for a in answers] == [3] * 16
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="no-such-model", prompt="Hello", max_tokens=2)
    with pytest.raises(openai.BadRequestError, match="maximum context length"):
        client.completions.create(model="tiny-llama", prompt="hello " * 2000, max_tokens=2)


@pytest.mark.parametrize("where", [ROUTER_HOST, "here"])
def test_killing_every_instance_of_one_host_under_load_fails_nothing(fleet, where):
    fleet.wait_router_healthy()
    load = fleet.load(240)
    load.wait_for(40)
    victims = fleet.containers(where)
    assert victims
    other = "here" if where == ROUTER_HOST else ROUTER_HOST
    neighbours = fleet.started(other)
    killed = time.time()
    # A crash, not an operator's stop: SIGKILL each container's main process (the
    # engine's restart policy, or systemd, brings it back; `docker kill` would not).
    pids = "$(docker inspect --format '{{.State.Pid}}' " + " ".join(victims) + ")"
    if where == "here":
        for pid in engine.docker("inspect", "--format", "{{.State.Pid}}", *victims).stdout.split():
            os.kill(int(pid), signal.SIGKILL)
    else:
        fleet.ssh(f"kill -9 {pids}")
    result = load.join()
    print(f"kill {where}: {result.summary()}")
    assert result.failed == 0 and result.ok == 240, fleet.router_state(result.summary())
    assert fleet.started(other) == neighbours  # the other host's instances never restarted
    # Its supervisor brings it back; the router must have seen it go and come back.
    address = fleet.here if where == "here" else fleet.router_address
    fleet.wait_router(False, [f"http://{address}:{PORT}"], timeout=60)
    fleet.wait_router_healthy()
    # While it restarted Prometheus found it down (zenvllm_monitoring_down_for, 5 s here):
    # the alert reached the operator's webhook through Alertmanager, then its resolution.
    host = "localhost" if where == "here" else ROUTER_HOST
    firing, resolved = fleet.webhook.fired_and_resolved("ZenvllmInstanceDown", killed, host=host)
    assert firing["labels"]["instance"] == f"{address}:{PORT}", firing
    assert firing["labels"]["severity"] == "critical" and firing["annotations"]["description"]
    assert firing["annotations"]["runbook"].startswith(f"Run `zenvllm status` on {host}")
    print(f"kill {where}: alert at the webhook and resolved {resolved - killed:.0f} s after")


def test_a_rolling_update_across_hosts_fails_nothing(fleet):
    before = {where: fleet.containers(where) for where in (ROUTER_HOST, "here")}
    # Steady but not saturating: while one host restarts, the other (one core here)
    # serves everything, and Ansible, the engine and the load share the machine too.
    load = fleet.load(100_000, **STEADY)
    try:  # stopped however the deploy ends: its threads would hold pytest's exit
        load.wait_for(3)
        began, sent_before = time.monotonic(), load.progress.sent
        run = fleet.deploy(zenvllm_serial=1, zenvllm_instances_extra_env=ROLLOUT_ENV)
        took, sent_during = time.monotonic() - began, load.progress.sent - sent_before
    finally:
        load.stop()
    result = load.join()
    print(f"rolling update: {sent_during} requests in its {took:.0f} s; {result.summary()}")
    assert run.rc == 0 and run.failed() == 0, run.output[-6000:]
    # The load went on through the whole rollout: a request every 8 s at least (one
    # client pausing 5 s: STEADY), however long the rollout takes on this CPU.
    assert result.failed == 0 and sent_during >= took / 8, result.summary()
    for where, old in before.items():
        assert set(fleet.containers(where)).isdisjoint(old), where  # replaced on both hosts


def test_the_router_host_serves_again_by_itself_after_a_reboot(fleet):
    """fleet-a (its vLLM instance, the gateway, the router, Prometheus and the firewall)
    rebooted as an operator would: all of it comes back with no one acting, and the same
    play run again changes nothing."""
    from support.nspawn import reboot

    fleet.wait_router_healthy()
    start = time.monotonic()
    ssh_back = reboot(fleet.machine)
    while (status := fleet.completion()) != 200:
        assert time.monotonic() - start < 600, f"no completion 600 s after the reboot: {status}"
        time.sleep(2)
    served = time.monotonic() - start
    # fleet-a's own vLLM, not only this machine's behind the router (which, restarted
    # with the host, counts a worker healthy until it has asked it).
    asked = start
    while fleet.own_completion() != "200":
        assert time.monotonic() - start < 600, (
            f"fleet-a's vLLM not back 600 s after the reboot: {fleet.instance_verdict()}"
        )
        if time.monotonic() - asked > 30:  # fails at once on a restart loop
            asked, _ = time.monotonic(), fleet.instance_verdict()
        time.sleep(2)
    whole = time.monotonic() - start
    fleet.wait_router_healthy()
    print(
        f"reboot of {ROUTER_HOST}: ssh after {ssh_back:.0f} s, completions through the "
        f"gateway after {served:.0f} s, from its own vLLM instance after {whole:.0f} s"
    )
    units = [f"{DEPLOYMENT}-0", f"{DEPLOYMENT}-router", f"{DEPLOYMENT}-firewall", "nginx"]
    active = fleet.ssh("systemctl is-active docker prometheus " + " ".join(units), check=False)
    assert set(active.stdout.split()) == {"active"}, active.stdout
    with pytest.raises(OSError):  # the firewall is back: only the router reaches vLLM
        socket.create_connection((fleet.router_address, PORT), timeout=3).close()
    again = fleet.deploy(**fleet.applied)
    assert again.rc == 0 and again.changed() == 0, changed_tasks(again.output)


def test_restarting_the_engine_brings_its_instance_back_while_the_other_host_serves(fleet):
    fleet.wait_router_healthy()
    before, neighbours = fleet.started(ROUTER_HOST), fleet.started("here")
    load = fleet.load(200)
    load.wait_for(20)
    fleet.ssh("systemctl restart docker")
    result = load.join()
    print(f"engine restart on {ROUTER_HOST}: {result.summary()}")
    assert result.failed == 0 and result.ok == 200, fleet.router_state(result.summary())
    deadline = time.monotonic() + 300
    while set(after := fleet.started(ROUTER_HOST)) & set(before) or not after:
        assert time.monotonic() < deadline, (
            f"no new instance container: {after}; {fleet.instance_verdict()}"
        )
        time.sleep(2)
    try:
        fleet.wait_router_healthy()
    except TimeoutError as err:
        raise AssertionError(f"{err}; {fleet.instance_verdict()}") from None
    assert fleet.started("here") == neighbours


def test_prometheus_has_every_target_up_and_the_rules(fleet):
    deadline = time.monotonic() + 60
    while True:
        targets = fleet.prometheus("/api/v1/targets")["activeTargets"]
        jobs = {(t["labels"]["job"], t["health"]) for t in targets}
        if all(t["health"] == "up" for t in targets) or time.monotonic() > deadline:
            break
        time.sleep(2)
    assert {job for job, _ in jobs} == {"vllm", "router", "node"}
    assert all(t["health"] == "up" for t in targets), [
        (t["scrapeUrl"], t["health"], t["lastError"]) for t in targets
    ]
    assert len([t for t in targets if t["labels"]["job"] == "vllm"]) == 2
    groups = {g["name"]: g for g in fleet.prometheus("/api/v1/rules")["groups"]}
    assert set(groups) == {"zenvllm.recording", "zenvllm.alerts"}
    alerts = {r["name"] for r in groups["zenvllm.alerts"]["rules"]}
    assert {
        "ZenvllmInstanceDown",
        "ZenvllmKvCacheNearFull",
        "ZenvllmTtftP95High",
        "ZenvllmQueueGrowing",
    } <= alerts
    assert all(r["health"] == "ok" for g in groups.values() for r in g["rules"])
    check = fleet.ssh("promtool check rules /etc/prometheus/zenvllm.rules.yml", check=False)
    assert check.returncode == 0, check.stdout + check.stderr
    # And the alerts fire when they should (promtool's rule unit tests), on the rules
    # with the role's default thresholds (this fleet's are shortened for the test).
    cases = (REPO / "tests/fixtures/prometheus/zenvllm_rules_test.yml").read_text()
    rules = role_template.render(MONITORING, "zenvllm.rules.yml.j2")
    fleet.ssh(
        "mkdir -p /tmp/zenvllm-rules && cd /tmp/zenvllm-rules && "
        f"cat > zenvllm_rules_test.yml <<'EOF'\n{cases}EOF\n"
        f"cat > zenvllm.rules.yml <<'EOF'\n{rules}EOF"
    )
    tested = fleet.ssh("promtool test rules /tmp/zenvllm-rules/zenvllm_rules_test.yml", check=False)
    assert tested.returncode == 0, tested.stdout + tested.stderr
    # Prometheus sends its alerts to the role's Alertmanager, which is up.
    managers = fleet.prometheus("/api/v1/alertmanagers")["activeAlertmanagers"]
    assert [m["url"] for m in managers] == ["http://127.0.0.1:9093/api/v2/alerts"], managers


def test_each_host_reports_its_instances_against_their_plan_to_prometheus(fleet):
    """fleet-a's status timer (systemd is PID 1 there) writes `zenvllm status` for the
    node exporter, and Prometheus alerts on what it finds. fleet-a's engine discards
    cpusets (a cgroup tree without the cpuset controller: support/nspawn.py), so its
    instance really runs unconfined: reported as drifted, and ZenvllmPlacementDrift
    fires. (This host's instance has no timer: the engine supervises it. A confined
    instance moved with docker update: test_e2e.py.)"""
    name = f"{DEPLOYMENT}-0"
    active = fleet.ssh("systemctl is-enabled zenvllm-status.timer; systemctl start zenvllm-status")
    assert active.stdout.split() == ["enabled"], active.stdout + active.stderr
    # The host's own view first: it names each difference.
    view = fleet.ssh(
        "PYTHONPATH=/opt/zenvllm/lib/zenvllm.pyz python3 -m zenvllm.runtime status --json"
        " --platform-cache /opt/zenvllm/lib/status-platforms.json",
        check=False,
    )
    assert view.returncode == 1, view.stdout + view.stderr  # drifted
    (row,) = json.loads(view.stdout)
    assert (row["name"], row["placement"], row["health"], row["backend"]) == (
        name,
        "drifted",
        "ok",
        "stock",
    )
    planned = format_cpu_list(row["planned_cpus"])
    assert row["problems"] == [
        f"cpuset unrestricted is not the planned {planned} (moved after launch?)",
        "memory nodes unrestricted are not the planned 0",
    ]
    series = f'zenvllm_instance="{name}",host="{ROUTER_HOST}"'
    queries = {
        "placement": f"zenvllm_placement_ok{{{series}}} == 0",
        "problems": f"zenvllm_placement_problems{{{series}}} == 2",
        "healthy": f"zenvllm_instance_healthy{{{series}}} == 1",
        "local": f"zenvllm_numa_local_ratio{{{series}}} == 1",  # one node: every page on it
        "backend": f'zenvllm_backend_info{{{series},backend="stock",platform="CpuPlatform"}}',
        "alert": f'ALERTS{{alertname="ZenvllmPlacementDrift",alertstate="firing",{series}}}',
    }
    # The alert fires once the drift has lasted zenvllm_monitoring_drift_for (10s here)
    # since the timer's first run after the deploy.
    deadline, found = time.monotonic() + 120, set()
    while found != set(queries):
        assert time.monotonic() < deadline, f"Prometheus has only {sorted(found)}"
        for key, query in queries.items():
            answer = fleet.prometheus(f"/api/v1/query?{urllib.parse.urlencode({'query': query})}")
            if answer["result"]:
                found.add(key)
        time.sleep(2)
    (alert,) = [
        a
        for a in fleet.prometheus("/api/v1/alerts")["alerts"]
        if a["labels"]["alertname"] == "ZenvllmPlacementDrift"
    ]
    assert alert["annotations"]["runbook"].startswith(f"Run `zenvllm status` on {ROUTER_HOST}")


def test_the_status_playbook_shows_the_fleet_with_the_routers_view(fleet):
    """One table of both hosts' instances, as their own `zenvllm status` sees them and
    as the router does; the run fails naming fleet-a's unconfined instance."""
    fleet.wait_router_healthy()
    run, rows = fleet.status()
    assert run.rc != 0 and run.changed() == 0, run.output[-4000:]
    here_cpus = format_cpu_list(int(c) for c in fleet.here_cpus.split(","))
    assert set(rows) == {ROUTER_HOST, "localhost"}, run.output[-4000:]
    # host name cpus node backend placement health router (run wait tok/s: numbers)
    assert rows["localhost"][2:8] == [here_cpus, "0", "stock", "ok", "ok", "healthy"]
    assert rows[ROUTER_HOST][3:8] == ["0", "stock", "drifted", "ok", "healthy"]
    assert rows[ROUTER_HOST][2] == "unrestricted", rows  # its engine keeps no cpuset
    assert all(float(cell) >= 0 for row in rows.values() for cell in row[8:]), rows
    assert f"{ROUTER_HOST} {DEPLOYMENT}-0: cpuset unrestricted is not the planned" in run.output
    # Each host's CPU with its generation and ISA (the nspawn host shares this CPU).
    cpu = read_host()
    for host in (ROUTER_HOST, "localhost"):
        assert f"{host}: {cpu.cpu_name}; {' '.join(sorted(cpu.isa))}" in run.output, host


def grafana(expr: str, choice: dict[str, str]) -> str:
    """A query as Grafana sends it: each $variable replaced by its value, a regex (a
    single value escaped as Grafana's Prometheus data source escapes it)."""
    for name, value in choice.items():
        expr = expr.replace(f"${name}", value)
    return expr


def test_every_dashboard_query_returns_data_for_every_variable(fleet):
    """After load, each panel of the dashboard has data with every variable at All,
    and with one host, model and instance chosen (fleet-a's, where the status timer
    runs); each variable's own query lists the fleet's values."""
    result = fleet.load(60).join()
    assert result.failed == 0, result.summary()
    time.sleep(6)  # a few scrapes after the load
    board = json.loads(DASHBOARD.read_text())
    variables = {v["name"]: v for v in board["templating"]["list"] if v["type"] == "query"}
    assert set(variables) == {"host", "model", "instance"}
    every = {name: v["allValue"] for name, v in variables.items()}
    # label_values(metric, label) is Grafana's call to Prometheus' series API.
    values = {}
    for name, v in variables.items():
        metric, label = re.fullmatch(r"label_values\((.+), (\w+)\)", v["query"]["query"]).groups()
        found = fleet.prometheus(
            "/api/v1/series?" + urllib.parse.urlencode({"match[]": grafana(metric, every)})
        )
        values[name] = sorted({series[label] for series in found if label in series})
    address = fleet.router_address
    assert values == {
        "host": ["fleet-a", "localhost"],
        "model": ["tiny-llama"],
        "instance": sorted([f"{address}:{PORT}", f"{fleet.here}:{PORT}"]),
    }
    one = {
        "host": "fleet-a",
        "model": "tiny-llama",
        "instance": re.escape(f"{address}:{PORT}").replace("\\", "\\\\"),
    }
    panels = [p for p in board["panels"] if p["type"] != "row"]
    empty = []
    for choice in (every, one):
        for panel in panels:
            for target in panel["targets"]:
                if not fleet.query(grafana(target["expr"], choice)):
                    empty.append(f"{panel['title']} with {choice}: {target['expr']}")
    assert not empty, empty
    assert len(panels) >= 14
    # The variables filter: the other host's instance is not in fleet-a's view.
    tokens = grafana(panels[0]["targets"][0]["expr"], one)
    assert {r["metric"]["host"] for r in fleet.query(tokens)} == {"fleet-a"}


def test_bench_results_land_next_to_the_fleet_metrics(fleet, tmp_path):
    """`zenvllm bench --metrics-file` into the node exporter's textfile directory."""
    from zenvllm.bench.metrics import write_metrics_file

    result = json.loads((REPO / "docs/bench/qwen0.5b/results.json").read_text())
    local = tmp_path / "zenvllm_bench.prom"
    write_metrics_file(local, result)
    copy = subprocess.run(
        [
            "ssh",
            *SSH_ARGS.split(),
            "-i",
            str(fleet.machine.key),
            f"root@{fleet.router_address}",
            "cat > /var/lib/prometheus/node-exporter/zenvllm_bench.prom",
        ],
        input=local.read_text(),
        text=True,
        capture_output=True,
        timeout=60,
    )
    assert copy.returncode == 0, copy.stderr
    auto = next(s for s in result["summary"] if s["config"] == "auto")
    query = urllib.parse.urlencode(
        {"query": 'zenvllm_bench_output_tokens_per_second{config="auto"}'}
    )
    deadline = time.monotonic() + 30
    while not (found := fleet.prometheus(f"/api/v1/query?{query}")["result"]):
        assert time.monotonic() < deadline, "Prometheus has no zenvllm_bench_* series"
        time.sleep(2)
    assert float(found[0]["value"][1]) == pytest.approx(auto["output_tok_s"], rel=1e-5)
    assert found[0]["metric"]["host"] == ROUTER_HOST


EMBED = "minilm"  # sorted before "tiny-llama": its router takes the first ports


def embed(fleet, texts: list[str]) -> tuple[int, dict]:
    status, _, answer = gateway.request(
        f"{fleet.url}/v1/embeddings",
        DEPLOYMENT,
        {"model": EMBED, "input": texts},
        host=ROUTER_HOST,
        timeout=60,
    )
    return status, answer


def test_two_models_on_the_fleet_each_behind_its_own_router(fleet):
    """Each host serves a model of its own, set in the inventory as an operator sets it
    (host variables): fleet-a the chat model, this machine sentence-transformers'
    all-MiniLM-L6-v2 (from PyPI). deploy.yml puts one router per model behind the one
    gateway, which sends each request to the router of the model it names; the chat
    model's instance killed under embedding load fails no embedding."""
    import openai

    plain = fleet.inventory.read_text()
    inventory = yaml.safe_load(plain)
    here = inventory["zenvllm"]["hosts"]["localhost"]
    models = Path(here.pop("zenvllm_model_dir")).parent  # models name their directories
    here |= {
        "zenvllm_models": [f"{EMBED}={models / EMBED}"],
        "zenvllm_model_sources": {EMBED: str(ensure_embedding_model())},
        "zenvllm_instances_model_src": "",  # the play's model_src is fleet-a's
        "zenvllm_instances_max_model_len": 0,  # the encoder's own (256)
    }
    fleet.inventory.write_text(yaml.safe_dump(inventory))
    try:
        started = time.monotonic()
        # What the hosts run (fleet-a's instance stays as it is), both hosts at once.
        run = fleet.deploy(**{k: v for k, v in fleet.applied.items() if k != "zenvllm_serial"})
        print(f"two-model deploy: {time.monotonic() - started:.0f} s")
        assert run.rc == 0 and run.failed() == 0, run.failures()
        units = fleet.ssh(f"systemctl list-units --plain --no-legend '{DEPLOYMENT}-router*'")
        assert [line.split()[0] for line in units.stdout.splitlines()] == [
            f"{DEPLOYMENT}-router-{EMBED}.service",
            f"{DEPLOYMENT}-router-tiny-llama.service",
        ], units.stdout
        # Each router has its own model's instances only.
        workers = {
            port: json.loads(fleet.ssh(f"curl -s http://127.0.0.1:{port}/workers").stdout)
            for port in (30000, 30001)
        }
        assert {p: [w["url"] for w in answer["workers"]] for p, answer in workers.items()} == {
            30000: [f"http://{fleet.here}:{PORT}"],
            30001: [f"http://{fleet.router_address}:{PORT}"],
        }

        client = fleet.openai_client()
        assert sorted(m.id for m in client.models.list().data) == [EMBED, "tiny-llama"]
        vectors = client.embeddings.create(model=EMBED, input=["The quick brown fox"]).data
        assert len(vectors[0].embedding) == 384
        done = client.completions.create(
            model="tiny-llama", prompt="Hello", max_tokens=3, extra_body=EXACT
        )
        assert done.usage.completion_tokens == 3
        with pytest.raises(openai.NotFoundError, match=f"models: {EMBED}, tiny-llama"):
            client.completions.create(model="no-such-model", prompt="Hello", max_tokens=2)
        # The status playbook asks each model's router about its instances.
        status, rows = fleet.status()
        routed = {host: cells[7] for host, cells in rows.items()}  # the router column
        assert routed == {ROUTER_HOST: "healthy", "localhost": "healthy"}, status.output[-4000:]
        # Prometheus scrapes both routers.
        deadline = time.monotonic() + 60
        while len(up := fleet.query('up{job="router"} == 1')) < 2:
            assert time.monotonic() < deadline, up
            time.sleep(2)

        # Isolation: embeddings under load while the chat model's only instance dies.
        failures: list[str] = []
        sent = 0
        stop = threading.Event()

        def keep_embedding() -> None:
            nonlocal sent
            while not stop.is_set():
                status, answer = embed(fleet, [f"text {sent}", "another"])
                sent += 1
                if status != 200 or len(answer["data"]) != 2:
                    failures.append(f"{status} {str(answer)[:200]}")
                time.sleep(0.2)  # under the key's rate limit (20 r/s)

        with ThreadPoolExecutor(2) as pool:
            running = [pool.submit(keep_embedding) for _ in range(2)]
            try:
                chat = f"http://{fleet.router_address}:{PORT}"
                (victim,) = fleet.containers(ROUTER_HOST)
                fleet.ssh(f"kill -9 $(docker inspect --format '{{{{.State.Pid}}}}' {victim})")
                deadline = time.monotonic() + 60
                while fleet.health(29001).get(chat):
                    assert time.monotonic() < deadline, "the chat router still counts it healthy"
                    time.sleep(1)
                sent_at_loss = sent
                time.sleep(5)  # embeddings go on while the chat model has no instance
            finally:
                stop.set()
            for future in running:
                future.result()
        print(f"embeddings while the chat instance was down: {sent} sent, {failures[:3]}")
        assert sent > sent_at_loss and not failures
    finally:
        fleet.inventory.write_text(plain)


def test_gateway_health_fails_when_no_instance_is_healthy(fleet):
    assert fleet.get(f"{fleet.url}/gateway-health")[0] == 200
    # Stop every instance of the fleet (the teardown removes them anyway).
    engine.docker("update", "--restart=no", *fleet.containers("here"))
    engine.docker("stop", *fleet.containers("here"))
    fleet.ssh(f"systemctl stop '{DEPLOYMENT}-*.service'")
    deadline = time.monotonic() + 60
    while fleet.get(f"{fleet.url}/gateway-health")[0] == 200:
        assert time.monotonic() < deadline, "/gateway-health still 200 with no instance"
        time.sleep(2)
    assert fleet.get(f"{fleet.url}/gateway-health")[0] in (502, 503)


def greedy(fleet) -> str:
    """A greedy completion through the gateway: the same text for as long as the model
    and the group that serves it are the same."""
    status, _, answer = gateway.request(
        f"{fleet.url}/v1/completions",
        DEPLOYMENT,
        {
            "model": "tiny-llama",
            "prompt": "Hello world",
            "max_tokens": 8,
            "temperature": 0,
            **EXACT,
        },
        host=ROUTER_HOST,
        timeout=120,
    )
    assert status == 200, answer
    return answer["choices"][0]["text"]


# What a pipeline group's members logged about breaking and forming again: how long a
# heal took is read from these (measured 49 s and 226 s on the same machine).
EVENTS = re.compile(r"broke|startup complete|[Ee]rror|timed out|pipeline group: watching")


def print_timeline(logs: dict[str, str]) -> None:
    for name, text in logs.items():
        lines = [line[:200] for line in text.splitlines() if EVENTS.search(line)]
        print(f"{name}'s timeline:", *lines[-30:], sep="\n  ")


def test_a_copy_cut_over_both_hosts_serves_at_its_head_and_heals(fleet):
    """vLLM's pipeline parallel across the fleet's two hosts, deployed by deploy.yml: the
    model is stated too large for one host (in float32, the size of a host's memory
    budget), so each host plans one stage; fleet-a's, first in the inventory, is the
    head, behind the router, and this machine's joins it headless over the bridge (no
    per-host variable: the stages follow inventory order)."""
    budget = node_budget(read_host(Path("/")).nodes[0].mem_total_bytes, Policy())
    stated = math.floor(budget / GIB / 2 * 10) / 10  # bf16 GiB: twice that in float32
    pipeline = {
        "zenvllm_instances_hosts": 2,
        "zenvllm_instances_model_size_gib": stated,
        "zenvllm_instances_dtype": "float32",
        "zenvllm_instances_serve_args": [],  # vLLM 0.32: no pipeline without its warm-up
        # The group's step timeout (core/container.py, 120 s in a plan) made short for the
        # partition below.
        "zenvllm_instances_extra_env": {"VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS": str(STEP_TIMEOUT)},
    }
    started = time.monotonic()
    run = fleet.deploy(**pipeline)
    print(f"pipeline deploy: {time.monotonic() - started:.0f} s")
    assert run.rc == 0 and run.failed() == 0, run.output[-6000:]
    assert "pipeline parallel 2:" in run.output
    # One model again: one router, under the plain name (the models' own ones removed).
    units = fleet.ssh(f"systemctl list-units --all --plain --no-legend '{DEPLOYMENT}-router*'")
    assert [line.split()[0] for line in units.stdout.splitlines()] == [
        f"{DEPLOYMENT}-router.service"
    ], units.stdout
    head = f"http://{fleet.router_address}:{PORT}"
    fleet.wait_router_healthy()
    assert set(fleet.health()) == {head}  # only the head is behind the router
    (worker,) = fleet.containers("here")
    args = json.loads(engine.docker("inspect", "--format", "{{json .Args}}", worker).stdout)
    assert {"--headless", "--node-rank=1", f"--master-addr={fleet.router_address}"} <= set(args)
    log = engine.logs(worker)
    assert "Worker_PP1" in log and "GLOO_SOCKET_IFNAME=" in log, log[-3000:]
    before = greedy(fleet)

    closed_to_strangers(fleet)

    # A stage that dies outright (SIGKILL) heals as the serve tier's two-stage copy shows
    # (tests/serve/test_model_parallel.py), and a whole host's instances killed under
    # load as test_killing_every_instance_of_one_host_under_load_fails_nothing does: here
    # the faults that keep the group's connections up, which only a deployment's
    # watchers catch.
    #
    # The worker's vLLM hangs (stopped; its launcher runs on): the head's step timeout
    # ends the head, which leaves the router; the worker's launcher sees the store's
    # connections close and kills its stopped vLLM; the group forms again by itself.
    @contextlib.contextmanager
    def stopped() -> Iterator[None]:
        os.killpg(engine.vllm_of(worker), signal.SIGSTOP)
        yield

    heals_under_load(fleet, head, before, "worker hung", stopped)
    journal = f"journalctl -u {DEPLOYMENT}-0 -o short-iso --no-pager"
    head_log, worker_log = fleet.ssh(journal, check=False).stdout, engine.logs(worker)
    print_timeline({"head": head_log, "worker": worker_log})
    assert "the pipeline group broke" in worker_log + head_log, worker_log[-3000:]

    # This machine drops every packet of the head's host but the gateway's, ssh's and the
    # router metrics' (which the test reads), silently (no reset): the group's
    # connections stay up, so the head notices by its step timeout and leaves the router;
    # the worker, hearing nothing of its head, leaves the group too and retries it. Once
    # the packets pass again the group forms by itself.
    @contextlib.contextmanager
    def cut_off() -> Iterator[None]:
        with dropped_from(fleet.router_address, keep=(22, GATEWAY_PORT, ROUTER_METRICS)):
            yield
            time.sleep(group.HEAD_GRACE + 10)  # the worker leaves, and retries its head

    heals_under_load(fleet, head, before, "cut off", cut_off)
    worker_log = engine.logs(worker)
    assert "its head has not answered /health" in worker_log, worker_log[-3000:]


def closed_to_strangers(fleet) -> None:
    """Every TCP and UDP socket the group's processes listen on, on both hosts (found
    from the kernel's tables by the cgroup that owns them: the store, the API, gloo's and
    the message queues' ephemeral ports), is dropped for a third host on the bridge; the
    group's own hosts formed and serve through them (the greedy answer above); an
    operator's listener on each host stays open to that third host."""
    slice_name = group_guard.slice_of(DEPLOYMENT)

    def on_head(argv: list[str]) -> str:
        return fleet.ssh(shlex.join(argv)).stdout

    def here(argv: list[str]) -> str:
        return subprocess.run(argv, capture_output=True, text=True, check=True).stdout

    sockets = scan.listeners(on_head, slice_name, fleet.router_address) + scan.listeners(
        here, slice_name, fleet.here
    )
    ports = {port for _, _, port in sockets}
    # The head's API and store, and ports no list names (gloo's, the queues'): found.
    assert {PORT, 29500} <= ports and len(ports) > 3, sockets
    theirs = 18199  # the operator's own service on each host, outside the group
    fleet.ssh(f"systemd-run --unit=operators-listener python3 -m http.server {theirs}")
    listener = subprocess.Popen(
        ["python3", "-m", "http.server", str(theirs), "--bind", fleet.here],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    bridge = group.interface_of(fleet.here)
    try:
        time.sleep(2)
        with scan.stranger(bridge, fleet.here.rsplit(".", 1)[0] + ".99") as probe:
            found = dict(zip(sockets, probe(sockets), strict=True))
            operators = probe([("tcp", fleet.router_address, theirs), ("tcp", fleet.here, theirs)])
    finally:
        listener.terminate()
        fleet.ssh("systemctl stop operators-listener", check=False)
    print(f"the group's sockets, as a third host finds them: {found}")
    assert all(what in ("silent", "refused") for what in found.values()), found
    assert operators == ["open", "open"]


def heals_under_load(fleet, head: str, before: str, what: str, fault) -> None:
    """Under a judged load, the pipeline's head leaves the router within the step timeout
    plus 60 s of `fault` (a context manager), comes back by itself once it is lifted, and
    answers as `before`; no answer is wrong, none waits past the step timeout plus 40 s,
    and none fails outside the fault's window."""
    fleet.wait_router(True, [head], timeout=600)
    load = fleet.load(100_000, judged=True, **STEADY)
    try:
        load.wait_for(3)
        start = time.monotonic()
        with fault():
            fleet.wait_router(False, [head], timeout=STEP_TIMEOUT + 60)
            out = time.monotonic() - start
        fleet.wait_router(True, [head], timeout=600)
        healed = time.monotonic() - start
        after = greedy(fleet)
        time.sleep(10)  # the load goes on: no failure once the group is back
    finally:
        load.stop()
    result = load.join()
    print(
        f"pipeline {what}: the head left the router {out:.0f} s after (step timeout "
        f"{STEP_TIMEOUT} s), back {healed:.0f} s after; {result.summary()}"
    )
    assert after == before
    assert "WrongAnswer" not in result.errors and result.slowest < STEP_TIMEOUT + 40, (
        result.summary()
    )
    assert not failed_outside(result, start, healed), result.summary()


def failed_outside(result, start: float, healed: float) -> list[float]:
    """When a load's requests failed outside a fault's window (from `start` to `healed`
    seconds after it, the group back behind the router, and 5 s for a request sent just
    before), in seconds after `start`."""
    end = start + healed + 5
    return [round(t - start, 1) for t in result.failed_at if not start <= t <= end]


@contextlib.contextmanager
def dropped_from(address: str, keep: tuple[int, ...]) -> Iterator[None]:
    """This machine drops, without a word, every TCP packet from `address` but those from
    the `keep` ports, until the block ends."""
    table = "zenvllm_test_partition"
    ports = ", ".join(str(p) for p in keep)
    rules = (
        f"table inet {table} {{ chain input {{ type filter hook input priority -50; "
        f"ip saddr {address} tcp sport != {{ {ports} }} drop; }}; }}"
    )
    subprocess.run(["nft", "-f", "-"], input=rules, text=True, check=True)
    try:
        yield
    finally:
        subprocess.run(["nft", "delete", "table", "inet", table], check=False)


def test_absent_removes_the_router_the_monitoring_and_the_firewall(fleet):
    # Another deployment's gateway where this host's gateway variables point: behind the
    # router this deployment made no gateway here, so its removal must leave that one.
    theirs = fleet.inventory.parent / "here"
    (theirs / "tls").mkdir(parents=True, exist_ok=True)
    (theirs / "site.conf").write_text("# zenvllm gateway: another deployment's site\n")
    (theirs / "tls" / ".zenvllm-output").write_text("another deployment's pair\n")
    run = fleet.deploy(zenvllm_state="absent")
    assert run.rc == 0 and run.failed() == 0, run.output[-6000:]
    assert (theirs / "site.conf").exists() and (theirs / "tls" / ".zenvllm-output").exists()
    gone = fleet.ssh(
        f"systemctl cat {DEPLOYMENT}-router.service; ls /etc/systemd/system/{DEPLOYMENT}-router*;"
        " dpkg -s prometheus prometheus-node-exporter"
        " prometheus-alertmanager;"
        f" nft list table inet {DEPLOYMENT.replace('-', '_')}_firewall; ls /opt/zenvllm/router;"
        " test -e /opt/zenvllm && echo opt-zenvllm-left;"
        " ls /etc/systemd/system/zenvllm-status.* /var/lib/prometheus/node-exporter/zenvllm.prom",
        check=False,
    )
    assert "zenvllm-status" not in gone.stdout and "zenvllm.prom" not in gone.stdout
    assert "opt-zenvllm-left" not in gone.stdout  # the parent the router's venv was made in
    assert f"{DEPLOYMENT}-router" not in gone.stdout, gone.stdout
    assert "vllm-router" not in gone.stdout and "Status: install ok" not in gone.stdout, gone.stdout
    assert not fleet.containers(ROUTER_HOST) and not fleet.containers("here")
    table = f"{DEPLOYMENT}-firewall".replace("-", "_")
    assert (
        subprocess.run(["nft", "list", "table", "inet", table], capture_output=True).returncode != 0
    )
    with pytest.raises(OSError):  # Prometheus and the gateway are gone too
        socket.create_connection((fleet.router_address, 9090), timeout=3).close()
    with pytest.raises(OSError):
        socket.create_connection((fleet.router_address, GATEWAY_PORT), timeout=3).close()
