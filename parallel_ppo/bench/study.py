"""The many-core study (`bench.py study`, `make study`): one command that measures what parallelism buys on this
machine, and writes a small table and plots under its folder (`machine_folder`),
docs/results/<cpu>[-avx512][-bf16][-family<F>-model<M>]-<cores>c[-<gpu>]/.

Seven families of short timed training runs on the same task, at 1, 2, 4, ... processes (up to the logical cores):
- `threads`: one sequential learner with that many intra-op threads (the contrast);
- `copies`: that many one-thread sequential trainers at once, sharing nothing (`bench.copies`: the yardstick);
- `workers`: the parallel trainer with that many worker processes, the learner on the CPU;
- `overlap`: the same, the workers collecting the next rollout while the learner updates (`parallel.overlap`);
- `ranks`: that many distributed ranks (torchrun, gloo), each a sequential collector and learner;
- `cuda`: the parallel trainer with that many CPU workers feeding a CUDA learner (only where CUDA is available);
- `cuda_overlap`: the same, the workers collecting the next rollout while the CUDA learner updates.

Every point of P processes uses P cores (a learner's threads are P, at most the usable cores; a rank's 1), but for
the overlapped families, whose learner's one thread updates beside its P busy workers: P + 1 at most (a CPU
learner takes P threads, as the synchronous one has, once its workers have collected:
`parallel.idle_learner_threads`). Every family keeps each process's work the same as it grows (the scaling rule of
`per_process_layout`): 8 envs and a minibatch of `batch_per_process` samples per process, the global figures
derived. A point that crashes or hangs is recorded with its error and the study goes on, so one failure never loses
the rest of a scarce machine's time.

A simulated study (`make study-sim`: the sim family, whose step sleeps for the physics time) runs the worker
families past the cores: sleeping workers leave the cores to the trainer's own work. Its pages say so.
"""

from __future__ import annotations

import json
import re
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from parallel_ppo.bench.copies import copies_row, copy_commands
from parallel_ppo.bench.scaling import point_row
from parallel_ppo.bench.study_arithmetic import (
    FORMER_CHUNK,
    PRECISION,
    chunk_items,
    cpu_microbatch,
    family_points,
    no_points_reasons,
)
from parallel_ppo.bench.study_merge import config_digest, earlier_points, other_configs
from parallel_ppo.bench.study_pages import (
    GPU_FAMILIES,
    measured_labels,
    merge_rows,
    results_files,
    write_results,
)
from parallel_ppo.bench.trainer_runs import BENCH_RUN_SETS, BenchRunCrashed, run_together, trainer_command
from parallel_ppo.core.config_yaml import config_env
from parallel_ppo.core.configure import build_config
from parallel_ppo.core.threads import usable_cpus
from parallel_ppo.envs.families import family_of
from parallel_ppo.errors import ConfigError, ParallelPPOError
from parallel_ppo.runs import fingerprint
from parallel_ppo.runs.reading import load_run

ROOT = Path(__file__).resolve().parents[2]

SIGN = re.compile(r"(^|[=,\[ ])-")
"""A minus sign that starts a value (`x=-1`, `[-1,-2]`): `set_slug` spells it out, which `slug` would drop."""


def slug(text: str) -> str:
    """`text` in lower-case letters, digits and single dashes, for a file name."""
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


def set_slug(item: str) -> str:
    """A `--set` item for a file name, its values' signs kept: `x=-1` is `x-minus1`, beside `x=1`'s `x-1`."""
    return slug(SIGN.sub(r"\1minus", item))


def drawing_tag(drawn: dict[str, str]) -> str:
    """How the frames were drawn where a variable chose it, for the study's file name: `-mesa` (EGL's vendor is
    Mesa's alone, or software rendering forced: on a GPU box, the CPU draws), `-osmesa`, `-lp<N>` (Mesa's threads
    set by the user); "" by default. Studies drawn otherwise sit beside each other instead of replacing one another."""
    tags = [tag for tag, chosen in (("mesa", fingerprint.mesa_egl(drawn)), ("osmesa", fingerprint.osmesa(drawn)))
            if chosen]
    if "LP_NUM_THREADS" in drawn:
        tags.append("lp" + slug(drawn["LP_NUM_THREADS"]))
    return "".join(f"-{t}" for t in tags)


@dataclass(frozen=True)
class StudySettings:
    """What every run of the study shares."""

    config: str
    env: str
    seconds: float
    """Wall-clock budget of each run."""
    envs_per_process: int = 8
    n_steps: int = 64
    batch_per_process: int = 128
    """Minibatch samples per process: the global minibatch is this × processes (a distributed rank's share is
    then this figure at every rank count)."""
    extra: tuple[str, ...] = ()
    """Further flags for every run (`--set` overrides)."""
    microbatch: int = FORMER_CHUNK
    """The CPU points' chunk (`plan_study` resolves the config's: `study_arithmetic.cpu_microbatch`)."""

    @property
    def sets(self) -> list[str]:
        """The KEY=VALUE items of `extra`'s `--set` flags."""
        return [self.extra[i + 1] for i in range(0, len(self.extra), 2)]


