"""Peer images: the servers the bench compares zenvllm with (build.yaml's `peers`).

Rendered and built like the targets (`zenvllm render|build --target llamacpp`),
from the same base image and certificates, but they hold no zenvllm code and are
never deployed. llama.cpp compiles for the CPU it is built on (GGML_NATIVE, its
default for a local build), so the tag and the Dockerfile carry a key of that
CPU's flags: a cached image or build layer from another CPU is never reused.
infinity (the embedding bench's peer) installs wheels only; its torch is the
stack's (pins.torch), from the wheelhouse as the targets take it.
"""

from __future__ import annotations

import hashlib
from typing import Any

import jinja2

from zenvllm.core.errors import ConfigError
from zenvllm.image import render

LABEL_PREFIX = render.LABEL_PREFIX


def is_peer(config: dict[str, Any], target: str) -> bool:
    return target in config.get("peers", {})


def cpu_key(flags: frozenset[str]) -> str:
    """A short key of the CPU's feature flags: what GGML_NATIVE compiles for."""
    return hashlib.sha256(" ".join(sorted(flags)).encode()).hexdigest()[:10]


def default_tag(config: dict[str, Any], name: str, cpu: str) -> str:
    peer = config["peers"][name]
    return str(peer["tag"]).format(version=peer["version"], cpu=cpu)


def labels(peer: dict[str, Any], name: str, cpu: str, origin: dict[str, str]) -> dict[str, str]:
    return {
        **origin,
        "org.opencontainers.image.title": f"zenvllm peer {name}",
        "org.opencontainers.image.description": peer["summary"],
        "org.opencontainers.image.version": str(peer["version"]),
        "org.opencontainers.image.vendor": "zenvllm",
        f"{LABEL_PREFIX}.peer": name,
        # Only an image built for one CPU carries its key (llama.cpp's GGML_NATIVE).
        **({f"{LABEL_PREFIX}.cpu-key": cpu} if "{cpu}" in peer["tag"] else {}),
        f"{LABEL_PREFIX}.pin.{peer['package']}": str(peer["version"]),
    }


def render_peer(config: dict[str, Any], request: render.Request, cpu: str) -> render.Context:
    """A peer's build context, decided; nothing written. `cpu` is cpu_key() of the
    machine that builds it."""
    name = request.target
    if request.pins or request.override or request.source:
        raise ConfigError(
            f"--target {name} is a bench peer: its one pin ({config['peers'][name]['package']}) "
            "lives in dockerfiles/build.yaml; --pin, --source and --override apply to "
            "vllm-openai, zen and pace"
        )
    peer = config["peers"][name]
    certs = render.gather(request.extra_ca_certs, ("*.crt", "*.pem"), "extra CA certificates")
    wheels = (
        render.gather(request.wheelhouse, ("*.whl",), "wheelhouse") if peer.get("torch") else []
    )
    image_labels = labels(peer, name, cpu, request.origin)
    defaults = config["defaults"]
    variables = {
        "name": name,
        "peer": peer,
        "cpu": cpu,
        "base_image": request.base_image or defaults["base_image"],
        "buildkit": request.buildkit,
        "has_certs": bool(certs),
        "user": defaults["user"],
        "labels": image_labels,
        "venv": defaults["venv"],
        "torch": str(config["pins"]["torch"]["version"]),
        # PyPI has no +cpu torch: the torch CPU index when no wheelhouse brings it.
        "torch_index_url": None if request.wheelhouse else defaults["torch_index_url"],
    }
    try:
        template = render.template_env(None).get_template(f"peers/{name}.Dockerfile.j2")
        dockerfile = template.render(**variables)
    except jinja2.TemplateError as err:
        raise ConfigError(f"template error rendering {name}: {err}") from err
    files = {"Dockerfile": dockerfile}
    copies = {f"certs/{c.stem}.crt": c for c in certs}
    copies.update({f"wheelhouse/{w.name}": w for w in wheels})
    for empty in ("wheelhouse", "certs") if peer.get("torch") else ("certs",):
        if not any(k.startswith(empty + "/") for k in copies):
            files[f"{empty}/.keep"] = ""
    return render.Context(name, default_tag(config, name, cpu), image_labels, files, copies)
