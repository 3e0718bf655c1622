"""Sequential against parallel in interleaved pairs: the same shipped configs, run one after the other, N times (in
ABBA order: every second pair starts with the parallel run), and the ratio of their steady-state SPS and of their
update time per 1,000 env steps (issue 24's acceptance 1).

    .venv/bin/python scripts/mode_pairs.py --pairs 3 --minutes 6 [--output-dir benchmarks/mode_pairs] [-- ARGS...]
    .venv/bin/python scripts/mode_pairs.py --config config/mujoco_pixels.yaml ...   (one config for both modes)

ARGS after `--` go to both trainers (e.g. `--set training.precision=fp32`). A measurement: exits 0 whatever the
ratios; the table is rewritten to <output-dir>/pairs.md after every pair. `--check` checks the arguments, the configs
and the output folder as a measurement would before it starts, and exits (0) without running or writing anything.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from parallel_ppo.bench.trainer_runs import BenchRunCrashed, checkout_path, run_bench_trainer  # noqa: E402
from parallel_ppo.cli.common import OneLineParser, duration_in, interrupted, positive_int, some_path, stop_on_sigterm  # noqa: E402
from parallel_ppo.cli.train import trainer_config  # noqa: E402
from parallel_ppo.core.files import write_text  # noqa: E402
from parallel_ppo.errors import ConfigError  # noqa: E402
from parallel_ppo.runs.directory import check_writable  # noqa: E402
from parallel_ppo.runs.reading import Run, load_run  # noqa: E402

TRAINERS = {"sequential": ("train_timed.py", "config/ppo_sequential.yaml"),
            "parallel": ("train_parallel_timed.py", "config/ppo_parallel.yaml")}
PHASES = ("env", "render", "inference", "eval")
"""The phases shown beside the update, each per 1,000 env steps (parallel: per-worker means)."""
HEADER = ["| pair | sequential SPS | parallel SPS | ratio | update s/1k steps seq | par | par/seq | "
          + " | ".join(f"{p} s/1k seq | par" for p in PHASES) + " |",
          "|---:|---:|---:|---:|---:|---:|---:|" + "---:|" * (2 * len(PHASES))]


def train(mode: str, run_dir: Path, minutes: float, extra: list[str], config: str | None) -> Run:
    script, shipped = TRAINERS[mode]
    config = config or shipped
    cmd = [sys.executable, str(ROOT / script), "--config", str(ROOT / config), "--duration", f"{minutes / 60:.6f}",
           "--output-dir", str(run_dir), "--overwrite", "--set", "logging.progress=off", *extra]
    try:
        run_bench_trainer(cmd, run_dir.name)
    except (ConfigError, BenchRunCrashed) as e:
        sys.exit(f"mode_pairs.py: error: {e}")
    return load_run(mode, run_dir)


def refusal(config: str | None, extra: list[str], out: Path) -> str | None:
    """Why the pairs cannot run, before any output exists: a missing config, arguments a trainer would refuse, or an
    output folder that cannot be written."""
    try:
        check_writable(out, f"--output-dir {out}")
    except ConfigError as e:
        return str(e)
    for mode, (_, shipped) in TRAINERS.items():
        if not (ROOT / (config or shipped)).is_file():
            return f"no config {config or shipped}"
        try:
            trainer_config(["python", "-m", "parallel_ppo", "train" if mode == "sequential" else "train-parallel",
                            "--config", str(ROOT / (config or shipped)), *extra], mode)
        except ConfigError as e:
            return str(e)
    return None


def main() -> int:
    p = OneLineParser(prog="mode_pairs.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--pairs", type=positive_int, default=3, metavar="N")
    p.add_argument("--minutes", type=duration_in("m"), default=6.0, metavar="TIME")
    p.add_argument("--output-dir", type=some_path, default="benchmarks/mode_pairs")
    p.add_argument("--config", type=some_path, help="one config for both modes (default: the shipped starpilot pair)")
    p.add_argument("--check", action="store_true", help="check the arguments, then exit without running anything")
    args, extra = p.parse_known_args()
    extra = [a for a in extra if a != "--"]
    out = Path(args.output_dir)
    config = args.config and checkout_path(args.config, ROOT)
    if problem := refusal(config, extra, out):
        print(f"mode_pairs.py: error: {problem}", file=sys.stderr)
        return 2
    if args.check:
        return 0
    stop_on_sigterm()
    out.mkdir(parents=True, exist_ok=True)
    lines = list(HEADER)
    for pair in range(1, args.pairs + 1):
        runs = {}
        for mode in TRAINERS if pair % 2 else reversed(TRAINERS):  # ABBA: a drift of the machine favours neither
            print(f"pair {pair}: {mode} for {args.minutes:g} min ...", flush=True)
            try:
                runs[mode] = train(mode, out / f"{mode}_{pair}", args.minutes, extra, config)
            except KeyboardInterrupt:  # the run was stopped by then
                done = len(lines) - len(HEADER)
                return interrupted("mode_pairs.py", f"the {done} pairs measured are in {out / 'pairs.md'}" if done
                                   else "no pair was measured")
        s, q = runs["sequential"], runs["parallel"]
        us, uq = s.per_thousand_steps("update"), q.per_thousand_steps("update")
        lines.append(f"| {pair} | {s.steady_sps:.1f} | {q.steady_sps:.1f} | {q.steady_sps / s.steady_sps:.3f} | "
                     f"{us:.3f} | {uq:.3f} | {uq / us:.3f} | "
                     + " | ".join(f"{r.per_thousand_steps(phase):.3f}" for phase in PHASES
                                  for r in (s, q)) + " |")
        print(lines[-1], flush=True)
        write_text(out / "pairs.md", "\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
