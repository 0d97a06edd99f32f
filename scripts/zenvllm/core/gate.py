"""The one gate for bytes from outside: files a user names, sysfs/procfs/cgroup under
`--root`, JSON in the environment or on the command line, calibration files, template
overrides, model configs and safetensors headers.

Every reader goes through here (tests/unit/test_gate.py scans the package's AST for
any other read), so each promise is kept in one place:

* only regular files are opened: a FIFO, a device, a socket or a directory is refused
  by what it is, without blocking on it (stat first, then O_NONBLOCK and fstat);
* at most a cap of bytes is read, per kind of file: /dev/zero or a sparse 2 GB file
  where a small one belongs costs the cap, not the file;
* text is UTF-8, and a bad byte is named by its file and offset;
* JSON nests at most MAX_DEPTH deep, has finite numbers of at most MAX_DIGITS digits;
* fields are checked by type and range, naming their path (`config.json:
  text_config.num_hidden_layers`), and zero is a value like any other.

Each refusal is an InputError (the CLI exits 2) naming the value, the limit and the fix.
hostengine.py alone keeps its own few guarded reads: it is shipped to hosts alone.
Standard library only.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, BinaryIO, Literal, overload

from zenvllm.core.errors import UserError

KIB, MIB = 1024, 1024 * 1024
# Caps per kind of file: far above any real one, far below what hurts a host.
SYSFS = 64 * KIB  # one sysfs or cgroup attribute
PROCFS = 8 * MIB  # /proc/cpuinfo of a 1,024-CPU host is about 1.5 MiB
DOCUMENT = 64 * MIB  # config.json, a shard index, tokenizer.json (Gemma's: 34 MB)
SMALL = 1 * MIB  # calibration files, template overrides, metrics files, env JSON
# safetensors' own reader refuses longer headers (MAX_HEADER_SIZE in the safetensors crate).
SAFETENSORS_HEADER = 100_000_000
MAX_DEPTH = 64  # real configs nest 4 deep; JSON's parser recurses, this stays far below
MAX_DIGITS = 40  # 2**128 has 39 digits; a size, count or offset never needs more


class InputError(UserError):
    """Bytes from outside that zenvllm will not read or cannot use (exit 2)."""


def resolved(path: Path, where: str, fix: str) -> Path:
    """The absolute path with its links followed; a loop or an unreadable link is refused
    by name (Path.resolve raises RuntimeError or OSError, not a message for a user)."""
    try:
        return Path(path).resolve(strict=False)
    except (RuntimeError, OSError) as err:
        raise InputError(f"{where}: its links cannot be followed ({err}); {fix}") from None


def describe(mode: int) -> str:
    """What a non-regular file is, in words an operator knows."""
    for test, name in (
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISFIFO, "a FIFO (named pipe)"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
    ):
        if test(mode):
            return name
    return "not a regular file"


@contextmanager
def regular(path: Path, fix: str) -> Iterator[tuple[BinaryIO, int]]:
    """The open file and its size; a non-regular file is refused, never opened blocking."""
    mode = os.stat(path).st_mode  # FileNotFoundError and friends are the caller's
    if not stat.S_ISREG(mode):
        raise InputError(f"{path} is {describe(mode)}, not a regular file; {fix}")
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except PermissionError:  # a file another user wrote 0600: say so, not a traceback
        raise InputError(
            f"{path} ({stat.filemode(mode)}) cannot be read by user {os.getuid()}; "
            f"make it readable (chmod a+r); {fix}"
        ) from None
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):  # replaced between the stat and the open
            raise InputError(f"{path} is {describe(st.st_mode)}, not a regular file; {fix}")
        yield f, st.st_size


@overload
def read_bytes(path: Path, cap: int, fix: str, optional: Literal[False] = False) -> bytes: ...
@overload
def read_bytes(path: Path, cap: int, fix: str, optional: bool) -> bytes | None: ...
def read_bytes(path: Path, cap: int, fix: str, optional: bool = False) -> bytes | None:
    """At most `cap` bytes of a regular file; more is refused. `optional`: a missing or
    unreadable file is None (sysfs attributes vary by kernel and VM)."""
    try:
        with regular(path, fix) as (f, _):
            data = f.read(cap + 1)
    except OSError as err:  # the gate's own refusals are not OSErrors: they pass on
        if optional:
            return None
        raise InputError(f"{path}: {err.strerror or err}; {fix}") from None
    if len(data) > cap:
        raise InputError(f"{path} holds more than {cap:,} bytes, the limit for this file; {fix}")
    return data


def tail(path: Path, nbytes: int = 256 * KIB) -> str:
    """The end of a log, for showing: bounded whatever its size, undecodable bytes
    replaced; "" when it is missing or not a regular file."""
    try:
        with regular(path, "") as (f, size):
            f.seek(max(0, size - nbytes))
            return f.read(nbytes).decode("utf-8", errors="replace")
    except (InputError, OSError):
        return ""


def digest(path: Path) -> str:
    """SHA-256 of a regular file, read in chunks (any size, bounded memory)."""
    sha = hashlib.sha256()
    with regular(path, "zenvllm hashes only the regular files it wrote") as (f, _):
        while chunk := f.read(MIB):
            sha.update(chunk)
    return sha.hexdigest()


def decode(data: bytes, source: str, fix: str) -> str:
    """UTF-8 text, or a refusal naming the first bad byte's offset."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise InputError(
            f"{source}: byte {err.start:,} (0x{data[err.start]:02x}) is not UTF-8; {fix}"
        ) from None


