"""`python -m parallel_ppo eval` (a checkpoint's return on training or test levels, eval.json, an optional
video) and `python -m parallel_ppo demo` (a video of the agent playing: the env's render, what the policy sees, or
both side by side, `--views`)."""

from __future__ import annotations

import argparse
import json
import math
import shlex
import sys
from pathlib import Path
from typing import Any

from parallel_ppo.cli.common import (
    OneLineParser,
    duration_in,
    fail,
    interrupted,
    positive_int,
    positive_up_to,
    seed_number,
    some_path,
)
from parallel_ppo.core.config import Config
from parallel_ppo.core.files import writing
from parallel_ppo.errors import ConfigError, ParallelPPOError, RunDataError, WriteFailed

DEFAULT_FPS = 15
MAX_DEMO_SECONDS = 3600.0
MAX_FPS = 120


def _common(p: OneLineParser) -> None:
    p.add_argument("--checkpoint", required=True, type=some_path, metavar="RUN_DIR_OR_FILE",
                   help="a run directory (its checkpoint.pt) or a checkpoint file")
    p.add_argument("--levels", choices=("auto", "train", "test"), default="auto",
                   help="the run's own levels, or levels it never saw; default auto: test where the run has "
                        "levels to hold out (Procgen), else train")
    p.add_argument("--deterministic", action="store_true", help="take the most likely action instead of sampling")
    p.add_argument("--seed", type=seed_number, default=0, metavar="N", help="seed of the eval envs and actions (0)")


def view_names(text: str) -> list[str]:
    """argparse type: the views of a video, comma-separated."""
    names = [name.strip() for name in text.split(",") if name.strip()]
    if not names:
        raise argparse.ArgumentTypeError(f"name one view or more (env, agent, an image key), got {text!r}")
    return names


def _views(p: OneLineParser, video: str) -> None:
    p.add_argument("--views", type=view_names, metavar="LIST", help=f"what {video} shows of env 0, side by side, left "
                   "to right, comma-separated: env (its own render, the default), agent (every image the policy "
                   "observes, as it receives it: resized and stacked, the newest frame of a stack; upscaled to the "
                   "render's height), or one image key of a dict observation (robot0_eye_in_hand_image)")


def eval_parser(prog: str) -> OneLineParser:
    p = OneLineParser(prog=prog, description="Play a trained policy for complete episodes on its training or test "
                      "levels; print the returns and record them in RUN_DIR/eval.json.")
    _common(p)
    p.add_argument("--episodes", type=positive_up_to("eval.episodes"), default=20, metavar="N",
                   help="complete episodes (default 20)")
    p.add_argument("--num-envs", type=positive_up_to("eval.num_envs"), default=8, metavar="N",
                   help="envs played at once (default 8)")
    p.add_argument("--video", type=some_path, metavar="FILE.mp4|FILE.gif",
                   help="also write env 0's episodes as a video")
    _views(p, "--video")
    return p


def demo_seconds(text: str) -> float:
    """argparse type: a video length, a positive number of seconds up to an hour."""
    seconds = duration_in("s")(text)
    if seconds > MAX_DEMO_SECONDS:
        raise argparse.ArgumentTypeError(f"a demo is at most {MAX_DEMO_SECONDS:.0f} s, got {text!r}")
    return seconds


def demo_fps(text: str) -> int:
    """argparse type: frames per second of a demo, 1 to `MAX_FPS`."""
    fps = positive_int(text)
    if fps > MAX_FPS:
        raise argparse.ArgumentTypeError(f"at most {MAX_FPS} frames/s, got {text!r}")
    return fps


