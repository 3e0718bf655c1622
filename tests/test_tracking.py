"""Logs for batch jobs (plain progress lines when stdout is not a terminal) and W&B tracking in offline mode: the
run's own W&B files, a resumed run continuing the same W&B run, no run id kept for a disabled one, videos in
TensorBoard (beside a run still training) and W&B, and the one-line refusals when wandb or tensorboard is not
installed."""

from __future__ import annotations

import logging
import re
import sys
from itertools import count
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

import parallel_ppo as ppo
from parallel_ppo.cli.flags import with_flags
from parallel_ppo.cli.train import make_parser, request_of
from parallel_ppo.cli.train import run as train_cli
from parallel_ppo.core.configure import build_config
from parallel_ppo.errors import ConfigError
from parallel_ppo.runs import progress
from parallel_ppo.runs.progress import LOGGER, ProgressLines, make_progress

ROOT = Path(__file__).resolve().parents[1]
CARTPOLE = str(ROOT / "config" / "cartpole.yaml")
LINE = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d train_timed\.py: update \d+ \| [\d,]+(/[\d,]+)? steps \| \d+ SPS \| "
                  r"return (-|-?[\d.]+) \| \d+:\d\d:\d\d elapsed, \d+:\d\d:\d\d left")


def _row(update: int) -> dict:
    return {"update": update, "env_steps": 256 * update, "wall_time": 0.5 * update, "sps": 512.0,
            "episodic_return_mean": float("nan") if update == 1 else 21.5}


@pytest.mark.slow  # trains in-process: 10 short updates
def test_a_batch_jobs_log_gets_a_plain_progress_line_every_interval(tmp_path, monkeypatch, capsys):
    """A trainer whose stdout is not a terminal (a file under nohup or Slurm; captured here) at a 4 s interval (the
    setting reaches the trainer): a line for the first update and then one per interval, not one per update, each on
    its own line, without carriage returns or padding. The lines' clock moves 1.5 s an update however busy the
    machine: of 10 updates, 1, 4, 7 and 10 are logged."""
    monkeypatch.syspath_prepend(str(ROOT / "tests"))  # toy_envs
    ticks = count(1.5, 1.5)
    monkeypatch.setattr(progress, "time", SimpleNamespace(monotonic=lambda: next(ticks)))  # read once an update
    status = train_cli(["--config", CARTPOLE, "--env", "toy_envs:Reach-v0", "--num-envs", "1",
                        "--set", "training.n_steps=64", "--batch-size", "64", "--set", "training.n_epochs=1",
                        "--total-steps", "640", "--set", "logging.progress_seconds=4", "--set", "run.limit_seconds=0",
                        "--set", "logging.tensorboard=false", "--output-dir", str(tmp_path / "run")],
                       parallel=False, prog="train_timed.py")
    text = capsys.readouterr().out
    assert status == 0, text
    assert "\r" not in text
    lines = [line for line in text.splitlines() if " update " in line]
    assert all(LINE.fullmatch(line) for line in lines), lines
    assert [int(re.search(r" update (\d+) ", line)[1]) for line in lines] == [1, 4, 7, 10], text


def test_progress_lines_keep_their_interval_and_on_prints_them_without_a_logging_setup(capsys, caplog):
    """A line for the first update, then none until the interval has passed; `auto` leaves the lines to the caller's
    logging setup, `on` prints them itself where nothing handles them, and puts the logger back afterwards."""
    with caplog.at_level(logging.INFO, logger=LOGGER.name):
        lines = ProgressLines(3600, 0, interval=3600)
        for update in (1, 2, 3):
            lines.update(_row(update))
        lines.close()
    assert [r.getMessage() for r in caplog.records] == [
        "update 1 | 256 steps | 512 SPS | no episode finished yet | 0:00:00 elapsed, 0:59:59 left"]
    assert make_progress("off", "sequential", 3600, 0, 30) is None
    saved = LOGGER.level, LOGGER.propagate, list(LOGGER.handlers)
    shown = make_progress("on", "sequential", 3600, 1024, 0)  # stdout is captured: not a terminal
    assert isinstance(shown, ProgressLines)
    shown.update(_row(2))
    shown.close()
    out = capsys.readouterr().out
    assert re.fullmatch(r"\S+ \S+ update 2 \| 512/1,024 steps \| 512 SPS \| return 21\.50 \| 0:00:01 elapsed, "
                        r"0:00:01 left\n", out), out
    assert (LOGGER.level, LOGGER.propagate, list(LOGGER.handlers)) == saved


