"""Episode statistics (issue 48, item 5): an entry of an episode's final info named in `logging.episode_info` travels
one path from the env to metrics.csv, TensorBoard, summary.json, the checkpoint's windows and compare_results' table
across seeds, as `is_success` always does; an entry an episode lacks does not count for it, one that is no number is
refused in one line. tests/test_parallel.py and tests/test_distributed.py check the same entry in those modes."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest

import parallel_ppo as ppo
from parallel_ppo.cli.train import run as train_cli
from parallel_ppo.core.checkpoint import load_checkpoint
from parallel_ppo.core.configure import config_from_dict
from parallel_ppo.core.train_state import TrainState
from parallel_ppo.envs.batch import SUCCESS, env_spaces, episode_info, make_batch_env
from parallel_ppo.envs.config import EnvConfig
from parallel_ppo.runs.report.text import console_summary, render_markdown, to_json

ROOT = Path(__file__).resolve().parents[1]
MUJOCO = str(ROOT / "config" / "mujoco.yaml")
GOAL = "toy_envs:GoalReach-v0"
TINY = {"env.id": GOAL, "env.num_envs": 4, "training.n_steps": 16, "training.batch_size": 32,
        "run.total_steps": 3 * 64, "run.limit_seconds": 0, "training.precision": "fp32",
        "training.microbatch_size": 0, "logging.episode_info": ["distance_to_goal"]}
"""Three updates of 4 envs × 16 steps: no 20-step episode ends in the first, 4 in the second, 4 more in the third."""


class Said:
    """An env whose ended episode's final info is `info`."""

    def __init__(self, info: dict) -> None:
        self.info = info

    def final_info(self, index: int, keys: tuple[str, ...]) -> dict:
        return {key: value for key, value in self.info.items() if key in keys}


def test_final_info_entries_are_read_from_each_ended_episode_as_numbers():
    env = make_batch_env(EnvConfig(id=GOAL), 1, 0, 4, 1)
    keys = ("distance_to_goal", "label", SUCCESS)
    try:
        env.reset()
        right = [e.unwrapped.target > 0 for e in env._env.envs]
        for _ in range(19):
            env.step(np.zeros((4, 1), np.float32))
            assert [episode_info(env, i, keys) for i in range(4)] == [({}, {})] * 4  # no episode ended
        _, rewards, dones, _ = env.step(np.zeros((4, 1), np.float32))
        read = [episode_info(env, i, keys) for i in range(4)]
    finally:
        env.close()
    assert dones.all() and True in right and False in right
    for (numbers, not_numbers), has, reward in zip(read, right, rewards, strict=True):
        assert numbers == ({"distance_to_goal": pytest.approx(-reward)} if has else {})  # lacking it: not counted
        assert not_numbers in ({"label": "'near' (str)"}, {"label": "'far' (str)"})
    said = Said({"a": np.float32(0.5), "b": True, "c": np.array([3]), "d": None, "e": float("nan"), "f": [1, 2],
                 "g": {"x": 1}, SUCCESS: 0.3})
    assert episode_info(said, 0, list(said.info)) == ({"a": 0.5, "b": 1.0, "c": 3.0, SUCCESS: 1.0},
                                                       {"f": "[1, 2] (list)", "g": "{'x': 1} (dict)"})


