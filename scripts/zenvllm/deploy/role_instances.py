"""The instances role's variables: each request option under its role name, with the
role's own defaults, plus the options only the role uses.

core/request.py holds the deployment request: what the planner is asked, each option
with its type, default, limits and help, and nothing of Ansible. The role knows more:
its variable for option `x` is `zenvllm_instances_x`; its default may follow a
playbook-wide variable (`inherit`, e.g. `zenvllm_model_dir`) or be its own, a value or
a Jinja expression over the inventory (`role_default`); and it has options of its own
(`role_only`: the model's delivery, the firewall, the engine's command line, the
paths of its files, the checks and the rollout), which a request refuses as it refuses
any name that is not one of its fields. VARIABLES lists them all in the role's order;
reference.py writes from ROLE the role's `defaults/main.yml`, `meta/argument_specs.yml`
and `templates/request.json.j2` (which sends the planner only the request's options)
and the variable reference. Variable and `own` are every role's (deploy/role_vars.py).
"""

from __future__ import annotations

from typing import Any

from zenvllm.core import request, revisions
from zenvllm.core.request import DEPLOY, HOST, MODEL, PATHS, SUPERVISE
from zenvllm.deploy.role_vars import ROLLOUT, Role, Variable, own

ROLE_PREFIX = "zenvllm_instances_"
SECRETS, CHECKS = "Secrets", "Checks after launch"


def asked(name: str, *, help: str = "", inherit: str = "", role_default: Any = None) -> Variable:
    """A request option as the role has it (`help`: the role's words when not the
    request's)."""
    spec = request.spec_of(name)
    default = getattr(request.DEFAULT, name)
    return Variable(
        name,
        spec,
        default,
        request.kind(name),
        help or spec.help,
        inherit=inherit,
        role_default=role_default,
    )


# A fleet's copies cut over hosts: consecutive runs of `hosts` hosts of the zenvllm group,
# in inventory order, so a rolling batch of whole runs restarts whole copies.
# (deploy/topology.py decides: the zenvllm.cpu.pipeline_hosts filter.)
PIPELINE_HOSTS = (
    "{{ groups['zenvllm'] | default([]) | zenvllm.cpu.pipeline_hosts(inventory_hostname, "
    "zenvllm_instances_hosts) }}"
)