def test_tracking_flags_and_keys():
    """--track and --wandb-* set the `tracking` section; tags take a comma-separated string or a list."""
    args = make_parser("train_timed.py", parallel=False).parse_args(
        ["--track", "--wandb-project", "p", "--wandb-entity", "me", "--wandb-group", "g", "--wandb-tags", "a, b,"])
    request = request_of(args, parallel=False)
    t = build_config(None, request.flags, [], parallel=False).tracking
    assert (t.wandb, t.project, t.entity, t.group, t.tags) == (True, "p", "me", "g", ["a", "b"])
    assert build_config(None, {}, ["tracking.tags=[x, y]"], parallel=False).tracking.tags == ["x", "y"]
    assert build_config(None, {}, [], parallel=False).tracking.wandb is False
    with pytest.raises(ConfigError, match="tracking.tags"):
        build_config(None, {}, ["tracking.tags={a: 1}"], parallel=False)
    with pytest.raises(ConfigError, match="logging.progress_seconds"):
        build_config(None, {}, ["logging.progress_seconds=0"], parallel=False)


def test_track_without_wandb_installed_is_one_line_and_exit_2(tmp_path, monkeypatch, capsys):
    """No wandb: one line naming the install, exit status 2, and no run directory."""
    monkeypatch.setitem(sys.modules, "wandb", None)  # `import wandb` now raises ImportError
    out = tmp_path / "run"
    status = train_cli(["--config", CARTPOLE, "--output-dir", str(out), "--track"], parallel=False,
                       prog="train_timed.py")
    err = capsys.readouterr().err
    assert status == 2
    assert err.count("\n") == 1 and "pip install 'parallel_ppo[wandb]'" in err, err
    assert not out.exists()


def test_a_list_in_brackets_that_yaml_cannot_read_is_refused_not_split(capsys):
    """`[a,b` is a list with its bracket missing, not the tags '[a' and 'b': one line and exit status 2, as
    logging.episode_info's; a flag's list in brackets is read as YAML."""
    status = train_cli(["--config", CARTPOLE, "--set", "tracking.tags=[a,b", "--print-config"], parallel=False,
                       prog="train_timed.py")
    assert status == 2
    assert capsys.readouterr().err == ("train_timed.py: error: tracking.tags (--wandb-tags): '[a,b' is not a valid "
                                       "YAML list; give one as [a, b] or a,b\n")
    flags = {"tracking.wandb": True, "tracking.tags": "[a, b]"}
    assert build_config(None, flags, [], parallel=False).tracking.tags == ["a", "b"]


def without_tensorboard(monkeypatch: pytest.MonkeyPatch) -> None:
    """`import tensorboard` and of its modules (those imported already too) raise ImportError, as where it is not
    installed."""
    for name in ["tensorboard", *(name for name in sys.modules if name.startswith("tensorboard."))]:
        monkeypatch.setitem(sys.modules, name, None)


SMALL = ["--config", CARTPOLE, "--total-steps", "1024", "--num-envs", "4", "--set", "training.n_steps=128",
         "--batch-size", "128"]


def test_training_without_tensorboard_installed_is_one_line_and_exit_2(tmp_path, monkeypatch, capsys):
    """No tensorboard while logging.tensorboard is on (the default): one line naming the fix and exit status 2
    before anything is written, not an ImportError once training starts with config.yaml and metrics.csv written."""
    without_tensorboard(monkeypatch)
    out = tmp_path / "run"
    status = train_cli([*SMALL, "--output-dir", str(out)], parallel=False, prog="train_timed.py")
    assert status == 2
    assert capsys.readouterr().err == ("train_timed.py: error: logging.tensorboard needs the tensorboard package, "
                                       "which is not installed: pip install tensorboard, or set "
                                       "logging.tensorboard=false\n")
    assert not out.exists()
    assert train_cli([*SMALL, "--set", "logging.tensorboard=false", "--print-config"], parallel=False,
                     prog="train_timed.py") == 0


def test_a_run_tracked_with_wandb_disabled_keeps_no_run_id(tmp_path, monkeypatch):
    """WANDB_MODE=disabled: W&B keeps nothing, so no id is recorded for a resume or an eval video to open (it was
    recorded as an online run's)."""
    wandb = pytest.importorskip("wandb")
    from parallel_ppo.runs.tracking import start_tracking, stored_run_id

    monkeypatch.setenv("WANDB_MODE", "disabled")
    cfg = build_config(CARTPOLE, {"tracking.wandb": True}, [], parallel=False)
    try:
        tracker = start_tracking(cfg, tmp_path / "run", "sequential", resumed=False)
        assert tracker is not None
        tracker.finish({})
    finally:
        wandb.teardown()
    assert stored_run_id(tmp_path / "run") is None


