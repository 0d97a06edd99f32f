"""End to end on this machine's real engine: deploy.yml serves the tiny model
from the vllm-openai image as two instances (one per core) behind nginx.

systemd is not PID 1 here, so the roles pick the engine's restart policy as
supervisor (the systemd units are exercised on the flavor renders). The
machine's sysctls and /dev/shm are left alone; everything else is real:
apt, the planner on the host, docker, nginx, /health and a completion.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from conftest import require
from cryptography import x509
from support import engine, gateway, prometheus, role_template
from support.ansible_run import (
    ANSIBLE_DIR,
    BIN,
    changed_tasks,
    planner_zipapp,
    playbook,
    start_playbook,
    task_runs,
)
from support.load import STEADY, BackgroundLoad, HealthWatch
from support.nspawn import NETWORKS
from support.tiny_model import ensure_tiny_model

from zenvllm.core.topology import read_host
from zenvllm.runtime.health import healthy

pytestmark = pytest.mark.ansible

IMAGE = "zenvllm/vllm-openai:0.32.0"
BROKEN = "zenvllm/vllm-openai:does-not-start"  # the bad upgrade's image
GATEWAY = 18000
PORTS = (18001, 18002)
DEPLOYMENT = "zenvllm-e2e"  # its own names: other deployments may share the engine
NAMES = (f"{DEPLOYMENT}-0", f"{DEPLOYMENT}-1")
SITE = Path("/etc/nginx/conf.d/zenvllm-e2e.conf")
SYS_GET_MEMPOLICY = 239  # x86_64
MONITORING = ANSIBLE_DIR / "roles" / "zenvllm_monitoring"
# Under --tags gateway there is no plan: the upstreams are given.
UPSTREAMS = {"zenvllm_gateway_upstreams": [f"127.0.0.1:{p}" for p in PORTS]}
TWO_CLIENTS = {**UPSTREAMS, "zenvllm_gateway_clients": ["default", "ci"]}
BEFORE_DEPLOY: set[str] = set()  # listeners off loopback before the deployment


URL = f"https://127.0.0.1:{GATEWAY}"


def completion(model: str, tokens: int = 8) -> dict:
    body = {"model": model, "prompt": "Hello", "max_tokens": tokens, "ignore_eos": True}
    status, _, answer = gateway.request(
        f"{URL}/v1/completions", DEPLOYMENT, body | {"temperature": 0}
    )
    assert status == 200, answer
    return answer


def inspect(name: str) -> dict:
    return json.loads(engine.docker("inspect", name).stdout)[0]


def started(name: str) -> datetime:
    return datetime.fromisoformat(inspect(name)["State"]["StartedAt"][:26].rstrip("Z"))


def remove_deployment() -> None:
    engine.docker("rm", "--force", *NAMES, check=False)
    SITE.unlink(missing_ok=True)
    if Path("/etc/init.d/nginx").exists():
        subprocess.run(["/etc/init.d/nginx", "stop"], capture_output=True, check=False)


@pytest.fixture(scope="module")
def deployment(tmp_path_factory):
    require(engine.engine_ready(), "no container engine answers on DOCKER_HOST (make engine)")
    require(
        ctypes.sizeof(ctypes.c_void_p) == 8 and Path("/usr/bin/apt-get").exists(), "needs Debian"
    )
    if engine.docker("image", "inspect", IMAGE, check=False).returncode != 0:
        engine.build("vllm-openai", tmp_path_factory.mktemp("build") / "build.log")
    base = tmp_path_factory.mktemp("e2e")
    planner = planner_zipapp(base)
    variables = {
        "zenvllm_docker_host": engine.engine_env()["DOCKER_HOST"],
        "zenvllm_image": IMAGE,
        # The image role's `build` source: `zenvllm build` on the host, as an operator
        # with zenvllm installed there runs it (a layer-cache hit after the image tier).
        "zenvllm_image_source": "build",
        "zenvllm_image_zenvllm_bin": str(BIN / "zenvllm"),
        "zenvllm_image_build_args": engine.build_args("vllm-openai")[len(engine.ZENVLLM) + 3 :],
        "zenvllm_model_dir": str(ensure_tiny_model()),
        "zenvllm_instances_deployment": DEPLOYMENT,
        "zenvllm_instances_count": 2,
        "zenvllm_instances_kv_cache_gib": 1,
        "zenvllm_instances_max_model_len": 512,
        "zenvllm_instances_base_port": PORTS[0],
        "zenvllm_instances_serve_args": ["--enforce-eager"],
        "zenvllm_instances_config_dir": str(base / "etc"),
        "zenvllm_instances_lib_dir": str(base / "lib"),
        "zenvllm_instances_seccomp_profile": str(base / "etc" / "seccomp-numa.json"),
        "zenvllm_instances_compile_cache_dir": str(base / "compile"),
        "zenvllm_instances_revisions_dir": str(base / "revisions" / DEPLOYMENT),
        "zenvllm_planner": str(planner),
        "zenvllm_gateway_listen": f"0.0.0.0:{GATEWAY}",
        "zenvllm_gateway_site_path": str(SITE),
        "zenvllm_gateway_tls_dir": str(base / "tls"),
        # Small enough that a burst meets them; each test's own requests stay under.
        "zenvllm_gateway_requests_per_second": 5,
        "zenvllm_gateway_burst": 10,
        # Given, so a --tags gateway run (no plan to size it from) renders the same site.
        "zenvllm_gateway_connections_per_key": 512,
        # Leave the shared machine's kernel settings alone (checked on nspawn hosts).
        "zenvllm_host_manage_sysctls": False,
        "zenvllm_host_manage_shm": False,
    }
    remove_deployment()
    BEFORE_DEPLOY.update(listeners_off_loopback())
    yield base, variables
    remove_deployment()


def test_check_mode_on_a_fresh_host_changes_nothing(deployment):
    base, variables = deployment
    run = playbook("--check", "--diff", extra_vars=variables)
    assert run.rc == 0 and run.failed() == 0, run.output[-5000:]
    assert not (base / "etc").exists() and not (base / "lib").exists()
    assert not (base / "compile").exists()  # the compile caches too
    assert not SITE.exists()
    for name in NAMES:
        assert engine.docker("inspect", name, check=False).returncode != 0


def test_deploy_serves_a_completion_through_the_gateway(deployment):
    _, variables = deployment
    start = time.monotonic()
    run = playbook(extra_vars=variables)
    print(f"deploy: {time.monotonic() - start:.0f} s, changed={run.changed()}")
    assert run.rc == 0 and run.failed() == 0, run.output[-5000:]
    assert "tiny-llama answered through the gateway" in run.output
    answer = completion("tiny-llama")
    assert answer["usage"]["completion_tokens"] == 8


def test_instances_are_pinned_confined_and_on_loopback(deployment):
    base, _ = deployment
    listening = subprocess.run(["ss", "-Hltn"], capture_output=True, text=True, check=True).stdout
    for port in PORTS:
        assert f"127.0.0.1:{port} " in listening
        assert f"0.0.0.0:{port} " not in listening and f"*:{port} " not in listening
    assert f"0.0.0.0:{GATEWAY} " in listening
    assert (base / "tls" / "gateway.key").stat().st_mode & 0o777 == 0o600
    for cpu, name in enumerate(NAMES):
        config = inspect(name)
        host = config["HostConfig"]
        assert host["CpusetCpus"] == str(cpu) and host["CpusetMems"] == "0"
        assert [c.removeprefix("CAP_") for c in host["CapAdd"]] == ["SYS_NICE"]
        assert host["CapDrop"] == ["ALL"]
        assert host["Privileged"] is False
        assert host["RestartPolicy"]["Name"] == "unless-stopped"
        assert host["ShmSize"] > 0 and host["Memory"] > 0
        assert any(opt.startswith("seccomp=") for opt in host["SecurityOpt"])
        assert config["Config"]["User"] == "10001:10001"
        assert config["Config"]["Labels"]["zenvllm.port"] == str(PORTS[cpu])
        env_file = base / "etc" / f"{name}.env"
        assert env_file.stat().st_mode & 0o777 == 0o600
        assert f"VLLM_CPU_OMP_THREADS_BIND={cpu}\n" in env_file.read_text()
        # The launcher checked the container against the plan instead of planning again.
        log = engine.logs(name)
        assert f"zenvllm-launch: validated the deployment's plan for {name}: no differences" in log
        assert "plan said" not in log


def test_the_seccomp_profile_permits_numa_memory_policy(deployment):
    probe = (
        "import ctypes; libc = ctypes.CDLL(None, use_errno=True); "
        f"rc = libc.syscall({SYS_GET_MEMPOLICY}, 0, 0, 0, 0, 0); print(rc, ctypes.get_errno())"
    )
    out = engine.docker("exec", NAMES[0], "python3", "-c", probe).stdout.split()
    assert out == ["0", "0"], f"get_mempolicy refused inside the instance: {out}"


def host_status(base: Path, *extra: str) -> subprocess.CompletedProcess:
    """`zenvllm status` as the host runs it: from the planner zipapp the role installed."""
    env = engine.engine_env() | {"PYTHONPATH": str(base / "lib" / "zenvllm.pyz")}
    argv = ["python3", "-m", "zenvllm.runtime", "status", "--deployment", DEPLOYMENT, *extra]
    return subprocess.run(argv, capture_output=True, text=True, env=env, timeout=300)


def test_status_shows_each_instance_where_its_plan_put_it_and_what_vllm_runs(deployment):
    base, _ = deployment
    done = host_status(base, "--json")
    assert done.returncode == 0, done.stdout + done.stderr
    rows = json.loads(done.stdout)
    assert [r["name"] for r in rows] == list(NAMES)
    for cpu, row in enumerate(rows):
        assert row["cpus"] == row["planned_cpus"] == [cpu] and row["node"] == [0]
        assert (row["placement"], row["problems"], row["health"]) == ("ok", [], "ok")
        # Asked of the running server: the vllm-openai image runs vLLM's own CPU platform.
        assert (row["platform"], row["backend"]) == ("CpuPlatform", "stock")
        assert row["numa_local_ratio"] == 1.0  # one node here: every resident page on it
        assert row["running"] == 0 and row["waiting"] == 0 and row["tokens_per_s"] == 0


def test_an_instance_moved_to_other_cpus_is_reported_drifted_and_alerted(deployment):
    """`docker update --cpuset-cpus` moves an instance; the status timer's next run (its
    command, run here: this host has no systemd) reports it drifted, in the table and
    in the metrics a real node exporter serves, and the monitoring role's own rules fire
    ZenvllmPlacementDrift in a real Prometheus (drift_for shortened to 5 s)."""
    base, _ = deployment
    textfiles = base / "textfile"
    textfiles.mkdir(exist_ok=True)
    timer = ["--textfile", str(textfiles / "zenvllm.prom"), "--platform-cache"]
    timer.append(str(base / "lib" / "status-platforms.json"))
    rules = role_template.render(
        MONITORING, "zenvllm.rules.yml.j2", zenvllm_monitoring_drift_for="5s"
    )
    instance = f'zenvllm_instance="{NAMES[1]}"'
    with prometheus.watching(textfiles, rules) as prom:
        assert host_status(base, *timer).returncode == 0  # the timer's run before the move
        prom.wait(f"zenvllm_placement_ok{{{instance}}} == 1", 30)
        engine.docker("update", "--cpuset-cpus", "0-1", NAMES[1])
        moved = time.monotonic()
        try:
            done = host_status(base, "--no-backend")
            assert done.returncode == 1, done.stdout + done.stderr
            lines = done.stdout.splitlines()
            # The host's CPU first, named as its plan names it (generation and ISA).
            cpu = read_host()
            isa = " ".join(sorted(cpu.isa))
            assert lines[0] == f"{socket.gethostname()}: {cpu.cpu_name}; {isa}"
            assert lines[2].split()[1:6] == [NAMES[0], "0", "0", "-", "ok"]
            assert lines[3].split()[1:6] == [NAMES[1], "0-1", "0", "-", "drifted"]
            assert f"{NAMES[1]}: cpuset 0-1 is not the planned 1 (moved after launch?)" in lines
            assert host_status(base, *timer).returncode == 1  # the timer's next run
            prom.wait(f"zenvllm_placement_ok{{{instance}}} == 0", 30)
            reported = time.monotonic() - moved
            fired = 'ALERTS{alertname="ZenvllmPlacementDrift",alertstate="firing"}'
            (alert,) = prom.wait(fired, 60)
            alerted = time.monotonic() - moved
            print(f"drift reported {reported:.0f} s and alerted {alerted:.0f} s after the move")
            assert alert["metric"]["zenvllm_instance"] == NAMES[1]
            assert alert["metric"]["host"] == "localhost"
            # Within one interval of the status timer (30 s, its default).
            assert reported < 30
        finally:
            engine.docker("update", "--cpuset-cpus", "1", NAMES[1])
        assert host_status(base, *timer).returncode == 0
        prom.wait(f"zenvllm_placement_ok{{{instance}}} == 1", 30)


def listeners_off_loopback() -> set[str]:
    """Every TCP listener not bound to loopback, as address:port, but for those on the
    nspawn test networks' own addresses: their modules run beside this one (their
    registry, mirror, webhook and instances listen there), and this deployment has no
    address on them; its listening on all addresses still shows as 0.0.0.0."""
    out = subprocess.run(["ss", "-Hltn"], capture_output=True, text=True, check=True).stdout
    found = {line.split()[3] for line in out.splitlines()}
    theirs = tuple(f"{network.subnet}." for network in NETWORKS)
    return {a for a in found if not a.startswith(("127.", "[::1]", "::1", *theirs))}


def test_the_gateway_is_the_only_new_listener_off_loopback(deployment):
    new = listeners_off_loopback() - BEFORE_DEPLOY
    assert new == {f"0.0.0.0:{GATEWAY}"}, new  # not an instance, not /metrics


def test_the_gateway_serves_only_over_tls_and_only_to_a_key_holder(deployment):
    models = f"{URL}/v1/models"
    status, headers, _ = gateway.request(models, DEPLOYMENT, api_key=None)
    assert status == 401 and headers.get("WWW-Authenticate") == "Bearer"
    assert gateway.request(models, DEPLOYMENT, api_key="literal:not-the-key")[0] == 401
    status, _, listed = gateway.request(models, DEPLOYMENT)
    assert status == 200 and listed["data"][0]["id"] == "tiny-llama"
    for inside in ("/metrics", "/health"):  # the instances' own, kept on loopback
        assert gateway.request(f"{URL}{inside}", DEPLOYMENT)[0] == 404
    # Plain HTTP on the TLS port: a redirect to HTTPS, never the API.
    plain = subprocess.run(
        [
            "curl",
            "-sS",
            "-o",
            "/dev/null",
            "-w",
            "%{http_code} %{redirect_url}",
            f"http://127.0.0.1:{GATEWAY}/v1/models",
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert plain.stdout.startswith(f"301 https://127.0.0.1:{GATEWAY}/v1/models"), plain
    # The certificate is the one the controller keeps for clients, and nothing else passes.
    untrusted = subprocess.run(
        ["curl", "-sS", "-o", "/dev/null", f"{URL}/v1/models"], capture_output=True, text=True
    )
    assert untrusted.returncode == 60, untrusted.stderr  # curl: peer certificate not trusted


def test_a_burst_over_the_limit_gets_429_with_retry_after(deployment):
    time.sleep(3)  # the limiter forgets the other tests' requests
    with ThreadPoolExecutor(max_workers=30) as pool:
        answers = list(
            pool.map(lambda _: gateway.request(f"{URL}/v1/models", DEPLOYMENT), range(30))
        )
    statuses = sorted(status for status, _, _ in answers)
    assert 200 in statuses and 429 in statuses, statuses
    assert set(statuses) == {200, 429}, statuses  # refused at once, never hung or failed
    limited = next(h for s, h, _ in answers if s == 429)
    assert limited.get("Retry-After") == "1"
    time.sleep(3)
    assert gateway.request(f"{URL}/v1/models", DEPLOYMENT)[0] == 200


def test_the_openai_client_completes_streams_and_lists_models(deployment):
    from openai import DefaultHttpxClient, OpenAI

    trust = ssl.create_default_context(cafile=str(gateway.ca(DEPLOYMENT)))  # the CA bundle
    client = OpenAI(
        base_url=f"{URL}/v1",
        api_key=gateway.key(DEPLOYMENT),
        http_client=DefaultHttpxClient(verify=trust),
    )
    assert [m.id for m in client.models.list()] == ["tiny-llama"]
    done = client.completions.create(
        model="tiny-llama", prompt="Hello", max_tokens=8, extra_body={"ignore_eos": True}
    )
    assert done.usage.completion_tokens == 8
    stream = client.completions.create(
        model="tiny-llama",
        prompt="Hello",
        max_tokens=8,
        stream=True,
        extra_body={"ignore_eos": True},
    )
    pieces = [chunk.choices[0].text for chunk in stream if chunk.choices]
    assert len(pieces) >= 2 and "".join(pieces)  # tokens arrived as they came


def test_a_client_removed_from_the_list_is_revoked(deployment):
    _, variables = deployment
    both = playbook("--tags", "gateway", extra_vars={**variables, **TWO_CLIENTS})
    assert both.rc == 0 and both.failed() == 0, both.output[-3000:]
    assert gateway.request(f"{URL}/v1/models", DEPLOYMENT, api_key="ci")[0] == 200
    revoked_key = gateway.key(DEPLOYMENT, "ci")
    keys = gateway.SECRETS / DEPLOYMENT / "keys"
    assert (keys / ".zenvllm-output").is_file()  # the marker that lets revocation delete
    (keys / "notes.txt").write_text("the operator's notes\n")  # not a key: never revoked
    one = playbook("--tags", "gateway", extra_vars={**variables, **UPSTREAMS})
    assert one.rc == 0 and one.failed() == 0, one.output[-3000:]
    literal = f"literal:{revoked_key}"
    assert gateway.request(f"{URL}/v1/models", DEPLOYMENT, api_key=literal)[0] == 401
    assert not (keys / "ci").exists()
    assert (keys / "notes.txt").read_text() == "the operator's notes\n"
    (keys / "notes.txt").unlink()
    assert gateway.request(f"{URL}/v1/models", DEPLOYMENT)[0] == 200


def test_serving_anyone_is_an_explicit_opt_out_with_a_warning(deployment):
    _, variables = deployment
    run = playbook(
        "--check",
        "--tags",
        "gateway",
        extra_vars={**variables, **UPSTREAMS, "zenvllm_gateway_anonymous": True},
    )
    assert run.rc == 0, run.output[-3000:]
    assert "WARNING: zenvllm_gateway_anonymous is true" in run.output


def test_second_run_changes_nothing_and_check_mode_agrees(deployment):
    base, variables = deployment
    key, cert = gateway.key(DEPLOYMENT), (base / "tls" / "gateway.crt").read_bytes()
    run = playbook(extra_vars=variables)
    assert run.rc == 0 and run.changed() == 0, changed_tasks(run.output)
    # The same key and certificate: clients that hold them keep working.
    assert gateway.key(DEPLOYMENT) == key and (base / "tls" / "gateway.crt").read_bytes() == cert
    check = playbook("--check", "--diff", extra_vars=variables)
    assert check.rc == 0 and check.changed() == 0, changed_tasks(check.output)


def served_certificate() -> x509.Certificate:
    """The certificate the gateway presents in its TLS handshake."""
    pem = ssl.get_server_certificate(("127.0.0.1", GATEWAY))
    return x509.load_pem_x509_certificate(pem.encode())


def dns_names(cert: x509.Certificate) -> list[str]:
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    return names.get_values_for_type(x509.DNSName)


def days_left(cert: x509.Certificate) -> float:
    return (cert.not_valid_after_utc - datetime.now(UTC)).total_seconds() / 86400


def test_the_certificate_is_renewed_near_its_end_and_when_a_name_is_added(deployment):
    """A name added is in the next run's certificate; a certificate inside its renewal
    window (a short-lived one: 10 days, the window 30) is renewed by every run; back at the
    defaults, the next run renews it for a year and the one after changes nothing. Clients
    trust the deployment's CA, which never changes: the same CA file and key work all
    along. The expiry reaches a real Prometheus, where the monitoring role's own rule
    fires ZenvllmCertificateExpiring for the short-lived one and lets it go after."""
    base, variables = deployment
    ca, key = gateway.ca(DEPLOYMENT).read_bytes(), gateway.key(DEPLOYMENT)
    first = served_certificate()
    assert days_left(first) > 300
    textfiles = base / "certificate-textfile"
    textfiles.mkdir()
    metric = {"zenvllm_gateway_expiry_textfile": str(textfiles / "gateway.prom")}
    short = {
        **variables,
        **UPSTREAMS,
        **metric,
        "zenvllm_gateway_tls_days": 10,
        "zenvllm_gateway_tls_names": ["DNS:api.zenvllm.test"],
    }
    rules = role_template.render(MONITORING, "zenvllm.rules.yml.j2")
    expiring = 'ALERTS{alertname="ZenvllmCertificateExpiring",alertstate="firing"}'
    with prometheus.watching(textfiles, rules) as prom:
        served = []
        for _ in range(2):  # the name added; then inside the renewal window
            run = playbook("--tags", "gateway", extra_vars=short)
            assert run.rc == 0 and run.failed() == 0, run.failures()
            served.append(served_certificate())
            assert "api.zenvllm.test" in dns_names(served[-1])
            assert 9 < days_left(served[-1]) <= 10
            assert gateway.request(f"{URL}/v1/models", DEPLOYMENT)[0] == 200
        assert len({c.serial_number for c in (first, *served)}) == 3  # renewed twice
        (alert,) = prom.wait(expiring, 60)
        assert alert["metric"]["deployment"] == DEPLOYMENT
        back = playbook("--tags", "gateway", extra_vars={**variables, **UPSTREAMS, **metric})
        assert back.rc == 0 and back.failed() == 0, back.failures()
        renewed = served_certificate()
        assert days_left(renewed) > 300 and "api.zenvllm.test" not in dns_names(renewed)
        prom.wait("zenvllm_gateway_certificate_expiry_seconds > time() + 300 * 86400", 60)
        deadline = time.monotonic() + 60
        while prom.query(expiring):
            assert time.monotonic() < deadline, "ZenvllmCertificateExpiring still fires"
            time.sleep(1)
    again = playbook("--tags", "gateway", extra_vars={**variables, **UPSTREAMS, **metric})
    assert again.rc == 0 and again.changed() == 0, changed_tasks(again.output)
    assert served_certificate().serial_number == renewed.serial_number
    # What clients hold never changed.
    assert gateway.ca(DEPLOYMENT).read_bytes() == ca and gateway.key(DEPLOYMENT) == key


def test_a_second_controller_with_the_same_key_store_changes_no_client_key(deployment, tmp_path):
    """The key store copied to another controller's directory (as an operator shares it)
    and named there: its run changes nothing on the host, no client key is minted or
    changed, and clients keep working with what they hold."""
    _, variables = deployment
    store = tmp_path / "controller-2" / DEPLOYMENT
    shutil.copytree(gateway.SECRETS / DEPLOYMENT, store)
    held = {p.name: p.read_bytes() for p in (store / "keys").iterdir()}
    second = {**variables, **UPSTREAMS, "zenvllm_gateway_secrets_dir": str(store)}
    run = playbook("--tags", "gateway", extra_vars=second)
    assert run.rc == 0 and run.changed() == 0, changed_tasks(run.output)
    assert {p.name: p.read_bytes() for p in (store / "keys").iterdir()} == held
    assert (store / "localhost-ca.pem").read_bytes() == gateway.ca(DEPLOYMENT).read_bytes()
    assert gateway.request(f"{URL}/v1/models", DEPLOYMENT)[0] == 200


def test_an_image_neither_the_host_nor_the_controller_has_is_refused_with_the_fix(deployment):
    """source=auto, the default: here the host is the controller, so an image its engine
    lacks can be neither used nor shipped; the play stops at the image role, naming both
    and the command that builds it, before the instances are touched."""
    _, variables = deployment
    before = {name: inspect(name)["Id"] for name in NAMES}
    missing = {**variables, "zenvllm_image": "zenvllm/not-built:0", "zenvllm_image_source": "auto"}
    run = playbook("--tags", "image,instances", extra_vars=missing)
    assert run.rc != 0
    assert "Image zenvllm/not-built:0 is not on localhost, and the" in run.output
    assert "zenvllm build --target vllm-openai" in run.output, run.failures()
    assert {name: inspect(name)["Id"] for name in NAMES} == before


def test_a_site_zenvllm_did_not_write_is_refused_untouched(deployment, tmp_path):
    _, variables = deployment
    site = tmp_path / "conf.d" / "theirs.conf"
    site.parent.mkdir()
    site.write_text("server { listen 127.0.0.1:9; }\n")
    theirs = {
        **variables,
        "zenvllm_gateway_site_path": str(site),
        "zenvllm_gateway_upstreams": [f"127.0.0.1:{PORTS[0]}"],  # no plan under --tags gateway
    }
    run = playbook("--tags", "gateway", extra_vars=theirs)
    assert run.rc != 0
    assert f"{site} exists and zenvllm did not write it" in run.output, run.output[-3000:]
    assert site.read_text() == "server { listen 127.0.0.1:9; }\n"


def test_a_planned_port_another_service_holds_is_refused_before_anything(deployment, tmp_path):
    _, variables = deployment
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        run = playbook(
            "--tags",
            "instances",
            extra_vars={
                **variables,
                "zenvllm_instances_deployment": "zenvllm-e2e-busy",
                "zenvllm_instances_base_port": port,
                "zenvllm_instances_count": 1,
                "zenvllm_instances_config_dir": str(tmp_path / "etc"),
            },
        )
    assert run.rc != 0
    assert f"Port {port} on 127.0.0.1 is already in use by something other than" in run.output
    assert "zenvllm_instances_base_port" in run.output
    assert not (tmp_path / "etc").exists()
    left = engine.docker("ps", "-aq", "--filter", "label=zenvllm.deployment=zenvllm-e2e-busy")
    assert left.stdout.strip() == ""


def test_an_interrupted_deploy_leaves_whole_files_and_undeploy_removes_it(deployment, tmp_path):
    """Ctrl-C while the instances start: every file written is whole (Ansible writes each
    atomically), nothing temporary is left, and one undeploy removes what was made."""
    _, variables = deployment
    name = "zenvllm-e2e-int"
    etc = tmp_path / "etc"
    extra = {
        **variables,
        "zenvllm_instances_deployment": name,
        "zenvllm_instances_base_port": PORTS[-1] + 10,
        "zenvllm_instances_count": 1,
        "zenvllm_instances_config_dir": str(etc),
        "zenvllm_instances_lib_dir": str(tmp_path / "lib"),
        "zenvllm_instances_seccomp_profile": str(etc / "seccomp-numa.json"),
        "zenvllm_gateway_site_path": str(tmp_path / "site.conf"),
        "zenvllm_gateway_tls_dir": str(tmp_path / "tls"),
        "zenvllm_instances_revisions_dir": str(tmp_path / "revisions" / name),
    }
    label = f"label=zenvllm.deployment={name}"
    proc = start_playbook(extra_vars=extra)
    try:
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline and proc.poll() is None:
            if engine.docker("ps", "-aq", "--filter", label).stdout.strip():
                break  # the instance's container exists: the play is half-way
            time.sleep(0.5)
        assert proc.poll() is None, "the play ended before it could be interrupted"
        output = interrupt(proc)
        check_interrupted(proc.returncode, output, etc, name, extra, label)
    finally:
        if proc.poll() is None:
            proc.kill()
        for cid in engine.docker("ps", "-aq", "--filter", label).stdout.split():
            engine.docker("rm", "--force", cid, check=False)  # whatever an assertion left


def interrupt(proc: subprocess.Popen[str]) -> str:
    """Ctrl-C as an operator gives it: once, and once more if the play goes on, which it
    may since ansible-core 2.19 (the first stops the running task, ansible/ansible#86078;
    seen here: a play still running 120 s after one). The second ends ansible-playbook;
    its workers, in sessions of their own, get it too, so nothing of the play runs on."""
    proc.send_signal(signal.SIGINT)
    try:
        return proc.communicate(timeout=30)[0]
    except subprocess.TimeoutExpired:
        children: list[str] = []
        with contextlib.suppress(FileNotFoundError):
            children = Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()
        for pid in [proc.pid, *map(int, children)]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGINT)
        return proc.communicate(timeout=60)[0]


def check_interrupted(rc: int, output: str, etc: Path, name: str, extra: dict, label: str):
    assert rc != 0, output[-3000:]
    written = sorted(p.name for p in etc.iterdir())
    assert written == sorted([f"{name}-0.env", f"{name}-0.run.sh", "seccomp-numa.json"]), written
    env_text = (etc / f"{name}-0.env").read_text()
    assert env_text.endswith("\n") and "VLLM_CPU_KVCACHE_SPACE=" in env_text
    assert json.loads((etc / "seccomp-numa.json").read_text())["comment"].startswith("zenvllm:")
    undo = playbook(extra_vars={**extra, "zenvllm_state": "absent"})
    assert undo.rc == 0 and undo.failed() == 0, undo.output[-3000:]
    assert engine.docker("ps", "-aq", "--filter", label).stdout.strip() == ""
    assert not etc.exists() and not Path(extra["zenvllm_gateway_site_path"]).exists()


LOG_MARGIN_S = 3


def start_log(name: str) -> tuple[float, str]:
    """Seconds from the container's (re)start to vLLM's "Application startup complete",
    by the engine's own clock, and what that start logged. The engine stamps StartedAt
    after the process may have begun to write (a quiet host's first line came up to 4 ms
    before it in 9 of 15 starts; on a busy one, every launcher line once did, and a
    `--since StartedAt` dropped them), so the log is read from a margin before; a
    restart's previous run wrote nothing in it but its shutdown."""
    started_at = started(name)
    since = (started_at - timedelta(seconds=LOG_MARGIN_S)).isoformat() + "Z"
    done = engine.docker("logs", "--timestamps", "--since", since, name)
    lines = (done.stdout + done.stderr).splitlines()
    ready = next(line for line in lines if "Application startup complete" in line)
    seconds = (stamp(ready) - started_at).total_seconds()
    return seconds, "\n".join(lines)


