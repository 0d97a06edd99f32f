"""The benchmark's pure parts: workload, configurations, vLLM result files, tables, plots.

No processes and no network here (`bench_run` is the side-effect edge). The
numbers come from vLLM's own `vllm bench serve --save-result` files; this
module only splits the workload over clients, folds clients and repeats
together, and writes what it found (JSON, CSV, Markdown shaped like AMD's
ZenDNN table, PNG plots; matplotlib is imported only when plotting).
"""

from __future__ import annotations

import csv
import io
import json
import statistics
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path

from zenvllm.errors import PlanError, UserError
from zenvllm.host import Host
from zenvllm.model import Model
from zenvllm.plan import Plan, Policy, make_plan, usable_cores
from zenvllm.topology import format_cpu_list, parse_cpu_list

# vLLM's CPU guide, "How to decide VLLM_CPU_KVCACHE_SPACE?": "This value is 4GB by default".
STOCK_KV_GIB = 4
# vLLM's CPU guide's `docker run` example.
STOCK_SHM = "4g"
# Both the guide's example and ours: lets vLLM bind memory (get_mempolicy, migrate_pages).
SECURITY_ARGS = ("--cap-add", "SYS_NICE", "--security-opt", "seccomp=unconfined")
MODEL_MOUNT = "/model"
STOCK = "stock"
PLANNER = "auto"  # the configuration that is the planner's own choice
ACCEPTANCE_RATIO = 1.3  # issue 5: the planner's layout >= 1.3x stock output throughput


# -- workload ----------------------------------------------------------------


@dataclass(frozen=True)
class Workload:
    """What every configuration is asked to do; AMD's is 128 in / 128 out, 1024 prompts,
    batch 128 (8 waves). Ours keeps the shape (equal in/out, 8 waves) at 1/4 the size:
    a repeat of the 26 M-parameter bench model takes ~40 s on 2 cores and repeats
    spread by about +-5% (the 0.2 M test model's spread by +-30%)."""

    input_len: int
    output_len: int
    num_prompts: int
    concurrency: int
    repeats: int
    warmup_prompts: int
    seed: int = 0
    enforce_eager: bool = False  # --quick only: halves server start-up, same for every config

    def check(self, max_model_len: int) -> None:
        for name in ("input_len", "output_len", "num_prompts", "concurrency", "repeats"):
            if getattr(self, name) < 1:
                raise UserError(f"--{name.replace('_', '-')} {getattr(self, name)}: give 1 or more")
        if self.warmup_prompts < 0:
            raise UserError(f"warm-up prompts {self.warmup_prompts}: give 0 or more")
        if self.input_len + self.output_len > max_model_len:
            raise UserError(
                f"--input-len {self.input_len} + --output-len {self.output_len} exceeds "
                f"--max-model-len {max_model_len}; shorten them or raise --max-model-len"
            )

    def shares(self, clients: int) -> list[Workload]:
        """One client per instance: prompts and concurrency split as evenly as they go."""
        if clients > min(self.num_prompts, self.concurrency):
            raise UserError(
                f"{clients} instances need at least {clients} prompts and a concurrency of "
                f"{clients} (one client each); got --num-prompts {self.num_prompts}, "
                f"--concurrency {self.concurrency}"
            )
        return [
            replace(
                self,
                num_prompts=split(self.num_prompts, clients)[i],
                concurrency=split(self.concurrency, clients)[i],
                warmup_prompts=split(self.warmup_prompts, clients)[i],
                seed=self.seed + i,  # distinct prompts per client, as one client would send
            )
            for i in range(clients)
        ]


def split(total: int, parts: int) -> list[int]:
    size, extra = divmod(total, parts)
    return [size + (1 if i < extra else 0) for i in range(parts)]


FULL = Workload(
    input_len=128, output_len=128, num_prompts=256, concurrency=32, repeats=3, warmup_prompts=32
)
QUICK = Workload(
    input_len=32,
    output_len=32,
    num_prompts=16,
    concurrency=4,
    repeats=1,
    warmup_prompts=4,
    enforce_eager=True,
)


