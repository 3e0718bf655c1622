"""Experiment tracking in Weights & Biases, optional (`tracking.wandb`, `--track`; `pip install
'parallel_ppo[wandb]'`): the resolved config, each update's metrics under their TensorBoard tags against
`global_step` (env steps), the summary, and the videos of `eval --video` and `demo`, which also go to the run's
TensorBoard events in <run>/logs/videos (those of evaluations during training, `eval.video`, go to TensorBoard only).

W&B keeps its files in the run directory (<run>/wandb, unless `WANDB_DIR` says otherwise), and the id of the W&B
run in <run>/wandb/run_id (none for `WANDB_MODE=disabled`), so that `--resume` continues the same W&B run online.
`WANDB_MODE=offline` writes everything there with no network (and turns off wandb's own error reports unless
`WANDB_ERROR_REPORTING` is set): each session in an offline-run-* folder of its own under the same id, whose history
starts again at step 0 (what `wandb sync` makes of them is W&B's)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

from parallel_ppo.core.config import Config
from parallel_ppo.core.configure import check_wandb
from parallel_ppo.core.files import write_text
from parallel_ppo.errors import ConfigError, TrackingError
from parallel_ppo.runs.video import add_tensorboard_video

RUN_ID_FILE = Path("wandb") / "run_id"
"""Where a run directory keeps the id of its W&B run."""
VIDEO_LOGS = Path("logs") / "videos"
"""Where a run directory's TensorBoard events of `eval --video` and `demo` videos go: a directory of their own, as the
videos of evaluations during training have (`runs.training.EvalHook.video_dir`), so that a live TensorBoard goes on
reading the training's scalars in logs/."""


def import_wandb() -> ModuleType:
    """The wandb module, or a ConfigError that names how to install it."""
    check_wandb()
    import wandb

    return wandb


def stored_run_id(run_dir: Path) -> str | None:
    """The id of the W&B run that tracks the run in `run_dir`, if it was tracked."""
    try:
        words = (run_dir / RUN_ID_FILE).read_text().split()
    except OSError:
        return None
    return words[0] if words else None


def tracked_offline(run_dir: Path) -> bool:
    """Whether the W&B run of `run_dir` was tracked offline (the id file's second word): what is added to it later
    (an eval video) stays offline too, whatever WANDB_MODE says then."""
    try:
        return (run_dir / RUN_ID_FILE).read_text().split()[1:2] == ["offline"]
    except OSError:
        return False


def _init(cfg: Config, run_dir: Path, run_id: str | None, quiet: bool = False, **extra: Any) -> Any:
    """wandb.init for the run in `run_dir` (continuing W&B run `run_id` if given), its steps on `global_step`;
    `quiet`: without wandb's console lines."""
    wandb = import_wandb()
    offline = extra.get("mode") == "offline" or os.environ.get("WANDB_MODE", "").lower() in ("offline", "dryrun")
    if offline:
        os.environ.setdefault("WANDB_ERROR_REPORTING", "false")  # offline means no network, crash reports included
    (run_dir / RUN_ID_FILE).parent.mkdir(parents=True, exist_ok=True)
    t = cfg.tracking
    try:
        run = wandb.init(project=t.project or None, entity=t.entity or None, group=t.group or None,
                         tags=t.tags or None, name=run_dir.name, id=run_id, resume="allow" if run_id else None,
                         dir=None if os.environ.get("WANDB_DIR") else str(run_dir),
                         settings=wandb.Settings(quiet=True) if quiet else None, **extra)
    except Exception as e:  # no login, no network, a refused project: whatever wandb raises, one line
        raise ConfigError(f"cannot start W&B tracking: {_reason(e, offline)}") from None
    run.define_metric("global_step")
    run.define_metric("*", step_metric="global_step")
    return run


SETTINGS = {"project": "tracking.project", "entity": "tracking.entity", "run_group": "tracking.group",
            "run_tags": "tracking.tags", "mode": "WANDB_MODE"}
"""W&B settings that ours set, by wandb's name: what a message names for the user to fix (the command lines add
the flags)."""


