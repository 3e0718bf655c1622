"""train_timed.py user errors: one line on stderr, exit status 2, no traceback, nothing written."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import make_environ

from parallel_ppo.runs.directory import EARLIER_RUN

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.slow  # every test here trains or starts trainers

TINY = ["--env", "CartPole-v1", "--num-envs", "2", "--set", "training.n_steps=8", "--batch-size", "8",
        "--set", "training.n_epochs=1", "--set", "model.mlp_hidden=[8]", "--set", "logging.progress=off"]

BAD_RUNS = {
    "bad flag": (["--bogus-flag"], "--bogus-flag"),
    "unknown key via --set": (["--set", "training.not_a_key=3"], "training.not_a_key"),
    "unknown key in YAML": (["--config", "{yaml_bad_key}"], "training.n_stepz"),
    "batch larger than rollout": (["--batch-size", "64"], "batch size 64"),
    "unknown game": (["--env", "starpylot"], "starpylot"),
    "missing config file": (["--config", "{missing}"], "not found"),
    "malformed config file": (["--config", "{yaml_malformed}"], "not valid YAML"),
    "--set without a value": (["--set", "training.n_steps"], "argument --set: expects section.key=value"),
}


@pytest.mark.parametrize("case", list(BAD_RUNS), ids=list(BAD_RUNS))
def test_user_error_is_one_line_exit_2(case, tmp_path, train_timed):
    """Each user error prints exactly one stderr line naming the problem, exits 2, and creates nothing."""
    (tmp_path / "bad_key.yaml").write_text("env:\n  id: CartPole-v1\ntraining:\n  n_stepz: 8\n")
    (tmp_path / "malformed.yaml").write_text("training: {n_steps: [1, 2\n")
    paths = {"yaml_bad_key": tmp_path / "bad_key.yaml", "missing": tmp_path / "nope.yaml",
             "yaml_malformed": tmp_path / "malformed.yaml"}
    extra, needle = BAD_RUNS[case]
    extra = [a.format(**paths) for a in extra]
    out_dir = tmp_path / "run"
    proc = train_timed(*TINY, "--output-dir", str(out_dir), "--total-steps", "16", *extra, timeout=120)

    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert needle in lines[0]
    assert lines[0].startswith("train_timed.py: error:")
    assert "Traceback" not in proc.stderr + proc.stdout
    assert not out_dir.exists()


def test_existing_run_is_refused_without_overwrite(tmp_path, train_timed):
    """A directory that already holds a run's file is refused (exit 2, one line) and left as it was."""
    out_dir = tmp_path / "run"
    out_dir.mkdir()
    existing = "metrics.csv"
    (out_dir / existing).write_text("earlier run\n")
    proc = train_timed(*TINY, "--output-dir", str(out_dir), "--total-steps", "16", timeout=120)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "--overwrite" in lines[0], proc.stderr
    assert "no checkpoint.pt" in lines[0], proc.stderr  # --resume-if-exists could not go on from it
    assert "Traceback" not in proc.stderr
    assert sorted(p.name for p in out_dir.iterdir()) == [existing]
    assert (out_dir / existing).read_text() == "earlier run\n"


def test_a_run_into_a_directory_another_run_is_writing_is_refused(tmp_path, train_timed):
    """Two runs into one directory at once (two terminals; a requeued job while the first still runs): the second
    is refused in one line, exit 2, even with --overwrite, and leaves the first's files as they are."""
    from parallel_ppo.runs.directory import run_dir_lock

    (tmp_path / "metrics.csv").write_text("the first run's\n")
    with run_dir_lock(tmp_path):  # held as the first run's process holds it
        proc = train_timed(*TINY, "--output-dir", str(tmp_path), "--total-steps", "16", "--overwrite", timeout=120)
    assert proc.returncode == 2 and proc.stderr.strip().splitlines() == [
        f"train_timed.py: error: another run is writing into {tmp_path} now; wait for it to end, or choose another "
        "--output-dir"], proc.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["metrics.csv"]
    assert (tmp_path / "metrics.csv").read_text() == "the first run's\n"


def test_a_taken_directory_is_refused_before_any_env_is_built(tmp_path, monkeypatch):
    """The usual slip, a run directory already used, is found before the env is built for its spaces (seconds for
    a robosuite env), in either mode."""
    import parallel_ppo as ppo
    from parallel_ppo.errors import ConfigError

    def built(*_):
        raise AssertionError("an env was built before the run directory was checked")

    monkeypatch.setattr("parallel_ppo.launch.env_spaces", built)
    (tmp_path / "metrics.csv").write_text("")
    for mode in ("sequential", "parallel"):
        with pytest.raises(ConfigError, match="already holds a run's files"):
            ppo.train(str(ROOT / "config" / "cartpole.yaml"), mode=mode, output_dir=tmp_path, verbose=False)


