"""deploy.yml against real systemd hosts (systemd-nspawn, systemd as PID 1)
reached over ssh on a private bridge: check mode, deploy, idempotence, then
testinfra on what the hosts ended up with.

The hosts are the operator's, as found: nspawn-a is fresh (zenvllm installs
Debian's engine), nspawn-b already runs its operator's own Debian docker.io and
a container of theirs (zenvllm uses that engine and never touches the container
or its image), and nspawn-c has Docker's docker-ce (a stand-in package: apt's
view is what matters, and Docker's packages cannot be fetched here), where the
play must refuse before changing anything.

The hosts run the real roles end to end: apt (from a local repository inside
the rootfs: the hosts have no network), the engine from Debian's docker.io,
the image delivered as a `docker save` archive, the planner on each host,
systemd units running the containers, nginx. The workload is a stand-in
server (tests/support/standin) rather than vLLM, and the engine in nspawn
discards cpuset and memory limits (see tests/support/nspawn.py); real vLLM
with enforced limits behind the same roles is tests/ansible/test_e2e.py.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import ssl
import subprocess
import sys
import tempfile
import threading
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from conftest import REPO, require, require_tool
from support import engine, nspawn, readme, registry
from support.ansible_run import (
    ANSIBLE_DIR,
    Run,
    build_collection,
    changed_tasks,
    env,
    finished,
    galaxy_run,
    planner_zipapp,
    playbook,
)
from support.gateway import SECRETS
from support.gateway import ca as gateway_ca
from support.gateway import key as gateway_key
from support.tiny_model import ensure_tiny_model

from zenvllm import __version__
from zenvllm.deploy import playbooks

pytestmark = pytest.mark.ansible

NAMES = ["nspawn-a", "nspawn-b"]
FRESH, OPERATOR, DOCKER_CE = "nspawn-a", "nspawn-b", "nspawn-c"
THEIRS = "theirs-web"  # the operator's own container on OPERATOR, and its image
THEIR_IMAGE = "theirs/web:1"
# A file of the operator's where zenvllm puts its planner's parent directory: that
# parent is theirs, so zenvllm's removal leaves it.
THEIR_NOTES = "/opt/zenvllm/operators-notes.txt"
# The host has no curl before zenvllm installs it; python3 it has.
THEIRS_ANSWER = (
    "python3 -c \"import urllib.request as u; u.urlopen('http://127.0.0.1:9090/health')\""
)
STANDIN = "zenvllm/standin:test"
STANDIN_DIR = REPO / "tests" / "support" / "standin"
SECRET = "nspawn-api-key-3f9a"
SSH_ARGS = " ".join(nspawn.SSH_OPTIONS)
# What an operator's own site playbook calls from the collection, by FQCN.
OPERATORS_ROLES = ("zenvllm_host", "zenvllm_image", "zenvllm_instances", "zenvllm_gateway")
OPERATORS_ROLES += ("zenvllm_verify",)
SYSCTLS = {"net.core.somaxconn": 4096, "net.ipv4.tcp_max_syn_backlog": 2048}
SYSCTL_FILE = "/etc/sysctl.d/60-zenvllm.conf"  # the host role's default


def build_standin() -> None:
    """python3 from the nspawn hosts' own local repository, served on loopback for the
    build (nspawn.local_repo_url): a fresh machine's runs lost the whole module twice to
    `apt-get update` failing to resolve Debian's mirror in this build."""
    with nspawn.local_repo_url() as repo:
        argv = ("build", "--network", "host", "--build-arg", f"REPO={repo}", "-t", STANDIN)
        done = engine.docker(*argv, str(STANDIN_DIR), check=False, timeout=600)
    assert done.returncode == 0, (
        f"docker build of {STANDIN}:\n{(done.stdout + done.stderr)[-3000:]}"
    )


def standin_archive(work) -> str:
    """The stand-in image as a `docker save` archive (the image role's archive source)."""
    if engine.docker("image", "inspect", STANDIN, check=False).returncode != 0:
        if (
            engine.docker("image", "inspect", "zenvllm/debian:bookworm", check=False).returncode
            != 0
        ):
            subprocess.run(
                [sys.executable, "-m", "zenvllm.image.baseimage"],
                env=engine.engine_env(),
                check=True,
            )
        build_standin()
    archive = work / "standin.tar"
    engine.docker("save", "-o", str(archive), STANDIN, timeout=300)
    return str(archive)


