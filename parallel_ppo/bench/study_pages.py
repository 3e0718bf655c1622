"""The study's pages: its table, plot and data (`<stem>.md`, `.png`, `.json`), with each point's speed-up and
efficiency."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from parallel_ppo.bench.study_arithmetic import FORMER_CHUNK
from parallel_ppo.core.files import atomic_write, write_json, write_text
from parallel_ppo.core.timing import PHASES
from parallel_ppo.runs.fingerprint import mesa_egl, osmesa

FAMILIES = ("threads", "copies", "workers", "overlap", "ranks", "cuda", "cuda_overlap")
"""The study's families of runs, in the order they run and are shown (`bench.study`)."""

FAMILY_TEXT = {
    "threads": "1 process, N intra-op threads (sequential trainer, CPU)",
    "copies": "N one-thread sequential trainers at once, sharing nothing, their steps/s summed: what N busy cores give "
              "the one-core job on this machine, the yardstick of the families below (not a bound: they can pass it)",
    "workers": "N worker processes, learner on the CPU (parallel trainer)",
    "overlap": "N worker processes collecting while the learner on the CPU, one thread, updates, taking the threads "
               "of parallel.idle_learner_threads once they have collected (parallel trainer, parallel.overlap: "
               "policy lag 1)",
    "ranks": "N distributed ranks, each a sequential collector and learner (torchrun, gloo)",
    "cuda": "N CPU worker processes, learner on CUDA, the whole minibatch at once (parallel trainer, --device cuda)",
    "cuda_overlap": "N CPU worker processes collecting while the learner on CUDA updates, the whole minibatch at once "
                    "(parallel trainer, --device cuda, parallel.overlap: policy lag 1)",
}
GPU_FAMILIES = {"cuda": "workers", "cuda_overlap": "overlap"}
"""The families whose learner is on the GPU, each with its CPU twin: the same workers, the learner on the CPU."""


def add_ratios(rows: list[dict[str, Any]]) -> None:
    """Speed-up and efficiency of every measured row. The base of the CPU families is one process with one
    thread (`threads_1`), so efficiency = speed-up / processes (without `threads_1`, each family's first point). A
    GPU family's row (`GPU_FAMILIES`: a GPU is not a core) is set against its CPU twin of as many workers, so its
    speed-up is what the GPU learner gains and it has no efficiency; without that twin, no ratio."""
    ok = [r for r in rows if "error" not in r]
    by_label = {r["label"]: r for r in ok}
    for family in FAMILIES:
        members = [r for r in ok if r["family"] == family]
        for r in members:
            if family in GPU_FAMILIES:
                base = by_label.get(f"{GPU_FAMILIES[family]}_{r['processes']}")
                if base is not None:
                    r["base"], r["speedup"] = base["label"], r["steps_per_second"] / base["steps_per_second"]
                continue
            base = by_label.get("threads_1") or members[0]
            r["base"] = base["label"]
            r["speedup"] = r["steps_per_second"] / base["steps_per_second"]
            r["efficiency"] = r["speedup"] / (r["processes"] / base["processes"])


SHOWN_PHASES = ("env", "render", "inference", "sync", "update", "allreduce")


def study_table(rows: list[dict[str, Any]]) -> str:
    """The markdown table: SPS, speed-up, efficiency and the phase split of every point."""
    head = ["family", "processes", "envs", "minibatch", "learner", "updates", "steps/s", "vs", "speed-up",
            "efficiency", *(f"{p} %" for p in SHOWN_PHASES), "other %"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * 2 + "---:|" * (len(head) - 2)]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['family']} | {r['processes']} | failed: {r['error']} |" + " |" * (len(head) - 3))
            continue
        fractions = r["phase_fractions"]
        shown = [100 * fractions.get(p, 0.0) for p in SHOWN_PHASES]
        other = max(0.0, 100 * sum(fractions.get(p, 0.0) for p in PHASES) - sum(shown))
        chunk = point_chunk_text(r.get("microbatch"), learner_minibatch(r))
        lent = r["threads"].get("learner_while_workers_wait")  # an overlapped learner's, once its workers wait
        threads = f"{r['threads'].get('learner', '?')}{f' (then {lent})' if lent else ''} thr"
        learner = f"{r['device']}, {threads}, {r.get('precision', '?')}{chunk}"
        lines.append("| " + " | ".join([
            r["family"], str(r["processes"]), str(r["envs"]), str(r.get("batch_size", "-")), learner,
            str(r["updates"]), f"{r['steps_per_second']:,.0f}", r.get("base", "-"),
            f"{r['speedup']:.2f}×" if "speedup" in r else "-",
            f"{100 * r['efficiency']:.0f}%" if "efficiency" in r else "-", *(f"{v:.0f}" for v in shown),
            f"{other:.0f}"]) + " |")
    return "\n".join(lines)


