"""Every measured figure in README.md and docs/ says what its committed evidence file says
(scripts/docs_evidence.py: figures are links to their file, results tables are generated from it)."""

from __future__ import annotations

import csv
import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("docs_evidence", ROOT / "scripts" / "docs_evidence.py")
evidence = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(evidence)

EVIDENCE = {"machine": "a 2-core test machine", "cpu_kind": [], "date": "2026-11-25", "commit": "abc1234",
            "command": "make bench",
            "figures": {"ratio": 1.085, "range": [1.012, 1.085], "return": [1639.47, 65.55]},
            "tables": {"pairs": {"columns": ["pair", "ratio"], "rows": [[1, 1.085], [2, "1.030"]]}}}
PAGE = """# Results

Parallel ahead by [1.012 to 1.085](m/pairs.json#range); HalfCheetah [1,639 ± 66](m/pairs.json#return).

<!-- table m/pairs.json pairs -->
| pair | ratio |
|---:|---:|
| 1 | 1.085 |
| 2 | 1.030 |
<!-- /table -->
"""


def _tree(tmp_path: Path, page: str = PAGE, data: dict | None = None) -> Path:
    (tmp_path / "docs" / "results" / "m").mkdir(parents=True)
    (tmp_path / "docs" / "results" / "m" / "pairs.json").write_text(json.dumps(data or EVIDENCE))
    path = tmp_path / "docs" / "results" / "index.md"
    path.write_text(page)
    return path


def test_every_figure_in_the_docs_is_the_one_in_its_evidence_file():
    problems = evidence.check_evidence_files() + [p for page in evidence.pages() for p in evidence.check_page(page)]
    assert not problems, "\n".join(problems)


def test_a_page_that_matches_its_evidence_passes(tmp_path):
    assert evidence.check_page(_tree(tmp_path), root=tmp_path) == []
    assert evidence.check_evidence_files(tmp_path) == []


def test_a_changed_figure_fails_naming_it(tmp_path):
    page = _tree(tmp_path, PAGE.replace("[1,639 ± 66]", "[1,650 ± 66]"))
    [problem] = evidence.check_page(page, root=tmp_path)
    assert "[1,650 ± 66](m/pairs.json#return) shows 1650 where its evidence has 1639.47" in problem


def test_a_changed_table_cell_fails_and_write_regenerates_it(tmp_path):
    page = _tree(tmp_path, PAGE.replace("| 2 | 1.030 |", "| 2 | 1.031 |"))
    assert evidence.check_page(page, root=tmp_path) == [
        "docs/results/index.md: table pairs differs from m/pairs.json (run with --write)"]
    evidence.check_page(page, write=True, root=tmp_path)
    assert page.read_text() == PAGE


def test_figures_without_evidence_and_evidence_without_its_origin_are_reported(tmp_path):
    page = _tree(tmp_path, PAGE + "\nThe update is 85% of a run at 372 SPS, 1.5 ms a frame, 8 × 128 steps, `9 ms`, "
                           "a test in 12 seconds.\n",
                 {k: v for k, v in EVIDENCE.items() if k != "commit"})
    problems = evidence.check_page(page, root=tmp_path)
    unlinked = ("85%", "372 SPS", "1.5 ms", "12 seconds")
    assert [p.split(": ", 1)[1] for p in problems[-4:]] == [
        f"'{figure}' has no evidence (link it to its file, or remove it)" for figure in unlinked]
    assert problems[0].endswith("pairs.json has no commit")
    assert evidence.check_evidence_files(tmp_path) == ["docs/results/m/pairs.json has no commit"]


def test_evidence_in_a_machine_kind_folder_names_that_kind(tmp_path):
    folder = tmp_path / "docs" / "results" / "amd-epyc-avx512-bf16-2c"
    folder.mkdir(parents=True)
    (folder / "pairs.json").write_text(json.dumps({**EVIDENCE, "cpu_kind": ["avx512"]}))
    other = tmp_path / "docs" / "results" / "amd-epyc-2c"
    other.mkdir()
    (other / "pairs.json").write_text(json.dumps({**EVIDENCE, "cpu_kind": ["bf16"]}))
    assert evidence.check_evidence_files(tmp_path) == [
        "docs/results/amd-epyc-2c/pairs.json: its cpu_kind is ['bf16'], its folder's []",
        "docs/results/amd-epyc-avx512-bf16-2c/pairs.json: its cpu_kind is ['avx512'], its folder's ['avx512', 'bf16']"]


