"""One option of a request: its Spec (type, limits, one line of help), its kind, and
the check of a value of each kind through the gate. core/request.py declares the
request's options with `option`; deploy/role_vars.py every role's own with Spec.
Pure; standard library only."""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from zenvllm.core import gate
from zenvllm.core.arguments import NAME_RULE, is_ip
from zenvllm.core.errors import UserError

FIX = "see `zenvllm plan --help` or docs/reference/variables.md"


@dataclass(frozen=True)
class Spec:
    """How one option is typed, limited, documented and rendered."""

    help: str  # one line, for --help and the reference
    section: str  # where the reference and the defaults file group it
    flag: str = ""  # `zenvllm plan`'s flag ("" = none: set it in --request)
    exclusive: str = ""  # flags of one group exclude each other on the command line
    choices: tuple[str, ...] = ()
    low: float | None = None  # inclusive limits of a number
    high: float | None = None
    above: bool = False  # `low` itself is excluded
    example: str = ""  # shown in a refusal
    pattern: re.Pattern[str] | None = None  # what a string must match
    path: bool = False  # an absolute path, or "" for none
    ip: bool = False  # an IP address, or "" for none
    auto: bool = False  # "auto" or a whole number of `low` or more
    # A structured string's parser ("" is none): its UserError names the value and the fix.
    parse: Callable[[str], Any] | None = None


def option(default: Any, help: str, section: str, **spec: Any) -> Any:
    """A request field: its default (a dict default is a fresh {}) and its Spec."""
    meta = {"spec": Spec(help=help, section=section, **spec)}
    if isinstance(default, dict):
        return field(default_factory=dict, metadata=meta)
    return field(default=default, metadata=meta)


def kind_of(spec: Spec, default: Any) -> str:
    """The kind of an option with this spec and default (a role's own options too)."""
    if spec.auto:
        return "count"
    return {bool: "bool", int: "int", float: "float", str: "str", tuple: "list"}.get(
        type(default), "dict"
    )


def _count(spec: Spec, value: Any, where: str, fix: str) -> Any:
    if value == "auto":
        return value
    if isinstance(value, str) and value.isdigit() and len(value) <= gate.MAX_DIGITS:
        value = int(value)  # -e key=value gives a string
    return gate.whole(value, where, 1, 1 << 20, f"give auto or {spec.example}")


def _bool(spec: Spec, value: Any, where: str, fix: str) -> bool:
    if not isinstance(value, bool):
        raise gate.InputError(f"{where} is {gate.shown(value)}, not true or false; {FIX}")
    return value


def _int(spec: Spec, value: Any, where: str, fix: str) -> int:
    return gate.whole(value, where, int(spec.low or 0), int(spec.high or 1 << 31), fix)


def _float(spec: Spec, value: Any, where: str, fix: str) -> float:
    low, high = float(spec.low or 0), float(spec.high or 1 << 20)
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    if not (number and math.isfinite(value) and low <= value <= high) or (
        spec.above and value == low
    ):
        bounds = f"{'(' if spec.above else '['}{low:,g}, {high:,.0f}]"
        raise gate.InputError(f"{where} is {gate.shown(value)}, not a number in {bounds}; {fix}")
    return float(value)


def _list(spec: Spec, value: Any, where: str, fix: str) -> tuple[str, ...]:
    items = gate.items(value, where, FIX)
    return tuple(gate.text(v, f"{where}[{i}]", FIX) for i, v in enumerate(items))


def _dict(spec: Spec, value: Any, where: str, fix: str) -> dict[str, str]:
    given = gate.obj(value, where, FIX)
    return {k: gate.text(v, f"{where}.{k[:40]}", FIX) for k, v in given.items()}


def _str(spec: Spec, value: Any, where: str, fix: str) -> str:
    text = gate.text(value, where, FIX)
    if spec.choices and text not in spec.choices:
        raise gate.InputError(
            f"{where} is {gate.shown(text)}, not one of {', '.join(spec.choices)}; {FIX}"
        )
    if spec.pattern and not spec.pattern.fullmatch(text):
        raise gate.InputError(
            f"{where} is {gate.shown(text)}, not {NAME_RULE}; give e.g. {spec.example}"
        )
    if spec.path and text and (not text.startswith("/") or any(c in text for c in ":,\n")):
        raise gate.InputError(
            f"{where} is {gate.shown(text)}, not an absolute path without ':' or ','; give "
            f'one, or "" for none; {FIX}'
        )
    if spec.ip and text and not is_ip(text):
        raise gate.InputError(
            f"{where} is {gate.shown(text)}, not an IP address; give e.g. {spec.example}, or "
            f'"" for none; {FIX}'
        )
    if spec.parse and text:
        try:
            spec.parse(text)
        except UserError as err:
            raise gate.InputError(f"{where}: {err}") from None
    return text


VALIDATORS = {"count": _count, "bool": _bool, "int": _int, "float": _float, "list": _list}
VALIDATORS |= {"dict": _dict, "str": _str}
