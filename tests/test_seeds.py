"""Learning across seeds: the interval arithmetic by hand, multi-seed labels in compare_results.py, `--seeds`
on the trainers, and the learning benchmark's files."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from fake_runs import write_run

from parallel_ppo.cli import compare as compare_cli
from parallel_ppo.errors import ConfigError, RunDataError
from parallel_ppo.runs.reading import load_groups
from parallel_ppo.runs.report.numbers import compare
from parallel_ppo.runs.report.text import console_summary, render_markdown, seed_verdict, verdict
from parallel_ppo.runs.seeds import CI, RANGE, Estimate, bootstrap_ci, differences, group_stats, iqm

ROOT = Path(__file__).resolve().parents[1]


def test_iqm_drops_a_quarter_at_each_end():
    assert iqm([8, 1, 7, 2, 6, 3, 5, 4]) == pytest.approx(4.5)  # mean of 3, 4, 5, 6
    assert iqm([0, 0, 0, 10]) == pytest.approx(0.0)  # mean of the middle two
    assert iqm([1, 2, 9]) == pytest.approx(4.0)  # fewer than 4: nothing to drop


def test_bootstrap_interval_by_hand():
    """[0, 0, 0, 10]: a resampled mean is 2.5 k with k ~ Binomial(4, 1/4) tens drawn. P(k = 0) = 0.32, so the
    2.5% quantile is 0; P(k >= 3) = 0.051 and P(k = 4) = 0.004, so the 97.5% quantile is 7.5."""
    low, high = bootstrap_ci(np.array([0.0, 0.0, 0.0, 10.0]))
    assert (float(low), float(high)) == (0.0, 7.5)
    # Two or three seeds: every resample of all-lowest (or all-highest) has probability >= 1/27 > 2.5%,
    # so a percentile bootstrap is the seeds' range: what a label of up to 4 seeds shows, named as such.
    assert tuple(map(float, bootstrap_ci(np.array([2.0, 3.0, 5.0])))) == (2.0, 5.0)
    est = Estimate.of([2.0, 3.0, 5.0])
    assert (est.mean, est.iqm, est.low, est.high) == pytest.approx((10 / 3, 10 / 3, 2.0, 5.0))
    assert est.interval == RANGE and Estimate.of([0.0, 1.0, 2.0, 9.0]).interval == RANGE
    # Five seeds: the 95% interval of the IQM (the middle three). [0, 0, 0, 0, 10] resampled holds k ~ Bin(5, 1/5)
    # tens and its IQM is 0 for k <= 1 (P = 0.737), 10/3 for k = 2 and 20/3 for k = 3 (P(k <= 2) = 0.942 < 0.975
    # <= P(k <= 3) = 0.993): the interval is [0, 20/3].
    est = Estimate.of([0.0, 0.0, 0.0, 0.0, 10.0])
    assert (est.interval, est.mean, est.iqm, est.low) == (CI, 2.0, 0.0, 0.0) and est.high == pytest.approx(20 / 3)
    assert Estimate.of([1.0, None]) is None  # a seed without the figure: no biased mean of the rest


def _seed_runs(parent: Path, finals: list[float]) -> Path:
    """One run per seed: returns 20 at update 2, then `final` at update 3."""
    for seed, final in enumerate(finals, 1):
        write_run(parent / f"seed_{seed}", [(1, 1024, 9.0, float("nan")), (2, 2048, 13.0, 20.0),
                                            (3, 3072, 17.0, final)], seed=seed)
    return parent


def test_verdict_names_a_difference_only_from_five_seeds_without_overlap(tmp_path):
    finals = {"high": [40, 41, 42, 43, 44], "low": [30, 31, 32, 33, 34], "near": [35, 38, 41, 44, 39]}
    groups = load_groups([(label, [_seed_runs(tmp_path / label, values)]) for label, values in finals.items()])
    assert [g.runs[1].label for g in groups] == ["high/seed_2", "low/seed_2", "near/seed_2"]
    lines = differences(group_stats(groups, equal_steps=3072, equal_time=17.0), "final_return", "final return")
    assert lines == [
        "final return: high IQM 42 [95% CI 40.3, 43.7] vs near IQM 39.3 [95% CI 36, 43]: the 95% intervals overlap: "
        "no difference shown",
        "final return: high IQM 42 [95% CI 40.3, 43.7] vs low IQM 32 [95% CI 30.3, 33.7]: high is higher (the 95% "
        "intervals do not overlap)"]
    at_steps = group_stats(groups, equal_steps=2048, equal_time=17.0)
    assert [s.return_at_equal_steps.mean for s in at_steps] == [20.0, 20.0, 20.0]
    cmp = compare(groups)
    console, markdown = console_summary(cmp, []), render_markdown(cmp)
    assert "5, 95% CI" in console and ", range" not in console
    assert "| 95% bootstrap CI |" in markdown and "| range of seeds |" not in markdown


def test_runs_of_different_envs_are_compared_by_speed_and_never_by_return(tmp_path):
    """Five seeds of CartPole against five of Pendulum, their intervals far apart: no label's return is called
    higher, no target return is derived from both, and the verdict says why; SPS is still compared. One run each
    alike."""
    for label, env, base in (("cart", "CartPole-v1", 30), ("pend", "Pendulum-v1", 40)):
        for seed in range(1, 6):
            write_run(tmp_path / label / f"seed_{seed}", [(1, 1024, 9.0, 10.0), (2, 2048, 13.0, base + seed)],
                      seed=seed, env_id=env)
    cmp = compare(load_groups([("cart", [tmp_path / "cart"]), ("pend", [tmp_path / "pend"])]))
    different = "Returns are not compared: the runs train different envs (CartPole-v1, Pendulum-v1)."
    lines = seed_verdict(cmp)
    assert lines[-1] == different and all(line.startswith("SPS: ") for line in lines[:-1]) and lines[:-1]
    assert cmp.threshold is None and "different envs" in cmp.threshold_source
    one_each = compare(load_groups([(label, [tmp_path / label / "seed_1"]) for label in ("cart", "pend")]))
    lines = verdict(one_each)
    assert lines[-1] == different and "return" not in " ".join(lines[:-1]) and one_each.threshold is None
    given = compare(load_groups([(label, [tmp_path / label / "seed_1"]) for label in ("cart", "pend")]), threshold=15)
    assert given.threshold is None and "return" not in " ".join(verdict(given)[:-1])  # given: none across envs


def test_a_return_at_equal_steps_read_well_before_them_is_said_to_be(tmp_path):
    """A label logging every 2,000 steps has its return @ 3,072 steps from its update at 2,000: a warning names it
    and where it was read; a label read at 3,072 itself is not named."""
    for label, rows in (("often", [(1, 1024, 9.0, 10.0), (2, 2048, 13.0, 20.0), (3, 3072, 17.0, 30.0)]),
                        ("rarely", [(1, 2000, 9.0, 10.0), (2, 4000, 17.0, 40.0)])):
        for seed in (1, 2):
            write_run(tmp_path / label / f"seed_{seed}", rows, seed=seed)
    cmp = compare(load_groups([(label, [tmp_path / label]) for label in ("often", "rarely")]))
    early = [w for w in cmp.warnings if w.startswith("the return @ 3,072 steps")]
    assert early == ["the return @ 3,072 steps is each run's at its last update by then, which ended well before "
                     "for some: rarely/seed_1, rarely/seed_2 at 2,000 (35% before)"]


@pytest.mark.parametrize("n", [2, 3])
def test_up_to_four_seeds_show_their_range_and_no_winner(tmp_path, n):
    """Two or three seeds: the range of the seeds, never called a 95% interval, and no label declared higher
    however far apart the ranges are."""
    groups = load_groups([(label, [_seed_runs(tmp_path / label, [base + i for i in range(n)])])
                          for label, base in (("high", 40), ("low", 30))])
    lines = differences(group_stats(groups, equal_steps=3072, equal_time=17.0), "final_return", "final return")
    assert lines == [f"final return: high mean {40 + (n - 1) / 2:.3g} [range 40, {39 + n}] vs low mean "
                     f"{30 + (n - 1) / 2:.3g} [range 30, {29 + n}]: {n} seeds, so no difference claimed "
                     "(≥ 5 seeds per label for a 95% interval)"]
    cmp = compare(groups)
    console, markdown = console_summary(cmp, []), render_markdown(cmp)
    for text in (console, markdown):
        assert "is higher" not in text and "95% CI" not in text and "95% interval" in text
    assert f"{n}, range" in console and "| range of seeds |" in markdown and "band: range of seeds" in markdown


def test_the_success_rate_is_a_figure_across_seeds_where_the_env_reports_it(tmp_path):
    """A label whose runs report success gets its success rate across seeds (issue 38, point 6); a comparison where
    no run reports one shows no such column."""
    for seed, rate in enumerate([0.5, 0.7, 0.9], 1):
        write_run(tmp_path / "lift" / f"seed_{seed}", seed=seed, final_metrics={"success_rate": rate})
    _seed_runs(tmp_path / "plain", [30, 31, 32])
    cmp = compare(load_groups([("lift", [tmp_path / "lift"]), ("plain", [tmp_path / "plain"])]))
    lift, plain = cmp.group_stats
    assert lift.success_rate.values == (0.5, 0.7, 0.9) and lift.success_rate.mean == pytest.approx(0.7)
    assert plain.success_rate is None
    markdown = render_markdown(cmp)
    assert "| success rate: mean |" in markdown and "| 0.7 | 0.7 | [0.5, 0.9] |" in markdown
    without = compare(load_groups([("plain", [tmp_path / "plain"]), ("other", [_seed_runs(tmp_path / "o", [1, 2])])]))
    assert "success rate" not in render_markdown(without) + console_summary(without, [])


def test_compare_reads_seeds_from_a_parent_directory(tmp_path, capsys):
    a = _seed_runs(tmp_path / "a", [40, 41, 42])
    b = _seed_runs(tmp_path / "b", [30, 31, 32])
    out = tmp_path / "cmp"
    status = compare_cli.main(["--run", f"a={a}", "--run", f"b={b / 'seed_1'},{b / 'seed_2'},{b / 'seed_3'}",
                               "--output-dir", str(out), "--at-steps", "2048"])
    assert status == 0
    result = json.loads((out / "comparison.json").read_text())
    across = result["across_seeds"]
    assert across["equal_env_steps"] == 2048
    labels = {entry["label"]: entry for entry in across["labels"]}
    assert labels["a"]["seeds"] == 3 and labels["a"]["runs"] == ["a/seed_1", "a/seed_2", "a/seed_3"]
    assert labels["a"]["final_return"]["mean"] == pytest.approx(41.0)
    assert labels["a"]["final_return"]["low"] == 40.0 and labels["b"]["final_return"]["high"] == 32.0
    assert labels["a"]["interval"] == labels["a"]["final_return"]["interval"] == "range of seeds"
    assert not any("is higher" in line for line in result["verdict"])
    assert (out / "learning_curves.png").stat().st_size > 10_000
    assert "Across seeds" in (out / "comparison.md").read_text()
    assert "Across seeds (" in capsys.readouterr().out


def test_a_label_repeating_a_seed_or_mixing_envs_is_one_line_and_exit_2(tmp_path, capsys):
    """Two runs of seed 1 under one label would count one seed twice (a zero-width interval when the runs are
    deterministic): refused. Under labels of their own they compare. Runs of two envs under one label are refused."""
    one, again = write_run(tmp_path / "one", seed=1), write_run(tmp_path / "again", seed=1)
    other = write_run(tmp_path / "other", seed=2)
    out = tmp_path / "cmp"
    assert compare_cli.main(["--run", f"a={one},{again}", "--run", f"b={other}", "--output-dir", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "run label 'a' has two runs of seed 1" in err, err
    assert not out.exists()
    assert compare(load_groups([("a", [one]), ("b", [again])])).baseline == "a"
    acrobot = write_run(tmp_path / "acrobot", seed=3)
    (acrobot / "config.yaml").write_text((acrobot / "config.yaml").read_text().replace("CartPole-v1", "Acrobot-v1"))
    assert compare_cli.main(["--run", f"a={one},{acrobot}", "--run", f"b={other}", "--output-dir", str(out)]) == 2
    err = capsys.readouterr().err  # its returns are no seeds of CartPole's
    assert err.count("\n") == 1 and "run label 'a' has runs of different envs: CartPole-v1 (" in err, err
    assert not out.exists()


def test_every_run_has_its_own_name_in_the_tables(tmp_path):
    """Two directories of one name under a label are told apart by their parents; a name that two labels would
    both give (`a`'s seed_1 and a label `a/seed_1`) is refused before any run is read."""
    x, y = write_run(tmp_path / "x" / "run", seed=1), write_run(tmp_path / "y" / "run", seed=2)
    [group] = load_groups([("e", [x, y])])
    assert [r.label for r in group.runs] == ["e/x/run", "e/y/run"]
    a, broken = _seed_runs(tmp_path / "a", [40, 41]), tmp_path / "broken"
    broken.mkdir()
    (broken / "summary.json").write_text("{not json")  # never read: the names clash first
    with pytest.raises(ConfigError, match="would both be called 'a/seed_1'"):
        load_groups([("a", [a]), ("a/seed_1", [broken])])


def test_the_baseline_may_be_one_seed_of_a_label(tmp_path, capsys):
    """`--baseline LABEL/<directory>` picks one run of a label over seeds (the label alone means its first); a
    seed that is not there is one line, exit 2, and nothing written."""
    a, b = _seed_runs(tmp_path / "a", [40, 41, 42]), _seed_runs(tmp_path / "b", [30, 31])
    groups = load_groups([("a", [a]), ("b", [b])])
    assert compare(groups).baseline == compare(groups, "a").baseline == "a/seed_1"
    assert compare(groups, "a/seed_2").baseline == "a/seed_2"
    out = tmp_path / "cmp"
    assert compare_cli.main(["--run", f"a={a}", "--run", f"b={b}", "--baseline", "b/seed_2", "--output-dir",
                             str(out)]) == 0
    assert json.loads((out / "comparison.json").read_text())["baseline"] == "b/seed_2"
    capsys.readouterr()
    single = a / "seed_3"
    for wrong in ("a/seed_9", "d/seed_1", "c/seed_3"):  # no such seed, no such label, a label of one run
        assert compare_cli.main(["--run", f"a={a}", "--run", f"b={b}", "--run", f"c={single}", "--baseline", wrong,
                                 "--output-dir", str(tmp_path / wrong.replace("/", "_"))]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and f"--baseline {wrong!r} is not one of the runs" in err, err
        assert not (tmp_path / wrong.replace("/", "_")).exists()


def test_a_seed_missing_its_summary_is_one_line_and_exit_2(tmp_path):
    parent = _seed_runs(tmp_path / "a", [40, 41, 42])
    (parent / "seed_2" / "summary.json").unlink()
    other = _seed_runs(tmp_path / "b", [30, 31])
    out = tmp_path / "cmp"
    proc = subprocess.run([sys.executable, "compare_results.py", "--run", f"a={parent}", "--run", f"b={other}",
                           "--output-dir", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and "seed_2 has no summary.json" in proc.stderr, proc.stderr
    assert not out.exists()
    empty = tmp_path / "empty"
    empty.mkdir()
    assert compare_cli.main(["--run", f"a={parent / 'seed_1'}", "--run", f"b={empty}"]) == 2
    (other / "seed_3").mkdir()  # a seed that did not start: not a label of 2 seeds said to be all there is
    with pytest.raises(RunDataError, match=r"b: seed_3 holds none of a run's files"):
        load_groups([("a", [parent / "seed_1"]), ("b", [other])])


def test_trainer_seeds_flag_refuses_bad_lists(capsys):
    from parallel_ppo.cli.train import run

    for argv in (["--seeds", "1,x"], ["--seeds", "1,1"], ["--seeds", "1,2", "--seed", "3"],
                 ["--seeds", "1,2", "--resume-if-exists"],  # without --output-dir: nothing to go on from
                 ["--seeds", "1,2", "--set", "run.seed=5"], ["--seeds", "1,2", "--set", "run.output_dir=x"]):
        assert run(argv, parallel=False, prog="train_timed.py") == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "--seeds" in err, err


@pytest.mark.slow
def test_trainer_runs_each_seed_into_its_directory(tmp_path):
    out = tmp_path / "seeds"
    proc = subprocess.run([sys.executable, "train_timed.py", "--config", "config/cartpole.yaml", "--seeds", "1,2",
                           "--total-steps", "512", "--output-dir", str(out), "--set", "logging.tensorboard=false",
                           "--set", "run.limit_seconds=0"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    for seed in (1, 2):
        summary = json.loads((out / f"seed_{seed}" / "summary.json").read_text())
        assert summary["seed"] == seed and summary["total_env_steps"] == 512
    shutil.rmtree(out / "seed_2")  # a session that stopped before seed 2: the same command goes on
    before = (out / "seed_1" / "metrics.csv").read_text()
    proc = subprocess.run([*proc.args, "--resume-if-exists"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert (out / "seed_1" / "metrics.csv").read_text() == before, "seed 1 had ended: no update more"
    assert f"resuming {out / 'seed_1'} at update 2, 512 steps" in proc.stdout, "seed 1 had ended: it stops at once"
    for seed in (1, 2):
        assert json.loads((out / f"seed_{seed}" / "summary.json").read_text())["total_env_steps"] == 512


@pytest.mark.slow
def test_learning_benchmark_writes_its_runs_and_comparison(tmp_path):
    """One variant × two seeds of a second each, in the sequential trainer (the default, as in the sweeps); a second
    call keeps the runs that met their budget and starts a stopped one over; the parallel trainer (`--parallel`) is
    refused their directory."""
    out = tmp_path / "learning"
    cmd = [sys.executable, "bench.py", "learning", "--config", "config/cartpole.yaml", "--env", "CartPole-v1",
           "--minutes", "0.015", "--seeds", "1,2", "--variant", "norm:training.normalize_reward=true",
           "--output-dir", str(out), "--set", "logging.tensorboard=false"]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    for seed in (1, 2):
        config = (out / "norm" / f"seed_{seed}" / "config.yaml").read_text()
        assert "normalize_reward: true" in config and f"seed: {seed}" in config
        assert json.loads((out / "norm" / f"seed_{seed}" / "summary.json").read_text())["mode"] == "sequential"
    for name in ("comparison.json", "comparison.md", "learning_curves.png"):
        assert (out / "comparison" / name).is_file()
    stopped = out / "norm" / "seed_2" / "summary.json"  # as a Ctrl-C leaves it: not kept, started over
    stopped.write_text(stopped.read_text().replace('"stop_reason": "duration"', '"stop_reason": "signal"'))
    again = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0 and again.stdout.count("done before, kept") == 1, again.stdout
    assert "norm seed 2: training" in again.stdout and json.loads(stopped.read_text())["stop_reason"] == "duration"
    # the same directory asked of the parallel trainer: refused before anything trains, not mixed in
    other = subprocess.run([*cmd, "--parallel"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert other.returncode == 2 and "trained by the sequential trainer" in other.stderr, other.stderr
    assert len(other.stderr.strip().splitlines()) == 1 and other.stdout == "", other.stdout


def test_learning_benchmark_runs_the_trainer_it_is_asked_for(tmp_path, monkeypatch, capsys):
    """`bench.py learning --parallel` hands each run to the parallel trainer (the benchmark test above trains the
    sequential one), the variant's overrides last, on the config's env where no `--env` is given; the trainers
    recorded and the comparison stubbed, nothing run."""
    from parallel_ppo.bench import learning
    from parallel_ppo.cli.bench import main

    started = []
    monkeypatch.setattr(learning, "run_bench_trainer", lambda cmd, name: started.append(cmd))
    monkeypatch.setattr(learning, "make_report", lambda specs, out, prog: 0)
    monkeypatch.chdir(ROOT)
    assert main(["learning", "--config", "config/cartpole.yaml", "--minutes", "0.5",
                 "--seeds", "1,2", "--variant", "norm:training.normalize_reward=true", "--parallel",
                 "--output-dir", str(tmp_path)]) == 0, capsys.readouterr().err
    assert capsys.readouterr().out.startswith("bench.py: CartPole-v1, 1 variants")
    assert [cmd[1:4] for cmd in started] == [["-m", "parallel_ppo", "train-parallel"]] * 2
    assert not any("--env" in cmd for cmd in started), "the config names the env"
    assert [cmd[cmd.index("--output-dir") + 1] for cmd in started] == [str(tmp_path / "norm" / f"seed_{s}")
                                                                        for s in (1, 2)]
    assert all(cmd[-2:] == ["--set", "training.normalize_reward=true"] for cmd in started)


def test_learning_benchmark_keeps_the_folder_an_earlier_version_wrote(tmp_path, monkeypatch):
    """The default folder has the id's `/` as a dash; an earlier version's nested folder is taken where only it
    exists, so that its runs resume, and never over the new one."""
    from parallel_ppo.cli.learning import default_folder

    monkeypatch.chdir(tmp_path)
    assert default_folder("robosuite/Lift") == Path("benchmarks/learning_robosuite-Lift")
    (tmp_path / "benchmarks" / "learning_robosuite" / "Lift").mkdir(parents=True)
    assert default_folder("robosuite/Lift") == Path("benchmarks/learning_robosuite/Lift")
    (tmp_path / "benchmarks" / "learning_robosuite-Lift").mkdir()
    assert default_folder("robosuite/Lift") == Path("benchmarks/learning_robosuite-Lift")
    assert default_folder("CartPole-v1") == Path("benchmarks/learning_CartPole-v1")


def test_learning_benchmark_refuses_kept_runs_of_another_trainer_or_env(tmp_path):
    """A finished run of the seeds asked for is kept only for the same trainer and env; an unreadable summary is
    named, not skipped; another seed's run left in the folder is neither checked nor compared."""
    from parallel_ppo.bench.learning import Variant, check_kept_runs, comparison_specs
    from parallel_ppo.errors import ConfigError

    run = write_run(tmp_path / "ppo" / "seed_7", mode="parallel")
    write_run(tmp_path / "ppo" / "seed_8", mode="sequential", env_id="Acrobot-v1")  # an earlier call's other seed
    check_kept_runs(tmp_path, {"ppo": "CartPole-v1"}, "parallel", [7, 9])
    check_kept_runs(tmp_path, {"other": "Acrobot-v1"}, "sequential", [7])  # another variant's folder is not its own
    with pytest.raises(ConfigError, match="parallel trainer on CartPole-v1, and this benchmark runs the sequential"):
        check_kept_runs(tmp_path, {"ppo": "CartPole-v1"}, "sequential", [7])
    with pytest.raises(ConfigError, match="on CartPole-v1, and this benchmark runs the parallel trainer on Acrobot"):
        check_kept_runs(tmp_path, {"ppo": "Acrobot-v1"}, "parallel", [7])
    (run / "summary.json").write_text("{")
    with pytest.raises(ConfigError, match="cannot be read"):
        check_kept_runs(tmp_path, {"ppo": "CartPole-v1"}, "parallel", [7])
    assert comparison_specs(tmp_path, [Variant("ppo", ())], [7, 9]) == [("ppo", [run, tmp_path / "ppo" / "seed_9"])]
