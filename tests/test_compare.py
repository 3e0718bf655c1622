"""compare_results.py on real short CartPole runs: the table's numbers against the runs' own files, every
output file, and one-line exit-2 errors that leave nothing behind."""

from __future__ import annotations

import csv
import dataclasses
import json
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from parallel_ppo.runs import load_runs

ROOT = Path(__file__).resolve().parents[1]
OUTPUTS = ("comparison.png", "phase_breakdown.png", "comparison_report.txt", "comparison.md", "comparison.json")
# One thread per process: the runs start together on a small machine, and oversubscribed torch threads crawl.
QUIET = ["--config", "config/cartpole.yaml", "--set", "training.n_epochs=4", "--set", "logging.tensorboard=false",
         "--set", "parallel.learner_threads=1", "--set", "env.env_threads=1", "--set", "parallel.worker_threads=1"]
RUNS = {
    "four": ["train_timed.py", "--num-envs", "4", "--batch-size", "64", "--total-steps", "2048"],
    "eight": ["train_timed.py", "--num-envs", "8", "--batch-size", "64", "--total-steps", "2048"],
    # 4 steps of one CartPole env: too short for any episode to end.
    "zero": ["train_timed.py", "--num-envs", "1", "--set", "training.n_steps=4", "--batch-size", "4",
             "--total-steps", "4"],
}


