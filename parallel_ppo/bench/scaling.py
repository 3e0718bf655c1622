"""Scaling sweep, layouts and autotune: short timed runs over worker and rank layouts, read back from their
run directories.

Each point is a real training run (`python -m parallel_ppo train-parallel`, or `train` for the sequential
point; under torchrun with `--distributed` for a distributed one), so the figures include everything a training
run pays: collection, sync, GAE, update and logging; its SPS is the run's steady-state SPS (`runs.figures.steady_sps`),
the figure its summary.json and compare show.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, NamedTuple

import psutil

from parallel_ppo.bench.trainer_runs import BENCH_RUN_SETS, run_bench_trainer, trainer_command
from parallel_ppo.core.files import atomic_write, write_json, write_text
from parallel_ppo.core.threads import usable_cpus
from parallel_ppo.core.timing import PHASES
from parallel_ppo.errors import ConfigError
from parallel_ppo.runs.figures import efficiency, speedup
from parallel_ppo.runs.reading import Run, load_run


def torchrun_command(ranks: int, command: str, config: Path) -> str:
    """How a user launches a distributed layout with a config (what autotune prints)."""
    return f"torchrun --standalone --nproc_per_node {ranks} -m parallel_ppo {command} --distributed --config {config}"


class Point(NamedTuple):
    """One timed run: workers (0: sequential) × envs per worker, as `ranks` ranks when distributed, `flags` last."""

    label: str
    what: str
    workers: int
    envs_per_worker: int
    ranks: int = 0
    flags: tuple[str, ...] = ()
    worker_threads: int = 1

    def command(self, out_dir: Path, seconds: float, config: str, extra: list[str]) -> list[str]:
        """Its trainer command, the run going to `out_dir / label`."""
        m = self.envs_per_worker
        if self.workers:
            cmd = [*trainer_command(self.workers, self.ranks), "--num-workers", str(self.workers),
                   "--num-envs-per-worker", str(m), "--set", f"parallel.worker_threads={self.worker_threads}",
                   "--set", f"env.num_envs={self.workers * m}"]  # the layout's total, over a config's
        else:
            cmd = [*trainer_command(0, self.ranks), "--num-envs", str(m)]
        return [*cmd, "--config", config, "--duration", f"{seconds / 3600:.8f}", "--output-dir",
                str(out_dir / self.label), "--overwrite", *BENCH_RUN_SETS, *extra, *self.flags]


def run_point(out: Path, workers: int, envs_per_worker: int, seconds: float, config: str, extra: list[str],
              worker_threads: int = 1, ranks: int = 0) -> dict[str, Any]:
    """One timed run into `out` (`Point.command`); returns its table row."""
    point = Point(out.name, "", workers, envs_per_worker, ranks, worker_threads=worker_threads)
    run_bench_trainer(point.command(out.parent, seconds, config, extra), out.name)
    return point_row(load_run(out.name, out), worker_threads)


def run_points(points: list[Point], out_dir: Path, seconds: float, config: str,
               extra: list[str]) -> list[dict[str, Any]]:
    """Run `points` one at a time, each into `out_dir / label`; their table rows."""
    rows = []
    for p in points:
        print(f"  {p.label}: {p.what}, {seconds:.0f} s ...", flush=True)
        run_bench_trainer(p.command(out_dir, seconds, config, extra), p.label)
        rows.append(r := point_row(load_run(p.label, out_dir / p.label), p.worker_threads))
        print(f"    {r['steps_per_second']:,.0f} steps/s, peak PSS {r['peak_pss_mb'] or 0:,.0f} MB", flush=True)
    return rows


def point_row(run: Run, worker_threads: int = 1) -> dict[str, Any]:
    """A finished run as a row of the scaling table. `workers` counts processes that collect (a distributed run:
    its ranks, or its ranks' workers), 0 for a sequential run; `ranks` is 0 unless distributed; `pace_*` are
    summary.json's `worker_pace` figures (None without workers)."""
    s = run.summary
    ranks = run.ranks if s.mode == "distributed" else 0
    return {
        "label": run.label, "workers": run.workers if ranks else s.num_workers, "ranks": ranks,
        "rank_workers": run.rank_workers if ranks else None, "envs_per_worker": run.envs_per_process,
        "worker_threads": worker_threads if s.num_workers else None,
        "envs": s.num_envs, "steps_per_second": run.steady_sps, "updates": s.updates,
        "peak_rss_mb": s.peak_rss_mb, "peak_pss_mb": s.peak_pss_mb,
        "phase_fractions": s.phase_fractions, "phase_means": run.phase_means(), "run_dir": str(run.path),
        "hardware": s.hardware, "threads": s.threads, "rollout_cut": run.steady_mean("rollout_cut"),
        **{f"pace_{k}": (s.worker_pace or {}).get(k) for k in ("rollouts", "slowest_share", "slowest_excess_seconds")},
    }


def add_speedups(rows: list[dict[str, Any]]) -> None:
    """Speed-up and efficiency of every row against the first (`runs.figures.speedup`, `runs.figures.efficiency`)."""
    base = rows[0]
    for r in rows:
        r["speedup"] = speedup(r["steps_per_second"], base["steps_per_second"])
        r["efficiency"] = efficiency(r["speedup"], r["workers"], base["workers"])


def scaling_table(rows: list[dict[str, Any]]) -> str:
    lines = ["| envs | ranks | workers | envs/worker | threads/worker | steps/s | speed-up | efficiency | "
             "peak RSS (MB) | peak PSS (MB) |", "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        pss = f"{r['peak_pss_mb']:,.0f}" if r.get("peak_pss_mb") else "-"
        threads = r["worker_threads"] or "-"
        lines.append(f"| {r['envs']} | {r.get('ranks') or '-'} | {r['workers'] or 'seq'} | {r['envs_per_worker']} | "
                     f"{threads} | "
                     f"{r['steps_per_second']:,.0f} | {r['speedup']:.2f}× | {100 * r['efficiency']:.0f}% | "
                     f"{r['peak_rss_mb']:,.0f} | {pss} |")
    return "\n".join(lines)


def plot_scaling(rows: list[dict[str, Any]], path: Path) -> None:
    """Speed-up vs processes (workers, or ranks) with the ideal line, efficiency, and each point's phase fractions."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    lines = _scaling_lines(rows)
    fig, axes = plt.subplots(1, 3, figsize=(17, 5.2))
    ax = axes[0]
    for name, pts in lines.items():
        ax.plot([r["workers"] for r in pts], [r["speedup"] for r in pts], "o-", label=name)
    top = max([r["workers"] for r in rows] + [1])
    base_workers = max(rows[0]["workers"], 1)
    ax.plot([1, top], [1 / base_workers, top / base_workers], "k--", lw=1, label="ideal (linear)")
    ax.set(xlabel="processes (workers or ranks)", ylabel=f"speed-up over {rows[0]['label']}",
           title="Speed-up (env steps/s ratio)")
    ax.legend()
    ax.grid(alpha=0.3)

    ax = axes[1]
    for name, pts in lines.items():
        ax.plot([r["workers"] for r in pts], [100 * r["efficiency"] for r in pts], "o-", label=name)
    ax.axhline(100, color="k", ls="--", lw=1)
    ax.set(xlabel="processes (workers or ranks)", ylabel="parallel efficiency (%)",
           title="Efficiency = speed-up / processes",
           ylim=(0, max(110, max(100 * r["efficiency"] for r in rows) + 10)))
    ax.legend()
    ax.grid(alpha=0.3)

    _plot_phase_shares(axes[2], rows)
    hw = rows[0]["hardware"]
    fig.suptitle(f"Scaling on {hw['cpu_model']} ({hw['physical_cores']} physical / {hw['logical_cores']} "
                 f"logical cores, {hw['memory_gb']} GB)")
    fig.tight_layout()
    atomic_write(path, lambda f: fig.savefig(f, format="png", dpi=110))
    plt.close(fig)


def _scaling_lines(rows: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """The scaling chart's lines: the worker points by envs per worker, the distributed ones by envs per rank (the
    sequential point is on none)."""
    lines: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        if r.get("ranks"):
            source = "1 worker × " if r["rank_workers"] else ""
            lines.setdefault(f"distributed, {source}{r['envs_per_worker']} envs/rank", []).append(r)
        elif r["workers"]:
            lines.setdefault(f"{r['envs_per_worker']} envs/worker", []).append(r)
    return lines


def _plot_phase_shares(ax: Any, rows: list[dict[str, Any]]) -> None:
    """Stacked bars: each point's share of wall time per phase."""
    labels = [r["label"] for r in rows]
    bottom = [0.0] * len(rows)
    for phase in PHASES:
        values = [100 * r["phase_fractions"].get(phase, 0.0) for r in rows]
        ax.bar(labels, values, bottom=bottom, label=phase)
        bottom = [b + v for b, v in zip(bottom, values, strict=True)]
    ax.set(ylabel="share of wall time (%)", title="Where the time goes", ylim=(0, 105))
    ax.tick_params(axis="x", rotation=30)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))


