"""Every engine command of the Ansible collection runs through one variable: a role's
`<role>_docker_bin` (zenvllm_image_controller_docker_bin on the controller), each
following the play-wide `zenvllm_docker_bin`. A task or template that spells `docker`
or `podman` itself would run an engine the operator did not choose, beside the one the
others run (the Python side's rule is tests/unit/test_layers.py's
test_only_the_engine_edge_runs_the_engine).

Scanned: every role's tasks, handlers and vars, the playbooks, and every template.
What counts as an engine run: a YAML list whose first item is the engine (an argv);
a quoted engine name in a Jinja expression (`['docker'] + ...`, `{% set d = 'docker' %}`);
a command line (`cmd:`, a free-form command or shell task, a template's line) with the
engine where a command starts (its start, after `;`, `&&`, `|`, `$(`, or after `exec`,
`while`, `if`, `!`, `sudo`, `env`, ... and a systemd unit's `ExecStart=`); and the
engine modules of community.docker and containers.podman. Words in comments, names,
messages, paths (/etc/docker/certs.d), units (docker.service) and packages (docker.io)
are not runs."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
COLLECTION = REPO / "ansible"
ENGINES = ("docker", "podman")
ENGINE_COLLECTIONS = ("community.docker.", "containers.podman.")
ENGINE_MODULES = {  # their short names, before collections
    f"{engine}_{what}" for engine in ENGINES for what in ("container", "image", "login", "compose")
}
# Modules whose free-form argument or `cmd` is a command line.
COMMAND_MODULES = {
    f"{prefix}{name}"
    for prefix in ("", "ansible.builtin.", "ansible.legacy.")
    for name in ("command", "shell", "raw", "script")
}
COMMAND_KEYS = COMMAND_MODULES | {"cmd", "_raw_params", "argv"}  # argv given as one string

_ENGINE = rf"(?:[^\s'\"=]*/)?(?:{'|'.join(ENGINES)})"
# Where a command starts on a shell or unit line, then the engine as that command. Not
# after "(" or a backtick, which prose has too ("(`docker logs x`)"): "$(" is the shell's.
_START = (
    r"(?:^|[;&|]|\$\(|\bExec\w*=[-@:+!]*"
    r"|\b(?:exec|then|do|else|while|until|if|time|nohup|sudo|command|xargs|env"
    r"|timeout[ \t]+\S+)[ \t])"
)
# Within one line: the start, a `!`, variables set for the command (NAME=value), the engine.
COMMAND_LINE = re.compile(
    rf"{_START}[ \t]*(?:![ \t]*)?(?:[A-Za-z_]\w*=[^\s{{]*[ \t]+)*{_ENGINE}(?=\s|$)", re.M
)
JINJA = re.compile(r"\{\{.*?\}\}|\{%.*?%\}", re.S)
QUOTED_ENGINE = re.compile(rf"(['\"]){_ENGINE}\1")
JINJA_COMMENT = re.compile(r"\{#.*?#\}", re.S)


def is_engine(word: object) -> bool:
    return isinstance(word, str) and word.strip().rsplit("/", 1)[-1] in ENGINES


class _AnyTags(yaml.SafeLoader):
    """Ansible's YAML, with its tags (!unsafe, !vault) read as plain values."""


_AnyTags.add_multi_constructor(
    "!",
    lambda loader, _, node: (
        loader.construct_scalar(node)
        if isinstance(node, yaml.ScalarNode)
        else loader.construct_sequence(node)
        if isinstance(node, yaml.SequenceNode)
        else loader.construct_mapping(node)
    ),
)


def jinja_runs(text: str) -> list[str]:
    """A quoted engine name inside a Jinja expression: an argv in the making."""
    found = (QUOTED_ENGINE.search(block) for block in JINJA.findall(text))
    return [m.group(0) for m in found if m is not None]


def command_runs(text: str) -> list[str]:
    """Where a command line starts the engine itself."""
    return [m.group(0).strip() for m in COMMAND_LINE.finditer(JINJA_COMMENT.sub("", text))]


def yaml_runs(node: Any, where: str = "") -> Iterator[str]:
    """Each engine run in a YAML document (a task file, vars, a playbook)."""
    if isinstance(node, list):
        if node and is_engine(node[0]):
            yield f"{where}: argv {node[:3]}"
        for item in node:
            yield from yaml_runs(item, where)
    elif isinstance(node, dict):
        for key, value in node.items():
            here = f"{where}.{key}" if where else str(key)
            key = str(key)
            if key.startswith(ENGINE_COLLECTIONS) or key in ENGINE_MODULES:
                yield f"{here}: engine module"
            if isinstance(value, str) and key in COMMAND_KEYS:
                yield from (f"{here}: {run}" for run in command_runs(value))
            yield from yaml_runs(value, here)
    elif isinstance(node, str):
        yield from (f"{where}: Jinja {run}" for run in jinja_runs(node))


def template_runs(text: str) -> list[str]:
    """A template's engine runs: its lines, comments (#, {# #}) left out, and its Jinja."""
    text = JINJA_COMMENT.sub("", text)
    lines = "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#"))
    return command_runs(lines) + jinja_runs(lines)


