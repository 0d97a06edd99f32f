"""Cloud VMs from first boot to a verified model, for real.

First boot: Debian's cloud-init (22.4) in the image, a NoCloud seed with the example
user data and the key pair, as Nova gives them. Two machines booted once serve every
assertion: `cloud-new` gets an empty volume (the user data formats and mounts it),
`cloud-kept` a volume that already holds a model (it must be mounted as it is, nothing
lost). Afterwards each host must be ready for deploy.yml as the OpenStack inventory
reaches it (user `debian`, its key, sudo, python3 with apt) and nothing else may have
changed.

Then the model's delivery (the instances role's tasks/model.yml), as the `debian` user
with become, onto the volume: from a mirror (nginx on this machine, over the hosts'
network) and from the controller's directory (rsync over ssh), each cut in the middle
of its largest file and resumed; a verified copy transfers nothing; the operator's
differing model directory is refused untouched, their identical one used as it is.

A container's systemd ignores fstab's device entries, so the mount after a reboot
(plain fstab on a VM) is not tested here; the first boot's mount is cloud-init's own.
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import hashlib
import json
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest
import yaml
from conftest import REPO, require_tool
from support import engine, gateway, readme
from support.ansible_run import BIN, Run, env, finished, planner_zipapp, playbook, start_playbook
from support.nspawn import (
    CLOUD_VMS,
    SSH_OPTIONS,
    FirstBoot,
    Machine,
    ensure_cloud_layer,
    fleet,
    ssh_argv,
)
from support.openstack_replay import clouds_yaml, replay
from support.readme import block
from support.tiny_model import ensure_tiny_model

pytestmark = pytest.mark.ansible

USER_DATA = REPO / "ansible" / "inventories" / "cloud-init.example.yml"
KEPT = "config.json\nmodel.safetensors\n"  # what the kept volume's model directory lists


def volume(path: Path, filled: bool) -> Path:
    """A 64 MiB disk image: empty, or ext4 labelled models with a model directory on it."""
    subprocess.run(["truncate", "-s", "64M", str(path)], check=True)
    if filled:
        tree = path.with_suffix(".d")
        (tree / "tiny").mkdir(parents=True)
        for name in KEPT.split():
            (tree / "tiny" / name).write_text(f"{name} of the operator\n")
        subprocess.run(
            ["mkfs.ext4", "-q", "-L", "models", "-d", str(tree), str(path)],
            check=True,
            capture_output=True,
        )
    return path


def on(machine: Machine, command: str, timeout: float = 120) -> str:
    proc = subprocess.run(
        ssh_argv(machine, command), capture_output=True, text=True, timeout=timeout, check=True
    )
    return proc.stdout


def first_boot_done(machine: Machine, timeout: float = 300) -> str:
    """`cloud-init status --wait` once the key is in place (sshd answers before that)."""
    deadline = time.monotonic() + timeout
    while True:
        proc = subprocess.run(
            ssh_argv(machine, "cloud-init status --wait --long"),
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        if proc.returncode != 255 or time.monotonic() > deadline:
            return proc.stdout + proc.stderr
        time.sleep(1)


def image_packages() -> set[str]:
    """The packages of the image (the cloud layer over the rootfs), before first boot."""
    # Installing cloud-init rewrote dpkg's status, so the layer has the whole list.
    status = ensure_cloud_layer() / "var/lib/dpkg/status"
    return {
        line.split(": ", 1)[1]
        for line in status.read_text().splitlines()
        if line.startswith("Package: ")
    }


@pytest.fixture(scope="module")
def vms(tmp_path_factory):
    require_tool("systemd-nspawn")
    require_tool("mkfs.ext4")
    work = tmp_path_factory.mktemp("cloud")
    first_boot = FirstBoot(
        user_data=USER_DATA.read_text(),
        volumes={
            "cloud-new": volume(work / "new.img", filled=False),
            "cloud-kept": volume(work / "kept.img", filled=True),
        },
    )
    started = time.monotonic()
    with fleet(["cloud-new", "cloud-kept"], work, CLOUD_VMS, first_boot=first_boot) as machines:
        statuses = {m.name: first_boot_done(m) for m in machines}
        yield {m.name: m for m in machines}, statuses, time.monotonic() - started, work


def test_first_boot_completes(vms):
    machines, statuses, seconds, _ = vms
    for name, status in statuses.items():
        assert "status: done" in status, f"{name}: {status}"
        assert "DataSourceNoCloud" in status
    assert seconds < 300
    for machine in machines.values():
        # The image's default user with the instance's key, sudo without a password,
        # and root refused with that key (cloud-init's disable_root: a forced command).
        assert on(machine, "id -un").strip() == "debian"
        assert on(machine, "sudo -n id -u").strip() == "0"
        root = dataclasses.replace(machine, user="root")
        refused = subprocess.run(ssh_argv(root, "true"), capture_output=True, text=True)
        assert refused.returncode != 0
        assert 'login as the user "debian"' in refused.stdout
        assert on(machine, "python3 -c 'import apt; print(apt.__name__)'").strip() == "apt"


def test_volume_formatted_only_when_empty(vms):
    machines, _, _, _ = vms
    for machine in machines.values():
        mount = json.loads(on(machine, "findmnt --json /srv/models"))["filesystems"][0]
        assert (mount["source"], mount["fstype"]) == ("/dev/vdb", "ext4"), machine.name
        assert on(machine, "sudo -n blkid -s LABEL -o value /dev/vdb").strip() == "models"
    assert on(machines["cloud-new"], "ls -A /srv/models").split() == ["lost+found"]
    kept = machines["cloud-kept"]
    assert on(kept, "ls /srv/models/tiny") == KEPT
    assert on(kept, "cat /srv/models/tiny/config.json") == "config.json of the operator\n"


def test_nothing_else_changed(vms):
    machines, _, _, _ = vms
    before = image_packages()
    for machine in machines.values():
        after = set(on(machine, "dpkg-query -W -f '${Package}\\n'").split())
        # python3-apt and what it depends on; sudo and python3 were in the image.
        assert after - before == {"python3-apt", "python-apt-common", "distro-info-data"}
        assert before - after == set()
        fstab = [x for x in on(machine, "cat /etc/fstab").splitlines() if not x.startswith("#")]
        assert [x.split()[:3] for x in fstab] == [["/dev/vdb", "/srv/models", "ext4"]]
        assert on(machine, "getent passwd debian").startswith("debian:")
        users = on(machine, "awk -F: '$3 >= 1000 && $3 < 60000 {print $1}' /etc/passwd")
        assert users.split() == ["debian"]
        assert on(machine, "ls /etc/sysctl.d").split() == ["99-sysctl.conf", "README.sysctl"]


def test_ansible_reaches_the_host_as_the_inventory_does(vms):
    """What deploy.yml needs from the host: the openstack example's ansible_user and
    become, python3 at /usr/bin/python3, facts."""
    machines, _, _, work = vms
    inventory = work / "inventory.yml"
    example = yaml.safe_load((REPO / "ansible/inventories/openstack.example.yml").read_text())
    user = yaml.safe_load(example["compose"]["ansible_user"])  # a Jinja2 string literal
    hosts = {
        m.name: {"ansible_host": m.address, "ansible_ssh_private_key_file": str(m.key)}
        for m in machines.values()
    }
    inventory.write_text(
        yaml.safe_dump(
            {"zenvllm": {"hosts": hosts, "vars": {"ansible_user": user.strip("'")}}},
        )
    )
    proc = subprocess.run(
        [
            *(str(BIN / "ansible"), "-i", str(inventory), "zenvllm", "--become"),
            *("-m", "setup", "-a", "filter=ansible_user_id,ansible_python,ansible_mounts"),
        ],
        cwd=REPO / "ansible",
        env={**env(), "ANSIBLE_LOAD_CALLBACK_PLUGINS": "1", "ANSIBLE_STDOUT_CALLBACK": "json"},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    results = json.loads(proc.stdout)["plays"][0]["tasks"][0]["hosts"]
    assert sorted(results) == sorted(machines)
    for facts in (r["ansible_facts"] for r in results.values()):
        assert facts["ansible_user_id"] == "root"
        assert facts["ansible_python"]["executable"] == "/usr/bin/python3"
        assert "/srv/models" in {m["mount"] for m in facts["ansible_mounts"]}


# ------------------------------------------------------------ README's quick start 3

QS3_CLOUD = REPO / "tests" / "fixtures" / "openstack" / "quick-start-3.json"
QS3_MODEL = "Qwen2.5-1.5B-Instruct"  # README's name for it
IMAGE = "zenvllm/vllm-openai:0.32.0"


@dataclasses.dataclass
class Operator:
    """An operator's controller: a checkout (a copy of ansible/), a home with their
    model in ~/models (and, once deployed, the key store in ~/.config/zenvllm), and
    their environment for a cloud (clouds.yaml written per replay)."""

    machine: Machine
    checkout: Path
    home: Path
    environ: dict[str, str]

    def run(
        self,
        name: str,
        cloud_dir: Path,
        placeholders: dict[str, str] | None = None,
        where: str = "",  # the checkout's directory the page runs the block in
    ):
        """Block NAME run as written against the replayed cloud: its output, and the
        cloud (what the clients asked of it)."""
        with replay(QS3_CLOUD, values={"address": self.machine.address}) as cloud:
            environ = self.environ | {
                "OS_CLIENT_CONFIG_FILE": str(clouds_yaml(cloud, cloud_dir)),
                "OS_CLOUD": "lab",
            }
            cwd = self.checkout / where
            start = time.monotonic()
            done = readme.run(name, placeholders, cwd=cwd, env=environ, timeout=1800)
            print(f"{name}: {time.monotonic() - start:.0f} s")
        return done, cloud

    def containers(self) -> list[str]:
        """The containers running on the VM (its own engine), by ID."""
        return sorted(on(self.machine, "sudo -n docker ps -q --no-trunc").split())

    def completion(self) -> dict:
        """A client's completion through the VM's gateway, trusting the CA the play left."""
        url = f"https://{self.machine.address}/v1/completions"
        body = {"model": QS3_MODEL, "prompt": "Hello", "max_tokens": 8, "ignore_eos": True}
        secrets = self.home / ".config" / "zenvllm"
        status, _, answer = gateway.request(url, "zenvllm", body, host="llm-a", secrets=secrets)
        assert status == 200, answer
        return answer


@pytest.fixture(scope="module")
def operator(vms, tmp_path_factory):
    """cloud-new, booted by cloud-init from the example user data, its empty volume
    formatted on /srv/models, nothing of zenvllm on it, is the server the replayed cloud
    (tests/fixtures/openstack/quick-start-3.json) creates: its fixed and floating address
    are the VM's. The operator's key for the image's `debian` user is the VM's
    (ANSIBLE_PRIVATE_KEY_FILE); the image is built on the controller; group_vars of theirs
    beside the inventory hold what this shared machine and an nspawn VM need (quick start
    2's: a 1 GiB KV cache, eager mode, net.* sysctls only, the controller's image
    archives)."""
    machines, _, _, _ = vms
    work = tmp_path_factory.mktemp("operator")
    if engine.docker("image", "inspect", IMAGE, check=False).returncode != 0:
        engine.build("vllm-openai", work / "build.log")
    checkout, home = work / "checkout", work / "home"
    shutil.copytree(REPO / "ansible", checkout / "ansible", symlinks=True)
    shutil.copytree(ensure_tiny_model(), home / "models" / QS3_MODEL)
    theirs = {
        "zenvllm_host_sysctls": {"net.core.somaxconn": 4096},
        "zenvllm_instances_kv_cache_gib": 1,
        "zenvllm_instances_serve_args": ["--enforce-eager"],
        "zenvllm_image_controller_dir": str(engine.image_archive(IMAGE).parent),
    }
    group_vars = checkout / "ansible" / "inventories" / "group_vars"
    group_vars.mkdir()
    (group_vars / "zenvllm.yml").write_text(yaml.safe_dump(theirs))
    environ = {k: v for k, v in env().items() if not k.startswith(("ANSIBLE_", "ZENVLLM_"))}
    machine = machines["cloud-new"]
    environ |= {
        "HOME": str(home),
        "PATH": f"{BIN}:{os.environ['PATH']}",
        "ANSIBLE_PRIVATE_KEY_FILE": str(machine.key),
        "ANSIBLE_SSH_COMMON_ARGS": " ".join(SSH_OPTIONS),
        "DOCKER_HOST": engine.engine_env()["DOCKER_HOST"],
    }
    return Operator(machine, checkout, home, environ)


def test_quick_start_3_serves_the_vm_it_boots_as_written(operator, tmp_path):
    """README's quick start 3 as written: plan, boot, the inventory, the deploy; the play
    ships the image, sends the model and ends with its own completion; then a client's."""
    done, cloud = operator.run("quick-start-3", tmp_path)
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-2000:]
    assert not cloud.unmatched, cloud.unmatched
    (server,) = [b["server"] for b in cloud.bodies if "server" in b]
    assert server["metadata"] == {"role": "zenvllm"} and server["name"] == "llm-a"
    (volume,) = [d for d in server["block_device_mapping_v2"] if d["source_type"] == "volume"]
    assert volume["uuid"] and volume["boot_index"] in (-1, "-1"), volume
    assert base64.b64decode(server["user_data"]).decode() == USER_DATA.read_text()
    assert "host: flavor epyc-9454-24c-96g" in done.stdout  # the plan before booting
    assert f"{QS3_MODEL} answered through the gateway" in done.stdout
    assert "TASK [zenvllm_image : Send the image archive to the host" in done.stdout
    assert operator.completion()["usage"]["completion_tokens"] == 8
    model = operator.home / "models" / QS3_MODEL
    listed = on(operator.machine, f"ls /srv/models/{QS3_MODEL}").split()
    assert listed == sorted(p.name for p in model.iterdir())


