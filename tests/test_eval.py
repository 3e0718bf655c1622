"""Evaluation: eval and demo on a briefly trained checkpoint, held-out levels, bad checkpoints, normalized scores,
and the periodic evaluation during training (metrics.csv, TensorBoard, summary.json)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import types
from pathlib import Path

import numpy as np
import pytest
import torch

from parallel_ppo.core.configure import build_config
from parallel_ppo.core.evaluate import play_episodes
from parallel_ppo.core.model import build_model
from parallel_ppo.envs.batch import eval_levels
from parallel_ppo.envs.procgen_envs import PROCGEN_EASY_RANGES, normalized_return

ROOT = Path(__file__).resolve().parents[1]
SMALL = ["--config", "config/ppo_sequential.yaml", "--num-envs", "4", "--batch-size", "32",
         "--set", "training.n_steps=16", "--set", "model.impala_depths=[4, 4, 4]", "--set", "model.hidden_size=16",
         "--set", "run.limit_seconds=0", "--set", "training.n_epochs=1"]


def _python(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A starpilot run of a few updates with a periodic evaluation after each (a tiny network, for speed)."""
    out = tmp_path_factory.mktemp("eval") / "run"
    proc = _python("train_timed.py", *SMALL, "--total-steps", "192", "--output-dir", str(out),
                   "--set", "eval.interval_seconds=0.001", "--set", "eval.episodes=2", "--set", "eval.num_envs=2")
    assert proc.returncode == 0, proc.stderr
    return out


def test_normalized_return_uses_the_easy_mode_constants():
    cfg = build_config(None, {"env.id": "starpilot"}, [], False).env
    assert normalized_return(cfg, 2.5) == 0.0 and normalized_return(cfg, 64.0) == 1.0
    assert normalized_return(cfg, 33.25) == pytest.approx(0.5)
    hard = build_config(None, {"env.id": "starpilot"}, ["env.distribution_mode=hard"], False).env
    assert normalized_return(hard, 10.0) is None  # other modes have other constants
    assert normalized_return(build_config(None, {"env.id": "CartPole-v1"}, [], False).env, 10.0) is None
    assert PROCGEN_EASY_RANGES["jumper"] == PROCGEN_EASY_RANGES["leaper"] == (3.0, 10.0)


@pytest.mark.slow  # plays 12 Procgen episodes to their end: seconds
def test_test_levels_are_disjoint_from_training_levels():
    """Each counted episode's level seed lies outside the training range (and inside it for `train`)."""
    cfg = build_config(None, {"env.id": "starpilot"}, ["training.precision=fp32", "env.num_levels=5",
                                                       "env.start_level=100",
                                                     "model.impala_depths=[4, 4, 4]", "model.hidden_size=16"], False)
    test = eval_levels(cfg.env, "test")
    assert test.start_level == 105 and test.num_levels > 0
    torch.manual_seed(0)
    model = build_model((64, 64, 3), 15, cfg.model)
    for levels, inside in (("test", False), ("train", True)):
        result = play_episodes(model, cfg, levels, episodes=6, num_envs=3, deterministic=False, seed=1)
        assert len(result.returns) == len(result.level_seeds) == 6
        assert all((100 <= s < 105) == inside for s in result.level_seeds), (levels, result.level_seeds)


def test_each_env_plays_its_share_of_episodes():
    """7 episodes on 3 envs: shares 3, 2, 2 (no bias toward envs that finish short episodes first)."""
    cfg = build_config(None, {"env.id": "CartPole-v1"}, ["training.precision=fp32"], False)
    torch.manual_seed(0)
    model = build_model((4,), 2, cfg.model)
    result = play_episodes(model, cfg, "train", episodes=7, num_envs=3, deterministic=True, seed=0)
    assert len(result.returns) == 7 and result.stats()["episodes"] == 7
    assert result.stats()["normalized_mean"] is None


