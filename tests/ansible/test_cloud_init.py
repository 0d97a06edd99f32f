"""The cloud-init example's first boot, for real: Debian's cloud-init (22.4) in the
image, a NoCloud seed with the example user data and the key pair, as Nova gives them.

Two machines booted once serve every assertion: `cloud-new` gets an empty volume (the
user data formats and mounts it), `cloud-kept` a volume that already holds a model
(it must be mounted as it is, nothing lost). Afterwards each host must be ready for
deploy.yml as the OpenStack inventory reaches it (user `debian`, its key, sudo, python3
with apt) and nothing else may have changed.

A container's systemd ignores fstab's device entries, so the mount after a reboot
(plain fstab on a VM) is not tested here; the first boot's mount is cloud-init's own.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import time
from pathlib import Path

import pytest
import yaml
from conftest import REPO, require_tool
from support.ansible_run import BIN, env
from support.nspawn import FirstBoot, Machine, ensure_cloud_layer, fleet, ssh_argv

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
    with fleet(["cloud-new", "cloud-kept"], work, first_boot=first_boot) as machines:
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
