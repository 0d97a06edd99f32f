"""A host is named with its CPU generation, from cpuinfo's family and model: under KVM
the brand string alone ("AMD EPYC") cannot tell a Zen 3 from a Zen 5."""

from __future__ import annotations

import pytest

from zenvllm.core import plan_doc
from zenvllm.core.flavors import synthetic_host
from zenvllm.core.generations import generation
from zenvllm.core.model import model_of_size
from zenvllm.core.plan import make_plan
from zenvllm.core.topology import parse_cpuinfo, read_host


@pytest.mark.parametrize(
    ("fixture", "name"),
    [
        ("test-machine-zen4-2cpu", "AMD EPYC (Zen 4)"),  # KVM's bare brand string
        ("vm-milan-8vcpu-avx2", "AMD EPYC 7763 64-Core Processor (Zen 3)"),
        ("container-cgroup1", "AMD EPYC 7313 16-Core Processor (Zen 3)"),
        ("epyc-9654-nps4", "AMD EPYC 9654 96-Core Processor (Zen 4)"),
        ("epyc-9755-1s-nps1", "AMD EPYC 9755 128-Core Processor (Zen 5)"),
        ("xeon-8480-spr-amx", "Intel(R) Xeon(R) Platinum 8480+ (Sapphire Rapids)"),
    ],
)
def test_recorded_hosts_are_named_with_their_generation(fixtures_dir, fixture, name):
    assert read_host(fixtures_dir / fixture).cpu_name == name


def test_the_ranges_of_each_vendor():
    assert generation("AuthenticAMD", 23, 0x31) == "Zen 2"  # Rome
    assert generation("AuthenticAMD", 25, 0xA0) == "Zen 4"  # Bergamo
    assert generation("AuthenticAMD", 25, 0x21) == "Zen 3"
    assert generation("AuthenticAMD", 26, 0x11) == "Zen 5"
    assert generation("GenuineIntel", 6, 0xCF) == "Emerald Rapids"
    assert generation("GenuineIntel", 6, 167) == ""  # not a server part zenvllm names
    assert generation("HygonGenuine", 24, 1) == ""


def test_an_unknown_part_keeps_its_numbers_and_bad_numbers_are_dropped():
    info = parse_cpuinfo(
        "vendor_id\t: GenuineIntel\ncpu family\t: 6\nmodel\t\t: 167\n"
        "model name\t: Intel(R) Xeon(R) Processor\nflags\t\t: avx2\n"
    )
    assert (info.family, info.model) == (6, 167)
    assert parse_cpuinfo("cpu family\t: six\nmodel\t: 1e9\n").family is None


def test_flavors_and_the_plan_json_carry_the_generation():
    plan = plan_doc.one(make_plan(synthetic_host("epyc-7763-8c-32g"), model_of_size(1)))
    assert plan["host"]["generation"] == "Zen 3"
    assert plan["host"]["model_name"] == "AMD EPYC 7763"
    assert any("AMD EPYC 7763 (Zen 3) has neither" in n for n in plan["notes"])
