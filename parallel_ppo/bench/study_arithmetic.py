"""The arithmetic of every point of the many-core study: which points a machine runs, fp32 (unless the user sets
otherwise), and each minibatch's forward and backward passes chunked as a run of the study's config takes them with
nothing measured, the same at every point on the CPU, the whole minibatch at once on a GPU."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from parallel_ppo.core.configure import build_config
from parallel_ppo.envs.batch import env_spaces
from parallel_ppo.errors import ConfigError, ParallelPPOError

FORMER_CHUNK = 64
"""The chunk a point that records none was measured in: every CPU point took 64 before the study followed the
config (and the GPU points too before they took the whole minibatch)."""


def cpu_microbatch(config: str, flags: dict[str, Any], sets: Sequence[str]) -> int:
    """The chunk of the CPU points' update, for the config one process of the study builds on the CPU (`flags` and
    `--device cpu`, as the CPU points pass it, then the user's `--set` items): its `training.microbatch_size` (0: the
    whole minibatch), or where that is `auto`, what `auto` takes unmeasured on this network (`learner_settings`: the
    whole minibatch for a network too small for the choice to matter, 64 for others), so that no point takes a choice
    measured or cached for its thread count. Lift's MLP in chunks of 64 made 16 simulated synchronous workers' update
    5.7 and 7.0 times as long as on the whole minibatch (docs/results/amd-epyc-avx512-bf16-family26-model2-2c/
    study_chunks.md)."""
    from parallel_ppo.tuning.learner_settings import candidates, is_small, preferred  # torch: only once resolving

    cfg = build_config(config, {**flags, "training.device": "cpu"}, list(sets), parallel=False)
    size = cfg.training.microbatch_size
    if size != "auto":
        return int(size)
    try:  # the env's spaces: where its family does not know them, one env is built here
        spaces = env_spaces(cfg.env)
    except ParallelPPOError:
        raise
    except Exception as e:  # noqa: BLE001 - a simulator's own error, before any point runs
        raise ConfigError(f"{cfg.env.id} could not be built to size its network ({type(e).__name__}: {e})") from e
    return preferred(cfg, candidates(cfg), small=is_small(cfg, spaces)).microbatch_size


PRECISION = ("--set", "training.precision=fp32")
"""A point's precision, before the user's `--set` items: `auto` would measure (or find cached) a choice per thread
count and device, and a point that got bf16 would not compare with one that got fp32."""


def point_chunk(gpu: bool, microbatch: int) -> int:
    """A point's chunk: `microbatch` on the CPU, the whole minibatch (0) on a GPU (chunks keep a CPU's working set in
    its caches, while a GPU needs the whole minibatch to fill its units: in chunks of 64, a CUDA learner fed by 16
    workers made 0.75 times the CPU learner's steps/s on Lift from state,
    docs/results/intel-xeon-avx512-bf16-16c-h200)."""
    return 0 if gpu else microbatch


def chunk_items(gpu: bool, microbatch: int) -> tuple[str, ...]:
    """A point's chunk (`point_chunk`) as `--set` items, after the user's (`cpu_microbatch` resolved theirs)."""
    return ("--set", f"training.microbatch_size={point_chunk(gpu, microbatch)}")


def other_chunks(points: list[dict[str, Any]], microbatch: int, gpu_families: Sequence[str]) -> list[str]:
    """The labels of the measured `points` whose update ran in other chunks than this study's points of their family
    do (`microbatch` on the CPU, the whole minibatch on a GPU; a point recording none: FORMER_CHUNK); a failed
    point, which records none, is not among them."""
    return [p["label"] for p in points if "error" not in p
            and p.get("microbatch", FORMER_CHUNK) != point_chunk(p["family"] in gpu_families, microbatch)]


def family_points(families: list[str], counts: list[int], cores: int,
                  sleeping: bool = False) -> list[tuple[str, int]]:
    """The (family, processes) points to run: a distributed run of one rank, or one copy, is the sequential trainer,
    so ranks and copies start at 2; threads, ranks and copies compute, so they stop at the `cores` (workers go past
    them only where the count asks: a simulated study's sleeping ones, and ranks too where their envs are `sleeping`:
    each then computes only its inference and update; copies never, being the yardstick of the cores there are)."""
    return [(f, n) for f in families for n in counts
            if not (f in ("ranks", "copies") and n == 1)
            and not (n > cores and (f in ("threads", "copies") or f == "ranks" and not sleeping))]


def no_points_reasons(families: list[str], counts: list[int], cores: int, sleeping: bool = False) -> list[str]:
    """Why `family_points` leaves out the points of `families` × `counts` it leaves out, each reason once."""
    kept = set(family_points(families, counts, cores, sleeping))
    reasons = [f"{f} start at 2" if n == 1 else f"{f} at {n}: more than the {cores} cores here"
               for f in families for n in counts if (f, n) not in kept]
    return list(dict.fromkeys(reasons))
