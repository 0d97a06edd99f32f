"""Make what a later tier needs while earlier tiers leave cores idle.

`make test` starts these after the image tier, in the background (scripts/test_tiers.sh,
the Makefile's BACKGROUND), and the tier that needs each waits for it:

- hosts, for the ansible tier: the nspawn hosts' Debian root and its cloud-image layer
  (debootstrap and apt: mostly downloads) and the `docker save` archive of vllm-openai
  the routed fleet's host loads;
- peer, for the bench tier: the llama.cpp peer compiled for this CPU (about 6 minutes
  of both cores on a fresh machine).

Each is cached and a later make is a hit (the same functions and build arguments the
tiers use). The serve and ansible tiers spend much of their time waiting on vLLM
starts, ssh round trips and health polls (the warm ansible tier alone left 28% of a
2-core Zen 4 idle; the peer built beside it made that tier 193 s longer, against 361 s
built on its own: docs/test-runs/2026-11-27-zen4-warm-ansible-tier-cpu-d891906.txt),
which is what these use. On zenvllm's own engine (scripts/engine.sh: never a host's) the
peer's build steps run at idle priority among the engine's containers: BuildKit runs
each RUN step in a cgroup under the engine's `buildkit` group, and `cpu.idle` on that
group leaves them only the cycles the tests' vLLM containers do not want. Undone after
the build.

    python tests/support/prebuild.py hosts|peer LOG
"""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from support import nspawn
from support.engine import build, engine_env, image_archive

from zenvllm.runtime.hostengine import PRIVATE_SOCKET

# What the routed fleet's host loads (tests/ansible/test_routed_fleet.py).
FLEET_IMAGE = "zenvllm/vllm-openai:0.32.0"
# Where the private engine's BuildKit puts its build steps (cgroup v1's cpu controller,
# or the unified tree).
BUILDKIT_GROUPS = ("/sys/fs/cgroup/cpu/docker/buildkit", "/sys/fs/cgroup/docker/buildkit")


def started_by_engine_sh(docker_host: str, runs: Path = Path("/run")) -> bool:
    """zenvllm's own dockerd (scripts/engine.sh), never a host's: the default private
    socket, or one in a zenvllm* directory of `runs` beside the daemon.json and pidfile
    engine.sh writes (ZENVLLM_ENGINE_STATE and DOCKER_HOST give a second one, e.g. a
    fresh run's)."""
    run = Path(docker_host.removeprefix("unix://")).parent
    beside = all((run / name).is_file() for name in ("daemon.json", "dockerd.pid"))
    ours = run.parent == runs and run.name.startswith("zenvllm") and beside
    return docker_host == PRIVATE_SOCKET or ours


@contextlib.contextmanager
def idle_build_steps(docker_host: str) -> Iterator[str]:
    """BuildKit's build steps at idle priority while inside; what was done, in words."""
    knob = next(
        (Path(g) / "cpu.idle" for g in BUILDKIT_GROUPS if (Path(g) / "cpu.idle").is_file()),
        None,
    )
    if not started_by_engine_sh(docker_host) or knob is None:
        yield "build steps at normal priority (not zenvllm's own engine, or no cpu.idle)"
        return
    before = knob.read_text().strip()
    knob.write_text("1")
    try:
        yield f"build steps at idle priority ({knob})"
    finally:
        knob.write_text(before)


def hosts(log: Path) -> str:
    root, cloud = nspawn.ensure_rootfs(), nspawn.ensure_cloud_layer()
    return f"{root}, {cloud}, {image_archive(FLEET_IMAGE)}"


def peer(log: Path) -> str:
    with idle_build_steps(engine_env()["DOCKER_HOST"]) as how:
        print(f"prebuild: the llama.cpp peer, {how}", flush=True)
        # At idle priority beside a busy tier it may outlast build()'s 30 min; cut, it
        # started over in the bench tier (a fresh run on 2026-11-26: timed out after
        # 30 min, then built again there). The bench tier waits for it instead.
        return build("llamacpp", log, timeout=3600)[0]


JOBS = {"hosts": hosts, "peer": peer}


def main(job: str, log: Path) -> int:
    start = time.monotonic()
    made = JOBS[job](log)
    print(f"prebuild {job}: {made} in {time.monotonic() - start:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], Path(sys.argv[2])))