def client_args(
    base_url: str, model: str, share: Workload, result_dir: str, result_name: str
) -> list[str]:
    """`vllm bench serve` arguments for one client; --ignore-eos makes every request
    produce exactly output_len tokens, so configurations do the same work."""
    return [
        "bench",
        "serve",
        "--backend",
        "openai",
        "--base-url",
        base_url,
        "--model",
        model,
        "--tokenizer",
        MODEL_MOUNT,
        "--dataset-name",
        "random",
        "--random-input-len",
        str(share.input_len),
        "--random-output-len",
        str(share.output_len),
        "--num-prompts",
        str(share.num_prompts),
        "--max-concurrency",
        str(share.concurrency),
        "--request-rate",
        "inf",
        "--ignore-eos",
        "--seed",
        str(share.seed),
        "--percentile-metrics",
        "ttft,tpot,itl,e2el",
        "--disable-tqdm",
        "--save-result",
        "--result-dir",
        result_dir,
        "--result-filename",
        result_name,
    ]


# -- configurations ----------------------------------------------------------


@dataclass(frozen=True)
class Spec:
    """A configuration before it meets the host."""

    name: str
    kind: str  # stock | plan | gateway
    summary: str
    target: str = "vllm-openai"
    instances: int | str | None = None  # plan: None auto, N, "per-node" or "two-per-node"
    layout: str = "contiguous"


CATALOGUE = (
    Spec(STOCK, "stock", "vLLM's docs: one container, all CPUs, default env, auto binding"),
    # The planner's own choice comes first, so layouts identical to it fold into it.
    Spec(PLANNER, "plan", "planner's auto layout (contiguous cores)"),
    Spec("single", "plan", "planner: one instance on all cores", instances=1),
    Spec("per-node", "plan", "planner: one instance per NUMA node", instances="per-node"),
    Spec("two-per-node", "plan", "planner: two instances per NUMA node", instances="two-per-node"),
    Spec(
        "auto-interleaved",
        "plan",
        "planner's auto instance count, interleaved cores",
        layout="interleaved",
    ),
    Spec("zen-auto", "plan", "zen image, the planner's auto layout", target="zen"),
    Spec("zen-single", "plan", "zen image, one instance on all cores", target="zen", instances=1),
    Spec("gateway", "gateway", "deploy.yml's nginx gateway over the planned instances"),
)
SPECS = {s.name: s for s in CATALOGUE}
QUICK_CONFIGS = (STOCK, PLANNER, "gateway")


@dataclass(frozen=True)
class Server:
    """One vLLM container of a configuration."""

    name: str
    port: int
    cpus: str  # the container's cpuset, "all" when unrestricted
    omp_bind: str  # VLLM_CPU_OMP_THREADS_BIND
    mems: str
    kv_cache_gib: int
    env: dict[str, str]
    docker_args: tuple[str, ...]


@dataclass(frozen=True)
class Configuration:
    name: str
    kind: str
    summary: str
    target: str
    servers: tuple[Server, ...] = ()
    same_as: tuple[str, ...] = ()  # catalogue entries identical to this one on this host

    @property
    def shape(self) -> str:
        """'2 x 1 core' style description of the instances."""
        if self.kind == "gateway":
            return "gateway"
        if self.kind == "stock":
            return "1 x all CPUs"
        sizes = sorted({len(cpu_ids(s.cpus)) for s in self.servers})
        cores = "/".join(str(n) for n in sizes)
        return f"{len(self.servers)} x {cores} CPU{'s' if sizes != [1] else ''}"

    def signature(self) -> tuple:
        """What makes two configurations the same run: image and every container's placement."""
        return (
            self.kind,
            self.target,
            tuple(
                sorted(
                    (s.cpus, s.omp_bind, s.mems, s.kv_cache_gib, tuple(sorted(s.env.items())))
                    for s in self.servers
                )
            ),
        )


def cpu_ids(text: str) -> list[int]:
    return list(parse_cpu_list(text)) if text != "all" else []


def parse_configs(text: str | None, quick: bool) -> list[str]:
    if not text:
        return list(QUICK_CONFIGS if quick else SPECS)
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in SPECS]
    if unknown:
        raise UserError(
            f"--configs: unknown configuration {unknown[0]!r}; choose from {', '.join(SPECS)}"
        )
    if STOCK not in names:
        raise UserError(f"--configs {text}: include {STOCK!r}, the baseline every ratio divides by")
    return list(dict.fromkeys(names))