def test_the_openstack_pages_boot_and_deploy_steps_run_as_written(operator, tmp_path):
    """docs/how-to/openstack.md's step 2 (the security group's two ports, the volume, the
    server) and step 5 (check, deploy, curl) on the VM quick start 3 deployed: the check
    and the deploy again change nothing of what serves, the curl gets its completion."""
    here = CLOUD_VMS.here
    boot, cloud = operator.run("openstack-boot", tmp_path, {"CONTROLLER_IP": here})
    assert boot.returncode == 0, boot.stdout[-3000:] + boot.stderr[-3000:]
    assert not cloud.unmatched, cloud.unmatched
    rules = [b["security_group_rule"] for b in cloud.bodies if "security_group_rule" in b]
    opened = [(r["port_range_min"], r.get("remote_ip_prefix")) for r in rules]
    assert opened == [(22, f"{here}/32"), (443, "0.0.0.0/0")], opened  # the client fills in any
    (server,) = [b["server"] for b in cloud.bodies if "server" in b]
    assert server["security_groups"], server
    before = operator.containers()
    deploy, _ = operator.run(
        "openstack-deploy", tmp_path, {"FLOATING_IP": operator.machine.address}, "ansible"
    )
    assert deploy.returncode == 0, deploy.stdout[-6000:] + deploy.stderr[-2000:]
    answer = json.loads(deploy.stdout[deploy.stdout.rindex('{"id"') :])
    assert answer["choices"][0]["text"] and answer["model"] == QS3_MODEL, answer
    assert operator.containers() == before  # nothing serving was replaced


