"""Quantized weights: which format a model's config.json names, and whether vLLM
0.32's CPU build can serve it on a host.

The planner needs nothing else to size them: it counts the safetensors headers'
byte spans, which are exact for packed INT4 words, their scales and zero points
alike. What vLLM 0.32 runs on a CPU (read in its source, served in the image tier):

* `awq` and `gptq`, INT4 weight-only: its CPU WNA16 kernel, `_C.cpu_gemm_wna16`,
  is compiled into its AVX-512 extension only (`_C_AVX2` lacks the op), so they
  need AVX-512; zentorch has no path for them (the zen target falls back to it).
* `compressed-tensors` INT8 W8A8: oneDNN's scaled matmul, in every build (AVX2
  too); on the zen target zentorch's dynamic quantized linear, when activations
  are quantized per token at run time (llm-compressor's W8A8 preset).

Anything else is named but not judged: vLLM decides at start-up. Pure.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from zenvllm.core import gate
from zenvllm.core.errors import PlanError, UserError
from zenvllm.core.host import Host

INT4_KERNEL = (
    "vLLM 0.32's CPU INT4 kernel (cpu_gemm_wna16) is compiled into its AVX-512 library only"
)
FIX = "fix or re-download the model's config.json"
SERVABLE_WITHOUT_AVX512 = "the bf16 weights or a compressed-tensors W8A8 INT8 copy"


@dataclass(frozen=True)
class Quantization:
    method: str  # config.json's quant_method
    label: str  # for the plan's notes: "AWQ INT4 (group 128)"
    needs_flags: tuple[str, ...] = ()  # /proc/cpuinfo flags its CPU kernel needs
    why: str = ""  # why it needs them
    zentorch: bool = False  # whether the zen target's zentorch runs its linears
    bits: int = 0  # bits per packed weight (0: not said), for the FLOPs a step computes


def bits_of(value: Any) -> int:
    """Bits per weight as the config says them; 0 for anything but 1 to 16."""
    ok = isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= 16
    return value if ok else 0


def compressed_tensors(config: dict[str, Any], where: str) -> Quantization:
    """The first config group's scheme: W8A8 INT8, W4A16, ..."""
    where = f"{where}: quantization_config.config_groups"
    groups = gate.obj(config.get("config_groups") or {}, where, FIX)
    name, group = next(iter(groups.items()), ("", {}))
    group = gate.obj(group, f"{where}.{name}", FIX)
    weights = gate.obj(group.get("weights") or {}, f"{where}.{name}.weights", FIX)
    acts = gate.obj(group.get("input_activations") or {}, f"{where}.{name}.input_activations", FIX)
    w_bits, a_bits = weights.get("num_bits"), acts.get("num_bits") or 16
    kind = str(weights.get("type", "int")).upper()
    label = f"compressed-tensors W{w_bits}A{a_bits} {kind}{w_bits}"
    int8 = (w_bits, a_bits, kind) == (8, 8, "INT")
    return Quantization(
        "compressed-tensors",
        label,
        zentorch=int8 and bool(acts.get("dynamic")),
        bits=bits_of(w_bits),
    )


def read(config: dict[str, Any], where: str) -> Quantization | None:
    """The model's quantization, from its config's `quantization_config`; None if bf16/fp."""
    q = config.get("quantization_config")
    if q is None:
        return None
    if not isinstance(q, dict) or not isinstance(q.get("quant_method"), str):
        raise UserError(
            f"{where}: quantization_config must be an object with a quant_method "
            "string; fix or re-download the model's config.json"
        )
    method = q["quant_method"].lower()
    if method in ("awq", "gptq"):
        label = f"{method.upper()} INT{q.get('bits', '?')} (group {q.get('group_size', '?')})"
        return Quantization(method, label, ("avx512f",), INT4_KERNEL, bits=bits_of(q.get("bits")))
    if method == "compressed-tensors":
        return compressed_tensors(q, where)
    return Quantization(method, f"{method} (not tested by zenvllm: vLLM decides at start-up)")


def check(q: Quantization | None, host: Host, model_name: str) -> None:
    """Refuse, with the way out, a format whose CPU kernel this host lacks."""
    missing = [f for f in q.needs_flags if f not in host.flags] if q else []
    if q and missing:
        raise PlanError(
            f"{model_name}: {q.label} needs {' '.join(missing)}, which this CPU "
            f"({host.cpu_name}) lacks: {q.why}. Serve "
            f"{SERVABLE_WITHOUT_AVX512} here, or use a host with AVX-512 "
            "(AMD EPYC Zen 4 or newer, Intel Xeon Skylake-SP or newer)"
        )


def note(q: Quantization | None, target: str) -> list[str]:
    """What the plan says about the format: its name, and what zen does with it."""
    if q is None:
        return []
    lines = [f"weights: {q.label}; sized from the safetensors headers (packed words, scales)"]
    if target == "zen":
        lines.append(
            "target zen: zentorch runs these linears"
            if q.zentorch
            else "target zen: zentorch has no kernel for this format; vLLM's own runs it"
        )
    return lines