def stock_server(port: int) -> Server:
    env = {"VLLM_CPU_KVCACHE_SPACE": str(STOCK_KV_GIB), "VLLM_CPU_OMP_THREADS_BIND": "auto"}
    return Server(
        name=f"zenvllm-bench-stock-{port}",  # the port keeps concurrent runs apart
        port=port,
        cpus="all",
        omp_bind="auto",
        mems="all",
        kv_cache_gib=STOCK_KV_GIB,
        env=env,
        docker_args=(f"--shm-size={STOCK_SHM}",),
    )


def servers_of(plan: Plan, prefix: str) -> tuple[Server, ...]:
    return tuple(
        Server(
            name=f"{prefix}-{i.port}",
            port=i.port,
            cpus=format_cpu_list(i.cpus),
            omp_bind=i.omp_threads_bind,
            mems=format_cpu_list(i.mems),
            kv_cache_gib=i.kv_cache_gib,
            env=dict(i.env),
            docker_args=tuple(i.docker_args),
        )
        for i in plan.instances
    )


def policy_of(spec: Spec, host: Host, base_port: int, max_model_len: int) -> Policy:
    instances = spec.instances
    if instances in ("per-node", "two-per-node"):
        nodes = len(usable_cores(host))  # the nodes the planner can place on
        instances = nodes * (2 if instances == "two-per-node" else 1)
    return Policy(
        instances=instances,  # type: ignore[arg-type]
        target=spec.target,
        layout=spec.layout,
        base_port=base_port,
        max_model_len=max_model_len,
    )


def resolve(
    names: list[str], host: Host, model: Model, base_port: int, max_model_len: int
) -> tuple[list[Configuration], list[str]]:
    """Catalogue names -> runnable configurations on this host, duplicates folded.

    Returns the configurations and notes (what was folded or skipped, and why)."""
    configs: list[Configuration] = []
    notes: list[str] = []
    for name in sorted(names, key=list(SPECS).index):  # the planner's own first
        spec = SPECS[name]
        if spec.kind == "stock":
            config = Configuration(
                name, spec.kind, spec.summary, spec.target, (stock_server(base_port),)
            )
        elif spec.kind == "gateway":
            config = Configuration(name, spec.kind, spec.summary, spec.target)
        else:
            try:
                plan = make_plan(host, model, policy_of(spec, host, base_port, max_model_len))
            except PlanError as err:
                notes.append(f"{name}: skipped on this host: {err}")
                continue
            config = Configuration(
                name, spec.kind, spec.summary, spec.target, servers_of(plan, "zenvllm-bench")
            )
        twin = next(
            (c for c in configs if c.kind != "gateway" and c.signature() == config.signature()),
            None,
        )
        if twin is not None and config.kind != "gateway":
            configs[configs.index(twin)] = replace(twin, same_as=(*twin.same_as, name))
            notes.append(
                f"{name}: identical to {twin.name} on this host ({twin.shape}, "
                f"cpusets {', '.join(s.cpus for s in twin.servers)}); measured once"
            )
            continue
        configs.append(config)
    return configs, notes


# -- container commands (argv only; bench_run executes them) --------------------

BENCH_LABEL = "io.zenvllm.bench"


def server_command(
    server: Server, image: str, model_dir: Path, max_model_len: int, eager: bool, run_id: str
) -> list[str]:
    """`docker run` argv for one server. `--entrypoint vllm` bypasses the image's launcher,
    so every configuration, stock included, gets exactly the env written here."""
    argv = ["run", "-d", "--name", server.name, "--label", f"{BENCH_LABEL}={run_id}"]
    argv += ["--network", "host", *SECURITY_ARGS, *server.docker_args]
    argv += ["-v", f"{model_dir}:{MODEL_MOUNT}:ro"]
    for key, value in sorted({**server.env, "HF_HUB_OFFLINE": "1"}.items()):
        argv += ["-e", f"{key}={value}"]
    argv += ["--entrypoint", "vllm", image, "serve", MODEL_MOUNT, "--dtype", "bfloat16"]
    argv += ["--max-model-len", str(max_model_len), "--host", "127.0.0.1"]
    argv += ["--port", str(server.port)]
    return argv + (["--enforce-eager"] if eager else [])


