"""The benchmark's `docker run` lines, as argv: servers and `vllm bench serve` clients
(their arguments for a generating model and for a pooling one).

Pure (runner executes them). Stock runs vLLM's CPU guide's command; a planner
layout runs its instance's container from `core.container`, as a deployment does.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path

from zenvllm.bench import backend
from zenvllm.bench.layouts import MODEL_MOUNT, Server
from zenvllm.bench.workloads import PERCENTILES, BatchShare, Workload
from zenvllm.core import compile_cache
from zenvllm.core.container import Container, container_of
from zenvllm.core.request import Request
from zenvllm.deploy import data

# The guide's example: lets vLLM bind memory (get_mempolicy, migrate_pages).
STOCK_SECURITY = ("--cap-add", "SYS_NICE", "--security-opt", "seccomp=unconfined")
# The planner's layouts run the container a deployment runs, its seccomp profile too.
SECCOMP_PROFILE = data.SECCOMP_PROFILE

BENCH_LABEL = "io.zenvllm.bench"
GGUF_MOUNT = "/gguf"
ONNX_MOUNT = "/model"  # where bench/to_onnx.py exports: infinity finds its optimised file there


@dataclass(frozen=True)
class Launch:
    """How the bench starts one server: its `docker run` argv, the files (path -> text)
    to write before it runs, and the directories to make for the container's user."""

    argv: list[str]
    files: dict[str, str]
    dirs: tuple[str, ...] = field(default=())


def container_settings(
    image: str,
    model_dir: Path,
    max_model_len: int,
    eager: bool,
    env_dir: Path,
    *,
    profile_dir: Path | None = None,
    compile_cache_dir: str = "",
    extra_env: dict[str, str] | None = None,
    target: str = "vllm-openai",
) -> Request:
    """A deployment's settings for a bench run: the same image, model and security, its
    compile cache; plus vLLM's profiler (idle until asked) writing to `profile_dir`."""
    profiling = backend.serve_args() if profile_dir else []
    return Request(
        deployment="zenvllm-bench",
        target=target,  # its containers' zenvllm.target label
        image=image,
        model_dir=str(model_dir),
        container_model_dir=MODEL_MOUNT,
        served_model_name=MODEL_MOUNT,  # what the clients ask for
        max_model_len=max_model_len,
        serve_args=(*(["--enforce-eager"] if eager else []), *profiling),  # the plan sets --dtype
        seccomp_profile=str(SECCOMP_PROFILE),
        config_dir=str(env_dir),
        supervisor="none",  # the bench stops it, reads its log and removes it
        extra_env=dict(extra_env or {}),
        extra_docker_args=(f"--volume={profile_dir}:{backend.PROFILE_MOUNT}",)
        if profile_dir
        else (),
        compile_cache_dir=compile_cache_dir,
    )


def stock_command(
    server: Server, image: str, model_dir: Path, max_model_len: int, eager: bool
) -> list[str]:
    """vLLM's own command, as its CPU guide runs it (stock, and the vllm-dp peer with its
    --data-parallel-size). `--entrypoint vllm` bypasses the image's launcher, so no
    zenvllm code touches these runs."""
    argv = ["run", "-d", "--name", server.name, "--network", "host", *STOCK_SECURITY]
    argv += [*server.docker_args, "-v", f"{model_dir}:{MODEL_MOUNT}:ro"]
    for key, value in sorted({**server.env, "HF_HUB_OFFLINE": "1"}.items()):
        argv += ["-e", f"{key}={value}"]
    argv += ["--entrypoint", "vllm", image, "serve", MODEL_MOUNT, "--dtype", server.dtype]
    argv += ["--max-model-len", str(max_model_len), "--host", "127.0.0.1"]
    argv += ["--port", str(server.port), *server.serve_args]
    return argv + (["--enforce-eager"] if eager else [])


def with_cache(argv: list[str], root: str, name: str) -> tuple[list[str], str]:
    """Stock's command with a compile cache of its own (when the bench keeps one; with
    compile_cache.env's VLLM_USE_AOT_COMPILE=0, without which vLLM 0.32 cannot load it):
    its start-up changes, not what it serves. The argv, and the directory it mounts."""
    cache = compile_cache.host_dir(root, name, compile_cache.key("", argv, {}))
    extra = ["-v", f"{cache}:{compile_cache.CONTAINER_DIR}"]
    for k, v in sorted(compile_cache.env().items()):
        extra += ["-e", f"{k}={v}"]
    at = argv.index("--entrypoint")
    return [*argv[:at], *extra, *argv[at:]], cache


def server_launch(server: Server, settings: Request, run_id: str) -> Launch:
    """Stock runs the guide's command; a planner layout runs its instance's container,
    exactly as `zenvllm plan --json` gives it to a deployment (launcher, env file,
    least privilege), so the bench measures what deployments run."""
    label = ["--label", f"{BENCH_LABEL}={run_id}"]
    if server.instance is None:
        model_dir = Path(settings.model_dir)
        eager = "--enforce-eager" in settings.serve_args
        argv = stock_command(server, settings.image, model_dir, settings.max_model_len, eager)
        cache = ""
        if settings.compile_cache_dir:
            argv, cache = with_cache(
                argv, settings.compile_cache_dir, server.name.rsplit("-", 1)[0]
            )
        return Launch([argv[0], *label, *argv[1:]], {}, (cache,) if cache else ())
    if server.speculation:
        settings = replace(settings, speculation=server.speculation)
    container: Container = container_of(server.instance, settings)
    argv = container.run_args
    dirs = (container.cache_dir,) if container.cache_dir else ()
    return Launch([argv[0], *label, *argv[1:]], {container.env_file: container.env_text}, dirs)