def test_a_users_entry_reaches_every_writer_the_checkpoint_and_the_comparison(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    runs = [ppo.train(MUJOCO, output_dir=tmp_path / "goal" / f"seed_{seed}", overrides={**TINY, "run.seed": seed},
                      verbose=False) for seed in (1, 2)]
    run = runs[0]
    with open(run.path / "metrics.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert [r["episodes"] for r in rows] == ["0", "4", "8"]
    assert rows[0]["episode_distance_to_goal"] == "" and float(rows[0]["reward_per_step"]) < 0  # before any episode
    windows = load_checkpoint(run.path / "checkpoint.pt")["episode_info"]
    assert windows[SUCCESS] == [] and 0 < len(windows["distance_to_goal"]) < 8  # the episodes whose info had it
    final = float(rows[-1]["episode_distance_to_goal"])
    assert final == pytest.approx(np.mean(windows["distance_to_goal"]), rel=1e-5)
    assert run.summary.final_metrics["episode_distance_to_goal"] == pytest.approx(final, rel=1e-5)
    assert "success_rate" not in run.summary.final_metrics and rows[-1]["success_rate"] == ""  # none reported
    events = EventAccumulator(str(run.path / "logs"))
    events.Reload()
    assert [e.step for e in events.Scalars("episode/distance_to_goal")] == [128, 192]
    assert events.Scalars("episode/distance_to_goal")[-1].value == pytest.approx(final, rel=1e-5)

    cmp = ppo.compare({"goal": tmp_path / "goal"})
    assert "episode/distance_to_goal" in console_summary(cmp, [])
    assert "| episode/distance_to_goal: mean |" in render_markdown(cmp)
    across = to_json(cmp)["across_seeds"]["labels"][0]["episode_distance_to_goal"]
    assert across["values"] == pytest.approx([r.summary.final_metrics["episode_distance_to_goal"] for r in runs])

    resumed = ppo.train(resume=run.path, overrides={"run.total_steps": 4 * 64}, verbose=False)
    after = load_checkpoint(resumed.path / "checkpoint.pt")["episode_info"]["distance_to_goal"]
    assert after[:len(windows["distance_to_goal"])] == windows["distance_to_goal"]  # the window went on
    ppo.train(resume=run.path, overrides={"run.total_steps": 5 * 64, "logging.episode_info": []}, verbose=False)
    with open(run.path / "metrics.csv", newline="") as f:
        kept = list(csv.DictReader(f))
    assert kept[2]["episode_distance_to_goal"] == rows[2]["episode_distance_to_goal"] != ""  # not logged now, kept
    assert kept[-1]["episode_distance_to_goal"] == "" and len(kept) == 5


def test_a_checkpoint_from_before_episode_info_keeps_its_success_window(tmp_path):
    run = ppo.train(MUJOCO, output_dir=tmp_path / "run", overrides={**TINY, "run.total_steps": 64}, verbose=False)
    checkpoint = load_checkpoint(run.path / "checkpoint.pt")
    del checkpoint["episode_info"]
    checkpoint["episode_successes"] = [1.0, 0.0, 1.0]  # how older versions saved the success window
    cfg = config_from_dict(checkpoint["config"])
    state = TrainState.from_checkpoint(cfg, env_spaces(cfg.env), checkpoint)
    assert list(state.episode_info.windows[SUCCESS]) == [1.0, 0.0, 1.0]
    assert state.episode_info.row()["charts/success_rate"] == pytest.approx(2 / 3)


@pytest.mark.parametrize("sets, words", [
    (["logging.episode_info=[distance_to_goal"], "'[distance_to_goal' is not a valid YAML list"),
    (["logging.episode_info=[is_success]"], "is_success is always read"),
    (["logging.episode_info=[a, a]"], "names a twice"),
])
def test_a_bad_entry_to_log_is_refused_in_one_line(tmp_path, capsys, sets, words):
    """A malformed or impossible setting, before anything starts."""
    assert train_cli([*goal_run(tmp_path), *(item for s in sets for item in ("--set", s))], parallel=False,
                     prog="train_timed.py") == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("train_timed.py: error: logging.episode_info") and words in err, err
    assert not (tmp_path / "run").exists()


def test_an_entry_the_env_gives_as_a_word_stops_the_run_with_its_files_written(tmp_path, capsys):
    """Found when the first episodes end (update 2): the run stops as after an env's error, in one line, its
    checkpoint and summary written."""
    assert train_cli([*goal_run(tmp_path), "--set", "logging.episode_info=[label]"], parallel=False,
                     prog="train_timed.py") == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("train_timed.py: error: label in the final info of "
                                                    "toy_envs:GoalReach-v0's episodes is '") and "not a number" in err
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["stop_reason"] == "error" and summary["updates"] == 1
    assert (tmp_path / "run" / "checkpoint.pt").is_file()


def goal_run(tmp_path: Path) -> list[str]:
    """A sequential run of 4 GoalReach envs, 16 steps an update, whose episodes end in its second update."""
    return ["--config", MUJOCO, "--env", GOAL, "--num-envs", "4", "--set", "training.n_steps=16", "--batch-size",
            "32", "--total-steps", "192", "--set", "run.limit_seconds=0", "--set", "logging.progress=off",
            "--output-dir", str(tmp_path / "run")]
