"""What a user hands a trainer that it cannot use ends in one line, never a crash: a checkpoint that does not fit the
learner of its config is refused before a resume writes anything (and by eval and export, through the same check);
an env of the user's own that fails stops the sequential trainer as the parallel one: before the run if it cannot
start, else with its checkpoint and summary written; a run directory whose files a resume would fail on, and a path
no file system takes, are refused before anything is written."""

from __future__ import annotations

import errno
import hashlib
import json
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import toy_envs_environ

from parallel_ppo.cli.train import run as train_cli
from parallel_ppo.core.checkpoint import load_checkpoint, save_checkpoint
from parallel_ppo.core.collect import RolloutError, SequentialCollector
from parallel_ppo.core.config import Config
from parallel_ppo.core.configure import build_config
from parallel_ppo.core.files import write_text
from parallel_ppo.core.model import network
from parallel_ppo.core.policy import Policy
from parallel_ppo.core.timing import PhaseTimer
from parallel_ppo.core.train_state import TrainState, check_checkpoint_fits
from parallel_ppo.envs.batch import env_spaces
from parallel_ppo.envs.observations import DictLayout
from parallel_ppo.errors import ConfigError, RunDataError
from parallel_ppo.launch import load_resume
from parallel_ppo.request import Request
from parallel_ppo.runs.directory import (
    CHECKPOINT_READ,
    EARLIER_RUN,
    check_writable,
    file_identity,
    new_run_dir,
    resolve_run_dir,
    resumed_run_dir,
    run_dir_lock,
)
from parallel_ppo.runs.report.make import make_report

ROOT = Path(__file__).resolve().parents[1]
CARTPOLE = str(ROOT / "config" / "cartpole.yaml")
TRAINERS = {"sequential": "train_timed.py", "parallel": "train_parallel_timed.py"}


def make_run(path: Path, mode: str, sets: tuple[str, ...] = ()) -> Path:
    """A CartPole run directory as `mode`'s trainer leaves it after an update (config.yaml, metrics.csv, logs/ and a
    checkpoint holding Adam's moments), made in-process: training one would take seconds."""
    cfg = build_config(CARTPOLE, {"run.output_dir": str(path)}, list(sets), parallel=mode == "parallel")
    with new_run_dir(path, cfg, overwrite=False):  # config.yaml, as a run starts
        pass
    (path / "metrics.csv").write_text("update,env_steps\n1,256\n")
    (path / "logs").mkdir()
    (path / "logs" / "events.out.tfevents.1.host").write_bytes(b"events")
    spaces = env_spaces(cfg.env)
    obs_shape = spaces.obs_shape
    with torch.random.fork_rng(devices=[]):
        state = TrainState.new(cfg, spaces)
    params, value = state.model(torch.ones(4, *obs_shape))
    (params.sum() + value.sum()).backward()
    state.optimizer.step()
    state.update, state.env_steps, state.episodes = 1, 256, 2
    state.episode_returns.extend([9.0, 21.0])
    state.episode_lengths.extend([9, 21])
    save_checkpoint(path / "checkpoint.pt", state.to_checkpoint(cfg, mode, 1.5))
    return path


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("runs")
    return {mode: make_run(base / mode, mode) for mode in TRAINERS}


def edited(run: Path, where: Path, edit: Callable[[dict], None] | None) -> Path:
    """A copy of `run` at `where` whose checkpoint `edit` changed (None: replaced by random bytes)."""
    shutil.copytree(run, where)
    path = where / "checkpoint.pt"
    if edit is None:
        path.write_bytes(os.urandom(4096))
    else:
        state = torch.load(path, weights_only=True)
        edit(state)
        torch.save(state, path)
    return where