def test_figure_rounding_and_count():
    assert evidence.figure_problem("1.05–1.10×", [1.0512, 1.1049]) is None
    assert evidence.figure_problem("1.05-1.10", [1.05, 1.10]) is None  # a hyphen after a digit is a range's dash
    assert evidence.figure_problem("60k steps", 60416) is None  # to the nearest thousand
    assert evidence.figure_problem("61k", 60416) == "shows 61000 where its evidence has 60416"
    assert evidence.figure_problem("−320.8", -320.8) is None
    assert evidence.figure_problem("3,072 and never", [3072, None]) is None  # a seed that never got there
    assert evidence.figure_problem("3,072", [3072, None]) == "shows 1 numbers where its evidence has 2: [3072, None]"
    assert evidence.figure_problem("never and 3,072", [3072, None]) == "shows never where its evidence has 3072"
    assert "not a number" in evidence.figure_problem("never", None)
    assert evidence.figure_problem("1.1×", 1.16) == "shows 1.1 where its evidence has 1.16"
    assert "shows 1 numbers where its evidence has 2" in evidence.figure_problem("24.9", [24.9, 31.0])


def test_pages_a_benchmark_writes_whole_are_not_checked_but_the_rest_are(tmp_path):
    _tree(tmp_path)
    folder = tmp_path / "docs" / "results" / "m"
    for name in ("study.md", "study-robosuite_lift.md", "lift_comparison.md", "robot_scaling.md", "studying.md"):
        (folder / name).write_text("# page\n")
    (tmp_path / "docs" / "study-guide.md").write_text("# a guide\n")  # not in a machine's results folder
    checked = {p.name for p in evidence.pages(tmp_path)}
    assert {"robot_scaling.md", "studying.md", "index.md", "study-guide.md"} <= checked
    assert not checked & {"study.md", "study-robosuite_lift.md", "lift_comparison.md"}


_keep_spec = importlib.util.spec_from_file_location("keep_runs", ROOT / "scripts" / "keep_runs.py")
keep_runs = importlib.util.module_from_spec(_keep_spec)
_keep_spec.loader.exec_module(keep_runs)


def test_kept_runs_read_back_as_they_were_and_are_not_evidence_files(tmp_path, capsys):
    """scripts/keep_runs.py copies what compare_results reads of each seed run; the copies load as the runs did, and
    the evidence check passes over them (a kept summary.json has no machine or commit of its own)."""
    from fake_runs import write_run

    from parallel_ppo.runs.reading import load_run

    for seed in (1, 2):
        write_run(tmp_path / "runs_in" / f"seed_{seed}", seed=seed)
    (tmp_path / "runs_in" / "seed_2" / "ignored.pt").write_bytes(b"checkpoint")
    dest = tmp_path / "docs" / "results" / "m" / "runs" / "study"
    assert keep_runs.main([str(dest), f"synchronous={tmp_path / 'runs_in'}"]) == 0
    kept = sorted(p.relative_to(dest).as_posix() for p in dest.rglob("*") if p.is_file())
    assert kept == [f"synchronous/seed_{s}/{n}" for s in (1, 2) for n in sorted(keep_runs.KEPT)]
    for seed in (1, 2):
        was, now = (load_run("x", d / f"seed_{seed}") for d in (tmp_path / "runs_in", dest / "synchronous"))
        assert now.summary == was.summary and now.config == was.config
        assert now.metrics.keys() == was.metrics.keys()
        for column, values in was.metrics.items():
            np.testing.assert_array_equal(now.metrics[column], values)  # NaN where NaN
    assert evidence.check_evidence_files(tmp_path) == []
    assert keep_runs.main([str(dest), f"synchronous={tmp_path / 'runs_in' / 'seed_2'}"]) == 2  # kept already
    assert "is taken" in capsys.readouterr().err
    (tmp_path / "runs_in" / "seed_1" / "summary.json").unlink()  # a run that did not finish: refused, nothing copied
    assert keep_runs.main([str(tmp_path / "other"), f"x={tmp_path / 'runs_in'}"]) == 2
    assert "has no summary.json" in capsys.readouterr().err and not (tmp_path / "other").exists()


_table_spec = importlib.util.spec_from_file_location("seed_table", ROOT / "scripts" / "seed_table.py")
seed_table = importlib.util.module_from_spec(_table_spec)
_table_spec.loader.exec_module(seed_table)


def set_success(metrics: Path, rates: tuple[str, ...]) -> None:
    """Rewrite a run's metrics.csv with these success rates, a row each ("": none reported)."""
    rows = list(csv.DictReader(metrics.read_text().splitlines()))
    for row, rate in zip(rows, rates, strict=True):
        row["success_rate"] = rate
    with metrics.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


