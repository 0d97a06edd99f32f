"""The package's layers: who may import whom, and what hosts and images receive."""

from __future__ import annotations

import argparse
import ast
import importlib
import io
import json
import os
import re
import subprocess
import sys
import tokenize
import zipfile
from pathlib import Path

import pytest
from conftest import require
from support import pythons

from zenvllm import SHIPPED_LAYERS
from zenvllm.core.errors import UserError
from zenvllm.deploy import data, shipped
from zenvllm.runtime import console

PACKAGE = data.ROOT
# Each layer may import the layers before it, never those after.
ORDER = ("core", "runtime", "deploy", "image", "bench", "cli")


def layer_of(module: str) -> str:
    """zenvllm.core.plan -> core; zenvllm.cli and zenvllm.__main__ -> cli."""
    parts = module.split(".")
    return parts[1] if len(parts) > 2 and parts[1] in ORDER else "cli"


def modules() -> dict[str, Path]:
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).with_suffix("")
        name = ".".join(("zenvllm", *rel.parts))
        found[name.removesuffix(".__init__")] = path
    return found


def imports(path: Path, known: set[str]) -> set[str]:
    """The zenvllm modules a file imports, at any depth (lazy imports count too)."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name.startswith("zenvllm")}
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("zenvllm"):
            for alias in node.names:
                sub = f"{node.module}.{alias.name}"
                out.add(sub if sub in known else node.module)
    return out - {"zenvllm"}  # the package root holds only the version and SHIPPED_LAYERS


def graph() -> dict[str, set[str]]:
    found = modules()
    return {name: imports(path, set(found)) for name, path in found.items()}


def test_each_layer_imports_only_the_layers_before_it():
    wrong = [
        f"{name} ({layer_of(name)}) imports {dep} ({layer_of(dep)})"
        for name, deps in graph().items()
        for dep in deps
        if ORDER.index(layer_of(dep)) > ORDER.index(layer_of(name))
    ]
    assert wrong == []


def test_the_import_graph_has_no_cycles():
    edges = graph()
    state: dict[str, str] = {}

    def visit(node: str, path: list[str]) -> list[str]:
        state[node] = "open"
        for dep in sorted(edges.get(node, ())):
            if state.get(dep) == "open":
                return [*path, node, dep]
            if dep not in state and (cycle := visit(dep, [*path, node])):
                return cycle
        state[node] = "done"
        return []

    cycles = [c for name in sorted(edges) if name not in state and (c := visit(name, []))]
    assert cycles == []


def test_a_violation_would_be_seen(tmp_path):
    # The checker itself can fail: a core module importing the bench is caught.
    bad = tmp_path / "bad.py"
    bad.write_text("from zenvllm.bench import layouts\n")
    deps = imports(bad, set(modules()))
    assert deps == {"zenvllm.bench.layouts"}
    assert ORDER.index(layer_of("zenvllm.bench.layouts")) > ORDER.index("core")


def test_images_and_hosts_receive_only_the_core_and_runtime(tmp_path):
    in_image = sorted(rel.removeprefix("zenvllm/") for rel in shipped.files())
    in_zipapp = zipfile.ZipFile(shipped.write_zipapp(tmp_path / "zenvllm.pyz")).namelist()
    sources = [n for n in in_zipapp if n.endswith(".py") and n != "__main__.py"]
    assert sorted(n.removeprefix("zenvllm/") for n in sources) == in_image
    assert sorted(n for n in in_zipapp if n.endswith(".pyc")) == sorted(n + "c" for n in sources)
    layers = {Path(rel).parts[0] for rel in in_image if "/" in rel}
    assert layers == set(SHIPPED_LAYERS) == {"core", "runtime"}
    assert "__init__.py" in in_image and "runtime/__main__.py" in in_image
    assert not any(rel.startswith(("image/", "bench/", "cli")) for rel in in_image)
    # Every module of those layers goes: a new one is not forgotten.
    on_disk = {
        str(p.relative_to(PACKAGE))
        for layer in SHIPPED_LAYERS
        for p in (PACKAGE / layer).glob("*.py")
    }
    assert on_disk <= set(in_image)


def test_the_zipapp_is_the_same_bytes_each_time_and_refuses_a_foreign_file(tmp_path):
    first = shipped.write_zipapp(tmp_path / "a.pyz").read_bytes()
    assert shipped.write_zipapp(tmp_path / "b.pyz").read_bytes() == first
    # Its bytecode too, in another process under another hash seed (set constants).
    for seed in ("1", "2"):
        other = tmp_path / f"seed-{seed}.pyz"
        argv = [sys.executable, "-m", "zenvllm.deploy.shipped", str(other)]
        env = {**os.environ, "PYTHONHASHSEED": seed, "PYTHONPATH": str(PACKAGE.parent)}
        subprocess.run(argv, env=env, check=True, capture_output=True)
        assert other.read_bytes() == first, seed
        other.unlink()
    assert shipped.write_zipapp(tmp_path / "a.pyz").read_bytes() == first  # its own: replaced
    theirs = tmp_path / "theirs.pyz"
    theirs.write_text("#!/bin/sh\necho an operator's tool\n")
    with pytest.raises(UserError, match="zenvllm did not write it"):
        shipped.write_zipapp(theirs)
    assert theirs.read_text() == "#!/bin/sh\necho an operator's tool\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.pyz", "b.pyz", "theirs.pyz"]


def rewritten(pyz: Path, dest: Path, change) -> Path:
    """A copy of the zipapp with change(name, data) -> data applied to every entry."""
    with zipfile.ZipFile(pyz) as src, zipfile.ZipFile(dest, "w") as out:
        for info in src.infolist():
            out.writestr(info, change(info.filename, src.read(info)))
    return dest


def imports_from(pyz: Path) -> subprocess.CompletedProcess:
    argv = [
        sys.executable,
        "-I",
        "-c",
        "import sys; sys.path.insert(0, sys.argv[1]); import zenvllm.core.plan",
        str(pyz),
    ]
    return subprocess.run(argv, capture_output=True, text=True, check=False)


def test_hosts_of_this_python_run_the_bytecode_and_others_the_source(tmp_path):
    """zipimport takes a module's .pyc before its source while the .pyc's hash is the
    source's; where the source was edited after, or the magic number is another
    Python's, it reads the source."""
    pyz = shipped.write_zipapp(tmp_path / "zenvllm.pyz")
    plan, said = "zenvllm/core/plan.py", b"raise SystemExit('%s')\n"
    with zipfile.ZipFile(pyz) as archive:
        compiled = archive.read(plan + "c")
    # Bytecode of other code, under the hash of the module's own source: it runs.
    other = shipped.bytecode({plan: said % b"ran the bytecode"})[plan]
    swapped = compiled[:16] + other[16:]
    run = imports_from(
        rewritten(pyz, tmp_path / "a.pyz", lambda n, d: swapped if n == plan + "c" else d)
    )
    assert "ran the bytecode" in run.stderr, run.stderr
    # The source edited after the build: its hash differs, the source runs.
    edited = said % b"read the source"
    run = imports_from(rewritten(pyz, tmp_path / "b.pyz", lambda n, d: edited if n == plan else d))
    assert "read the source" in run.stderr, run.stderr

    # Another Python's magic number on that other code's bytecode: the source runs.
    def other_python(n: str, d: bytes) -> bytes:
        d = swapped if n == plan + "c" else d
        return b"\0\0\r\n" + d[4:] if n.endswith(".pyc") else d

    run = imports_from(rewritten(pyz, tmp_path / "c.pyz", other_python))
    assert run.returncode == 0 and "ran the bytecode" not in run.stderr, run.stderr


