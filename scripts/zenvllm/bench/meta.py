"""What every bench's results say of their run, whatever the model's kind: the run, the
host, the model, the workload, the load and wall time (a kind adds its own:
bench/kinds.py)."""

from __future__ import annotations

import os
import time
from dataclasses import asdict
from typing import Any

from zenvllm.bench.measuring import Settings
from zenvllm.bench.workloads import AnyWorkload


def run_meta(
    settings: Settings[AnyWorkload],
    run_id: str,
    started: float,
    load_before: tuple[float, float, float],
    failures: list[str],
) -> dict[str, Any]:
    """What every bench's results say of their run: the run, the host, the model, the
    workload, the load and wall time as the runs end."""
    return {
        "run_id": run_id,
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
        "host": settings.host_label,
        "cpus": os.cpu_count(),
        "model": settings.model_name,
        "model_dir": str(settings.model_dir),
        "images": settings.images,
        "max_model_len": settings.max_model_len,
        "workload": asdict(settings.workload),
        "load_before": [round(x, 2) for x in load_before],
        "load_after": [round(x, 2) for x in os.getloadavg()],
        "wall_s": round(time.time() - started, 1),
        "notes": settings.notes,
        "failures": failures,
    }
