"""The router role's variables (zenvllm_router_*): vLLM's router in front of every
instance of the fleet, its routing, health checks and unit; reference.py writes the
role's defaults and argument specs from ROLE."""

from __future__ import annotations

from zenvllm.deploy.role_vars import Role, own, state
from zenvllm.deploy.topology import ROUTER_METRICS_PORT

INSTALL, UNIT, WORKERS = "Installation", "The unit and its listeners", "Workers"
ROUTING, HEALTH, SYSTEMD = "Routing", "Health checks and retries", "systemd"

VARIABLES = (
    own(
        "version",
        "0.1.17",
        "The pin and its reason live in the compatibility matrix (dockerfiles/build.yaml, "
        "`fleet:`); the collection cannot read that file, so the value is repeated here and "
        "tests/unit/test_collection.py keeps the two equal.",
        INSTALL,
        description="vllm-router version; the pin of dockerfiles/build.yaml (fleet).",
    ),
    own(
        "wheelhouse",
        "",
        "A directory of wheels on the controller (vllm-router and what it needs) for "
        'hosts without PyPI; "" = install from PyPI on the host.',
        INSTALL,
        description="Directory of wheels on the controller for hosts without PyPI; "
        '"" installs from PyPI.',
    ),
    own(
        "venv",
        "/opt/zenvllm/router",
        "",
        INSTALL,
        description="The router's own venv on the host.",
        type="path",
    ),
    own(
        "packages",
        ("python3-venv",),
        "",
        INSTALL,
        description="Distribution packages the venv needs.",
    ),
    own(
        "name",
        "",
        "Names the unit: <deployment>-router.service, and with several models one unit "
        "per model, <deployment>-router-<model>.service.",
        UNIT,
        role_default="{{ zenvllm_instances_deployment | default('zenvllm') }}-router",
        description="Unit name without .service; defaults to <deployment>-router. With several "
        "models each model's unit adds -<model>.",
    ),
    own(
        "listen",
        "127.0.0.1:30000",
        "Where the router listens: loopback, behind the gateway on the same host. With "
        "several models (one router each, in the order of their names) the next models "
        "listen on the next ports.",
        UNIT,
        description="address:port the router listens on (loopback, behind the gateway); with "
        "several models, the first model's, the next ones on the next ports.",
    ),
    own(
        "metrics_listen",
        "",
        "Where its Prometheus metrics listen (the monitoring host scrapes them); the next "
        "models' on the next ports.",
        UNIT,
        role_default="{{ zenvllm_private_address | default('127.0.0.1') }}:"
        f"{ROUTER_METRICS_PORT}",
        description="address:port of the router's Prometheus metrics; defaults to the host's "
        f"private address, port {ROUTER_METRICS_PORT}; with several models the next ones on "
        "the next ports.",
    ),
    own(
        "models",
        (),
        "Every model of every host, each with its instances' URLs (served_name, urls): "
        "the models of each host's plan. One router per served name (vllm-router serves "
        "one model), in front of every instance of that model; the gateway sends each "
        "request to the router of the model it names.",
        WORKERS,
        role_default="{{ groups['zenvllm'] | default([]) | map('extract', hostvars)\n"
        "   | map(attribute='zenvllm_instances_plan', default={})\n"
        "   | map(attribute='models', default=[]) | flatten }}",
        description="The fleet's models, each a dict of served_name and urls (its instances); "
        "defaults to the models of every plan of the zenvllm group. One router per served name.",
        elements="dict",
    ),
    own(
        "policy",
        "cache_aware",
        "cache_aware sends a prompt where its prefix is already cached (vLLM's prefix "
        "cache) and falls back to the least loaded instance when load is uneven; "
        "power_of_two and round_robin ignore the cache; consistent_hash pins a session.",
        ROUTING,
        description="Routing policy. cache_aware (prefix-cache affinity, balanced under uneven "
        "load), power_of_two, round_robin, random or consistent_hash.",
        choices=("cache_aware", "power_of_two", "round_robin", "random", "consistent_hash"),
    ),
    own(
        "cache_threshold",
        0.3,
        "",
        ROUTING,
        description="cache_aware's prefix-match share above which the cached instance is picked.",
    ),
    own(
        "health_endpoint",
        "/health",
        "Active health checks: an instance is left out after `failures` failed checks "
        "and taken back after `successes` good ones.",
        HEALTH,
        description="Path of each instance's health check.",
    ),
    own(
        "health_interval",
        5,
        "",
        HEALTH,
        description="Seconds between active health checks.",
    ),
    own(
        "health_timeout",
        3,
        "",
        HEALTH,
        description="Seconds a health check may take.",
    ),
    own(
        "health_failures",
        2,
        "",
        HEALTH,
        description="Failed checks in a row before an instance is left out.",
    ),
    own(
        "health_successes",
        1,
        "",
        HEALTH,
        description="Good checks in a row before it is taken back.",
    ),
    own(
        "retries",
        5,
        "A request that fails on one instance is retried on another (the router's "
        "retries exclude an instance whose circuit breaker opened).",
        HEALTH,
        description="Attempts per request, each on an instance whose breaker is closed.",
    ),
    own(
        "breaker_failures",
        3,
        "Circuit breaker: an instance that fails this often is skipped for timeout "
        "seconds. Short, so that a rolling update's next host never finds the previous "
        "host's instances still skipped.",
        HEALTH,
        description="Failures that open an instance's circuit breaker.",
    ),
    own(
        "breaker_timeout",
        10,
        "",
        HEALTH,
        description="Seconds an open breaker skips its instance (short, so a rolling update's next "
        "host never finds the previous one still skipped).",
    ),
    own(
        "startup_timeout",
        600,
        "At start the router waits for every instance to be healthy, this long at most.",
        HEALTH,
        description="Seconds the router waits at start for every instance to be healthy.",
    ),
    own(
        "request_timeout",
        1800,
        "",
        HEALTH,
        description="Seconds one request may take.",
    ),
    own(
        "extra_args",
        (),
        "",
        HEALTH,
        description="More vllm-router arguments, appended as given.",
    ),
    own(
        "unit_dir",
        "/etc/systemd/system",
        "",
        SYSTEMD,
        description="Directory of the router's systemd unit.",
        type="path",
    ),
    own(
        "ready_timeout",
        600,
        "Wait for /readiness (at least one healthy instance) after a (re)start.",
        SYSTEMD,
        description="Seconds to wait for /readiness after a (re)start.",
    ),
    state(),
)

ROLE = Role(
    "zenvllm_router",
    "scripts/zenvllm/deploy/role_router.py",
    "vLLM's router in front of every zenvllm instance of every host",
    (
        "Runs vllm-router (pinned in dockerfiles/build.yaml) under systemd on the hosts of the "
        "zenvllm_router group; the zenvllm gateway on the same host is the public edge.",
        "docs/how-to/fleet-and-monitoring.md shows the picture and an inventory.",
    ),
    VARIABLES,
    intro="vLLM's router (PyPI `vllm-router`) in front of every instance of every host in the "
    "`zenvllm` group, on the host(s) of the `zenvllm_router` group, under systemd: one router "
    "per model the fleet serves. The zenvllm gateway (nginx: TLS, client keys, limits) stays "
    "the public edge and proxies to them on loopback, each request to its model's router.",
)
