"""compare_results.py's console and warnings on fabricated run directories (no training, no plots): the console
tables fit 120 columns, the duration warning tells runs of different lengths from runs that stopped at one step
budget, and FLOP figures are printed in a unit that shows them."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

from fake_runs import ROWS, write_run

from parallel_ppo.runs.reading import load_groups
from parallel_ppo.runs.report.formatting import CONSOLE_WIDTH, fmt_flop
from parallel_ppo.runs.report.numbers import compare
from parallel_ppo.runs.report.text import console_summary, render_markdown


def test_console_tables_fit_120_columns_and_the_files_keep_every_column(tmp_path: Path) -> None:
    """Every optional column on (normalized and test return, PSS, GFLOP/s), a distributed layout and long labels."""
    extra = {"normalized_return": 0.512, "test_return_mean": 31.5, "peak_pss_mb": 2100.0, "flops_per_env_step": 6e8,
             "achieved_gflops": 153.6, "peak_gflops": 245.0, "peak_fraction": 0.63}
    specs = [("sequential", [write_run(tmp_path / "sequential", **extra)])]
    for label, layout in (("distributed-4x8", {"mode": "distributed", "world_size": 4, "num_workers": 8,
                                                "num_envs_per_worker": 4, "num_envs": 32}),
                          ("bf16-chunk128", {})):
        specs.append((label, [write_run(tmp_path / label / f"seed_{s}", seed=s, **extra, **layout) for s in (1, 2)]))
    cmp = compare(load_groups(specs))
    console = console_summary(cmp, [])
    tables = console.split("\n  ")[0]  # the verdict and warnings follow, one (long) sentence a line
    assert "4 ranks × 2×4" in tables and "bf16-chunk128/seed_2" in tables and "Across seeds" in tables
    assert max(map(len, tables.splitlines())) <= CONSOLE_WIDTH, tables
    assert "(also in comparison.md: normalized, GFLOP/s (of peak), peak RSS, peak PSS, CPU cores busy, mode)" in tables
    markdown = render_markdown(cmp)
    for column in ("| normalized |", "| GFLOP/s (of peak) |", "| peak PSS |", "| CPU cores busy |", "| mode |"):
        assert column in markdown


def test_the_console_table_keeps_the_success_rate_where_the_env_reports_one(tmp_path: Path) -> None:
    """The success rate is the last column the console leaves out for width: here the test return goes instead."""
    extra = {"normalized_return": 0.5, "test_return_mean": 31.5, "peak_pss_mb": 2100.0,
             "final_metrics": {"success_rate": 0.5}}
    specs = [(label, [write_run(tmp_path / label / f"seed_{s}", seed=s, **extra) for s in (1, 2)])
             for label in ("a-rather-long-label-one", "another-long-label")]
    tables = console_summary(compare(load_groups(specs)), []).split("\n  ")[0]
    results = tables.split("\n\n")[0]
    assert "success" in results and "50%" in results and "test return" in results.splitlines()[-1], results
    assert max(map(len, tables.splitlines())) <= CONSOLE_WIDTH, tables


def test_the_across_seeds_table_says_what_it_left_out_for_width_episode_statistics_first(tmp_path: Path) -> None:
    """Long labels, a success rate and three episode statistics: the console's across-seeds table leaves out the
    episode statistics before SPS, and says so, as the results table does (it dropped them silently, SPS first)."""
    metrics = {"success_rate": 0.5, "episode_drop_count": 3.0, "episode_grasp_time": 9.0, "episode_lift_height": 0.6}
    specs = [(label, [write_run(tmp_path / label / f"seed_{s}", seed=s, final_metrics=metrics) for s in (1, 2)])
             for label in ("bf16_microbatch_overlap_long", "fp32_microbatch_overlap_long")]
    across = console_summary(compare(load_groups(specs)), []).split("Across seeds")[1].split("\n\n")[0]
    assert max(map(len, across.splitlines())) <= CONSOLE_WIDTH, across
    assert "SPS" in across and "episode/lift_height" not in across.splitlines()[1], across
    assert across.splitlines()[-1].startswith("(also in comparison.md: episode/"), across


def _warnings(tmp_path: Path, runs: dict[str, dict]) -> str:
    """The comparison's warnings over runs written with `write_run(**runs[label])`."""
    groups = load_groups([(label, [write_run(tmp_path / label, **kw)]) for label, kw in runs.items()])
    return "\n".join(compare(groups).warnings)


def test_runs_stopped_at_one_step_budget_are_comparable_whatever_their_wall_times(tmp_path: Path) -> None:
    slower = [(u, steps, 2 * wall, ret) for u, steps, wall, ret in ROWS]  # the same 3,072 steps in twice the time
    assert "differ in duration" not in _warnings(tmp_path / "budget", {"fast": {}, "slow": {"rows": slower}})
    timed = {"fast": {"stop_reason": "duration"}, "slow": {"rows": slower, "stop_reason": "duration"}}
    assert "runs differ in duration (18 s (fast) vs 34 s (slow))" in _warnings(tmp_path / "timed", timed)
    shorter = {"long": {}, "short": {"rows": ROWS[:2]}}  # step budgets of 3,072 and 2,048
    assert ("runs differ in duration (3,072 env steps (long) vs 2,048 env steps (short))"
            in _warnings(tmp_path / "steps", shorter))


def test_flop_figures_are_printed_in_a_unit_that_shows_them() -> None:
    from parallel_ppo.runs.closing import end_lines

    assert [fmt_flop(x) for x in (6.1e8, 6.12e7, 1.7e5, 810)] == ["0.61 GFLOP", "61.2 MFLOP", "0.17 MFLOP",
                                                                   "0.81 kFLOP"]
    assert fmt_flop(1234e9, "/s") == "1,234 GFLOP/s"
    mlp = {"stop_reason": "total_steps", "total_env_steps": 4096, "wall_seconds": 2.0, "sps": 3000.0,
           "episodic_return_mean": 20.0, "episodes": 40, "normalized_return": None, "test_return_mean": None,
           "limit_efficiency": None, "achieved_gflops": 0.51, "flops_per_env_step": 1.7e5, "peak_fraction": 0.002,
           "precision": "fp32", "peak_gflops": 240.0, "distributed": None, "worker_pace": None}
    cfg = SimpleNamespace(logging=SimpleNamespace(return_window=100))
    line = next(line for line in end_lines(cfg, Path("run"), mlp) if "achieved" in line)
    assert line.startswith("0.51 GFLOP/s achieved (0.17 MFLOP per env step)"), line
