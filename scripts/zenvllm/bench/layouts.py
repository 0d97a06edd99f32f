"""The benchmark's configurations: each entry of a model kind's catalogue
(bench/catalogue.py) resolved on the host.

Pure, like the workload they run (bench/workloads.py): no processes and no network
here (bench/servers.py is the side-effect edge). A catalogue entry (Spec) meets the
host's plan and becomes a Configuration of servers, those that come out alike
folded into one; bench/results.py folds vLLM's result files into runs and
summaries, bench/report.py writes the files, bench/check.py checks them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from zenvllm.bench.catalogue import (
    QUICK_CONFIGS,
    RANK_FLAGS,
    REFERENCE_KIND,
    SPECS,
    STOCK,
    STOCK_DTYPE,
    STOCK_KV_GIB,
    STOCK_SHM,
    Spec,
)
from zenvllm.core.container import placement
from zenvllm.core.cores import usable_cores
from zenvllm.core.dtype import served_model
from zenvllm.core.errors import PlanError, UserError
from zenvllm.core.host import Host
from zenvllm.core.model import POOLING, Model
from zenvllm.core.plan import Instance, Plan, Policy, make_plan
from zenvllm.core.topology import format_cpu_list, parse_cpu_list

MODEL_MOUNT = "/model"


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
    serve_args: tuple[str, ...] = ()  # beyond the model, dtype, length and port
    # vLLM's own command's --dtype (stock, the dp/tp/pp peers); "" on a planner layout's
    # server, whose plan decides (the dtype its CPU computes natively).
    dtype: str = ""
    gguf: str = ""  # llamacpp: the GGUF type of the weights it serves
    model_dir: str = ""  # another copy of the weights (--weights NAME=DIR); "": --model's
    # The bytes a decode step reads where they are not --model's as stored (another copy
    # of the weights, or another dtype: float32 doubles bf16's); 0: --model's.
    weight_bytes: int = 0
    speculation: str = ""  # a planner layout's, over the run's settings ("": the plan's)
    # A planner layout's instance, whose container (core.container) the bench runs.
    instance: Instance | None = field(default=None, compare=False, repr=False)

    @property
    def served_dtype(self) -> str:
        """The dtype vLLM serves in: its plan's on a planner layout, else its own --dtype."""
        return self.instance.dtype if self.instance else self.dtype

    def to_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__ if k != "instance"}


@dataclass(frozen=True)
class Configuration:
    name: str
    kind: str
    summary: str
    target: str
    servers: tuple[Server, ...] = ()
    same_as: tuple[str, ...] = ()  # catalogue entries identical to this one on this host
    serve_env: tuple[tuple[str, str], ...] = ()  # the spec's env over the plan's (Spec.env)

    @property
    def shape(self) -> str:
        """'2 x 1 core' style description of the instances."""
        if self.kind == "gateway":
            return "gateway"
        if self.kind in ("stock", REFERENCE_KIND):  # vLLM's own command on every CPU
            return "1 x all CPUs"
        if self.kind in RANK_FLAGS:
            ranks = self.servers[0].omp_bind.split("|")
            return f"1 x {len(ranks)} {self.kind.upper()} ranks"
        if self.kind == "llamacpp":
            threads = len(cpu_ids(self.servers[0].omp_bind))
            return f"1 x {threads} threads ({self.servers[0].gguf})"
        sizes = sorted({len(cpu_ids(s.cpus)) for s in self.servers})
        cores = "/".join(str(n) for n in sizes)
        return f"{len(self.servers)} x {cores} CPU{'s' if sizes != [1] else ''}"

    def signature(self) -> tuple[Any, ...]:
        """What makes two configurations the same run: image and every container's placement."""
        return (
            self.kind,
            self.target,
            tuple(
                sorted(
                    (
                        s.cpus,
                        s.omp_bind,
                        s.served_dtype,
                        s.mems,
                        s.kv_cache_gib,
                        s.gguf,
                        s.model_dir,
                        s.speculation,
                        tuple(sorted(s.env.items())),
                    )
                    for s in self.servers
                )
            ),
        )


def cpu_ids(text: str) -> list[int]:
    return list(parse_cpu_list(text)) if text != "all" else []


