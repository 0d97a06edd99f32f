"""The host's command line: `python3 -m zenvllm.runtime plan|status|doctor|calibrate ...`.

Hosts and images receive only the core and runtime, so this entry imports only
their verbs; on a workstation `zenvllm` (zenvllm.cli) has these and the rest.
"""

from zenvllm.runtime import (
    commands_calibrate,
    commands_doctor,
    commands_engine,
    commands_model,
    commands_plan,
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
        ),
        None,
    )
)
