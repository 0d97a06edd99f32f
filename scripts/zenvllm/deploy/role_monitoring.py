"""The monitoring role's variables (zenvllm_monitoring_*): Prometheus, its targets from
the plans, the alert thresholds, Alertmanager and its receivers, the Grafana dashboard;
reference.py writes the role's defaults and argument specs from ROLE."""

from __future__ import annotations

from zenvllm.deploy.role_vars import Role, own, state
from zenvllm.deploy.topology import ROUTER_METRICS_PORT

PACKAGES, PROMETHEUS, TARGETS = "Packages", "Prometheus", "Targets"
THRESHOLDS, ALERTMANAGER = "Alert thresholds", "Alertmanager"
RECEIVERS, GRAFANA = "Alert receivers", "Grafana"

VARIABLES = (
    own(
        "packages",
        ("prometheus",),
        "",
        PACKAGES,
        description="Prometheus packages from the distribution.",
    ),
    own(
        "node_exporter_packages",
        ("prometheus-node-exporter",),
        "",
        PACKAGES,
        description="Node exporter packages from the distribution.",
    ),
    own(
        "node_exporter",
        True,
        "Install the node exporter on this host (the node-exporter play runs on every host).",
        PACKAGES,
        description="Whether this host runs a node exporter (and Prometheus scrapes it).",
    ),
    own(
        "node_exporter_port",
        9100,
        "",
        PACKAGES,
        description="The node exporter's port.",
    ),
    own(
        "config_path",
        "/etc/prometheus/prometheus.yml",
        "",
        PROMETHEUS,
        description="Prometheus's configuration (only Debian's sample or zenvllm's own is "
        "overwritten).",
        type="path",
    ),
    own(
        "rules_path",
        "/etc/prometheus/zenvllm.rules.yml",
        "",
        PROMETHEUS,
        description="zenvllm's rules file, checked with promtool.",
        type="path",
    ),
    own(
        "scrape_interval",
        "15s",
        "",
        PROMETHEUS,
        description="How often Prometheus scrapes (Prometheus duration).",
    ),
    own(
        "evaluation_interval",
        "15s",
        "",
        PROMETHEUS,
        description="How often rules are evaluated.",
    ),
    own(
        "url",
        "http://127.0.0.1:9090",
        "Where Prometheus answers (Debian's default port); the test and Grafana read it.",
        PROMETHEUS,
        description="Where Prometheus answers on its host.",
    ),
    own(
        "instance_targets",
        {},
        "From the plans: each host's instances (their URLs), the router's "
        "metrics listener, and every host's node exporter.",
        TARGETS,
        role_default="{{ dict(groups['zenvllm'] | default([])\n"
        "        | zip(groups['zenvllm'] | default([]) | map('extract', hostvars)\n"
        "              | map(attribute='zenvllm_instances_urls', default=[]))) }}",
        description="Host name to its instances' URLs; defaults to every zenvllm host's plan.",
    ),
    own(
        "router_targets",
        (),
        "",
        TARGETS,
        role_default="{% set models = groups['zenvllm'] | default([]) | map('extract', hostvars)\n"
        "   | map(attribute='zenvllm_instances_plan', default={})\n"
        "   | map(attribute='models', default=[]) | flatten\n"
        "   | map(attribute='served_name') | unique | list | length %}{{\n"
        "   groups['zenvllm_router'] | default([]) | map('extract', hostvars)\n"
        "   | map(attribute='zenvllm_private_address', default='')\n"
        "   | zenvllm.cpu.router_targets(models) }}",
        description="address:port of each router's metrics; defaults to the router hosts, port "
        f"{ROUTER_METRICS_PORT} and, with several models (a router each), the next ports.",
    ),
    own(
        "node_hosts",
        (),
        "",
        TARGETS,
        role_default="{{ (groups['zenvllm'] | default([])) + (groups['zenvllm_router'] "
        "| default([]))\n   + (groups['zenvllm_monitoring'] | default([])) | unique }}",
        description="Hosts whose node exporter is scraped; defaults to every host of the fleet.",
    ),
    own(
        "kv_cache_full",
        0.9,
        "",
        THRESHOLDS,
        description="KV cache usage (0 to 1) over which ZenvllmKvCacheNearFull fires.",
    ),
    own(
        "ttft_p95_seconds",
        5,
        "",
        THRESHOLDS,
        description="TTFT p95 of one model on one host over which ZenvllmTtftP95High fires.",
        type="float",
    ),
    own(
        "queue_waiting",
        4,
        "",
        THRESHOLDS,
        description="Waiting requests over which a growing queue fires ZenvllmQueueGrowing.",
    ),
    own(
        "for",
        "5m",
        "",
        THRESHOLDS,
        description="How long a warning condition must hold before it fires.",
    ),
    own(
        "down_for",
        "1m",
        "How long an instance may be unreachable (a restart takes less) before the alert.",
        THRESHOLDS,
        description="How long an instance may be unreachable before ZenvllmInstanceDown fires (and "
        "a router without healthy instances before ZenvllmRouterWithoutInstances).",
    ),
    own(
        "drift_for",
        "2m",
        "How long an instance may run off its plan (or on a fallback backend) before the alert.",
        THRESHOLDS,
        description="How long an instance may run off its plan, or on a fallback backend, before "
        "ZenvllmPlacementDrift or ZenvllmBackendFallback fires (Prometheus duration).",
    ),
    own(
        "certificate_days",
        14,
        "Days before a gateway's certificate expires that the alert fires: a re-run of "
        "deploy.yml renews it earlier (zenvllm_gateway_tls_renew_days), so this means none ran.",
        THRESHOLDS,
        description="ZenvllmCertificateExpiring fires when a gateway's certificate expires within "
        "this many days.",
        low=1,
    ),
    own(
        "alertmanager",
        True,
        "Alertmanager (Debian's prometheus-alertmanager) beside Prometheus: alerts "
        "grouped per alert, host and model go to the receivers below, when they fire "
        "and when they resolve. zenvllm configures only an Alertmanager it installed.",
        ALERTMANAGER,
        description="Install Alertmanager beside Prometheus and send it the alerts.",
    ),
    own(
        "alertmanager_packages",
        ("prometheus-alertmanager",),
        "",
        ALERTMANAGER,
        description="Alertmanager packages from the distribution.",
    ),
    own(
        "alertmanager_config_path",
        "/etc/prometheus/alertmanager.yml",
        "",
        ALERTMANAGER,
        description="Alertmanager's route and receivers (written only into an Alertmanager "
        "zenvllm installed).",
        type="path",
    ),
    own(
        "alertmanager_args_path",
        "/etc/default/prometheus-alertmanager",
        "",
        ALERTMANAGER,
        description="The file of Alertmanager's command-line arguments its service reads.",
        type="path",
    ),
    own(
        "alertmanager_listen",
        "127.0.0.1:9093",
        "This host only: Prometheus beside it is its one client.",
        ALERTMANAGER,
        description="address:port Alertmanager listens on; Prometheus sends it the alerts there.",
    ),
    own(
        "alert_webhooks",
        (),
        "With no receiver, Alertmanager holds the alerts (its API, amtool) and "
        "sends nothing. Webhook URLs get Alertmanager's JSON (Slack, Teams and chat "
        "bridges accept it).",
        RECEIVERS,
        description="URLs that receive each alert group as Alertmanager's webhook JSON, firing "
        "and resolved.",
    ),
    own(
        "alert_email_to",
        "",
        "E-mail: the address, the sender and the SMTP relay (host:port); no relay, no mail.",
        RECEIVERS,
        description="An address that receives each alert group by e-mail (needs the sender and "
        "the relay).",
    ),
    own(
        "alert_email_from",
        "",
        "",
        RECEIVERS,
        description="The sender of the alert e-mails.",
    ),
    own(
        "alert_smarthost",
        "",
        "",
        RECEIVERS,
        description="host:port of the SMTP relay the e-mails go through.",
    ),
    own(
        "alert_smtp_tls",
        True,
        "",
        RECEIVERS,
        description="Whether the relay must offer STARTTLS.",
    ),
    own(
        "alert_group_wait",
        "30s",
        "Wait this long to batch a new group's alerts; then at most one message per "
        "group and interval; a still-firing group is sent again after the repeat "
        "interval.",
        RECEIVERS,
        description="How long a new alert group waits for more alerts before it is sent.",
    ),
    own(
        "alert_group_interval",
        "5m",
        "",
        RECEIVERS,
        description="At most one message per group in this interval (new alerts, resolutions).",
    ),
    own(
        "alert_repeat_interval",
        "4h",
        "",
        RECEIVERS,
        description="A group still firing is sent again after this long.",
    ),
    own(
        "dashboard_dir",
        "/usr/share/zenvllm/grafana",
        "The Grafana dashboard (import it, or point Grafana's provisioning at the directory).",
        GRAFANA,
        description="Where the Grafana dashboard JSON is installed.",
        type="path",
    ),
    state(),
)

ROLE = Role(
    "zenvllm_monitoring",
    "scripts/zenvllm/deploy/role_monitoring.py",
    "Prometheus and Alertmanager for a zenvllm fleet, with rules and a Grafana dashboard",
    (
        "Debian's prometheus on the host of the zenvllm_monitoring group, scraping every "
        "instance, the router and each host's node exporter; targets come from each host's "
        "plan.",
        "Debian's prometheus-alertmanager beside it routes the alerts to the receivers named here.",
        "tasks_from node_exporter installs Debian's prometheus-node-exporter on a host.",
    ),
    VARIABLES,
    intro="Prometheus (Debian's package) on the host of the `zenvllm_monitoring` group, "
    "scraping every instance's /metrics, the router and each host's node exporter (Debian's "
    "prometheus-node-exporter), with zenvllm's rules, Alertmanager and a Grafana dashboard.",
)
