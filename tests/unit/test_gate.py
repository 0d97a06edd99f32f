"""The gate (zenvllm.core.gate): what it refuses, that it never blocks or reads past
its cap, and that no other module of the package reads an outside file (an AST scan)."""

from __future__ import annotations

import ast
import json
import re
import signal
import tracemalloc
from pathlib import Path

import pytest
from conftest import require
from support.hostile import special_file

from zenvllm.core import gate

PACKAGE = Path(__file__).resolve().parents[2] / "scripts" / "zenvllm"


@pytest.fixture(autouse=True)
def no_hang():
    """A read that blocks (a FIFO opened without O_NONBLOCK) fails the test in 10 s."""

    def hung(signum, frame):
        raise AssertionError("blocked for 10 s")

    previous = signal.signal(signal.SIGALRM, hung)
    signal.alarm(10)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, previous)


@pytest.mark.parametrize(
    ("kind", "named"),
    [
        ("fifo", r"a FIFO \(named pipe\)"),
        ("directory", "a directory"),
        ("device", "a character device"),
        ("socket", "a socket"),
    ],
)
def test_only_regular_files_are_opened_and_nothing_blocks(tmp_path, kind, named):
    path = special_file(tmp_path / kind, kind)
    for optional in (False, True):  # a missing sysfs file is None; a FIFO never is
        with pytest.raises(gate.InputError, match=f"{path} is {named}, not a regular file; fix"):
            gate.read_bytes(path, 100, "fix", optional=optional)


def test_a_huge_sparse_file_costs_the_cap_not_its_size(tmp_path):
    path = tmp_path / "sparse"
    with path.open("wb") as f:
        f.truncate(3 << 30)  # 3 GiB of holes
    tracemalloc.start()
    with pytest.raises(gate.InputError, match=r"holds more than 1,048,576 bytes, the limit"):
        gate.read_bytes(path, gate.SMALL, "fix")
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 4 * gate.SMALL


def test_missing_files_are_none_only_when_optional(tmp_path):
    assert gate.read_text(tmp_path / "no", 10, "fix", optional=True) is None
    with pytest.raises(gate.InputError, match=r"/no: No such file or directory; fix"):
        gate.read_text(tmp_path / "no", 10, "fix")


def test_a_bad_byte_is_named_by_file_and_offset(tmp_path):
    path = tmp_path / "online"
    path.write_bytes(b"0-3\xff\n")
    with pytest.raises(gate.InputError, match=r"online: byte 3 \(0xff\) is not UTF-8; fix"):
        gate.read_text(path, 100, "fix")


@pytest.mark.parametrize("depth", [gate.MAX_DEPTH + 1, 200_000])
def test_json_nested_too_deep_is_refused_not_a_recursion_error(depth):
    with pytest.raises(gate.InputError, match=f"nested deeper than {gate.MAX_DEPTH} levels"):
        gate.parse_json("[" * depth + "]" * depth, "x.json", "fix")


def test_json_as_deep_as_allowed_parses():
    depth = gate.MAX_DEPTH
    assert gate.parse_json("[" * depth + "]" * depth, "x.json", "fix") == json.loads(
        "[" * depth + "]" * depth
    )


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ('{"a": 1e400}', "the number 1e400 is beyond a float's range"),
        ('{"a": -1e400}', "beyond a float's range"),
        ('{"a": NaN}', "NaN is not a finite number"),
        ('{"a": Infinity}', "Infinity is not a finite number"),
        ('{"a": ' + "9" * 5000 + "}", "a number of 5,000 digits (the limit is 40)"),
        ('{"a": 1.' + "5" * 5000 + "}", None),  # a long fraction is a float like any other
        ("{", "not valid JSON at line 1 column 2"),
    ],
    ids=["1e400", "-1e400", "NaN", "Infinity", "5000-digits", "long-fraction", "truncated"],
)
def test_json_numbers_are_finite_and_bounded(text, says):
    if says is None:
        assert gate.parse_json(text, "x.json", "fix")["a"] == pytest.approx(14 / 9)
        return
    with pytest.raises(gate.InputError, match=f"x.json: .*{re.escape(says)}.*fix"):
        gate.parse_json(text, "x.json", "fix")


def test_typed_fields_name_their_path_and_limit():
    with pytest.raises(gate.InputError, match=r"^cfg: a.b is \"32\", not a whole number from 1"):
        gate.whole("32", "cfg: a.b", 1, 10, "fix")
    with pytest.raises(gate.InputError, match=r"is true, not a whole number"):
        gate.whole(True, "w", 0, 10, "fix")
    assert gate.whole(0, "w", 0, 10, "fix") == 0  # zero is a value
    with pytest.raises(gate.InputError, match=r"is 5, not a JSON object"):
        gate.obj(5, "w", "fix")
    with pytest.raises(gate.InputError, match=r"is \{\}, not a list"):
        gate.items({}, "w", "fix")
    with pytest.raises(gate.InputError, match=r"w is -1e-300, not a number in \(0, 10\]"):
        gate.number(-1e-300, "w", 0, 10, "fix")
    with pytest.raises(gate.InputError, match=r"'9{10}.*' is not a whole number"):
        gate.whole_text("9" * 50, "w", 0, 10, "fix")