def llamacpp_launch(
    server: Server, image: str, gguf: Path, max_model_len: int, slots: int, run_id: str
) -> Launch:
    """llama-server as its docs run it: the GGUF file, a slot per request in flight,
    each slot with the served context (-c is shared by the slots), its Prometheus
    counters on (the bench counts generated tokens there), the clients' model name.
    No SSE pings: llama-server sends `:` after 30 s without a token (a long prompt phase)
    and `vllm bench serve` strips the blank line that ends it, so every later message of
    that stream fuses with it and the request fails ("Never received a valid chunk")."""
    argv = ["run", "-d", "--name", server.name, "--network", "host", "--cap-drop", "ALL"]
    argv += ["--security-opt", "no-new-privileges", *server.docker_args]
    argv += ["-v", f"{gguf.parent}:{GGUF_MOUNT}:ro", image, "--model", f"{GGUF_MOUNT}/{gguf.name}"]
    argv += ["--host", "127.0.0.1", "--port", str(server.port), "--alias", MODEL_MOUNT]
    argv += ["--parallel", str(slots), "--ctx-size", str(slots * max_model_len), "--metrics"]
    argv += ["--sse-ping-interval", "-1"]
    return Launch(
        [argv[0], "--label", f"{BENCH_LABEL}={run_id}", *argv[1:], *server.serve_args], {}
    )


def infinity_launch(server: Server, image: str, onnx_dir: Path, run_id: str) -> Launch:
    """infinity-emb's server (layouts.infinity_server's flags) on the model's ONNX
    directory, mounted where it was exported (bench/to_onnx.py), under the clients'
    model name; least privilege, as llama.cpp's server runs."""
    argv = ["run", "-d", "--name", server.name, "--network", "host", "--cap-drop", "ALL"]
    argv += ["--security-opt", "no-new-privileges", *server.docker_args]
    argv += ["--label", f"{BENCH_LABEL}={run_id}", "-v", f"{onnx_dir}:{ONNX_MOUNT}:ro"]
    argv += [image, "v2", "--model-id", ONNX_MOUNT, "--served-model-name", MODEL_MOUNT]
    argv += ["--host", "127.0.0.1", "--port", str(server.port), *server.serve_args]
    return Launch(argv, {})


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


def client_loop_command(
    name: str, image: str, model_dir: Path, result_dir: Path, run_id: str, loop: str
) -> list[str]:
    """`docker run -i` argv for a long-lived client running `loop` (Python source,
    bench/clients.py's CLIENT_LOOP) with client_command's mounts and labels."""
    one_shot = client_command(name, image, model_dir, result_dir, run_id, [])
    at = one_shot.index("--entrypoint")
    return [one_shot[0], "-i", *one_shot[1:at], "--entrypoint", "python", image, "-c", loop]


def client_args(
    base_url: str,
    model: str,
    share: Workload,
    result_dir: str,
    result_name: str,
    llamacpp: bool = False,
) -> list[str]:
    """`vllm bench serve` arguments for one client; --ignore-eos makes every request
    produce exactly output_len tokens, so configurations do the same work.

    For llama-server, each request's inter-token latencies are kept (--save-detailed:
    results.counted_by_server reads them) and each request gets its own connection:
    llama-server closes a connection after a streamed response while announcing
    keep-alive, and the client's pool then writes the next request into the closed
    socket (5 to 8 of 128 requests failed that way here)."""
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
        *(["--save-detailed", "--header", "Connection=close"] if llamacpp else []),
    ]


# vLLM's client for a pooling model: its backend and endpoint for each server kind (both
# are vLLM's own `vllm bench serve` backends; infinity serves /embeddings, without /v1).
EMBEDDING_BACKENDS = {
    "vllm": ("openai-embeddings", "/v1/embeddings"),
    "infinity": ("infinity-embeddings", "/embeddings"),
}


def embedding_args(
    base_url: str, kind: str, share: BatchShare, result_dir: str, result_name: str
) -> list[str]:
    """`vllm bench serve` arguments for one client of a pooling model's server (`kind`:
    vllm or infinity): random inputs of input_len tokens (its random dataset counts the
    tokenizer's special tokens in), `--random-batch-size` inputs per request, every
    request's latency and error kept (--save-detailed)."""
    client_backend, endpoint = EMBEDDING_BACKENDS[kind]
    return [
        "bench",
        "serve",
        "--backend",
        client_backend,
        "--endpoint",
        endpoint,
        "--base-url",
        base_url,
        "--model",
        MODEL_MOUNT,
        "--tokenizer",
        MODEL_MOUNT,
        "--dataset-name",
        "random",
        "--random-input-len",
        str(share.input_len),
        "--random-batch-size",
        str(share.batch),
        "--num-prompts",
        str(share.inputs),
        "--max-concurrency",
        str(share.concurrency),
        "--request-rate",
        "inf",
        "--seed",
        str(share.seed),
        "--percentile-metrics",
        "e2el",
        "--metric-percentiles",
        ",".join(str(p) for p in PERCENTILES),
        "--disable-tqdm",
        "--save-result",
        "--save-detailed",
        "--result-dir",
        result_dir,
        "--result-filename",
        result_name,
    ]