@pytest.mark.slow
def test_eval_writes_eval_json_and_a_video(trained: Path, tmp_path: Path):
    import imageio.v3 as iio

    video = tmp_path / "eval.mp4"
    proc = _python("-m", "parallel_ppo", "eval", "--checkpoint", str(trained), "--episodes", "3", "--num-envs", "2",
                   "--video", str(video))
    assert proc.returncode == 0, proc.stderr
    entry = json.loads((trained / "eval.json").read_text())["test_sampled"]
    assert entry["episodes"] == 3 and entry["levels"] == "test" and entry["start_level"] == 200
    assert entry["min"] <= entry["median"] <= entry["max"] and np.isfinite(entry["std"])
    assert entry["normalized_mean"] == pytest.approx((entry["mean"] - 2.5) / 61.5)
    assert entry["command"].startswith("python -m parallel_ppo eval") and entry["checkpoint_env_steps"] == 192
    frames = iio.imread(video, plugin="pyav")
    assert frames.shape[1:] == (512, 512, 3) and frames.shape[0] >= 10  # env 0's episode(s), at full resolution
    gif = tmp_path / "demo.gif"
    proc = _python("-m", "parallel_ppo", "demo", "--checkpoint", str(trained / "checkpoint.pt"), "--seconds", "1",
                   "--fps", "10", "--output", str(gif))
    assert proc.returncode == 0, proc.stderr
    assert iio.imread(gif).shape == (10, 512, 512, 3)
    proc = _python("-m", "parallel_ppo", "eval", "--checkpoint", str(trained), "--episodes", "2", "--levels", "train",
                   "--deterministic")
    assert proc.returncode == 0, proc.stderr
    assert set(json.loads((trained / "eval.json").read_text())) == {"test_sampled", "train_deterministic"}
    garbled = tmp_path / "garbled"  # an eval.json that cannot be read: refused before playing, left as it was
    shutil.copytree(trained, garbled)
    (garbled / "eval.json").write_text("{not json")
    proc = _python("-m", "parallel_ppo", "eval", "--checkpoint", str(garbled), "--episodes", "1")
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1 and "move it away" in proc.stderr
    assert (garbled / "eval.json").read_text() == "{not json"


