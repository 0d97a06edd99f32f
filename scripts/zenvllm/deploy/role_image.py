"""The image role's variables (zenvllm_image_*): which image, and how it reaches the host
(present, build, archive or registry); reference.py writes the role's defaults and
argument specs from ROLE."""

from __future__ import annotations

from zenvllm.core import request
from zenvllm.core.targets import TARGETS
from zenvllm.deploy.role_vars import Role, own, state
from zenvllm.runtime.engine import BINARY_SETTING, DOCKER_NAME

IMAGE = "The image"
BUILD = "source=build: the command and the image target"
ARCHIVE = "source=auto and archive: the archive on the controller, and where the host keeps it"
REGISTRY = "source=registry"

VARIABLES = (
    own(
        "name",
        request.DEFAULT.image,
        "The image every instance runs (a tag; the role resolves it to an image ID).",
        IMAGE,
        inherit="zenvllm_image",
        description="The image reference instances run. Defaults to zenvllm_image, else "
        f"{request.DEFAULT.image}.",
    ),
    own(
        "source",
        "auto",
        "How the image reaches the host:\n"
        "  auto     - used where the host has it, else shipped from the controller's engine\n"
        "             (a `docker save` archive made once per image ID, rsync, `docker load`)\n"
        "  present  - it is already there (built by `make image`, or by hand): only checked\n"
        "  build    - `zenvllm build` on the host (zenvllm must be installed there)\n"
        "  archive  - copy a `docker save` archive from the controller and `docker load` it\n"
        "  registry - `docker pull` from your registry",
        IMAGE,
        description="How the image reaches the host: auto (the host's, else shipped from the "
        "controller's engine as an archive), present (checked only), build (zenvllm build on "
        "the host), archive (docker load of a docker save file), registry (docker pull).",
        choices=("auto", "present", "build", "archive", "registry"),
    ),
    own(
        "docker_host",
        "",
        'DOCKER_HOST for engine commands ("" = the engine\'s default socket).',
        IMAGE,
        inherit="zenvllm_docker_host",
        description="DOCKER_HOST for engine commands; empty means the default socket. "
        "Defaults to zenvllm_docker_host.",
    ),
    own(
        "docker_bin",
        "/usr/bin/docker",
        "The engine's command on the host, as given: an absolute path, or a command the "
        "units can run (the instances' systemd units run the same zenvllm_docker_bin, and "
        "systemd needs an absolute path).",
        IMAGE,
        inherit="zenvllm_docker_bin",
        description="The engine's command on the host, as given: an absolute path, or a "
        "command the units can run (the instances' systemd units run the same "
        "zenvllm_docker_bin, and systemd needs an absolute path). Defaults to "
        "zenvllm_docker_bin.",
    ),
    own(
        "build_target",
        "vllm-openai",
        "",
        BUILD,
        description="Image target for source=build.",
        choices=tuple(TARGETS),
    ),
    own(
        "zenvllm_bin",
        "zenvllm",
        "",
        BUILD,
        description="The zenvllm command on the host, for source=build.",
    ),
    own(
        "build_args",
        (),
        "",
        BUILD,
        description="Extra arguments for zenvllm build (e.g. --wheelhouse DIR).",
    ),
    own(
        "controller_docker_host",
        "",
        "source=auto: the controller's engine, which ships an image a host lacks, and where "
        "the controller keeps its archives (one per image ID; delete old ones at will).",
        ARCHIVE,
        role_default="{{ lookup('ansible.builtin.env', 'DOCKER_HOST') }}",
        description="For source=auto: DOCKER_HOST of the controller's engine (default: the "
        "controller's DOCKER_HOST, else the default socket).",
    ),
    own(
        "controller_docker_bin",
        DOCKER_NAME,
        "source=auto: the engine's command on the controller (a workstation, no units), the "
        "one `zenvllm build` there runs: ZENVLLM_DOCKER, else docker on the controller's "
        "PATH. Not the hosts' zenvllm_docker_bin.",
        ARCHIVE,
        role_default=f"{{{{ lookup('ansible.builtin.env', '{BINARY_SETTING}') "
        f"or '{DOCKER_NAME}' }}}}",
        description="For source=auto: the engine's command on the controller (default: the "
        "controller's ZENVLLM_DOCKER, else docker as its PATH finds it).",
    ),
    own(
        "controller_dir",
        "",
        "",
        ARCHIVE,
        role_default="{{ lookup('ansible.builtin.env', 'HOME') }}/.cache/zenvllm/images",
        description="For source=auto: where the controller keeps the archives it ships.",
        type="path",
    ),
    own(
        "archive",
        "",
        "",
        ARCHIVE,
        description="For source=archive: the docker save archive on the controller.",
        type="path",
    ),
    own(
        "archive_dest_dir",
        "/var/lib/zenvllm/images",
        "",
        ARCHIVE,
        description="Where the archive is kept on the host (a changed archive is loaded again).",
        type="path",
    ),
    own(
        "pull_always",
        False,
        "Pull when the image is missing (or on every run).",
        REGISTRY,
        description="For source=registry: pull on every run, not only when the image is missing.",
    ),
    own(
        "registry_username",
        "",
        "A private registry's account, given here or logged in beforehand by you. zenvllm "
        "logs in into a Docker client config of its own (registry_config_dir, 0700), never "
        "root's ~/.docker; the password is never logged.",
        REGISTRY,
        description="For source=registry: the account zenvllm logs in with (into "
        "registry_config_dir, never ~/.docker); empty when the host is logged in already or "
        "the registry is open.",
    ),
    own(
        "registry_password",
        "",
        "",
        REGISTRY,
        description="The account's password or token (never logged).",
        secret=True,
    ),
    own(
        "registry_config_dir",
        "/etc/zenvllm/registry",
        "",
        REGISTRY,
        description="The Docker client config zenvllm logs in and pulls with.",
        type="path",
    ),
    own(
        "registry_ca",
        "",
        "The CA that signed the registry's certificate (a PEM file on the controller), for "
        "hosts that do not trust it yet: installed as /etc/docker/certs.d/<registry>/ca.crt, "
        "which the engine reads per registry. A ca.crt there that zenvllm did not write is "
        "never replaced.",
        REGISTRY,
        description="PEM file on the controller: the CA of the registry's certificate, "
        "installed as /etc/docker/certs.d/<registry>/ca.crt (a ca.crt zenvllm did not write "
        "is never replaced).",
        type="path",
    ),
    state(),
)

ROLE = Role(
    "zenvllm_image",
    "scripts/zenvllm/deploy/role_image.py",
    "Deliver the zenvllm image to a host",
    (
        "Variables of the zenvllm_image role; its README.md and docs/reference/variables.md "
        "list them.",
    ),
    VARIABLES,
)
