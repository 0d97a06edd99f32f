"""Number types for the CLI's options: argparse refuses a bad value by the option's
name, with the value, the limit and an example (`argument --kv-fraction: 'nan' is not
a number in (0, 1]; e.g. 0.9`), exit 2, before any work."""

from __future__ import annotations

import argparse
import ipaddress
import math
import re
from collections.abc import Callable


def whole(low: int, high: int | None = None, example: int = 1) -> Callable[[str], int]:
    """A whole number in [low, high]."""
    limit = f"from {low} to {high}" if high is not None else f"of {low} or more"

    def parse(value: str) -> int:
        try:
            n = int(value)
        except ValueError:
            n = None
        if n is None or n < low or (high is not None and n > high):
            raise argparse.ArgumentTypeError(
                f"{value!r} is not a whole number {limit}; e.g. {example}"
            )
        return n

    return parse


def real(low: float, high: float | None = None, example: float = 1.0) -> Callable[[str], float]:
    """A finite number above `low` and at most `high`: NaN and infinities are refused."""
    limit = f"in ({low:g}, {high:g}]" if high is not None else f"above {low:g}"

    def parse(value: str) -> float:
        try:
            x = float(value)
        except ValueError:
            x = math.nan
        if not math.isfinite(x) or x <= low or (high is not None and x > high):
            raise argparse.ArgumentTypeError(f"{value!r} is not a number {limit}; e.g. {example:g}")
        return x

    return parse


# One validator per option that several verbs take, with the limit it names.
port = whole(1, 65535, example=8001)  # --base-port
max_model_len = whole(1, 1 << 24, example=4096)  # --max-model-len: 16 M tokens, past any model


def instances(value: str) -> int | None:
    """'auto' (None) or a whole number of 1 or more."""
    return None if value == "auto" else whole(1, example=2)(value)


# A container name prefix: what docker, systemd and the env files all accept.
NAME = re.compile(r"[a-z][a-z0-9-]{0,40}")
NAME_RULE = "a name of lowercase letters, digits and dashes (up to 41, starting with a letter)"


def name(value: str) -> str:
    if not NAME.fullmatch(value):
        raise argparse.ArgumentTypeError(f"{value!r} is not {NAME_RULE}; e.g. zenvllm")
    return value


def is_ip(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True


def ip_address(value: str) -> str:
    if not is_ip(value):
        raise argparse.ArgumentTypeError(
            f"{value[:80]!r} is not an IP address; give the host's, e.g. 10.0.0.11"
        )
    return value


def env_pair(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key.replace("_", "").isalnum() or not key[0].isalpha():
        raise argparse.ArgumentTypeError(
            f"{text[:80]!r} is not KEY=VALUE with a variable name as KEY; give e.g. "
            "VLLM_CPU_OMP_THREADS_BIND=auto"
        )
    return key, value
