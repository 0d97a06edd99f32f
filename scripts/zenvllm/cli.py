"""The thin command line: every verb, each in the layer whose code it drives.

`zenvllm plan` and `doctor` live in the runtime (hosts run them too, as
`python3 -m zenvllm.runtime`), `render` and `build` in image, `bench` in bench
(commands_bench, one entry for a model of either kind: bench/kinds.py).
"""

from __future__ import annotations

from zenvllm.bench import commands_bench
from zenvllm.image import commands_image
from zenvllm.runtime import (
    commands_calibrate,
    commands_doctor,
    commands_model,
    commands_plan,
    commands_revision,
    commands_status,
    console,
)

# In the order `--help` lists them.
VERBS = (
    commands_plan,
    commands_status,
    commands_doctor,
    commands_calibrate,
    commands_model,
    commands_revision,
    commands_image,
    commands_bench,
)


def main(argv: list[str] | None = None) -> int:
    return console.run(VERBS, argv)
