"""Which points of an earlier call of a study join this call's results file: those of the same settings on the same
machine (a file of others is refused, never overwritten), of this machine's CPU family, whose update ran in this
study's chunks, and measured with the config file's values as they are now (`config_digest`)."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

from parallel_ppo.bench.study_arithmetic import FORMER_CHUNK, other_chunks
from parallel_ppo.bench.study_pages import FAMILIES, GPU_FAMILIES
from parallel_ppo.core.config_yaml import load_yaml
from parallel_ppo.errors import RunDataError


def config_digest(config: str | os.PathLike) -> str:
    """A short digest of the values config file `config` holds (its comments and layout aside). Each point records
    the one it ran with: the study's settings name the file, not what is in it."""
    values = json.dumps(load_yaml(config), sort_keys=True, default=str)
    return hashlib.sha256(values.encode()).hexdigest()[:12]


def other_configs(points: list[dict[str, Any]], digest: str) -> list[str]:
    """The labels of the `points` measured with other values of the config file than `digest` (a point that records
    none, measured before points recorded theirs, is not among them)."""
    return [p["label"] for p in points if p.get("config_digest", digest) != digest]


def flattened(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """`d`'s leaves by dotted key: {"settings": {"seconds": 30.0}} is {"settings.seconds": 30.0}."""
    out: dict[str, Any] = {}
    for key, value in d.items():
        if isinstance(value, dict) and value:
            out.update(flattened(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def differences(data: dict[str, Any], identity: dict[str, Any]) -> list[str]:
    """What differs between a study's results (`data`) and `identity`: `settings.seconds 20.0, not 30.0`."""
    were, now = flattened({k: data.get(k) for k in identity}), flattened(identity)
    return [f"{k} {were.get(k)!r}, not {now.get(k)!r}"
            for k in sorted(set(were) | set(now)) if were.get(k) != now.get(k)]


def earlier_points(path: Path, identity: dict[str, Any], family: str | None = None,
                   microbatch: int = FORMER_CHUNK) -> tuple[list[dict[str, Any]], list[str]]:
    """The points of the study in `path`, measured on this machine with these settings (`identity`), and the labels
    of those dropped: those whose update ran in other chunks than this study's CPU points' `microbatch` or its GPU
    points' whole minibatch (`study_arithmetic.other_chunks`; a failed point is kept). A study of other settings or
    another machine in its place is refused (RunDataError, naming what differs: its points would be lost), as is one
    with points of another CPU family than this machine's `family` (where both are recorded: the model name can be
    one), and a file that is not a study's results."""
    if not path.is_file():
        return [], []
    try:
        data = json.loads(path.read_text())
        points = [p for p in data["points"] if p["family"] in FAMILIES and p["label"] and p["measured_at"]]
        same = {k: data.get(k) for k in identity} == identity
        others = {(p.get("hardware") or {}).get("cpu_family") for p in points} - {None, family} if family else set()
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise RunDataError(f"{path} is not the results of a study ({type(e).__name__}: {e}); move it away") from None
    if not same:
        differ = ", ".join(differences(data, identity))
        raise RunDataError(f"{path} holds a study of other settings or another machine ({differ}): give the same, "
                           "another --results-dir, or move it away")
    if others:
        raise RunDataError(f"{path} holds points measured on CPU family {', '.join(sorted(others))}, not this "
                           f"machine's {family}: another --results-dir, or move it away")
    chunked = other_chunks(points, microbatch, GPU_FAMILIES)
    return [p for p in points if p["label"] not in chunked], chunked