# ---------------------------------------------------------------- the model's delivery

MIB = 1024 * 1024
SHARD = 8 * MIB  # random: neither rsync nor a proxy can squeeze it
MIRROR_PORT = 18480
HF_PATH = "zenvllm/tiny-shard/resolve/main"
DELIVER = """\
- name: Put the model on the host, verified
  hosts: zenvllm
  become: true
  gather_facts: false
  tasks:
    - name: Install what the host needs (rsync for zenvllm_model_src), as deploy.yml does first
      ansible.builtin.include_role:
        name: zenvllm_host
        tasks_from: packages
    - name: Install the zenvllm package
      ansible.builtin.include_role:
        name: zenvllm_instances
        tasks_from: planner
    - name: Deliver the model
      ansible.builtin.include_role:
        name: zenvllm_instances
        tasks_from: model
"""


class Nginx:
    """Debian's nginx on this machine's bridge address: the model mirror."""

    PROBE = "/zenvllm-mirror-probe"  # outside the mirror: 404, and not in log()

    def __init__(self, work: Path, root: Path):
        self.work, self.root = work, root
        self.proc: subprocess.Popen | None = None
        # The Hugging Face layout HF_ENDPOINT mirrors serve: <org>/<model>/resolve/<revision>.
        self.url = f"http://{CLOUD_VMS.here}:{MIRROR_PORT}/{HF_PATH}"

    def start(self, rate: str = "0") -> None:
        self.stop()
        with socket.socket() as probe:  # a mirror left by another run must not answer
            assert probe.connect_ex((CLOUD_VMS.here, MIRROR_PORT)) != 0, f"{MIRROR_PORT} is taken"
        conf = self.work / "nginx.conf"
        temp = " ".join(
            f"{kind}_temp_path {self.work}/{kind};"
            for kind in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi")
        )
        conf.write_text(
            f"""user root;
worker_processes 1;
pid {self.work}/nginx.pid;
error_log {self.work}/error.log;
events {{}}
http {{
  log_format zv '$uri $status "$http_range" $body_bytes_sent';
  access_log {self.work}/access.log zv;
  {temp}
  server {{ listen {CLOUD_VMS.here}:{MIRROR_PORT}; root {self.root}; limit_rate {rate}; }}
}}
"""
        )
        self.proc = subprocess.Popen(
            ["nginx", "-e", "stderr", "-p", str(self.work), "-c", str(conf), "-g", "daemon off;"]
        )
        # Asked until it answers, at a path of its own: nginx logs a request after its
        # reply, so a probe of the model's files could be logged after a test counted.
        probe = f"http://{CLOUD_VMS.here}:{MIRROR_PORT}{self.PROBE}"
        deadline = time.monotonic() + 10
        while subprocess.run(["curl", "-s", "-o", "/dev/null", probe]).returncode:
            assert time.monotonic() < deadline and self.proc.poll() is None, "nginx did not start"
            time.sleep(0.1)

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()  # fast shutdown: open transfers are cut
            self.proc.wait(timeout=10)

    def log(self) -> list[list[str]]:
        """Each request of the hosts (not start's probes): path, status, Range asked, bytes sent."""
        path = self.work / "access.log"
        lines = path.read_text().splitlines() if path.exists() else []
        entries = [line.replace('"', "").split(" ") for line in lines]
        return [entry for entry in entries if entry[0] != self.PROBE]


