"""Serve a model from the image on the path an AVX2-only CPU (AMD EPYC Zen 3) takes, on
any x86 machine, in bf16 and in the dtype the planner chooses there, and time both.

What an AVX2-only CPU changes inside the container, and how each is forced here:
* the launcher and vLLM read /proc/cpuinfo: a Zen 3 view is bind-mounted over it
  (tests/support/cpu.py's fixture), so the launcher plans float32;
* vLLM 0.32 loads its AVX2 kernel library (`_C_AVX2`) when torch reports no AVX-512,
  and picks AMX GEMM and attention kernels when it reports AMX: a .pth file in the
  image's venv makes torch.cpu's capability checks answer False in every Python
  process, vLLM's workers included;
* oneDNN runs at most AVX2 code (ONEDNN_MAX_CPU_ISA=AVX2), so vLLM's bf16 linears fail
  to be created there and fall back to torch, as the Zen 3 log shows; ATen's own kernels
  run their AVX2 builds (ATEN_CPU_CAPABILITY=avx2).
The kernel still offers this machine's other features (AMX tiles, say) to code that
asks for them without these checks; the result is this path, not a Zen 3's timing.

    python tests/support/avx2_path.py --image zenvllm/vllm-openai:0.32.0 --out DIR

Prints and writes DIR/avx2-path.json: per case, seconds from `docker run` to a served
completion, output tokens/s of a fixed load, and whether vLLM logged its torch fallback.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from support import cpu, engine
from support.tiny_model import ensure_tiny_model

# torch.cpu's capability checks vLLM reads (kernel library, AMX GEMM and attention).
CHECKS = ("avx512", "avx512_bf16", "avx512_vnni", "amx_tile", "amx_fp16")
PTH = "import torch.cpu as c; " + "; ".join(f"c._is_{f}_supported = lambda: False" for f in CHECKS)
PTH += "\n"
ENV = {"ONEDNN_MAX_CPU_ISA": "AVX2", "ATEN_CPU_CAPABILITY": "avx2"}
FALLBACK = "Failed to create oneDNN linear, fallback to torch linear"


def site_packages(image: str) -> str:
    code = "import sysconfig; print(sysconfig.get_paths()['purelib'])"
    return engine.python_in(image, code)[0]


def load(port: int, prompts: int, concurrency: int, max_tokens: int) -> tuple[float, int]:
    """Seconds for `prompts` completions of exactly max_tokens, and the tokens made."""
    body = {"model": "/model", "prompt": "The quick brown fox", "max_tokens": max_tokens}
    body |= {"ignore_eos": True, "temperature": 0}
    url = f"http://127.0.0.1:{port}/v1/completions"
    start = time.monotonic()
    with ThreadPoolExecutor(concurrency) as pool:
        replies = list(pool.map(lambda _: engine.http_json(url, body, 900), range(prompts)))
    return time.monotonic() - start, sum(r["usage"]["completion_tokens"] for r in replies)


def case(image: str, model: Path, work: Path, dtype: str | None, args) -> dict:
    view = work / "cpuinfo"
    view.write_text(cpu.fake_cpuinfo("amd-zen3-avx2", len(cpu.this_host().cpus)))
    pth = work / "zz_zenvllm_avx2_path.pth"
    pth.write_text(PTH)
    opts = ("-v", f"{view}:/proc/cpuinfo:ro", "-v", f"{pth}:{args.site}/{pth.name}:ro")
    opts += tuple(a for k, v in ENV.items() for a in ("-e", f"{k}={v}"))
    port = engine.free_port()
    start = time.monotonic()
    extra = ("--dtype", dtype) if dtype else ()
    # Cold each time: the time to ready is one of the figures compared.
    with engine.serve(image, model, port, *extra, run_opts=opts, keep_compiled=False) as name:
        engine.wait_for(lambda: engine.running(name) and ready(port), 1800, "a completion", name)
        ready_s = time.monotonic() - start
        seconds, tokens = load(port, args.prompts, args.concurrency, args.max_tokens)
        log = engine.logs(name)
    served = next((ln for ln in log.splitlines() if "--dtype=" in ln and "exec vllm" in ln), "")
    return {
        "asked": dtype or "(planner)",
        "served": served.split("--dtype=")[1].split()[0] if served else dtype,
        "ready_s": round(ready_s, 1),
        "load_s": round(seconds, 2),
        "output_tok_s": round(tokens / seconds, 2),
        "torch_fallback_logged": FALLBACK in log,
    }


def ready(port: int) -> bool:
    try:
        load(port, 1, 1, 1)
    except OSError:
        return False
    return True


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--image", default="zenvllm/vllm-openai:0.32.0")
    parser.add_argument("--model", type=Path, help="default: the tests' tiny model")
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    args.site = site_packages(args.image)
    model = (args.model or ensure_tiny_model()).resolve()
    results = {"cpu": cpu.this_host().cpu_name, "model": model.name, "cases": []}
    results |= {"workload": vars(args) | {"out": str(args.out), "model": str(model)}}
    with tempfile.TemporaryDirectory() as tmp:
        for dtype in ("bfloat16", None):
            results["cases"].append(case(args.image, model, Path(tmp), dtype, args))
            print(json.dumps(results["cases"][-1]), flush=True)
    bf16, planner = results["cases"]
    results["ready_ratio"] = round(bf16["ready_s"] / planner["ready_s"], 2)
    results["throughput_ratio"] = round(planner["output_tok_s"] / bf16["output_tok_s"], 2)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "avx2-path.json").write_text(json.dumps(results, indent=2) + "\n")
    print(json.dumps({k: results[k] for k in ("ready_ratio", "throughput_ratio")}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
