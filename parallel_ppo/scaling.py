"""Scaling sweep and autotune: short timed runs over worker layouts, read back from their run directories.

Each point is a real training run (`python -m parallel_ppo train-parallel`, or `train` for the sequential
point), so the figures include everything a training run pays: collection, sync, GAE, update and logging;
its SPS is the run's steady-state SPS (`runs.steady_sps`), the figure its summary.json and compare show.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

from parallel_ppo.config import ConfigError
from parallel_ppo.files import atomic_write, write_json, write_text
from parallel_ppo.runs import Run, efficiency, load_run, speedup
from parallel_ppo.timing import PHASES


class BenchRunCrashed(RuntimeError):
    """A benchmark run failed for a reason other than its settings (which the trainer refuses with exit 2)."""


def trainer_command(workers: int) -> list[str]:
    """The trainer, run as a module of the installed package, so the sweep works outside a checkout too."""
    return [sys.executable, "-m", "parallel_ppo", "train-parallel" if workers else "train"]


BENCH_RUN_SETS = ("--set", "logging.progress=off", "--set", "run.limit_seconds=0", "--set", "eval.interval_seconds=0")
"""What every benchmark run adds to its trainer command: no progress line, no compute-limit measurement and no
periodic evaluation, so the run's time is training alone."""


def run_bench_trainer(cmd: list[str], name: str) -> None:
    """Run a benchmark's trainer command to its end: exit 2 (settings refused) is a ConfigError, any other
    failure a BenchRunCrashed, each naming the run and the trainer's last line."""
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        if proc.returncode == 2:
            raise ConfigError(f"benchmark run {name} refused its settings: {last}")
        raise BenchRunCrashed(f"benchmark run {name} crashed (exit status {proc.returncode}): {last}")


def run_point(out: Path, workers: int, envs_per_worker: int, seconds: float, config: str, extra: list[str],
              worker_threads: int = 1) -> dict[str, Any]:
    """One timed run (workers == 0: sequential with `envs_per_worker` envs); returns its table row."""
    if workers:
        cmd = [*trainer_command(workers), "--num-workers", str(workers), "--num-envs-per-worker",
               str(envs_per_worker), "--set", f"parallel.worker_threads={worker_threads}",
               "--set", f"env.num_envs={workers * envs_per_worker}"]  # the layout's total, over a config's
    else:
        cmd = [*trainer_command(0), "--num-envs", str(envs_per_worker)]
    cmd += ["--config", config, "--duration", f"{seconds / 3600:.8f}", "--output-dir", str(out), "--overwrite",
            *BENCH_RUN_SETS, *extra]
    run_bench_trainer(cmd, out.name)
    return point_row(load_run(out.name, out), worker_threads)


def point_row(run: Run, worker_threads: int = 1) -> dict[str, Any]:
    """A finished run as a row of the scaling table."""
    s = run.summary
    return {
        "label": run.label, "workers": s.num_workers,
        "envs_per_worker": s.num_envs_per_worker if s.num_workers else s.num_envs,
        "worker_threads": worker_threads if s.num_workers else None,
        "envs": s.num_envs, "steps_per_second": run.steady_sps, "updates": s.updates,
        "peak_rss_mb": s.peak_rss_mb, "peak_pss_mb": s.peak_pss_mb,
        "phase_fractions": s.phase_fractions, "run_dir": str(run.path),
        "hardware": s.hardware, "threads": s.threads,
    }


def add_speedups(rows: list[dict[str, Any]]) -> None:
    """Speed-up and efficiency of every row against the first (`runs.speedup`, `runs.efficiency`)."""
    base = rows[0]
    for r in rows:
        r["speedup"] = speedup(r["steps_per_second"], base["steps_per_second"])
        r["efficiency"] = efficiency(r["speedup"], r["workers"], base["workers"])