@overload
def read_text(path: Path, cap: int, fix: str, optional: Literal[False] = False) -> str: ...
@overload
def read_text(path: Path, cap: int, fix: str, optional: bool) -> str | None: ...
def read_text(path: Path, cap: int, fix: str, optional: bool = False) -> str | None:
    data = read_bytes(path, cap, fix, optional)
    return None if data is None else decode(data, str(path), fix)


def _number(text: str, source: str) -> int | float:
    digits = text.lstrip("-").partition(".")[0].partition("e")[0].partition("E")[0]
    if len(digits) > MAX_DIGITS:
        raise InputError(
            f"{source}: a number of {len(digits):,} digits (the limit is {MAX_DIGITS})"
        )
    value = float(text) if any(c in text for c in ".eE") else int(text)
    if not math.isfinite(value):
        raise InputError(f"{source}: the number {text[:40]} is beyond a float's range")
    return value


def _depth(value: Any) -> int:
    """How deep containers nest in `value` (iterative: no recursion of its own)."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, level = stack.pop()
        if isinstance(item, (dict, list)):
            deepest = max(deepest, level)
            children = item.values() if isinstance(item, dict) else item
            stack.extend((child, level + 1) for child in children)
    return deepest


def parse_json(text: str, source: str, fix: str) -> Any:
    """JSON with finite numbers of bounded length, nested at most MAX_DEPTH deep."""

    def constant(name: str) -> Any:
        raise InputError(f"{source}: {name} is not a finite number; {fix}")

    def number(token: str) -> int | float:
        try:
            return _number(token, source)
        except InputError as err:
            raise InputError(f"{err}; {fix}") from None

    too_deep = InputError(f"{source}: JSON nested deeper than {MAX_DEPTH} levels; {fix}")
    try:
        value = json.loads(text, parse_constant=constant, parse_float=number, parse_int=number)
    except json.JSONDecodeError as err:
        raise InputError(
            f"{source}: not valid JSON at line {err.lineno} column {err.colno} ({err.msg}); {fix}"
        ) from None
    except RecursionError:  # the parser recursed past Python's limit
        raise too_deep from None
    if _depth(value) > MAX_DEPTH:
        raise too_deep
    return value


def read_json(path: Path, cap: int, fix: str, optional: bool = False) -> Any:
    text = read_text(path, cap, fix, optional)
    return None if text is None else parse_json(text, str(path), fix)


def read_stream(stream: BinaryIO, cap: int, source: str, fix: str) -> str:
    """At most `cap` bytes of a pipe (a manifest on stdin), as UTF-8 text."""
    data = stream.read(cap + 1)
    if len(data) > cap:
        raise InputError(f"{source} holds more than {cap:,} bytes, the limit for it; {fix}")
    return decode(data, source, fix)


def env_json(name: str, fix: str) -> Any:
    """JSON from the environment variable `name`; None when unset or empty."""
    text = os.environ.get(name) or ""
    if not text:
        return None
    if len(text) > SMALL:
        raise InputError(f"${name} holds {len(text):,} characters, over {SMALL:,}; {fix}")
    return parse_json(text, f"${name}", fix)


# ---------------------------------------------------------------- typed fields


def shown(value: Any) -> str:
    """A value as JSON would write it, cut short."""
    try:
        return json.dumps(value)[:60]
    except (TypeError, ValueError):
        return repr(value)[:60]


def obj(value: Any, where: str, fix: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise InputError(f"{where} is {shown(value)}, not a JSON object; {fix}")
    return value


def items(value: Any, where: str, fix: str) -> list[Any]:
    if not isinstance(value, list):
        raise InputError(f"{where} is {shown(value)}, not a list; {fix}")
    return value


def text(value: Any, where: str, fix: str) -> str:
    if not isinstance(value, str):
        raise InputError(f"{where} is {shown(value)}, not a string; {fix}")
    return value


def whole(value: Any, where: str, low: int, high: int, fix: str) -> int:
    """An integer in [low, high] (a JSON bool is not one)."""
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise InputError(
            f"{where} is {shown(value)}, not a whole number from {low:,} to {high:,}; {fix}"
        )
    return value


def number(value: Any, where: str, low: float, high: float, fix: str) -> float:
    """A finite number in (low, high]: a bandwidth, a time, a fraction."""
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    if not ok or not math.isfinite(value) or not low < value <= high:
        raise InputError(f"{where} is {shown(value)}, not a number in ({low:g}, {high:g}]; {fix}")
    return float(value)


def fields(text: str, known: tuple[str, ...], fix: str) -> dict[str, str]:
    """KEY=VALUE,... (a flavor, a load) with each key one of `known`, once."""
    given: dict[str, str] = {}
    for part in text.split(","):
        key, eq, value = (p.strip() for p in part.partition("="))
        if key not in known or not eq:
            names = ", ".join(f"{k}=" for k in known)
            raise InputError(f"{part[:40]!r} is not one of {names}; {fix}")
        if key in given:
            raise InputError(f"{text[:80]!r} gives {key} twice; {fix}")
        given[key] = value
    return given


def number_text(raw: str, where: str, low: float, high: float, fix: str) -> float:
    """A finite number in (low, high] written as text (a CLI field, a flag)."""
    value = raw.strip()
    try:
        parsed = float(value) if len(value) <= MAX_DIGITS else math.nan
    except ValueError:
        parsed = math.nan
    if not math.isfinite(parsed) or not low < parsed <= high:
        top = f"{high:,.0f}" if float(high).is_integer() else f"{high:g}"
        raise InputError(f"{where} is {value[:40]!r}, not a number in ({low:g}, {top}]; {fix}")
    return parsed


def whole_text(raw: str, where: str, low: int, high: int, fix: str) -> int:
    """An integer written as text (sysfs, a CLI field), checked before it is used."""
    value = raw.strip()
    digits = value.lstrip("-")
    if not digits.isdigit() or not digits.isascii() or len(digits) > MAX_DIGITS:
        raise InputError(f"{where}: {value[:40]!r} is not a whole number; {fix}")
    return whole(int(value), where, low, high, fix)
