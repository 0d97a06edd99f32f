"""`zenvllm bench`'s flags, and the typed request read once from them."""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from zenvllm.bench import catalogue, order, workloads
from zenvllm.core import arguments
from zenvllm.core.arguments import real, whole


@dataclass(frozen=True)
class ImageTags:
    """--image, --zen-image, --pace-image, --llamacpp-image, --infinity-image (None: the
    default tag)."""

    vllm_openai: str | None
    zen: str | None
    pace: str | None
    llamacpp: str | None
    infinity: str | None = None


@dataclass(frozen=True)
class BenchRequest:
    """What the command is asked: every option its flags give, in --help's order, typed
    and frozen; None where a flag without a default of its own was left out (the parser
    alone holds the defaults). request_of builds it once from the parsed flags; the
    Namespace stays in run; the helpers take it or the fields they need. Nothing in it is checked
    yet: run checks the paths and values in the order it always has."""

    model: Path  # not yet checked to be a directory
    quick: bool
    embed: bool  # bench an embedding model (bench/kinds.py: a pooling model's kind)
    batch_sizes: str | None  # a pooling model's: inputs per request, a comma list
    configs: str | None  # the comma list, parsed by layouts.parse_configs
    weights: tuple[str, ...]  # each NAME=DIR as given
    # The workload flags: each overrides the Workload field of its name when given.
    repeats: int | None
    input_len: int | None
    output_len: int | None
    num_prompts: int | None
    concurrency: int | None
    warmup_prompts: int | None
    batch1_prompts: int | None
    ordering: order.Order  # --order and --reverse (bench/order.py)
    compile: bool  # never fall back to --enforce-eager
    compile_cache: Path | None
    restart: bool  # not --no-restart
    quality: bool  # not --no-quality
    serve_env: tuple[tuple[str, str], ...]  # KEY=VALUE pairs in the order given
    stock_dtype: str  # "bfloat16", or "plan": the dtype the planner serves on this CPU
    max_model_len: int | None
    images: ImageTags
    gateway_flag: str | None  # --gateway: 'deploy' or a running deployment's URL
    base_port: int
    out: Path
    start_timeout: float
    plots: bool  # not --no-plots
    metrics_file: Path | None
    dry_run: bool

    def workload_overrides(self) -> dict[str, int]:
        """The workload flags given, by Workload field."""
        flags = {
            "input_len": self.input_len,
            "output_len": self.output_len,
            "num_prompts": self.num_prompts,
            "concurrency": self.concurrency,
            "repeats": self.repeats,
            "warmup_prompts": self.warmup_prompts,
            "batch1_prompts": self.batch1_prompts,
        }
        return {name: value for name, value in flags.items() if value is not None}


positive = whole(1, 1_000_000)  # repeats, lengths, prompts, concurrency: far past a bench


def add_target_flags(parser: argparse.ArgumentParser) -> None:
    """What is measured: the model, its other weights, the configurations."""
    parser.add_argument("--model", type=Path, required=True, help="local model directory")
    parser.add_argument("--quick", action="store_true", help="few prompts, one repeat (CI)")
    parser.add_argument(
        "--embed",
        action="store_true",
        help="embedding throughput of an embedding model: stock vLLM, the planner's layout "
        "and infinity-emb, in inputs/s and tokens/s at each --batch-sizes (what a pooling "
        "model gets without it; refuses a model that generates)",
    )
    parser.add_argument(
        "--batch-sizes",
        metavar="N,N,...",
        help="an embedding model's inputs per request (default 1,8,32); --num-prompts "
        "counts inputs",
    )
    parser.add_argument(
        "--configs",
        help=f"comma list from: {', '.join(catalogue.SPECS)} (an embedding model's: "
        f"{', '.join(catalogue.POOLING_SPECS)})",
    )
    parser.add_argument(
        "--weights",
        action="append",
        default=[],
        metavar="NAME=DIR",
        help="another copy of --model's weights (INT8, INT4...), measured as LAYOUT-NAME "
        "with each planner layout of --configs planned for it (repeatable)",
    )


def add_workload_flags(parser: argparse.ArgumentParser) -> None:
    """What each configuration is asked to do, over --quick's or the full workload."""
    parser.add_argument("--repeats", type=positive, help="measured runs per configuration")
    parser.add_argument("--input-len", type=positive, help="random prompt tokens")
    parser.add_argument("--output-len", type=positive, help="tokens generated per request")
    parser.add_argument("--num-prompts", type=positive, help="requests per repeat, all clients")
    parser.add_argument("--concurrency", type=positive, help="requests in flight, all clients")
    parser.add_argument(
        "--warmup-prompts", type=whole(0), help="requests before the measured repeats"
    )
    parser.add_argument(
        "--batch1-prompts",
        type=whole(0, 1000),
        help="after the repeats, requests one at a time to each configuration's first "
        f"instance (default {workloads.FULL.batch1_prompts}; 0: no batch-1 figures)",
    )
    parser.add_argument(
        "--order",
        choices=order.ORDERS,
        default=order.BLOCKS,
        help="blocks: each configuration's repeats at one start of its servers (default); "
        "rounds: a repeat of every configuration per round, the order reversed each round, "
        "so the machine's drift falls on all alike (each round starts the servers again)",
    )
    parser.add_argument(
        "--reverse",
        action="store_true",
        help="start from the last configuration (a second run, to show the order does not "
        "change the ratios)",
    )