def test_the_refusal_says_whether_the_run_has_a_checkpoint(tmp_path):
    """A run directory's refusal says when it holds no checkpoint (--resume-if-exists could not go on from it)."""
    from parallel_ppo.core.config import Config
    from parallel_ppo.errors import ConfigError
    from parallel_ppo.runs.directory import resolve_run_dir

    cfg = Config()
    cfg.run.output_dir = str(tmp_path)
    (tmp_path / "metrics.csv").write_text("")
    with pytest.raises(ConfigError, match="but no checkpoint.pt"):
        resolve_run_dir(cfg, "parallel", overwrite=False)
    (tmp_path / "checkpoint.pt").write_bytes(b"")
    with pytest.raises(ConfigError) as refused:
        resolve_run_dir(cfg, "parallel", overwrite=False)
    assert "no checkpoint" not in str(refused.value)
    assert resolve_run_dir(cfg, "parallel", overwrite=True) == tmp_path


def test_output_dir_that_is_a_file_is_refused(tmp_path, train_timed):
    """--output-dir naming an existing file is a one-line error; the file is untouched."""
    target = tmp_path / "afile"
    target.write_text("keep")
    proc = train_timed(*TINY, "--output-dir", str(target), "--total-steps", "16", timeout=120)
    assert proc.returncode == 2
    assert len(proc.stderr.strip().splitlines()) == 1 and "not a directory" in proc.stderr
    assert target.read_text() == "keep"