def stamp(text: str) -> datetime:
    return datetime.fromisoformat(text.split()[0][:26].rstrip("Z"))


def compile_phase(log: str) -> float:
    """Seconds of vLLM's compile warm-up in a start's log (engine timestamps): where a
    cold start traces, generates and builds its kernels and a warm one loads them. Read
    apart from the start's imports and the load of the weights, which a busy neighbour
    on the same cores stretches alike for both."""
    lines = log.splitlines()
    began = next(line for line in lines if "Warming up model for the compilation" in line)
    done = next(line for line in lines if "Warming up done" in line)
    return (stamp(done) - stamp(began)).total_seconds()


def test_a_new_configuration_rolls_out_one_at_a_time_and_restarts_warm(deployment):
    """vLLM's default compiled mode and a new served name, rolled out: the instances are
    replaced one at a time, each health-gated; the first compiles into its own cache
    directory (a new key: the serve arguments changed), the second, of the same shape on
    other cores, starts warm from a copy of it; then a restart of the container loads
    what it compiled and is ready sooner. (One rollout for these claims: each cold
    compile costs minutes on 2 cores.)"""
    base, variables = deployment
    before = {name: inspect(name)["Id"] for name in NAMES}
    compiled = {
        **variables,
        "zenvllm_instances_serve_args": [],
        "zenvllm_instances_served_model_name": "tiny-v2",
    }
    run = playbook(extra_vars=compiled)
    assert run.rc == 0 and run.failed() == 0, run.output[-5000:]
    assert all(before[n] != inspect(n)["Id"] for n in NAMES)
    # The second instance went down only after the first answered /health again.
    assert (started(NAMES[1]) - started(NAMES[0])).total_seconds() > 10
    assert completion("tiny-v2")["usage"]["completion_tokens"] == 8
    cold, cold_log = start_log(NAMES[0])
    assert "compile cache: cold" in cold_log, cold_log[-3000:]
    _, second_log = start_log(NAMES[1])
    assert "compile cache: warm" in second_log, second_log[-3000:]
    seeded = [t.split(" : ")[-1] for t in changed_tasks(run.output) if "compile cache," in t]
    assert seeded == [f"Start from a sibling's compile cache, {NAMES[1]}"], seeded
    # One directory per instance, of the current key only (the eager key's was pruned),
    # the same key for both, and the second's kernels the first's.
    keys = {name: list((base / "compile" / name).iterdir()) for name in NAMES}
    for name in NAMES:
        assert len(keys[name]) == 1 and any(keys[name][0].joinpath("inductor").rglob("*.so"))
    first, second = (keys[name][0] for name in NAMES)
    assert first.name == second.name and first != second
    so = {p.relative_to(first) for p in first.rglob("*.so")}
    assert so == {p.relative_to(second) for p in second.rglob("*.so")}, so
    # Inductor's precompiled headers too (torch builds them outside its cache dir, so the
    # launcher links that dir in): a warm start must not run g++ on them again.
    kept = base / "compile" / NAMES[0]
    headers = {p: p.stat().st_mtime_ns for p in kept.rglob("*.gch")}
    assert headers, "no precompiled header in the kept compile cache"
    kernels = set(kept.rglob("*.so"))
    engine.docker("restart", NAMES[0])
    engine.wait_for(lambda: healthy(PORTS[0]), 600, f"/health of port {PORTS[0]}", every=0.5)
    warm, warm_log = start_log(NAMES[0])
    assert "compile cache: warm" in warm_log, warm_log[-3000:]
    assert {p: p.stat().st_mtime_ns for p in headers} == headers  # loaded, not rebuilt
    assert set(kept.rglob("*.so")) == kernels  # no kernel built anew
    # Ready sooner, judged on the compile warm-up alone: the whole start's time moved with
    # the other worker's load (seen: cold 73 s, warm 94 s while nspawn hosts deployed).
    phases = compile_phase(cold_log), compile_phase(warm_log)
    print(
        f"\ntime to ready, 2 cores: cold {cold:.1f} s, warm {warm:.1f} s; "
        f"compile warm-up: cold {phases[0]:.1f} s, warm {phases[1]:.1f} s"
    )
    assert phases[1] < phases[0], phases
    assert completion("tiny-v2")["usage"]["completion_tokens"] == 8


