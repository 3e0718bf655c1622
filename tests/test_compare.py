"""compare_results.py on real short CartPole runs: the table's numbers against the runs' own files, every
output file, and one-line exit-2 errors that leave nothing behind.

The runs are trained once, concurrently, and every compare_results.py invocation of the module (good and bad)
then runs once, a few at a time, in the `cli` fixture; the tests check the recorded results.
"""

from __future__ import annotations

import csv
import dataclasses
import json
import math
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from fake_runs import ROWS, write_run

from parallel_ppo.core.configure import config_from_dict
from parallel_ppo.runs.reading import Run, load_runs

pytestmark = pytest.mark.slow  # every test here trains or starts trainers

ROOT = Path(__file__).resolve().parents[1]
HAS_PARALLEL = (ROOT / "train_parallel_timed.py").exists()
OUTPUTS = ("comparison.png", "phase_breakdown.png", "comparison_report.txt", "comparison.md",
           "comparison.json")
PRECISION = os.environ.get("PARALLEL_PPO_TEST_PRECISION", "fp32")
"""The arithmetic of every run here: pinned, not `auto` (a choice measured while other test files run beside this
one), so that the runs compared differ only where a test makes them differ. PARALLEL_PPO_TEST_PRECISION=bf16 runs
the module with the other one."""
assert PRECISION in ("fp32", "bf16"), f"PARALLEL_PPO_TEST_PRECISION={PRECISION!r}: fp32 or bf16"
# One torch thread per process: the runs train side by side on a small machine; no compute limit measured.
COMMON = ["--config", "config/cartpole.yaml", "--set", "training.n_epochs=4", "--set", "run.limit_seconds=0", "--set",
          "logging.tensorboard=false", "--set", "parallel.learner_threads=1", "--set", "env.env_threads=1",
          "--set", f"training.precision={PRECISION}", "--set", "training.microbatch_size=0"]
TRAINING = {
    "four": ["train_timed.py", "--num-envs", "4", "--batch-size", "64", "--total-steps", "2048"],
    "eight": ["train_timed.py", "--num-envs", "8", "--batch-size", "64", "--total-steps", "2048"],
    # 4 steps of one CartPole env: too short for any episode to end.
    "zero": ["train_timed.py", "--num-envs", "1", "--set", "training.n_steps=4", "--batch-size", "4",
             "--total-steps", "4"],
}
if HAS_PARALLEL:
    TRAINING["par"] = ["train_parallel_timed.py", "--num-workers", "2", "--num-envs-per-worker", "4",
                       "--batch-size", "64", "--total-steps", "2048"]


def _run(args: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True, timeout=300)