def test_overwrite_replaces_an_earlier_run_and_resume_if_exists_continues_it(tmp_path, train_timed):
    """With --overwrite the run goes ahead and the earlier run's files (its evaluations and demo included) are
    replaced; other files stay. The same command with --resume-if-exists (a requeued job's) then continues it."""
    out_dir = tmp_path / "run"
    out_dir.mkdir()
    for name in ("metrics.csv", "eval.json", "demo.mp4"):
        (out_dir / name).write_text("stale\n")
    (out_dir / "notes.txt").write_text("mine\n")
    command = [*TINY, "--output-dir", str(out_dir), "--set", "run.limit_seconds=0"]
    proc = train_timed(*command, "--total-steps", "16", "--overwrite", timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert (out_dir / "metrics.csv").read_text().startswith("update,env_steps,")
    assert (out_dir / "summary.json").is_file()
    assert not (out_dir / "eval.json").exists() and not (out_dir / "demo.mp4").exists()
    assert (out_dir / "notes.txt").read_text() == "mine\n"
    assert not (out_dir / EARLIER_RUN).exists()  # the earlier run, set aside while the new one started, is gone
    proc = train_timed(*command, "--total-steps", "32", "--resume-if-exists", timeout=300)
    assert proc.returncode == 0, proc.stderr
    summary = json.loads((out_dir / "summary.json").read_text())
    assert (summary["resumes"], summary["restarts"], summary["updates"], summary["total_env_steps"]) == (1, 1, 2, 32)


PARALLEL_TINY = ["--env", "CartPole-v1", "--set", "training.n_steps=8", "--batch-size", "8",
                 "--set", "training.n_epochs=1", "--set", "logging.progress=off"]

# (trainer, arguments, words the error line must contain, words it must not contain)
USER_ERRORS = {
    "negative workers": ("train_parallel_timed.py", ["--num-workers", "-1"],
                         ["parallel.num_workers (--num-workers)", "-1"], ["env.num_envs"]),
    "zero envs per worker": ("train_parallel_timed.py", ["--num-envs-per-worker", "0"],
                             ["parallel.num_envs_per_worker (--num-envs-per-worker)", "got 0"], ["env.num_envs"]),
    "total envs that conflict with the layout": (
        "train_parallel_timed.py", ["--num-workers", "2", "--num-envs-per-worker", "4", "--set", "env.num_envs=6"],
        ["env.num_envs (--num-envs) = 6 conflicts", "2 workers × 4 envs per worker = 8"], []),
    "output dir under a file": ("train_parallel_timed.py", ["--output-dir", "{a_file}/run"],
                                ["cannot create output directory", "is not a directory"], []),
    "output dir that cannot be written": ("train_parallel_timed.py", ["--output-dir", "/proc/parallel_ppo/run"],
                                          ["cannot write output directory /proc/parallel_ppo/run: /proc: "], []),
    "rollout larger than memory": (
        "train_timed.py", ["--env", "starpilot", "--num-envs", "4096", "--set", "training.n_steps=100000"],
        ["100,001 rows × 4,096 envs", "GiB of memory is available"], []),
    "exploration mode of a game without one": (
        "train_timed.py", ["--env", "starpilot", "--set", "env.distribution_mode=exploration"],
        ["starpilot has no exploration mode"], []),
}


@pytest.mark.parametrize("case", list(USER_ERRORS), ids=list(USER_ERRORS))
def test_user_error_names_what_was_given(case, tmp_path):
    """Layout, output-directory and size errors: one line naming what the user gave, exit 2, before any
    env, worker or file exists (the trainer's start line never prints)."""
    script, extra, needles, absent = USER_ERRORS[case]
    (tmp_path / "a_file").write_text("not a directory")
    extra = [a.format(a_file=tmp_path / "a_file") for a in extra]
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, script, *PARALLEL_TINY, "--output-dir", str(out), *extra,
                           "--total-steps", "16"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    for needle in needles:
        assert needle in lines[0]
    for word in absent:
        assert word not in lines[0]
    assert "→" not in proc.stdout  # the start line: nothing was started
    assert not out.exists()


class RunsCode:
    """Pickles to a call of os.system: what a checkpoint crafted to attack `--resume` would hold."""

    def __init__(self, command: str) -> None:
        self.command = command

    def __reduce__(self):
        return os.system, (self.command,)


def test_crafted_checkpoint_is_refused_without_running_code(tmp_path, train_timed):
    """A checkpoint that would run code when unpickled is refused (exit 2, one line), and the code never runs."""
    run = tmp_path / "run"
    run.mkdir()
    marker = tmp_path / "code_ran"
    torch.save({"format_version": 1, "config": {}, "model": RunsCode(f"touch {marker}"), "optimizer": {},
                "update": 1, "env_steps": 8, "elapsed": 1.0}, run / "checkpoint.pt")
    proc = train_timed("--resume", str(run), timeout=120)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "refusing to load it" in lines[0], proc.stderr
    assert not marker.exists()


DISTRIBUTED_ERRORS = {
    "no ranks": (["NPROC=0"], "make train-distributed: error: NPROC must be a whole number above 0, got '0'"),
    "ranks not a number": (["NPROC=abc"], "NPROC must be a whole number above 0, got 'abc'"),
    "a duration that is not one": (["DURATION=abc"], "train_timed.py: error: argument --duration: expected a duration"),
    "envs that do not split over the ranks": (["NPROC=3", "ENVS_TOTAL=16"],
                                              "num_envs_total (--num-envs-total) = 16 does not split evenly over 3"),
}


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
@pytest.mark.parametrize("case", list(DISTRIBUTED_ERRORS), ids=list(DISTRIBUTED_ERRORS))
def test_make_train_distributed_checks_its_values_before_torchrun(case, tmp_path):
    """A bad NPROC, or a flag the trainer refuses, is one line of the Makefile's or the trainer's (beside make's own
    `*** Error 2`) and exit status 2: torchrun never starts, nothing is written."""
    assignments, needle = DISTRIBUTED_ERRORS[case]
    env = make_environ()
    out = tmp_path / "run"
    proc = subprocess.run(["make", "-s", "--no-print-directory", "-o", "install", "train-distributed",
                           f"PY={sys.executable}", f"OUT={out}", *assignments], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)
    lines = [line for line in proc.stderr.strip().splitlines() if not line.startswith("make: ***")]
    assert proc.returncode == 2 and len(lines) == 1 and needle in lines[0], proc.stderr
    assert "Traceback" not in proc.stderr and "torchrun" not in proc.stderr + proc.stdout and not out.exists()


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
@pytest.mark.parametrize("assignment, tag", [
    ("ENV=", "1h"), ("ENV=CartPole-v1", "CartPole-v1_1h"),
    ("ENV=sim/Sleep?step_ms=1&horizon=50", "sim-Sleep-step_ms-1-horizon-50_1h"), ("DURATION=1 h", "1-h")])
def test_make_compare_keeps_each_envs_runs_in_their_own_folders(assignment, tag):
    """`make compare ENV=CartPole-v1` once found starpilot's benchmarks/sequential_1h and compared it with a CartPole
    run: the default TAG names the env; and a DURATION of the trainer's with a space was refused as a TAG the user
    never gave (make -n: nothing runs)."""
    env = make_environ()
    out = subprocess.run(["make", "-n", "--no-print-directory", "-o", "install", "compare", assignment],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=60, check=True).stdout
    folders = {word.strip("'").removesuffix("/summary.json") for word in out.split() if word.strip("'").startswith(
        "benchmarks/")}
    assert folders == {f"benchmarks/{trainer}_{tag}" for trainer in ("sequential", "parallel", "comparison")}, out
    words = shlex.split(out.replace("\\\n", " "))
    durations = [words[i + 1] for i, word in enumerate(words) if word == "--duration"]
    assert durations == [assignment.removeprefix("DURATION=") if "DURATION" in assignment else "1h"] * 2, out


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
@pytest.mark.parametrize("tag", ["", "a b", "a;b"])
def test_make_compare_refuses_a_tag_that_names_no_run_before_it_trains(tag):
    """An empty TAG once trained an hour into benchmarks/sequential_; one with a space broke the shell's test. (PY is
    `false`: were the TAG let through, its training would fail at once, not run.)"""
    env = make_environ()
    proc = subprocess.run(["make", "-s", "--no-print-directory", "-o", "install", "compare", "PY=false",
                           f"TAG={tag}"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    lines = [line for line in proc.stderr.strip().splitlines() if not line.startswith("make: ***")]
    assert proc.returncode == 2 and lines == [f"make compare: error: TAG names the runs: letters, digits and . _ : + - "
                                              f"only, got '{tag}'"], proc.stderr


def test_make_train_distributeds_torchrun_ends_as_its_ranks_do(monkeypatch, capsys):
    """A Ctrl-C, which the ranks stop on and say so, is status 130 without torchrun's traceback; a failed rank one
    line naming it in place of torchrun's report; the arguments are torchrun's own."""
    import signal

    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure

    from parallel_ppo.cli import torchrun

    given = []

    def stopped(args):
        given.append(args)
        raise SignalException("got signal: 2", sigval=signal.SIGINT)

    monkeypatch.setattr("torch.distributed.run.run", stopped)
    assert torchrun.main(["--standalone", "--nproc_per_node", "2", "train_timed.py", "--distributed"]) == 130
    assert given[0].nproc_per_node == "2" and given[0].training_script_args == ["--distributed"]

    def failed(args):
        raise ChildFailedError("train_timed.py", {1: ProcessFailure(local_rank=1, pid=1, exitcode=2, error_file="")})

    monkeypatch.setattr("torch.distributed.run.run", failed)
    assert torchrun.main(["--standalone", "train_timed.py"]) == 1
    assert capsys.readouterr().err == ("torchrun: rank 1 exited with status 2 (its lines are above); the other ranks "
                                       "were stopped\n")

    def killed(args):
        raise ChildFailedError("train_timed.py", {0: ProcessFailure(local_rank=0, pid=1, exitcode=-9, error_file="")})

    monkeypatch.setattr("torch.distributed.run.run", killed)
    assert torchrun.main(["--standalone", "train_timed.py"]) == 1
    assert capsys.readouterr().err == "torchrun: rank 0 was killed by SIGKILL; the other ranks were stopped\n"


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
@pytest.mark.parametrize("assignments, layout, sequential", [
    (["ENV=HalfCheetah-v5"], None, None), ([], None, None),
    (["ENV=HalfCheetah-v5", "WORKERS=4"], ("4", "8"), "32"), (["ENVS=2"], ("2", "2"), "4")])
def test_make_takes_the_configs_worker_layout_unless_one_is_given(assignments, layout, sequential):
    """`make train-parallel ENV=HalfCheetah-v5` ran 2 × 8 envs (WORKERS and ENVS's defaults) where mujoco.yaml has 2
    × 2, CleanRL's rollout; compare's sequential run takes the parallel one's envs only where they are given (each
    shipped config's two runs step as many). make -n: nothing runs."""
    env = make_environ()

    def words(target: str) -> list[str]:
        out = subprocess.run(["make", "-n", "--no-print-directory", "-o", "install", target, *assignments], cwd=ROOT,
                             env=env, capture_output=True, text=True, timeout=60, check=True).stdout
        return shlex.split(out.replace("\\\n", " "))

    def flag(argv: list[str], name: str) -> str | None:
        return argv[argv.index(name) + 1] if name in argv else None

    parallel = words("train-parallel")
    assert (flag(parallel, "--num-workers"), flag(parallel, "--num-envs-per-worker")) == (layout or (None, None))
    compared = words("compare")
    trained = compared[compared.index("train_timed.py"):compared.index("train_parallel_timed.py")]
    assert flag(trained, "--num-envs") == sequential