def parse_configs(
    text: str | None,
    quick: bool,
    specs: Mapping[str, Spec] = SPECS,
    unknown_is: str = "unknown configuration {!r}",
) -> list[str]:
    """--configs' names, each once, from a model kind's catalogue (`specs`; --quick's
    few of a generating model's); stock among them."""
    if not text:
        return list(QUICK_CONFIGS if quick else specs)
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in specs]
    if unknown:
        raise UserError(
            f"--configs: {unknown_is.format(unknown[0])}; choose from {', '.join(specs)}"
        )
    if STOCK not in names:
        raise UserError(f"--configs {text}: include {STOCK!r}, the baseline every ratio divides by")
    return list(dict.fromkeys(names))


def stock_server(port: int, dtype: str = STOCK_DTYPE) -> Server:
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
        dtype=dtype,
    )


def servers_of(plan: Plan) -> tuple[Server, ...]:
    return tuple(
        Server(
            name=i.name,
            port=i.port,
            cpus=format_cpu_list(i.cpus),
            omp_bind=i.omp_threads_bind,
            mems=format_cpu_list(i.mems),
            kv_cache_gib=i.kv_cache_gib,
            env=dict(i.env),
            docker_args=tuple(i.docker_args),
            instance=i,
        )
        for i in plan.instances
    )


def in_dtype(server: Server, model: Model) -> Server:
    """The vLLM server with the bytes a decode step reads in the dtype it serves, where
    they are not `model`'s as stored: the roofline counts what is streamed."""
    dtype = server.served_dtype
    served = served_model(model, dtype).weight_bytes if dtype else model.weight_bytes
    return server if served == model.weight_bytes else replace(server, weight_bytes=served)


def with_env(server: Server, env: dict[str, str]) -> Server:
    """A planner server with env over its planned one (its binding included)."""
    if not env:
        return server
    bind = env.get("VLLM_CPU_OMP_THREADS_BIND", server.omp_bind)
    return replace(server, omp_bind=bind, env={**server.env, **env})


def ranks_server(plan: Plan, port: int, kind: str) -> Server:
    """vLLM's own parallel (`kind`: RANK_FLAGS) over the plan's slices: one container on
    all of them, one rank per slice, each rank's OpenMP threads on its slice
    (VLLM_CPU_OMP_THREADS_BIND's "|" form) and its KV cache as planned (vLLM sizes the
    KV cache per rank); the container gets the slices' memory and shm."""
    first = plan.instances[0]
    # One container over every slice: placement() of their union, as for any instance.
    union = replace(
        first,
        cpus=tuple(sorted({c for i in plan.instances for c in i.cpus})),
        mems=tuple(sorted({m for i in plan.instances for m in i.mems})),
        shm_size_mib=sum(i.shm_size_mib for i in plan.instances),
        memory_limit_mib=sum(i.memory_limit_mib for i in plan.instances),
    )
    bind = "|".join(i.omp_threads_bind for i in plan.instances)
    kv = min(i.kv_cache_gib for i in plan.instances)
    env = {**first.env, "VLLM_CPU_KVCACHE_SPACE": str(kv), "VLLM_CPU_OMP_THREADS_BIND": bind}
    env.pop("ZENVLLM_PLAN", None)  # vLLM's own command: no launcher reads it
    return Server(
        name=f"zenvllm-bench-{kind}-{port}",
        port=port,
        cpus=format_cpu_list(union.cpus),
        omp_bind=bind,
        mems=format_cpu_list(union.mems),
        kv_cache_gib=kv,
        env=env,
        docker_args=tuple(placement(union)),
        serve_args=(RANK_FLAGS[kind], str(len(plan.instances))),
        dtype=STOCK_DTYPE,
    )


def peer_server(
    host: Host, kind: str, port: int, serve_args: tuple[str, ...], **more: Any
) -> Server:
    """A peer's server (its `kind`: llamacpp, infinity) on every usable CPU, its memory on
    their nodes, no KV cache of vLLM's; `more`: Server fields over that."""
    cores = usable_cores(host)
    cpus = format_cpu_list(sorted(c for ids in cores.values() for core in ids for c in core))
    server = Server(
        name=f"zenvllm-bench-{kind}-{port}",
        port=port,
        cpus=cpus,
        omp_bind=cpus,
        mems=format_cpu_list(sorted(cores)),
        kv_cache_gib=0,  # llama.cpp sizes its KV cache from -c; infinity has none
        env={},
        docker_args=(f"--cpuset-cpus={cpus}",),
        serve_args=serve_args,
    )
    return replace(server, **more)