def test_what_hosts_receive_runs_alone_on_the_standard_library(tmp_path):
    # The zipapp alone, and -S drops site-packages: an import of the image or bench
    # layers, or of Jinja2/PyYAML, fails here.
    zipapp = shipped.write_zipapp(tmp_path / "zenvllm.pyz")
    fixture = PACKAGE.parents[1] / "tests" / "fixtures" / "hosts" / "vm-milan-8vcpu-avx2"
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(zipapp)}

    def host_cli(*argv: str) -> subprocess.CompletedProcess:
        command = [sys.executable, "-S", "-m", "zenvllm.runtime", *argv]
        return subprocess.run(command, capture_output=True, text=True, env=env, check=False)

    plan = host_cli("plan", "--json", "--root", str(fixture), "--model-size-gib", "1")
    assert plan.returncode == 0, plan.stderr
    assert json.loads(plan.stdout)["instances"][0]["container"]["name"]
    doctor = host_cli("doctor", "--json", "--root", str(fixture))
    assert doctor.returncode == 0, doctor.stderr
    # An AVX2-only Milan: vLLM's image serves, zen and pace would be inactive.
    assert json.loads(doctor.stdout)["targets"] == {
        "vllm-openai": "ok",
        "zen": "warn",
        "pace": "warn",
    }


