"""Two settings of one config in interleaved pairs: the parallel trainer with settings A (or, with --sequential-a,
the sequential trainer), then the parallel trainer with settings B (ABBA order: every second pair starts with B),
N times, and the ratio B/A of their steady-state SPS and their phases per 1,000 env steps. What a setting costs in
speed, measured in one sitting.

    .venv/bin/python scripts/setting_pairs.py --config config/robosuite_lift_camera.yaml --pairs 3 --minutes 4 \\
        --a "unshifted: --set training.augment_shift=0" --b "recipe:" --output-dir benchmarks/shift_speed

(`make camera-recipe-speed` runs the camera config with a privileged critic and the shift against it without them;
`make overlap-speed` the sequential trainer against overlapped workers on robosuite Lift from state.) With
`--a-checkout DIR`, A runs from another checkout of the project (its trainer and its copy of the config: a git
worktree at the commit before a change, `git worktree add DIR COMMIT`), so the pairs measure the change itself.

Each of --a and --b is `LABEL: ARGS...` (trainer arguments; none for the config as it is). Writes <output-dir>/pairs.md
after every pair and <output-dir>/pairs.json at the end: an evidence file for docs/results (machine, date, commit,
command, the ratios, the table). A measurement: exits 0 whatever the ratios.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shlex
import statistics
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from parallel_ppo.bench.study import available_cores  # noqa: E402
from parallel_ppo.bench.trainer_runs import BenchRunCrashed, checkout_path, run_bench_trainer  # noqa: E402
from parallel_ppo.cli.common import OneLineParser, duration_in, interrupted, positive_int, some_path, stop_on_sigterm  # noqa: E402
from parallel_ppo.cli.train import trainer_config  # noqa: E402
from parallel_ppo.core.files import write_text  # noqa: E402
from parallel_ppo.errors import ConfigError  # noqa: E402
from parallel_ppo.runs import fingerprint  # noqa: E402
from parallel_ppo.runs.directory import check_writable  # noqa: E402
from parallel_ppo.runs.reading import Run, load_run  # noqa: E402

PHASES = ("env", "render", "inference", "update", "sync")
"""The phases shown per 1,000 env steps (the workers': per-worker means)."""


def variant(text: str) -> tuple[str, list[str]]:
    """`LABEL: ARGS...` → (label, argument list)."""
    label, colon, args = text.partition(":")
    if not colon or not label.strip():
        raise argparse.ArgumentTypeError(f"expects LABEL: ARGS..., got {text!r}")
    return label.strip(), shlex.split(args)


def train(config: str, run_dir: Path, minutes: float, args: list[str], sequential: bool = False,
          root: Path = ROOT) -> Run:
    """One run of the trainer in the checkout at `root`, its own package and config file. It runs from that folder
    (relative paths in `args` are read from there), with the folder first on PYTHONPATH: in a checkout older than
    `processes.start_forkserver`, the workers import the package their forkserver finds from where it started."""
    root = root.resolve()
    script = "train_timed.py" if sequential else "train_parallel_timed.py"
    cmd = [sys.executable, str(root / script), "--config", str(root / config), "--duration",
           f"{minutes / 60:.6f}", "--output-dir", str(run_dir.resolve()), "--overwrite", "--set",
           "logging.progress=off", *args]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")]))}
    try:
        run_bench_trainer(cmd, run_dir.name, cwd=root, env=env)
    except (ConfigError, BenchRunCrashed) as e:
        sys.exit(f"setting_pairs.py: error: {e}")
    return load_run(run_dir.name, run_dir)


def figures(run: Run) -> dict[str, Any]:
    """A run's steady SPS, its phases per 1,000 env steps and its learner settings (`precision/chunk`)."""
    learner = run.summary.learner or {}
    chunk = learner.get("microbatch_size") or "whole"
    return {"sps": round(float(run.steady_sps), 2), "learner": f"{learner.get('precision', '?')}/{chunk}",
            **{f"{phase}_s_per_1k": round(run.per_thousand_steps(phase), 4) for phase in PHASES}}


def trainer(args: argparse.Namespace, label: str) -> str:
    """Which trainer ran the variant `label`."""
    return "sequential" if args.sequential_a and label == args.a[0] else "parallel"


def refusal(args: argparse.Namespace) -> str | None:
    """Why the pairs cannot run, before any output exists: another checkout without the trainer or config, a
    missing config, one label for both, a variant's arguments that its trainer would refuse (an A run from another
    checkout is checked by that checkout's trainer when it starts), or an output folder that cannot be written."""
    if args.a[0] == args.b[0]:
        return f"--a and --b need labels of their own, got {args.a[0]!r} for both"
    needs = ("train_timed.py" if args.sequential_a else "train_parallel_timed.py", args.config)
    if args.a_checkout and not all((args.a_checkout / name).is_file() for name in needs):
        return f"--a-checkout {args.a_checkout} is not a checkout of this project with {' and '.join(needs)}"
    if not (ROOT / args.config).is_file():
        return f"no config {args.config}"
    try:
        for label, extra in (args.a, args.b):
            if not (args.a_checkout and label == args.a[0]):
                command = "train" if trainer(args, label) == "sequential" else "train-parallel"
                trainer_config(["python", "-m", "parallel_ppo", command, "--config", str(ROOT / args.config),
                                *extra], label)
        check_writable(Path(args.output_dir), f"--output-dir {args.output_dir}")
    except ConfigError as e:
        return str(e)
    return None


def evidence_of(args: argparse.Namespace, pairs: list[dict]) -> dict:
    """The sitting as an evidence file: machine, date, commit, command, the ratios and the pairs' table."""
    (a, a_args), (b, b_args) = args.a, args.b
    ratios = [pair["ratio"] for pair in pairs]
    columns = ["pair", f"{a} SPS", f"{b} SPS", f"{b}/{a}", f"learner {a}", f"learner {b}",
               *(f"{ph} s/1k {x}" for ph in PHASES for x in (a, b))]
    rows = [[i, pair[a]["sps"], pair[b]["sps"], pair["ratio"], pair[a]["learner"], pair[b]["learner"],
             *(pair[x][f"{ph}_s_per_1k"] for ph in PHASES for x in (a, b))] for i, pair in enumerate(pairs, 1)]
    return {"machine": f"{fingerprint.describe_cpu()}, {available_cores()} cores", "cpu_kind": fingerprint.cpu_kind(),
            "cpu_family": fingerprint.read_cpu_family(), "date": datetime.date.today().isoformat(),
            "commit": fingerprint.source_commit() or "unknown",
            "command": shlex.join(["scripts/setting_pairs.py", *sys.argv[1:]]), "config": args.config,
            "minutes": args.minutes, "a": {"label": a, "args": a_args, "trainer": trainer(args, a),
                                            "commit": fingerprint.source_commit(args.a_checkout or ROOT)},
            "b": {"label": b, "args": b_args, "trainer": trainer(args, b)},
            "figures": {"ratios": ratios, "ratio_median": statistics.median(ratios), "ratio_min": min(ratios),
                        "ratio_max": max(ratios), "ratio_range": [min(ratios), max(ratios)]},
            "tables": {"pairs": {"columns": columns, "rows": rows}}}


def main() -> int:
    p = OneLineParser(prog="setting_pairs.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--config", required=True, type=some_path)
    p.add_argument("--a", type=variant, required=True, metavar="'LABEL: ARGS'")
    p.add_argument("--b", type=variant, required=True, metavar="'LABEL: ARGS'")
    p.add_argument("--sequential-a", action="store_true", help="A runs the sequential trainer (train_timed.py)")
    p.add_argument("--a-checkout", type=lambda text: Path(some_path(text)), metavar="DIR",
                   help="A runs from this checkout of the project")
    p.add_argument("--pairs", type=positive_int, default=3, metavar="N")
    p.add_argument("--minutes", type=duration_in("m"), default=4.0, metavar="TIME")
    p.add_argument("--output-dir", type=some_path, default="benchmarks/setting_pairs")
    args = p.parse_args()
    args.config = checkout_path(args.config, ROOT)
    if problem := refusal(args):
        print(f"setting_pairs.py: error: {problem}", file=sys.stderr)
        return 2
    stop_on_sigterm()  # once its settings are checked: a SIGTERM before then ends it as any process
    return pairs_of(args)


def pairs_of(args: argparse.Namespace) -> int:
    """The pairs, one run at a time, and their table and evidence file; Ctrl-C stops the run under way and keeps
    the table of the pairs measured before."""
    (a, a_args), (b, b_args) = args.a, args.b
    out = Path(args.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    lines = [f"| pair | {a} SPS | {b} SPS | {b}/{a} | " + " | ".join(f"{ph} s/1k {a} | {b}" for ph in PHASES) + " |",
             "|---:|---:|---:|---:|" + "---:|" * (2 * len(PHASES))]
    pairs: list[dict] = []
    for pair in range(1, args.pairs + 1):
        order = [(a, a_args), (b, b_args)] if pair % 2 else [(b, b_args), (a, a_args)]  # ABBA
        runs = {}
        for label, extra in order:
            print(f"pair {pair}: {label} for {args.minutes:g} min ...", flush=True)
            sequential = trainer(args, label) == "sequential"
            root = args.a_checkout if label == a and args.a_checkout else ROOT
            try:
                run = train(args.config, out / f"{label}_{pair}", args.minutes, extra, sequential, root)
            except KeyboardInterrupt:  # the run was stopped by then
                kept = f"the {len(pairs)} pairs measured are in {out / 'pairs.md'}" if pairs else "no pair was measured"
                return interrupted("setting_pairs.py", kept)
            runs[label] = figures(run)
        pairs.append({**runs, "ratio": round(runs[b]["sps"] / runs[a]["sps"], 4), "order": [x for x, _ in order]})
        lines.append(f"| {pair} | {runs[a]['sps']:.1f} | {runs[b]['sps']:.1f} | {pairs[-1]['ratio']:.3f} | "
                     + " | ".join(f"{runs[x][f'{ph}_s_per_1k']:.3f}" for ph in PHASES for x in (a, b)) + " |")
        print(lines[-1], flush=True)
        write_text(out / "pairs.md", "\n".join(lines) + "\n")
    evidence = evidence_of(args, pairs)
    write_text(out / "pairs.json", json.dumps(evidence, indent=1) + "\n")
    print("\n".join(lines))
    found = evidence["figures"]
    print(f"{b}/{a} SPS: median {found['ratio_median']:.3f}, lowest {found['ratio_min']:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