def descendants(pid: int) -> list[int]:
    """Every process under `pid`, however deep (Ansible's workers start sessions of
    their own, so killing the play's process group would miss its rsync)."""
    parents = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError):
            fields = stat.read_text().rsplit(")", 1)[1].split()
            parents[int(stat.parent.name)] = int(fields[1])
    found, todo = [], [pid]
    while todo:
        current = todo.pop()
        children = [child for child, parent in parents.items() if parent == current]
        found += children
        todo += children
    return found


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@dataclasses.dataclass
class Delivery:
    machines: dict[str, Machine]
    model: Path
    manifest: Path
    inventory: Path
    play: Path
    nginx: Nginx
    planner: Path

    def variables(self, extra: dict) -> dict:
        return {"zenvllm_planner": str(self.planner), **extra}

    def run(self, host: str, *more: str, **extra) -> Run:
        argv = ("-i", str(self.inventory), "--limit", host, *more)
        return playbook(*argv, extra_vars=self.variables(extra), playbook_file=str(self.play))

    def start(self, host: str, **extra) -> subprocess.Popen:
        argv = ("-i", str(self.inventory), "--limit", host)
        return start_playbook(*argv, extra_vars=self.variables(extra), playbook_file=str(self.play))

    def size_on(self, host: str, pattern: str) -> int:
        """The size of the first file matching the shell pattern on the host (0: none)."""
        # sudo: rsync makes its partial directory 0700.
        out = on(self.machines[host], f"sudo -n sh -c 'stat -c %s {pattern} 2>/dev/null' | head -1")
        return int(out.strip() or 0)

    def wait_for(self, host: str, pattern: str, proc: subprocess.Popen) -> int:
        deadline = time.monotonic() + 120
        while (size := self.size_on(host, pattern)) < MIB:
            assert proc.poll() is None, proc.stdout.read() if proc.stdout else ""
            assert time.monotonic() < deadline, f"no {pattern} on {host}"
            time.sleep(0.2)
        return size

    def hashes_on(self, host: str, directory: str) -> dict[str, str]:
        out = on(
            self.machines[host],
            f"cd {directory} && sha256sum config.json tokenizer.json model.safetensors",
        )
        return {name: digest for digest, name in (line.split() for line in out.splitlines())}

    def hashes(self) -> dict[str, str]:
        return {p.name: sha256(p) for p in self.model.iterdir()}


