"""The learning benchmark: one game, a few config variants × seeds, each a timed training run, then a
multi-seed comparison (curves with bands, IQM and bootstrap intervals) of the variants.

Runs go one after another, never at once, seed by seed (every variant's seed 1, then every variant's seed 2,
...), so an interrupted benchmark leaves comparable data. A run that met its budget is not run again, and one that
did not (stopped by a signal, an error or a kill) starts over, as the command now asks: rerunning the same command
finishes an interrupted benchmark. A run of another trainer or env that wrote its summary is refused before
anything trains (kept, it would mix into the comparison).

    OUT/<variant>/seed_<n>/   one run directory per variant and seed
    OUT/comparison/           compare_results.py's report over the variants
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from parallel_ppo.bench.trainer_runs import BENCH_RUN_SETS, run_bench_trainer, trainer_command
from parallel_ppo.core.config_yaml import parse_set
from parallel_ppo.errors import ConfigError, RunDataError
from parallel_ppo.runs.reading import seed_dir
from parallel_ppo.runs.report.make import make_report
from parallel_ppo.runs.summary import BUDGETS, RunSummary


@dataclass(frozen=True)
class Variant:
    """A label and the `--set` overrides that make it."""

    label: str
    sets: tuple[str, ...]


DEFAULT_VARIANTS = (
    Variant("rnorm+vclip", ("training.normalize_reward=true", "training.clip_vloss=true")),
    Variant("rnorm", ("training.normalize_reward=true", "training.clip_vloss=false")),
    Variant("vclip", ("training.normalize_reward=false", "training.clip_vloss=true")),
)
"""The references' setting (reward normalization and value clipping, as in CleanRL's ppo_procgen and
openai/train-procgen) and each of the two switched off alone."""


def parse_variant(spec: str) -> Variant:
    """`LABEL:key=value,key=value` (`LABEL:` alone: the config as it is)."""
    label, colon, rest = spec.partition(":")
    if not colon or not label.strip() or "/" in label or label.strip() in (".", ".."):
        raise ConfigError(f"--variant expects LABEL:section.key=value,..., got {spec!r}")
    sets = tuple(item.strip() for item in rest.split(",") if item.strip())
    for item in sets:
        parse_set(item)
    return Variant(label.strip(), sets)


def plan(variants: list[Variant], seeds: list[int]) -> list[tuple[Variant, int]]:
    """The runs in the order they go: seed-major, so a partial benchmark still has every variant per seed."""
    return [(variant, seed) for seed in seeds for variant in variants]


def run_command(variant: Variant, seed: int, out: Path, config: str, minutes: float, extra: list[str],
                parallel: bool = False) -> list[str]:
    """The command of one run: the sequential trainer, or the parallel one with the config's workers (learning per
    step does not depend on the mode: a parallel update equals a sequential one), with the variant's overrides last."""
    cmd = [*trainer_command(int(parallel)), "--config", config, "--seed", str(seed), "--duration",
           f"{minutes / 60:.8f}", "--output-dir", str(seed_dir(out / variant.label, seed)), "--overwrite",
           *BENCH_RUN_SETS, *extra]
    for item in variant.sets:
        cmd += ["--set", item]
    return cmd


def check_kept_runs(out: Path, env_ids: dict[str, str], mode: str, seeds: list[int]) -> None:
    """Raise ConfigError if a finished run of `seeds` that the comparison would read under `out/<label>` (for each
    variant label → the env id it trains) was trained by another trainer than `mode` or on another env."""
    for label, env_id in env_ids.items():
        for path in (seed_dir(out / label, seed) / "summary.json" for seed in seeds):
            if not path.is_file():
                continue
            try:
                summary = RunSummary.read(path)
            except RunDataError as e:
                raise ConfigError(f"a kept run cannot be read: {e}; remove it to train it again") from None
            if (summary.mode, summary.env_id) != (mode, env_id):
                raise ConfigError(f"{path.parent} was trained by the {summary.mode} trainer on {summary.env_id}, and "
                                  f"this benchmark runs the {mode} trainer on {env_id}: use another --output-dir, or "
                                  "remove that run")


def run_all(out: Path, variants: list[Variant], seeds: list[int], config: str, minutes: float,
            extra: list[str], parallel: bool = False) -> None:
    """Train every (variant, seed) that has not met its budget yet, one at a time, printing each as it ends."""
    runs = plan(variants, seeds)
    for i, (variant, seed) in enumerate(runs, 1):
        run_dir = seed_dir(out / variant.label, seed)
        if met_budget(run_dir):
            print(f"[{i}/{len(runs)}] {variant.label} seed {seed}: done before, kept ({run_dir})", flush=True)
            continue
        print(f"[{i}/{len(runs)}] {variant.label} seed {seed}: training {minutes:g} min → {run_dir}", flush=True)
        command = run_command(variant, seed, out, config, minutes, extra, parallel)
        run_bench_trainer(command, f"{variant.label} seed {seed}")


def met_budget(run_dir: Path) -> bool:
    """Whether the run in `run_dir` ended on its budget (not on a signal or an error, or never): one that did not
    is not resumed, its settings and code perhaps not the command's now."""
    try:
        return RunSummary.read(run_dir / "summary.json").stop_reason in BUDGETS
    except RunDataError:  # none yet, or one `check_kept_runs` lets through: trained (again) by the trainer
        return False


def comparison_specs(out: Path, variants: list[Variant], seeds: list[int]) -> list[tuple[str, list[Path]]]:
    """What the comparison reads: one label per variant over the run directories of `seeds`, those alone (another
    seed's directory left under it by an earlier call is not this benchmark's)."""
    return [(v.label, [seed_dir(out / v.label, seed) for seed in seeds]) for v in variants]


def main_learning(out: Path, variants: list[Variant], seeds: list[int], config: str, minutes: float,
                  extra: list[str], prog: str, parallel: bool = False) -> int:
    """Run the benchmark and its comparison; returns the exit status."""
    run_all(out, variants, seeds, config, minutes, extra, parallel)
    print(f"{prog}: comparing {len(variants)} variants over seeds {', '.join(map(str, seeds))}", flush=True)
    return make_report(comparison_specs(out, variants, seeds), out / "comparison", f"{prog} (compare)")