def ssh(machine, command: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(
        nspawn.ssh_argv(machine, command),
        capture_output=True,
        text=True,
        timeout=600,
        check=check,
    )


def operators_own_engine(machine, archive: str) -> None:
    """What the operator had before zenvllm: Debian's docker.io, installed and started by
    apt, and a web container of theirs from an image of theirs."""
    ssh(
        machine,
        "apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq docker.io",
    )
    shutil.copy(archive, machine.root / "root/theirs.tar")
    ssh(
        machine,
        f"docker load -qi /root/theirs.tar && rm /root/theirs.tar && docker tag {STANDIN} "
        f"{THEIR_IMAGE} && docker rmi {STANDIN} && docker run -d --name {THEIRS} --network host "
        f"--restart unless-stopped {THEIR_IMAGE} --host 127.0.0.1 --port 9090",
    )
    ssh(machine, f"mkdir -p {Path(THEIR_NOTES).parent} && echo 'ours, not zenvllm' > {THEIR_NOTES}")
    ssh(
        machine,
        f"for i in $(seq 30); do {THEIRS_ANSWER} 2>/dev/null && exit; sleep 1; done; exit 1",
    )


def theirs(host) -> dict:
    """The operator's container as the engine sees it, their image and their file."""
    fmt = "{{.Id}} {{.State.StartedAt}} {{.State.Running}} {{.Image}}"
    cid, started, running, image = host.check_output(
        f"docker inspect --format '{fmt}' {THEIRS}"
    ).split()
    return {
        "id": cid,
        "started": started,
        "running": running,
        "image": image,
        "tagged": host.check_output(f"docker image inspect --format '{{{{.Id}}}}' {THEIR_IMAGE}"),
        "answers": host.run(THEIRS_ANSWER).rc == 0,
        "engine": host.package("docker.io").version,
        "notes": host.file(THEIR_NOTES).content_string,
    }


@pytest.fixture(scope="module")
def hosts(tmp_path_factory):
    require(os.geteuid() == 0, "nspawn hosts need root")
    require_tool("systemd-nspawn")
    require_tool("debootstrap")
    require(engine.engine_ready(), "no container engine answers on DOCKER_HOST (make engine)")

    work = tmp_path_factory.mktemp("nspawn")
    archive = standin_archive(work)
    planner = planner_zipapp(work)
    with nspawn.fleet([*NAMES, DOCKER_CE], work, nspawn.NSPAWN_HOSTS) as machines:
        inventory = work / "inventory.yml"
        access = {
            "ansible_user": "root",
            "ansible_ssh_private_key_file": str(machines[0].key),
            "ansible_ssh_common_args": SSH_ARGS,
        }
        inventory.write_text(
            yaml.safe_dump(
                {
                    "zenvllm": {
                        "hosts": {m.name: {"ansible_host": m.address} for m in machines[:2]},
                        "vars": access,
                    }
                }
            )
        )
        (work / "docker-ce.yml").write_text(
            yaml.safe_dump(
                {
                    "zenvllm": {
                        "hosts": {DOCKER_CE: {"ansible_host": machines[2].address}},
                        "vars": access,
                    }
                }
            )
        )
        operators_own_engine(machines[1], archive)
        variables = {
            "zenvllm_image": STANDIN,
            # The image role's default source (auto): the hosts lack the image, so the play
            # ships it from this controller's engine as an archive.
            "zenvllm_image_controller_dir": str(work / "controller-images"),
            "zenvllm_model_dir": "/srv/models/tiny-llama",
            # The model travels from the controller: rsync, verified against its manifest.
            "zenvllm_model_src": str(ensure_tiny_model()),
            "zenvllm_instances_kv_cache_gib": 1,
            "zenvllm_planner": str(planner),
            "zenvllm_api_key": SECRET,
            # Inside nspawn only net.* sysctls are writable (the rest of /proc/sys is read-only).
            "zenvllm_host_sysctls": SYSCTLS,
            "zenvllm_host_shm_size": "256m",
            "zenvllm_verify_completion": False,
            "zenvllm_verify_health_timeout": 240,
            "zenvllm_instances_health_timeout": 240,
            # Small enough that the exposure test's burst meets them.
            "zenvllm_gateway_requests_per_second": 5,
            "zenvllm_gateway_burst": 10,
        }
        yield machines, inventory, variables


def sha256_of(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def deploy(inventory, variables, *args):
    return playbook("-i", str(inventory), *args, extra_vars=variables)


def infra(inventory, name):
    import testinfra

    os.environ.update({k: v for k, v in env().items() if k.startswith("ANSIBLE_") or k == "PATH"})
    return testinfra.get_host(f"ansible://{name}?ansible_inventory={inventory}")


@pytest.fixture(scope="module")
def theirs_before(hosts):
    """The operator's container before zenvllm first comes near the host."""
    _, inventory, _ = hosts
    before = theirs(infra(inventory, OPERATOR))
    assert before["running"] == "true" and before["answers"], before
    return before


def test_check_mode_on_fresh_hosts_changes_nothing(hosts, theirs_before):
    _, inventory, variables = hosts
    run = deploy(inventory, variables, "--check", "--diff")
    assert run.rc == 0 and run.failed() == 0, run.output[-5000:]
    assert not infra(inventory, FRESH).package("docker.io").is_installed
    assert theirs(infra(inventory, OPERATOR)) == theirs_before
    for name in NAMES:
        host = infra(inventory, name)
        assert not host.file("/etc/zenvllm").exists
        assert not host.file("/etc/systemd/system/zenvllm-0.service").exists
        assert not host.file("/opt/zenvllm/lib").exists
    assert not infra(inventory, FRESH).file("/opt/zenvllm").exists


def test_deploy_then_second_run_changes_nothing(hosts):
    _, inventory, variables = hosts
    run = deploy(inventory, variables)
    assert run.rc == 0 and run.failed() == 0, run.output[-6000:]
    assert SECRET not in run.output
    again = deploy(inventory, variables)
    assert again.rc == 0 and again.changed() == 0, changed_tasks(again.output)
    check = deploy(inventory, variables, "--check", "--diff")
    assert check.rc == 0 and check.changed() == 0, changed_tasks(check.output)


def test_the_image_the_hosts_lacked_was_shipped_from_the_controller(hosts):
    """source=auto: the controller saved its engine's image once, and each host that
    lacked it received that archive and loaded it."""
    _, inventory, variables = hosts
    image_id = engine.docker("image", "inspect", "--format", "{{.Id}}", STANDIN).stdout.strip()
    name = f"zenvllm_standin_test-{image_id.removeprefix('sha256:')[:12]}.tar"
    saved = Path(variables["zenvllm_image_controller_dir"]) / name
    assert saved.is_file()
    for machine in NAMES:
        host = infra(inventory, machine)
        assert host.file(f"/var/lib/zenvllm/images/{name}").size == saved.stat().st_size
        loaded = host.check_output(f"docker image inspect --format '{{{{.Id}}}}' {STANDIN}")
        assert loaded == image_id


def test_the_engine_is_the_hosts_own_and_installed_only_where_there_was_none(hosts, theirs_before):
    _, inventory, _ = hosts
    record = "/var/lib/zenvllm/installed-packages/docker.io"
    fresh = infra(inventory, FRESH)
    assert fresh.package("docker.io").is_installed and fresh.service("docker").is_enabled
    assert fresh.file(record).content_string.startswith("Installed by zenvllm")
    operator = infra(inventory, OPERATOR)
    assert not operator.file(record).exists  # theirs: zenvllm never starts or enables it
    assert theirs(operator) == theirs_before
    # The instances run on that engine, and restart with its unit.
    unit = operator.file("/etc/systemd/system/zenvllm-0.service").content_string
    assert "Requires=docker.service" in unit and "DOCKER_HOST" not in unit
    assert operator.run("docker inspect zenvllm-0").rc == 0


@pytest.mark.parametrize("name", NAMES)
def test_hosts_run_what_the_plan_says(hosts, name):
    _, inventory, _ = hosts
    host = infra(inventory, name)
    plan = json.loads(
        host.check_output(
            "PYTHONPATH=/opt/zenvllm/lib/zenvllm.pyz python3 -m zenvllm.runtime plan --json "
            "--model /srv/models/tiny-llama --kv-cache-gib 1"
        )
    )
    assert plan["instances"]
    for instance in plan["instances"]:
        unit = f"{instance['name']}.service"
        assert host.service(unit).is_enabled and host.service(unit).is_running
        env_file = host.file(f"/etc/zenvllm/{instance['name']}.env")
        assert env_file.mode == 0o600 and env_file.user == "root"
        text = env_file.content_string
        for key, value in instance["env"].items():
            assert f"{key}={value}\n" in text
        assert f"VLLM_API_KEY={SECRET}\n" in text
        # What the running container actually received through --env-file.
        seen = json.loads(
            host.check_output(f"curl -sf http://127.0.0.1:{instance['port']}/standin/env")
        )
        assert seen["env"]["VLLM_CPU_OMP_THREADS_BIND"] == instance["omp_threads_bind"]
        assert seen["env"]["VLLM_CPU_KVCACHE_SPACE"] == str(instance["kv_cache_gib"])
        assert seen["uid"] == 10001
        unit_text = host.file(f"/etc/systemd/system/{unit}").content_string
        assert "--cap-add=SYS_NICE" in unit_text and "privileged" not in unit_text
        assert "--security-opt=seccomp=/etc/zenvllm/seccomp-numa.json" in unit_text
    for key, value in SYSCTLS.items():
        assert host.sysctl(key) == value
    profile = host.file("/etc/zenvllm/seccomp-numa.json")
    assert profile.mode == 0o644 and "get_mempolicy" in profile.content_string
    assert (
        ANSIBLE_DIR / "roles/zenvllm_instances/files/seccomp-numa.json"
    ).read_text() == profile.content_string
    assert "size=262144k" in host.mount_point("/dev/shm").options or "size=256m" in str(
        host.mount_point("/dev/shm").options
    )
    assert host.service("docker").is_running and host.service("nginx").is_running
    listening = host.check_output("ss -Hltn")
    for instance in plan["instances"]:
        assert f"127.0.0.1:{instance['port']} " in listening


@pytest.mark.parametrize("name", NAMES)
def test_the_gateway_is_closed_and_the_only_listener_off_loopback(hosts, name):
    """The account of what a deployment exposes, on a real systemd host."""
    _, inventory, _ = hosts
    host = infra(inventory, name)
    addresses = {line.split()[3] for line in host.check_output("ss -Hltn").splitlines()}
    outside = {a for a in addresses if not a.startswith(("127.", "[::1]"))}
    assert "0.0.0.0:443" in outside
    assert outside <= {"0.0.0.0:443", "0.0.0.0:22", "[::]:22", "*:22"}, outside  # and ssh
    key = (SECRETS / "zenvllm" / "keys" / "default").read_text().strip()
    ca = "/etc/zenvllm/tls/ca.pem"
    assert (SECRETS / "zenvllm" / f"{name}-ca.pem").read_text() == host.file(ca).content_string
    assert host.file("/etc/zenvllm/tls/gateway.key").mode == 0o600

    def status(path: str, auth: str = "", scheme: str = "https") -> str:
        header = f"-H 'Authorization: Bearer {auth}' " if auth else ""
        return host.check_output(
            f"curl -s -o /dev/null -w '%{{http_code}}' --cacert {ca} {header}"
            f"{scheme}://localhost:443{path}"
        )

    assert status("/standin/env") == "401"
    assert status("/standin/env", "not-the-key") == "401"
    assert status("/standin/env", key) == "200"
    assert status("/standin/env", SECRET) == "200"  # the operator's own key, beside it
    assert status("/metrics", key) == "404" and status("/health", key) == "404"
    assert status("/standin/env", key, scheme="http") == "301"  # plain HTTP: a redirect
    host.check_output("sleep 3")  # the limiter forgets the requests above
    burst = host.check_output(
        f"seq 30 | xargs -P 30 -I{{}} curl -s -o /dev/null -w '%{{http_code}}\\n' "
        f"--cacert {ca} -H 'Authorization: Bearer {key}' https://localhost:443/standin/env"
    ).split()
    assert set(burst) == {"200", "429"}, burst


def test_a_crashed_instance_comes_back_under_systemd(hosts):
    _, inventory, _ = hosts
    host = infra(inventory, NAMES[0])
    before = host.check_output("systemctl show -p MainPID --value zenvllm-0.service")
    host.run("docker kill zenvllm-0")
    host.run("for i in $(seq 60); do curl -sf http://127.0.0.1:8001/health && break; sleep 1; done")
    assert host.service("zenvllm-0.service").is_running
    assert host.check_output("systemctl show -p MainPID --value zenvllm-0.service") != before
    assert host.run("curl -sf http://127.0.0.1:8001/health").rc == 0


def test_a_rolling_update_replaces_only_zenvllms_containers(hosts, theirs_before):
    _, inventory, variables = hosts
    ids = "docker ps -q --no-trunc --filter label=zenvllm.managed"
    before = {n: set(infra(inventory, n).check_output(ids).split()) for n in NAMES}
    run = deploy(
        inventory, {**variables, "zenvllm_serial": 1, "zenvllm_instances_extra_env": {"R": "2"}}
    )
    assert run.rc == 0 and run.failed() == 0, run.output[-6000:]
    for name in NAMES:
        after = set(infra(inventory, name).check_output(ids).split())
        assert after and after.isdisjoint(before[name]), name
    assert theirs(infra(inventory, OPERATOR)) == theirs_before


def test_a_host_with_dockers_docker_ce_is_refused_before_any_change(hosts, tmp_path):
    """apt sees docker-ce installed (a stand-in package, made with dpkg-deb as equivs
    would): whether zenvllm would use it or install Debian's engine beside it, the play
    stops before its first change, naming docker-ce and the variable to set."""
    machines, inventory, variables = hosts
    machine = machines[2]
    package = tmp_path / "docker-ce"
    (package / "DEBIAN").mkdir(parents=True)
    (package / "DEBIAN/control").write_text(
        "Package: docker-ce\nVersion: 5:27.3.1-1~debian.12~bookworm\nArchitecture: amd64\n"
        "Maintainer: zenvllm tests <tests@invalid>\nDescription: stand-in for Docker's engine\n"
    )
    subprocess.run(
        ["dpkg-deb", "--build", str(package), str(machine.root / "root/docker-ce.deb")],
        check=True,
        capture_output=True,
    )
    ssh(machine, "dpkg -i /root/docker-ce.deb && touch /root/before-zenvllm && sleep 1")
    changed = (
        "find /etc /opt /srv /usr /var/lib/dpkg /var/lib/apt /var/lib/zenvllm -xdev "
        "-newer /root/before-zenvllm 2>/dev/null; dpkg-query -W | md5sum"
    )
    state = ssh(machine, changed).stdout
    cases = {
        "auto": "docker-ce is installed but no engine answers on the default socket",
        "distribution": "docker-ce is installed and conflicts with docker.io (it declares "
        "Conflicts: docker-ce)",
    }
    for mode, reason in cases.items():
        run = deploy(inventory.parent / "docker-ce.yml", {**variables, "zenvllm_host_engine": mode})
        assert run.rc != 0 and run.recap[DOCKER_CE]["changed"] == 0, run.output[-4000:]
        message = " ".join(run.output.split())
        assert reason in message, message[-3000:]
        assert "zenvllm_docker_host" in message or "zenvllm_host_engine=external" in message
        assert ssh(machine, changed).stdout == state, mode  # not a file, not a package


def test_host_settings_zenvllm_did_not_write_are_refused_untouched(hosts):
    _, inventory, variables = hosts
    host = infra(inventory, NAMES[0])
    host.run("echo 'vm.theirs = 1' > /etc/sysctl.d/61-theirs.conf")
    host.run("echo 'none /dev/shm tmpfs rw,size=1g 0 0' >> /etc/fstab")
    fstab = host.file("/etc/fstab").content_string
    try:
        theirs = {**variables, "zenvllm_host_sysctl_file": "/etc/sysctl.d/61-theirs.conf"}
        run = deploy(inventory, theirs, "--tags", "host", "--limit", NAMES[0])
        assert run.rc != 0
        assert "/etc/sysctl.d/61-theirs.conf exists and zenvllm did not write it" in run.output
        run = deploy(inventory, variables, "--tags", "host", "--limit", NAMES[0])
        assert run.rc != 0
        assert "/etc/fstab already mounts /dev/shm (none /dev/shm tmpfs rw,size=1g 0 0)" in (
            run.output
        ), run.output[-3000:]
        assert host.file("/etc/sysctl.d/61-theirs.conf").content_string == "vm.theirs = 1\n"
        assert host.file("/etc/fstab").content_string == fstab
    finally:
        host.run("rm -f /etc/sysctl.d/61-theirs.conf; sed -i '/^none \\/dev\\/shm /d' /etc/fstab")


def test_a_removal_that_does_not_manage_the_host_settings_leaves_them(hosts):
    """A deployment with zenvllm_host_manage_sysctls/_shm false shares the host's settings
    with one that manages them (another configuration directory, still serving): its
    removal leaves the other's sysctl file and fstab line. CI 70 caught the tutorial's
    fstab line lost to the routed fleet's local host's removal, beside it."""
    _, inventory, variables = hosts
    host = infra(inventory, NAMES[0])
    before = host.file("/etc/fstab").content_string, host.file(SYSCTL_FILE).content_string
    assert "tmpfs /dev/shm tmpfs defaults,nosuid,nodev,size=256m 0 0" in before[0], before
    unmanaged = {
        **variables,
        "zenvllm_state": "absent",
        "zenvllm_host_manage_sysctls": False,
        "zenvllm_host_manage_shm": False,
    }
    run = deploy(inventory, unmanaged, "--tags", "host", "--limit", NAMES[0])
    assert run.rc == 0 and run.changed() == 0, changed_tasks(run.output)
    assert (host.file("/etc/fstab").content_string, host.file(SYSCTL_FILE).content_string) == before


def test_undeploy_removes_what_deploy_made_and_again_changes_nothing(hosts):
    _, inventory, variables = hosts
    absent = {**variables, "zenvllm_state": "absent"}
    check = deploy(inventory, absent, "--check", "--diff")
    assert check.rc == 0 and check.failed() == 0 and check.changed() > 0, check.output[-5000:]
    assert infra(inventory, NAMES[0]).file("/etc/systemd/system/zenvllm-0.service").exists
    run = deploy(inventory, absent)
    assert run.rc == 0 and run.failed() == 0, run.output[-6000:]
    for name in NAMES:
        host = infra(inventory, name)
        assert host.check_output("docker ps --all --quiet --filter label=zenvllm.managed") == ""
        assert host.check_output("ls /etc/systemd/system | grep -c '^zenvllm' || true") == "0"
        for path in ("/etc/zenvllm", "/opt/zenvllm/lib", "/etc/nginx/conf.d/zenvllm.conf"):
            assert not host.file(path).exists, path
        assert not host.file("/opt/zenvllm/.zenvllm-parent").exists
        # The parent zenvllm made goes; the operator's, with their file in it, stays.
        assert host.file("/opt/zenvllm").exists == (name == OPERATOR)
        assert not host.file(SYSCTL_FILE).exists
        assert "/dev/shm" not in host.file("/etc/fstab").content_string
        # What it keeps: the model, the image, the engine and nginx (no longer serving it).
        assert host.file("/srv/models/tiny-llama/config.json").exists
        assert host.run(f"docker image inspect {STANDIN}").rc == 0
        assert host.service("docker").is_running and host.service("nginx").is_running
        assert host.run("curl -sf http://127.0.0.1:8000/health").rc != 0
    again = deploy(inventory, absent)
    assert again.rc == 0 and again.changed() == 0, changed_tasks(again.output)
    check = deploy(inventory, absent, "--check")
    assert check.rc == 0 and check.changed() == 0, changed_tasks(check.output)


def test_undeploy_left_the_operators_engine_container_and_image(hosts, theirs_before):
    _, inventory, _ = hosts
    host = infra(inventory, OPERATOR)
    assert theirs(host) == theirs_before
    assert host.service("docker").is_enabled and host.service("docker").is_running


PREVIOUS = "0.0.9"  # the release the upgrade starts from (there is no earlier one yet)


@contextlib.contextmanager
def calling(url: str, key: str, cafile: Path, every: float = 0.4) -> Iterator[list[str]]:
    """A client calling URL through the gateway until the block ends (under the rate
    limit): each reply's status, or the error that took its place."""
    got: list[str] = []
    stop = threading.Event()
    tls = ssl.create_default_context(cafile=str(cafile))
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {key}"})

    def call() -> None:
        while not stop.is_set():
            try:
                with urllib.request.urlopen(request, timeout=10, context=tls) as reply:
                    got.append(str(reply.status))
            except urllib.error.HTTPError as refused:
                got.append(str(refused.code))
            except OSError as error:
                got.append(type(error).__name__)
            stop.wait(every)

    thread = threading.Thread(target=call, daemon=True)
    thread.start()
    try:
        yield got
    finally:
        stop.set()
        thread.join()


@pytest.fixture
def operators_home() -> Iterator[Path]:
    """The operator's home, at a short path: ssh's control sockets under ~/.ansible/cp
    must fit a Unix socket's 108 bytes, which a home under pytest's tmp_path may not."""
    home = Path(tempfile.mkdtemp(prefix="zv-home-"))
    yield home
    shutil.rmtree(home, ignore_errors=True)


def test_a_release_installed_as_written_upgrades_the_operators_deployment(
    hosts, tmp_path, operators_home
):
    """The way an operator installs, runs and upgrades zenvllm, on the fresh host:
    - the previous release (this tree stamped 0.0.9: no earlier release exists) is in the
      operator's ~/.ansible/collections; their own playbook, in a directory of theirs with
      no ansible.cfg and no roles, calls the roles by their fully qualified names, with
      the planner the collection carries; the rest of their settings in group_vars;
    - the image comes from a real registry (Debian's docker-registry on the hosts'
      bridge, TLS with its own CA, basic auth): the image role installs the CA for that
      registry, logs in into a client config of zenvllm's own and pulls;
    - collection.md's two blocks as written install this release (a venv with the wheel
      and its deploy extra from PyPI, the collection over the old one, `zenvllm doctor`)
      and deploy it from the registry, while a client calls through the gateway: no
      call fails, the host runs this release's planner, and as it plans the host as the
      last release did, the instance is not restarted and the revision stays;
    - the collection's own playbook then removes it all but the image, and root's own
      Docker login was never touched."""
    machines, inventory, variables = hosts
    home, site, dist = operators_home, tmp_path / "site", tmp_path / "release" / "dist"
    (site / "group_vars").mkdir(parents=True)
    play = {"name": "Serve the model with zenvllm", "hosts": "zenvllm"}
    play["roles"] = [f"zenvllm.cpu.{role}" for role in OPERATORS_ROLES]
    (site / "site.yml").write_text(yaml.safe_dump([play], sort_keys=False))
    fresh = yaml.safe_load(inventory.read_text())
    fresh["zenvllm"]["hosts"] = {FRESH: fresh["zenvllm"]["hosts"][FRESH]}
    (site / "inventory.yml").write_text(yaml.safe_dump(fresh))
    theirs = {
        k: v
        for k, v in env().items()
        if not k.startswith("ANSIBLE_") and k not in ("PYTHONPATH", "VIRTUAL_ENV")
    }
    theirs.update(
        HOME=str(home),  # ~/.ansible/collections, ~/.venvs: the operator's own
        PATH="/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        PIP_CACHE_DIR=str(Path.home() / ".cache" / "pip"),  # this machine's, for speed
        ANSIBLE_HOST_KEY_CHECKING="False",
        ANSIBLE_NOCOLOR="1",
    )
    previous = build_collection(tmp_path / "previous", PREVIOUS)
    galaxy_run("install", "--offline", "--force", str(previous), environ=theirs)  # (ansible_run)
    wheel = subprocess.run(
        [sys.executable, "-m", "build", "--wheel", "--outdir", str(dist), str(REPO)],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert wheel.returncode == 0, wheel.stdout[-3000:] + wheel.stderr[-3000:]
    build_collection(dist.parent)

    def operator(playbook_name: str, extra: dict) -> Run:
        argv = playbooks.command(playbook_name, "-i", "inventory.yml", "-e", json.dumps(extra))
        done = subprocess.run(
            argv, cwd=site, env=theirs, capture_output=True, text=True, timeout=1200
        )
        return finished(done.returncode, done.stdout + done.stderr)

    host = infra(inventory, FRESH)
    host.run_expect([0], f"docker rmi {STANDIN}")  # so the pull below brings every layer
    with registry.running(tmp_path, hosts=(nspawn.NSPAWN_HOSTS.here,)) as reg:
        image = f"{reg.address}/zenvllm/standin:test"
        pusher = tmp_path / "docker-config"
        reg.login(pusher)
        engine.docker("tag", STANDIN, image)
        pushed = engine.docker(
            "push", "--quiet", image, check=False, timeout=600, env=registry.client_env(pusher)
        )
        engine.docker("rmi", image)
        assert pushed.returncode == 0, pushed.stderr
        # What collection.md's deploy block gives with -e; the rest is the operator's group_vars.
        given = {
            "zenvllm_image": image,
            "zenvllm_image_source": "registry",
            "zenvllm_model_src": variables["zenvllm_model_src"],
            "zenvllm_model_dir": variables["zenvllm_model_dir"],
        }
        kept = {k: v for k, v in variables.items() if k not in (*given, "zenvllm_planner")}
        kept.update(
            zenvllm_image_registry_username=reg.user,
            zenvllm_image_registry_password=reg.password,
            zenvllm_image_registry_ca=str(reg.ca),
        )
        (site / "group_vars" / "zenvllm.yml").write_text(yaml.safe_dump(kept))
        run = operator("site.yml", given)
        assert run.rc == 0 and run.failed() == 0, run.output[-6000:]
        assert reg.password not in run.output
        assert "TASK [zenvllm.cpu.zenvllm_instances : " in run.output
        assert host.file("/opt/zenvllm/lib/zenvllm.pyz").sha256sum == sha256_of(
            tmp_path / f"previous/ansible-{PREVIOUS}/roles/zenvllm_instances/files/zenvllm.pyz"
        )
        assert host.run("curl -sf http://127.0.0.1:8001/health").rc == 0
        assert host.check_output("docker inspect --format '{{.Config.Image}}' zenvllm-0") == (image)
        trust = host.file(f"/etc/docker/certs.d/{reg.address}/ca.crt").content_string
        assert trust.startswith("# zenvllm: ") and reg.ca.read_text().strip() in trust
        assert reg.address in host.file("/etc/zenvllm/registry/config.json").content_string
        assert host.file("/etc/zenvllm/registry").mode == 0o700
        assert not host.file("/root/.docker/config.json").exists
        # Not run a second time: the release under test is the next one, and the same
        # roles' second run changing nothing is test_deploy_then_second_run_changes_nothing's.
        revision = deployed_revision(host)
        assert f"zenvllm {PREVIOUS}" in revision
        started = host.check_output("docker inspect --format '{{.Id}}' zenvllm-0")

        gateway = f"https://{machines[0].address}/standin/env"
        key, cafile = gateway_key("zenvllm"), gateway_ca("zenvllm", FRESH)
        with calling(gateway, key, cafile) as got:
            install = readme.run("collection-install", cwd=dist, env=theirs, timeout=900)
            assert install.returncode == 0, install.stdout[-3000:] + install.stderr[-3000:]
            doctor = install.stdout
            operators = {**theirs, "PATH": f"{home}/.venvs/zenvllm/bin:{theirs['PATH']}"}
            placeholders = {
                "registry.example:5000/zenvllm/zen:0.32.0": image,
                "/srv/models/Qwen2.5-1.5B-Instruct": given["zenvllm_model_src"],
                "/srv/models/qwen": given["zenvllm_model_dir"],
            }
            upgrade = readme.run(
                "collection-deploy", placeholders, cwd=site, env=operators, timeout=1200
            )
            assert upgrade.returncode == 0, upgrade.stdout[-6000:] + upgrade.stderr[-3000:]
        assert got and set(got) == {"200"}, Counter(got)
        print(f"calls through the gateway during the upgrade: {Counter(got)}")
        assert "vllm-openai" in doctor  # the installed CLI ran: what this CPU can run
        installed = home / ".ansible/collections/ansible_collections/zenvllm/cpu"
        manifest = json.loads((installed / "MANIFEST.json").read_text())
        assert manifest["collection_info"]["version"] == __version__
        assert host.file("/opt/zenvllm/lib/zenvllm.pyz").sha256sum == sha256_of(
            installed / "roles/zenvllm_instances/files/zenvllm.pyz"
        )
        # This release plans the host as the last did: nothing is rolled out, so the
        # instance keeps running and the host keeps the revision that put it there.
        assert host.check_output("docker inspect --format '{{.Id}}' zenvllm-0") == started
        assert deployed_revision(host) == revision
        assert host.run("curl -sf http://127.0.0.1:8001/health").rc == 0

        gone = operator("zenvllm.cpu.deploy", {**given, "zenvllm_state": "absent"})
        assert gone.rc == 0 and gone.failed() == 0, gone.output[-6000:]
    assert host.check_output("docker ps --all --quiet --filter label=zenvllm.managed") == ""
    for path in ("/opt/zenvllm", "/etc/zenvllm", f"/etc/docker/certs.d/{reg.address}"):
        assert not host.file(path).exists, path
    assert host.run(f"docker image inspect {image}").rc == 0  # the image stays


def deployed_revision(host) -> str:
    """The revision the host serves, as `zenvllm revision list` names it."""
    listed = host.check_output(
        "PYTHONPATH=/opt/zenvllm/lib/zenvllm.pyz python3 -m zenvllm.runtime revision list"
        " --dir /var/lib/zenvllm/revisions/zenvllm"
    )
    (serving,) = [line for line in listed.splitlines() if line.startswith("* ")]
    return serving