def _all(commands: dict[str, list[str]], at_once: int) -> dict[str, subprocess.CompletedProcess[str]]:
    with ThreadPoolExecutor(at_once) as pool:
        return dict(zip(commands, pool.map(_run, commands.values()), strict=True))


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Real short runs, trained concurrently once for the module."""
    base = tmp_path_factory.mktemp("runs")
    done = _all({name: [*args, *COMMON, "--output-dir", str(base / name)] for name, args in TRAINING.items()},
                at_once=len(TRAINING))
    for name, res in done.items():
        assert res.returncode == 0, f"training run {name} failed:\n{res.stdout}{res.stderr}"
    return {name: base / name for name in TRAINING}


# --- broken inputs: (damage done to a copy of a good run, words the error line must contain) -----------
def _truncate_mid_line(run: Path) -> None:
    data = (run / "metrics.csv").read_bytes()
    (run / "metrics.csv").write_bytes(data[: len(data) - 25])


def _drop_last_rows(run: Path) -> None:
    lines = (run / "metrics.csv").read_text().splitlines(keepends=True)
    (run / "metrics.csv").write_text("".join(lines[:-3]))


def _bad_cell(run: Path) -> None:
    lines = (run / "metrics.csv").read_text().splitlines()
    fields = lines[3].split(",")
    fields[3] = "oops"  # the sps column; the row keeps its field count
    lines[3] = ",".join(fields)
    (run / "metrics.csv").write_text("\n".join(lines) + "\n")


def _header_only(run: Path) -> None:
    (run / "metrics.csv").write_text((run / "metrics.csv").read_text().splitlines()[0] + "\n")


BROKEN: dict[str, tuple[Callable[[Path], object], str]] = {
    "no_metrics": (lambda run: (run / "metrics.csv").unlink(), "has no metrics.csv"),
    "truncated_mid_line": (_truncate_mid_line, "truncated"),
    "rows_missing": (_drop_last_rows, "truncated metrics.csv"),
    "bad_cell": (_bad_cell, "not a number"),
    "binary_garbage": (lambda run: (run / "metrics.csv").write_bytes(b"\x00\xff\xfe" * 100), "corrupt"),
    "empty_metrics": (lambda run: (run / "metrics.csv").write_text(""), "is empty"),
    "header_only": (_header_only, "no rows"),
    "corrupt_summary": (lambda run: (run / "summary.json").write_text('{"mode": "seq'), "not valid JSON"),
    "no_summary": (lambda run: (run / "summary.json").unlink(), "has not finished"),
}
BAD_ARGS = {  # {four}/{eight}/{missing} are filled in; words the error line must contain
    "missing_dir": (["--sequential", "{four}", "--parallel", "{missing}"], "not found"),
    "same_label": (["--run", "a={four}", "--run", "a={eight}"], "given twice"),
    "same_run_two_labels": (["--sequential", "{four}", "--parallel", "{four}"], "are the same run(s)"),
    "no_equals": (["--run", "{four}", "--run", "b={eight}"], "LABEL=DIR"),
    "one_run": (["--sequential", "{four}"], "at least two runs"),
    "bad_flag": (["--sequential", "{four}", "--parallel", "{eight}", "--threshold", "high"], "invalid float"),
    "unknown_baseline": (["--sequential", "{four}", "--parallel", "{eight}", "--baseline", "x"],
                         "not one of"),
    "output_is_file": (["--sequential", "{four}", "--parallel", "{eight}"], "not a directory"),
}


@pytest.fixture(scope="module")
def cli(runs: dict[str, Path], tmp_path_factory: pytest.TempPathFactory
        ) -> dict[str, tuple[subprocess.CompletedProcess[str], Path]]:
    """Every compare_results.py invocation of the module → (its result, its --output-dir)."""
    base = tmp_path_factory.mktemp("cli")
    four, eight, zero = (str(runs[k]) for k in ("four", "eight", "zero"))
    commands: dict[str, list[str]] = {
        "reference": ["--sequential", four, "--parallel", eight],
        "sweep": ["--run", f"four={four}", "--run", f"zero={zero}", "--run", f"eight={eight}",
                  "--threshold", "15", "--baseline", "eight"],
    }
    if HAS_PARALLEL:
        commands["parallel"] = ["--sequential", eight, "--parallel", str(runs["par"])]
    for case, (damage, _) in BROKEN.items():
        broken = base / f"broken_{case}"
        shutil.copytree(runs["eight"], broken)
        damage(broken)
        commands[case] = ["--sequential", four, "--parallel", str(broken)]
    for case, (args, _) in BAD_ARGS.items():
        commands[case] = [a.format(four=four, eight=eight, missing=base / "nope") for a in args]
    (base / "output_is_file").write_text("keep me")
    results = _all({name: ["compare_results.py", *args, "--output-dir", str(base / name)]
                    for name, args in commands.items()}, at_once=4)
    return {name: (res, base / name) for name, res in results.items()}


def ok(cli: dict[str, tuple[subprocess.CompletedProcess[str], Path]], name: str
       ) -> tuple[subprocess.CompletedProcess[str], Path, dict]:
    res, out = cli[name]
    assert res.returncode == 0, res.stderr
    return res, out, json.loads((out / "comparison.json").read_text())


def read_metrics(run: Path) -> list[dict[str, float]]:
    """metrics.csv read independently of parallel_ppo.runs.reading (empty cells → NaN)."""
    with open(run / "metrics.csv", newline="") as f:
        return [{k: float(v) if v else float("nan") for k, v in row.items()} for row in csv.DictReader(f)]


def return_at(rows: list[dict[str, float]], seconds: float) -> float:
    return [r for r in rows if r["wall_time"] <= seconds][-1]["episodic_return_mean"]


# ---------------------------------------------------------------------------------------- acceptance 1
def test_every_output_file_exists_and_pngs_are_images(cli) -> None:
    from matplotlib.image import imread

    _, out, _ = ok(cli, "reference")
    assert sorted(p.name for p in out.iterdir()) == sorted(OUTPUTS)  # and no temp files left over
    for name in ("comparison.png", "phase_breakdown.png"):
        assert (out / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        pixels = imread(out / name)
        assert pixels.shape[0] > 300 and pixels.shape[1] > 1000
        assert pixels.std() > 0.05  # not a blank canvas


def test_table_numbers_match_the_runs_own_metrics(runs: dict[str, Path], cli) -> None:
    _, _, result = ok(cli, "reference")
    by_label = {r["label"]: r for r in result["runs"]}
    assert result["baseline"] == "sequential"
    seq, par = by_label["sequential"], by_label["parallel"]
    dirs = {"sequential": runs["four"], "parallel": runs["eight"]}
    rows = {label: read_metrics(d) for label, d in dirs.items()}
    summaries = {label: json.loads((d / "summary.json").read_text()) for label, d in dirs.items()}

    steady = {label: (r[-1]["env_steps"] - r[0]["env_steps"]) / (r[-1]["wall_time"] - r[0]["wall_time"])
              for label, r in rows.items()}  # from the end of update 1 to the end of the last
    assert seq["sps"] == pytest.approx(steady["sequential"]) == pytest.approx(summaries["sequential"]["sps"])
    assert par["sps"] == pytest.approx(steady["parallel"]) == pytest.approx(summaries["parallel"]["sps"])
    assert seq["speedup"] == pytest.approx(1.0)
    assert par["speedup"] == pytest.approx(steady["parallel"] / steady["sequential"])
    assert par["efficiency"] == pytest.approx(par["speedup"])  # both sequential: 1 worker each

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

    start = max(next(r["episodic_return_mean"] for r in rows[label] if not math.isnan(r["episodic_return_mean"]))
                for label in rows)  # the highest first logged return
    best = max(s["episodic_return_mean"] for s in summaries.values())
    threshold = start + 0.8 * (best - start) if best > start else None
    assert result["return_threshold"] == pytest.approx(threshold)
    if threshold is None:
        return
    for label, stats in by_label.items():
        first = next((r for r in rows[label] if r["episodic_return_mean"] >= threshold), None)
        assert stats["time_to_threshold_seconds"] == (None if first is None else pytest.approx(first["wall_time"]))
        assert stats["steps_to_threshold"] == (None if first is None else first["env_steps"])


def test_console_table_and_reports_show_the_numbers(cli) -> None:
    res, out, result = ok(cli, "reference")
    par = next(r for r in result["runs"] if r["label"] == "parallel")
    text = (out / "comparison_report.txt").read_text()
    markdown = (out / "comparison.md").read_text()
    for shown in (res.stdout, text, markdown):
        assert f"{par['speedup']:.2f}×" in shown
        assert f"{par['sps']:,.0f}" in shown
        assert "SPS" in shown and "speed-up" in shown and "efficiency" in shown
    for line in result["verdict"]:
        assert line in res.stdout and line in text and line in markdown
    verdict = result["verdict"][0]
    # the two real runs may be of any speed: "was N× faster/slower than", or "ran at the speed of" within noise
    assert verdict.startswith(("parallel was", "parallel ran at the speed of")) and "at equal wall time" in verdict
    for report in (text, markdown):
        assert "speed-up = a run's SPS / the baseline's SPS" in report
        assert par["hardware"]["cpu_model"] in report and f"torch {par['versions']['torch']}" in report
    assert "![" in markdown and "| run |" in markdown
    # --parallel was given a sequential run: said, not hidden. The runs differ only in env count: no
    # config warning.
    assert any("given as the parallel run" in w for w in result["warnings"])
    assert not any("beyond the parallel layout" in w for w in result["warnings"])


def test_run_labels_baseline_threshold_and_zero_episodes(runs: dict[str, Path], cli) -> None:
    res, _, result = ok(cli, "sweep")
    assert [r["label"] for r in result["runs"]] == ["four", "zero", "eight"]
    assert result["baseline"] == "eight" and result["return_threshold"] == 15
    by_label = {r["label"]: r for r in result["runs"]}
    assert by_label["eight"]["speedup"] == pytest.approx(1.0)
    assert by_label["four"]["speedup"] == pytest.approx(by_label["four"]["sps"] / by_label["eight"]["sps"])
    first = next(r for r in read_metrics(runs["four"]) if r["episodic_return_mean"] >= 15)
    assert by_label["four"]["time_to_threshold_seconds"] == pytest.approx(first["wall_time"])
    zero = by_label["zero"]
    assert zero["episodes"] == 0 and zero["final_return"] is None
    assert zero["return_at_equal_time"] is None and zero["time_to_threshold_seconds"] is None
    assert "no episodes finished" in res.stdout and res.stderr == ""
    warnings = "\n".join(result["warnings"])
    assert "config differs beyond the parallel layout: training.batch_size" in warnings
    assert "training.n_steps: 32 (four, eight) vs 4 (zero)" in warnings
    assert "runs differ in duration" in warnings


def test_efficiency_divides_by_workers(runs: dict[str, Path]) -> None:
    """The layout is relabelled in memory (W=2) to check the formula on a real run's numbers."""
    from parallel_ppo.runs.report.numbers import compare
    from parallel_ppo.runs.report.text import verdict

    seq, other = load_runs([("sequential", runs["four"]), ("parallel", runs["eight"])])
    par = dataclasses.replace(other, summary=dataclasses.replace(other.summary, mode="parallel", num_workers=2,
                                                                 num_envs_per_worker=4))
    cmp = compare([seq, par])
    stats = {s.label: s for s in cmp.stats}
    assert stats["parallel"].layout == "2×4"
    assert stats["parallel"].efficiency == pytest.approx(stats["parallel"].speedup / 2)
    assert "parallel efficiency with 2 workers" in verdict(cmp)[0]