@pytest.fixture(scope="module")
def delivery(vms):
    machines, _, _, work = vms
    model = work / "mirror" / HF_PATH
    model.mkdir(parents=True)
    (model / "config.json").write_text(json.dumps({"model_type": "llama", "hidden_size": 64}))
    (model / "tokenizer.json").write_text(json.dumps({"version": "1.0", "model": {}}))
    (model / "model.safetensors").write_bytes(random.Random(7).randbytes(SHARD))
    # The manifest as docs/how-to/openstack.md's step 4 makes it, run as written.
    (work / "Qwen2.5-1.5B-Instruct").symlink_to(model)
    made = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", block("model-manifest")],
        cwd=work,
        env=env(),
        capture_output=True,
        text=True,
    )
    assert made.returncode == 0, made.stderr
    manifest = work / "Qwen2.5-1.5B-Instruct.manifest.json"
    assert sorted(json.loads(manifest.read_text())["files"]) == [
        "config.json",
        "model.safetensors",
        "tokenizer.json",
    ]
    inventory = work / "delivery-inventory.yml"
    inventory.write_text(
        yaml.safe_dump(
            {
                "zenvllm": {
                    "hosts": {
                        m.name: {
                            "ansible_host": m.address,
                            "ansible_ssh_private_key_file": str(m.key),
                        }
                        for m in machines.values()
                    },
                    "vars": {
                        "ansible_user": "debian",
                        "ansible_ssh_common_args": " ".join(SSH_OPTIONS),
                    },
                }
            }
        )
    )
    play = work / "deliver.yml"
    play.write_text(DELIVER)
    nginx = Nginx(work, work / "mirror")
    yield Delivery(machines, model, manifest, inventory, play, nginx, planner_zipapp(work))
    nginx.stop()