def test_seed_runs_become_figures_and_a_table_in_an_evidence_file(tmp_path, capsys):
    """scripts/seed_table.py: each label's final figures over its seeds (steps to a return, the share cut) and the
    table of means and ranges at the steps asked, each seed's row nearest the step; input it cannot read is one line
    and exit 2."""
    from fake_runs import write_run

    for seed, returns in ((1, (5.0, 7.0, 9.0)), (2, (1.0, 3.0, 4.0))):  # rows at 1,024, 2,048 and 3,072 steps
        write_run(tmp_path / "sync" / f"seed_{seed}", [(i + 1, 1024 * (i + 1), 4.0 * (i + 1), r)
                                                       for i, r in enumerate(returns)], seed=seed)
    set_success(tmp_path / "sync" / "seed_1" / "metrics.csv", ("0.3", "0.6", "0.9"))
    config = tmp_path / "sync" / "seed_1" / "config.yaml"  # a run that cut its stragglers' rollouts
    config.write_text(config.read_text().replace("sync_fraction: 1.0", "sync_fraction: 0.5", 1))
    path = tmp_path / "e.json"
    path.write_text(json.dumps(EVIDENCE))
    assert seed_table.main([str(path), "study", f"sync={tmp_path / 'sync'}", "--steps", "1000,2100",
                            "--command", "train", "--return-target", "6"]) == 0
    data = json.loads(path.read_text())
    figures = data["figures"]
    assert figures["study_sync_first_return_6_steps"] == [2048, None]  # seed 2 never reached a return of 6
    assert figures["study_sync_rollout_cut_mean"] == figures["study_sync_rollout_cut_max"] == 0.1  # every row's
    assert data["study_command"].startswith("train; scripts/seed_table.py --return-target 6 at ")
    assert figures["study_sync_seeds"] == [1, 2] and figures["study_sync_final_returns"] == [9.0, 4.0]
    assert figures["study_sync_return_range"] == [4.0, 9.0] and figures["study_sync_policy_lag"] == 0
    assert figures["study_sync_first_success_50_steps"] == [2048, None]
    assert figures["study_sync_first_success_80_steps"] == [3072, None]
    assert data["tables"]["study"]["rows"] == [["1,000", 3.0, "1.0 to 5.0", 0.2, 0.1],
                                               ["2,100", 5.0, "3.0 to 7.0", 0.35, 0.1]]
    assert figures["ratio"] == 1.085
    assert seed_table.main([str(path), "early", f"sync={tmp_path / 'sync'}", "--steps", "1000", "--until", "2048",
                            "--command", "train"]) == 0  # read up to 2,048 steps: the finals are those rows'
    data = json.loads(path.read_text())
    assert data["figures"]["early_sync_final_returns"] == [7.0, 3.0]
    assert data["tables"]["early"]["rows"] == [["1,000", 3.0, "1.0 to 5.0", 0.2, 0.1]]
    assert data["figures"]["early_sync_first_success_80_steps"] == [None, None]
    assert data["early_command"].startswith("train; scripts/seed_table.py --until 2048 at ")
    write_run(tmp_path / "plain", [(1, 1024, 4.0, 2.0)])
    set_success(tmp_path / "plain" / "metrics.csv", ("",))
    assert seed_table.main([str(path), "plain", f"sync={tmp_path / 'plain'}", "--steps", "1000",
                            "--command", "train"]) == 0  # an env that reports no success: no success figures
    data = json.loads(path.read_text())
    assert data["tables"]["plain"]["columns"] == ["env steps", "sync: mean return", "sync: return range",
                                                  "sync: mean entropy"]
    assert not [key for key in data["figures"] if key.startswith("plain_") and ("success" in key or "cut" in key)]
    capsys.readouterr()
    sync = tmp_path / "sync"  # below: no runs; runs that end before the table's last step or --until
    for runs, steps in ((tmp_path / "none", "1"), (sync, "5000"), (sync, "1000 --until 5000"),
                        (sync, "1000,3000 --until 2048"),  # --until before the table's last step; no return
                        (sync, "1000 --return-target nan")):
        assert seed_table.main([str(path), "study", f"sync={runs}", "--steps", *steps.split(), "--command", "x"]) == 2
        assert capsys.readouterr().err.count("\n") == 1
    with pytest.raises(SystemExit) as stop:  # a flag's value it cannot read: one line too
        seed_table.main([str(path), "study", f"sync={sync}", "--steps", "1", "--command", "x", "--return-target", "a"])
    assert stop.value.code == 2 and capsys.readouterr().err.count("\n") == 1
    for text in ("[]", '{"figures": []}', '{"figures": {'):  # not an evidence file: one line, the file left as it was
        path.write_text(text)
        assert seed_table.main([str(path), "study", f"sync={sync}", "--steps", "1000", "--command", "x"]) == 2
        assert capsys.readouterr().err.count("\n") == 1 and path.read_text() == text