def _reason(error: Exception, offline: bool) -> str:
    """Why wandb.init failed, in one line: a bad setting named with its value, else wandb's first line and, unless
    `offline`, how to log in or track without network."""
    details = error.errors() if callable(getattr(error, "errors", None)) else []  # pydantic's, of wandb.Settings
    if details:
        name = ".".join(str(part) for part in details[0].get("loc", ())) or "?"
        value = repr(details[0].get("input"))
        value = value if len(value) <= 80 else value[:77] + "..."
        why = str(details[0].get("msg", "")).removeprefix("Value error, ")
        return f"W&B setting {SETTINGS.get(name, name)} = {value}: {why}"
    text = str(error).strip()
    if len(text) > 1 and text[0] == text[-1] and text[0] in "'\"":  # some of wandb's errors come quoted
        text = text[1:-1].strip()
    line = text.splitlines()[0] if text else type(error).__name__
    if offline:
        return line
    return f"{line} (log in with `wandb login`, or set WANDB_MODE=offline to track without network)"


class WandbTracker:
    """The W&B run of a training run (rank 0's): `log` each update's row, `finish` with the summary."""

    def __init__(self, run: Any) -> None:
        self.run = run

    @classmethod
    def start(cls, cfg: Config, run_dir: Path, mode: str, resumed: bool) -> WandbTracker:
        """Start a W&B run for `run_dir` (a resumed run continues the W&B run it had) and record the config."""
        run = _init(cfg, run_dir, stored_run_id(run_dir) if resumed else None, job_type=mode)
        run.config.update(cfg.to_dict(), allow_val_change=True)
        if not run.disabled:  # WANDB_MODE=disabled: a run that keeps nothing, for no resume or video to open
            write_text(run_dir / RUN_ID_FILE, f"{run.id} {'offline' if run.offline else 'online'}\n")
        return cls(run)

    def log(self, tags: dict[str, float], step: int) -> None:
        """An update's metrics under their tags, with the env steps as `global_step`."""
        self.run.log({**tags, "global_step": step})

    def finish(self, summary: dict[str, Any]) -> None:
        """Record summary.json's values and close the W&B run, marked failed when the run ended on an error or a
        signal (`summary` then may hold only `stop_reason`)."""
        if "updates" in summary:
            self.run.summary.update({k: v for k, v in summary.items() if v is not None})
        self.run.finish(exit_code=1 if summary.get("stop_reason") in ("error", "signal") else 0)


def start_tracking(cfg: Config, run_dir: Path, mode: str, resumed: bool,
                   distributed: bool = False) -> WandbTracker | None:
    """The run's tracker (None when `tracking.wandb` is off). A W&B run that cannot start raises TrackingError (a new
    run's directory is then put back as it was: `runs.directory.new_run_dir`)."""
    if not cfg.tracking.wandb:
        return None
    try:
        return WandbTracker.start(cfg, run_dir, "distributed" if distributed else mode, resumed)
    except ConfigError as e:
        raise TrackingError(str(e)) from None


def publish_video(cfg: Config, run_dir: Path, tag: str, frames: Sequence[np.ndarray], fps: int, step: int,
                  video: Path) -> list[str]:
    """Add an eval or demo video (written to `video`) of the run in `run_dir` to its TensorBoard events (when it
    has them; in `VIDEO_LOGS`) and to its W&B run (when it was tracked), at env step `step`; returns what was done,
    one line each (lines starting `warning:` for what could not be)."""
    said = []
    if cfg.logging.tensorboard and (run_dir / "logs").is_dir():
        try:
            add_tensorboard_video(run_dir / VIDEO_LOGS, tag, frames, fps, step)
            said.append(f"added the video to TensorBoard as {tag} ({run_dir / VIDEO_LOGS})")
        except (OSError, ImportError) as e:  # a full disk; tensorboard not installed
            said.append(f"warning: the video is not in TensorBoard: {e}")
    run_id = stored_run_id(run_dir)
    if run_id is not None:
        try:
            wandb = import_wandb()
            run = _init(cfg, run_dir, run_id, quiet=True, **({"mode": "offline"} if tracked_offline(run_dir) else {}))
        except ConfigError as e:
            return [*said, f"warning: not logged to W&B: {e}"]
        run.log({tag: wandb.Video(str(video)), "global_step": step})
        run.finish()
        said.append(f"logged the video to W&B run {run_id} as {tag}")
    return said