def test_model_from_a_mirror_resumes_after_a_cut(delivery):
    host, where = "cloud-new", "/srv/models/m"
    url = {
        "zenvllm_model_dir": where,
        "zenvllm_model_url": delivery.nginx.url,
        "zenvllm_model_manifest": str(delivery.manifest),
    }
    delivery.nginx.start(rate="1m")  # 8 s for the shard: time to cut it
    proc = delivery.start(host, **url)
    kept = delivery.wait_for(host, f"{where}/.zenvllm-partial/model.safetensors", proc)
    delivery.nginx.stop()
    cut = finished(proc.wait(timeout=120), proc.stdout.read())
    assert cut.rc != 0
    assert re.search(
        r"model\.safetensors: transfer cut at [\d,]+ of 8,388,608 bytes; run again", cut.output
    ), cut.output[-3000:]
    partial = delivery.size_on(host, f"{where}/.zenvllm-partial/model.safetensors")
    assert kept <= partial < SHARD
    # Files in their order: those before the cut are in place, none after it.
    assert on(delivery.machines[host], f"ls {where}").split() == ["config.json"]

    delivery.nginx.start()
    done = delivery.run(host, **url)
    assert done.rc == 0 and done.changed() > 0, done.output[-3000:]
    last = [entry for entry in delivery.nginx.log() if entry[0] == f"/{HF_PATH}/model.safetensors"][
        -1
    ]
    # Asked only for the rest, and given only the rest.
    assert last[1:] == ["206", f"bytes={partial}-", str(SHARD - partial)], last
    assert delivery.hashes_on(host, where) == delivery.hashes()
    assert on(delivery.machines[host], f"ls -A {where}").split() == [
        ".zenvllm-model",
        "config.json",
        "model.safetensors",
        "tokenizer.json",
    ]
    owner = on(delivery.machines[host], f"stat -c '%U %a' {where}/model.safetensors").strip()
    assert owner == "root 644"

    asked = len(delivery.nginx.log())
    again = delivery.run(host, **url)
    assert again.rc == 0 and again.changed() == 0, again.output[-3000:]
    assert len(delivery.nginx.log()) == asked  # a verified copy asks the mirror nothing


