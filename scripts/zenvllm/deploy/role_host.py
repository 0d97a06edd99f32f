"""The host role's variables (zenvllm_host_*): the container engine, the packages, the
kernel settings and /dev/shm; reference.py writes the role's defaults and argument
specs from ROLE."""

from __future__ import annotations

from zenvllm.deploy.role_vars import Role, own, state

ENGINE, PACKAGES, SYSCTLS, SHM = "Container engine", "Packages", "Kernel settings", "/dev/shm"

VARIABLES = (
    own(
        "engine",
        "auto",
        "auto: use the engine the host has (Docker's docker-ce, Debian's docker.io, or any "
        "daemon that answers), and install Debian's docker.io only where none is installed.\n"
        "external: you manage the engine; zenvllm installs nothing and only checks it answers.\n"
        "distribution: Debian's docker.io, installed (and started) by zenvllm if missing.\n"
        "zenvllm never installs, starts, upgrades, removes or reconfigures an engine it did "
        "not install; where its packages would conflict with yours it refuses before any "
        "change.",
        ENGINE,
        description="auto uses the engine the host has (docker-ce, docker.io, or any daemon "
        "that answers) and installs Debian's docker.io only where no engine is installed; "
        "external installs nothing and only checks that your engine answers; distribution "
        "installs Debian's docker.io if missing. Conflicting engine packages are refused "
        "before any change.",
        choices=("auto", "external", "distribution"),
    ),
    own(
        "docker_host",
        "",
        'DOCKER_HOST for every engine command ("" = the engine\'s default socket).',
        ENGINE,
        inherit="zenvllm_docker_host",
        description="DOCKER_HOST for engine commands; empty means the engine's default "
        "socket. Defaults to zenvllm_docker_host.",
    ),
    own(
        "docker_bin",
        "/usr/bin/docker",
        "The engine's command the role asks the engine with, as given: an absolute path, "
        "or a command the units can run (the instances' systemd units run the same "
        "zenvllm_docker_bin, and systemd needs an absolute path).",
        ENGINE,
        inherit="zenvllm_docker_bin",
        description="The engine's command the role asks the engine with, as given: an "
        "absolute path, or a command the units can run (the instances' systemd units run "
        "the same zenvllm_docker_bin, and systemd needs an absolute path). Defaults to "
        "zenvllm_docker_bin.",
    ),
    own(
        "packages",
        ("numactl", "python3", "curl"),
        "Packages the instances and the planner need on the host.",
        PACKAGES,
        description="Other packages the instances and the planner need (numactl, python3, curl).",
    ),
    own(
        "apt_cache_valid_time",
        3600,
        "When a package is missing, refresh the apt cache if it is older than this many "
        "seconds (with every package installed, the archive is not asked at all).",
        PACKAGES,
        description="When a package is missing, refresh the apt cache if older than this "
        "(seconds); with all installed the archive is not asked.",
    ),
    own(
        "manage_sysctls",
        True,
        "Kernel settings, written to one sysctl.d file and loaded from it.",
        SYSCTLS,
        description="Write zenvllm_host_sysctls to zenvllm_host_sysctl_file and load it.",
    ),
    own(
        "sysctl_file",
        "/etc/sysctl.d/60-zenvllm.conf",
        "",
        SYSCTLS,
        description="The sysctl.d file the kernel settings go to.",
        type="path",
    ),
    own(
        "sysctls",
        {
            "net.core.somaxconn": 4096,
            "net.ipv4.tcp_max_syn_backlog": 4096,
            "kernel.numa_balancing": 0,
            "vm.swappiness": 1,
        },
        "The backlogs: room for bursts of client connections at the gateway. No automatic "
        "NUMA balancing: instances are pinned to their node, it only moves pages back and "
        "forth. Swappiness 1: keep model weights and KV cache in RAM.",
        SYSCTLS,
        description="Kernel settings (name: value): connection backlog, no automatic NUMA "
        "balancing, low swappiness.",
    ),
    own(
        "manage_shm",
        True,
        "/dev/shm on the host (tmpfs size option: bytes, k/m/g suffix or a % of RAM). Each "
        "container gets its own /dev/shm of the planned size; this one serves processes on "
        'the host itself. "" leaves it alone.',
        SHM,
        description="Size the host's /dev/shm (fstab entry, remounted when it changes).",
    ),
    own(
        "shm_size",
        "50%",
        "",
        SHM,
        description="tmpfs size of /dev/shm: bytes with an optional k/m/g suffix, or a share "
        "of RAM such as 50%. Empty leaves it alone.",
    ),
    state(),
)

ROLE = Role(
    "zenvllm_host",
    "scripts/zenvllm/deploy/role_host.py",
    "Prepare a host for zenvllm instances",
    (
        "Variables of the zenvllm_host role; its README.md and docs/reference/variables.md "
        "list them.",
    ),
    VARIABLES,
)