def test_the_hosts_oldest_python_plans_alike_and_an_older_one_is_told_the_fix(tmp_path):
    """Ubuntu 22.04's 3.10, README's oldest, runs the zipapp for real and plans what this
    Python plans; 3.9 (Debian 11's) gets exit 2 and the fix, not a traceback."""
    zipapp = shipped.write_zipapp(tmp_path / "zenvllm.pyz")
    fixture = PACKAGE.parents[1] / "tests" / "fixtures" / "hosts" / "epyc-9354-2s-smt"
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(zipapp)}

    def plan(python: Path) -> subprocess.CompletedProcess:
        argv = ["-S", "-m", "zenvllm.runtime", "plan", "--json", "--root", str(fixture)]
        argv += ["--model-size-gib", "500"]  # split over the two sockets: tensor parallel
        return subprocess.run(
            [str(python), *argv], capture_output=True, text=True, env=env, check=False
        )

    oldest, older = pythons.find("3.10"), pythons.find("3.9")
    require(oldest is not None and older is not None, "no python3.10 and python3.9 here")
    here, there = plan(Path(sys.executable)), plan(oldest)
    assert there.returncode == 0, there.stderr
    assert json.loads(there.stdout) == json.loads(here.stdout)
    assert json.loads(there.stdout)["instances"][0]["tensor_parallel_size"] == 2
    refused = plan(older)
    assert refused.returncode == 2, refused.stderr
    assert refused.stderr.startswith("zenvllm: this host's python3 is 3.9."), refused.stderr
    assert "ansible_python_interpreter" in refused.stderr and "Traceback" not in refused.stderr


def shadowed(path: Path) -> list[str]:
    """Names a file binds that are also zenvllm modules it imports (a local `results`
    list hiding the `results` module fails only when that line runs)."""
    tree = ast.parse(path.read_text())
    known = modules()
    imported = {
        alias.asname or alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("zenvllm")
        for alias in node.names
        if f"{node.module}.{alias.name}" in known
    }
    bound = []
    for node in ast.walk(tree):
        name = (
            node.id
            if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store)
            else node.arg
            if isinstance(node, ast.arg)
            else node.name
            if isinstance(node, ast.FunctionDef | ast.ClassDef)
            else None
        )
        if name in imported:
            bound.append(f"{path.name}:{node.lineno} binds {name}")
    return bound


def test_no_name_hides_an_imported_module(tmp_path):
    repo = PACKAGE.parents[1]
    files = [*PACKAGE.rglob("*.py"), *(repo / "tests").rglob("*.py")]
    assert [s for f in files for s in shadowed(f)] == []
    bad = tmp_path / "bad.py"
    bad.write_text("from zenvllm.bench import results\nresults = []\n")
    assert shadowed(bad) == ["bad.py:2 binds results"]


def test_the_cli_runs_with_its_base_dependencies_alone():
    # The bench extra (numpy, gguf, matplotlib) is imported only where a bench needs it.
    code = (
        "import sys; sys.modules.update(numpy=None, gguf=None, matplotlib=None)\n"
        "from zenvllm.cli import main\n"
        "sys.exit(main(['plan', '--json', '--model-size-gib', '1']))"
    )
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(PACKAGE.parent)}
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, check=False
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["instances"]


ENGINE_EDGE = "zenvllm.runtime.engine"
# The engines' names and the binary's one setting: spelled by the edge alone.
ENGINE_WORDS = {"docker", "podman", "ZENVLLM_DOCKER"}


def engine_commands(path: Path) -> list[int]:
    """Lines that name an engine themselves: any constant that is exactly "docker",
    "podman" or ZENVLLM_DOCKER (the binary's one setting), wherever it stands (first in
    an argument list or not, a default, a key, inside an f-string's expression)."""
    return sorted(
        node.lineno
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Constant) and node.value in ENGINE_WORDS
    )


