"""What passes between the one bench and a model kind (bench/kinds.py), pure types.

A kind prepares a run from the request (Prepared: the host, the configurations, its
workload); the command makes the run's Settings; for each configuration the one runner
(bench/runner.py) starts the servers and hands the kind a Stage (the settings, the
run's raw directory and clients, the configuration's endpoints, how its servers
started); the kind measures and hands back what it Measured (its raw rows, what ran,
the failures that leave its runs standing, its answer to one probe).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic

from zenvllm.bench import catalogue
from zenvllm.bench.clients import ClientPool
from zenvllm.bench.gateway import Deployment
from zenvllm.bench.layouts import Configuration
from zenvllm.bench.order import Order, Visit
from zenvllm.bench.roofline import Bandwidth
from zenvllm.bench.workloads import AnyWorkload
from zenvllm.core.host import Host


@dataclass(frozen=True)
class Prepared(Generic[AnyWorkload]):
    """A kind's run before the images are chosen: on this host, at this served length,
    its workload, its configurations and the notes on them."""

    host: Host
    max_model_len: int
    workload: AnyWorkload
    configs: list[Configuration]
    notes: list[str]
    bandwidth: Bandwidth | None = None  # the roofline's (a generating model's), if measured
    pooling: str = ""  # a pooling model's sentence-transformers pooling (infinity's ONNX)
    dtypes: tuple[str, str] = (catalogue.STOCK_DTYPE, "bfloat16")  # stock's, the planner's
    # A configuration's quality format where its weights are quantized (core/quality.py's
    # BOUNDS); any other is judged as the dtype its first server serves in.
    formats: dict[str, str] = field(default_factory=dict)
    # The performance model's inputs the document records (bench/predicted.py's meta_of).
    performance: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Settings(Generic[AnyWorkload]):
    """One run of the bench, whatever the model's kind: what its servers and clients need
    and what its results say of it."""

    model_dir: Path
    model_name: str
    images: dict[str, str]  # target -> image tag
    workload: AnyWorkload
    max_model_len: int
    out_dir: Path
    gateway_url: str | None = None  # an existing deployment's gateway
    gateway_deploy: Deployment | None = None  # or one deploy.yml makes for this run
    start_timeout_s: float = 900.0
    client_timeout_s: float = 1800.0
    plots: bool = True
    host_label: str = ""
    cpu: str = ""  # the CPU's name, generation, family and model
    notes: list[str] = field(default_factory=list)
    # For the roofline: what a decode step reads, and what a core can stream (None:
    # unknown, no roofline).
    weight_bytes: int = 0
    bandwidth: Bandwidth | None = None
    host_cores: int = 0
    gguf: dict[str, Path] = field(default_factory=dict)  # llama.cpp peers: GGUF type -> file
    onnx_dir: Path | None = None  # the infinity peer's ONNX directory (None: no such peer)
    infinity_version: str = ""
    # vLLM's compile cache for every vLLM server ("" = none: each start compiles).
    compile_cache_dir: str = ""
    serve_env: dict[str, str] = field(default_factory=dict)  # over the planner's env
    # What stock and the planner's layouts serve in (the guard compares runs where they match).
    stock_dtype: str = catalogue.STOCK_DTYPE
    plan_dtype: str = "bfloat16"
    restart: bool = True  # restart the planner's layout once: its warm time to ready
    ordering: Order = field(default_factory=Order)  # blocks, or rounds (bench/order.py)
    quality: bool = True  # score each configuration against the float32 reference
    formats: dict[str, str] = field(default_factory=dict)  # Prepared.formats
    performance: dict[str, Any] = field(default_factory=dict)  # Prepared.performance


@dataclass(frozen=True)
class Stage(Generic[AnyWorkload]):
    """One configuration, its servers ready, handed to its kind to measure."""

    settings: Settings[AnyWorkload]
    raw: Path  # the run's raw files: client results and logs
    pool: ClientPool  # the run's clients, one per endpoint index
    endpoints: list[tuple[str, str]]  # (base URL, served model name), a client each
    started: dict[str, Any]  # how its servers started (bench/servers.py); {}: none
    tag: str  # "[i/n] name", before each line said of it
    visit: Visit  # the repeats this start of its servers measures, and if it is the last


@dataclass(frozen=True)
class Measured:
    """What a kind measured of one configuration."""

    rows: dict[str, list[dict[str, Any]]]  # the document's raw rows by key (runs, batch1)
    facts: dict[str, Any]  # what ran and how it started, in its configurations entry
    failures: list[str] = field(default_factory=list)  # its runs stand regardless
    probe: tuple[float, ...] = ()  # its answer to one fixed request (an embedding)