def per_process_layout(settings: StudySettings, processes: int) -> dict[str, int]:
    """The scaling rule: envs and minibatch grow with the processes, so each process steps the same envs and
    learns on the same number of samples at every count."""
    return {"envs": settings.envs_per_process * processes, "batch_size": settings.batch_per_process * processes}


def point_command(family: str, processes: int, settings: StudySettings, out: Path, cores: int) -> list[str]:
    """The trainer command of one study point on a machine of `cores` usable cores (of one copy, for `copies`).
    The user's `--set` items (`settings.extra`) come after the study's own and win, but for the thread counts that
    define the `threads`, `copies` and `ranks` families (a one-core point stays one thread whatever the other
    points' learners are given) and the update's chunk (`settings.microbatch`, resolved from the user's items too; a
    GPU's whole minibatch)."""
    layout = per_process_layout(settings, 1 if family == "copies" else processes)  # a copy is one process
    m = settings.envs_per_process
    overlap, gpu = family in ("overlap", "cuda_overlap"), family in GPU_FAMILIES
    learner = 1 if overlap else min(processes, cores)  # overlapped: one thread beside the P workers, P once they wait
    own: tuple[str, ...] = ()
    if family in ("threads", "copies"):  # a copy is one process of one thread (`copy_commands` makes P of them)
        threads = processes if family == "threads" else 1
        cmd = [*trainer_command(0), "--num-envs", str(layout["envs"]), "--device", "cpu"]
        own = ("--set", f"parallel.learner_threads={threads}", "--set", f"env.env_threads={threads}")
    elif family == "ranks":  # the distributed scaling rule: envs and minibatch per rank; one thread each
        cmd = [*trainer_command(0, processes), "--num-envs", str(m), "--device", "cpu"]
        own = ("--set", "parallel.learner_threads=1", "--set", "env.env_threads=1")
    else:  # the learner gets as many threads as there are workers (up to the cores), each worker one
        cmd = [*trainer_command(processes), "--num-workers", str(processes), "--num-envs-per-worker", str(m),
               "--set", "parallel.worker_threads=1", "--set", f"parallel.learner_threads={learner}",
               "--set", "env.env_threads=1", "--set", f"parallel.overlap={str(overlap).lower()}",
               "--set", f"parallel.idle_learner_threads={min(processes, cores)}",
               "--set", f"env.num_envs={layout['envs']}", "--device", "cuda" if gpu else "cpu"]
    batch = settings.batch_per_process if family == "ranks" else layout["batch_size"]
    return [*cmd, "--config", settings.config, "--env", settings.env, "--batch-size", str(batch),
            "--set", f"training.n_steps={settings.n_steps}", "--duration", f"{settings.seconds / 3600:.8f}",
            "--output-dir", str(out), "--overwrite", *BENCH_RUN_SETS, *PRECISION,
            *settings.extra, *own, *chunk_items(gpu, settings.microbatch)]


def run_study_point(family: str, processes: int, settings: StudySettings, runs_dir: Path,
                    cores: int) -> dict[str, Any]:
    """One timed run (the `copies` family's P runs at once), as a row of the study; a run that fails or hangs
    becomes a row with its error."""
    label = f"{family}_{processes}"
    command = point_command(family, processes, settings, runs_dir / label, cores)
    commands = copy_commands(command, processes) if family == "copies" else [command]
    row: dict[str, Any] = {"family": family, "processes": processes, "label": label,
                           "measured_at": time.strftime("%Y-%m-%d %H:%M:%S")}
    try:
        ended = run_together(commands, label, timeout=3 * settings.seconds + 120)
        runs = [load_run(label, Path(cmd[cmd.index("--output-dir") + 1])) for cmd in commands]
        figures = copies_row(runs, ended) if family == "copies" else point_row(runs[0])
    except (BenchRunCrashed, ParallelPPOError) as e:
        return {**row, "error": str(e)}
    run = runs[0]
    ranks = run.summary.world_size
    return {**row, **figures, "batch_size": run.config.training.batch_size * ranks * len(runs),
            "precision": run.summary.precision, "microbatch": run.config.training.microbatch_size,
            "device": (run.summary.learner or {}).get("device", "cpu")}


def available_cores() -> int:
    """The cores this process may run on (its affinity mask: a container's or a job's share, not the host's)."""
    return usable_cpus()


def process_counts(cores: int) -> list[int]:
    """1, 2, 4, ... up to `cores`, `cores` included."""
    counts = [1]
    while counts[-1] * 2 <= cores:
        counts.append(counts[-1] * 2)
    return counts if counts[-1] == cores else [*counts, cores]