def test_a_published_video_leaves_a_live_tensorboard_reading_the_runs_scalars(tmp_path):
    """`eval --video` or `demo` of a run still training: the video's events go to logs/videos, a TensorBoard run of
    their own. In logs/, TensorBoard stopped reading the training's event file once the video's, a later one, was
    there ("File ... updated even though the current file is ...")."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from torch.utils.tensorboard import SummaryWriter

    from parallel_ppo.core.config import Config
    from parallel_ppo.runs.tracking import publish_video

    run_dir = tmp_path / "run"
    training = SummaryWriter(str(run_dir / "logs"))
    shown = EventAccumulator(str(run_dir / "logs"))  # what TensorBoard shows of the run, read again as it trains
    frames = [np.full((8, 8, 3), 40 * i, dtype=np.uint8) for i in range(3)]
    for step in (1, 2, 3):
        training.add_scalar("charts/SPS", float(step), step)
        training.flush()
        shown.Reload()
        if step == 1:
            said = publish_video(Config(), run_dir, "videos/demo", frames, 4, 1, tmp_path / "clip.gif")
    training.close()
    assert [scalar.step for scalar in shown.Scalars("charts/SPS")] == [1, 2, 3]
    assert said == [f"added the video to TensorBoard as videos/demo ({run_dir / 'logs' / 'videos'})"]
    videos = EventAccumulator(str(run_dir / "logs" / "videos"))
    videos.Reload()
    assert [image.step for image in videos.Images("videos/demo")] == [1]


def test_a_video_without_tensorboard_installed_is_a_warning_and_still_goes_to_wandb(tmp_path, monkeypatch):
    """`eval --video` or `demo` where tensorboard cannot be imported: a warning line for TensorBoard, then the video
    is logged to the run's W&B run as ever (wandb stood in for here), not an ImportError."""
    from parallel_ppo.core.config import Config
    from parallel_ppo.runs import tracking

    run_dir = tmp_path / "run"
    (run_dir / "logs").mkdir(parents=True)
    (run_dir / "wandb").mkdir()
    (run_dir / "wandb" / "run_id").write_text("abc123 offline\n")
    logged: list[dict] = []
    run = SimpleNamespace(log=logged.append, finish=lambda: logged.append({"finished": True}))
    monkeypatch.setattr(tracking, "import_wandb", lambda: SimpleNamespace(Video=lambda path: f"video of {path}"))
    monkeypatch.setattr(tracking, "_init", lambda *args, **kwargs: run)
    without_tensorboard(monkeypatch)
    frames = [np.zeros((8, 8, 3), dtype=np.uint8)] * 2
    said = tracking.publish_video(Config(), run_dir, "videos/demo", frames, 4, 7, tmp_path / "clip.gif")
    assert len(said) == 2 and said[0].startswith("warning: the video is not in TensorBoard: "), said
    assert said[1] == "logged the video to W&B run abc123 as videos/demo"
    assert logged == [{"videos/demo": f"video of {tmp_path / 'clip.gif'}", "global_step": 7}, {"finished": True}]


@pytest.mark.parametrize("mode, tags, words", [
    ("bogus", [], "W&B setting WANDB_MODE = 'bogus': Input should be 'online', 'offline'"),
    ("offline", ["x" * 70], "W&B setting tracking.tags = ('xxxx"),
])
def test_a_bad_wandb_setting_is_named_with_its_value(tmp_path, monkeypatch, mode, tags, words):
    """wandb says only "1 validation error for Settings" in its first line: the setting and its value are named
    instead, without a login hint (not the cause; offline nothing logs in)."""
    import wandb

    from parallel_ppo.errors import TrackingError
    from parallel_ppo.runs.tracking import start_tracking

    monkeypatch.setenv("WANDB_MODE", mode)
    cfg = build_config(CARTPOLE, {"tracking.wandb": True, "tracking.tags": tags}, [], parallel=False)
    try:
        with pytest.raises(TrackingError) as error:
            start_tracking(cfg, tmp_path / "run", "sequential", resumed=False)
    finally:
        wandb.teardown()  # wandb keeps the settings it was set up with for the process: the next test sets its own
    message = str(error.value)
    assert words in message and "wandb login" not in message and "\n" not in message, message
    if tags:  # the trainers' error line names the flag too
        assert "W&B setting tracking.tags (--wandb-tags) = ('xxxx" in with_flags(message)


