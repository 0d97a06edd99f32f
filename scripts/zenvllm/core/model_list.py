"""Several models in one request: `models` holds NAME=DIR entries (NAME the name clients
ask for, DIR the model's directory on the host) and `shares` NAME=cores:N or
NAME=weight:W, each read here and refused by value, the same way for `zenvllm plan`'s
flags and the instances role's request. Pure; standard library only.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from zenvllm.core import gate
from zenvllm.core.arguments import NAME, NAME_RULE

ENTRY = "NAME=DIR (e.g. chat=/srv/models/qwen)"
SHARE = "NAME=cores:N or NAME=weight:W (e.g. embed=cores:4, chat=weight:3)"


@dataclass(frozen=True)
class Share:
    """What one model asks of the host: `cores` physical cores, or a `weight`."""

    name: str  # the served model name
    cores: int | None = None
    weight: float | None = None


def entry(text: str) -> tuple[str, str] | None:
    """(NAME, DIR) of one NAME=DIR entry, or None when it is not one."""
    name, eq, directory = text.partition("=")
    bad = any(c in directory for c in ":,\n")
    if eq and NAME.fullmatch(name) and directory.startswith("/") and not bad:
        return name, directory
    return None


def share(text: str) -> Share | None:
    """The Share one NAME=cores:N or NAME=weight:W says, or None when it is not one."""
    name, _, how = text.partition("=")
    kind, _, value = how.partition(":")
    if not NAME.fullmatch(name):
        return None
    if kind == "cores" and value.isdigit() and len(value) <= 6 and int(value) >= 1:
        return Share(name, cores=int(value))
    try:
        weight = float(value) if kind == "weight" else 0.0
    except ValueError:
        return None
    return Share(name, weight=weight) if weight > 0 and math.isfinite(weight) else None


def models_of(entries: tuple[str, ...], where: str) -> list[tuple[str, str]]:
    """Each entry's (NAME, DIR), in order; an InputError naming the first bad one."""
    named = [entry(e) for e in entries]
    for text, pair in zip(entries, named, strict=True):
        if pair is None:
            raise gate.InputError(
                f"{where}: models entry {gate.shown(text)} is not {ENTRY}, NAME being {NAME_RULE} "
                "and DIR an absolute path without ':' or ','"
            )
    names = [pair[0] for pair in named if pair]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise gate.InputError(f"{where}: two models are named {twice[0]}; give each its own NAME")
    return [pair for pair in named if pair]


def shares_of(texts: tuple[str, ...], names: list[str], where: str) -> list[Share]:
    """One Share per model in `names` order: the one asked, or the default (by weight)."""
    asked = {}
    for text in texts:
        one = share(text)
        if one is None:
            raise gate.InputError(f"{where}: share {gate.shown(text)} is not {SHARE}")
        if one.name not in names:
            raise gate.InputError(
                f"{where}: share {gate.shown(text)} names {one.name}, which no models entry "
                f"does (models: {', '.join(names) or 'none'}); name one of them"
            )
        asked[one.name] = one
    return [asked.get(n, Share(n)) for n in names]


def checked(entries: tuple[str, ...], texts: tuple[str, ...], where: str) -> None:
    """Refuse bad entries and shares, and shares without several models to divide."""
    names = [n for n, _ in models_of(entries, where)]
    if texts and len(names) < 2:
        raise gate.InputError(
            f"{where}: shares divide the host between several models, and models names "
            f"{len(names)}; give two or more NAME=DIR entries, or no shares"
        )
    shares_of(texts, names, where)
