"""`zenvllm calibrate`: measure this host's memory bandwidth and keep it for the planner."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from zenvllm.core import gate
from zenvllm.core.arguments import real
from zenvllm.core.calibration import DEFAULT_PATH, parse
from zenvllm.core.errors import UserError
from zenvllm.core.model import read_model
from zenvllm.core.topology import read_host
from zenvllm.runtime.atomic import write_atomically
from zenvllm.runtime.calibrate import calibrate


def check_out(path: Path) -> None:
    """Refuse, before measuring, a path that is not a calibration file zenvllm wrote."""
    if path.is_symlink() or (path.exists() and not path.is_file()):
        raise UserError(f"--out {path} is not a regular file; give a file path")
    if path.exists():
        try:  # read at most the gate's cap: a 2.5 GB file is refused, never loaded
            parse(gate.read_text(path, gate.SMALL, "") or "", str(path))
        except UserError:
            raise UserError(
                f"--out {path} exists and is not a calibration zenvllm wrote; zenvllm never "
                "replaces a file it did not write: give another --out, or move it away"
            ) from None


def run(args: argparse.Namespace) -> int:
    check_out(args.out)
    for model in args.model:  # a bad directory is refused before seconds of measuring
        read_model(model)
    host = read_host()
    print(
        f"calibrate: measuring {host.cpu_name} for ~{8 * args.seconds:g} s",
        file=sys.stderr,
    )
    cal = calibrate(host, args.seconds, tuple(args.model))
    write_atomically(args.out, cal.to_json())
    for node, figure in sorted(cal.nodes.items()):
        print(
            f"node {node}: {figure.gbs:.1f} GB/s over {figure.cores} core(s), "
            f"{figure.per_core_gbs:.1f} GB/s per core copying; {figure.read_gbs:.1f} GB/s, "
            f"{figure.per_core_read_gbs:.1f} GB/s per core reading"
        )
    print(
        f"one core alone: {cal.core_alone_gbs:.1f} GB/s copying, "
        f"{cal.read_alone_gbs:.1f} GB/s reading"
    )
    for step in cal.steps:
        print(
            f"{step.model}: its {step.weight_bytes / 1e9:.2f} GB of weights read in "
            f"{step.ms:.1f} ms by {step.cores} core(s), {step.per_core_gbs:.1f} GB/s per core "
            "(the planner uses this figure for this model)"
        )
    print(f"the planner now uses {cal.per_core_gbs:.1f} GB/s per core ({args.out})")
    return 0


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "calibrate", help="measure memory bandwidth per core and node, for the planner"
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=Path(DEFAULT_PATH),
        help=f"where to keep it (default {DEFAULT_PATH})",
    )
    parser.add_argument(
        "--seconds",
        type=real(0, 60, example=2),
        default=2.0,
        help="per measurement (default 2; ~4 in all on one node)",
    )
    parser.add_argument(
        "--model",
        type=Path,
        action="append",
        default=[],
        metavar="DIR",
        help="also time a decode step's weight read of this model (repeatable)",
    )
    parser.set_defaults(func=run)