def llamacpp_server(host: Host, spec: Spec, port: int) -> Server:
    """llama.cpp's server as its docs tune it for a CPU: one thread per physical core
    (SMT siblings slow ggml's matmuls down), on every usable core; across NUMA nodes
    `--numa distribute` spreads threads and pages evenly over them. Slots and context
    follow the workload (launch.llamacpp_launch)."""
    cores = usable_cores(host)
    one_per_core = [core[0] for ids in cores.values() for core in ids]
    threads = str(len(one_per_core))
    numa = ("--numa", "distribute") if len(cores) > 1 else ()
    # llama.cpp 0.3.36 repacks Q8_0 weights for AMX where the CPU has it, then dies in
    # ggml_backend_amx_mul_mat at the first matmul (SIGSEGV, seen on a KVM Xeon with
    # AMX); without repacking it serves with its AVX-512 kernels.
    broken_amx = ("--no-repack",) if spec.gguf != "bf16" and "amx_int8" in host.flags else ()
    args = ("--threads", threads, "--threads-batch", threads, *numa, *broken_amx)
    # A thread per core (llama.cpp floats them).
    return peer_server(
        host, "llamacpp", port, args, omp_bind=format_cpu_list(one_per_core), gguf=spec.gguf
    )


# infinity's --batch-size default: the most inputs it runs in one forward pass.
INFINITY_BATCH = 32


def infinity_server(host: Host, port: int, pooling: str) -> Server:
    """infinity-emb on every usable CPU: ONNX Runtime sizes its thread pool by the cores
    it finds (infinity has no thread option); batches of up to INFINITY_BATCH inputs (its
    default); `pooling` as the model's sentence-transformers Pooling module says (its
    ONNX engine would take the CLS token otherwise); token counts by its tokenizer
    (--lengths-via-tokenize; by default it reports characters), so tokens/s compares."""
    args = ("--engine", "optimum", "--device", "cpu", "--batch-size", str(INFINITY_BATCH))
    return peer_server(
        host, "infinity", port, (*args, "--pooling-method", pooling, "--lengths-via-tokenize")
    )


def policy_of(spec: Spec, host: Host, base_port: int, max_model_len: int, base: Policy) -> Policy:
    """The spec's policy over `base` (the host's calibrated figures, if any)."""
    instances = spec.instances
    nodes = len(usable_cores(host))  # the nodes the planner can place on
    if instances in ("per-node", "two-per-node"):
        instances = nodes * (2 if instances == "two-per-node" else 1)
    elif instances == "ranks":  # a split needs two ranks at least
        instances = nodes if nodes > 1 else 2
    return replace(
        base,
        instances=instances,  # type: ignore[arg-type]
        target=spec.target,
        layout=spec.layout,
        dtype=spec.dtype or base.dtype,
        speculation=spec.speculation or base.speculation,
        base_port=base_port,
        max_model_len=max_model_len,
        name_prefix=f"zenvllm-bench-{base_port}",  # the port keeps concurrent runs apart
    )


@dataclass(frozen=True)
class Weights:
    """Another copy of --model's weights (INT8, INT4...), served by each planner layout
    of vLLM's image among --configs beside the bf16 one: `<layout>-<name>`."""

    name: str
    path: str
    model: Model