def test_model_from_the_controller_resumes_after_a_cut(delivery):
    host, where = "cloud-new", "/srv/models/r"
    src = {"zenvllm_model_dir": where, "zenvllm_model_src": str(delivery.model)}
    proc = delivery.start(host, **src, zenvllm_instances_model_rsync_opts=["--bwlimit=1m"])
    # rsync writes the file being received beside it, under a temporary name.
    delivery.wait_for(host, f"{where}/.model.safetensors.*", proc)
    for pid in [proc.pid, *descendants(proc.pid)]:  # the controller dies: play, ssh, rsync
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    proc.wait(timeout=30)
    deadline = time.monotonic() + 60
    while on(delivery.machines[host], "pgrep -x rsync || true").strip():
        assert time.monotonic() < deadline, "the host's rsync outlived its connection"
        time.sleep(0.5)
    partial = delivery.size_on(host, f"{where}/.zenvllm-partial/model.safetensors")
    assert MIB <= partial < SHARD
    assert not delivery.size_on(host, f"{where}/model.safetensors")

    done = delivery.run(host, "-v", **src, zenvllm_instances_model_rsync_opts=["--stats"])
    assert done.rc == 0, done.output[-3000:]
    literal = int(re.search(r"Literal data: ([\d,]+) bytes", done.output)[1].replace(",", ""))
    assert literal <= SHARD - partial + 64 * 1024, (literal, partial)  # the rest, not the whole
    assert delivery.hashes_on(host, where) == delivery.hashes()

    again = delivery.run(host, **src)
    assert again.rc == 0 and again.changed() == 0, again.output[-3000:]
    # Verified: rsync is not even started.
    rsync = re.search(r"Send the model from the controller[^\n]*\n(\S+)", again.output)
    assert rsync and rsync[1] == "skipping:", again.output[-3000:]


def test_the_operators_model_directory_is_never_overwritten(delivery):
    host, machine = "cloud-kept", delivery.machines["cloud-kept"]
    before = on(machine, "ls -lA --time-style=full-iso /srv/models/tiny && cat /srv/models/tiny/*")
    delivery.nginx.start()
    asked = len(delivery.nginx.log())
    refused = delivery.run(
        host,
        zenvllm_model_dir="/srv/models/tiny",
        zenvllm_model_url=delivery.nginx.url,
        zenvllm_model_manifest=str(delivery.manifest),
    )
    said = " ".join(refused.output.split())
    assert refused.rc != 0
    assert "/srv/models/tiny holds files zenvllm did not write" in said, said[-3000:]
    assert "config.json holds 28 bytes, not 42; model.safetensors holds" in said, said[-3000:]
    assert (
        on(machine, "ls -lA --time-style=full-iso /srv/models/tiny && cat /srv/models/tiny/*")
        == before
    )
    assert len(delivery.nginx.log()) == asked

    # The operator's own identical copy (a shared volume, say): verified, used as it is.
    copy = "/srv/models/theirs"
    for path in delivery.model.iterdir():
        subprocess.run(
            [
                "scp",
                *SSH_OPTIONS,
                "-q",
                "-i",
                str(machine.key),
                str(path),
                f"debian@{machine.address}:/tmp/{path.name}",
            ],
            check=True,
        )
    names = " ".join(sorted(p.name for p in delivery.model.iterdir()))
    on(
        machine,
        f"sudo mkdir {copy} && cd /tmp && sudo cp {names} {copy}/",
    )
    listed = on(machine, f"ls -lA --time-style=full-iso {copy}")
    used = delivery.run(host, zenvllm_model_dir=copy, zenvllm_model_manifest=str(delivery.manifest))
    assert used.rc == 0 and used.changed() == 0, used.output[-3000:]
    assert on(machine, f"ls -lA --time-style=full-iso {copy}") == listed  # no marker, nothing
    assert len(delivery.nginx.log()) == asked
