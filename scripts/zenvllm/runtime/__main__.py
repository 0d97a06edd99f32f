"""The host's command line: `python3 -m zenvllm.runtime plan|status|doctor|calibrate ...`.

Hosts and images receive only the core and runtime, so this entry imports only
their verbs; on a workstation `zenvllm` (zenvllm.cli) has these and the rest.
"""

import sys

# Before any import of the layers, which use 3.10's syntax and library: an older host
# Python gets the fix, not a SyntaxError (this much parses on any Python 3).
if sys.version_info < (3, 10):  # noqa: UP036 (ruff assumes 3.10; a host may not)
    print(
        f"zenvllm: this host's python3 is {sys.version.split()[0]}, below 3.10, the oldest "
        "the planner runs on (Ubuntu 22.04's; Debian 12 has 3.11): install a newer python3 "
        "and give Ansible its path (ansible_python_interpreter)",
        file=sys.stderr,
    )
    raise SystemExit(2)

from zenvllm.runtime import (
    commands_calibrate,
    commands_compile_cache,
    commands_doctor,
    commands_engine,
    commands_files,
    commands_health,
    commands_model,
    commands_plan,
    commands_preflight,
    commands_revision,
    commands_status,
    console,
)

raise SystemExit(
    console.run(
        (
            commands_plan,
            commands_status,
            commands_doctor,
            commands_calibrate,
            commands_model,
            commands_engine,
            commands_files,
            commands_health,
            commands_preflight,
            commands_revision,
            commands_compile_cache,
        ),
        None,
    )
)