def weights_configs(
    copies: tuple[Weights, ...],
    layouts: list[str],
    host: Host,
    base_port: int,
    max_model_len: int,
    base: Policy,
) -> tuple[list[Configuration], list[str]]:
    """Each layout planned for each copy (fewer bytes may take fewer cores), those that
    come out alike measured once."""
    configs: list[Configuration] = []
    notes: list[str] = []
    for w, name in ((w, n) for w in copies for n in layouts):
        spec = SPECS[name]
        try:
            plan = make_plan(host, w.model, policy_of(spec, host, base_port, max_model_len, base))
        except PlanError as err:
            notes.append(f"{name}-{w.name}: skipped on this host: {err}")
            continue
        label = w.model.quantization.label if w.model.quantization else "unquantized"
        servers = tuple(
            in_dtype(replace(s, model_dir=w.path, weight_bytes=w.model.weight_bytes), w.model)
            for s in servers_of(plan)
        )
        summary = f"{spec.summary}, on {w.model.name} ({label})"
        config = Configuration(f"{name}-{w.name}", "plan", summary, spec.target, servers)
        twin = next((c for c in configs if c.signature() == config.signature()), None)
        if twin is not None:
            configs[configs.index(twin)] = replace(twin, same_as=(*twin.same_as, config.name))
            notes.append(f"{config.name}: identical to {twin.name} on this host; measured once")
            continue
        configs.append(config)
    return configs, notes


def planned_config(spec: Spec, plan: Plan, model: Model, base_port: int) -> Configuration:
    """A configuration of the planner's (kind plan) or of vLLM's own ranks over its slices."""
    servers = (
        (ranks_server(plan, base_port, spec.kind),)
        if spec.kind in RANK_FLAGS
        else tuple(
            replace(with_env(s, dict(spec.env)), speculation=spec.speculation)
            for s in servers_of(plan)
        )
    )
    return Configuration(
        spec.name,
        spec.kind,
        spec.summary,
        spec.target,
        tuple(in_dtype(s, model) for s in servers),
        serve_env=spec.env,
    )


def config_of(
    spec: Spec,
    host: Host,
    model: Model,
    base_port: int,
    max_model_len: int,
    base: Policy,
    stock_dtype: str,
    pooling: str,
) -> Configuration:
    """One catalogue entry on this host (PlanError: the planner cannot place it). Stock
    names the model's runner when it pools, as vLLM's pooling docs run it."""
    if spec.kind == "stock":
        server = in_dtype(stock_server(base_port, stock_dtype), model)
        if model.runner == POOLING:
            server = replace(server, serve_args=("--runner", POOLING))
        return Configuration(spec.name, spec.kind, spec.summary, spec.target, (server,))
    if spec.kind == "gateway":
        return Configuration(spec.name, spec.kind, spec.summary, spec.target)
    if spec.kind in ("llamacpp", "infinity"):
        peer = (
            llamacpp_server(host, spec, base_port)
            if spec.kind == "llamacpp"
            else infinity_server(host, base_port, pooling)
        )
        return Configuration(spec.name, spec.kind, spec.summary, spec.target, (peer,))
    policy = policy_of(spec, host, base_port, max_model_len, base)
    return planned_config(spec, make_plan(host, model, policy), model, base_port)


def resolve(
    names: list[str],
    host: Host,
    model: Model,
    base_port: int,
    max_model_len: int,
    base: Policy | None = None,
    copies: tuple[Weights, ...] = (),
    stock_dtype: str = STOCK_DTYPE,
    specs: Mapping[str, Spec] = SPECS,
    pooling: str = "",
) -> tuple[list[Configuration], list[str]]:
    """Catalogue names (of `specs`, the model kind's) -> runnable configurations on this
    host, duplicates folded, then the planner's layout for each other copy of the
    weights. `pooling`: a pooling model's sentence-transformers pooling, for infinity.

    Returns the configurations and notes (what was folded or skipped, and why)."""
    configs: list[Configuration] = []
    notes: list[str] = []
    policy = base or Policy()
    for name in sorted(names, key=list(specs).index):  # the planner's own first
        try:
            config = config_of(
                specs[name], host, model, base_port, max_model_len, policy, stock_dtype, pooling
            )
        except PlanError as err:
            notes.append(f"{name}: skipped on this host: {err}")
            continue
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
    planned = [n for n in SPECS if n in names and SPECS[n].kind == "plan"]
    # The auto one's image, as deployed (speculation is measured on --model's weights).
    planned = [n for n in planned if SPECS[n].target == "vllm-openai" and not SPECS[n].speculation]
    more, more_notes = weights_configs(copies, planned, host, base_port, max_model_len, policy)
    return [*configs, *more], [*notes, *more_notes]
