"""Real test hosts with systemd as PID 1: systemd-nspawn machines on a private bridge.

    rootfs = ensure_rootfs()                    # debootstrap, cached in $ZENVLLM_CACHE
    with fleet(["nspawn-a", "nspawn-b"], workdir, NSPAWN_HOSTS) as hosts:
        ... ssh root@host.address with hosts[0].key ...

One cached Debian rootfs (openssh-server, python3, systemd, dbus, iproute2)
serves as the read-only lower layer of one overlay per host. The hosts have no
network beyond the bridge, so the rootfs carries a flat apt repository with
exactly the packages the roles install (downloaded once, with their
dependency closure), and apt inside the hosts points only at it.

The container engine runs inside these hosts, with three concessions that a
VM would not need (measured on this kind of machine, cgroup v1 hybrid host):
- SYSTEMD_NSPAWN_UNIFIED_HIERARCHY=1: with the host's v1 controllers mounted
  read-only inside nspawn, runc cannot create a cgroup; a private cgroup2
  tree lets it. That tree has no cpuset or memory controller, so dockerd in
  these hosts *discards* --cpuset-cpus/--cpuset-mems/--memory (with a
  warning). Those limits are checked on the real engine (tests/ansible/test_e2e.py).
- --system-call-filter=add_key keyctl request_key bpf: nspawn's own filter
  refuses the session keyring and the device-cgroup BPF program runc needs.
- --capability=all: dockerd needs the capabilities nspawn drops by default.
/var/lib/docker is bind-mounted from a plain directory: overlay2 cannot stack
on the host's overlay root.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import http.server
import json
import os
import shutil
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

MIRROR = "http://deb.debian.org/debian"
SUITE = "bookworm"
BASE_PACKAGES = ("openssh-server", "python3", "systemd", "systemd-sysv", "dbus", "iproute2")
# What the roles install, served by the local apt repository inside the rootfs.
REPO_PACKAGES = (
    "docker.io",
    "containerd",
    "runc",
    "numactl",
    "curl",
    "nginx",
    "libnginx-mod-http-js",  # the gateway of several models reads each request's model
    "openssl",
    "python3-apt",
    # A routed fleet: the router's venv, the instances' firewall, monitoring.
    "python3-venv",
    "nftables",
    "prometheus",
    "prometheus-node-exporter",
    "prometheus-alertmanager",
    # A cloud VM's first boot (tests/ansible/test_cloud_vms.py): Debian's cloud-init in
    # the image, and what the example user data installs; rsync for model delivery.
    "cloud-init",
    "locales",
    "sudo",
    "rsync",
)
RECIPE = 2  # bump when the rootfs recipe changes


@dataclass(frozen=True)
class Network:
    """A private bridge of its own for one test module's machines, so modules on
    different networks run side by side (make test-ansible's workers)."""

    bridge: str
    subnet: str  # the first three octets of a /24 only these machines use

    @property
    def here(self) -> str:
        """This machine's address on the bridge."""
        return f"{self.subnet}.1"

    def address(self, index: int) -> str:
        return f"{self.subnet}.{11 + index}"


NSPAWN_HOSTS = Network("zvnsbr0", "10.231.7")  # tests/ansible/test_nspawn.py
CLOUD_VMS = Network("zvnsbr1", "10.231.8")  # tests/ansible/test_cloud_vms.py
ROUTED_FLEET = Network("zvnsbr2", "10.231.6")  # tests/ansible/test_routed_fleet.py
QUICK_START = Network("zvnsbr3", "10.231.9")  # tests/ansible/test_quick_start.py
NETWORKS = (NSPAWN_HOSTS, CLOUD_VMS, ROUTED_FLEET, QUICK_START)
NSPAWN_FLAGS = (
    "--register=no",
    "--keep-unit",
    "--console=passive",
    "--capability=all",
    "--system-call-filter=add_key keyctl request_key bpf",
)


def cache_dir() -> Path:
    return Path(os.environ.get("ZENVLLM_CACHE", "/var/cache/zenvllm")) / "nspawn"


def rootfs_key() -> str:
    text = repr((RECIPE, SUITE, BASE_PACKAGES, REPO_PACKAGES))
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def run(*argv: str, timeout: float = 900, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(
        argv, check=True, capture_output=True, text=True, timeout=timeout, **kwargs
    )


def packages_index(repo: Path) -> str:
    """A flat repository's Packages file, with dpkg-deb only (no dpkg-dev needed)."""
    stanzas = []
    for deb in sorted(repo.glob("*.deb")):
        control = run("dpkg-deb", "--field", str(deb)).stdout.strip()
        sha = hashlib.sha256(deb.read_bytes()).hexdigest()
        stanzas.append(
            f"{control}\nFilename: ./{deb.name}\nSize: {deb.stat().st_size}\nSHA256: {sha}\n"
        )
    return "\n".join(stanzas)


def apt_get(root: Path, *args: str) -> None:
    """apt-get inside root (chroot), without questions."""
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    run("chroot", str(root), "apt-get", *args, env=env)


def drop_apt_lists(root: Path) -> None:
    """The downloaded package lists: a host refreshes its own from the local repo."""
    for lists in (root / "var/lib/apt/lists").glob("*_*"):
        lists.unlink()


def build_rootfs(dest: Path) -> None:
    tmp = dest.with_name(dest.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    run(
        "debootstrap",
        "--variant=minbase",
        "--include=" + ",".join(BASE_PACKAGES),
        SUITE,
        str(tmp),
        MIRROR,
    )
    # The dependency closure of what the roles install, relative to this rootfs.
    apt_get(tmp, "update", "-qq")
    apt_get(
        tmp, "install", "-y", "-qq", "--download-only", "--no-install-recommends", *REPO_PACKAGES
    )
    repo = tmp / "srv" / "localrepo"
    repo.mkdir(parents=True)
    for deb in (tmp / "var/cache/apt/archives").glob("*.deb"):
        shutil.move(str(deb), repo / deb.name)
    (repo / "Packages").write_text(packages_index(repo))
    (tmp / "etc/apt/sources.list").write_text("deb [trusted=yes] file:/srv/localrepo ./\n")
    drop_apt_lists(tmp)
    # Boot quickly and quietly: no getty on the console, networkd for the bridge address.
    run("chroot", str(tmp), "systemctl", "enable", "systemd-networkd", "ssh")
    run(
        "chroot",
        str(tmp),
        "systemctl",
        "mask",
        "console-getty.service",
        "systemd-networkd-wait-online.service",
    )
    tmp.rename(dest)


@contextlib.contextmanager
def local_repo_url() -> Iterator[str]:
    """The rootfs's local apt repository (what the roles install, and debootstrap's own
    packages: python3 among them) served on loopback while inside, for an image build
    on the host network that must not depend on Debian's mirror. Its URL."""
    repo = ensure_rootfs() / "srv" / "localrepo"
    handler = functools.partial(QuietFiles, directory=str(repo))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


class QuietFiles(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args: object) -> None:  # apt's requests: not the tests' output
        pass


@contextlib.contextmanager
def cache_lock() -> Iterator[None]:
    """One builder of the cached trees at a time (the ansible tier's workers, the
    background prebuild): each waits, then finds the other's tree made."""
    cache_dir().mkdir(parents=True, exist_ok=True)
    with (cache_dir() / ".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def ensure_rootfs() -> Path:
    """The cached rootfs (built in about 2 minutes on first use)."""
    with cache_lock():
        return rootfs()


def rootfs() -> Path:
    dest = cache_dir() / f"rootfs-{SUITE}-{rootfs_key()}"
    if not dest.is_dir():
        dest.parent.mkdir(parents=True, exist_ok=True)
        # Older recipes' rootfs trees (ours: the cache directory is the tests') go first.
        for old in dest.parent.glob(f"rootfs-{SUITE}-*"):
            shutil.rmtree(old, ignore_errors=True)
        build_rootfs(dest)
    return dest


# A cloud image's own settings (Debian's cloud images carry the like in cloud.cfg.d):
# the seed is NoCloud, the hostname goes into /etc/hosts, and the address comes from
# the bridge's networkd file, as a cloud's DHCP would give it, so cloud-init leaves
# the network and the apt sources (the local repository) alone.
CLOUD_IMAGE_PACKAGES = ("cloud-init", "locales")
CLOUD_IMAGE_CFG = """\
datasource_list: [NoCloud, None]
manage_etc_hosts: true
network: {config: disabled}
apt_preserve_sources_list: true
locale: C.UTF-8
"""


def ensure_cloud_layer() -> Path:
    """An overlay layer over the rootfs with Debian's cloud-init installed, as in a cloud
    image: booted with a NoCloud seed, the machine's first boot runs the user data."""
    with cache_lock():
        return cloud_layer(rootfs())


def cloud_layer(lower: Path) -> Path:
    key = hashlib.sha256(repr((lower.name, CLOUD_IMAGE_PACKAGES, CLOUD_IMAGE_CFG)).encode())
    dest = cache_dir() / f"cloud-{key.hexdigest()[:12]}"
    if dest.is_dir():
        return dest
    for old in dest.parent.glob("cloud-*"):
        shutil.rmtree(old, ignore_errors=True)
    tmp = dest.with_name(dest.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    upper, work, root = tmp / "upper", tmp / "work", tmp / "root"
    for d in (upper, work, root):
        d.mkdir(parents=True)
    opts = f"lowerdir={lower},upperdir={upper},workdir={work}"
    run("mount", "-t", "overlay", "overlay", "-o", opts, str(root))
    try:
        apt_get(root, "update", "-qq")
        apt_get(root, "install", "-y", "-qq", *CLOUD_IMAGE_PACKAGES)
        (root / "etc/cloud/cloud.cfg.d/90-test-image.cfg").write_text(CLOUD_IMAGE_CFG)
        drop_apt_lists(root)
    finally:
        run("umount", str(root))
    upper.rename(dest)
    shutil.rmtree(tmp, ignore_errors=True)
    return dest


@dataclass
class Machine:
    name: str
    address: str
    root: Path
    key: Path
    pid: int  # systemd-nspawn's; a reboot gives a new one
    network: Network
    cpus: str = ""
    flags: tuple = ()  # more systemd-nspawn options (a device bound in)
    user: str = "root"  # who logs in with key (a cloud VM: its image's default user, sudo)


def wait_ssh(address: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with (
            contextlib.suppress(OSError),
            socket.create_connection((address, 22), timeout=2) as conn,
        ):
            if conn.recv(4).startswith(b"SSH"):
                return
        time.sleep(0.5)
    raise TimeoutError(f"{address}: no ssh after {timeout} s")


def prepare_overlay(
    name: str, address: str, lower: Path | str, work: Path, pubkey: str | None
) -> Path:
    """The machine's root: an overlay over lower (a path, or "top:...:bottom" layers),
    with its name and address, and root's ssh key unless pubkey is None (a cloud VM
    gets its user and key from cloud-init)."""
    upper, ovl_work, root = work / name / "upper", work / name / "work", work / name / "root"
    for d in (upper, ovl_work, root, work / name / "docker"):
        d.mkdir(parents=True, exist_ok=True)
    run(
        "mount",
        "-t",
        "overlay",
        "overlay",
        "-o",
        f"lowerdir={lower},upperdir={upper},workdir={ovl_work}",
        str(root),
    )
    (root / "etc/hostname").write_text(name + "\n")
    network = root / "etc/systemd/network/10-host0.network"
    network.parent.mkdir(parents=True, exist_ok=True)
    network.write_text(f"[Match]\nName=host0\n\n[Network]\nAddress={address}/24\n")
    if pubkey is not None:
        ssh = root / "root/.ssh"
        ssh.mkdir(mode=0o700, parents=True, exist_ok=True)
        (ssh / "authorized_keys").write_text(pubkey)
        (ssh / "authorized_keys").chmod(0o600)
    return root


def wait_veth_gone(name: str, timeout: float = 180) -> None:
    """Wait until the host side of a stopped machine of this name has left. After a
    machine that ran containers, it stayed about 2 minutes (its network namespace still
    held; by what is not known), and a module run again in that time failed with
    systemd-nspawn's "Failed to add new veth interfaces (vb-NAME:host0): File exists",
    then waited out ssh. One still there after `timeout` is removed if a killed test
    machine left it, else refused."""
    link = Path("/sys/class/net") / f"vb-{name}"
    deadline = time.monotonic() + timeout
    while link.exists() and time.monotonic() < deadline:
        time.sleep(0.5)
    if not link.exists():
        return
    # A machine killed with its run (CI's time limit, a SIGKILL) left its veth for good
    # (seen for an hour, 2026-12-08): removed when no machine of that name runs and it
    # is a veth as nspawn makes one for the tests' bridges; anything else is left.
    shown = subprocess.run(
        ["ip", "-j", "-d", "link", "show", "dev", f"vb-{name}"], capture_output=True, text=True
    )
    if shown.returncode != 0:  # gone meanwhile
        return
    if machine_running(name) or not veth_left_by_a_test(json.loads(shown.stdout)):
        raise RuntimeError(
            f"vb-{name} exists and is not a veth a killed test machine left (a machine of "
            f"that name runs, or the link is another kind or on another bridge): left "
            f"untouched; stop that machine or remove the link"
        )
    run("ip", "link", "del", f"vb-{name}")


def veth_left_by_a_test(shown: list[dict]) -> bool:
    """Whether the link `ip -j -d link show dev vb-NAME` describes is the host side of a
    test machine's veth: a veth on one of NETWORKS' bridges, or on none (the bridge gone)."""
    bridges = {network.bridge for network in NETWORKS}
    return len(shown) == 1 and (
        shown[0].get("linkinfo", {}).get("info_kind") == "veth"
        and shown[0].get("master", "") in bridges | {""}
    )


def machine_running(name: str) -> bool:
    """A systemd-nspawn of this machine name runs on this machine."""
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            argv = cmdline.read_bytes().split(b"\0")
        except OSError:
            continue
        if argv[0].endswith(b"systemd-nspawn") and b"-M" in argv:
            at = argv.index(b"-M")
            if at + 1 < len(argv) and argv[at + 1] == name.encode():
                return True
    return False


def avx2_view_flags() -> tuple[str, ...]:
    """The AVX2 view for a test host (tests/support/avx2_machine.py), when
    ZENVLLM_TEST_AVX2_VIEW names it: the Zen 3 /proc/cpuinfo, and the runc wrapper
    first on containerd's PATH (/usr/local/sbin), apart from the runc its Docker installs;
    the wrapper's log writable."""
    view = os.environ.get("ZENVLLM_TEST_AVX2_VIEW")
    if not view:
        return ()
    return (
        f"--bind-ro={view}",
        f"--bind={view}/log",  # the wrapper's record of the containers it started
        f"--bind-ro={view}/cpuinfo:/proc/cpuinfo",
        f"--bind-ro={view}/runc:/usr/local/sbin/runc",
    )


def boot(
    name: str,
    root: Path,
    docker_dir: Path,
    log: Path,
    network: Network,
    cpus: str = "",
    flags: tuple = (),
) -> int:
    wait_veth_gone(name)
    env = {**os.environ, "SYSTEMD_NSPAWN_UNIFIED_HIERARCHY": "1"}
    with log.open("a") as out:
        proc = subprocess.Popen(
            [
                "systemd-nspawn",
                "-D",
                str(root),
                "-M",
                name,
                *NSPAWN_FLAGS,
                *avx2_view_flags(),
                f"--network-bridge={network.bridge}",
                f"--bind={docker_dir}:/var/lib/docker",
                *([f"--cpu-affinity={cpus}"] if cpus else []),
                *flags,
                "--boot",
            ],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )
    return proc.pid


SSH_OPTIONS = ("-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null")


def ssh_argv(machine: Machine, command: str) -> list[str]:
    """ssh to the machine as its login user, with the fleet's key."""
    return [
        "ssh",
        *SSH_OPTIONS,
        "-i",
        str(machine.key),
        f"{machine.user}@{machine.address}",
        command,
    ]


def exit_status(pid: int) -> int | None:
    """The exit code of our child systemd-nspawn once it has ended, else None."""
    try:
        done, status = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:  # already reaped (by subprocess's own clean-up)
        return -1
    return os.waitstatus_to_exitcode(status) if done else None


def reboot(machine: Machine, timeout: float = 120) -> float:
    """Reboot the machine from inside, as its operator would (`systemctl reboot`): systemd
    stops every unit and systemd-nspawn exits with 133, then, as systemd-nspawn@.service
    does, it boots again on the same root (the overlay and /var/lib/docker keep what was
    written). Returns the seconds until ssh answers again."""
    start = time.monotonic()
    # The connection drops as the machine goes down; that is the point.
    with contextlib.suppress(subprocess.TimeoutExpired):
        subprocess.run(
            ssh_argv(
                machine,
                "systemctl reboot" if machine.user == "root" else "sudo -n systemctl reboot",
            ),
            capture_output=True,
            timeout=30,
            check=False,
        )
    while (code := exit_status(machine.pid)) is None:
        if time.monotonic() - start > timeout:
            raise TimeoutError(f"{machine.name}: still up {timeout} s after systemctl reboot")
        time.sleep(0.3)
    if code not in (133, -1):
        raise RuntimeError(f"{machine.name}: systemd-nspawn exited with {code}, not 133 (reboot)")
    work = machine.root.parent.parent
    machine.pid = boot(
        machine.name,
        machine.root,
        machine.root.parent / "docker",
        work / f"{machine.name}.log",
        machine.network,
        machine.cpus,
        machine.flags,
    )
    wait_ssh(machine.address, timeout)
    return time.monotonic() - start


def left_by_a_test(shown: list[dict], network: Network) -> bool:
    """Whether the link `ip -j -d addr show dev BRIDGE` describes is one a test run left
    (killed before its teardown): a bridge whose only IPv4 address is the network's own."""
    return len(shown) == 1 and (
        shown[0].get("linkinfo", {}).get("info_kind") == "bridge"
        and [
            (a.get("local"), a.get("prefixlen"))
            for a in shown[0].get("addr_info", [])
            if a.get("family") == "inet"
        ]
        == [(network.here, 24)]
    )


def bridge_up(network: Network) -> None:
    """The network's bridge, made anew; a link of its name is removed only when it is
    one a test run left, else refused untouched."""
    shown = subprocess.run(
        ["ip", "-j", "-d", "addr", "show", "dev", network.bridge], capture_output=True, text=True
    )
    if shown.returncode == 0:  # a link of that name exists
        if not left_by_a_test(json.loads(shown.stdout), network):
            raise RuntimeError(
                f"{network.bridge} exists and is not a bridge holding only {network.here}/24, "
                "as a test run leaves one: left untouched; remove it, or give the tests "
                "another network in NETWORKS (tests/support/nspawn.py)"
            )
        run("ip", "link", "del", network.bridge)
    run("ip", "link", "add", network.bridge, "type", "bridge")
    run("ip", "addr", "add", f"{network.here}/24", "dev", network.bridge)
    run("ip", "link", "set", network.bridge, "up")


def stop(machines: list[Machine], grace: float = 30) -> None:
    """Power the machines off together (nspawn asks each one's systemd on SIGTERM) and
    kill what still runs after `grace` seconds. Their exit is read with waitpid: they are
    our children, and a kill(pid, 0) answers for a zombie too (each stop then waited its
    full 30 s, one machine after another)."""
    for machine in machines:
        with contextlib.suppress(ProcessLookupError):
            os.kill(machine.pid, signal.SIGTERM)
    running = list(machines)
    deadline = time.monotonic() + grace
    while running and time.monotonic() < deadline:
        running = [m for m in running if exit_status(m.pid) is None]
        time.sleep(0.3)
    for machine in running:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(machine.pid, signal.SIGKILL)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(machine.pid, 0)
    for machine in machines:
        subprocess.run(["umount", "--lazy", str(machine.root)], capture_output=True, check=False)


@dataclass(frozen=True)
class FirstBoot:
    """Boot the machines as new cloud VMs: the image has cloud-init, the NoCloud seed
    holds this user data and the fleet's key as the instance's key pair (as Nova's
    metadata does), no key is baked in for root, and each machine's disk image
    (volumes[name]) is bound as its /dev/vdb through a loop device."""

    user_data: str
    volumes: dict[str, Path]
    user: str = "debian"  # the Debian cloud image's default user


def seed(root: Path, name: str, pubkey: str, user_data: str) -> None:
    nocloud = root / "var/lib/cloud/seed/nocloud"
    nocloud.mkdir(parents=True, exist_ok=True)
    (nocloud / "user-data").write_text(user_data)
    (nocloud / "meta-data").write_text(
        f"instance-id: i-{name}\nlocal-hostname: {name}\npublic-keys:\n  - {pubkey.strip()}\n"
    )


def attach(image: Path) -> str:
    return run("losetup", "--find", "--show", str(image)).stdout.strip()


@contextlib.contextmanager
def fleet(
    names: list[str],
    work: Path,
    network: Network,
    cpus: dict[str, str] | None = None,
    first_boot: FirstBoot | None = None,
) -> Iterator[list[Machine]]:
    """Boot one machine per name on the network's bridge; tear everything down after.

    cpus gives a machine its own CPUs (a CPU list, e.g. "0"), as a real host has:
    everything in it, the planner included, sees only those. first_boot makes them
    cloud VMs at their first boot (FirstBoot).
    """
    lower: Path | str = ensure_rootfs()
    if first_boot:
        lower = f"{ensure_cloud_layer()}:{lower}"
    key = work / "id_ed25519"
    if not key.exists():
        run("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key))
    pubkey = key.with_suffix(".pub").read_text()
    machines: list[Machine] = []
    loops: list[str] = []
    bridge_up(network)
    try:
        for index, name in enumerate(names):
            address = network.address(index)
            own_cpus = (cpus or {}).get(name, "")
            flags: tuple = ()
            if first_boot:
                root = prepare_overlay(name, address, lower, work, None)
                seed(root, name, pubkey, first_boot.user_data)
                loops.append(attach(first_boot.volumes[name]))
                # The console goes to the log: cloud-init writes to it, and an unread
                # console blocks it once the terminal's buffer is full.
                flags = (f"--bind={loops[-1]}:/dev/vdb", "--console=read-only")
            else:
                root = prepare_overlay(name, address, lower, work, pubkey)
            log = work / f"{name}.log"
            pid = boot(name, root, work / name / "docker", log, network, own_cpus, flags)
            user = first_boot.user if first_boot else "root"
            machines.append(Machine(name, address, root, key, pid, network, own_cpus, flags, user))
        for machine in machines:
            wait_ssh(machine.address)
        yield machines
    finally:
        stop(machines)
        for loop in loops:
            subprocess.run(["losetup", "--detach", loop], capture_output=True, check=False)
        subprocess.run(["ip", "link", "del", network.bridge], capture_output=True, check=False)
        for name in names:
            shutil.rmtree(work / name, ignore_errors=True)