@pytest.mark.slow
def test_periodic_eval_in_metrics_tensorboard_and_summary(trained: Path):
    import csv

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    with open(trained / "metrics.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 3 and all(r["test_return_mean"] != "" for r in rows)
    assert all(float(r["time_eval"]) > 0 for r in rows[1:])  # each evaluation counts in the next row
    acc = EventAccumulator(str(trained / "logs"))
    acc.Reload()
    assert len(acc.Scalars("charts/test_return")) == 3
    summary = json.loads((trained / "summary.json").read_text())
    assert summary["eval_levels"] == "test" and summary["test_return_mean"] is not None
    assert summary["generalization_gap"] == pytest.approx(summary["episodic_return_mean"] - summary["test_return_mean"])
    assert summary["phase_seconds"]["eval"] > 0


@pytest.mark.slow
@pytest.mark.parametrize("command, args, words", [
    ("eval", ["--seed", "-1"], "argument --seed: must be in 0..2147483647"),
    ("demo", ["--seconds", "1e308"], "a demo is at most 3600 s"),
    ("demo", ["--seconds", "3600", "--fps", "1000000000"], "at most 120 frames/s"),
    ("demo", ["--output", "/proc/x.gif"], "cannot write video file /proc/x.gif"),
    ("demo", ["--output", "{tmp}/x.avi"], ".mp4 or .gif"),
    ("eval", ["--checkpoint", "{no_generator}"], "it lacks generator"),
    ("eval", ["--checkpoint", "{tmp}/missing"], "not found"),
])
def test_bad_eval_and_demo_input_is_one_line_and_exit_2(trained, bad_checkpoints, tmp_path, capsys, command, args,
                                                         words):
    """In-process, before any episode is played (the later --checkpoint replaces the trained run's)."""
    from parallel_ppo.cli.evaluation import demo_main, eval_main

    args = [a.format(tmp=tmp_path, no_generator=bad_checkpoints["no_generator"]) for a in args]
    try:
        status = (eval_main if command == "eval" else demo_main)(["--checkpoint", str(trained), *args])
    except SystemExit as e:
        status = e.code
    err = capsys.readouterr().err
    assert status == 2 and err.count("\n") == 1 and words in err, err


@pytest.mark.slow
def test_eval_and_demo_interrupted_or_on_a_full_disk_say_so_in_one_line(trained, tmp_path, monkeypatch, capsys):
    """Ctrl-C while playing: one line, status 130, nothing written; a video the disk does not take (PyAV says so as
    an EOFError): one line naming it, status 1, no file nor the folders made for it, no second traceback as its
    writer is collected."""
    import imageio.v3

    from parallel_ppo.cli.evaluation import demo_main, eval_main
    from parallel_ppo.core import evaluate

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    def full(path, *args, **kwargs):
        Path(path).write_bytes(b"half a video")
        raise EOFError("End of file: 'avcodec_send_frame()'")

    before = sorted(p.name for p in trained.iterdir())
    video = tmp_path / "new" / "folders" / "v.mp4"
    with monkeypatch.context() as patch:
        patch.setattr(evaluate, "play_episodes", interrupted)
        assert eval_main(["--checkpoint", str(trained), "--episodes", "1"]) == 130
        assert capsys.readouterr().err.endswith("eval: interrupted; nothing was written\n")
        assert demo_main(["--checkpoint", str(trained), "--output", str(video)]) == 130
        assert capsys.readouterr().err.endswith("demo: interrupted; nothing was written\n")
    with monkeypatch.context() as patch:
        patch.setattr(imageio.v3, "imwrite", full)
        assert demo_main(["--checkpoint", str(trained), "--seconds", "1", "--output", str(video)]) == 1
        assert capsys.readouterr().err == (f"python -m parallel_ppo demo: error: could not write {video}: EOFError: "
                                           "End of file: 'avcodec_send_frame()'\n")
    assert not list(tmp_path.iterdir()) and sorted(p.name for p in trained.iterdir()) == before


def test_a_long_demo_sums_up_its_episodes_returns():
    """A demo of hundreds of episodes printed every return on one line; from 11 on, their count, mean and range."""
    from parallel_ppo.cli.evaluation import returns_shown

    assert returns_shown([]) == "none finished" and returns_shown([1.0, 2.5]) == "1, 2.5"
    assert returns_shown([float(r) for r in range(1, 301)]) == "300 episodes, mean 150.5 (min 1, max 300)"


def test_a_video_the_disk_refuses_loses_no_evaluation(trained, tmp_path, monkeypatch, capsys):
    """eval --video on a disk that takes eval.json but not the video: the result is printed and recorded, then the
    video's failure is one line, status 1 (the episodes' result was lost with the video)."""
    import imageio.v3

    from parallel_ppo.cli.evaluation import eval_main

    def full(path, *args, **kwargs):
        raise EOFError("End of file: 'avcodec_send_frame()'")

    run, video = shutil.copytree(trained, tmp_path / "run"), tmp_path / "v.mp4"
    monkeypatch.setattr(imageio.v3, "imwrite", full)
    assert eval_main(["--checkpoint", str(run), "--episodes", "1", "--video", str(video)]) == 1
    out, err = capsys.readouterr()
    assert "return mean" in out and f"wrote {run / 'eval.json'}" in out and "could not write" in err, (out, err)
    assert list(json.loads((run / "eval.json").read_text())) and not video.exists()


def test_eval_and_demo_interrupted_while_torch_loads_say_so_in_one_line(tmp_path, monkeypatch, capsys):
    """Ctrl-C before a checkpoint is read (the modules that play it still loading): one line, status 130, no
    traceback."""
    from parallel_ppo.cli.evaluation import demo_main, eval_main

    class Loading(types.ModuleType):
        def __getattr__(self, name: str) -> None:
            raise KeyboardInterrupt

    monkeypatch.setitem(sys.modules, "parallel_ppo.core.evaluate", Loading("parallel_ppo.core.evaluate"))
    for main, name in ((eval_main, "eval"), (demo_main, "demo")):
        assert main(["--checkpoint", str(tmp_path)]) == 130
        assert capsys.readouterr().err == f"\npython -m parallel_ppo {name}: interrupted; nothing was written\n"
    assert not list(tmp_path.iterdir())


@pytest.fixture(scope="module")
def bad_checkpoints(trained: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The trained checkpoint cut short (corrupt), without its generator, and with a config its weights do not fit."""
    out = tmp_path_factory.mktemp("bad")
    (out / "corrupt.pt").write_bytes((trained / "checkpoint.pt").read_bytes()[:1000])
    state = torch.load(trained / "checkpoint.pt", weights_only=True)
    del state["generator"]
    torch.save(state, out / "no_generator.pt")
    state = torch.load(trained / "checkpoint.pt", weights_only=True)
    state["config"]["model"]["hidden_size"] = 32  # the weights are for 16
    torch.save(state, out / "mismatched.pt")
    return {name: out / f"{name}.pt" for name in ("corrupt", "no_generator", "mismatched")}


@pytest.mark.slow
def test_a_corrupt_or_mismatched_checkpoint_is_one_line_and_exit_2(bad_checkpoints: dict[str, Path]):
    """From the command line: nothing the load prints (a warning, a traceback) adds a line, whether it fails reading
    the file (corrupt) or building the policy from it (mismatched)."""
    for name, words in (("corrupt", "corrupt"), ("mismatched", "does not match")):
        proc = _python("-m", "parallel_ppo", "eval", "--checkpoint", str(bad_checkpoints[name]))
        assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and words in proc.stderr, f"{name}: {proc.stderr}"


def crashing_evaluations(monkeypatch: pytest.MonkeyPatch, failing: int) -> None:
    """The run's evaluations (`runs.training.play_episodes`), the `failing`-th of which raises as a crashing eval env
    would."""
    from parallel_ppo.runs import training

    played = []

    def crashing(*args, **kwargs):
        played.append(1)
        if len(played) == failing:
            raise RuntimeError("the eval simulator lost its state")
        return play_episodes(*args, **kwargs)

    monkeypatch.setattr(training, "play_episodes", crashing)


def cartpole(out: Path, steps: int, interval: str) -> list[str]:
    """A sequential CartPole run of 32 steps an update, evaluated every `interval` seconds."""
    return ["--config", str(ROOT / "config" / "cartpole.yaml"), "--num-envs", "2", "--set", "training.n_steps=16",
            "--batch-size", "32", "--set", "training.n_epochs=1", "--total-steps", str(steps), "--set",
            "run.limit_seconds=0", "--set", "logging.progress=off", "--set", "logging.tensorboard=false", "--set",
            f"eval.interval_seconds={interval}", "--set", "eval.episodes=1", "--set", "eval.num_envs=1",
            "--output-dir", str(out)]


def test_an_evaluation_that_fails_mid_run_stops_it_with_its_files_written(tmp_path, monkeypatch, capsys):
    """The evaluation after update 2 raises (an eval env that crashes): the run stops there as after a worker's
    error, in one line and exit 1, update 2's row logged and its checkpoint and summary.json written; --resume goes
    on from it."""
    from parallel_ppo.cli.train import run as train_cli

    crashing_evaluations(monkeypatch, failing=2)
    out = tmp_path / "run"
    assert train_cli(cartpole(out, 320, "0.001"), parallel=False, prog="train_timed.py") == 1
    assert capsys.readouterr().err == ("train_timed.py: error: the evaluation after update 2 failed: RuntimeError: the "
                                       f"eval simulator lost its state (checkpoint and summary written to {out}; its "
                                       "traceback in error.txt)\n")
    summary = json.loads((out / "summary.json").read_text())
    assert (summary["stop_reason"], summary["updates"], summary["total_env_steps"]) == ("error", 2, 64)
    trace = (out / "error.txt").read_text()
    assert trace.startswith("Traceback (most recent call last):") and "the eval simulator lost its state" in trace
    assert torch.load(out / "checkpoint.pt", weights_only=True)["update"] == 2
    rows = (out / "metrics.csv").read_text().splitlines()
    assert [row.split(",")[0] for row in rows[1:]] == ["1", "2"]  # the failed evaluation's update too
    assert train_cli(["--resume", str(out)], parallel=False, prog="train_timed.py") == 0
    assert json.loads((out / "summary.json").read_text())["updates"] == 10
    assert not (out / "error.txt").exists(), "the session that finished the run has no error"


def test_an_evaluation_that_fails_at_the_end_leaves_a_run_that_a_resume_finishes(tmp_path, monkeypatch, capsys):
    """The evaluation after the last update fails: the run stops on it, its checkpoint at the step budget, and
    --resume finishes it (the final evaluation, summary.json's budget) instead of keeping the error as a finished
    run's. A final evaluation that fails is one line too, its checkpoint and summary.json written."""
    from parallel_ppo.cli.train import run as train_cli

    crashing_evaluations(monkeypatch, failing=2)
    out = tmp_path / "run"
    assert train_cli(cartpole(out, 64, "0.001"), parallel=False, prog="train_timed.py") == 1
    assert "the evaluation after update 2 failed" in capsys.readouterr().err
    assert train_cli(["--resume", str(out)], parallel=False, prog="train_timed.py") == 0
    summary = json.loads((out / "summary.json").read_text())
    assert (summary["stop_reason"], summary["updates"], summary["error"]) == ("total_steps", 2, None)
    assert summary["test_return_mean"] is not None
    assert train_cli(["--resume", str(out)], parallel=False, prog="train_timed.py") == 0  # finished: kept as it is
    assert json.loads((out / "summary.json").read_text()) == summary

    crashing_evaluations(monkeypatch, failing=1)  # no evaluation before the last
    out = tmp_path / "final"
    assert train_cli(cartpole(out, 64, "3600"), parallel=False, prog="train_timed.py") == 1
    said = capsys.readouterr().err
    assert said.endswith("train_timed.py: error: the final evaluation failed: RuntimeError: the eval simulator lost "
                         f"its state (checkpoint and summary written to {out}; its traceback in error.txt)\n")
    assert "in final" in (out / "error.txt").read_text(), "the final evaluation's traceback"
    summary = json.loads((out / "summary.json").read_text())
    assert (summary["stop_reason"], summary["updates"]) == ("error", 2)
    assert train_cli(["--resume", str(out)], parallel=False, prog="train_timed.py") == 0  # evaluated this time
    summary = json.loads((out / "summary.json").read_text())
    assert (summary["stop_reason"], summary["updates"], summary["error"]) == ("total_steps", 2, None)
    assert summary["test_return_mean"] is not None


class Killed(BaseException):
    """A SIGKILL, as far as the run's files go: the process stops where it is raised, nothing more written."""


def killed(*args, **kwargs) -> None:
    raise Killed


def test_a_run_killed_during_its_final_evaluation_is_evaluated_by_a_resume(tmp_path, monkeypatch, capsys):
    """Killed at its budget after its last checkpoint (which records the budget) and before summary.json: --resume
    trains nothing and writes what the kill lost, the final evaluation and the summary of the run's updates, not of
    an empty session; resumed again, the run is finished and kept as it is."""
    from parallel_ppo.cli.train import run as train_cli
    from parallel_ppo.runs import training

    out = tmp_path / "run"
    with monkeypatch.context() as patch, pytest.raises(Killed):
        patch.setattr(training, "play_episodes", killed)
        train_cli(cartpole(out, 64, "3600"), parallel=False, prog="train_timed.py")
    assert torch.load(out / "checkpoint.pt", weights_only=True)["stop_reason"] == "total_steps"
    assert not (out / "summary.json").exists()
    capsys.readouterr()
    assert train_cli(["--resume", str(out)], parallel=False, prog="train_timed.py") == 0
    assert "evaluation on train levels: mean return" in capsys.readouterr().out
    summary = json.loads((out / "summary.json").read_text())
    assert (summary["stop_reason"], summary["updates"], summary["total_env_steps"]) == ("total_steps", 2, 64)
    assert summary["test_return_mean"] is not None and summary["final_metrics"] == {}  # no update of its own
    assert train_cli(["--resume", str(out)], parallel=False, prog="train_timed.py") == 0
    assert json.loads((out / "summary.json").read_text()) == summary


def test_a_resume_past_its_budget_finishes_a_session_killed_after_a_checkpoint(tmp_path, monkeypatch, capsys):
    """A finished run (2 updates) resumed with a larger budget and killed after update 4's checkpoint (written during
    the session: no stop reason), its first session's summary.json left; resumed with a budget it has spent, it
    trains nothing and writes the summary of its 4 updates, not the stale one of 2."""
    from parallel_ppo.cli.train import run as train_cli
    from parallel_ppo.runs import training

    out = tmp_path / "run"
    assert train_cli(cartpole(out, 64, "3600"), parallel=False, prog="train_timed.py") == 0
    with monkeypatch.context() as patch, pytest.raises(Killed):
        patch.setattr(training.CheckpointHook, "save_last", killed)
        train_cli(["--resume", str(out), "--total-steps", "128", "--set", "run.checkpoint_interval=0.0001"],
                  parallel=False, prog="train_timed.py")
    checkpoint = torch.load(out / "checkpoint.pt", weights_only=True)
    assert (checkpoint["update"], checkpoint["stop_reason"]) == (4, None)
    assert json.loads((out / "summary.json").read_text())["updates"] == 2
    capsys.readouterr()
    assert train_cli(["--resume", str(out), "--total-steps", "64"], parallel=False, prog="train_timed.py") == 0
    assert "total_steps after 128 steps" in capsys.readouterr().out
    summary = json.loads((out / "summary.json").read_text())
    assert (summary["stop_reason"], summary["updates"], summary["total_env_steps"]) == ("total_steps", 4, 128)
    assert summary["test_return_mean"] is not None
    assert torch.load(out / "checkpoint.pt", weights_only=True)["stop_reason"] == "total_steps"


def full_disk(monkeypatch: pytest.MonkeyPatch, name: str, from_call: int) -> None:
    """Writing the run's `name` (`runs.training`'s `save_checkpoint` or `write_json`) fails from its `from_call`-th
    call on, as on a full disk: part of the file is written, then the write raises."""
    from parallel_ppo.core.files import atomic_write
    from parallel_ppo.runs import training

    real, calls = getattr(training, name), []

    def half(f) -> None:
        f.write(b"half a file")
        raise OSError(28, "No space left on device")

    def failing(path, *args):
        calls.append(1)
        return real(path, *args) if len(calls) < from_call else atomic_write(path, half)

    monkeypatch.setattr(training, name, failing)


def test_a_full_disk_at_the_end_is_one_line_and_keeps_the_files_written_before(tmp_path, monkeypatch, capsys):
    """A checkpoint (after each update, then the last), summary.json or metrics.csv's last rows that cannot be
    written end the run in one line and exit 1, saying which file and whether a checkpoint stands, never a traceback
    nor a half-written file; --resume goes on. From Python: RunFailed, in the same words."""
    import parallel_ppo as ppo
    from parallel_ppo.cli.train import run as train_cli

    def train(out: Path, *more: str) -> int:
        return train_cli([*cartpole(out, 96, "3600"), "--set", "run.checkpoint_interval=0.0001", *more],
                         parallel=False, prog="train_timed.py")

    for name, from_call, file, kept in (("save_checkpoint", 2, "checkpoint.pt", "the last checkpoint in {} is intact"),
                                        ("save_checkpoint", 1, "checkpoint.pt", "no checkpoint was written in {}"),
                                        ("write_json", 1, "summary.json", "the last checkpoint in {} is intact")):
        with monkeypatch.context() as patch:
            full_disk(patch, name, from_call)
            out = tmp_path / f"{name}{from_call}"
            assert train(out) == 1, name
        said = (f"could not write {out / file}: OSError: [Errno 28] No space left on device; stopping "
                f"({kept.format(out)})")
        assert capsys.readouterr().err.splitlines()[-1] == f"train_timed.py: error: {said}"
        assert not (out / "summary.json").exists() and not list(out.glob(".*.tmp"))
        if from_call == 2:  # stopped after the first update, whose checkpoint stands
            assert torch.load(out / "checkpoint.pt", weights_only=True)["update"] == 1
        if kept.startswith("the last"):
            assert train_cli(["--resume", str(out)], parallel=False, prog="train_timed.py") == 0
            assert json.loads((out / "summary.json").read_text())["updates"] == 3
    with monkeypatch.context() as patch:
        full_disk(patch, "save_checkpoint", 1)
        with pytest.raises(ppo.RunFailed, match=re.escape(f"stopped on an error: could not write {tmp_path / 'api'}")
                           + ".*no checkpoint was written in"):
            ppo.train(cartpole(tmp_path, 0, "3600")[1], output_dir=tmp_path / "api", verbose=False,
                      overrides={"run.total_steps": 64, "run.limit_seconds": 0, "run.checkpoint_interval": 0.0001})

    for out, checkpoints in ((tmp_path / "metrics", False), (tmp_path / "both", True)):
        with monkeypatch.context() as patch:  # metrics.csv's rows held in memory: closing the file cannot write them
            patch.setattr("parallel_ppo.runs.metrics.open", lambda path, *a, **k: open("/dev/full", "a", newline=""),
                          raising=False)
            if checkpoints:  # the last checkpoint's error is said: metrics.csv's as the file closes would hide it
                full_disk(patch, "save_checkpoint", 1)
            assert train(out) == 1
        file = "checkpoint.pt" if checkpoints else "metrics.csv"
        assert capsys.readouterr().err.splitlines()[-1].startswith(
            f"train_timed.py: error: could not write {out / file}: OSError: [Errno 28] No space left on device")
    from torch.utils.tensorboard import SummaryWriter

    def unflushed(writer) -> None:  # as its writer thread's error on a full disk comes back from close()
        raise OSError(28, "No space left on device")

    with monkeypatch.context() as patch:
        patch.setattr(SummaryWriter, "close", unflushed)
        assert train(out := tmp_path / "events", "--set", "logging.tensorboard=true") == 1
    assert capsys.readouterr().err.splitlines()[-1] == (
        f"train_timed.py: error: could not write {out / 'logs'}: OSError: [Errno 28] No space left on device; stopping "
        f"(the last checkpoint in {out} is intact)")


def test_a_second_ctrl_c_says_whether_a_checkpoint_stands(tmp_path, monkeypatch, capsys):
    """A second Ctrl-C (KeyboardInterrupt out of the loop) ends the run with status 130 and one line that names the
    checkpoint left to resume from: none before the run's first, the last one after it."""
    from parallel_ppo.cli.train import run as train_cli
    from parallel_ppo.runs import training

    def interrupted(*args, **kwargs) -> None:
        raise KeyboardInterrupt

    out = tmp_path / "run"
    with monkeypatch.context() as patch:
        patch.setattr(training, "run_loop", interrupted)
        assert train_cli(cartpole(out, 64, "3600"), parallel=False, prog="train_timed.py") == 130
    assert capsys.readouterr().err == f"\ntrain_timed.py: interrupted; no checkpoint was written in {out}\n"
    assert not (out / "checkpoint.pt").exists()
    assert train_cli(cartpole(out, 64, "3600") + ["--overwrite"], parallel=False, prog="train_timed.py") == 0
    with monkeypatch.context() as patch:
        patch.setattr(training, "run_loop", interrupted)
        assert train_cli(["--resume", str(out), "--total-steps", "128"], parallel=False, prog="train_timed.py") == 130
    assert capsys.readouterr().err == f"\ntrain_timed.py: interrupted; the last checkpoint in {out} is intact\n"


def test_a_failed_encoders_second_failure_is_not_printed_and_nothing_else_is_hidden(monkeypatch):
    """`runs.video.collect_quietly`: the writer a failed encode leaves in its traceback fails again as it is collected
    (imageio closes it), unprinted; another object's error meanwhile still reaches the hook, which is put back."""
    import gc
    import sys

    from parallel_ppo.runs import video

    said = []
    gc.collect()  # what earlier tests left is not this test's
    monkeypatch.setattr(sys, "unraisablehook", lambda raised: said.append(type(raised.exc_value)))
    hook = sys.unraisablehook

    class Writer:
        def __init__(self, error: BaseException) -> None:
            self.error, self.itself = error, self  # a cycle: only the collector frees it

        def __del__(self) -> None:
            raise self.error

    def encode() -> None:
        writer = Writer(EOFError("End of file"))  # noqa: F841 (held by the traceback's frame)
        raise OSError(28, "No space left on device")

    try:
        try:
            encode()
        except OSError as e:
            raise RuntimeError("chained") from e
    except RuntimeError as e:
        Writer(ValueError("a bug elsewhere"))
        video.collect_quietly(e)
    assert said == [ValueError] and sys.unraisablehook is hook
    gc.collect()
    assert said == [ValueError]
