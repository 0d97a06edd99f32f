"""Which CPU generation a host is, from /proc/cpuinfo's vendor, family and model.

Under KVM the brand string is often only "AMD EPYC" or "Intel(R) Xeon(R) Processor", so
a plan, a status row or a bench result that quotes it cannot tell a Zen 3 from a Zen 5;
the family and model the hypervisor passes through can. The ranges are AMD's and Intel's
model numbers as Linux's arch/x86 code names them (AMD family 17h Zen and Zen 2, 19h Zen
3 and Zen 4, 1Ah Zen 5; Intel family 6 server parts). Pure; standard library only.
"""

from __future__ import annotations

# (family, first model, last model, name); the first match wins.
AMD = (
    (0x17, 0x00, 0x2F, "Zen"),
    (0x17, 0x30, 0xFF, "Zen 2"),
    (0x19, 0x00, 0x0F, "Zen 3"),
    (0x19, 0x10, 0x1F, "Zen 4"),
    (0x19, 0x20, 0x5F, "Zen 3"),
    (0x19, 0x60, 0xAF, "Zen 4"),
    (0x1A, 0x00, 0x7F, "Zen 5"),
)
INTEL = {
    0x55: "Skylake-SP/Cascade Lake",
    0x6A: "Ice Lake-SP",
    0x6C: "Ice Lake-D",
    0x8F: "Sapphire Rapids",
    0xCF: "Emerald Rapids",
    0xAD: "Granite Rapids",
    0xAF: "Sierra Forest",
}


def generation(vendor: str, family: int | None, model: int | None) -> str:
    """ "Zen 3", "Sapphire Rapids", ...; "" when the numbers name no known part."""
    if family is None or model is None:
        return ""
    if vendor == "AuthenticAMD":
        return next((n for f, lo, hi, n in AMD if f == family and lo <= model <= hi), "")
    if vendor == "GenuineIntel" and family == 6:
        return INTEL.get(model, "")
    return ""


def cpu_name(model_name: str, gen: str, family: int | None, model: int | None) -> str:
    """The brand string with the generation (or the raw family and model) it lacks."""
    name = model_name or "unknown CPU"
    if gen:
        return name if gen in name else f"{name} ({gen})"
    if family is not None and model is not None:
        return f"{name} (family {family} model {model})"
    return name