def test_warnings_name_what_differs(runs: dict[str, Path]) -> None:
    from parallel_ppo.runs.report.formatting import describe_hardware
    from parallel_ppo.runs.report.numbers import compare

    def trained_in(precision: str, run: Run) -> Run:
        config = config_from_dict(run.config.to_dict())
        config.training.precision = precision
        return dataclasses.replace(run, config=config)

    a, b = load_runs([("a", runs["four"]), ("b", runs["eight"])])
    seq, other = trained_in("fp32", a), trained_in("bf16", b)  # set apart on purpose, whatever the runs trained in
    hw = other.summary.hardware
    moved = dataclasses.replace(other, summary=dataclasses.replace(
        other.summary, hardware={**hw, "cpu_model": "Another CPU", "logical_cores": 96},
        versions={**other.summary.versions, "torch": "0.0.1"}))
    warnings = "\n".join(compare([seq, moved]).warnings)
    # the other run's own core count, whatever the host running this test has
    assert "different hardware" in warnings and describe_hardware(moved) in warnings
    assert describe_hardware(moved).startswith("Another CPU") and "96 logical" in describe_hardware(moved)
    assert describe_hardware(seq) in warnings and seq.summary.hardware["cpu_model"] in describe_hardware(seq)
    assert "software versions differ: torch" in warnings and "0.0.1 (b)" in warnings
    assert "training.precision: fp32 (a) vs bf16 (b)" in warnings

    def of_family(run: Run, family: str | None) -> Run:
        hardware = {k: v for k, v in {**hw, "cpu_family": family}.items() if v is not None}
        return dataclasses.replace(run, summary=dataclasses.replace(run.summary, hardware=hardware))

    def hardware_warning(x: Run, y: Run) -> str:
        return "\n".join(w for w in compare([x, y]).warnings if "different hardware" in w)

    apart = hardware_warning(of_family(seq, "25/17"), of_family(other, "26/2"))  # one model name, two families
    assert "family 25/17)" in apart and "family 26/2)" in apart
    assert hardware_warning(of_family(seq, "25/17"), of_family(other, "25/17")) == ""
    assert hardware_warning(of_family(seq, "25/17"), of_family(other, None)) == ""  # one recorded before it was
    unknown = dataclasses.replace(other, summary=dataclasses.replace(other.summary,
                                                                     hardware={**hw, "cpu_family": None}))
    assert hardware_warning(of_family(seq, "25/17"), unknown) == ""  # not x86: no family to tell apart

    def with_versions(run: Run, **versions: str) -> Run:
        return dataclasses.replace(run, summary=dataclasses.replace(run.summary, versions=versions))

    assert "mujoco 3.3.5 (a) vs 3.3.7 (b)" in "\n".join(compare(
        [with_versions(seq, torch="2", mujoco="3.3.5"), with_versions(other, torch="2", mujoco="3.3.7")]).warnings)
    assert "mujoco" not in "\n".join(compare(  # a version one run did not record is not a difference
        [with_versions(seq, torch="2"), with_versions(other, torch="2", mujoco="3.3.7")]).warnings)
    assert "robosuite" not in "\n".join(compare(  # nor a package one run's environment did not have
        [with_versions(seq, robosuite=None), with_versions(other, robosuite="1.5.2")]).warnings)