def cut_note(rows: list[dict[str, Any]]) -> str:
    """What `parallel.sync_fraction` or `distributed.sync_fraction` cut, for the points that cut steps ("" where none
    did)."""
    cut = [f"{r['label']} {100 * r['rollout_cut']:.2f}%" for r in rows if r.get("rollout_cut")]
    return ("Steps cut by `parallel.sync_fraction` or `distributed.sync_fraction` (the mean share of a steady "
            f"rollout's steps that its slowest workers or ranks did not take): {', '.join(cut)}.\n\n") if cut else ""


def pace_note(rows: list[dict[str, Any]]) -> str:
    """Which worker the points with workers waited for (summary.json's `worker_pace`; "" where none counted one)."""
    paced = [f"{r['label']} {r['pace_slowest_share']:.2f} of {r['pace_rollouts']}, "
             f"{r['pace_slowest_excess_seconds']:.3g} s" for r in rows if r.get("pace_rollouts")]
    return ("The slowest worker of each rollout (summary.json's `worker_pace`): the share of the rollouts in which the "
            "one most often slowest was (1 / workers where each is in turn, 1 where one always is), of how many, and "
            "the seconds the slowest took over the mean worker's for a whole rollout at its pace, a rollout's mean: "
            f"{', '.join(paced)}.\n\n") if paced else ""


COOPERATING = ("workers", "overlap", "ranks")
"""The CPU families whose processes share one training run, set against the copies (`copies_note`)."""


def copies_note(rows: list[dict[str, Any]]) -> str:
    """What N busy cores gave the one-core job (the `copies` points) and what the cooperating families made of it at
    the same count ("" where no copies were measured)."""
    ok = {r["label"]: r for r in rows if "error" not in r}
    parts = []
    for c in (r for r in ok.values() if r["family"] == "copies"):
        n, sps = c["processes"], c["steps_per_second"]
        shares = [f"{f}_{n} {ok[f'{f}_{n}']['steps_per_second'] / sps:.2f}" for f in COOPERATING if f"{f}_{n}" in ok]
        against = f"{c['speedup']:.2f}× {c['base']} " if c.get("base") == "threads_1" else ""
        span = f"over a common steady span {c['copies_span']:.2f} of a copy's, " if "copies_span" in c else ""
        parts.append(f"{c['label']} {against}{span}each copy "
                     f"{min(c['copies_sps']):,.0f}–{max(c['copies_sps']):,.0f} steps/s"
                     + (f" ({', '.join(shares)} of it)" if shares else ""))
    return ("What N busy cores give the one-core job (the `copies` points: N one-core runs at once, sharing nothing, "
            "their steps/s summed over the span in which all ran steady, as a share of one copy's own span) and the "
            "cooperating families' steps/s as a share of it at the same count (above 1 where they use the cores "
            f"better than N runs apart): {'; '.join(parts)}.\n\n") if parts else ""