def client_command(
    name: str, image: str, model_dir: Path, result_dir: Path, run_id: str, args: list[str]
) -> list[str]:
    """`docker run` argv for one `vllm bench serve` client, from the image itself, so the
    host needs no vLLM. Clients are not pinned: they float like any client on the host."""
    return [
        "run",
        "--rm",
        "--name",
        name,
        "--label",
        f"{BENCH_LABEL}={run_id}",
        "--network",
        "host",
        "-e",
        "HF_HUB_OFFLINE=1",
        "-v",
        f"{model_dir}:{MODEL_MOUNT}:ro",
        "-v",
        f"{result_dir}:/results",
        "--entrypoint",
        "vllm",
        image,
        *args,
    ]


# -- results -----------------------------------------------------------------

# The fields of vLLM's --save-result JSON this harness reads.
RESULT_KEYS = (
    "completed",
    "total_input_tokens",
    "total_output_tokens",
    "duration",
    "mean_ttft_ms",
    "median_ttft_ms",
    "mean_tpot_ms",
    "median_tpot_ms",
)


@dataclass(frozen=True)
class ClientResult:
    """One `vllm bench serve` result file."""

    completed: int
    failed: int
    input_tokens: int
    output_tokens: int
    duration_s: float
    mean_ttft_ms: float
    median_ttft_ms: float
    mean_tpot_ms: float
    median_tpot_ms: float
    finished_at: float  # epoch seconds the file was written: the end of the measurement


def parse_client_result(data: dict, source: str, finished_at: float) -> ClientResult:
    missing = [k for k in RESULT_KEYS if k not in data]
    if missing:
        raise ValueError(f"{source}: not a `vllm bench serve` result, missing {', '.join(missing)}")
    completed = int(data["completed"])
    failed = int(data.get("failed", len([e for e in data.get("errors", []) if e])))
    if completed < 1 or float(data["duration"]) <= 0:
        raise ValueError(f"{source}: no request completed (completed={completed})")
    return ClientResult(
        completed=completed,
        failed=failed,
        input_tokens=int(data["total_input_tokens"]),
        output_tokens=int(data["total_output_tokens"]),
        duration_s=float(data["duration"]),
        mean_ttft_ms=float(data["mean_ttft_ms"]),
        median_ttft_ms=float(data["median_ttft_ms"]),
        mean_tpot_ms=float(data["mean_tpot_ms"]),
        median_tpot_ms=float(data["median_tpot_ms"]),
        finished_at=finished_at,
    )


@dataclass(frozen=True)
class Run:
    """One measured repeat of one configuration, every client folded in."""

    config: str
    repeat: int
    clients: int
    completed: int
    failed: int
    input_tokens: int
    output_tokens: int
    window_s: float
    output_tok_s: float
    total_tok_s: float
    request_s: float
    mean_ttft_ms: float
    median_ttft_ms: float
    mean_tpot_ms: float
    median_tpot_ms: float
    load_1m: float  # load average just before the repeat: how quiet the machine was


def weighted(values: list[float], weights: list[int]) -> float:
    return sum(v * w for v, w in zip(values, weights, strict=True)) / sum(weights)