def test_the_runs_train_in_the_pinned_precision(runs: dict[str, Path]) -> None:
    for name, run in runs.items():
        summary = json.loads((run / "summary.json").read_text())
        assert (summary["precision"], summary["learner"]["microbatch_size"]) == (PRECISION, 0), name
        assert summary["learner"]["source"] == "config", name  # nothing left to `auto`


def test_a_failure_while_rendering_writes_nothing(runs: dict[str, Path], tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    from parallel_ppo.runs.report import plots
    from parallel_ppo.runs.report.numbers import Comparison

    def broken(cmp: Comparison) -> bytes:
        raise RuntimeError("plotting failed")

    from parallel_ppo.cli import compare as entry

    monkeypatch.setattr(plots, "plot_phases", broken)  # the second figure: the first is already rendered
    out = tmp_path / "out"
    with pytest.raises(RuntimeError, match="plotting failed"):
        entry.main(["--sequential", str(runs["four"]), "--parallel", str(runs["eight"]),
                    "--output-dir", str(out)])
    assert not out.exists()


@pytest.mark.skipif(not HAS_PARALLEL, reason="train_parallel_timed.py is not there yet")
def test_real_parallel_run(cli) -> None:
    _, _, result = ok(cli, "parallel")
    par = next(r for r in result["runs"] if r["label"] == "parallel")
    assert par["mode"] == "parallel" and par["workers_counted"] == 2 and par["num_envs_per_worker"] == 4
    assert par["efficiency"] == pytest.approx(par["speedup"] / 2)
    # 8 envs either way and the same settings: only the layout differs, so no config warning.
    assert not any("beyond the parallel layout" in w for w in result["warnings"])


# ---------------------------------------------------------------------------------------- acceptance 2
@pytest.mark.parametrize("case", [*BROKEN, *BAD_ARGS])
def test_bad_input_is_one_line_exit_2_and_writes_nothing(case: str, cli) -> None:
    res, out = cli[case]
    expect = (BROKEN.get(case) or BAD_ARGS[case])[1]
    assert res.returncode == 2, res.stdout + res.stderr
    assert "Traceback" not in res.stderr and res.stdout == ""
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("compare_results.py: error:"), res.stderr
    assert expect in lines[0], lines[0]
    if case == "output_is_file":
        assert out.read_text() == "keep me"
    else:
        assert not out.exists()


# ------------------------------------------------------------------------------- reference curves (fake runs, fast)
REFERENCE_CSV = ("env_steps,episodic_return_mean,return_low,return_high,source\n"
                 "0,1.5,1,2,paper\n1500,18,12,24,paper\n2100,30,25,33,paper\n5000,80,70,90,paper\n")
LATE_CSV = "env_steps,episodic_return_mean\n4000,50\n6000,70\n"
"""Published curves: one with a band (and a column to ignore), one that starts after the runs end. Beside
`_fake_labels`, the first one's row logged last by the equal env steps (2,048, the shorter label's end) is 1,500's
(as for a run), and 5,000 lies past the longest run (3,072 env steps); the second is not logged by then."""


def _fake_labels(base: Path) -> list[str]:
    """compare_results.py's run flags for two labels of fake runs: `a` over two seeds up to 3,072 env steps, `b` one
    run up to 2,048."""
    for seed in (1, 2):
        write_run(base / "a" / f"seed_{seed}", seed=seed)
    return ["--run", f"a={base / 'a'}", "--run", f"b={write_run(base / 'b', rows=ROWS[:2])}"]


def test_a_reference_curve_is_tabled_at_equal_env_steps_and_never_as_a_run(tmp_path: Path, capsys) -> None:
    from parallel_ppo.cli import compare as entry

    curve, late = tmp_path / "sac.csv", tmp_path / "late.csv"
    curve.write_text(REFERENCE_CSV)
    late.write_text(LATE_CSV)
    out = tmp_path / "out"
    assert entry.main([*_fake_labels(tmp_path), "--reference", f"sac={curve}", "--reference", f"late={late}",
                       "--output-dir", str(out)]) == 0
    stdout = capsys.readouterr().out
    result = json.loads((out / "comparison.json").read_text())
    assert result["references"] == [
        {"label": "sac", "file": str(curve), "compared_at_env_steps": 2048, "first_env_steps": 0,
         "last_env_steps": 5000, "env_steps": 1500, "episodic_return_mean": 18, "return_low": 12, "return_high": 24},
        {"label": "late", "file": str(late), "compared_at_env_steps": 2048, "first_env_steps": 4000,
         "last_env_steps": 6000, "env_steps": None, "episodic_return_mean": None, "return_low": None,
         "return_high": None}]
    assert [r["label"] for r in result["runs"]] == ["a/seed_1", "a/seed_2", "b"]
    assert [g["label"] for g in result["across_seeds"]["labels"]] == ["a", "b"]
    markdown, text = (out / "comparison.md").read_text(), (out / "comparison_report.txt").read_text()
    assert "## References\n\n| reference | file | env steps (its row by 2,048) | return | band |" in markdown
    assert f"| sac | {curve} | 1,500 | 18.0 | 12.0 to 24.0 |" in markdown
    assert f"| late | {late} | - | - | - |" in markdown
    assert "Not logged there (late: its curve spans 4,000 to 6,000 env steps)." in markdown
    assert "\nReferences\n----------\n" in text
    assert re.search(rf"\nsac\s+{re.escape(str(curve))}\s+1,500\s+18\.0\s+12\.0 to 24\.0\n", text), text
    for report in (markdown, text):
        assert "a published learning curve, not a run made here: it has no wall time and no speed" in report
    assert (f"reference sac ({curve}, a published curve, not run here): return 18.0 at 1,500 env steps (its row by "
            "2,048), band 12.0 to 24.0") in stdout
    assert f"reference late ({late}, a published curve, not run here): not logged at 2,048 env steps" in stdout
    for name in ("comparison.png", "learning_curves.png"):
        assert (out / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    import parallel_ppo as ppo
    from parallel_ppo.runs.report.references import references_json

    cmp = ppo.compare({"a": tmp_path / "a"}, at_steps=3000, references={"sac": curve})  # two seeds to 3,072
    assert [ref["env_steps"] for ref in references_json(cmp)] == [2100]  # from Python too, at the steps given
    with pytest.raises(ppo.ConfigError, match=r"^--at-steps 3,000 is past the end of b \(2,048\): at most the "
                                              r"shortest run's 2,048 env steps$"):  # its last return is not there
        ppo.compare({"a": tmp_path / "a", "b": tmp_path / "b"}, at_steps=3000)
    no = tmp_path / "no"
    assert entry.main([*_fake_labels(tmp_path / "cli"), "--at-steps", "2048.5", "--output-dir", str(no)]) == 2
    assert capsys.readouterr().err == ("compare_results.py: error: --at-steps 2,048.5 is past the end of b (2,048): at "
                                       "most the shortest run's 2,048 env steps\n")
    assert not no.exists()
    with pytest.raises(ppo.ConfigError, match="'a/seed_1' is already a run's label"):
        ppo.compare({"a": tmp_path / "a", "b": tmp_path / "b"}, references={"a/seed_1": curve})
    for bad in (float("nan"), 0):  # refused from Python as on the command line
        with pytest.raises(ppo.ConfigError, match="--at-steps must be a positive number of env steps"):
            ppo.compare({"a": tmp_path / "a", "b": tmp_path / "b"}, at_steps=bad)
    one, two = write_run(tmp_path / "one"), write_run(tmp_path / "two", seed=2)  # no seeds, no reference: unused
    with pytest.raises(ppo.ConfigError, match="--at-steps compares returns across seeds or against a --reference"):
        ppo.compare({"one": one, "two": two}, at_steps=2048)


def test_a_reference_curve_is_drawn_on_the_env_steps_panels_only_up_to_the_longest_run(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from parallel_ppo.runs.reading import load_groups
    from parallel_ppo.runs.reference import load_reference
    from parallel_ppo.runs.report import plots
    from parallel_ppo.runs.report.numbers import compare

    _fake_labels(tmp_path)
    (tmp_path / "sac.csv").write_text(REFERENCE_CSV)
    (tmp_path / "late.csv").write_text(LATE_CSV)
    cmp = compare(load_groups([("a", [tmp_path / "a"]), ("b", [tmp_path / "b"])]),
                  references=[load_reference(name, tmp_path / f"{name}.csv") for name in ("sac", "late")])
    figures: list = []
    monkeypatch.setattr(plots, "_png", lambda fig: figures.append(fig) or b"")
    plots.plot_comparison(cmp)
    plots.plot_seeds(cmp)
    (time_panel, steps_panel), (seed_steps, seed_time) = figures[0].axes[:2], figures[1].axes[:2]
    for ax in (steps_panel, seed_steps):
        line = next(line for line in ax.get_lines() if list(line.get_xdata()) == [0, 1500, 2100])  # 5,000 clipped
        assert line.get_linestyle() == "--" and list(line.get_ydata()) == [1.5, 18, 30]
        band = [c.get_paths()[0].vertices for c in ax.collections]
        assert any(v[:, 0].min() == 0 and v[:, 0].max() == 2100 and v[:, 1].max() == 33 for v in band)
        assert [t.get_text() for t in ax.get_legend().get_texts()] == ["sac (reference)"]  # late: nothing to draw
    for ax in (time_panel, seed_time):  # wall time is not comparable across machines
        assert not any(list(line.get_xdata()) == [0, 1500, 2100] for line in ax.get_lines())
        assert ax.get_legend() is None


BAD_REFERENCES = {  # case → (the CSV's text, or None: no file; the --reference values; words the error must contain)
    "missing_column": ("env_steps,return\n1024,5\n", ["sac={csv}"], "lacks the column(s) episodic_return_mean"),
    "not_a_number": ("env_steps,episodic_return_mean\n1024,5\n2048,high\n", ["sac={csv}"],
                     "line 3: column episodic_return_mean holds 'high', not a finite number"),
    "not_finite": ("env_steps,episodic_return_mean\n1024,inf\n", ["sac={csv}"], "holds 'inf', not a finite"),
    "unsorted_steps": ("env_steps,episodic_return_mean\n2048,5\n1024,6\n", ["sac={csv}"],
                       "line 3: env_steps 1,024 is not above the row before (2,048)"),
    "empty": ("", ["sac={csv}"], "is empty"),
    "header_only": ("env_steps,episodic_return_mean\n", ["sac={csv}"], "has a header but no rows"),
    "only_return_low": ("env_steps,episodic_return_mean,return_low\n1024,5,4\n", ["sac={csv}"],
                        "has return_low alone: give both return_low and return_high"),
    "band_upside_down": ("env_steps,episodic_return_mean,return_low,return_high\n1024,5,4,6\n2048,7,8,6\n",
                         ["sac={csv}"], "line 3: return_low is above return_high"),
    "missing_file": (None, ["sac={csv}"], "cannot read reference curve"),
    "label_of_a_run": (REFERENCE_CSV, ["b={csv}"], "'b' is already a run's label"),
    "duplicate_label": (REFERENCE_CSV, ["sac={csv}", "sac={csv}"], "'sac' is already the label of"),
    "no_label": (REFERENCE_CSV, ["{csv}"], "--reference expects LABEL=CSV"),
}


@pytest.mark.parametrize("case", BAD_REFERENCES)
def test_a_bad_reference_is_one_line_naming_the_file_exit_2_and_writes_nothing(case: str, tmp_path: Path,
                                                                                capsys) -> None:
    from parallel_ppo.cli import compare as entry

    text, specs, expect = BAD_REFERENCES[case]
    curve = tmp_path / "curve.csv"
    if text is not None:
        curve.write_text(text)
    flags = [a for spec in specs for a in ("--reference", spec.format(csv=curve))]
    out = tmp_path / "out"
    assert entry.main([*_fake_labels(tmp_path), *flags, "--output-dir", str(out)]) == 2
    res = capsys.readouterr()
    lines = res.err.strip().splitlines()
    assert res.out == "" and len(lines) == 1 and lines[0].startswith("compare_results.py: error:"), res.err
    assert str(curve) in lines[0] and expect in lines[0], lines[0]
    assert not out.exists()


def test_a_reference_does_not_count_as_a_run(tmp_path: Path, capsys) -> None:
    from parallel_ppo.cli import compare as entry

    (tmp_path / "sac.csv").write_text(REFERENCE_CSV)
    out = tmp_path / "out"
    assert entry.main(["--run", f"b={write_run(tmp_path / 'b')}", "--reference", f"sac={tmp_path / 'sac.csv'}",
                       "--output-dir", str(out)]) == 2
    assert "nothing to compare: give at least two runs" in capsys.readouterr().err and not out.exists()
    assert entry.main(["--run", f"a={tmp_path / 'nonexistent'}", "--output-dir", str(out)]) == 2
    assert f"run directory not found: {tmp_path / 'nonexistent'}" in capsys.readouterr().err and not out.exists()


# ------------------------------------------------------------------------------- summary and output files (fake runs)
WRONG_TYPES = {  # summary.json field → a value of the wrong type inside it, the entry the error must name
    "logical_cores_text": ("hardware", {"cpu_model": "x", "logical_cores": "2"}, "'hardware.logical_cores'"),
    "cpu_kind_numbers": ("hardware", {"cpu_model": "x", "cpu_kind": [1, 2]}, "'hardware.cpu_kind'"),
    "success_rate_text": ("final_metrics", {"success_rate": "0.5"}, "'final_metrics.success_rate'"),
    "episode_stat_list": ("final_metrics", {"episode_distance": [1.0]}, "'final_metrics.episode_distance'"),
}


@pytest.mark.parametrize("case", WRONG_TYPES)
def test_a_wrong_type_inside_a_summary_field_is_one_line_naming_the_file_and_entry(case: str, tmp_path: Path,
                                                                                   capsys) -> None:
    from parallel_ppo.cli import compare as entry
    from parallel_ppo.runs.summary import RunSummary

    field, value, expect = WRONG_TYPES[case]
    bad = write_run(tmp_path / "bad", **{field: value})
    out = tmp_path / "out"
    assert entry.main(["--run", f"a={write_run(tmp_path / 'a')}", "--run", f"b={bad}", "--output-dir", str(out)]) == 2
    res = capsys.readouterr()
    lines = res.err.strip().splitlines()
    assert res.out == "" and len(lines) == 1 and lines[0].startswith("compare_results.py: error:"), res.err
    assert str(bad / "summary.json") in lines[0] and expect in lines[0], lines[0]
    assert not out.exists()
    # What the trainer may write is read: nulls (psutil may not know the physical cores), no cpu_kind, NaN.
    fine = write_run(tmp_path / "fine", hardware={"cpu_model": "x", "logical_cores": 2, "physical_cores": None},
                     final_metrics={"success_rate": None, "episode_distance": float("nan"), "policy_lag": 1})
    assert RunSummary.read(fine / "summary.json").final_metrics["policy_lag"] == 1


def test_an_output_that_cannot_be_written_leaves_every_output_file_as_it_was(tmp_path: Path, capsys) -> None:
    from parallel_ppo.cli import compare as entry

    out = tmp_path / "out"
    out.mkdir()
    (out / "comparison.md").mkdir()  # the fourth output: the three before it must not be written either
    for name in ("comparison.png", "comparison_report.txt", "learning_curves.png"):
        (out / name).write_text(f"old {name}")
    runs = ["--run", f"a={write_run(tmp_path / 'a')}", "--run", f"b={write_run(tmp_path / 'b', rows=ROWS[:2])}"]
    assert entry.main([*runs, "--output-dir", str(out)]) == 2
    res = capsys.readouterr()
    lines = res.err.strip().splitlines()
    assert res.out == "" and len(lines) == 1 and lines[0].startswith("compare_results.py: error:"), res.err
    assert lines[0].endswith(f"{out / 'comparison.md'} is a directory in the way"), lines[0]
    assert sorted(p.name for p in out.iterdir()) == ["comparison.md", "comparison.png", "comparison_report.txt",
                                                     "learning_curves.png"]
    assert [(out / n).read_text() for n in ("comparison.png", "comparison_report.txt", "learning_curves.png")] == [
        "old comparison.png", "old comparison_report.txt", "old learning_curves.png"]
    assert not any((out / "comparison.md").iterdir())
    (out / "comparison.md").rmdir()  # written now: the report without seeds replaces the earlier one, curves too
    assert entry.main([*runs, "--output-dir", str(out)]) == 0
    assert sorted(p.name for p in out.iterdir()) == ["comparison.json", "comparison.md", "comparison.png",
                                                     "comparison_report.txt", "phase_breakdown.png"]


def test_a_report_the_disk_does_not_take_is_one_line_exit_1_and_leaves_nothing(tmp_path, monkeypatch, capsys):
    """A full disk as the third report file is written: one line naming it, status 1 (not bad input), no file nor
    temp file, and no output folder the comparison made; from Python, WriteFailed in the same words."""
    import errno

    from parallel_ppo import api
    from parallel_ppo.cli import compare as entry
    from parallel_ppo.errors import WriteFailed
    from parallel_ppo.runs.report import plots

    written, refused = [], []
    real = plots._write_temp

    def full(target, data):
        if len(written) == 2:
            refused.append(target)
            raise OSError(errno.ENOSPC, "No space left on device")
        written.append(target)
        return real(target, data)

    monkeypatch.setattr(plots, "_write_temp", full)
    runs = {"a": write_run(tmp_path / "a"), "b": write_run(tmp_path / "b", rows=ROWS[:2])}
    out = tmp_path / "new" / "out"
    assert entry.main([*(f"--run={k}={v}" for k, v in runs.items()), "--output-dir", str(out)]) == 1
    res = capsys.readouterr()
    assert res.out == "" and res.err == (f"compare_results.py: error: could not write {refused[0]}: OSError: "
                                         "[Errno 28] No space left on device\n"), res.err
    assert not (tmp_path / "new").exists()
    written.clear()
    with pytest.raises(WriteFailed, match=r"^could not write .*No space left on device"):
        api.compare(runs, output_dir=out)
    assert not (tmp_path / "new").exists()


def test_a_label_with_tex_signs_is_drawn_as_written(tmp_path: Path) -> None:
    """matplotlib would read `$...$` in a label as TeX and fail on a bad one; the figures show it as written."""
    from parallel_ppo.cli import compare as entry

    label = "$\\frac{a}$"
    args = ["--run", f"{label}={write_run(tmp_path / 'a')}", "--run", f"b={write_run(tmp_path / 'b', seed=2)}"]
    assert entry.main([*args, "--output-dir", str(tmp_path / "out")]) == 0
    assert [r["label"] for r in json.loads((tmp_path / "out" / "comparison.json").read_text())["runs"]] == [label, "b"]


def test_long_labels_take_more_legend_rows_not_the_figures_edges(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """Four long labels: each figure's one legend fits its width (on more rows), the titles wrap onto two lines, and
    the seed band is named once, in the title, or in every legend entry where the labels' bands differ."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    from parallel_ppo.runs.reading import load_groups
    from parallel_ppo.runs.report import plots
    from parallel_ppo.runs.report.numbers import compare

    labels = [f"overlapped_with_a_long_descriptive_label_{i}" for i in range(4)]
    figures: list = []
    monkeypatch.setattr(plots, "_png", lambda fig: figures.append(fig) or b"")
    for seeds in (1, 5):  # the last label's band: the range of its one seed, or an interval of five
        groups = [(label, [write_run(tmp_path / str(seeds) / label / f"seed_{s}", seed=s)
                           for s in range(1, (seeds if label == labels[-1] else 1) + 1)]) for label in labels]
        cmp = compare(load_groups(groups))
        plots.plot_comparison(cmp)
        plots.plot_seeds(cmp)
    for fig in figures:
        assert len(fig.legends) == 1, "a legend too wide is taken off"
        legend, renderer = fig.legends[0], FigureCanvasAgg(fig).get_renderer()
        assert legend.get_window_extent(renderer).width <= fig.bbox.width
        assert fig._suptitle.get_text().count("\n") == 1  # wrapped onto two lines
    one_band, two_bands = figures[1], figures[3]
    assert "(band: range of seeds)" in one_band._suptitle.get_text()
    assert [t.get_text() for t in one_band.legends[0].get_texts()] == [f"{label} (1 seed)" for label in labels]
    assert "(band: 95% bootstrap CI of the mean or range of seeds)" in two_bands._suptitle.get_text()
    assert [t.get_text() for t in two_bands.legends[0].get_texts()] == [
        *(f"{label} (1 seed, band: range of seeds)" for label in labels[:3]),
        f"{labels[3]} (5 seeds, band: 95% bootstrap CI of the mean)"]


def test_a_success_rate_of_nan_and_flops_without_a_peak_read_as_not_reported(tmp_path):
    """summary.json's NaN success rate is no success rate (was 'nan%'); achieved GFLOP/s without its peak share is the
    figure alone (was a TypeError traceback)."""
    from parallel_ppo.runs.report.formatting import fmt_flops
    from parallel_ppo.runs.report.numbers import compare

    a = write_run(tmp_path / "a", final_metrics={"success_rate": float("nan")}, achieved_gflops=5.0,
                  peak_fraction=None)
    b = write_run(tmp_path / "b", seed=2, final_metrics={"success_rate": 0.5})
    cmp = compare(load_runs([("a", a), ("b", b)]))
    assert [s.success_rate for s in cmp.stats] == [None, 0.5]
    assert fmt_flops(cmp.runs[0].summary) == "5"