def scanned() -> dict[str, Path]:
    roles = COLLECTION / "roles"
    yml = [
        *roles.glob("*/tasks/**/*.yml"),
        *roles.glob("*/handlers/**/*.yml"),
        *roles.glob("*/vars/**/*.yml"),
        *(COLLECTION / "playbooks").glob("**/*.yml"),
    ]
    templates = [*roles.glob("*/templates/**/*.j2")]
    return {str(p.relative_to(COLLECTION)): p for p in sorted(yml + templates)}


def engine_runs(path: Path) -> list[str]:
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".j2":
        return template_runs(text)
    return list(yaml_runs(yaml.load(text, Loader=_AnyTags)))


def test_the_scan_covers_the_roles_tasks_and_templates():
    names = scanned()
    assert "roles/zenvllm_instances/templates/instance.service.j2" in names
    assert "roles/zenvllm_image/tasks/source_auto.yml" in names
    assert "roles/zenvllm_host/tasks/engine.yml" in names
    assert len(names) > 50


def test_every_engine_command_of_the_roles_runs_through_the_variable():
    """Each role runs the engine as its <role>_docker_bin says (zenvllm_docker_bin,
    set once for the play), never as a literal docker or podman."""
    found = {name: runs for name, path in scanned().items() if (runs := engine_runs(path))}
    assert found == {}, "engine runs that do not go through <role>_docker_bin:\n" + "\n".join(
        f"  {name}: {run}" for name, runs in found.items() for run in runs
    )


@pytest.mark.parametrize(
    "task",
    [
        "- ansible.builtin.command:\n    argv: [docker, ps]\n",
        "- ansible.builtin.command:\n    argv:\n      - /usr/bin/podman\n      - ps\n",
        "- ansible.builtin.command:\n    argv: \"{{ ['docker'] + extra }}\"\n",
        '- ansible.builtin.command:\n    argv: \'{{ ["podman", "rm"] }}\'\n',
        "- ansible.builtin.command: docker ps --all\n",
        "- ansible.builtin.shell:\n    cmd: >-\n      docker save --output x.tar img && mv x\n",
        "- ansible.builtin.shell:\n    cmd: test -f x || docker load --input x\n",
        "- ansible.builtin.shell: set -e; DOCKER_HOST=x docker ps\n",
        "- shell: if docker info; then :; fi\n",
        "- ansible.builtin.set_fact:\n    x: \"{% set d = 'docker' %}{{ d }}\"\n",
        "- community.docker.docker_container:\n    name: x\n",
        "- vars:\n    engine_argv: [docker, ps]\n  ansible.builtin.command:\n"
        '    argv: "{{ engine_argv }}"\n',
    ],
)
def test_the_scan_sees_each_way_a_task_runs_the_engine(tmp_path, task):
    stray = tmp_path / "stray.yml"
    stray.write_text("---\n" + task)
    assert engine_runs(stray), task


@pytest.mark.parametrize(
    "line",
    [
        "exec docker \\",
        'while docker container inspect "$name" >/dev/null 2>&1; do',
        '    docker rm --force "$name" || true',
        "ExecStart=/usr/bin/docker run --rm x",
        "ExecStartPre=-docker rm --force x",
        "out=$(podman ps -q)",
        "{% set docker = '/usr/bin/docker' %}",
        "if ! docker info; then exit 1; fi",
    ],
)
def test_the_scan_sees_each_way_a_template_runs_the_engine(tmp_path, line):
    stray = tmp_path / "stray.sh.j2"
    stray.write_text(f"#!/bin/sh\n{line}\n")
    assert engine_runs(stray), line


@pytest.mark.parametrize(
    "text",
    [
        # tasks: a variable, and the engine's words that run nothing
        '- ansible.builtin.command:\n    argv: ["{{ zenvllm_instances_docker_bin }}", ps]\n',
        '- ansible.builtin.command:\n    argv: "{{ [zenvllm_image_docker_bin] + x }}"\n',
        "- ansible.builtin.systemd_service:\n    name: docker\n    state: started\n",
        "- ansible.builtin.apt:\n    name: [docker.io, containerd]\n",
        "- ansible.builtin.file:\n    path: /etc/docker/certs.d/r\n    state: directory\n",
        "- ansible.builtin.fail:\n    msg: >-\n      a `docker save` archive, or docker\n"
        "      load it; start docker.service\n",
        "- ansible.builtin.set_fact:\n    u: \"{{ x | default('docker.service') }}\"\n",
        "- name: Load it (docker load)\n  ansible.builtin.shell:\n"
        '    cmd: "{{ zenvllm_image_docker_bin | quote }} load --input x"\n',
    ],
)
def test_the_scan_leaves_words_that_run_no_engine(tmp_path, text):
    stray = tmp_path / "fine.yml"
    stray.write_text("---\n" + text)
    assert engine_runs(stray) == [], text


def test_the_scan_leaves_a_templates_comments_and_messages(tmp_path):
    stray = tmp_path / "fine.sh.j2"
    stray.write_text(
        "#!/bin/sh\n# docker rm can outlast docker's own wait\n{# docker ps #}\n"
        'echo "still there after 60 s of docker rm --force" >&2\n'
        "exec {{ zenvllm_instances_docker_bin | quote }} \\\n"
        "After=docker.service\nExecStart={{ docker }} run x\n"
    )
    assert engine_runs(stray) == []