def combine(config: str, repeat: int, results: list[ClientResult], load_1m: float) -> Run:
    """Clients of a multi-instance run -> one run. Throughput is all tokens over the span
    from the first client's start to the last one's end, so start-up skew between clients
    counts against the multi-instance layout, never for it. Latencies are the
    request-weighted means of each client's figure."""
    if not results:
        raise ValueError(f"{config} repeat {repeat}: no client results")
    start = min(r.finished_at - r.duration_s for r in results)
    # Rounded before use, so every rate in the file is the quotient of numbers in the file.
    window = round(max(r.finished_at for r in results) - start, 4)
    out = sum(r.output_tokens for r in results)
    inp = sum(r.input_tokens for r in results)
    done = [r.completed for r in results]
    return Run(
        config=config,
        repeat=repeat,
        clients=len(results),
        completed=sum(done),
        failed=sum(r.failed for r in results),
        input_tokens=inp,
        output_tokens=out,
        window_s=window,
        output_tok_s=round(out / window, 2),
        total_tok_s=round((out + inp) / window, 2),
        request_s=round(sum(done) / window, 3),
        mean_ttft_ms=round(weighted([r.mean_ttft_ms for r in results], done), 2),
        median_ttft_ms=round(weighted([r.median_ttft_ms for r in results], done), 2),
        mean_tpot_ms=round(weighted([r.mean_tpot_ms for r in results], done), 3),
        median_tpot_ms=round(weighted([r.median_tpot_ms for r in results], done), 3),
        load_1m=round(load_1m, 2),
    )


@dataclass(frozen=True)
class Summary:
    """A configuration over its repeats: medians, and min/max as the spread."""

    config: str
    shape: str
    repeats: int
    output_tok_s: float
    output_min: float
    output_max: float
    total_tok_s: float
    ttft_ms: float
    ttft_min: float
    ttft_max: float
    tpot_ms: float
    tpot_min: float
    tpot_max: float
    ratio: float | None  # output_tok_s / stock's output_tok_s (both as written)


def summarize(runs: list[Run], configs: list[Configuration]) -> list[Summary]:
    summaries = []
    for config in configs:
        mine = [r for r in runs if r.config == config.name]
        if not mine:
            continue
        out = [r.output_tok_s for r in mine]
        ttft = [r.median_ttft_ms for r in mine]
        tpot = [r.median_tpot_ms for r in mine]
        summaries.append(
            Summary(
                config=config.name,
                shape=config.shape,
                repeats=len(mine),
                output_tok_s=round(statistics.median(out), 1),
                output_min=round(min(out), 1),
                output_max=round(max(out), 1),
                total_tok_s=round(statistics.median(r.total_tok_s for r in mine), 1),
                ttft_ms=round(statistics.median(ttft), 2),
                ttft_min=round(min(ttft), 2),
                ttft_max=round(max(ttft), 2),
                tpot_ms=round(statistics.median(tpot), 3),
                tpot_min=round(min(tpot), 3),
                tpot_max=round(max(tpot), 3),
                ratio=None,
            )
        )
    stock = next((s for s in summaries if s.config == STOCK), None)
    if stock is None or stock.output_tok_s <= 0:
        return summaries
    return [replace(s, ratio=round(s.output_tok_s / stock.output_tok_s, 3)) for s in summaries]


def verdict(summaries: list[Summary], configs: list[Configuration]) -> dict:
    """Does the planner's auto layout reach the acceptance ratio, and is it the best
    layout of its image the sweep found?"""
    by_name = {s.config: s for s in summaries}
    kinds = {c.name: c for c in configs}
    planner = by_name.get(PLANNER)
    same_image = (
        [
            s
            for s in summaries
            if kinds[s.config].kind == "plan" and kinds[s.config].target == kinds[PLANNER].target
        ]
        if planner
        else []
    )
    best = max(same_image, key=lambda s: s.output_tok_s, default=None)
    overall = max(summaries, key=lambda s: s.output_tok_s, default=None)
    return {
        "planner": PLANNER,
        "planner_ratio": planner.ratio if planner else None,
        "acceptance_ratio": ACCEPTANCE_RATIO,
        "meets_acceptance": bool(planner and planner.ratio and planner.ratio >= ACCEPTANCE_RATIO),
        "best_layout": best.config if best else None,
        "planner_is_best_layout": bool(best and planner and best.config == PLANNER),
        "best_overall": overall.config if overall else None,
    }


# -- writers -----------------------------------------------------------------


def runs_csv(runs: list[Run]) -> str:
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=[f.name for f in fields(Run)], lineterminator="\n")
    writer.writeheader()
    for r in runs:
        writer.writerow(asdict(r))
    return buf.getvalue()