def revisions_listed(base: Path) -> list[str]:
    """`zenvllm revision list` on the host, as an operator reads it, newest first."""
    argv = ["python3", "-m", "zenvllm.runtime", "revision", "list"]
    argv += ["--dir", str(base / "revisions" / DEPLOYMENT)]
    env = {**engine.engine_env(), "PYTHONPATH": str(base / "lib" / "zenvllm.pyz")}
    done = subprocess.run(argv, capture_output=True, text=True, env=env, check=True)
    return done.stdout.splitlines()


def image_id(ref: str) -> str:
    return engine.docker("image", "inspect", "--format", "{{.Id}}", ref).stdout.strip()


def model_mounted(name: str) -> str:
    """The host directory the instance's container has as its model."""
    (mount,) = [m for m in inspect(name)["Mounts"] if m["Destination"] == "/model"]
    return mount["Source"]


def rolled_out_one_at_a_time(output: str, watch: HealthWatch) -> None:
    """Each instance restarted once, the second only after the first answered /health
    again, never both down; each taken out of the gateway's rotation, drained, replaced
    and put back, in that order (its server line edited twice, the drain run going out,
    skipped coming back)."""
    spans = {port: watch.down_spans(port) for port in PORTS}
    seconds = {port: [round(b - a, 1) for a, b in s] for port, s in spans.items()}
    print(f"\nseconds down per port in the rollout: {seconds}")
    assert watch.all_down() == 0, spans
    assert all(len(s) == 1 for s in spans.values()), spans
    (a0, a1), (b0, b1) = spans[PORTS[0]][0], spans[PORTS[1]][0]
    assert a1 <= b0 or b1 <= a0, spans
    replace = [output.index(f"Replace the container of {name}") for name in NAMES]
    assert replace[0] < output.index(f"Wait for /health of {NAMES[0]}", replace[0]) < replace[1]
    for name, port in zip(NAMES, PORTS, strict=True):
        edits = task_runs(output, f"Mark the server in or out of rotation (down), 127.0.0.1:{port}")
        assert [text.count("1 replacements made") for _, text in edits] == [1, 1], edits
        drains = task_runs(output, f"Wait for the requests in flight to finish on {name}")
        assert ["ok: [" in text and "skipping" not in text for _, text in drains] == [1, 0]
        replaced = output.index(f"Replace the container of {name}")
        assert edits[0][0] < drains[0][0] < replaced < edits[1][0]
    assert " down;" not in SITE.read_text(), "an instance was left out of rotation"


