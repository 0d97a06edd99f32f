"""What every bench's results say of their run (the generation bench's and the embedding
bench's alike): the run, the host, the model, the workload, the load and wall time."""

from __future__ import annotations

import os
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any, Protocol


class RunSettings(Protocol):
    """What run_meta reads (read-only): this bench's Settings and the embedding bench's."""

    @property
    def host_label(self) -> str: ...
    @property
    def model_name(self) -> str: ...
    @property
    def model_dir(self) -> Path: ...
    @property
    def images(self) -> dict[str, str]: ...
    @property
    def max_model_len(self) -> int: ...
    @property
    def workload(self) -> Any: ...  # a dataclass: Workload or EmbedWorkload
    @property
    def notes(self) -> list[str]: ...


def run_meta(
    settings: RunSettings,
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