def plot_study(rows: list[dict[str, Any]], path: Path, title: str) -> None:
    """Steps/s and efficiency against processes per family, and the phase split of every point."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ok = [r for r in rows if "error" not in r]
    fig, axes = plt.subplots(1, 3, figsize=(18, 5.4))
    for family in FAMILIES:
        pts = [r for r in ok if r["family"] == family]
        if pts:
            n = [r["processes"] for r in pts]
            axes[0].plot(n, [r["steps_per_second"] for r in pts], "o-", label=family)
            if family not in GPU_FAMILIES:  # a GPU learner's gain over the CPU's is no efficiency
                axes[1].plot(n, [100 * r["efficiency"] for r in pts], "o-", label=family)
    base = next((r for r in ok if r["label"] == "threads_1"), None)
    counts = sorted({r["processes"] for r in ok})
    if base is not None:  # at each count: a straight line from 1 to N would bend away from it on the log axis
        ideal = sorted({1, *counts})
        axes[0].plot(ideal, [n * base["steps_per_second"] for n in ideal], "k--", lw=1, label="ideal (1 core × N)")
    for ax in axes[:2]:
        ax.set_xscale("log", base=2)
        ax.set_xticks(counts, [str(n) for n in counts])
        ax.set_xlabel("processes (threads, copies, workers or ranks)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    axes[0].set(ylabel="env steps/s (steady state)", title="Throughput")
    axes[1].axhline(100, color="k", ls="--", lw=1)
    axes[1].set(ylabel="efficiency (%)", title="Efficiency = speed-up / processes (each against its 'vs' point)")
    ax = axes[2]
    labels = [r["label"] for r in ok]
    bottom = [0.0] * len(ok)
    for phase in PHASES:
        values = [100 * r["phase_fractions"].get(phase, 0.0) for r in ok]
        if any(values):
            ax.bar(labels, values, bottom=bottom, label=phase)
            bottom = [b + v for b, v in zip(bottom, values, strict=True)]
    ax.set(ylabel="share of wall time (%)", title="Where the time goes", ylim=(0, 105))
    ax.tick_params(axis="x", rotation=60, labelsize=7)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.suptitle(title)
    fig.tight_layout()
    atomic_write(path, lambda f: fig.savefig(f, format="png", dpi=100))
    plt.close(fig)


def mesa_threads(meta: dict[str, Any], rows: list[dict[str, Any]]) -> str:
    """The page's caveat where Mesa's llvmpipe drew with threads of its own: the points measured at a commit whose
    workers' points lack their drawing threads (`draw_per_worker`, recorded since 24169b4; the trainer set
    LP_NUM_THREADS to them since 958c98b), without the user's LP_NUM_THREADS."""
    drawing = meta.get("drawing") or {}
    if not (mesa_egl(drawing) or osmesa(drawing)) or "LP_NUM_THREADS" in drawing:
        return ""
    commits = {r.get("commit") for r in rows if "worker" in r["threads"] and "draw_per_worker" not in r["threads"]}
    before = [r["label"] for r in rows if r.get("commit") in commits]  # a sequential point of theirs too
    if not before:
        return ""
    return (f", but for the drawing: {', '.join(before)} were measured before the trainer set Mesa's drawing "
            "threads (LP_NUM_THREADS), and where llvmpipe drew it started a thread per core in every process, so "
            "those points may have used more cores")


def results_files(stem: Path) -> dict[str, Path]:
    """The study's table, data and plot: `<stem>.md`, `<stem>.json` and `<stem>.png`."""
    return {ext: stem.parent / f"{stem.name}.{ext}" for ext in ("md", "json", "png")}


def measured_labels(rows: list[dict[str, Any]]) -> set[str]:
    """The labels of the points in `rows` that have a figure (no error)."""
    return {r["label"] for r in rows if "error" not in r}