def demo_parser(prog: str) -> OneLineParser:
    p = OneLineParser(prog=prog, description="Write a video of a trained policy playing (no screen needed), its "
                      "episode return drawn on the frames.")
    _common(p)
    p.add_argument("--seconds", type=demo_seconds, default=20.0, metavar="TIME",
                   help=f"video length (default 20; at most {MAX_DEMO_SECONDS:.0f})")
    p.add_argument("--output", type=some_path, metavar="FILE.mp4|FILE.gif", help="default RUN_DIR/demo.mp4")
    p.add_argument("--fps", type=demo_fps, default=DEFAULT_FPS, metavar="N",
                   help=f"frames/s (default {DEFAULT_FPS}; at most {MAX_FPS})")
    _views(p, "the video")
    return p


def earlier_evals(run_dir: Path) -> dict[str, Any]:
    """The evaluations in RUN_DIR/eval.json (none where there is no file); RunDataError for one that cannot be read
    as them, before any episode is played: writing the new one would lose them."""
    path = run_dir / "eval.json"
    if not path.exists():
        return {}
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise RunDataError(f"{path} holds no evaluations that can be read ({type(e).__name__}); move it away") from None
    if not isinstance(data, dict):
        raise RunDataError(f"{path} holds no evaluations (a JSON {type(data).__name__}); move it away")
    return data


def eval_main(argv: list[str] | None = None, prog: str = "python -m parallel_ppo eval") -> int:
    args = eval_parser(prog).parse_args(argv)
    frames: list = []
    try:
        from parallel_ppo.core.evaluate import play_episodes  # torch: a Ctrl-C while it loads is one line too
        from parallel_ppo.core.files import write_json
        from parallel_ppo.core.policy import Policy
        from parallel_ppo.envs.views import ENV_VIEW, Views
        from parallel_ppo.runs.directory import check_writable
        from parallel_ppo.runs.video import captioned, check_video_path, write_video

        if args.views and not args.video:
            raise ConfigError("--views chooses what the video shows; add --video FILE.mp4")
        if args.video:
            check_video_path(Path(args.video))
        policy = Policy.load(args.checkpoint)
        cfg, model, run_dir, checkpoint = policy.cfg, policy.model, policy.run_dir, policy.state
        earlier_evals(run_dir)  # one that cannot be read is refused before playing (they are kept, with this one)
        check_writable(run_dir, f"{run_dir / 'eval.json'}")  # before the episodes, not after them
        views = Views.chosen(args.views or [ENV_VIEW], policy.spaces, cfg.env, "--views", cfg.model.actor_keys)
        result = play_episodes(model, cfg, args.levels, args.episodes, args.num_envs, args.deterministic, args.seed,
                               frames=captioned(frames) if args.video else None, views=views)
    except ParallelPPOError as e:
        return fail(prog, e, 2)
    except KeyboardInterrupt:
        return interrupted(prog, "nothing was written")
    command = " ".join([prog, shlex.join(argv if argv is not None else sys.argv[1:])])
    entry = {**result.stats(), "checkpoint_update": checkpoint["update"],
             "checkpoint_env_steps": checkpoint["env_steps"], "seed": args.seed, "command": command}
    key = f"{result.levels}_{'deterministic' if args.deterministic else 'sampled'}"
    path = run_dir / "eval.json"
    print(format_eval(cfg, entry))  # shown before it is recorded, so a failed write loses no result
    try:  # read again: an evaluation of another kind may have been written while this one played
        with writing(path):
            write_json(path, {**earlier_evals(run_dir), key: entry})
        print(f"wrote {path}", flush=True)
        if args.video:  # after the result is recorded: a video the disk refuses loses no evaluation
            write_video(Path(args.video), frames, DEFAULT_FPS)
            print(f"wrote {args.video} ({len(frames)} frames)", flush=True)
            publish(prog, cfg, run_dir, f"videos/eval_{key}", frames, DEFAULT_FPS, checkpoint["env_steps"],
                    args.video)
    except (ParallelPPOError, WriteFailed) as e:
        return fail(prog, e, 1)
    except KeyboardInterrupt:
        return interrupted(prog, f"the result is shown above{' and in ' + str(path) if path.exists() else ''}")
    return 0