def test_a_wandb_run_that_cannot_start_puts_back_the_run_it_was_to_replace(tmp_path, monkeypatch):
    """--overwrite with W&B that cannot start: the refusal leaves the earlier run's files as they were, nothing of
    the new run's and no set-aside folder; files that are no run's stay."""
    import wandb

    from parallel_ppo.errors import TrackingError
    from parallel_ppo.runs.directory import EARLIER_RUN

    run_dir = tmp_path / "run"
    (run_dir / "logs").mkdir(parents=True)
    earlier = {"config.yaml": "earlier", "metrics.csv": "update\n1\n", "checkpoint.pt": "weights",
               "logs/events": "events", "notes.txt": "mine"}
    for name, text in earlier.items():
        (run_dir / name).write_text(text)
    monkeypatch.setenv("WANDB_MODE", "bogus")
    try:
        with pytest.raises(TrackingError, match="WANDB_MODE = 'bogus'"):
            ppo.train(CARTPOLE, output_dir=run_dir, overwrite=True, verbose=False,
                      overrides={"tracking.wandb": True, "run.total_steps": 256, "logging.tensorboard": False})
    finally:
        wandb.teardown()
    found = {str(p.relative_to(run_dir)): p.read_text() for p in run_dir.rglob("*") if p.is_file()}
    assert found == earlier and not (run_dir / EARLIER_RUN).exists()


def _offline_runs(run_dir: Path, run_id: str) -> list[Path]:
    """W&B's offline directories of run `run_id` (a second one started within the same second ends in `-1`)."""
    return sorted((run_dir / "wandb").glob(f"offline-run-*-{run_id}*"))


@pytest.mark.slow
def test_offline_tracking_keeps_the_run_in_its_directory_and_resume_continues_it(tmp_path, monkeypatch):
    """WANDB_MODE=offline: the W&B run lives in RUN_DIR/wandb with the config, every update's metrics under their
    TensorBoard tags and the summary; a resumed run logs to the same W&B run id; a video goes to TensorBoard and W&B,
    offline as the run was."""
    wandb = pytest.importorskip("wandb")
    for name, value in {"WANDB_MODE": "offline", "WANDB_ERROR_REPORTING": "false", "WANDB_SILENT": "true",
                        "WANDB_CONFIG_DIR": str(tmp_path / "config"), "WANDB_CACHE_DIR": str(tmp_path / "cache"),
                        "WANDB_DATA_DIR": str(tmp_path / "data")}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("WANDB_DIR", raising=False)
    run_dir = tmp_path / "run"
    overrides = {"tracking.wandb": True, "tracking.tags": ["test"], "run.total_steps": 512, "run.limit_seconds": 0}
    try:
        ppo.train(CARTPOLE, output_dir=run_dir, overrides=overrides, verbose=False)
        wandb.teardown()  # W&B's service may still be writing the finished run's file; a new process would wait too
        run_id, mode = (run_dir / "wandb" / "run_id").read_text().split()
        assert mode == "offline"
        [first] = _offline_runs(run_dir, run_id)
        records = (first / f"run-{run_id}.wandb").read_bytes()
        for key in (b"charts/SPS", b"losses/approx_kl", b"time/update", b"global_step", b"n_steps",
                    b"stop_reason", b"CartPole-v1"):
            assert key in records, key

        resumed = ppo.train(resume=run_dir, overrides={"run.total_steps": 1024}, verbose=False)
        assert (run_dir / "wandb" / "run_id").read_text().split() == [run_id, "offline"]
        assert len(_offline_runs(run_dir, run_id)) == 2, "the resumed run continues the same W&B run"

        from parallel_ppo.runs.tracking import publish_video
        from parallel_ppo.runs.video import write_video

        frames = [np.full((64, 64, 3), 40 * i, dtype=np.uint8) for i in range(4)]
        write_video(tmp_path / "clip.gif", frames, 4)
        monkeypatch.delenv("WANDB_MODE")  # `eval --video` later, without it: the run was offline, so is its video
        said = publish_video(resumed.config, run_dir, "videos/demo", frames, 4, 1024, tmp_path / "clip.gif")
    finally:
        wandb.teardown()
    assert [line.split(" as ")[0] for line in said] == ["added the video to TensorBoard",
                                                        f"logged the video to W&B run {run_id}"]
    assert [gif for run in _offline_runs(run_dir, run_id) for gif in run.glob("files/media/videos/**/*.gif")]
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run_dir / "logs" / "videos"))
    events.Reload()
    [image] = events.Images("videos/demo")
    assert image.step == 1024 and image.encoded_image_string.startswith(b"GIF89a")
