"""Each figure is defined once (parallel_ppo/runs/figures.py), and every consumer of a run reports the same number:
summary.json, compare_results.py, the scaling sweep / autotune rows and the speed check."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import pytest
from fake_runs import STEADY, write_run

from parallel_ppo.bench.scaling import point_row
from parallel_ppo.bench.speedcheck import trainer_figures
from parallel_ppo.runs.figures import efficiency, first_reaching, first_return, return_at, speedup, steady_sps
from parallel_ppo.runs.reading import load_run
from parallel_ppo.runs.report.numbers import compare
from parallel_ppo.runs.report.text import definitions

ROOT = Path(__file__).resolve().parents[1]



def test_steady_sps_leaves_out_the_first_update():
    assert steady_sps([1024, 2048, 3072], [9.0, 13.0, 17.0]) == pytest.approx(STEADY)
    assert steady_sps([1024], [9.0]) == pytest.approx(1024 / 9.0)  # one update: that update, from the start


def test_speedup_and_efficiency_by_hand():
    assert speedup(300.0, 200.0) == pytest.approx(1.5)
    assert efficiency(1.5, workers=2, base_workers=0) == pytest.approx(0.75)  # sequential counts as 1 worker
    assert efficiency(1.5, workers=4, base_workers=2) == pytest.approx(0.75)


def test_every_consumer_reports_the_runs_steady_sps(tmp_path):
    """compare_results.py, the scaling/autotune rows and the speed check all give the hand-computed figure."""
    run_dir = write_run(tmp_path / "run")
    runs = [load_run("a", run_dir), load_run("b", run_dir)]
    assert runs[0].steady_sps == pytest.approx(STEADY)
    assert all(s.sps == pytest.approx(STEADY) for s in compare(runs).stats)
    assert point_row(runs[0])["steps_per_second"] == pytest.approx(STEADY)
    figures = trainer_figures(run_dir)
    assert figures["sps"] == pytest.approx(STEADY) and figures["updates"] == 2


def rewrite_metrics(run_dir: Path, rows: list[dict[str, str]]) -> None:
    with open(run_dir / "metrics.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


def test_a_study_row_holds_the_steady_updates_mean_cut(tmp_path):
    """A point's `rollout_cut` is metrics.csv's over the updates its steps/s count (update 1 left out); None where the
    run left the column empty or predates it."""
    run_dir = write_run(tmp_path / "run")
    with open(run_dir / "metrics.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    rewrite_metrics(run_dir, [row | {"rollout_cut": cut} for row, cut in zip(rows, ("0.5", "0.1", "0.3"), strict=True)])
    assert point_row(load_run("a", run_dir))["rollout_cut"] == pytest.approx(0.2)
    rewrite_metrics(run_dir, [row | {"rollout_cut": ""} for row in rows])
    assert point_row(load_run("a", run_dir))["rollout_cut"] is None
    rewrite_metrics(run_dir, [{k: v for k, v in row.items() if k != "rollout_cut"} for row in rows])
    assert point_row(load_run("a", run_dir))["rollout_cut"] is None


def test_return_at_a_wall_time_and_time_to_threshold(tmp_path):
    run = load_run("a", write_run(tmp_path / "run"))
    assert return_at(run, 8.9) is None  # nothing logged yet
    assert return_at(run, 9.5) is None  # logged, but no episode had finished
    assert return_at(run, 13.0) == pytest.approx(20.0)
    assert return_at(run, 100.0) == pytest.approx(35.0)
    assert first_reaching(run, 30.0) == 2 and first_reaching(run, 50.0) is None
    assert first_return(run) == pytest.approx(20.0)  # update 1 finished no episode


def test_the_derived_threshold_lies_between_the_highest_start_and_the_best_final(tmp_path):
    """80% of the way from the highest first logged return to the best final return, so no run has reached it at its
    first row; none when no run ended above that start; a run without episodes takes no part; a given one wins."""
    def run(name: str, returns: list[float], seed: int):
        rows = [(i + 1, 1024 * (i + 1), 9.0 + 4 * i, r) for i, r in enumerate(returns)]
        episodes = {} if returns[-1] == returns[-1] else {"episodes": 0, "episodic_return_mean": None}
        return load_run(name, write_run(tmp_path / name, rows, seed=seed, **episodes))

    nan = float("nan")
    a, b = run("a", [nan, 20.0, 35.0], 1), run("b", [22.0, 21.0, 25.0], 2)
    none = run("none", [nan, nan, nan], 3)
    cmp = compare([a, b, none])
    assert cmp.threshold == pytest.approx(22.0 + 0.8 * (35.0 - 22.0))  # 32.4: b started above a
    assert [s.time_to_threshold for s in cmp.stats] == [17.0, None, None]
    assert cmp.threshold_source == "80% of the way from the highest first logged return, 22.0, to the best final return"

    c, d = run("c", [-9.0, -8.9, -9.5], 1), run("d", [-9.5, -9.2, -9.0], 2)  # d ends where c began
    cmp = compare([c, d])
    assert cmp.threshold is None and all(s.time_to_threshold is None for s in cmp.stats)
    assert cmp.threshold_source == "none: no run ended above the highest first logged return (-9.00)"
    assert "Time to threshold: none; no run ended above the highest first logged return (-9.00)." in definitions(cmp)
    assert compare([c, d], threshold=-9.2).stats[1].time_to_threshold == 13.0


@pytest.mark.slow
@pytest.mark.parametrize("script", ["train_timed.py", "train_parallel_timed.py"])
def test_a_trainers_summary_agrees_with_every_reader(tmp_path, script):
    """On a real run: summary.json's sps is the steady-state SPS that every reader computes from metrics.csv."""
    out = tmp_path / "run"
    proc = subprocess.run([sys.executable, script, "--config", "config/cartpole.yaml", "--total-steps", "1280",
                           "--output-dir", str(out), "--set", "logging.tensorboard=false",
                           "--set", "run.limit_seconds=0"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    summary = json.loads((out / "summary.json").read_text())
    with open(out / "metrics.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 5
    by_hand = ((int(rows[-1]["env_steps"]) - int(rows[0]["env_steps"]))
               / (float(rows[-1]["wall_time"]) - float(rows[0]["wall_time"])))
    run = load_run("run", out)
    readers = {"summary.json": summary["sps"], "compare": compare([run, load_run("again", out)]).stats[0].sps,
               "scaling": point_row(run)["steps_per_second"], "speed check": trainer_figures(out)["sps"]}
    assert all(v == pytest.approx(by_hand, rel=1e-9) for v in readers.values()), (by_hand, readers)
    assert summary["overall_sps"] == pytest.approx(summary["total_env_steps"] / summary["wall_seconds"])