def summary_csv(summaries: list[Summary]) -> str:
    buf = io.StringIO()
    names = [f.name for f in fields(Summary)]
    writer = csv.DictWriter(buf, fieldnames=names, lineterminator="\n")
    writer.writeheader()
    for s in summaries:
        row = asdict(s)
        row["ratio"] = "" if s.ratio is None else s.ratio
        writer.writerow(row)
    return buf.getvalue()


def amd_table(summaries: list[Summary], model: str) -> str:
    """AMD's ZenDNN table: a row per model, output tok/s per configuration, then the
    ratio of the planner's layout to the baseline."""
    names = [s.config for s in summaries]
    planner = next((s for s in summaries if s.config == PLANNER), None)
    head = ["Model", *names, f"{PLANNER}vs{STOCK}"]
    row = [model, *(f"{s.output_tok_s:g}" for s in summaries)]
    row.append(f"{planner.ratio:.3f}" if planner and planner.ratio is not None else "n/a")
    return "\n".join(
        ["| " + " | ".join(head) + " |", "|" + "---|" * len(head), "| " + " | ".join(row) + " |"]
    )


def detail_table(summaries: list[Summary], configs: list[Configuration]) -> str:
    by_name = {c.name: c for c in configs}
    lines = [
        "| configuration | instances | output tok/s (median) | min-max | total tok/s "
        "| TTFT ms | TPOT ms | vs stock |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for s in summaries:
        config = by_name[s.config]
        name = s.config + (f" (= {', '.join(config.same_as)})" if config.same_as else "")
        ratio = f"{s.ratio:.3f}x" if s.ratio is not None else "n/a"
        lines.append(
            f"| {name} | {s.shape} | {s.output_tok_s:g} | {s.output_min:g}-{s.output_max:g} "
            f"| {s.total_tok_s:g} | {s.ttft_ms:g} | {s.tpot_ms:g} | {ratio} |"
        )
    return "\n".join(lines)


def markdown(result: dict) -> str:
    meta = result["meta"]
    summaries = [Summary(**s) for s in result["summary"]]
    configs = configs_from_dicts(result["configurations"])
    w = meta["workload"]
    v = result["verdict"]
    parts = [
        f"# zenvllm bench: {meta['model']} on {meta['host']}",
        "",
        amd_table(summaries, meta["model"]),
        "",
        detail_table(summaries, configs),
        "",
        f"Workload: random {w['input_len']} in / {w['output_len']} out tokens, "
        f"{w['num_prompts']} prompts at concurrency {w['concurrency']} per configuration "
        f"(split over one client per instance), {w['warmup_prompts']} warm-up prompts "
        f"excluded, {w['repeats']} repeat(s); median with min-max over repeats.",
        f"Load average: {meta['load_before']} before, {meta['load_after']} after "
        f"({meta['cpus']} CPUs); wall time {meta['wall_s']:.0f} s.",
        f"Planner ({v['planner']}): {v['planner_ratio']}x stock "
        f"(acceptance {v['acceptance_ratio']}x: {'met' if v['meets_acceptance'] else 'NOT met'});"
        f" best layout of its image: {v['best_layout']}; best overall: {v['best_overall']}.",
    ]
    parts += [f"- {n}" for n in meta.get("notes", [])]
    return "\n".join(parts) + "\n"


def configs_from_dicts(items: list[dict]) -> list[Configuration]:
    out = []
    for d in items:
        servers = tuple(
            Server(**{**s, "docker_args": tuple(s["docker_args"])}) for s in d["servers"]
        )
        out.append(
            Configuration(
                name=d["name"],
                kind=d["kind"],
                summary=d["summary"],
                target=d["target"],
                servers=servers,
                same_as=tuple(d["same_as"]),
            )
        )
    return out


def config_dict(config: Configuration, image: str | None) -> dict:
    d = asdict(config)
    d["shape"] = config.shape
    d["image"] = image
    return d


def result_document(
    meta: dict, configs: list[Configuration], images: dict[str, str], runs: list[Run]
) -> dict:
    summaries = summarize(runs, configs)
    return {
        "meta": meta,
        "configurations": [config_dict(c, images.get(c.target)) for c in configs],
        "runs": [asdict(r) for r in runs],
        "summary": [asdict(s) for s in summaries],
        "verdict": verdict(summaries, configs),
    }


# -- plots -------------------------------------------------------------------


def plot(result: dict, out_dir: Path) -> list[Path]:
    """throughput.png (median bars, min-max whiskers, the 1.3x line) and latency.png."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as err:
        raise UserError(
            f"plots need matplotlib ({err}); pip install 'zenvllm[bench]' or pass --no-plots"
        ) from None

    summaries = [Summary(**s) for s in result["summary"]]
    names = [s.config for s in summaries]
    colors = ["#7f7f7f" if n == STOCK else "#d62728" if n == PLANNER else "#1f77b4" for n in names]
    title = f"{result['meta']['model']} on {result['meta']['host']}"

    fig, ax = plt.subplots(figsize=(max(6, 1.3 * len(names)), 4.5))
    med = [s.output_tok_s for s in summaries]
    err = [
        [m - s.output_min for m, s in zip(med, summaries, strict=True)],
        [s.output_max - m for m, s in zip(med, summaries, strict=True)],
    ]
    ax.bar(names, med, yerr=err, capsize=4, color=colors)
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
    paths = [out_dir / "throughput.png"]
    fig.savefig(paths[0], dpi=110)
    plt.close(fig)

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
    paths.append(out_dir / "latency.png")
    fig.savefig(paths[1], dpi=110)
    plt.close(fig)
    return paths


def write_outputs(result: dict, out_dir: Path, plots: bool = True) -> list[Path]:
    """results.json, runs.csv, summary.csv, table.md and the PNGs into out_dir."""
    runs = [Run(**r) for r in result["runs"]]
    summaries = [Summary(**s) for s in result["summary"]]
    files = {
        "results.json": json.dumps(result, indent=2) + "\n",
        "runs.csv": runs_csv(runs),
        "summary.csv": summary_csv(summaries),
        "table.md": markdown(result),
    }
    written = []
    for name, text in files.items():
        path = out_dir / name
        path.write_text(text)
        written.append(path)
    if plots and summaries:
        written += plot(result, out_dir)
    return written


# -- consistency -------------------------------------------------------------

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def png_size(path: Path) -> tuple[int, int] | None:
    """(width, height) from a PNG's IHDR chunk; None when it is not a PNG."""
    head = path.read_bytes()[:24] if path.is_file() else b""
    if len(head) < 24 or head[:8] != PNG_MAGIC or head[12:16] != b"IHDR":
        return None
    return int.from_bytes(head[16:20], "big"), int.from_bytes(head[20:24], "big")


def same(a: object, b: object) -> bool:
    """A CSV cell against a JSON value."""
    if b is None:
        return a == ""
    if isinstance(b, float | int) and not isinstance(b, bool):
        try:
            return abs(float(a) - float(b)) <= 1e-9 * max(1.0, abs(float(b)))  # type: ignore[arg-type]
        except ValueError:
            return False
    return str(a) == str(b)


def check_outputs(out_dir: Path, expect: list[str] | None = None) -> list[str]:
    """Every way a bench output directory can be incomplete or inconsistent, as messages.

    Empty means: every configuration ran every repeat with the same workload, the
    summary is the median/min/max of the runs, each ratio is the quotient of the
    numbers beside it, the CSVs say what the JSON says, the table shows them, and
    the plots are real PNGs."""
    problems: list[str] = []
    try:
        result = json.loads((out_dir / "results.json").read_text())
    except (OSError, ValueError) as err:
        return [f"results.json: {err}"]
    meta, w = result["meta"], result["meta"]["workload"]
    names = [c["name"] for c in result["configurations"]]
    problems += [f"failed: {f}" for f in meta["failures"]]
    for name in expect or []:
        folded = any(name in c["same_as"] for c in result["configurations"])
        if name not in names and not folded:
            problems.append(f"configuration {name} is missing")
    runs = result["runs"]
    summary = {s["config"]: s for s in result["summary"]}
    for name in names:
        mine = [r for r in runs if r["config"] == name]
        if len(mine) != w["repeats"]:
            problems.append(f"{name}: {len(mine)} runs, expected {w['repeats']} repeats")
        for r in mine:
            if r["failed"] or r["completed"] != w["num_prompts"]:
                problems.append(
                    f"{name} repeat {r['repeat']}: {r['completed']} completed, "
                    f"{r['failed']} failed of {w['num_prompts']}"
                )
            if r["output_tokens"] != w["num_prompts"] * w["output_len"]:
                problems.append(
                    f"{name} repeat {r['repeat']}: {r['output_tokens']} output tokens,"
                    f" expected {w['num_prompts']} x {w['output_len']}"
                )
            rate = r["output_tokens"] / r["window_s"]
            if abs(rate - r["output_tok_s"]) > 0.01 + 1e-4 * rate:
                problems.append(
                    f"{name} repeat {r['repeat']}: output_tok_s {r['output_tok_s']} "
                    f"is not output_tokens / window_s = {rate:.2f}"
                )
        s = summary.get(name)
        if s is None:
            problems.append(f"{name}: no summary row")
            continue
        out = [r["output_tok_s"] for r in mine]
        if out and (s["output_tok_s"], s["output_min"], s["output_max"]) != (
            round(statistics.median(out), 1),
            round(min(out), 1),
            round(max(out), 1),
        ):
            problems.append(f"{name}: summary {s['output_tok_s']} is not the median of {out}")
    stock = summary.get(STOCK)
    if stock is None:
        problems.append("no stock summary: ratios have no baseline")
    else:
        for s in summary.values():
            want = round(s["output_tok_s"] / stock["output_tok_s"], 3)
            if s["ratio"] is None or abs(s["ratio"] - want) > 5e-4:
                problems.append(
                    f"{s['config']}: ratio {s['ratio']} is not "
                    f"{s['output_tok_s']} / {stock['output_tok_s']} = {want}"
                )
    problems += compare_csv(out_dir / "runs.csv", runs, "runs.csv")
    problems += compare_csv(out_dir / "summary.csv", result["summary"], "summary.csv")
    table = (out_dir / "table.md").read_text() if (out_dir / "table.md").is_file() else ""
    for s in summary.values():
        for text in (f"| {s['config']}", f"{s['output_tok_s']:g}", f"{s['ratio']:.3f}x"):
            if s["ratio"] is not None and text not in table:
                problems.append(f"table.md lacks {text!r} for {s['config']}")
    for png in ("throughput.png", "latency.png"):
        size = png_size(out_dir / png)
        if not size or min(size) < 100:
            problems.append(f"{png}: missing or not a PNG image ({size})")
    return problems


def compare_csv(path: Path, rows: list[dict], label: str) -> list[str]:
    try:
        with path.open(newline="") as f:
            got = list(csv.DictReader(f))
    except OSError as err:
        return [f"{label}: {err}"]
    if len(got) != len(rows):
        return [f"{label}: {len(got)} rows, results.json has {len(rows)}"]
    return [
        f"{label} row {i + 1} {key}: {g.get(key)!r} but results.json says {want!r}"
        for i, (g, row) in enumerate(zip(got, rows, strict=True))
        for key, want in row.items()
        if not same(g.get(key), want)
    ]


def main(argv: list[str] | None = None) -> int:
    """`python -m zenvllm.bench DIR [--acceptance]`: check a bench output directory."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m zenvllm.bench", description=main.__doc__)
    parser.add_argument("out", type=Path, help="a `zenvllm bench --out` directory")
    parser.add_argument(
        "--acceptance",
        action="store_true",
        help=f"also require the planner's layout at >= {ACCEPTANCE_RATIO}x stock",
    )
    args = parser.parse_args(argv)
    problems = check_outputs(args.out)
    verdict_ = {}
    if not problems:
        verdict_ = json.loads((args.out / "results.json").read_text())["verdict"]
        if args.acceptance and not verdict_["meets_acceptance"]:
            problems.append(
                f"the planner's layout ({verdict_['planner']}) made {verdict_['planner_ratio']}x "
                f"stock output throughput, under the {ACCEPTANCE_RATIO}x acceptance"
            )
    for p in problems:
        print(f"{args.out}: {p}")
    if not problems:
        print(f"{args.out}: complete and consistent; planner {verdict_['planner_ratio']}x stock")
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
