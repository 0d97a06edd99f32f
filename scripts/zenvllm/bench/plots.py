"""The report's plots, for each model kind (matplotlib, the bench extra, is imported only
when plotting). A generating model's: throughput.png (output tokens/s, median bars with
min-max whiskers and the acceptance line; a configuration beyond its quality bound
hatched, its name in red with BEYOND) and latency.png (TTFT, TPOT). A pooling
model's: throughput.png (inputs/s per batch size, a bar per configuration)."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType
from typing import Any

from zenvllm.bench.catalogue import ACCEPTANCE_RATIO, PLANNER, STOCK
from zenvllm.bench.results import PoolingSummary, Summary
from zenvllm.core.errors import UserError
from zenvllm.deploy.playbooks import BENCH_EXTRA


def generation_plots(result: dict[str, Any], out_dir: Path) -> list[Path]:
    """throughput.png (median bars, min-max whiskers, the 1.3x line) and latency.png."""
    plt = pyplot()
    summaries = [Summary(**s) for s in result["summary"]]
    names = [s.config for s in summaries]
    colors = ["#7f7f7f" if n == STOCK else "#d62728" if n == PLANNER else "#1f77b4" for n in names]
    title = f"{result['meta']['model']} on {result['meta']['host']}"
    paths = [out_dir / "throughput.png", out_dir / "latency.png"]
    beyond = frozenset(result["verdict"].get("beyond_bound", []))
    throughput_plot(plt, summaries, colors, title, paths[0], beyond)
    latency_plot(plt, summaries, colors, title, paths[1])
    return paths


def pyplot() -> ModuleType:
    """matplotlib is optional (the bench extra), so it is imported only when plotting,
    headless (Agg), and its absence is a UserError naming the fix."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as err:
        raise UserError(
            f"plots need matplotlib ({err}); install the bench extra ({BENCH_EXTRA}) "
            "or pass --no-plots"
        ) from None
    return plt


def throughput_plot(
    plt: ModuleType,
    summaries: list[Summary],
    colors: list[str],
    title: str,
    path: Path,
    beyond: frozenset[str] = frozenset(),
) -> None:
    """Output tok/s per configuration, each bar labelled with its ratio to stock, and
    the acceptance line the planner's bar has to clear; those `beyond` their quality
    bound hatched and named BEYOND in red."""
    names = [s.config + ("\nBEYOND" if s.config in beyond else "") for s in summaries]
    fig, ax = plt.subplots(figsize=(max(6, 1.3 * len(names)), 4.5))
    med = [s.output_tok_s for s in summaries]
    err = [
        [m - s.output_min for m, s in zip(med, summaries, strict=True)],
        [s.output_max - m for m, s in zip(med, summaries, strict=True)],
    ]
    bars = ax.bar(names, med, yerr=err, capsize=4, color=colors)
    for bar, label, s in zip(bars, ax.get_xticklabels(), summaries, strict=False):
        if s.config in beyond:
            bar.set_hatch("//")
            bar.set_edgecolor("#d62728")
            label.set_color("#d62728")
    for i, s in enumerate(summaries):
        if s.ratio is not None:
            ax.annotate(
                f"{s.ratio:.2f}x",
                (i, s.output_max),
                ha="center",
                va="bottom",
                xytext=(0, 3),
                textcoords="offset points",
            )
    stock = next((s for s in summaries if s.config == STOCK), None)
    if stock:
        ax.axhline(
            stock.output_tok_s * ACCEPTANCE_RATIO,
            ls="--",
            color="#2ca02c",
            lw=1,
            label=f"{ACCEPTANCE_RATIO}x stock",
        )
        ax.legend(loc="lower right")
    ax.set_ylabel("output tokens/s (median, min-max)")
    ax.set_ylim(0, max(s.output_max for s in summaries) * 1.12)  # room for the ratios
    ax.set_title(f"Output throughput\n{title}", fontsize=10)
    ax.tick_params(axis="x", rotation=20)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def latency_plot(
    plt: ModuleType, summaries: list[Summary], colors: list[str], title: str, path: Path
) -> None:
    """TTFT and TPOT side by side: throughput bought with latency should show."""
    names = [s.config for s in summaries]
    fig, (left, right) = plt.subplots(1, 2, figsize=(max(8, 2 * len(names)), 4.2))
    for ax, key, label in ((left, "ttft", "TTFT ms"), (right, "tpot", "TPOT ms")):
        mid = [getattr(s, f"{key}_ms") for s in summaries]
        lo = [m - getattr(s, f"{key}_min") for m, s in zip(mid, summaries, strict=True)]
        hi = [getattr(s, f"{key}_max") - m for m, s in zip(mid, summaries, strict=True)]
        ax.bar(names, mid, yerr=[lo, hi], capsize=4, color=colors)
        ax.set_ylabel(f"{label} (median of per-run medians)")
        ax.set_title(label)
        ax.tick_params(axis="x", rotation=30)
    fig.suptitle(f"Latency: {title}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def pooling_plots(result: dict[str, Any], out_dir: Path) -> list[Path]:
    """throughput.png: inputs/s per batch size, a bar per configuration, min-max whiskers."""
    plt = pyplot()
    path = out_dir / "throughput.png"
    summaries = [PoolingSummary(**s) for s in result["summary"]]
    names = list(dict.fromkeys(s.config for s in summaries))
    sizes = sorted({s.batch for s in summaries})
    fig, ax = plt.subplots(figsize=(max(6, 2 * len(sizes)), 4.5))
    width = 0.8 / len(names)
    for i, name in enumerate(names):
        mine = {s.batch: s for s in summaries if s.config == name}
        xs = [j + i * width for j, b in enumerate(sizes) if b in mine]
        mid = [mine[b].inputs_s for b in sizes if b in mine]
        err = [
            [mine[b].inputs_s - mine[b].inputs_min for b in sizes if b in mine],
            [mine[b].inputs_max - mine[b].inputs_s for b in sizes if b in mine],
        ]
        ax.bar(xs, mid, width, yerr=err, capsize=3, label=name)
    ax.set_xticks([j + width * (len(names) - 1) / 2 for j in range(len(sizes))])
    ax.set_xticklabels([f"batch {b}" for b in sizes])
    ax.set_ylabel("inputs/s (median, min-max)")
    ax.set_title(f"Embeddings: {result['meta']['model']} on {result['meta']['host']}", fontsize=9)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return [path]
