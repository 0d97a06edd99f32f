"""Image targets: what each needs from the CPU and the run-time env it wants.

The one place that says which ISA a target needs; the planner, doctor and the
image launcher all ask `missing_isa`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from zenvllm.core.host import Host


@dataclass(frozen=True)
class Target:
    name: str
    summary: str
    needs_flags: tuple[str, ...]  # /proc/cpuinfo flags, all required
    needs_vendor: str | None = None  # vendor_id, when the target is vendor specific
    # Tuning env the planner adds for this target; each value says why in README.
    env: dict[str, str] = field(default_factory=dict)


TARGETS = {
    t.name: t
    for t in (
        Target(
            "vllm-openai",
            "vLLM's CPU build: AVX2 everywhere, AVX-512/AMX kernels picked at run time",
            needs_flags=("avx2",),
        ),
        Target(
            "zen",
            "vllm-openai plus zentorch: ZenDNN kernels for linear layers on AMD Zen 4/5",
            needs_flags=("avx512f", "avx512_bf16"),
            needs_vendor="AuthenticAMD",
            env={
                # Prepack linear weights once at load instead of per call (vLLM's default, pinned).
                # No TORCHINDUCTOR_FREEZING: AMD's older recipes set it for zentorch's compile
                # backend, but vLLM 0.32's ZenCpuPlatform routes linears to zentorch at load,
                # and freezing breaks vLLM's AOT compile cache ("expected OutputCode, got
                # <class 'function'>"), so the server never starts in its default compiled mode.
                "VLLM_ZENTORCH_WEIGHT_PREPACK": "1",
            },
        ),
        Target(
            "pace",
            "vllm-openai plus AMD PACE (pace-vllm) platform plugin",
            # No vendor: pace-vllm 1.3.0 registers its platform wherever /proc/cpuinfo
            # shows avx512f and avx512_bf16 (PacePlatform.is_available); under a faked
            # Sapphire Rapids view vLLM picked PacePlatform.
            needs_flags=("avx512f", "avx512_bf16"),
        ),
    )
}


def missing_isa(target: Target, host: Host) -> list[str]:
    """What the host lacks for the target to accelerate anything; empty when it can."""
    missing = [f for f in target.needs_flags if f not in host.flags]
    if target.needs_vendor and host.vendor and host.vendor != target.needs_vendor:
        missing.insert(0, f"vendor {target.needs_vendor} (this CPU is {host.vendor})")
    return missing
