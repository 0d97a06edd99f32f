"""A deployment's revisions on one host, as Helm keeps a release's: each rollout that
changes what runs is a numbered revision holding everything needed to run it again
(the plan: every container's arguments and environment; the image by tag and ID; the
models' directories). A rollout writes its
revision `pending` before it replaces anything and marks it `deployed` once every
instance is healthy, so a rollout that failed half-way stays on record as what it was.

A rollback is a rollout of an older revision's plan: by default the last one that was
deployed before the newest record (the newest deployed one when the newest record is
a failed attempt), or a number asked for. Pure: runtime/revisions.py reads and writes
the files.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from zenvllm.core.errors import UserError

PENDING, DEPLOYED = "pending", "deployed"
KEEP = 5  # revisions kept per host and deployment: the newest, and four to go back to
ROOT = "/var/lib/zenvllm/revisions"  # by default each deployment's are in ROOT/DEPLOYMENT
MARK_FILE = ".zenvllm-output"


@dataclass(frozen=True)
class Revision:
    number: int
    status: str  # PENDING or DEPLOYED
    deployed_at: str  # ISO 8601, UTC, when the rollout began
    zenvllm: str  # the version that planned and rolled it out
    plan: Mapping[str, Any]  # `zenvllm plan --json` as rolled out
    image: str = ""  # the tag the containers run
    image_id: str = ""  # what the tag named then
    model_dirs: tuple[str, ...] = ()  # each model's directory on the host
    rollback_of: int = 0  # the revision whose plan this one rolled back to, else 0

    def summary(self) -> str:
        image = f"{self.image}@{self.image_id.removeprefix('sha256:')[:12]}"
        models = ", ".join(m["served_name"] for m in self.plan.get("models", [])) or "none"
        back = f", a rollback to revision {self.rollback_of}" if self.rollback_of else ""
        return (
            f"revision {self.number} ({self.status}{back}; {self.deployed_at}): "
            f"image {image}, model {models}, zenvllm {self.zenvllm}"
        )


def newest(revisions: Sequence[Revision]) -> Revision | None:
    return max(revisions, key=lambda r: r.number, default=None)


def serving(revisions: Sequence[Revision]) -> Revision | None:
    """The newest revision that was deployed whole: what the host runs, unless a
    rollout after it failed half-way."""
    return newest([r for r in revisions if r.status == DEPLOYED])


def to_record(revisions: Sequence[Revision], plan: Mapping[str, Any]) -> int:
    """The number a rollout of `plan` records, or 0 when the newest record is this plan,
    deployed: a rerun that changes nothing records nothing."""
    last = newest(revisions)
    if last is not None and last.status == DEPLOYED and dict(last.plan) == dict(plan):
        return 0
    return last.number + 1 if last else 1


def rollback_target(revisions: Sequence[Revision], asked: int = 0) -> Revision:
    """The revision a rollback rolls out: `asked` (a number), or the last deployed one
    before the newest record (the newest deployed one if that record failed)."""
    if asked:
        found = [r for r in revisions if r.number == asked]
        if not found:
            kept = ", ".join(str(r.number) for r in sorted(revisions, key=lambda r: r.number))
            raise UserError(
                f"revision {asked} is not kept on this host (kept: {kept or 'none'}); "
                "ask for one of them, or for the previous revision"
            )
        return found[0]
    last = newest(revisions)
    before = [r for r in revisions if r.status == DEPLOYED and last and r.number < last.number]
    if last is not None and last.status != DEPLOYED and (ok := serving(revisions)) is not None:
        return ok  # the newest record is a failed rollout: back to what served before it
    if not before:
        raise UserError(
            "there is no earlier deployed revision to roll back to on this host "
            f"({len(revisions)} kept); deploy a revision first, or ask for one by its number"
        )
    return max(before, key=lambda r: r.number)


def to_prune(revisions: Sequence[Revision], keep: int = KEEP) -> list[int]:
    """The numbers beyond the newest `keep`, oldest first; the serving one is never among
    them, so a host can always go back to what runs."""
    ordered = sorted(revisions, key=lambda r: r.number, reverse=True)
    live = serving(revisions)
    return sorted(r.number for r in ordered[keep:] if live is None or r.number != live.number)