def add_server_flags(parser: argparse.ArgumentParser) -> None:
    """How the servers start: compiled or eager, their caches, their environment."""
    parser.add_argument(
        "--compile",
        action="store_true",
        help="never fall back to --enforce-eager (the image has a C++ compiler)",
    )
    parser.add_argument(
        "--compile-cache",
        type=Path,
        metavar="DIR",
        help="keep vLLM's compile caches under DIR across runs, stock's too (its start-up "
        "only); default: a fresh one per run, removed after it, so each run measures cold "
        "starts and the planner's warm restart",
    )
    parser.add_argument("--no-restart", action="store_true", help="skip the planner's restart")
    parser.add_argument(
        "--no-quality",
        action="store_true",
        help="speed only: no float32 reference and no quality scores (a generating model's)",
    )
    parser.add_argument(
        "--serve-env",
        type=arguments.env_pair,
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="set in the planner's containers over what it planned (repeatable), e.g. to "
        "measure a layout with another binding",
    )
    parser.add_argument(
        "--stock-dtype",
        choices=("bfloat16", "plan"),
        default="bfloat16",
        help="stock's --dtype: bfloat16, as a user runs a bf16 model (default), or 'plan': the "
        "dtype the planner serves on this CPU (float32 where it lacks bf16 in hardware), so "
        "stock and the planner differ in their layout alone, as the speed guard compares them",
    )
    parser.add_argument(
        "--max-model-len", type=arguments.max_model_len, help="served context length"
    )


def add_image_flags(parser: argparse.ArgumentParser) -> None:
    """What serves: the images, the gateway, the ports."""
    parser.add_argument("--image", help="vllm-openai image tag (default: what make image builds)")
    parser.add_argument("--zen-image", help="zen image tag (default: make image TARGET=zen)")
    parser.add_argument("--pace-image", help="pace image tag (default: make image TARGET=pace)")
    parser.add_argument(
        "--llamacpp-image", help="llama.cpp peer image tag (default: make peer-image)"
    )
    parser.add_argument(
        "--infinity-image",
        help="an embedding model's infinity peer image tag (default: make peer-image "
        "PEER=infinity)",
    )
    parser.add_argument(
        "--gateway",
        metavar="deploy|URL",
        help="measure a gateway too: 'deploy' runs ansible/playbooks/deploy.yml here for the run "
        "and takes it down after; a URL measures a running deployment",
    )
    parser.add_argument("--base-port", type=arguments.port, default=8401, help="first server port")


def add_output_flags(parser: argparse.ArgumentParser) -> None:
    """Where the results go, how long a server may take to start, a dry run."""
    parser.add_argument("--out", type=Path, default=Path("out/bench"), help="output directory")
    parser.add_argument(
        "--start-timeout", type=real(0, 86400, example=900), default=900, help="seconds to /health"
    )
    parser.add_argument("--no-plots", action="store_true", help="skip the PNGs (no matplotlib)")
    parser.add_argument(
        "--metrics-file",
        type=Path,
        help="also write the results as Prometheus gauges here (the node exporter's textfile "
        "directory: /var/lib/prometheus/node-exporter/zenvllm_bench.prom)",
    )
    parser.add_argument(
        "--dry-run", action="store_true", help="print the configurations as JSON, run nothing"
    )


def request_of(values: Mapping[str, Any]) -> BenchRequest:
    """The one reader of the bench's parsed flags (vars of the Namespace, which stays in
    the entry point): every flag, typed, in --help's order."""
    args = SimpleNamespace(**values)
    return BenchRequest(
        model=args.model,
        quick=args.quick,
        embed=args.embed,
        batch_sizes=args.batch_sizes,
        configs=args.configs,
        weights=tuple(args.weights),
        repeats=args.repeats,
        input_len=args.input_len,
        output_len=args.output_len,
        num_prompts=args.num_prompts,
        concurrency=args.concurrency,
        warmup_prompts=args.warmup_prompts,
        batch1_prompts=args.batch1_prompts,
        ordering=order.Order(args.order, args.reverse),
        compile=args.compile,
        compile_cache=args.compile_cache,
        restart=not args.no_restart,
        quality=not args.no_quality,
        serve_env=tuple(args.serve_env),
        stock_dtype=args.stock_dtype,
        max_model_len=args.max_model_len,
        images=ImageTags(
            args.image, args.zen_image, args.pace_image, args.llamacpp_image, args.infinity_image
        ),
        gateway_flag=args.gateway,
        base_port=args.base_port,
        out=args.out,
        start_timeout=args.start_timeout,
        plots=not args.no_plots,
        metrics_file=args.metrics_file,
        dry_run=args.dry_run,
    )