def write_scaling(rows: list[dict[str, Any]], out_dir: Path, title: str) -> None:
    """scaling.json, scaling.md and scaling.png in `out_dir`."""
    add_speedups(rows)
    write_json(out_dir / "scaling.json", {"title": title, "points": rows})
    hw = rows[0]["hardware"]
    text = (f"# {title}\n\n{scaling_table(rows)}\n\nSteps/s are steady-state (after the first update) of real "
            f"training runs; speed-up is relative to `{rows[0]['label']}`; efficiency = speed-up / "
            f"(processes / its processes), the processes being workers, or ranks of a distributed run (each a "
            f"sequential collector and learner, its gradients all-reduced). Peak PSS counts memory shared between "
            f"processes once; a distributed run's memory figures are rank 0's processes alone.\n\n"
            f"Machine: {hw['cpu_model']}, {hw['physical_cores']} physical / {hw['logical_cores']} logical cores, "
            f"{hw['memory_gb']} GB.\n")
    write_text(out_dir / "scaling.md", text)
    plot_scaling(rows, out_dir / "scaling.png")


def default_worker_counts() -> list[int]:
    """1, 2, 4, ... up to the physical cores this process may use (`usable_cpus`), included if not a power of 2."""
    logical = psutil.cpu_count() or 1
    physical = psutil.cpu_count(logical=False) or logical
    cores = max(1, min(physical, usable_cpus() * physical // logical))  # about the cores the usable CPUs belong to
    counts = [2**i for i in range(cores.bit_length())]
    return counts if counts[-1] == cores else [*counts, cores]


def sweep_points(workers: list[int], envs_per_worker: list[int], sequential: bool, distributed: bool) -> list[Point]:
    """A sequential point (same envs as one worker, when asked) then every workers × envs-per-worker point, and
    (`distributed`) for 2 or more workers the same count of distributed ranks, each a sequential source with
    envs-per-worker envs."""
    points = [Point(f"seq_e{m}", f"sequential × {m} envs", 0, m) for m in envs_per_worker[:1]] if sequential else []
    points += [Point(f"w{w}_e{m}", f"{w} workers × {m} envs", w, m) for m in envs_per_worker for w in workers]
    if distributed:
        points += [Point(f"r{w}_e{m}", f"{w} ranks × {m} envs", 0, m, w)
                   for m in envs_per_worker for w in workers if w >= 2]
    return points


def autotune(out_dir: Path, seconds: float, config: str, extra: list[str]) -> dict[str, Any]:
    """Short runs over layouts that fit this machine; writes autotune.json and a ready config for the fastest."""
    from parallel_ppo.core.config_yaml import dump_yaml

    rows = _autotune_points(out_dir, seconds, config, extra)
    add_speedups(rows)
    best = max(rows, key=lambda r: r["steps_per_second"])
    path = out_dir / "ppo_autotuned.yaml"
    cfg, trainer, command = _autotuned_config(best, config, extra, path)
    header = (f"# Written by `make autotune`: the fastest layout measured on this machine "
              f"({best['steps_per_second']:,.0f} env steps/s).\n# Use: {command}\n")
    write_text(path, header + dump_yaml(cfg))
    result = {"best": best, "trainer": trainer, "command": command, "config": str(path), "points": rows}
    write_json(out_dir / "autotune.json", result)
    return result


def _autotune_points(out_dir: Path, seconds: float, config: str, extra: list[str]) -> list[dict[str, Any]]:
    """Autotune's runs: sequential × 16 envs, workers (1 or 2 threads for one) × 4, 8 or 16 envs, then 2 or more
    distributed ranks × 8 or 16 envs; a layout the trainer refuses is skipped."""
    counts = default_worker_counts()
    rows = [run_point(out_dir / "seq_e16", 0, 16, seconds, config, extra)]
    print(f"  sequential × 16 envs: {rows[-1]['steps_per_second']:,.0f} steps/s", flush=True)
    for w in counts:
        for m in (4, 8, 16):
            for threads in (1, 2) if w == 1 else (1,):
                label = f"w{w}_e{m}_t{threads}"
                try:
                    rows.append(run_point(out_dir / label, w, m, seconds, config, extra, worker_threads=threads))
                except ConfigError as e:  # refused settings, e.g. a minibatch that does not divide the rollout
                    print(f"  {w} workers × {m} envs: skipped ({e})", flush=True)
                    continue
                print(f"  {w} workers × {m} envs, {threads} thread(s): {rows[-1]['steps_per_second']:,.0f} steps/s",
                      flush=True)
    for n in (n for n in counts if n >= 2):  # distributed ranks, each a sequential collector and learner
        for m in (8, 16):
            try:
                rows.append(run_point(out_dir / f"r{n}_e{m}", 0, m, seconds, config, extra, ranks=n))
            except ConfigError as e:
                print(f"  {n} ranks × {m} envs: skipped ({e})", flush=True)
                continue
            print(f"  {n} ranks × {m} envs: {rows[-1]['steps_per_second']:,.0f} steps/s", flush=True)
    return rows


def _autotuned_config(
    best: dict[str, Any], config: str, extra: list[str], path: Path
) -> tuple[dict[str, Any], str, str]:
    """`config` with the runs' `--env` and `--set` items (`extra`), set to the `best` layout; its trainer, and the
    command that runs it once written to `path`."""
    from parallel_ppo.core.config_yaml import parse_set
    from parallel_ppo.core.configure import load_yaml

    cfg = load_yaml(config)
    for flag, item in zip(extra[::2], extra[1::2], strict=True):  # in order: a --set env.id overrides --env
        key, value = ("env.id", item) if flag == "--env" else parse_set(item)
        *sections, name = key.split(".")
        section = cfg
        for part in sections:
            section = section.setdefault(part, {})
        section[name] = value
    if best["ranks"]:  # by the scaling rule: the envs and minibatch of one rank, × the ranks torchrun starts
        cfg.setdefault("env", {})["num_envs"] = best["envs_per_worker"]
        cfg.get("distributed", {}).pop("num_envs_total", None)
        return cfg, "train", torchrun_command(best["ranks"], "train", path)
    if best["workers"]:
        cfg.setdefault("parallel", {}).update({"num_workers": best["workers"],
                                               "num_envs_per_worker": best["envs_per_worker"],
                                               "worker_threads": best["worker_threads"]})
        cfg.get("env", {}).pop("num_envs", None)  # derived from the layout in parallel mode
    else:
        cfg.setdefault("env", {})["num_envs"] = best["envs_per_worker"]
    trainer = "train-parallel" if best["workers"] else "train"
    return cfg, trainer, f"python -m parallel_ppo {trainer} --config {path}"


def layout_points(processes: list[int], envs: int) -> list[Point]:
    """The ways to spend P processes on the same `envs` envs, for each P: the sequential trainer (every core's
    threads) first, then P workers; P distributed ranks, each a sequential source with envs / P envs; and P ranks
    each with one worker of envs / P envs (the ranks split the envs and the minibatch: one problem)."""
    points = [Point("seq", f"sequential, {envs} envs", 0, envs)]
    split = ("--num-envs-total", str(envs))
    for p in (p for p in processes if p >= 2):
        if envs % p:
            raise ConfigError(f"{envs} envs do not split evenly over {p} processes")
        m = envs // p
        points += [Point(f"w{p}_e{m}", f"{p} workers × {m} envs", p, m),
                   Point(f"r{p}_e{m}", f"{p} ranks × {m} envs", 0, m, p, split),
                   Point(f"r{p}_w1_e{m}", f"{p} ranks × (1 worker × {m} envs)", 1, m, p, split)]
    return points


def layout_name(row: dict[str, Any]) -> str:
    if row["ranks"]:
        m = row["envs_per_worker"]
        source = f"({row['rank_workers']} worker × {m})" if row["rank_workers"] else f"{m} envs"
        return f"distributed {row['ranks']} ranks × {source}"
    if row["workers"]:
        return f"parallel {row['workers']} × {row['envs_per_worker']}"
    return f"sequential {row['envs']} envs"


def layouts_table(rows: list[dict[str, Any]]) -> str:
    """SPS, speed-up and efficiency against the sequential trainer, and seconds per update by phase (rank 0's for
    a distributed run): collection = env + render + inference (a parallel source's: its workers' mean), sync = waiting
    on workers or other ranks."""
    lines = ["| layout | threads | steps/s | speed-up | efficiency | collect (s) | sync (s) | update (s) | "
             "all-reduce (s) |", "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        t = r["phase_means"]
        threads = ", ".join(f"{k} {v}" for k, v in r["threads"].items())
        collect = t["env"] + t.get("render", 0.0) + t["inference"]
        lines.append(f"| {layout_name(r)} | {threads} | {r['steps_per_second']:,.0f} | {r['speedup']:.2f}× | "
                     f"{100 * r['efficiency']:.0f}% | {collect:.2f} | {t['sync']:.2f} | "
                     f"{t['update']:.2f} | {t.get('allreduce', 0.0):.2f} |")
    return "\n".join(lines)


def write_layouts(rows: list[dict[str, Any]], out_dir: Path) -> None:
    """layouts.json, layouts.md and layouts.png (the scaling chart of these points) in `out_dir`."""
    add_speedups(rows)
    write_json(out_dir / "layouts.json", {"points": rows})
    hw = rows[0]["hardware"]
    write_text(out_dir / "layouts.md", f"# Layouts of {rows[0]['envs']} envs\n\n{layouts_table(rows)}\n\n"
               f"Steady-state steps/s of real training runs; seconds are means per update after the first. "
               f"Efficiency = speed-up / processes.\n\nMachine: {hw['cpu_model']}, {hw['physical_cores']} physical / "
               f"{hw['logical_cores']} logical cores, {hw['memory_gb']} GB.\n")
    plot_scaling(rows, out_dir / "layouts.png")
