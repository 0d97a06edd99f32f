"""build.yaml + a target + overrides -> a complete build context.

`resolve` and `render` are pure over the config (they read only templates and
the zenvllm package files they copy); `write_context` is the one side effect,
and it is atomic: the context is written to a temp dir beside the output and
renamed into place, so an error never leaves a half-written context.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jinja2
import yaml

from zenvllm.core import compile_cache, gate
from zenvllm.core.errors import ConfigError, UserError
from zenvllm.core.targets import TARGETS
from zenvllm.deploy import data, outputs, shipped
from zenvllm.image import matrix
from zenvllm.runtime import amx, working_set

SOURCES = ("wheel", "source")
LABEL_PREFIX = "io.zenvllm"


@dataclass(frozen=True)
class Request:
    target: str
    pins: dict[str, str] = field(default_factory=dict)  # --pin overrides
    source: str | None = None  # None: the config's default
    base_image: str | None = None
    wheelhouse: Path | None = None
    extra_ca_certs: Path | None = None
    buildkit: bool = False  # cache mounts need BuildKit; the legacy builder rejects --mount
    override: Path | None = None  # a template that extends the target's (Kolla style)
    # Labels of where the image comes from (provenance.origin: source, revision, created,
    # licenses, base): decided by the caller, so rendering stays free of git and clocks.
    origin: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Resolved:
    target: str
    source: str
    pins: dict[str, str]  # every pin that applies to this image
    rows: dict[str, dict[str, Any]]  # the matrix row each pin fell in
    spec: dict[str, Any]  # the target's section of build.yaml


@dataclass(frozen=True)
class Context:
    """What goes into the build context: text files plus files copied as they are."""

    target: str
    tag: str
    labels: dict[str, str]
    files: dict[str, str]  # relative path -> text
    copies: dict[str, Path] = field(default_factory=dict)  # relative path -> source file


def load_config(path: Path | None = None) -> dict[str, Any]:
    path = path or data.BUILD_CONFIG
    try:
        loaded = yaml.safe_load(gate.read_text(path, gate.SMALL, "give zenvllm's own build.yaml"))
    except yaml.YAMLError as err:
        raise ConfigError(f"cannot read the build configuration {path}: {err}") from err
    if not isinstance(loaded, dict):
        raise ConfigError(f"the build configuration {path} is not a mapping")
    return loaded


def parse_pins(items: list[str] | None) -> dict[str, str]:
    pins: dict[str, str] = {}
    for item in items or []:
        name, sep, version = item.partition("=")
        if not sep or not name.strip() or not version.strip():
            raise UserError(f"--pin {item!r} is not NAME=VERSION (e.g. --pin zentorch=2.13.0.1)")
        pins[name.strip()] = version.strip()
    return pins


def image_pin_names(spec: dict[str, Any]) -> list[str]:
    # Pins of packages an image does not contain are not its business.
    base = ["python", "vllm", "torch", "intel-openmp", "uv"]
    return base + [p for p in spec.get("packages", []) if p not in base]


def resolve(
    config: dict[str, Any], target: str, overrides: dict[str, str], source: str | None
) -> Resolved:
    targets = config["targets"]
    if target not in targets:
        raise UserError(f"unknown target {target!r}; targets: {', '.join(targets)}")
    source = source or config["defaults"]["install_source"]
    if source not in SOURCES:
        raise UserError(f"unknown install source {source!r}; sources: {', '.join(SOURCES)}")
    spec = targets[target]
    unknown = sorted(set(overrides) - set(config["pins"]))
    if unknown:
        raise UserError(
            f"unknown pin {unknown[0]!r}; pins: {', '.join(config['pins'])} (--pin NAME=VERSION)"
        )
    names = image_pin_names(spec)
    foreign = sorted(set(overrides) - set(names))
    if foreign:
        raise UserError(
            f"--pin {foreign[0]}: target {target} does not contain {foreign[0]}; "
            f"its pins are {', '.join(names)}"
        )
    pins = {n: str(config["pins"][n]["version"]) for n in names}
    pins.update({k: str(v) for k, v in (spec.get("pins") or {}).items()})
    pins.update(overrides)
    rows = matrix.check(config["matrix"], pins)
    return Resolved(target, source, pins, rows, spec)


def default_tag(config: dict[str, Any], resolved: Resolved) -> str:
    return str(config["defaults"]["tag"]).format(target=resolved.target, vllm=resolved.pins["vllm"])


def vllm_sdist(config: dict[str, Any], resolved: Resolved) -> dict[str, str]:
    """The vLLM project's own source distribution on PyPI, checked by its recorded hash."""
    version = resolved.pins["vllm"]
    sha256 = (config.get("vllm_sdists") or {}).get(version)
    if not sha256:
        raise UserError(
            f"--source source: no SHA-256 recorded for the vllm {version} sdist; add it to "
            f"vllm_sdists in build.yaml (PyPI lists it) or pin a recorded version "
            f"({', '.join(sorted(config.get('vllm_sdists') or {}))})"
        )
    url = config["defaults"]["vllm_sdist_url"].format(version=version)
    return {"url": url, "sha256": sha256, "version": version}


