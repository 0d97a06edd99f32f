"""The verify role's variables (zenvllm_verify_*): what it waits for and what it asks
through the gateway; reference.py writes the role's defaults and argument specs from
ROLE."""

from __future__ import annotations

from zenvllm.deploy.role_vars import Role, own, state

CHECKS = "Checks"

VARIABLES = (
    own(
        "urls",
        (),
        "The instances to wait for (the plan's URLs, set by the instances role).",
        CHECKS,
        role_default="{{ zenvllm_instances_urls | default([]) }}",
        description="Instance URLs to wait for (http://address:port); defaults to the plan's.",
    ),
    own(
        "health_timeout",
        900,
        "How long each instance may take to answer /health (vLLM's first start compiles).",
        CHECKS,
        description="Seconds each instance may take to answer /health.",
    ),
    own("health_delay", 1, "", CHECKS, description="Seconds between /health asks."),
    own(
        "planner",
        "",
        "The planner zipapp on the host, which waits for them in one process (`zenvllm "
        "health wait`): the instances role's copy.",
        CHECKS,
        role_default="{{ zenvllm_instances_pythonpath | default('') }}",
        description="Path of the planner zipapp on the host; defaults to the instances "
        "role's copy.",
    ),
    own(
        "python",
        "/usr/bin/python3",
        "",
        CHECKS,
        role_default="{{ zenvllm_instances_python | default('/usr/bin/python3') }}",
        description="The host's Python that runs the planner zipapp.",
    ),
    own(
        "completion",
        True,
        "Send a real completion through the gateway.",
        CHECKS,
        description="Send a real completion through the gateway after the health checks.",
    ),
    own(
        "gateway_here",
        True,
        "Whether this host has a gateway to send it through: deploy.yml says no for a host "
        "behind a router without zenvllm_gateway_per_host (the router's play checks there).",
        CHECKS,
        description="Whether this host has a gateway of its own (set by deploy.yml).",
    ),
    own(
        "gateway_url",
        "",
        "",
        CHECKS,
        role_default="{{ 'https' if zenvllm_gateway_tls | default(true) | bool else 'http' "
        "}}://127.0.0.1:{{\n   (zenvllm_gateway_listen | default('443')) | string "
        "| regex_replace('^.*:', '') }}",
        description="Base URL of the gateway as seen from the host (https unless "
        "zenvllm_gateway_tls is false).",
    ),
    own(
        "ca_path",
        "",
        "The certificate to trust: the deployment's CA, which signed the gateway's (an "
        "operator's certificate is rarely valid for 127.0.0.1, so it is not checked on this "
        "loopback request).",
        CHECKS,
        role_default="{{ zenvllm_gateway_ca_path | default('') if not "
        "zenvllm_gateway_tls_cert | default('') else '' }}",
        description="Certificate to trust on the host; defaults to the deployment's CA, which "
        "signed the gateway's (empty skips the check, as for an operator's certificate on "
        "this loopback request).",
    ),
    own(
        "models",
        (),
        "Each model of the plan, by its served name: generate gets a completion, pooling (an "
        "embedding or scoring model) a /pooling request.",
        CHECKS,
        role_default="{{ zenvllm_instances_plan.models | default([{'served_name': 'model', "
        "'runner': 'generate'}]) }}",
        description="The models to ask through the gateway, each a dict with served_name and "
        "runner (generate asks for a completion, pooling sends a /pooling request, for an "
        "embedding or scoring model); defaults to every model of the plan.",
        elements="dict",
    ),
    own(
        "prompt",
        "The capital of France is",
        "",
        CHECKS,
        description="Prompt of the test completion.",
    ),
    own(
        "max_tokens",
        8,
        "",
        CHECKS,
        description="Tokens to generate (exact, with ignore_eos).",
    ),
    own(
        "api_key",
        "",
        "One of the gateway's keys (the first client's), or zenvllm_api_key.",
        CHECKS,
        role_default="{{ (zenvllm_gateway_keys | default({}) | dictsort | map('last') | list "
        "+ [zenvllm_api_key | default('')])\n   | first }}",
        description="API key sent as a bearer token; defaults to the gateway's first client "
        "key, else zenvllm_api_key.",
    ),
    state(
        "present, or absent: checks nothing (there is nothing to remove). Follows zenvllm_state.",
        "present waits for the instances and sends a completion; absent checks nothing. "
        "Defaults to zenvllm_state.",
    ),
)

ROLE = Role(
    "zenvllm_verify",
    "scripts/zenvllm/deploy/role_verify.py",
    "Wait for every instance's /health and send a real completion through the gateway",
    (
        "Variables of the zenvllm_verify role; its README.md and docs/reference/variables.md "
        "list them.",
    ),
    VARIABLES,
)