def gpu_name() -> str | None:
    """The CUDA device's name, None without one."""
    import torch

    return torch.cuda.get_device_name(0) if torch.cuda.is_available() else None


def results_slug(cpu_model: str, cores: int, gpu: str | None, kind: Sequence[str] = (),
                 family: str | None = None) -> str:
    """`<cpu>[-<kind>...][-family<F>-model<M>]-<cores>c[-<gpu>]`, in lower-case letters, digits and dashes, e.g.
    `intel-xeon-platinum-8480-avx512-bf16-16c-h100-80gb-hbm3`; `kind` (`fingerprint.cpu_kind`) tells apart CPUs
    that share a model name (an AMD EPYC with AVX-512 and bf16 and one without either), `family` (`F/M`,
    `fingerprint.read_cpu_family`) those that share both (`machine_folder`)."""
    def clean(text: str) -> str:
        return slug(re.sub(r"\((r|tm)\)|\bcpu\b|@.*$|\bprocessor\b|\bnvidia\b|\d+-core", " ", text.lower()))

    tag = ["family{}-model{}".format(*family.split("/"))] if family else []
    return "-".join([clean(cpu_model) or "cpu", *kind, *tag, f"{cores}c"]) + (f"-{clean(gpu)}" if gpu else "")


def recorded_families(folder: Path) -> set[str]:
    """The CPU families (`F/M`) the JSON evidence in `folder` records: a file's own `cpu_family`, its `hardware`'s
    and its points' (a study's)."""
    found: set[str] = set()
    for path in folder.glob("*.json"):
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(data, dict):
            points = data.get("points") if isinstance(data.get("points"), list) else []
            records = [data, data.get("hardware"), *(p.get("hardware") for p in points if isinstance(p, dict))]
            found |= {r["cpu_family"] for r in records if isinstance(r, dict) and isinstance(r.get("cpu_family"), str)}
    return found


def machine_folder(results_root: Path, hw: dict[str, Any], cores: int, gpu: str | None) -> Path:
    """The folder under `results_root` of a machine of hardware `hw` (`fingerprint.hardware`): named by its CPU's
    model name and kind (`results_slug`), and by its family and model too where that folder exists, or where the
    plain one's evidence records other families and not this one (two CPU generations sold under one name, "AMD
    EPYC" with AVX-512 and bf16, compute at other speeds and round floats otherwise: one machine kind per folder)."""
    plain = results_root / results_slug(hw["cpu_model"], cores, gpu, hw["cpu_kind"])
    family = hw.get("cpu_family")
    if not family:
        return plain
    tagged = results_root / results_slug(hw["cpu_model"], cores, gpu, hw["cpu_kind"], family)
    recorded = recorded_families(plain)
    return tagged if tagged.is_dir() or (recorded and family not in recorded) else plain


def machine_results_dir(results_root: Path) -> Path:
    """This machine's folder under `results_root` (`machine_folder`): the study's results and the other evidence
    measured here go in it."""
    return machine_folder(results_root, fingerprint.hardware(), available_cores(), gpu_name())


def results_name(settings: StudySettings, drawn: dict[str, str]) -> str:
    """The stem of the study's files in the machine's folder, `study[-<config>][-<env>][-<sets>][<drawing_tag>]`:
    the config's name unless it is ppo_parallel (the Procgen study's), the env's unless the config trains it (its
    env.id, else the built-in one), the user's `--set` items (`parallel-learner-threads-4`), how the frames were
    drawn where a variable chose it (`drawn`); a value's sign is kept (`x=-1` is `x-minus1`, beside `x=1`'s `x-1`).
    `study` for starpilot on ppo_parallel.yaml, `study-robosuite_lift` for robosuite/Lift on its config,
    `study-bigfish` for bigfish on ppo_parallel.yaml: the studies of several tasks on one machine sit side by side
    instead of replacing one another."""
    config = Path(settings.config)
    own_env = config_env(config) if config.is_file() else None
    name = "study" if config.stem == "ppo_parallel" else f"study-{config.stem}"
    sets = "".join("-" + set_slug(item) for item in settings.sets)
    return (name if settings.env == own_env else f"{name}-{slug(settings.env)}") + sets + drawing_tag(drawn)


def simulated(env_id: str) -> bool:
    """Whether the study's env is the sim family's (its step a sleep: `envs.sim_envs`)."""
    return family_of(env_id).name == "sim"


def one_process(settings: StudySettings) -> dict[str, Any]:
    """The flags of one process of the study alone (`build_config`'s): its env, rollout, envs and minibatch."""
    return {"env.id": settings.env, "training.n_steps": settings.n_steps, "env.num_envs": settings.envs_per_process,
            "training.batch_size": settings.batch_per_process}