_curve_spec = importlib.util.spec_from_file_location("reference_curve", ROOT / "scripts" / "reference_curve.py")
reference_curve = importlib.util.module_from_spec(_curve_spec)
_curve_spec.loader.exec_module(reference_curve)


def test_a_published_curve_is_the_seeds_mean_and_range_where_every_seed_logged(tmp_path, capsys):
    """scripts/reference_curve.py: the step counts every seed logged (up to --max-steps), each with the mean return
    and the seeds' range; input it cannot read is one line, exit 2, and nothing written."""
    (tmp_path / "a.csv").write_text("steps,ret,other\n100,1,x\n200,3,x\n300,5,x\n400,9,x\n")
    (tmp_path / "b.csv").write_text("steps,ret\n200,5\n300,1\n400,2\n")
    out = tmp_path / "ref.csv"
    args = ["--steps", "steps", "--return", "ret"]
    assert reference_curve.main([str(out), str(tmp_path / "a.csv"), str(tmp_path / "b.csv"), *args,
                                 "--max-steps", "350"]) == 0
    assert out.read_text().splitlines() == ["env_steps,episodic_return_mean,return_low,return_high",
                                            "200,4.0000,3.0000,5.0000", "300,3.0000,1.0000,5.0000"]
    (tmp_path / "c.csv").write_text("steps,ret\n50,nan?\n")
    (tmp_path / "d.csv").write_text("steps,ret\n50,1\n")
    capsys.readouterr()
    for bad in (["c.csv"], ["a.csv", "d.csv"], ["missing.csv"], ["a.csv", "a.csv"]):  # not a number; no common step;
        # no file; one seed's log twice
        out.unlink(missing_ok=True)
        assert reference_curve.main([str(out), *(str(tmp_path / name) for name in bad), *args]) == 2
        assert capsys.readouterr().err.count("\n") == 1 and not out.exists()
    assert reference_curve.main([str(out), str(tmp_path / "a.csv"), "--steps", "x", "--return", "ret"]) == 2
    assert "no column 'x'" in capsys.readouterr().err
    (tmp_path / "f.csv").write_text("steps,ret,steps\n1,2,3\n")
    (tmp_path / "g.csv").write_text("steps,ret,other\n\n50,x,9\n")  # a blank line, then text
    for name, says in (("f.csv", "more than one column 'steps'"), ("g.csv", "record 3: steps '50' or ret 'x' is not")):
        assert reference_curve.main([str(out), str(tmp_path / name), *args]) == 2 and not out.exists()
        err = capsys.readouterr().err
        assert says in err and err.count("\n") == 1
    (tmp_path / "e.csv").write_text("steps,ret\n1234567,1\n1234568\n")  # a short row
    assert reference_curve.main([str(out), str(tmp_path / "e.csv"), *args]) == 2 and not out.exists()
    (tmp_path / "e.csv").write_text("steps,ret\n1234567,1\n1234568,2\n")
    assert reference_curve.main([str(out), str(tmp_path / "e.csv"), *args]) == 0
    assert out.read_text().splitlines()[1:] == ["1234567,1.0000,1.0000,1.0000", "1234568,2.0000,2.0000,2.0000"]
    capsys.readouterr()
    assert reference_curve.main([str(out / "x.csv"), str(tmp_path / "e.csv"), *args]) == 2  # no folder in a file
    assert capsys.readouterr().err == (f"reference_curve.py: error: cannot create the reference CSV {out / 'x.csv'}: "
                                       f"{out} is not a directory\n")


def test_the_published_curves_committed_read_as_references():
    """Each CSV under docs/results/references/ is one compare_results.py --reference takes."""
    from parallel_ppo.runs.reference import load_reference

    curves = sorted((ROOT / "docs" / "results" / "references").glob("*.csv"))
    assert curves
    for path in curves:
        curve = load_reference(path.stem, path)
        assert curve.low is not None and (curve.low <= curve.returns).all() and (curve.returns <= curve.high).all()