def _train(jobs: dict[str, list[str]], base: Path) -> dict[str, Path]:
    procs = {name: subprocess.Popen([sys.executable, *args, *QUIET, "--output-dir", str(base / name)], cwd=ROOT,
                                    stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for name, args in jobs.items()}
    for name, proc in procs.items():
        out, _ = proc.communicate(timeout=300)
        assert proc.returncode == 0, f"training run {name} failed:\n{out}"
    return {name: base / name for name in jobs}


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Three real sequential runs, trained concurrently once for the module."""
    return _train(RUNS, tmp_path_factory.mktemp("runs"))


def compare(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "compare_results.py", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)


@pytest.fixture(scope="module")
def compared(runs: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str, dict]:
    """The reference guide's interface, once: --sequential four --parallel eight."""
    out = tmp_path_factory.mktemp("cmp") / "comparison"
    res = compare("--sequential", str(runs["four"]), "--parallel", str(runs["eight"]), "--output-dir", str(out))
    assert res.returncode == 0, res.stderr
    return out, res.stdout, json.loads((out / "comparison.json").read_text())


def read_metrics(run: Path) -> list[dict[str, float]]:
    """metrics.csv read independently of parallel_ppo.runs (empty cells → NaN)."""
    with open(run / "metrics.csv", newline="") as f:
        return [{k: float(v) if v else float("nan") for k, v in row.items()} for row in csv.DictReader(f)]


def return_at(rows: list[dict[str, float]], seconds: float) -> float:
    return [r for r in rows if r["wall_time"] <= seconds][-1]["episodic_return_mean"]


# ---------------------------------------------------------------------------------------- acceptance 1
def test_every_output_file_exists_and_pngs_are_images(compared: tuple[Path, str, dict]) -> None:
    from matplotlib.image import imread

    out, _, _ = compared
    assert sorted(p.name for p in out.iterdir()) == sorted(OUTPUTS)  # and no temp files left over
    for name in ("comparison.png", "phase_breakdown.png"):
        assert (out / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        pixels = imread(out / name)
        assert pixels.shape[0] > 300 and pixels.shape[1] > 1000
        assert pixels.std() > 0.05  # not a blank canvas


def test_table_numbers_match_the_runs_own_metrics(runs: dict[str, Path], compared: tuple[Path, str, dict]) -> None:
    _, _, result = compared
    by_label = {r["label"]: r for r in result["runs"]}
    assert result["baseline"] == "sequential"
    seq, par = by_label["sequential"], by_label["parallel"]
    rows = {"sequential": read_metrics(runs["four"]), "parallel": read_metrics(runs["eight"])}
    summaries = {"sequential": json.loads((runs["four"] / "summary.json").read_text()),
                 "parallel": json.loads((runs["eight"] / "summary.json").read_text())}

    medians = {label: statistics.median(r["sps"] for r in rows[label]) for label in rows}
    assert seq["median_sps"] == pytest.approx(medians["sequential"])
    assert par["median_sps"] == pytest.approx(medians["parallel"])
    assert seq["speedup"] == pytest.approx(1.0)
    assert par["speedup"] == pytest.approx(medians["parallel"] / medians["sequential"])
    # Both are sequential runs, which count as one worker each.
    assert par["efficiency"] == pytest.approx(par["speedup"])

    equal_time = min(r[-1]["wall_time"] for r in rows.values())
    assert result["equal_wall_time_seconds"] == pytest.approx(equal_time)
    for label, stats in by_label.items():
        summary = summaries[label]
        assert stats["return_at_equal_time"] == pytest.approx(return_at(rows[label], equal_time))
        assert stats["final_return"] == pytest.approx(summary["episodic_return_mean"])
        assert stats["total_env_steps"] == summary["total_env_steps"]
        assert stats["wall_seconds"] == pytest.approx(summary["wall_seconds"])
        assert stats["peak_rss_mb"] == pytest.approx(summary["peak_rss_mb"])
        assert stats["workers_counted"] == 1 and stats["num_workers"] == 0
        assert sum(stats["phase_fractions"].values()) == pytest.approx(1.0)

    threshold = 0.8 * max(s["episodic_return_mean"] for s in summaries.values())
    assert result["return_threshold"] == pytest.approx(threshold)
    for label, stats in by_label.items():
        first = next(r for r in rows[label] if r["episodic_return_mean"] >= threshold)
        assert stats["time_to_threshold_seconds"] == pytest.approx(first["wall_time"])
        assert stats["steps_to_threshold"] == first["env_steps"]


def test_console_table_and_reports_show_the_numbers(compared: tuple[Path, str, dict]) -> None:
    out, stdout, result = compared
    par = next(r for r in result["runs"] if r["label"] == "parallel")
    text = (out / "comparison_report.txt").read_text()
    markdown = (out / "comparison.md").read_text()
    for shown in (stdout, text, markdown):
        assert f"{par['speedup']:.2f}×" in shown
        assert f"{par['median_sps']:,.0f}" in shown
        assert "median SPS" in shown and "speed-up" in shown and "efficiency" in shown
    for line in result["verdict"]:
        assert line in stdout and line in text and line in markdown
    verdict = result["verdict"][0]
    assert verdict.startswith("parallel was") and "at equal wall time" in verdict
    for report in (text, markdown):
        assert "median SPS / the baseline's median SPS" in report
        assert par["hardware"]["cpu_model"] in report and f"torch {par['versions']['torch']}" in report
        assert "![" in markdown and "| run |" in markdown
    # --parallel was given a sequential run: said, not hidden.
    assert any("given as the parallel run" in w for w in result["warnings"])


def test_run_labels_threshold_and_zero_episodes(runs: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "sweep"
    res = compare("--run", f"four={runs['four']}", "--run", f"zero={runs['zero']}", "--run",
                  f"eight={runs['eight']}", "--threshold", "15", "--baseline", "eight", "--output-dir", str(out))
    assert res.returncode == 0, res.stderr
    result = json.loads((out / "comparison.json").read_text())
    assert [r["label"] for r in result["runs"]] == ["four", "zero", "eight"]
    assert result["baseline"] == "eight" and result["return_threshold"] == 15
    by_label = {r["label"]: r for r in result["runs"]}
    assert by_label["eight"]["speedup"] == pytest.approx(1.0)
    assert by_label["four"]["speedup"] == pytest.approx(by_label["four"]["median_sps"]
                                                        / by_label["eight"]["median_sps"])
    zero = by_label["zero"]
    assert zero["episodes"] == 0 and zero["final_return"] is None and zero["time_to_threshold_seconds"] is None
    assert "no episodes finished" in res.stdout
    four_rows = read_metrics(runs["four"])
    first = next(r for r in four_rows if r["episodic_return_mean"] >= 15)
    assert by_label["four"]["time_to_threshold_seconds"] == pytest.approx(first["wall_time"])


def test_efficiency_divides_by_workers(runs: dict[str, Path]) -> None:
    """The layout is relabelled in memory (W=2) to check the formula; the numbers are a real run's."""
    from parallel_ppo.report import compare as compare_runs
    from parallel_ppo.report import verdict

    seq, other = load_runs([("sequential", runs["four"]), ("parallel", runs["eight"])])
    par = dataclasses.replace(other, mode="parallel", num_workers=2, num_envs_per_worker=4)
    cmp = compare_runs([seq, par])
    stats = {s.label: s for s in cmp.stats}
    assert stats["parallel"].layout == "2×4"
    assert stats["parallel"].efficiency == pytest.approx(stats["parallel"].speedup / 2)
    assert "parallel efficiency with 2 workers" in verdict(cmp)[0]


@pytest.mark.skipif(not (ROOT / "train_parallel_timed.py").exists(), reason="train_parallel_timed.py not there yet")
def test_real_parallel_run(runs: dict[str, Path], tmp_path: Path) -> None:
    par = _train({"par": ["train_parallel_timed.py", "--num-workers", "2", "--num-envs-per-worker", "4",
                          "--batch-size", "64", "--total-steps", "2048"]}, tmp_path)["par"]
    out = tmp_path / "cmp"
    res = compare("--sequential", str(runs["eight"]), "--parallel", str(par), "--output-dir", str(out))
    assert res.returncode == 0, res.stderr
    result = json.loads((out / "comparison.json").read_text())
    p = next(r for r in result["runs"] if r["label"] == "parallel")
    assert p["mode"] == "parallel" and p["workers_counted"] == 2
    assert p["efficiency"] == pytest.approx(p["speedup"] / 2)
    assert not any("beyond the parallel layout" in w for w in result["warnings"])


# ---------------------------------------------------------------------------------------- acceptance 2
def _copy(run: Path, dest: Path) -> Path:
    shutil.copytree(run, dest)
    return dest


def _truncate_mid_line(run: Path) -> None:
    data = (run / "metrics.csv").read_bytes()
    (run / "metrics.csv").write_bytes(data[: len(data) - 25])


def _drop_last_rows(run: Path) -> None:
    lines = (run / "metrics.csv").read_text().splitlines(keepends=True)
    (run / "metrics.csv").write_text("".join(lines[:-3]))


def _bad_cell(run: Path) -> None:
    lines = (run / "metrics.csv").read_text().splitlines()
    fields = lines[3].split(",")
    fields[3] = "oops"  # the sps column
    lines[3] = ",".join(fields)
    (run / "metrics.csv").write_text("\n".join(lines) + "\n")


BROKEN = {
    "no_metrics": (lambda run: (run / "metrics.csv").unlink(), "has no metrics.csv"),
    "truncated_mid_line": (_truncate_mid_line, "truncated"),
    "rows_missing": (_drop_last_rows, "truncated metrics.csv"),
    "bad_cell": (_bad_cell, "not a number"),
    "binary_garbage": (lambda run: (run / "metrics.csv").write_bytes(b"\x00\xff\xfe" * 100), "corrupt"),
    "empty_metrics": (lambda run: (run / "metrics.csv").write_text(""), "is empty"),
    "header_only": (lambda run: (run / "metrics.csv").write_text(
        (run / "metrics.csv").read_text().splitlines()[0] + "\n"), "no rows"),
    "corrupt_summary": (lambda run: (run / "summary.json").write_text('{"mode": "seq'), "not valid JSON"),
    "no_summary": (lambda run: (run / "summary.json").unlink(), "has not finished"),
}


def assert_one_line_exit_2(res: subprocess.CompletedProcess[str], expect: str) -> None:
    assert res.returncode == 2, res.stdout + res.stderr
    assert "Traceback" not in res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("compare_results.py: error:"), res.stderr
    assert expect in lines[0]
    assert res.stdout == ""


@pytest.mark.parametrize("case", sorted(BROKEN))
def test_broken_run_directory_is_one_line_exit_2(case: str, runs: dict[str, Path], tmp_path: Path) -> None:
    damage, expect = BROKEN[case]
    broken = _copy(runs["eight"], tmp_path / "broken")
    damage(broken)
    out = tmp_path / "out"
    res = compare("--sequential", str(runs["four"]), "--parallel", str(broken), "--output-dir", str(out))
    assert_one_line_exit_2(res, expect)
    assert not out.exists()


@pytest.mark.parametrize("case", ["missing_dir", "same_label", "no_equals", "one_run", "bad_flag",
                                  "unknown_baseline", "output_is_file"])
def test_bad_arguments_are_one_line_exit_2(case: str, runs: dict[str, Path], tmp_path: Path) -> None:
    four, eight = str(runs["four"]), str(runs["eight"])
    out = tmp_path / "out"
    args, expect = {
        "missing_dir": (["--sequential", four, "--parallel", str(tmp_path / "nope")], "not found"),
        "same_label": (["--run", f"a={four}", "--run", f"a={eight}"], "given twice"),
        "no_equals": (["--run", four, "--run", f"b={eight}"], "LABEL=DIR"),
        "one_run": (["--sequential", four], "at least two runs"),
        "bad_flag": (["--sequential", four, "--parallel", eight, "--threshold", "high"], "invalid float"),
        "unknown_baseline": (["--sequential", four, "--parallel", eight, "--baseline", "x"], "not one of"),
        "output_is_file": (["--sequential", four, "--parallel", eight], "not a directory"),
    }[case]
    if case == "output_is_file":
        out.write_text("keep me")
    res = compare(*args, "--output-dir", str(out))
    assert_one_line_exit_2(res, expect)
    if case == "output_is_file":
        assert out.read_text() == "keep me"
    else:
        assert not out.exists()