def publish(prog: str, cfg: Config, run_dir: Path, tag: str, frames: list, fps: int, step: int, video: str) -> None:
    """Add a video to the run's TensorBoard events and its W&B run, where it has them; one line for each (a
    warning on stderr for what could not be done)."""
    from parallel_ppo.runs.tracking import publish_video

    for line in publish_video(cfg, run_dir, tag, frames, fps, step, Path(video)):
        print(f"{prog}: {line}", file=sys.stderr if line.startswith("warning:") else sys.stdout, flush=True)


def format_eval(cfg: Config, e: dict[str, Any]) -> str:
    from parallel_ppo.envs.families import family_of

    last = e["start_level"] + e["num_levels"] - 1
    where = f" levels {e['start_level']}..{last}" if family_of(cfg.env.id).levels else ""
    norm = "" if e["normalized_mean"] is None else f", normalized {e['normalized_mean']:.3f}"
    success = "" if e.get("success_rate") is None else f"; success rate {e['success_rate']:.0%}"
    episodes = f"{e['episodes']} episode{'s' if e['episodes'] != 1 else ''}"
    return (f"{cfg.env.id}, {e['levels']}{where}, {episodes}, "
            f"{'deterministic' if e['deterministic'] else 'sampled'} actions, checkpoint at "
            f"{e['checkpoint_env_steps']:,} steps\n"
            f"  return mean {e['mean']:.2f} ± {e['std']:.2f} (median {e['median']:.2f}, min {e['min']:.2f}, max "
            f"{e['max']:.2f}){norm}{success}; mean length {e['mean_length']:.0f} steps; {e['seconds']:.1f} s")


def returns_shown(returns: list[float]) -> str:
    """A demo's episode returns on one line: each of up to 10, else their count, mean and range."""
    if not returns:
        return "none finished"
    if len(returns) <= 10:
        return ", ".join(f"{r:g}" for r in returns)
    return f"{len(returns)} episodes, mean {sum(returns) / len(returns):g} (min {min(returns):g}, max {max(returns):g})"


def demo_main(argv: list[str] | None = None, prog: str = "python -m parallel_ppo demo") -> int:
    args = demo_parser(prog).parse_args(argv)
    frames: list = []
    wanted = math.ceil(args.seconds * args.fps)
    try:
        from parallel_ppo.core.evaluate import play_episodes  # torch: a Ctrl-C while it loads is one line too
        from parallel_ppo.core.policy import Policy
        from parallel_ppo.envs.views import ENV_VIEW, Views
        from parallel_ppo.runs.video import captioned, check_video_path, write_video

        policy = Policy.load(args.checkpoint)
        cfg, model, run_dir, checkpoint = policy.cfg, policy.model, policy.run_dir, policy.state
        output = Path(args.output) if args.output else run_dir / "demo.mp4"
        check_video_path(output)
        views = Views.chosen(args.views or [ENV_VIEW], policy.spaces, cfg.env, "--views", cfg.model.actor_keys)
        result = play_episodes(model, cfg, args.levels, 10**6, 1, args.deterministic, args.seed,
                               frames=captioned(frames), until=lambda: len(frames) >= wanted, views=views)
        write_video(output, frames, args.fps)
    except ParallelPPOError as e:
        return fail(prog, e, 2)
    except WriteFailed as e:
        return fail(prog, e, 1)
    except KeyboardInterrupt:
        return interrupted(prog, f"{output} was not written" if frames else "nothing was written")
    print(f"wrote {output}: {len(frames)} frames at {args.fps} fps of {cfg.env.id} ({result.levels} levels; "
          f"{' | '.join(views.names)}); returns of the episodes it shows: {returns_shown(result.returns)}", flush=True)
    try:
        publish(prog, cfg, run_dir, "videos/demo", frames, args.fps, checkpoint["env_steps"], str(output))
    except KeyboardInterrupt:
        return interrupted(prog, f"{output} is written")
    return 0