def hashes(path: Path) -> dict[str, str]:
    """sha256 of every file under `path`, by relative path: a file added, removed or changed shows."""
    return {str(p.relative_to(path)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(path.rglob("*")) if p.is_file()}


def _set(keys: tuple, value: object) -> Callable[[dict], None]:
    def edit(state: dict) -> None:
        target = state
        for key in keys[:-1]:
            target = target[key]
        target[keys[-1]] = value
    return edit


INCONSISTENT = {  # what a trial of bad checkpoints found: each crashed or hung a resumed run
    "wrong-shape exp_avg": (_set(("optimizer", "state", 0, "exp_avg"), torch.zeros(3, 5)),
                            "optimizer state of actor.0.weight: exp_avg has shape (3, 5), expected (64, 4)"),
    "wrong-shape weight": (_set(("model", "actor.0.weight"), torch.zeros(3, 5)),
                           "model['actor.0.weight'] has shape (3, 5), expected (64, 4)"),
    "extra weight": (_set(("model", "extra.weight"), torch.zeros(3)), "'extra.weight'"),
    "bad RNG state": (_set(("generator",), torch.zeros(10, dtype=torch.uint8)),
                      "generator is not a random generator's state"),
    "non-numeric episode_returns": (_set(("episode_returns",), ["abc", 1.0]),
                                    "corrupt: episode_returns[0] is 'abc', not a number"),
    "non-numeric episode_info": (_set(("episode_info",), {"is_success": [1.0, "abc"]}),
                                 "corrupt: episode_info['is_success'][1] is 'abc', not a number"),
    "random bytes": (None, "is not a checkpoint: it is corrupt"),
    "unknown mode": (_set(("mode",), "weird"),
                     "is corrupt: its mode is 'weird', not sequential, parallel or distributed"),
}


@pytest.mark.parametrize("mode", TRAINERS)
@pytest.mark.parametrize("kind", INCONSISTENT)
def test_an_inconsistent_checkpoint_is_refused_before_a_resume_writes_anything(runs, tmp_path, capsys, monkeypatch,
                                                                                mode, kind):
    """In-process through either trainer's command line: one line naming what differs, exit 2, and every file of the
    run directory as it was (no config.yaml rewritten, no new TensorBoard file); --resume-if-exists as --resume."""
    def started(*args: object) -> None:  # a checkpoint let through would crash or exhaust this process
        raise AssertionError("the checkpoint was not refused before the run started")

    monkeypatch.setattr("parallel_ppo.launch.join", started)
    edit, words = INCONSISTENT[kind]
    run = edited(runs[mode], tmp_path / "run", edit)
    before = hashes(run)
    for argv in (["--resume", str(run)], ["--config", CARTPOLE, "--output-dir", str(run), "--resume-if-exists"]):
        status = train_cli(argv, parallel=mode == "parallel", prog=TRAINERS[mode])
        captured = capsys.readouterr()
        assert status == 2, captured.err
        assert captured.err.count("\n") == 1 and captured.err.startswith(f"{TRAINERS[mode]}: error: "), captured.err
        assert words in captured.err and "→" not in captured.out, captured.err
        assert hashes(run) == before, "a refused resume changed the run directory"


def test_a_corrupt_config_yaml_is_the_runs_data_on_a_resume(runs, tmp_path, capsys):
    """The run's own config.yaml, not the command's settings: a RunDataError naming it (from Python too), one line
    and exit 2 on the command line, the run directory as it was."""
    import parallel_ppo as ppo

    run = Path(shutil.copytree(runs["sequential"], tmp_path / "run"))
    (run / "config.yaml").write_text("env:\n  nope: 1\n")
    before = hashes(run)
    with pytest.raises(RunDataError, match=f"^{re.escape(str(run / 'config.yaml'))}: unknown config key 'env.nope'"):
        ppo.train(resume=run, verbose=False)
    assert train_cli(["--resume", str(run)], parallel=False, prog="train_timed.py") == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "config.yaml: unknown config key 'env.nope'" in err, err
    assert hashes(run) == before


def test_the_checks_pass_an_intact_checkpoint_and_leave_the_random_state_alone(runs):
    for mode, run in runs.items():
        torch.manual_seed(7)
        expected = torch.rand(3)
        torch.manual_seed(7)
        cfg = build_config(str(run / "config.yaml"), {}, [], parallel=mode == "parallel")
        check_checkpoint_fits(cfg, env_spaces(cfg.env), load_checkpoint(run / "checkpoint.pt"), run / "checkpoint.pt")
        assert torch.equal(torch.rand(3), expected)


def _group(key: str, value: object) -> Callable[[dict], None]:
    return lambda state: state["optimizer"]["param_groups"][0].__setitem__(key, value)


MORE = {  # (edit, what the message says); ids name the kind
    "torch_rng garbage": (_set(("torch_rng",), torch.randint(0, 256, (5056,), dtype=torch.uint8)),
                          "torch_rng is not a random generator's state"),
    "counter a string": (_set(("update",), "3"), "update is '3', not a whole number ≥ 0"),
    "no ranks": (_set(("world_size",), 0), "world_size is 0, not a whole number ≥ 1"),
    "elapsed nan": (_set(("elapsed",), math.nan), "elapsed is nan"),
    "lengths not a list": (_set(("episode_lengths",), {"a": 1}), "episode_lengths is {'a': 1}, not a list"),
    "weight missing": (lambda s: s["model"].pop("critic.4.bias"), "model lacks 'critic.4.bias'"),
    "weight float64": (lambda s: s["model"].__setitem__("critic.4.bias", s["model"]["critic.4.bias"].double()),
                       "model['critic.4.bias'] is torch.float64, expected torch.float32"),
    "another parameter list": (_group("params", list(range(13))), "is not over the network's 12 parameters"),
    "learning rate text": (_group("lr", "fast"), "optimizer parameter group 0['lr'] is 'fast', not a number"),
    "amsgrad without its moment": (_group("amsgrad", True), "expected 'step', 'exp_avg', 'exp_avg_sq', "
                                                            "'max_exp_avg_sq'"),
    "moment missing": (lambda s: s["optimizer"]["state"][3].pop("exp_avg_sq"), "actor.2.bias holds 'step', "
                                                                              "'exp_avg', expected"),
    "state of no parameter": (_set(("optimizer", "state", 99), {}), "state for parameter 99, which the network"),
    "optimizer a list": (_set(("optimizer",), []), "optimizer is not an optimizer's state"),
}


def _check(run: Path, edit: Callable[[dict], None]) -> None:
    """The resume's check of `run`'s checkpoint after `edit`."""
    state = load_checkpoint(run / "checkpoint.pt")
    edit(state)
    cfg = build_config(str(run / "config.yaml"), {}, [], parallel=False)
    check_checkpoint_fits(cfg, env_spaces(cfg.env), state, run / "checkpoint.pt")


@pytest.mark.parametrize("kind", MORE)
def test_the_check_names_what_differs(runs, kind):
    edit, words = MORE[kind]
    with pytest.raises(RunDataError, match="^checkpoint .*checkpoint.pt (is corrupt|does not match)") as error:
        _check(runs["sequential"], edit)
    assert words in str(error.value)


def test_running_statistics_are_checked_against_the_envs(tmp_path):
    """A reward scaler's state for another number of envs (a resumed run would fail in its first update)."""
    run = make_run(tmp_path / "run", "sequential", ("training.normalize_reward=true",))
    with pytest.raises(RunDataError, match=r"reward_scaler\['returns'\] has shape \(3,\), expected \(8,\)"):
        _check(run, _set(("reward_scaler", "returns"), torch.zeros(3, dtype=torch.float64)))


def test_eval_and_export_load_a_policy_through_the_same_check(runs, tmp_path):
    """`Policy.load` (eval, demo, export) refuses a network that does not fit with the resume's message; what only a
    resumed run loads (Adam's moments) is no reason to refuse a policy."""
    edit, words = INCONSISTENT["wrong-shape weight"]
    with pytest.raises(RunDataError, match=re.escape(words)):
        Policy.load(edited(runs["sequential"], tmp_path / "weight", edit))
    moments = edited(runs["sequential"], tmp_path / "moments", INCONSISTENT["wrong-shape exp_avg"][0])
    assert Policy.load(moments).state["update"] == 1


def test_a_file_that_is_not_a_checkpoint_is_called_so(tmp_path):
    path = tmp_path / "checkpoint.pt"
    for data in (os.urandom(4096), b"", b"PK\x03\x04 half a zip"):
        path.write_bytes(data)
        with pytest.raises(RunDataError, match="is not a checkpoint: it is corrupt, truncated or another kind of file"):
            load_checkpoint(path)


@pytest.mark.slow
@pytest.mark.parametrize("mode", TRAINERS)
def test_a_resumed_trainer_refuses_a_wrong_shape_moment_in_one_line(runs, tmp_path, mode):
    """The trial's worst case as a process: this checkpoint made the sequential trainer segfault and the parallel
    coordinator grow to 24 GB."""
    run = edited(runs[mode], tmp_path / "run", INCONSISTENT["wrong-shape exp_avg"][0])
    before = hashes(run)
    proc = subprocess.run([sys.executable, TRAINERS[mode], "--resume", str(run)], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.count("\n") == 1 and "exp_avg has shape (3, 5)" in proc.stderr, proc.stderr
    assert hashes(run) == before


@pytest.mark.slow
def test_a_user_env_that_fails_stops_the_sequential_run_resumably(tmp_path):
    """An env raising in step() (on each env's 40th step, in the second update): one line naming its error (a
    message of two lines joined), exit 1, the checkpoint and summary written, and the env's traceback in error.txt;
    --resume continues from the first update. The parallel trainer's worker says it on one line too."""
    env = toy_envs_environ()
    out = tmp_path / "run"
    command = [sys.executable, "train_timed.py", "--config", CARTPOLE, "--env", "toy_envs:FailingReach-v0",
               "--num-envs", "2", "--set", "training.n_steps=32", "--batch-size", "64", "--set", "training.n_epochs=1",
               "--set", "run.limit_seconds=0", "--set", "logging.tensorboard=false", "--total-steps", "100000",
               "--output-dir", str(out)]
    for resumes in (0, 1):
        proc = subprocess.run(command if resumes == 0 else [*command[:2], "--resume", str(out)], cwd=ROOT, env=env,
                              capture_output=True, text=True, timeout=120)
        assert proc.returncode == 1, proc.stderr
        assert proc.stderr == (f"train_timed.py: error: the rollout on toy_envs:FailingReach-v0 failed: RuntimeError: "
                               f"the simulator lost its state: contact solver diverged (checkpoint and summary written "
                               f"to {out}; its traceback in error.txt)\n")
        assert 'toy_envs.py", line' in (out / "error.txt").read_text(), "where the user's env raised"
        summary = json.loads((out / "summary.json").read_text())
        assert (summary["stop_reason"], summary["updates"], summary["resumes"]) == ("error", 1 + resumes, resumes)
        assert load_checkpoint(out / "checkpoint.pt")["update"] == 1 + resumes
    parallel = tmp_path / "parallel"  # a worker's env: its message of two lines on one line too
    proc = subprocess.run([sys.executable, "train_parallel_timed.py", *command[2:-1], str(parallel)], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1 and re.fullmatch(  # either worker's envs may fail first
        r"train_parallel_timed.py: error: worker [01] failed: RuntimeError: the simulator lost its state: contact "
        rf"solver diverged \(checkpoint and summary written to {re.escape(str(parallel))}; its traceback in "
        r"error.txt\)\n", proc.stderr), proc.stderr


@pytest.mark.slow
def test_a_reward_that_is_not_a_number_stops_the_run_before_an_update_learns_from_it(tmp_path):
    """An env whose reward turns NaN (each env's 40th step, in the second rollout): one line naming the reward, the
    step and the env, exit 1; the checkpoint is the first update's, every parameter finite."""
    out = tmp_path / "run"
    proc = subprocess.run([sys.executable, "train_timed.py", "--config", CARTPOLE, "--env",
                           "toy_envs:NotFiniteReach-v0", "--num-envs", "2", "--set", "training.n_steps=32",
                           "--batch-size", "64", "--set", "run.limit_seconds=0", "--set", "logging.tensorboard=false",
                           "--total-steps", "100000", "--output-dir", str(out)],
                          cwd=ROOT, env=toy_envs_environ(), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1, proc.stderr
    assert proc.stderr == ("train_timed.py: error: a reward of toy_envs:NotFiniteReach-v0 at step 7 of env 0 of the "
                           "rollout is nan, not a finite number: the run stops before an update learns from it "
                           f"(checkpoint and summary written to {out})\n")
    checkpoint = load_checkpoint(out / "checkpoint.pt")
    assert checkpoint["update"] == 1 and all(torch.isfinite(p).all() for p in checkpoint["model"].values())


def test_a_rollout_value_that_is_not_finite_is_traced_to_its_field_step_and_env():
    """The env's rewards and observations are named before the model's values (which follow from them); a dict
    observation's vector keys are read from its packed rows."""
    from parallel_ppo.core.buffer import RolloutBuffer, not_finite_error

    buffer = RolloutBuffer.allocate(4, 3, (2,), np.float32)
    assert not_finite_error(buffer, "E") is None
    buffer.values[1, 2] = float("nan")
    assert not_finite_error(buffer, "E").startswith("the model's value estimate at step 1 of env 2 of the rollout is "
                                                    "nan, not a finite number: the model diverged")
    buffer.last_obs[1, 0] = float("-inf")
    assert not_finite_error(buffer, "E").startswith("an observation of E at the last step of env 1 of the rollout is "
                                                    "-inf")
    buffer.rewards[3, 0] = float("inf")
    assert not_finite_error(buffer, "E").startswith("a reward of E at step 3 of env 0 of the rollout is inf")
    frames = RolloutBuffer.allocate(2, 1, (4, 4, 3), np.uint8)  # integer frames hold only numbers
    assert not_finite_error(frames, "E") is None
    layout = DictLayout.of({"cam": ((4, 4, 3), True), "state": ((3,), False)})  # a dict's vectors as packed bytes
    rows = RolloutBuffer.allocate(2, 2, (layout.nbytes,), np.uint8)
    rows.obs[1, 1] = torch.from_numpy(layout.pack({"cam": np.full((4, 4, 3), 255, np.uint8),
                                                   "state": np.array([0.0, np.nan, 1.0])}, batched=False))
    assert not_finite_error(rows, "E") is None  # bytes alone say nothing
    assert not_finite_error(rows, "E", layout).startswith("an observation of E at step 1 of env 1 of the rollout is "
                                                          "nan")


@pytest.mark.filterwarnings("ignore:.*not within the observation space")  # gymnasium's checker sees it too
def test_an_env_that_cannot_start_or_returns_another_shape_is_a_rollout_error():
    """What the sequential trainer reports in one line, as the parallel one does for its workers: an env whose
    reset() fails (before any file is written) and one whose step() breaks its observation space (the run then
    stops with its checkpoint and summary, as above)."""
    def config(env_id: str) -> Config:
        return build_config(CARTPOLE, {"env.id": env_id, "env.num_envs": 2},
                            ["training.n_steps=8", "training.batch_size=16"], parallel=False)

    with pytest.raises(RolloutError, match="^the envs of toy_envs:UnreachableReach-v0 failed to start: "
                                           "ConnectionError: cannot connect to the simulator$"):
        SequentialCollector(config("toy_envs:UnreachableReach-v0"), 1)
    cfg = config("toy_envs:WrongShapeReach-v0")
    source = SequentialCollector(cfg, 1)
    try:
        with pytest.raises(RolloutError, match="^the rollout on toy_envs:WrongShapeReach-v0 failed: ValueError: "):
            source.collect(network(cfg, source.spaces), PhaseTimer())
    finally:
        source.close()


def test_a_run_is_resumed_by_its_own_trainer_and_told_how_otherwise(tmp_path):
    """A resume names the trainer that can go on: its commands, and for a distributed run its ranks under torchrun
    and the trainer of its ranks (summary.json's), which the other trainer under torchrun may not switch to."""
    from parallel_ppo.runs.directory import trainer_mismatch

    run = tmp_path / "run"
    run.mkdir()
    assert trainer_mismatch(run, {"mode": "parallel"}, "parallel", True) is None
    assert trainer_mismatch(run, {"mode": "sequential"}, "parallel", True) == (
        f"cannot resume: {run} holds a sequential run; resume it with the sequential trainer (train_timed.py, or "
        "parallel-ppo train), not under torchrun")
    distributed = {"mode": "distributed", "world_size": 2}
    assert trainer_mismatch(run, distributed, "distributed", True) is None  # no summary.json: the trainer is unknown
    (run / "summary.json").write_text(json.dumps({"distributed": {"source": "sequential"}}))
    assert trainer_mismatch(run, distributed, "distributed", False) is None
    assert trainer_mismatch(run, distributed, "distributed", True) == (
        f"cannot resume: {run} holds a distributed run of 2 ranks; resume it under torchrun with that many ranks of "
        "the sequential trainer (train_timed.py, or parallel-ppo train) and --distributed")
    assert trainer_mismatch(run, distributed, "sequential", False).startswith(f"cannot resume: {run} holds a "
                                                                             "distributed run of 2 ranks; resume it")


def test_a_folder_that_takes_no_files_is_not_called_missing(tmp_path, monkeypatch, capsys):
    """A file system that answers a new file with ENOENT (/proc) is named as taking none, not as missing; a
    comparison is refused so before it reads a run."""
    def refuse(*args, **kwargs):
        raise FileNotFoundError(errno.ENOENT, "No such file or directory")

    monkeypatch.setattr(tempfile, "TemporaryFile", refuse)
    with pytest.raises(ConfigError, match=re.escape(f"{tmp_path}: it takes no new files")):
        check_writable(tmp_path / "run")
    assert make_report([("a", [tmp_path / "a"]), ("b", [tmp_path / "b"])], tmp_path / "cmp", "compare_results.py") == 2
    assert capsys.readouterr().err == (f"compare_results.py: error: cannot write output directory {tmp_path / 'cmp'}: "
                                       f"{tmp_path}: it takes no new files\n")


def _folder_for(path: Path) -> None:
    path.unlink()
    path.mkdir()


def _file_for(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)
    path.write_text("not a folder")


DAMAGED = {
    "metrics.csv of other bytes than text": (lambda run: (run / "metrics.csv").write_bytes(b"update\n1\n\xff\xfe"),
                                             "metrics.csv cannot be read ('utf-8' codec can't decode byte 0xff"),
    # (read in the locale's encoding, as a resume reads it: UTF-8 under a C or UTF-8 locale, PEP 538)
    "metrics.csv with a field over csv's limit": (lambda run: (run / "metrics.csv").write_text("a\n" + "9" * 200_000),
                                                  "metrics.csv cannot be read (field larger than field limit"),
    "metrics.csv a folder": (lambda run: _folder_for(run / "metrics.csv"), "metrics.csv is a folder, not the run's"),
    "summary.json a folder": (lambda run: (run / "summary.json").mkdir(), "summary.json is a folder, not the run's"),
    "logs a file": (lambda run: _file_for(run / "logs"), "logs is a file, not the run's folder"),
    "wandb a file": (lambda run: _file_for(run / "wandb"), "wandb is a file, not the run's folder"),
}


@pytest.mark.parametrize("kind", DAMAGED)
def test_a_run_directory_that_a_resume_would_fail_on_is_refused_before_it_writes_anything(runs, tmp_path, capsys,
                                                                                         monkeypatch, kind):
    """A run's file that a resume reads or writes, damaged: one line naming it, exit 2, the run directory as it was
    (config.yaml not rewritten), where the run would have failed with a traceback once its workers had started."""
    def started(*args: object) -> None:
        raise AssertionError("the run directory was not refused before the run started")

    monkeypatch.setattr("parallel_ppo.launch.join", started)
    damage, words = DAMAGED[kind]
    run = tmp_path / "run"
    shutil.copytree(runs["sequential"], run)
    damage(run)
    before = hashes(run)
    status = train_cli(["--resume", str(run)], parallel=False, prog="train_timed.py")
    err = capsys.readouterr().err
    assert status == 2 and err.count("\n") == 1 and words in err, err
    assert hashes(run) == before


LONG = "x" * 300
"""A name longer than any file system takes (255 bytes)."""


@pytest.mark.parametrize("argv", [
    ["train", "--output-dir", f"runs/{LONG}"], ["train-parallel", "--resume", LONG], ["train", "--config", LONG],
    ["eval", "--checkpoint", LONG], ["export", LONG], ["export", "run", "--output", f"{LONG}.onnx"],
    ["compare", "--run", f"a={LONG}", "--run", "b=b"], ["compare", "--run", "a=a", "--output-dir", LONG],
    ["compare", "--run", "a=a", "--reference", f"sac={LONG}.csv"], ["bench", "roofline", "--output", LONG],
    ["bench", "scaling", "--output-dir", LONG], ["bench", "study", "--runs-dir", LONG],
    ["compare", "--run", "a=a", "--output-dir", ""], ["train", "--config", ""],
])
def test_a_path_no_file_system_takes_is_one_line_before_any_work(tmp_path, monkeypatch, capsys, argv):
    """An empty path, or a name over 255 bytes, in any command's path flag: one line, exit 2, before anything is
    read or measured (no `OSError: File name too long` traceback, no report written to the current directory)."""
    from parallel_ppo.cli import main

    def started(*args: object) -> None:  # a path let through must not train here
        raise AssertionError("the path was not refused before the run started")

    monkeypatch.setattr("parallel_ppo.launch.join", started)
    monkeypatch.chdir(tmp_path)
    try:
        status = main(argv)
    except SystemExit as e:  # argparse's refusal
        status = e.code
    err = capsys.readouterr().err
    assert status == 2 and err.count("\n") == 1, err
    assert ("longer than the 255 a file system takes" if argv[-1] else "an empty path") in err, err
    assert not list(tmp_path.iterdir())


def test_a_config_files_output_directory_no_file_system_takes_is_refused(tmp_path):
    cfg = build_config(CARTPOLE, {"run.output_dir": str(tmp_path / LONG)}, [], parallel=False)
    with pytest.raises(ConfigError, match="^output directory: a name of 300 bytes"):
        resolve_run_dir(cfg, "sequential", overwrite=False)
    root = build_config(CARTPOLE, {"run.output_dir": "/"}, [], parallel=False)
    with pytest.raises(ConfigError, match="^output directory / is the file system's root"):
        resolve_run_dir(root, "sequential", overwrite=True)
    (tmp_path / "loop").symlink_to(tmp_path / "loop")
    looped = build_config(CARTPOLE, {"run.output_dir": str(tmp_path / "loop" / "run")}, [], parallel=False)
    with pytest.raises(ConfigError, match="^output directory .*loop/run: "):
        resolve_run_dir(looped, "sequential", overwrite=False)
    with pytest.raises(ConfigError, match="^--output-dir .*loop/run: "):  # beside --resume
        load_resume(Request(resume=str(tmp_path), flags={"run.output_dir": str(tmp_path / "loop" / "run")}))


def _files(path: Path) -> dict[str, str]:
    return {str(p.relative_to(path)): p.read_text() for p in path.rglob("*") if p.is_file()}


class Stop(Exception):
    """A start that fails (W&B, a write, Ctrl-C: any exception of the body)."""


@pytest.mark.parametrize("overwrite", [False, True])
@pytest.mark.parametrize("starts", [True, False])
def test_a_new_run_dir_keeps_what_is_no_run_of_its_own_and_replaces_a_run_only_once_started(tmp_path, overwrite,
                                                                                           starts):
    """`new_run_dir`: a folder of the user's own named replaced_run is never touched without --overwrite; with it,
    the earlier run's files are gone once the start has returned and are back, the new run's gone, if it raised. A
    directory that existed stays, empty or not."""
    cfg = build_config(CARTPOLE, {}, [], parallel=False)
    earlier = {"metrics.csv": "update\n1\n", "logs/events": "events", "policy.onnx": "exported", "notes.txt": "mine"}
    own = {f"{EARLIER_RUN}/data.txt": "the user's", "notes.txt": "mine"}
    before = earlier if overwrite else own
    for name, text in before.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    try:
        with new_run_dir(tmp_path, cfg, overwrite):
            assert (tmp_path / "config.yaml").is_file() and not (tmp_path / "metrics.csv").exists()
            if not starts:
                raise Stop
    except Stop:
        pass
    after = _files(tmp_path)
    assert all(after[name] == text for name, text in before.items() if name in after)
    if starts:
        assert set(after) == {"config.yaml", *(k for k in before if k.startswith((EARLIER_RUN, "notes")))}
    else:
        assert after == before


def test_an_earlier_run_is_not_set_aside_in_part(tmp_path, monkeypatch):
    """A move that fails half-way puts back what moved, and a replaced_run in the way is refused before any move,
    in the directory check too (before the run's envs start)."""
    cfg = build_config(CARTPOLE, {"run.output_dir": str(tmp_path)}, [], parallel=False)
    earlier = {"metrics.csv": "update\n1\n", "checkpoint.pt": "weights", "summary.json": "{}"}
    for name, text in earlier.items():
        (tmp_path / name).write_text(text)
    moves, replace = [], os.replace

    def fails_second(src, dst):
        moves.append(src)
        if len(moves) == 2 and Path(dst).parent.name == EARLIER_RUN:
            raise OSError(28, "No space left on device")
        replace(src, dst)

    monkeypatch.setattr("parallel_ppo.runs.directory.os.replace", fails_second)
    with pytest.raises(OSError, match="No space"), new_run_dir(tmp_path, cfg, overwrite=True):
        pass
    assert _files(tmp_path) == earlier and not (tmp_path / EARLIER_RUN).exists()
    (tmp_path / EARLIER_RUN).write_text("in the way")
    for check in (lambda: resolve_run_dir(cfg, "sequential", overwrite=True),
                  lambda: new_run_dir(tmp_path, cfg, overwrite=True).__enter__()):
        with pytest.raises(ConfigError, match=f"{EARLIER_RUN} is in the way"):
            check()
    assert _files(tmp_path) == {**earlier, EARLIER_RUN: "in the way"}


def test_a_resume_whose_start_fails_leaves_the_run_as_it_was(runs, tmp_path, capsys, monkeypatch):
    """`--resume RUN --track` where W&B cannot start: one line, exit 2, and config.yaml not rewritten with the new
    settings (a plain resume afterwards would fail the same way), no W&B folder left."""
    import wandb

    run = tmp_path / "run"
    shutil.copytree(runs["sequential"], run)
    before = hashes(run)
    monkeypatch.setenv("WANDB_MODE", "bogus")
    try:
        status = train_cli(["--resume", str(run), "--track", "--total-steps", "4096"],
                           parallel=False, prog="train_timed.py")
    finally:
        wandb.teardown()
    err = capsys.readouterr().err
    assert status == 2 and err.count("\n") == 1 and "WANDB_MODE = 'bogus'" in err, err
    assert hashes(run) == before and not (run / "wandb").exists()


def test_a_resume_into_a_directory_that_takes_no_writes_is_one_line_and_changes_nothing(runs, tmp_path, capsys,
                                                                                        monkeypatch):
    """A run directory that takes no new file (a read-only mount; as root, chmod makes none, so the probe's file is
    refused as such a mount refuses it) is refused before the run starts: one line, exit 2. Where config.yaml cannot
    be written once it starts, the run stops in one line naming the file (exit 1), the restore of config.yaml after
    it being best effort: its error does not replace the first. The run directory stays as it was."""
    def tuned(*args: object) -> None:
        raise AssertionError("the directory was not refused before the run started")

    def read_only(*args: object, **kwargs: object) -> None:
        raise OSError(errno.EROFS, "Read-only file system")

    run = Path(shutil.copytree(runs["sequential"], tmp_path / "run"))
    before, temporary_file = hashes(run), tempfile.TemporaryFile

    def probe(*args: object, dir: object = None, **kwargs: object) -> object:  # tempfile names it `dir`
        return read_only() if dir == run.absolute() else temporary_file(*args, dir=dir, **kwargs)

    with monkeypatch.context() as patch:
        patch.setattr("parallel_ppo.launch.tune", tuned)
        patch.setattr(tempfile, "TemporaryFile", probe)
        assert train_cli(["--resume", str(run)], parallel=False, prog="train_timed.py") == 2
    assert capsys.readouterr().err == (f"train_timed.py: error: cannot write run directory {run}: {run}: Read-only "
                                       "file system\n")
    with monkeypatch.context() as patch:
        patch.setattr("parallel_ppo.runs.directory.write_text", read_only)
        patch.setattr("parallel_ppo.runs.directory.atomic_write", read_only)
        assert train_cli(["--resume", str(run)], parallel=False, prog="train_timed.py") == 1
        assert capsys.readouterr().err == (f"train_timed.py: error: could not write {run / 'config.yaml'}: OSError: "
                                           f"[Errno 30] Read-only file system; stopping (the last checkpoint in {run} "
                                           "is intact)\n")
    assert hashes(run) == before


def test_a_new_run_whose_config_the_disk_does_not_take_is_one_line_and_leaves_no_directory(tmp_path, capsys,
                                                                                           monkeypatch):
    """A full disk as a new run writes its config.yaml was a traceback: now the run stops in one line naming the file
    (exit 1), and the directory made for it is removed."""
    def full(*args: object, **kwargs: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    run = tmp_path / "run"
    monkeypatch.setattr("parallel_ppo.runs.directory.write_text", full)
    argv = ["--config", CARTPOLE, "--set", "run.limit_seconds=0", "--output-dir", str(run)]
    assert train_cli(argv, parallel=False, prog="train_timed.py") == 1
    assert capsys.readouterr().err == (f"train_timed.py: error: could not write {run / 'config.yaml'}: OSError: "
                                       f"[Errno 28] No space left on device; stopping (no checkpoint was written in "
                                       f"{run})\n")
    assert not run.exists()


def test_a_start_that_fails_removes_the_directory_it_made_only(tmp_path):
    """The run directory made for a start that fails is removed, its parent (made too) and a directory that was
    there already stay."""
    cfg = build_config(CARTPOLE, {}, [], parallel=False)
    (tmp_path / "there").mkdir()
    for path in (tmp_path / "new" / "run", tmp_path / "there"):
        with pytest.raises(Stop), run_dir_lock(path), new_run_dir(path, cfg, overwrite=False):
            raise Stop
    assert sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*")) == ["new", "there"]


def test_a_run_directory_takes_one_run_at_a_time(tmp_path, monkeypatch):
    """A second lock of a directory is refused while the first is held (a second open of it, as another process's
    would be), and taken again once it is released; a lock on a directory no longer at its path is none."""
    with run_dir_lock(tmp_path), pytest.raises(ConfigError, match=f"another run is writing into {tmp_path} now"):
        with run_dir_lock(tmp_path):
            pass
    with run_dir_lock(tmp_path):
        pass
    other = tmp_path / "other"
    other.mkdir()
    with monkeypatch.context() as patch, pytest.raises(ConfigError, match="was removed .* while this run locked it"):
        patch.setattr(os, "stat", lambda *args, **kwargs: os.lstat(other))  # the path is another directory now
        with run_dir_lock(tmp_path):
            pass


def test_the_start_checks_the_directory_again_under_its_lock(tmp_path):
    """What a run found before its lock (seconds to minutes earlier: env, workers, measurements) is checked again
    once it holds it: a new run's directory that a run ended into meanwhile is refused unless overwriting, and a
    resume whose checkpoint was written again since it was read (by a run ended since) is refused."""
    cfg = build_config(CARTPOLE, {}, [], parallel=False)
    (tmp_path / "metrics.csv").write_text("update\n1\n")
    with pytest.raises(ConfigError, match="got another run's files while this run started"):
        with new_run_dir(tmp_path, cfg, overwrite=False):
            pass
    assert sorted(p.name for p in tmp_path.iterdir()) == ["metrics.csv"]
    (tmp_path / "config.yaml").write_text("as it was")
    (tmp_path / "checkpoint.pt").write_bytes(b"update 2")
    resume = {CHECKPOINT_READ: file_identity(tmp_path / "checkpoint.pt")}
    with resumed_run_dir(tmp_path, cfg, resume):
        pass
    write_text(tmp_path / "checkpoint.pt", "update 4")  # as a run's checkpoint is written: a new file in its place
    (tmp_path / "config.yaml").write_text("as it was")
    with pytest.raises(ConfigError, match="checkpoint.pt was written again while this run started"):
        with resumed_run_dir(tmp_path, cfg, resume):
            pass
    assert (tmp_path / "config.yaml").read_text() == "as it was"


@pytest.mark.parametrize(("flag", "value", "words"), [("--episodes", "1000001", "at most 1,000,000 (as eval.episodes)"),
                                                      ("--num-envs", "4097", "at most 4,096 (as eval.num_envs)")])
def test_the_eval_commands_counts_stop_where_the_configs_do(capsys, flag, value, words):
    """`eval --episodes` and `--num-envs` past `eval.episodes`' and `eval.num_envs`' maxima: one line, exit 2."""
    import parallel_ppo as ppo
    from parallel_ppo.cli import main

    try:
        status = main(["eval", "--checkpoint", "run", flag, value])
    except SystemExit as e:  # argparse's refusal
        status = e.code
    err = capsys.readouterr().err
    assert status == 2 and err.count("\n") == 1 and words in err, err
    with pytest.raises(ConfigError, match=f"^{flag[2:].replace('-', '_')} must be at most"):  # the Python API's too
        ppo.evaluate("run", **{flag[2:].replace("-", "_"): int(value)})