def test_env_json_is_bounded(monkeypatch):
    monkeypatch.setenv("ZENVLLM_TEST_JSON", "[" * 100 + "]" * 100)
    with pytest.raises(gate.InputError, match=r"\$ZENVLLM_TEST_JSON: JSON nested deeper"):
        gate.env_json("ZENVLLM_TEST_JSON", "fix")
    monkeypatch.setenv("ZENVLLM_TEST_JSON", " " * (gate.SMALL + 1))
    with pytest.raises(gate.InputError, match=r"holds 1,048,577 characters"):
        gate.env_json("ZENVLLM_TEST_JSON", "fix")
    monkeypatch.delenv("ZENVLLM_TEST_JSON")
    assert gate.env_json("ZENVLLM_TEST_JSON", "fix") is None


def test_a_log_tail_is_bounded_and_never_blocks(tmp_path):
    log = tmp_path / "log"
    log.write_bytes(b"x" * 1000 + b"\xffend\n")
    assert gate.tail(log, 5) == "\ufffdend\n"
    assert gate.tail(special_file(tmp_path / "fifo", "fifo")) == ""


# ---------------------------------------------------------------- the AST scan

# Reads that do not parse outside bytes, each with why it may bypass the gate.
ALLOWED = {
    ("image/baseimage.py", "open"): "streams zenvllm's own base tarball to the engine, unread",
    ("bench/to_gguf.py", "memmap"): "maps tensor data after the gate checked the header",
    ("image/render.py", "FileSystemLoader"): "zenvllm's own templates, in the package",
    ("reference.py", "safe_load"): "reads back the YAML it just wrote, to check a folded value",
    ("deploy/shipped.py", "loads"): "the bytecode its own child compiled from the gated sources",
}
# Shipped to hosts alone (the host role's ansible.builtin.script): it guards its own reads.
STANDALONE = {"core/gate.py", "runtime/hostengine.py"}
READERS = {"read_text", "read_bytes", "load", "loads", "safe_load", "memmap", "FileSystemLoader"}


def writes(call: ast.Call, position: int) -> bool:
    """A constant mode (or os.open flags) that writes, not reads."""
    mode = call.args[position] if len(call.args) > position else None
    mode = next((k.value for k in call.keywords if k.arg in ("mode", "flags")), mode)
    if isinstance(mode, ast.Constant) and isinstance(mode.value, str):
        return any(c in mode.value for c in "wax")
    names = {n.attr for n in ast.walk(mode) if isinstance(n, ast.Attribute)} if mode else set()
    return bool(names & {"O_WRONLY", "O_RDWR", "O_CREAT"})


def reads(tree: ast.AST) -> list[tuple[str, int]]:
    """Every call in the tree that reads a file (or parses bytes) outside the gate."""
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
        base = getattr(func, "value", None)
        owner = base.id if isinstance(base, ast.Name) else ""
        argument = node.args[0] if node.args else None
        gated = (
            isinstance(argument, ast.Call)
            and isinstance(argument.func, ast.Attribute)
            and getattr(argument.func.value, "id", "") == "gate"
        )
        if (name == "open" and owner == "os") or name == "fdopen":
            bad = not writes(node, 1)
        elif name == "open":
            bad = not writes(node, 0 if isinstance(func, ast.Attribute) else 1)
        elif name in READERS and owner != "gate":
            bad = not gated  # e.g. yaml.safe_load(gate.read_text(...))
        else:
            bad = False
        if bad:
            found.append((name, node.lineno))
    return found


def test_no_module_but_the_gate_reads_an_outside_file():
    offenders = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = str(path.relative_to(PACKAGE))
        if rel in STANDALONE:
            continue
        for name, line in reads(ast.parse(path.read_text(), str(path))):
            if (rel, name) not in ALLOWED:
                offenders.append(f"{rel}:{line} {name}()")
    assert offenders == [], "read these through zenvllm.core.gate"


def test_the_scan_finds_the_reads_it_forbids():
    source = """
import json, os, yaml
json.loads(text)
Path(p).read_text()
open(p)
open(p, "w")
p.open("rb")
p.open("w")
os.open(p, os.O_RDONLY)
os.open(p, os.O_WRONLY | os.O_CREAT)
yaml.safe_load(gate.read_text(p, 1, ""))
gate.read_text(p, 1, "")
"""
    assert [n for n, _ in reads(ast.parse(source))] == [
        "loads",
        "read_text",
        "open",
        "open",
        "open",
    ]


def test_a_file_the_reader_may_not_read_is_refused_with_the_fix():
    """A weights file another user wrote 0600 (torch's save does): the launcher, running
    as vLLM's user, reads its header through gate.regular (core/model.py) and says
    which file, its mode and the fix, not a traceback. Read in a
    child that drops to another user, since root reads any file."""
    import os
    import shutil
    import subprocess
    import sys
    import tempfile

    require(os.geteuid() == 0, "needs root to read as another user")
    # Where the other user may look (pytest's own temporary directories are root's 0700).
    where = Path(tempfile.mkdtemp())
    where.chmod(0o755)
    weights = where / "model.safetensors"
    weights.write_bytes(b"\0" * 16)
    weights.chmod(0o600)
    reader = (
        "import os, sys; from pathlib import Path; from zenvllm.core import gate\n"
        "os.setgid(65534); os.setuid(65534)\n"
        "try:\n"
        "    with gate.regular(Path(sys.argv[1]), 'the fix'):\n"
        "        pass\n"
        "except gate.InputError as err:\n"
        "    print(err)\n"
    )
    try:
        said = subprocess.run(
            [sys.executable, "-c", reader, str(weights)], capture_output=True, text=True, check=True
        ).stdout
    finally:
        shutil.rmtree(where)
    assert f"{weights} (-rw-------) cannot be read by user 65534" in said, said
    assert "chmod a+r" in said and "the fix" in said
