"""The gateway role's variables (zenvllm_gateway_*): Debian's nginx in front of the
instances, its keys, TLS and limits; reference.py writes the role's defaults and
argument specs from ROLE."""

from __future__ import annotations

from zenvllm.deploy.role_vars import Role, own, state

NGINX, MODELS, HEALTH = "nginx", "Several models", "Health and retries"
KEYS, TLS, LIMITS, SITE = "Client keys", "TLS", "Limits per key", "The site"

VARIABLES = (
    own(
        "packages",
        ("nginx",),
        "Debian's nginx in front of the instances; the only listener off loopback.",
        NGINX,
        description="nginx packages from the distribution.",
    ),
    own(
        "listen",
        "0.0.0.0:443",
        "Where clients connect (address:port; 0.0.0.0 = every interface): HTTPS.",
        NGINX,
        description="Where clients connect, [address:]port (HTTPS unless zenvllm_gateway_tls is "
        "false); the only listener off loopback.",
    ),
    own(
        "upstream_name",
        "",
        "Name of the nginx upstream: one per deployment, so several deployments can "
        "share one nginx.",
        NGINX,
        role_default="{{ zenvllm_instances_deployment | default('zenvllm') }}",
        description="Name of the nginx upstream; defaults to the deployment name, so several "
        "deployments can share one nginx.",
    ),
    own(
        "upstreams",
        (),
        "The upstream servers: the plan's instances (set by the instances role), or the router.",
        NGINX,
        role_default="{{ zenvllm_instances_urls | default([]) | map('regex_replace', '^https?://', "
        "'') | list }}",
        description="Upstream servers (address:port); defaults to the plan's instances (or, on a "
        "router host, the router).",
    ),
    own(
        "models",
        (),
        "The models behind this gateway: the plan's, each with its served name and "
        "URLs. With several, each request goes to the instances of the model its JSON "
        "\"model\" field names (nginx's njs module reads it: Debian's "
        "libnginx-mod-http-js, installed then; refused on an nginx zenvllm did not "
        "install, where the operator installs it), and GET /v1/models lists them all; "
        "with one, nginx proxies as it always has.",
        MODELS,
        role_default="{{ zenvllm_instances_plan.models | default([]) }}",
        description="The models behind the gateway, each with served_name and urls (default the "
        "plan's). With several, requests go by their JSON model field to that model's "
        "instances (nginx's njs module, libnginx-mod-http-js; on an nginx zenvllm did not "
        "install, refused until the operator installs it) and GET /v1/models lists them all.",
        elements="dict",
    ),
    own(
        "njs_packages",
        ("libnginx-mod-http-js",),
        "",
        MODELS,
        description="The package of nginx's njs module, installed when several models are served.",
    ),
    own(
        "script_path",
        "",
        "The script that reads the model field (written with several models only).",
        MODELS,
        role_default="{{ zenvllm_gateway_site_path | regex_replace('[.]conf$', '') }}.js",
        description="Where the njs script that reads the model field goes (several models only).",
    ),
    own(
        "health_path",
        "/health",
        "/gateway-health asks the upstreams this path and answers 200 when one of them "
        "does, 502 when none does: the instances' /health, or the router's /readiness.",
        HEALTH,
        description="What /gateway-health asks the upstreams (200 while one answers 200, else "
        "502); /health of the instances, /readiness of the router.",
    ),
    own(
        "max_fails",
        0,
        "Passive health checks: after max_fails errors within fail_timeout an instance "
        "is left out for fail_timeout. 0 (the default) never leaves one out: a stopped "
        "instance on loopback refuses at once and the request moves on, while a "
        "left-out one that is back lingers out for fail_timeout, and a rolling update "
        'that stops the next instance then has none left (nginx answers 502 "no live '
        'upstreams"; measured by tests/reliability).',
        HEALTH,
        description="Passive health check: failed attempts within fail_timeout before an instance "
        "is left out; 0 never leaves one out (a stopped instance refuses at once and "
        "the request moves on).",
    ),
    own(
        "fail_timeout",
        "10s",
        "",
        HEALTH,
        description="Passive health check window, and how long a failed instance is left out "
        "(nginx time).",
    ),
    own(
        "next_upstream",
        ("error", "timeout", "http_502", "http_503"),
        "Retry a request on another instance when one fails or answers 502/503.",
        HEALTH,
        description="Conditions under which a request is retried on the next instance "
        "(proxy_next_upstream).",
    ),
    own(
        "next_upstream_tries",
        3,
        "",
        HEALTH,
        description="At most this many instances try one request.",
    ),
    own(
        "next_upstream_timeout",
        "30s",
        "",
        HEALTH,
        description="Stop retrying a request after this long (nginx time).",
    ),
    own(
        "retry_non_idempotent",
        True,
        "Completions are stateless: retrying a POST costs compute, not correctness.",
        HEALTH,
        description="Retry POST requests too (completions are stateless).",
    ),
    own(
        "read_timeout",
        "600s",
        "Long generations stream for minutes.",
        HEALTH,
        description="How long a streaming response may stay silent (nginx time).",
    ),
    own(
        "client_max_body_size",
        "32m",
        "",
        HEALTH,
        description="Largest request body (nginx size).",
    ),
    own(
        "clients",
        ("default",),
        'Closed by default: clients send "Authorization: Bearer <key>". One key per '
        "client name, generated on the controller on the first run and reused (0600 "
        "files under zenvllm_gateway_secrets_dir/keys/); a name left out of the list is "
        "revoked.",
        KEYS,
        description="Client names; each gets a key generated on the controller on the first run "
        "and reused; a name removed from the list is revoked on the next run.",
    ),
    own(
        "api_key",
        "",
        'A key of your own, accepted beside the generated ones (client "given").',
        KEYS,
        inherit="zenvllm_api_key",
        description='A key of your own accepted beside the generated ones (client "given"); '
        "defaults to zenvllm_api_key.",
    ),
    own(
        "upstream_key",
        "",
        "The key the instances require (VLLM_API_KEY), sent upstream in place of the client's.",
        KEYS,
        role_default="{{ zenvllm_instances_api_key | default(zenvllm_api_key | default('')) }}",
        description="The key the instances require (VLLM_API_KEY), sent upstream in place of the "
        "client's; defaults to zenvllm_instances_api_key.",
    ),
    own(
        "anonymous",
        False,
        "Serve without any key: an explicit opt-out, warned about in the play output.",
        KEYS,
        description="Serve without any API key (an explicit opt-out, warned about in the play "
        "output).",
    ),
    own(
        "secrets_dir",
        "",
        "On the controller: the generated keys and each host's CA certificate.",
        KEYS,
        role_default="{{ lookup('ansible.builtin.env', 'ZENVLLM_SECRETS_DIR')\n"
        "   or lookup('ansible.builtin.env', 'HOME') ~ '/.config/zenvllm' }}"
        "/{{ zenvllm_gateway_upstream_name }}",
        description="On the controller, the generated keys (keys/NAME, 0600) and each host's CA "
        "certificate (HOST-ca.pem); defaults to ~/.config/zenvllm/DEPLOYMENT.",
        type="path",
    ),
    own(
        "tls",
        True,
        "TLS at the edge: the operator's certificate and key (paths on the host), or "
        "else a pair the deployment's own CA signs (community.crypto, on the controller, "
        "in zenvllm_gateway_secrets_dir/tls), installed in zenvllm_gateway_tls_dir. Plain "
        "HTTP on the listener gets a redirect to HTTPS. false: plain HTTP, warned.",
        TLS,
        description="Serve HTTPS (plain HTTP on the listener is redirected); false serves plain "
        "HTTP, warned about in the play output.",
    ),
    own(
        "tls_cert",
        "",
        "",
        TLS,
        description="The operator's certificate (chain) on the host; empty makes a self-signed "
        "one.",
    ),
    own(
        "tls_key",
        "",
        "",
        TLS,
        description="The private key of zenvllm_gateway_tls_cert on the host.",
    ),
    own(
        "tls_dir",
        "/etc/zenvllm/tls",
        "",
        TLS,
        description="Where the host keeps the CA-signed pair the role installs (removed by "
        "zenvllm_state=absent).",
        type="path",
    ),
    own(
        "tls_names",
        (),
        "Names and addresses the certificate is valid for, beside localhost, 127.0.0.1, "
        "the host's names and the addresses the inventory gives it (ansible_host: a "
        "floating IP). A name added later is in the certificate the next run makes.",
        TLS,
        description="Extra subjectAltName entries of the gateway's certificate, e.g. "
        "DNS:api.example.com or IP:203.0.113.7 (localhost, 127.0.0.1, the host's names and "
        "its inventory addresses are always in); a name added renews the certificate.",
    ),
    own(
        "tls_days",
        365,
        "How long a host certificate the role signs is valid, and how many days before "
        "its end a run renews it (ZenvllmCertificateExpiring fires when a renewal was "
        "missed: zenvllm_monitoring_certificate_days before the end).",
        TLS,
        description="Days a host certificate the role signs is valid.",
        low=1,
    ),
    own(
        "tls_renew_days",
        30,
        "",
        TLS,
        description="A run renews the host certificate when it expires within this many days.",
        low=1,
    ),
    own(
        "expiry_textfile",
        "",
        "Where the certificate's expiry goes as a metric, for the node exporter's textfile "
        'collector (written once that directory exists; "" = none).',
        TLS,
        role_default="/var/lib/prometheus/node-exporter/zenvllm-gateway-"
        "{{ zenvllm_gateway_upstream_name }}.prom",
        description="The node exporter textfile the certificate's expiry is written to "
        '(zenvllm_gateway_certificate_expiry_seconds); "" writes none.',
        type="path",
    ),
    own(
        "requests_per_second",
        20,
        "Per key: requests per second (with a burst) and requests at once; over either, "
        "429 with Retry-After. Sized from the plan: every instance's max_num_seqs.",
        LIMITS,
        description="Requests per second per key (nginx limit_req rate); over it and the burst, "
        "429 with Retry-After.",
    ),
    own(
        "burst",
        0,
        "",
        LIMITS,
        role_default="{{ zenvllm_instances_plan.max_concurrency | default(256) }}",
        description="Requests per key above the rate before 429; defaults to the plan's "
        "max_concurrency (every instance's max_num_seqs).",
    ),
    own(
        "connections_per_key",
        0,
        "",
        LIMITS,
        role_default="{{ zenvllm_instances_plan.max_concurrency | default(256) }}",
        description="Requests at once per key (nginx limit_conn); over it, 429 with Retry-After; "
        "defaults to the plan's max_concurrency.",
    ),
    own(
        "site_path",
        "/etc/nginx/conf.d/zenvllm.conf",
        "Where the site goes, and whether Debian's default site (port 80) is removed.",
        SITE,
        description="Where the nginx site is written.",
        type="path",
    ),
    own(
        "remove_default_site",
        True,
        "",
        SITE,
        description="Remove Debian's default site (it listens on port 80).",
    ),
    own(
        "manage_service",
        True,
        "Start nginx through systemd, or its init script where systemd is not PID 1.",
        SITE,
        description="Start nginx (systemd, or its init script where systemd is not PID 1).",
    ),
    state(),
)

ROLE = Role(
    "zenvllm_gateway",
    "scripts/zenvllm/deploy/role_gateway.py",
    "Debian's nginx as the load balancer in front of the zenvllm instances",
    (
        "Variables of the zenvllm_gateway role; its README.md and docs/reference/variables.md "
        "list them.",
    ),
    VARIABLES,
)