def test_a_new_model_version_then_a_bad_image_and_a_rollback_fail_no_request(deployment):
    """Under load through the gateway (long streams, under way when an instance is
    replaced), as operations.md's "Upgrade, and roll back" says: a new version of the
    model (another directory, zenvllm_model_dir) rolls out instance by instance, each
    taken out of rotation, drained, replaced, health-gated and put back, never both
    down; then an upgrade to an image that does not start stops at the first instance
    (out of rotation, its /health never answers within the timeout), the other serves
    every request, and the attempt stays on record, pending; `-e zenvllm_rollback=true`
    rolls the last deployed revision (the new model's) out again: both instances run its
    image and model, no request failed, and `zenvllm status` names the revision, a
    rollback to the one that served."""
    base, variables = deployment
    version = base / "models" / "tiny-2026-12"  # the model's next version, a new directory
    shutil.copytree(variables["zenvllm_model_dir"], version)
    # Eager again (the deployment's own mode before the compiled rollout above): what
    # is rolled out and back is the model and the image, and an eager start is a minute
    # shorter than a compiled one whose new model's key starts its cache cold.
    serving = {
        **variables,
        "zenvllm_model_dir": str(version),
        "zenvllm_instances_served_model_name": "tiny-v2",
    }
    (before,) = [line for line in revisions_listed(base) if line.startswith("* ")]
    number = int(before.split()[2])
    good = {name: inspect(name)["Image"] for name in NAMES}
    assert set(good.values()) == {image_id(IMAGE)}
    made = engine.docker("create", IMAGE).stdout.strip()
    engine.docker("commit", "--change", 'ENTRYPOINT ["/bin/false"]', made, BROKEN)
    engine.docker("rm", made)
    key, cafile = gateway.key(DEPLOYMENT), str(gateway.ca(DEPLOYMENT))
    client = {"requests": 100_000, **STEADY, "headers": {"Authorization": f"Bearer {key}"}}
    # One client of streams, not a second of short completions beside it: each request
    # keeps an instance's worker busy-polling for a second after it (about 0.7 of a
    # core per client, docs/test-runs/2026-12-07-zen4-ansible-tier-serial-cpu.txt), and
    # a stream an instance being replaced refuses or cuts fails as a short one would.
    load = BackgroundLoad(
        URL, "tiny-v2", max_tokens=192, stream=True, cafile=cafile, **client
    ).start()
    try:
        load.wait_for(3)
        with HealthWatch(PORTS) as watch:
            newer = playbook("-v", extra_vars=serving)
        assert newer.rc == 0 and newer.failed() == 0, newer.failures()
        assert {model_mounted(name) for name in NAMES} == {str(version)}
        rolled_out_one_at_a_time(newer.output, watch)
        upgrade = {
            **serving,
            "zenvllm_image": BROKEN,
            "zenvllm_image_source": "present",
            "zenvllm_instances_health_timeout": 30,
        }
        bad = playbook(extra_vars=upgrade)
        assert bad.rc != 0 and f"Wait for /health of {NAMES[0]}" in bad.failures(), bad.output[
            -3000:
        ]
        assert inspect(NAMES[1])["Image"] == good[NAMES[1]]  # never reached
        assert revisions_listed(base)[0].startswith(f"  revision {number + 2} (pending; ")
        back = playbook(extra_vars={**serving, "zenvllm_rollback": True})
        assert back.rc == 0 and back.failed() == 0, back.failures()
        assert f"rolling back to revision {number + 1} (deployed" in back.output
        sent = load.progress.sent
        load.wait_for(sent + 3)  # and it serves after the rollback too
    finally:
        load.stop()
        result = load.join()
        engine.docker("rmi", BROKEN, check=False)
    print(f"streams through the new model, the bad image and the rollback: {result.summary()}")
    assert result.sent >= 20 and result.failed == 0, result.summary()
    assert {name: inspect(name)["Image"] for name in NAMES} == good
    assert {model_mounted(name) for name in NAMES} == {str(version)}
    assert completion("tiny-v2")["usage"]["completion_tokens"] == 8
    newest = revisions_listed(base)[0]
    assert newest.startswith(
        f"* revision {number + 3} (deployed, a rollback to revision {number + 1}; "
    )
    shown = host_status(base, "--no-backend", "--revisions", str(base / "revisions")).stdout
    host = socket.gethostname()  # status names the host as it calls itself
    assert f"{host} {DEPLOYMENT}: revision {number + 3} (deployed, a rollback to" in shown, shown


def test_undeploy_removes_the_deployment_and_again_changes_nothing(deployment):
    base, variables = deployment
    absent = {**variables, "zenvllm_state": "absent"}
    run = playbook(extra_vars=absent)
    assert run.rc == 0 and run.failed() == 0, run.output[-5000:]
    left = engine.docker(
        "ps", "--all", "--quiet", "--filter", f"label=zenvllm.deployment={DEPLOYMENT}"
    )
    assert left.stdout.strip() == ""
    # Env files, run scripts, the seccomp profile, the planner and their directories.
    assert not (base / "etc").exists() and not (base / "lib").exists()
    assert not (base / "compile").exists()  # the compile caches too
    assert not SITE.exists()
    assert engine.docker("image", "inspect", IMAGE, check=False).returncode == 0  # kept
    assert Path(variables["zenvllm_model_dir"], "config.json").exists()  # kept
    again = playbook(extra_vars=absent)
    assert again.rc == 0 and again.changed() == 0, changed_tasks(again.output)
    check = playbook("--check", extra_vars=absent)
    assert check.rc == 0 and check.changed() == 0, changed_tasks(check.output)
