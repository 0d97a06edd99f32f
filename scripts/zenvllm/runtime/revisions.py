"""The files of a deployment's revisions on a host (core/revisions.py decides): one
JSON file per revision, N.json, in a directory zenvllm marked, each written whole in one
rename. Standard library only; the engine only to check and restore a rollback's image.
"""

from __future__ import annotations

import json
from dataclasses import asdict, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from zenvllm import __version__
from zenvllm.core import gate, revisions
from zenvllm.core.errors import UserError
from zenvllm.core.revisions import DEPLOYED, PENDING, Revision
from zenvllm.runtime.atomic import write_atomically
from zenvllm.runtime.engine import DOCKER

FIX = "give zenvllm_instances_revisions_dir a directory zenvllm made (or a new path)"
MARK = "zenvllm revisions: one N.json per rollout of this deployment on this host\n"
REVISION_CAP = 16 * gate.MIB  # a plan of hundreds of instances is far below


def marked(directory: Path) -> bool:
    text = gate.read_text(directory / revisions.MARK_FILE, gate.SMALL, FIX, optional=True)
    return text is not None and text == MARK


def on_disk(directory: Path) -> list[Revision]:
    """Every revision kept in the directory; [] when there is none yet."""
    if not directory.exists():
        return []
    if not marked(directory):
        raise UserError(
            f"{directory} exists and zenvllm did not make it (no {MARK.strip()!r}); {FIX}"
        )
    found = []
    for path in sorted(directory.glob("*.json")):
        if not path.stem.isdigit():
            continue
        data = gate.obj(gate.read_json(path, REVISION_CAP, FIX), str(path), FIX)
        found.append(
            Revision(
                number=gate.whole(data.get("number"), f"{path}: number", 1, 10**9, FIX),
                status=gate.text(data.get("status"), f"{path}: status", FIX),
                deployed_at=gate.text(data.get("deployed_at"), f"{path}: deployed_at", FIX),
                zenvllm=gate.text(data.get("zenvllm"), f"{path}: zenvllm", FIX),
                plan=gate.obj(data.get("plan"), f"{path}: plan", FIX),
                image=gate.text(data.get("image", ""), f"{path}: image", FIX),
                image_id=gate.text(data.get("image_id", ""), f"{path}: image_id", FIX),
                model_dirs=tuple(
                    gate.text(d, f"{path}: model_dirs", FIX)
                    for d in gate.items(data.get("model_dirs", []), f"{path}: model_dirs", FIX)
                ),
                rollback_of=gate.whole(
                    data.get("rollback_of", 0), f"{path}: rollback_of", 0, 10**9, FIX
                ),
            )
        )
    return found


def save(directory: Path, revision: Revision) -> None:
    if not directory.exists():
        directory.mkdir(parents=True, mode=0o700)
        write_atomically(directory / revisions.MARK_FILE, MARK)
    write_atomically(directory / f"{revision.number}.json", json.dumps(asdict(revision), indent=1))


def begin(
    directory: Path, plan: dict[str, Any], image: str, image_id: str, model_dirs: list[str]
) -> Revision | None:
    """Record the rollout of `plan`, pending, before anything is replaced; None when the
    newest record is this plan, deployed (a rerun that changes nothing)."""
    kept = on_disk(directory)
    number = revisions.to_record(kept, plan)
    if not number:
        return None
    # The plan of a revision deployed before: a rollback to it, which runs what it ran.
    back = revisions.newest([r for r in kept if r.status == DEPLOYED and dict(r.plan) == plan])
    revision = Revision(
        number,
        PENDING,
        datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        __version__,
        plan,
        back.image if back else image,
        back.image_id if back else image_id,
        back.model_dirs if back else tuple(model_dirs),
        rollback_of=back.number if back else 0,
    )
    save(directory, revision)
    for old in revisions.to_prune([*kept, revision]):
        (directory / f"{old}.json").unlink()
    return revision


def done(directory: Path) -> Revision | None:
    """The newest record marked deployed, if it was pending."""
    last = revisions.newest(on_disk(directory))
    if last is None or last.status == DEPLOYED:
        return None
    deployed = replace(last, status=DEPLOYED)
    save(directory, deployed)
    return deployed


def rollback(directory: Path, asked: int = 0) -> Revision:
    """The revision to roll back to, once its image and models are on this host; its
    image's tag points at its image again when a later build moved it."""
    target = revisions.rollback_target(on_disk(directory), asked)
    if target.image_id and not DOCKER.ok("image", "inspect", target.image_id):
        raise UserError(
            f"revision {target.number}'s image {target.image} ({target.image_id}) is no longer "
            "in this host's engine (removed since); load it again, or roll back to another "
            "revision (zenvllm_rollback=N)"
        )
    for where in map(Path, target.model_dirs):
        if not (where / "config.json").is_file():
            raise UserError(
                f"revision {target.number}'s model at {where} is no longer on this host; put "
                "it back there, or roll back to another revision (zenvllm_rollback=N)"
            )
    if target.image and target.image_id:
        now = DOCKER.words("image", "inspect", "--format", "{{.Id}}", target.image)
        tagged = (
            DOCKER.run("tag", target.image_id, target.image) if now != [target.image_id] else None
        )
        if tagged is not None and tagged.returncode != 0:  # else it would run what the tag names
            raise UserError(
                f"could not point {target.image} back at revision {target.number}'s image "
                f"{target.image_id}: {tagged.stderr.strip()[-500:]}; tag it by hand and run again"
            )
    return target