def pip_name(resolved: Resolved, name: str) -> str:
    return str(resolved.rows.get(name, {}).get("pip_name", name))


def requirement(resolved: Resolved, name: str) -> str:
    return f"{pip_name(resolved, name)}=={resolved.pins[name]}"


def isa_label(config: dict[str, Any], resolved: Resolved) -> str:
    isa: dict[str, str] = config["isa"]
    if resolved.source == "wheel":
        return isa["wheel"]
    if resolved.rows["vllm"].get("source_isa_args"):
        return isa["source_isa_args"]
    return isa["source_runtime_dispatch"]


def labels(config: dict[str, Any], resolved: Resolved, origin: dict[str, str]) -> dict[str, str]:
    out = {
        **origin,
        "org.opencontainers.image.title": f"zenvllm {resolved.target}",
        "org.opencontainers.image.description": resolved.spec["summary"],
        "org.opencontainers.image.version": resolved.pins["vllm"],
        "org.opencontainers.image.vendor": "zenvllm",
        f"{LABEL_PREFIX}.target": resolved.target,
        f"{LABEL_PREFIX}.install-source": resolved.source,
        f"{LABEL_PREFIX}.isa": isa_label(config, resolved),
    }
    out.update({f"{LABEL_PREFIX}.pin.{k}": v for k, v in resolved.pins.items()})
    return out


def preload_paths(config: dict[str, Any]) -> list[str]:
    venv = config["defaults"]["venv"]
    return [p["path"].format(venv=venv) for p in config["preload"]]


def image_manifest(config: dict[str, Any], resolved: Resolved) -> dict[str, Any]:
    """/etc/zenvllm/image.json: what the launcher (stdlib only) knows of its image."""
    return {
        "target": resolved.target,
        "source": resolved.source,
        "pins": resolved.pins,
        "preload": preload_paths(config),
        "packages": list(resolved.spec.get("packages", [])),
        "port": config["defaults"]["port"],
        "matrix": {
            k: {"versions": r["versions"], "needs": r.get("needs") or {}}
            for k, r in resolved.rows.items()
        },
    }


def constraints(resolved: Resolved) -> str:
    # Everything later installs (target packages too) must keep these versions.
    lines = [requirement(resolved, n) for n in ("vllm", "torch", "intel-openmp")]
    return "\n".join(lines) + "\n"


def overrides_txt(config: dict[str, Any]) -> str:
    # uv overrides: a marker that is never true keeps a dependency out entirely.
    return "".join(f"{name}; sys_platform == 'never'\n" for name in config["drop"])


def template_env(override: Path | None) -> jinja2.Environment:
    """zenvllm's templates, and the user's override (read through the gate, so a FIFO,
    a huge or a non-UTF-8 file is refused by name; it extends parent_template)."""
    loader: jinja2.BaseLoader = jinja2.FileSystemLoader([str(data.DOCKERFILES)])
    if override is not None:
        fix = "give --override a UTF-8 template that {% extends parent_template %}"
        text = gate.read_text(override, gate.SMALL, fix)
        loader = jinja2.ChoiceLoader([jinja2.DictLoader({override.name: text}), loader])
    env = jinja2.Environment(
        loader=loader,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
        autoescape=False,
    )
    env.filters["shell_words"] = shell_words
    return env


def shell_words(items: list[str], indent: int = 8) -> str:
    """One word per continued line, sorted: diffs of package lists stay one line each."""
    pad = " " * indent
    return (" \\\n" + pad).join(sorted(items))