def test_only_the_engine_edge_runs_the_engine(tmp_path):
    """Every engine command goes through runtime/engine.py's Cli, and the engine's choice
    (docker or podman, the binary, its builder) is made there: a module naming docker or
    podman itself is one more way a command would pick its engine."""
    found = {
        name: lines
        for name, path in modules().items()
        if name != ENGINE_EDGE and (lines := engine_commands(path))
    }
    assert found == {}, found
    stray = tmp_path / "stray.py"
    stray.write_text(
        "import os, subprocess\n"
        'subprocess.run(["docker", "ps"])\n'  # the binary first
        'subprocess.run([os.environ["BIN"], "podman"])\n'  # not first
        'subprocess.run(("sudo", "docker", "ps"))\n'
        'KIND = {"docker": 1}.get(os.environ.get("ZENVLLM_DOCKER", ""))\n'
        "def f(x, kind='podman'): return f\"{'docker' if x else kind}\"\n"
        "ok = ['dockerd', 'docker.io', 'podman-docker', 'run docker']\n"  # other words
    )
    assert engine_commands(stray) == [2, 3, 4, 5, 5, 6, 6]  # the rule sees each


# Ansible's own words, and the names of the roles' variables (zenvllm_*): core plans
# from a request and never says how a role spells, defaults or templates an option
# (deploy/role_instances.py does).
ANSIBLE_WORDS = ("{{", "{%", "groups[", "hostvars", "inventory_hostname", "ansible_", "role_path")
ROLE_VARIABLE = re.compile(r"\bzenvllm_\w+")
# Words of that shape that are not a variable: the model manifest's and the directory
# marker's format keys; and one refusal that tells the operator which variable to change.
NOT_A_VARIABLE = {
    "zenvllm.core.modelfiles": frozenset(
        {"zenvllm_model_manifest", "zenvllm_model", "zenvllm_model_dir"}
    )
}


def ansible_words(path: Path, allowed: frozenset[str] = frozenset()) -> list[tuple[int, str]]:
    """(line, word) for each of Ansible's words or a zenvllm_* name in a file's strings
    (docstrings and f-strings' text included, as the program holds them) and comments;
    code (a list named groups) is not text."""
    source = path.read_text()
    texts = [
        (node.lineno, node.value)
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Constant) and isinstance(node.value, str)
    ]
    texts += [
        (token.start[0], token.string)
        for token in tokenize.generate_tokens(io.StringIO(source).readline)
        if token.type == tokenize.COMMENT
    ]
    found = set()
    for line, text in texts:
        found |= {(line, word) for word in ANSIBLE_WORDS if word in text}
        found |= {(line, word) for word in ROLE_VARIABLE.findall(text) if word not in allowed}
    return sorted(found)


def test_core_names_no_ansible_variable(tmp_path):
    """The request is the planner's; the instances role's names, defaults and Jinja are
    the image layer's (deploy/role_instances.py)."""
    found = {
        name: words
        for name, path in modules().items()
        if layer_of(name) == "core"
        and (words := ansible_words(path, NOT_A_VARIABLE.get(name, frozenset())))
    }
    assert found == {}, found
    stray = tmp_path / "stray.py"
    stray.write_text(
        "groups = [1, 2]\nfirst = groups[:1]\n"  # code, not text
        'PATTERN = f"^{groups}(\\\\d{{1,4}})$"\n'  # an f-string's {{ is one brace
        "HOSTS = \"{{ groups['zenvllm'] }}\"  # zenvllm_instances_hosts\n"
    )
    assert ansible_words(stray) == [(4, "groups["), (4, "zenvllm_instances_hosts"), (4, "{{")]


def command_functions(parser: argparse.ArgumentParser) -> set[str]:
    """module.name of every function a parser or its subparsers run (set_defaults(func=))."""
    found = {f"{f.__module__}.{f.__qualname__}"} if (f := parser.get_default("func")) else set()
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                found |= command_functions(sub)
    return found


def test_only_command_entry_points_take_a_namespace():
    """argparse's Namespace stops at each command's entry point: every function that takes
    one is a verb's `func`; the rest take typed arguments."""
    loaded = [importlib.import_module(n) for n in modules() if not n.endswith("__main__")]
    verbs = [module for module in loaded if hasattr(module, "register")]
    entries = command_functions(console.build_parser(tuple(verbs), "zenvllm"))
    assert len(entries) >= 15  # every verb of both command lines
    takers = set()
    for name, path in modules().items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                annotations = [a.annotation for a in node.args.args + node.args.kwonlyargs]
                if any(a is not None and "Namespace" in ast.unparse(a) for a in annotations):
                    takers.add(f"{name}.{node.name}")
    assert takers - entries == set()
