"""`zenvllm render` and `zenvllm build`: a target's build context, and its image."""

from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from zenvllm.core.topology import read_host
from zenvllm.deploy import outputs
from zenvllm.image import baseimage, build, peers, provenance, push, render
from zenvllm.runtime.engine import choose_engine


def _path(value: str | None) -> Path | None:
    return Path(value) if value else None


def add_render_options(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--target",
        default=os.environ.get("TARGET", "vllm-openai"),
        help="vllm-openai, zen or pace (default vllm-openai); llamacpp: the bench's "
        "llama.cpp peer, compiled for this machine's CPU",
    )
    p.add_argument(
        "--pin",
        action="append",
        metavar="NAME=VERSION",
        help="override a pin of dockerfiles/build.yaml (repeatable)",
    )
    p.add_argument(
        "--source",
        choices=("wheel", "source"),
        default=None,
        help="install vLLM from PyPI wheels (default) or build it from git",
    )
    p.add_argument(
        "--wheelhouse",
        default=os.environ.get("ZENVLLM_WHEELHOUSE"),
        help="directory of wheels (e.g. torch +cpu) copied into the context",
    )
    p.add_argument(
        "--extra-ca-certs",
        default=os.environ.get("ZENVLLM_EXTRA_CA_CERTS"),
        metavar="DIR|FILE",
        help="CA certificates to trust (TLS-intercepting proxies)",
    )
    p.add_argument(
        "--base-image",
        default=None,
        help="FROM image (default zenvllm/debian:bookworm, made with debootstrap)",
    )
    p.add_argument(
        "--override",
        default=None,
        metavar="FILE",
        help="a template that {%% extends parent_template %%} and overrides blocks",
    )


@dataclass(frozen=True)
class RenderOptions:
    """What the render options (add_render_options) ask, typed; each field is the flag's
    argparse name, so the entry points read it whole from their Namespace."""

    target: str
    pin: list[str] | None  # NAME=VERSION, each as given
    source: str | None
    wheelhouse: str | None
    extra_ca_certs: str | None
    base_image: str | None
    override: str | None


def options_in(values: dict[str, Any]) -> RenderOptions:
    """The render options among a command's parsed values (vars of its Namespace)."""
    return RenderOptions(**{f.name: values[f.name] for f in fields(RenderOptions)})


def base_of(options: RenderOptions, config: dict[str, Any]) -> str:
    return options.base_image or config["defaults"]["base_image"]


def request_of(options: RenderOptions, buildkit: bool, config: dict[str, Any]) -> render.Request:
    peer = peers.is_peer(config, options.target)
    origin = provenance.origin(base_of(options, config), peer=peer)
    return render.Request(
        target=options.target,
        pins=render.parse_pins(options.pin),
        source=options.source,
        base_image=options.base_image,
        wheelhouse=_path(options.wheelhouse),
        extra_ca_certs=_path(options.extra_ca_certs),
        buildkit=buildkit,
        override=_path(options.override),
        origin=origin,
    )


def context_of(config: dict[str, Any], request: render.Request) -> render.Context:
    """A target's context, or a peer's (compiled for the CPU of this machine)."""
    if peers.is_peer(config, request.target):
        return peers.render_peer(config, request, peers.cpu_key(read_host().flags))
    return render.render(config, request)


def run_render(args: argparse.Namespace) -> int:
    outputs.check_output(args.output, "--output")  # before any work
    config = render.load_config()
    context = context_of(config, request_of(options_in(vars(args)), args.buildkit, config))
    render.write_context(context, args.output)
    print(Path(args.output).resolve())
    print(f"render: {context.target} -> {args.output} (tag {context.tag})", file=sys.stderr)
    return 0


def run_build(args: argparse.Namespace) -> int:
    engine = choose_engine(args.engine, args.builder)
    build.check_daemon(engine)
    config = render.load_config()
    options = options_in(vars(args))
    request = request_of(options, engine.buildkit, config)
    context = context_of(config, request)  # refuses bad pins before any build work
    base = base_of(options, config)
    if base == config["defaults"]["base_image"]:
        baseimage.ensure_base_image(base, engine=engine.binary)
    tag = args.tag or context.tag
    print(
        f"build: {context.target} as {tag} with {engine.binary} ({engine.builder})",
        file=sys.stderr,
    )
    previous = build.image_id(engine, tag)
    start = time.monotonic()
    name = build.context_name(context.target, engine)
    with build.context_dir(baseimage.cache_dir(), name) as ctx:
        render.write_context(context, ctx, "the build context")
        image = build.build_context(
            engine, ctx, tag, args.network, base, _path(args.log), args.no_cache
        )
    print(f"build: {tag} {image} in {time.monotonic() - start:.1f} s", file=sys.stderr)
    if previous and previous != image:
        build.remove_image(engine, previous)  # the old image the tag left behind
    if args.push:
        start = time.monotonic()
        digest = push.push(engine.kind, engine.binary, tag, _path(args.log))
        took = time.monotonic() - start
        print(f"build: pushed {tag} {digest or ''} in {took:.1f} s", file=sys.stderr)
    print(tag)
    return 0


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser("render", help="write a target's build context (Dockerfile etc.)")
    add_render_options(p)
    p.add_argument("--output", required=True, type=Path, help="the context directory to write")
    p.add_argument(
        "--buildkit",
        action="store_true",
        help="emit BuildKit cache mounts (the legacy builder rejects them)",
    )
    p.set_defaults(func=run_render)

    p = subparsers.add_parser("build", help="render a target and build its image")
    add_render_options(p)
    p.add_argument("--tag", default=None, help="image tag (default zenvllm/TARGET:VLLM)")
    p.add_argument(
        "--network",
        default="host",
        help="build network (default host: the engine runs with --bridge=none)",
    )
    p.add_argument("--engine", default="auto", help="auto, docker or podman")
    p.add_argument("--builder", default="auto", help="auto, buildkit or legacy (docker)")
    p.add_argument("--log", default=None, help="write the build output here, not to the terminal")
    p.add_argument("--no-cache", action="store_true", help="ignore the engine's layer cache")
    p.add_argument(
        "--push",
        action="store_true",
        help="push the tag to its registry after the build (--tag REGISTRY/NAME:TAG), "
        "with the engine's own login (`docker login REGISTRY`)",
    )
    p.set_defaults(func=run_build)