def scaling_table(rows: list[dict[str, Any]]) -> str:
    lines = ["| envs | workers | envs/worker | threads/worker | steps/s | speed-up | efficiency | peak RSS (MB) | "
             "peak PSS (MB) |", "|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        pss = f"{r['peak_pss_mb']:,.0f}" if r.get("peak_pss_mb") else "-"
        threads = r["worker_threads"] or "-"
        lines.append(f"| {r['envs']} | {r['workers'] or 'seq'} | {r['envs_per_worker']} | {threads} | "
                     f"{r['steps_per_second']:,.0f} | {r['speedup']:.2f}× | {100 * r['efficiency']:.0f}% | "
                     f"{r['peak_rss_mb']:,.0f} | {pss} |")
    return "\n".join(lines)


def plot_scaling(rows: list[dict[str, Any]], path: Path) -> None:
    """Speed-up vs workers with the ideal line, efficiency, and stacked phase fractions per point."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    par = [r for r in rows if r["workers"]]
    fig, axes = plt.subplots(1, 3, figsize=(17, 5.2))
    ax = axes[0]
    for m in sorted({r["envs_per_worker"] for r in par}):
        pts = [r for r in par if r["envs_per_worker"] == m]
        ax.plot([r["workers"] for r in pts], [r["speedup"] for r in pts], "o-", label=f"{m} envs/worker")
    top = max([r["workers"] for r in par] + [1])
    base_workers = max(rows[0]["workers"], 1)
    ax.plot([1, top], [1 / base_workers, top / base_workers], "k--", lw=1, label="ideal (linear)")
    ax.set(xlabel="workers", ylabel=f"speed-up over {rows[0]['label']}", title="Speed-up (env steps/s ratio)")
    ax.legend()
    ax.grid(alpha=0.3)

    ax = axes[1]
    for m in sorted({r["envs_per_worker"] for r in par}):
        pts = [r for r in par if r["envs_per_worker"] == m]
        ax.plot([r["workers"] for r in pts], [100 * r["efficiency"] for r in pts], "o-", label=f"{m} envs/worker")
    ax.axhline(100, color="k", ls="--", lw=1)
    ax.set(xlabel="workers", ylabel="parallel efficiency (%)", title="Efficiency = speed-up / workers",
           ylim=(0, max(110, max(100 * r["efficiency"] for r in rows) + 10)))
    ax.legend()
    ax.grid(alpha=0.3)

    ax = axes[2]
    labels = [r["label"] for r in rows]
    bottom = [0.0] * len(rows)
    for phase in PHASES:
        values = [100 * r["phase_fractions"].get(phase, 0.0) for r in rows]
        ax.bar(labels, values, bottom=bottom, label=phase)
        bottom = [b + v for b, v in zip(bottom, values, strict=True)]
    ax.set(ylabel="share of wall time (%)", title="Where the time goes", ylim=(0, 105))
    ax.tick_params(axis="x", rotation=30)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    hw = rows[0]["hardware"]
    fig.suptitle(f"Scaling on {hw['cpu_model']} ({hw['physical_cores']} physical / {hw['logical_cores']} "
                 f"logical cores, {hw['memory_gb']} GB)")
    fig.tight_layout()
    atomic_write(path, lambda f: fig.savefig(f, format="png", dpi=110))
    plt.close(fig)


def write_scaling(rows: list[dict[str, Any]], out_dir: Path, title: str) -> None:
    """scaling.json, scaling.md and scaling.png in `out_dir`."""
    add_speedups(rows)
    write_json(out_dir / "scaling.json", {"title": title, "points": rows})
    hw = rows[0]["hardware"]
    text = (f"# {title}\n\n{scaling_table(rows)}\n\nSteps/s are steady-state (after the first update) of real "
            f"training runs; speed-up is relative to `{rows[0]['label']}`; efficiency = speed-up / "
            f"(workers / its workers). Peak PSS counts memory shared between processes once.\n\n"
            f"Machine: {hw['cpu_model']}, {hw['physical_cores']} physical / {hw['logical_cores']} logical cores, "
            f"{hw['memory_gb']} GB.\n")
    write_text(out_dir / "scaling.md", text)
    plot_scaling(rows, out_dir / "scaling.png")


def best_layout(rows: list[dict[str, Any]]) -> dict[str, Any]:
    return max(rows, key=lambda r: r["steps_per_second"])


def default_worker_counts() -> list[int]:
    """1, 2, 4, ... up to the physical core count (which is included even when not a power of two)."""
    import psutil

    cores = psutil.cpu_count(logical=False) or psutil.cpu_count() or 1
    counts = [1]
    while counts[-1] * 2 <= cores:
        counts.append(counts[-1] * 2)
    if counts[-1] != cores:
        counts.append(cores)
    return counts


def sweep(out_dir: Path, workers: list[int], envs_per_worker: list[int], seconds: float, config: str,
          extra: list[str], sequential: bool = True) -> list[dict[str, Any]]:
    """A sequential point (same envs as one worker, when asked) then every workers × envs-per-worker point."""
    rows = []
    points = [(0, m) for m in envs_per_worker[:1]] if sequential else []
    points += [(w, m) for m in envs_per_worker for w in workers]
    for w, m in points:
        label = f"seq_e{m}" if w == 0 else f"w{w}_e{m}"
        print(f"  {label}: {'sequential' if w == 0 else f'{w} workers'} × {m} envs, {seconds:.0f} s ...",
              flush=True)
        rows.append(run_point(out_dir / label, w, m, seconds, config, extra))
        print(f"    {rows[-1]['steps_per_second']:,.0f} steps/s, peak PSS {rows[-1]['peak_pss_mb'] or 0:,.0f} MB",
              flush=True)
    return rows


def autotune(out_dir: Path, seconds: float, config: str, extra: list[str]) -> dict[str, Any]:
    """Short runs over layouts that fit this machine; writes autotune.json and a ready config for the fastest."""
    import yaml

    from parallel_ppo.config import load_yaml

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
    add_speedups(rows)
    best = best_layout(rows)
    cfg = load_yaml(config)
    if best["workers"]:
        cfg.setdefault("parallel", {}).update({"num_workers": best["workers"],
                                               "num_envs_per_worker": best["envs_per_worker"],
                                               "worker_threads": best["worker_threads"]})
        cfg.get("env", {}).pop("num_envs", None)  # derived from the layout in parallel mode
    else:
        cfg.setdefault("env", {})["num_envs"] = best["envs_per_worker"]
    trainer = "train-parallel" if best["workers"] else "train"
    header = (f"# Written by `make autotune`: the fastest layout measured on this machine "
              f"({best['steps_per_second']:,.0f} env steps/s).\n# Use: python -m parallel_ppo {trainer} --config "
              f"{out_dir / 'ppo_autotuned.yaml'}\n")
    text = header + yaml.safe_dump(cfg, sort_keys=False)
    write_text(out_dir / "ppo_autotuned.yaml", text)
    result = {"best": best, "trainer": trainer, "config": str(out_dir / "ppo_autotuned.yaml"), "points": rows}
    write_json(out_dir / "autotune.json", result)
    return result