def template_vars(
    config: dict[str, Any],
    resolved: Resolved,
    request: Request,
    has_certs: bool,
    image_labels: dict[str, Any],
) -> dict[str, Any]:
    d = config["defaults"]
    vllm_row = resolved.rows["vllm"]
    use_index = request.wheelhouse is None
    return {
        "target": resolved.target,
        "spec": resolved.spec,
        "source": resolved.source,
        "pins": resolved.pins,
        "buildkit": request.buildkit,
        # With BuildKit and podman the runtime stage installs the venv in place (uv on a
        # tmpfs, the wheelhouse mounted): its gigabytes written once, not in a build stage
        # and again by a copy (a fresh machine's image tier waits on the disk). The legacy
        # builder cannot mount, and a source build needs the build stage's compilers:
        # both install in the build stage and copy the venv over.
        "install_in_runtime": request.buildkit and resolved.source == "wheel",
        "base_image": request.base_image or d["base_image"],
        "venv": d["venv"],
        "python": resolved.pins["python"],
        "user": d["user"],
        "compile_cache": compile_cache.CONTAINER_DIR,
        "port": d["port"],
        "apt": config["apt"],
        "preload": preload_paths(config),
        "drop": config["drop"],
        "torch_index_url": d["torch_index_url"] if use_index else None,
        "vllm_sdist": vllm_sdist(config, resolved) if resolved.source == "source" else None,
        "isa_args": bool(vllm_row.get("source_isa_args")),
        "source_requirements": vllm_row.get("source_requirements", []),
        "base_requirements": [requirement(resolved, n) for n in ("vllm", "torch")],
        "target_requirements": [requirement(resolved, p) for p in resolved.spec["packages"]],
        # Tuning env comes from the planner's own table: one source for image and plan.
        "env": TARGETS[resolved.target].env,
        "labels": image_labels,
        "has_certs": has_certs,
    }


def gather(directory: Path | None, patterns: tuple[str, ...], what: str) -> list[Path]:
    if directory is None:
        return []
    if directory.is_file():
        return [directory]
    if not directory.is_dir():
        raise UserError(f"{what} {directory} does not exist; give a directory or file")
    found = sorted({p for pat in patterns for p in directory.glob(pat) if p.is_file()})
    if not found:
        raise UserError(f"{what} {directory} holds no {' or '.join(patterns)} files")
    return found


def render(config: dict[str, Any], request: Request) -> Context:
    """Everything the build context holds, decided; nothing written."""
    resolved = resolve(config, request.target, request.pins, request.source)
    wheels = gather(request.wheelhouse, ("*.whl",), "wheelhouse")
    certs = gather(request.extra_ca_certs, ("*.crt", "*.pem"), "extra CA certificates")
    image_labels = labels(config, resolved, request.origin)
    variables = template_vars(config, resolved, request, bool(certs), image_labels)
    env = template_env(request.override)
    name = f"targets/{resolved.target}.Dockerfile.j2"
    try:
        if request.override is not None:
            template = env.get_template(request.override.name)
            dockerfile = template.render(parent_template=name, **variables)
        else:
            dockerfile = env.get_template(name).render(**variables)
    except jinja2.TemplateError as err:
        raise ConfigError(f"template error rendering {resolved.target}: {err}") from err
    files = {
        "Dockerfile": dockerfile,
        "image.json": json.dumps(image_manifest(config, resolved), indent=2) + "\n",
        "constraints.txt": constraints(resolved),
        "overrides.txt": overrides_txt(config),
        "zenvllm_amx.pth": amx.PTH_LINE,
        **{f"zenvllm_plugins.dist-info/{k}": v for k, v in working_set.DIST_INFO.items()},
    }
    copies = dict(shipped.files())
    copies.update({f"wheelhouse/{w.name}": w for w in wheels})
    # update-ca-certificates only reads *.crt.
    copies.update({f"certs/{c.stem}.crt": c for c in certs})
    for empty in ("wheelhouse", "certs"):
        if not any(k.startswith(empty + "/") for k in copies):
            files[f"{empty}/.keep"] = ""
    return Context(resolved.target, default_tag(config, resolved), image_labels, files, copies)


LINK_FROM = 1 << 20  # bytes: wheels are linked, the package's files and certificates copied


def _link_or_copy(src: Path, dest: Path) -> None:
    """A wheelhouse of GBs costs nothing when linked on the same filesystem. Small files
    are copied: an edit in place of a linked source file would change the context behind
    its manifest, and the next render would rightly refuse to replace it."""
    if src.stat().st_size >= LINK_FROM:
        try:
            dest.hardlink_to(src)
            return
        except OSError:
            pass
    shutil.copy2(src, dest)


def write_context(context: Context, output: Path, option: str = "--output") -> Path:
    """Write the context to `output` atomically, only over a directory zenvllm made."""
    with outputs.staged(output, option) as tmp:
        for rel, text in context.files.items():
            path = tmp / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
        for rel, src in context.copies.items():
            path = tmp / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            _link_or_copy(src, path)
    return output.resolve()