def merge_rows(old: list[dict[str, Any]], new: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The points of an earlier study in the same results folder with every point measured now replaced (so a
    study can be measured in several calls of a short-lived machine), in family then process order; a point that
    failed now keeps the figure it had."""
    figures = measured_labels(old)
    new = [r for r in new if "error" not in r or r["label"] not in figures]
    measured = {r["label"] for r in new}
    rows = [r for r in old if r["label"] not in measured] + new
    return sorted(rows, key=lambda r: (FAMILIES.index(r["family"]), r["processes"]))


def chunks(microbatch: int) -> str:
    """How the study's points chunked their update, for its page: the CPU's chunk, a GPU's whole minibatch."""
    if microbatch == 0:
        return "the whole minibatch at once (on the CPU and a GPU)"
    return f"in chunks of {microbatch} on the CPU (a minibatch no larger whole, as on a GPU)"


def learner_minibatch(row: dict[str, Any]) -> int | None:
    """The minibatch each learner of a row's point chunks: its `batch_size` is the point's, which each distributed rank
    or copy (a learner of its own) takes a share of."""
    size = row.get("batch_size")
    return size // row["processes"] if size is not None and row["family"] in ("ranks", "copies") else size


def point_chunk_text(microbatch: int | None, minibatch: int | None) -> str:
    """A row's chunk for its learner column: none recorded, whole (no chunk, or one no smaller than the minibatch,
    which the update then takes at once) or the chunk."""
    if microbatch is None:
        return ""
    whole = microbatch == 0 or minibatch is not None and microbatch >= minibatch
    return ", whole" if whole else f", chunks of {microbatch}"


def write_results(rows: list[dict[str, Any]], stem: Path, meta: dict[str, Any]) -> None:
    """The study's files (`results_files(stem)`) for `rows` (measured now, and kept from before)."""
    files = results_files(stem)
    stem.parent.mkdir(parents=True, exist_ok=True)
    for r in rows:
        r.pop("speedup", None), r.pop("efficiency", None), r.pop("base", None)
    add_ratios(rows)
    hw, settings = meta["hardware"], meta["settings"]
    kind = f" ({', '.join(hw['cpu_kind'])})" if hw.get("cpu_kind") else ""
    machine = (f"{hw['cpu_model']}{kind}, {meta['cores']} cores ({hw['logical_cores']} logical / "
               f"{hw['physical_cores']} physical on the host), {hw['memory_gb']} GB"
               + (f", {meta['gpu']}" if meta.get("gpu") else ""))
    sittings = sorted({r["measured_at"][:16] for r in rows})
    title = "Simulated many-core study" if meta.get("simulated") else "Many-core study"
    sim = (f"**Simulated.** The env's step sleeps for the physics time it stands for ({settings['env']}), so a point "
           f"of N workers runs on these {meta['cores']} cores whatever N: the workers' sleep stands for cores of "
           "their own, and what the figures measure is the trainer's own work (inference, the update, the waits) "
           "on what is left. Not the speed of a machine with N cores.\n\n") if meta.get("simulated") else ""
    write_json(files["json"], {"machine": machine, "date": max(r["measured_at"] for r in rows)[:10], **meta,
                               "points": rows})
    text = (f"# {title}: {machine}\n\n{sim}"
            f"{settings['env']} ({settings['config']}), {settings['envs_per_process']} envs × {settings['n_steps']} "
            f"steps and a minibatch of {settings['batch_per_process']} samples per process (global figures × "
            f"processes), fp32 at every point"
            + (f" (unless set otherwise: {' '.join(settings['extra'])})" if settings["extra"] else "")
            + f", {chunks(meta.get('cpu_microbatch', FORMER_CHUNK))}, "
            f"{settings['seconds']:g} s per run; versions {meta['versions']}"
            + (f"; frames drawn with {' '.join(f'{k}={v}' for k, v in meta['drawing'].items())}"
               if meta.get("drawing") else "") + ".\n\n"
            + "\n".join(f"- `{f}`: {FAMILY_TEXT[f]}" for f in FAMILIES if any(r["family"] == f for r in rows))
            + f"\n\n{study_table(rows)}\n\n{copies_note(rows)}{cut_note(rows)}{pace_note(rows)}"
            "Steps/s are steady state (from the end of update 1 to the end of the last update) of real training "
            "runs with evaluation and the compute-limit measurement off; every point of N processes uses N cores "
            + ("(sleeping workers: these cores stand for N)" if meta.get("simulated") else
               "(an overlapped one N + 1 at most: its learner's thread beside N workers)")
            + mesa_threads(meta, rows) + ". "
            "Speed-up is against the point named under *vs* (one process with one thread on the CPU, `threads_1`, "
            "where it was measured), efficiency = speed-up / (processes / that point's processes); a CUDA family's "
            "against its CPU twin of as many workers (`workers` for `cuda`, `overlap` for `cuda_overlap`), where "
            "measured: the GPU learner's gain, no efficiency, a GPU not being a core. Phases are shares of each "
            "run's wall time.\n\n"
            f"Measured {', '.join(sittings)} with `bench.py study`.\n")
    write_text(files["md"], text)
    plot_study(rows, files["png"], f"{title}: {machine}")