VARIABLES = (
    # -- the model
    asked("model_dir", inherit="zenvllm_model_dir"),
    own(
        "model_src",
        "",
        "A model directory on the controller, sent to model_dir with rsync (only what "
        "differs; a cut transfer resumes).",
        MODEL,
        inherit="zenvllm_model_src",
    ),
    own(
        "model_url",
        "",
        "A mirror's http(s) URL of the model directory (or <HF_ENDPOINT>/<org>/<model>/"
        "resolve/<revision>), fetched with resumable ranges; needs model_manifest.",
        MODEL,
        inherit="zenvllm_model_url",
    ),
    own(
        "model_manifest",
        "",
        "A manifest on the controller (size and SHA-256 per file, `zenvllm model manifest "
        'DIR`) every host\'s copy is verified against; "" = made from model_src.',
        MODEL,
        inherit="zenvllm_model_manifest",
    ),
    own("model_rsync_opts", (), "More rsync options for model_src, e.g. --bwlimit=50m.", MODEL),
    asked("served_model_name"),
    asked("models", inherit="zenvllm_models"),
    own(
        "model_sources",
        {},
        "With several models: NAME -> a model directory on the controller, sent to that "
        "model's DIR on the host as model_src is (rsync, verified file by file); a model "
        "not named here must be on the host already.",
        MODEL,
        inherit="zenvllm_model_sources",
    ),
    asked("shares", inherit="zenvllm_model_shares"),
    asked("model_size_gib"),
    asked("dtype"),
    asked("speculation"),
    asked("max_model_len"),
    # -- the deployment
    asked("deployment"),
    asked("count"),
    asked("tensor_parallel"),
    asked("hosts"),
    own(
        "pipeline_hosts",
        (),
        "The inventory hosts one copy is cut over, head first (default: with hosts > 1, "
        "this host's run of `hosts` hosts of the zenvllm group in inventory order: the "
        "first `hosts` hosts make one copy, the next `hosts` the next).",
        DEPLOY,
        role_default=PIPELINE_HOSTS,
    ),
    asked(
        "host_rank",
        role_default="{{ zenvllm_instances_pipeline_hosts "
        "| zenvllm.cpu.host_rank(inventory_hostname) }}",
    ),
    asked(
        "head_address",
        role_default="{{ (hostvars[zenvllm_instances_pipeline_hosts[0]].zenvllm_private_address "
        "| default(hostvars[zenvllm_instances_pipeline_hosts[0]].ansible_host | "
        "default(zenvllm_instances_pipeline_hosts[0]))) if zenvllm_instances_pipeline_hosts "
        "| length > 1 else '' }}",
    ),
    asked("head_port"),
    asked("target"),
    asked("allow_inactive", role_default=True),  # Ansible deploys zen or pace anywhere, loudly
    asked("layout"),
    asked("base_port"),
    asked(
        "address",
        help="Where the instances listen: loopback behind the host's gateway; in a routed "
        "fleet (a zenvllm_router group) the host's private address (zenvllm_private_address).",
        role_default="{{ (zenvllm_private_address | default(ansible_host | default('127.0.0.1'))) "
        "if groups['zenvllm_router'] | default([]) | length > 0 else '127.0.0.1' }}",
    ),
    own(
        "firewall",
        False,
        "Off loopback, an nftables table admits to the instances' ports only this host and "
        "firewall_sources.",
        DEPLOY,
        role_default="{{ zenvllm_instances_address != '127.0.0.1' }}",
    ),
    own(
        "firewall_sources",
        (),
        "The addresses the firewall admits (default: the router and monitoring hosts' "
        "private addresses).",
        DEPLOY,
        role_default="{{ ((groups['zenvllm_router'] | default([])) + "
        "(groups['zenvllm_monitoring'] | default([]))) | map('extract', hostvars) "
        "| map(attribute='zenvllm_private_address', default='') | select | unique | list }}",
    ),
    own(
        "pipeline_peers",
        (),
        "The addresses the firewall admits to a pipeline head's store port (default: the "
        "private addresses of pipeline_hosts).",
        DEPLOY,
        role_default="{{ (zenvllm_instances_pipeline_hosts | map('extract', hostvars) "
        "| map(attribute='zenvllm_private_address', default='') | select | unique | list) "
        "if zenvllm_instances_pipeline_hosts | length > 1 else [] }}",
    ),
    own(
        "firewall_name",
        "zenvllm-firewall",
        "The firewall's nftables table and unit (the unit re-applies it at boot).",
        DEPLOY,
        role_default="{{ zenvllm_instances_deployment }}-firewall",
    ),
    asked("kv_cache_gib"),
    asked("kv_fraction"),
    asked("load"),
    asked("slo"),
    # -- the host the plan is for
    asked("sysfs_root"),
    asked("flavor"),
    own(
        "python",
        "/usr/bin/python3",
        "The python3 that runs the planner on the host (standard library only).",
        HOST,
    ),
    # -- the image and each container
    asked("image", inherit="zenvllm_image"),
    asked("image_id", inherit="zenvllm_image_id"),
    asked("user"),
    asked("container_model_dir"),
    asked("serve_args"),
    asked("extra_env"),
    asked("extra_docker_args"),
    # -- secrets
    own(
        "hf_token",
        "",
        "HF_TOKEN, written only to the 0600 env files, never shown.",
        SECRETS,
        inherit="zenvllm_hf_token",
        secret=True,
    ),
    own(
        "api_key",
        "",
        "VLLM_API_KEY the instances require, written only to the 0600 env files.",
        SECRETS,
        inherit="zenvllm_api_key",
        secret=True,
    ),
    # -- supervision and the engine
    asked("supervisor"),
    asked("cgroup_driver"),
    asked("cgroup2_mount"),
    own(
        "engine_unit",
        "docker.service",
        "The engine's systemd unit the instance units start after and restart with "
        '("" = none); the host role finds it.',
        SUPERVISE,
        role_default="{{ (zenvllm_host_engine_choice | default({})).unit "
        "| default('docker.service') }}",
    ),
    own(
        "docker_bin",
        "/usr/bin/docker",
        "The engine's command, as given, for every engine run of the role and in its "
        "units: an absolute path, or a command the units can run (a systemd unit's "
        "ExecStart needs an absolute path). /usr/bin/docker is where docker.io, docker-ce "
        "and podman-docker install it.",
        SUPERVISE,
        inherit="zenvllm_docker_bin",
    ),
    own(
        "docker_host",
        "",
        'DOCKER_HOST for engine commands and units ("" = the engine\'s default socket).',
        SUPERVISE,
        inherit="zenvllm_docker_host",
    ),
    # -- where things go on the host
    own("lib_dir", "/opt/zenvllm/lib", "Where the planner zipapp goes.", PATHS),
    asked("config_dir"),
    asked("unit_dir"),
    asked("seccomp_profile"),
    asked("compile_cache_dir"),
    own(
        "planner",
        "",
        "The planner zipapp on the controller, copied to lib_dir (the collection carries "
        "it; in a checkout `make planner` makes it).",
        PATHS,
        role_default="{{ zenvllm_planner | default(role_path ~ '/files/zenvllm.pyz') }}",
    ),
    # -- checks after launch
    own(
        "status_textfile",
        "/var/lib/prometheus/node-exporter/zenvllm.prom",
        "Where a systemd timer writes `zenvllm status` as metrics for the node exporter's "
        "textfile collector: each instance's placement, memory locality, health and backend "
        '("" = no timer; it waits until the directory exists).',
        CHECKS,
        path=True,
    ),
    own(
        "status_interval",
        "30s",
        "How often the timer checks every instance against its plan (systemd time span).",
        CHECKS,
    ),
    # -- rollout
    own(
        "state",
        "present",
        "present deploys; absent removes the instances, units, env files, firewall and "
        "compile caches (the model and the image stay).",
        ROLLOUT,
        choices=("present", "absent"),
        inherit="zenvllm_state",
    ),
    own(
        "render_only",
        False,
        "Render the plan's files only: no engine, no units started (flavor checks, dry runs).",
        ROLLOUT,
    ),
    own(
        "health_timeout",
        900,
        "Seconds a restarted instance has to answer /health before the next one restarts.",
        ROLLOUT,
    ),
    own("health_delay", 1, "Seconds between /health asks (one process on the host asks).", ROLLOUT),
    own(
        "drain_timeout",
        600,
        "Seconds an instance out of the gateway's rotation has to finish its requests "
        "before a rolling update replaces it (the gateway's read timeout).",
        ROLLOUT,
    ),
    own(
        "prune",
        True,
        "Remove instances (units, containers, env files) the plan no longer has.",
        ROLLOUT,
    ),
    own(
        "revisions_dir",
        "",
        "Each rollout that changes what runs is a revision kept here (the plan, the image "
        "by ID, the models' directories), the newest "
        f"{revisions.KEEP}, so a rollback can go back to one (docs/how-to/operations.md).",
        ROLLOUT,
        role_default=f"{revisions.ROOT}/{{{{ zenvllm_instances_deployment }}}}",
        path=True,
    ),
    own(
        "rollback",
        "",
        "Roll back instead of planning: true (or yes) goes to the previous revision (to what "
        "served before a rollout that failed), a number to that revision; its image must "
        "still be on the host, and its models.",
        ROLLOUT,
        inherit="zenvllm_rollback",
    ),
)

ROLE = Role(
    "zenvllm_instances",
    "scripts/zenvllm/core/request.py and scripts/zenvllm/deploy/role_instances.py",
    "Plan vLLM instances with the zenvllm planner and run each as a supervised container",
    ("docs/reference/variables.md lists the variables with their defaults.",),
    VARIABLES,
)