def check_settings(settings: StudySettings) -> None:
    """Refuse settings that no point could run (ConfigError), before the first run: the layout of one process
    alone and as one worker, as every point of the study builds it."""
    flags, m = one_process(settings), settings.envs_per_process
    build_config(settings.config, flags, settings.sets, parallel=False)
    build_config(settings.config, {**flags, "parallel.num_workers": 1, "parallel.num_envs_per_worker": m},
                 settings.sets, parallel=True)


@dataclass(frozen=True)
class StudyPlan:
    """What a study will run and where its results go, decided before the first run (`plan_study`)."""

    settings: StudySettings
    points: list[tuple[str, int]]
    skipped: list[str]
    """The GPU families asked for where no CUDA device runs them."""
    stem: Path
    """The results files' stem (`results_files`)."""
    identity: dict[str, Any]
    """What a results file must match for these points to join it."""
    kept: list[dict[str, Any]]
    """The points of that file kept beside the new ones."""
    dropped: list[str]
    """The labels of that file's points dropped, run in other chunks (`earlier_points`)."""
    edited: list[str]
    """The labels of that file's points dropped, measured with other values of the config file (`other_configs`)."""
    config_digest: str
    """The values of the config file this call's points run with (`config_digest`), which each records."""
    hardware: dict[str, Any]

    @property
    def cores(self) -> int:
        """The CPUs this process may use, as the results file records them."""
        return self.identity["cores"]


def plan_study(families: list[str], counts: list[int], settings: StudySettings, results_root: Path) -> StudyPlan:
    """The study's points on this machine (the GPU families only where CUDA runs them), the chunk of its CPU points'
    update (`cpu_microbatch`) and its results file; refuses
    (ConfigError, RunDataError) a study with no point to run here, or whose results file holds another's."""
    gpu = gpu_name()
    skipped = [] if gpu else [f for f in families if f in GPU_FAMILIES]
    hw, cores = fingerprint.hardware(), available_cores()
    points = family_points([f for f in families if f not in skipped], counts, cores, simulated(settings.env))
    if not points:
        without = [f"{', '.join(skipped)}: no CUDA device here"] if skipped else []
        why = "; ".join(without + no_points_reasons(families, counts, cores, simulated(settings.env)))
        raise ConfigError(f"the study has no points to run here ({why})")
    settings = replace(settings, microbatch=cpu_microbatch(settings.config, one_process(settings), settings.sets))
    config = Path(settings.config).resolve()  # named from the checkout when in it, so results compare across hosts
    shown = {**asdict(settings), "config": str(config.relative_to(ROOT) if config.is_relative_to(ROOT) else config)}
    del shown["microbatch"]  # the points record theirs: a file's points of other chunks are dropped, not refused
    drawn = fingerprint.drawing()  # names the files where a variable chose it; a study drawn otherwise is not merged
    identity = {"settings": json.loads(json.dumps(shown)), "cores": cores, "gpu": gpu, "cpu_model": hw["cpu_model"],
                "drawing": drawn or None}
    if simulated(settings.env):  # a key only simulated studies have: the real ones measured before still merge
        identity["simulated"] = True
    stem = machine_folder(results_root, hw, cores, gpu) / results_name(settings, drawn)
    kept, dropped = earlier_points(results_files(stem)["json"], identity, hw.get("cpu_family"), settings.microbatch)
    edited = other_configs(kept, digest := config_digest(settings.config))
    kept = [p for p in kept if p["label"] not in edited]
    return StudyPlan(settings, points, skipped, stem, identity, kept, dropped, edited, digest, hw)


def run_study(plan: StudyPlan, runs_dir: Path) -> list[dict[str, Any]]:
    """Run every point of `plan`, one at a time, rewriting the results after each (a machine taken back mid-study
    leaves the points it finished); returns the rows measured now."""
    meta = {**plan.identity, "cpu_microbatch": plan.settings.microbatch, "hardware": plan.hardware, "versions":
            fingerprint.versions(), "commit": fingerprint.source_commit(),
            "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]])}
    rows: list[dict[str, Any]] = []
    settings = plan.settings
    for family, n in plan.points:
        print(f"  {family} × {n}: {settings.seconds:g} s ...", flush=True)
        rows.append({**run_study_point(family, n, settings, runs_dir, plan.cores), "commit": meta["commit"],
                     "config_digest": plan.config_digest})
        r = rows[-1]
        kept = r["label"] in measured_labels(plan.kept)
        print(f"    failed: {r['error']}{' (the figure measured before is kept)' if kept else ''}" if "error" in r else
              f"    {r['steps_per_second']:,.0f} steps/s over {r['updates']} updates", flush=True)
        write_results(merge_rows(plan.kept, rows), plan.stem, meta)
    return rows
