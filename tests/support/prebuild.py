"""Build what the bench tier needs while the serve and ansible tiers leave cores idle.

`make test` starts this after the image tier, in the background, and the bench tier
waits for it (scripts/test_tiers.sh). What it builds is the bench tier's llama.cpp
peer, compiled for this CPU: about 6 minutes of both cores on a fresh machine, a
cache hit afterwards. The serve and ansible tiers spend much of their time waiting on
vLLM starts, ssh round trips and health polls (vmstat on a 2-core Zen 4 during the
ansible tier: about 45% of the CPU idle), so the build goes beside them, with the same
arguments as the bench tier's own build (tests/support/engine.build), which then finds
the image in its cache.

On zenvllm's own engine (scripts/engine.sh: never a host's) the build's steps run at
idle priority among the engine's containers: BuildKit runs each RUN step in a cgroup
under the engine's `buildkit` group, and `cpu.idle` on that group leaves its tasks
only the cycles the tests' vLLM containers do not want. Undone after the build.

    python tests/support/prebuild.py LOG
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from pathlib import Path

from support.engine import build, engine_env

from zenvllm.runtime.hostengine import PRIVATE_SOCKET

# Where the private engine's BuildKit puts its build steps (cgroup v1's cpu controller,
# or the unified tree).
BUILDKIT_GROUPS = ("/sys/fs/cgroup/cpu/docker/buildkit", "/sys/fs/cgroup/docker/buildkit")


@contextlib.contextmanager
def idle_build_steps(docker_host: str) -> Iterator[str]:
    """BuildKit's build steps at idle priority while inside; what was done, in words."""
    knob = next(
        (Path(g) / "cpu.idle" for g in BUILDKIT_GROUPS if (Path(g) / "cpu.idle").is_file()),
        None,
    )
    if docker_host != PRIVATE_SOCKET or knob is None:
        yield "build steps at normal priority (not zenvllm's own engine, or no cpu.idle)"
        return
    before = knob.read_text().strip()
    knob.write_text("1")
    try:
        yield f"build steps at idle priority ({knob})"
    finally:
        knob.write_text(before)


def main(log: Path) -> int:
    with idle_build_steps(engine_env()["DOCKER_HOST"]) as how:
        print(f"prebuild: the llama.cpp peer, {how}", flush=True)
        tag, seconds = build("llamacpp", log)
    print(f"prebuild: {tag} in {seconds:.0f} s (log: {log})")
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1])))
