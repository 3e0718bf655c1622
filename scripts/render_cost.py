"""What a MuJoCo pixel env costs a step on this CPU: physics alone, and physics + an 84×84 frame with the default
renderer and with `env.fast_render`, each in its own process, interleaved over rounds. A gymnasium MuJoCo env
renders its scene; a robosuite task (`--env robosuite/Lift`) renders the camera `--camera`, with `fast_render` also
as it drew before it handed the renderer only the geoms in view (`envs.culling`); Genesis's
`genesis/FrankaLift` (the extra `genesis`) its wrist camera, with Genesis's one renderer (no fast settings), and the
seconds each process took to build its scene are kept too.

    .venv/bin/python scripts/render_cost.py [--env HalfCheetah-v5] [--steps 200] [--rounds 3] [--output FILE]
    .venv/bin/python scripts/render_cost.py --env robosuite/Lift --camera robot0_eye_in_hand --output FILE
    .venv/bin/python scripts/render_cost.py --env genesis/FrankaLift --output FILE

Prints milliseconds per step (the median over rounds) and writes `docs/results/<machine>/render_cost.json`
(`render_cost_<family>.json` for a robosuite or Genesis task), an
evidence file for the docs (machine, date, commit, command, figures and a table). A measurement: nothing else should
run meanwhile.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

SETTINGS = {"physics": "physics alone (no frame)",
            "default": "the default renderer (multisampling, shadows, reflections, skybox)",
            "fast": "`env.fast_render` (the default here): those off"}
ROBOSUITE_SETTINGS = {"physics": SETTINGS["physics"], "default": SETTINGS["default"],
                      "every": "`env.fast_render` before it culled: every geom handed to the renderer",
                      "fast": "`env.fast_render` (the default here): those off, and only the geoms the camera sees"}
GENESIS_SETTINGS = {"physics": "physics and inverse kinematics alone (no frame)",
                    "camera": "with the 84×84 wrist camera's frame"}


def time_setting(env_id: str, setting: str, steps: int, camera: str) -> tuple[float, float, str]:
    """Milliseconds per env step of `setting`, after 20 steps of warm-up, the seconds the env took to build, in
    this process, and the OpenGL platform it rendered with (Genesis may choose its own once loaded)."""
    from parallel_ppo.core.config import EnvConfig
    from parallel_ppo.envs.families import GENESIS, ROBOSUITE, check_family, family_of, options_of
    from parallel_ppo.envs.gym_envs import RenderClock

    family = family_of(env_id)
    if family is ROBOSUITE:
        cfg = EnvConfig(id=env_id, options=[] if setting == "physics" else [f"cameras={camera}"],
                        fast_render=setting in ("fast", "every"))
        if setting == "every":  # what fast_render drew before `envs.culling`: this process only
            import contextlib

            from parallel_ppo.envs import robot_envs

            robot_envs.only_in_view = lambda *args: contextlib.nullcontext()
    elif family is GENESIS:
        cfg = EnvConfig(id=env_id, options=[f"wrist_camera={setting == 'camera'}", "object_state=true"])
    else:
        cfg = EnvConfig(id=env_id, pixels=setting != "physics", fast_render=setting == "fast")
    check_family(cfg)
    built = time.perf_counter()
    env = family.maker()(cfg, options_of(cfg, family), False, RenderClock(), 0)
    built = time.perf_counter() - built
    env.reset(seed=0)
    for i in range(steps + 20):
        if i == 20:
            start = time.perf_counter()
        _, _, terminated, truncated, _ = env.step(env.action_space.sample())
        if terminated or truncated:
            env.reset()
    seconds = time.perf_counter() - start
    env.close()
    platform = os.environ.get("PYOPENGL_PLATFORM" if family is GENESIS else "MUJOCO_GL", "unset")
    return 1000 * seconds / steps, built, platform


def positive(text: str) -> int:
    """argparse type: a whole number above 0."""
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number above 0")
    return int(text)


def parse_args() -> argparse.Namespace:
    from parallel_ppo.cli.common import OneLineParser, some_path

    parser = OneLineParser(prog="render_cost.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--env", default="HalfCheetah-v5")
    parser.add_argument("--steps", type=positive, default=200)
    parser.add_argument("--rounds", type=positive, default=3)
    parser.add_argument("--output", type=some_path)
    parser.add_argument("--camera", default="robot0_eye_in_hand", help="the camera of a robosuite task")
    parser.add_argument("--one", help=argparse.SUPPRESS)  # a child process: time one setting, print ms
    return parser.parse_args()


def prepare(args: argparse.Namespace) -> tuple[Any, dict[str, str], Path]:
    """The env's family, the settings timed and the evidence file: checked before any is timed (ConfigError)."""
    from parallel_ppo.bench.study import machine_results_dir
    from parallel_ppo.envs.families import GENESIS, MUJOCO, ROBOSUITE, family_of
    from parallel_ppo.errors import ConfigError
    from parallel_ppo.runs.directory import check_output_file

    family = family_of(args.env)
    if family not in (MUJOCO, ROBOSUITE, GENESIS):
        raise ConfigError(f"{args.env} is a {family.name} env; this times the renderers of MuJoCo, robosuite and "
                          "Genesis")
    settings = GENESIS_SETTINGS if family is GENESIS else ROBOSUITE_SETTINGS if family is ROBOSUITE else SETTINGS
    name = "render_cost.json" if family is MUJOCO else f"render_cost_{family.name}.json"
    output = Path(args.output) if args.output else machine_results_dir(ROOT / "docs" / "results") / name
    check_output_file(output, f"the evidence file {output}")
    return family, settings, output


def time_rounds(args: argparse.Namespace,
                settings: dict[str, str]) -> tuple[dict[str, list[float]], list[float], set[str]]:
    """Each setting's milliseconds a step in each round, each in a process of its own, interleaved; the seconds
    each process took to build its env and the OpenGL platforms they rendered with. ParallelPPOError with a
    child's last line where one failed."""
    from parallel_ppo.cli.common import last_line
    from parallel_ppo.errors import ParallelPPOError

    times: dict[str, list[float]] = {s: [] for s in settings}
    builds: list[float] = []
    platforms: set[str] = set()
    for r in range(args.rounds):
        for setting in list(settings)[:: 1 if r % 2 == 0 else -1]:
            child = subprocess.run([sys.executable, __file__, "--one", setting, "--env", args.env, "--steps",
                                    str(args.steps), "--camera", args.camera], capture_output=True, text=True)
            if child.returncode != 0:  # a camera the task lacks, a missing extra, ...: the child's last line
                raise ParallelPPOError(f"{setting}: {last_line(child.stderr, child.returncode)}")
            *timing, platform = child.stdout.split()[-3:]
            ms, built = map(float, timing)
            times[setting].append(ms)
            builds.append(built)
            if setting != "physics":
                platforms.add(platform)
            print(f"round {r + 1}: {setting}: {ms:.2f} ms a step (built in {built:.1f} s)", flush=True)
    return times, builds, platforms


def main() -> int:
    args = parse_args()
    if args.one:
        print(*time_setting(args.env, args.one, args.steps, args.camera))
        return 0
    from parallel_ppo.bench.study import available_cores
    from parallel_ppo.cli.common import interrupted, stop_on_sigterm, write_result

    stop_on_sigterm()
    from parallel_ppo.core.files import write_text
    from parallel_ppo.envs.families import GENESIS, ROBOSUITE
    from parallel_ppo.errors import ParallelPPOError
    from parallel_ppo.runs import fingerprint

    try:
        family, settings, output = prepare(args)
        times, builds, platforms = time_rounds(args, settings)
    except ParallelPPOError as e:
        print(f"render_cost.py: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return interrupted("render_cost.py", "nothing was written")
    median = {s: round(statistics.median(t), 2) for s, t in times.items()}
    ratio = {"camera_over_physics": round(median["camera"] / median["physics"], 1)} if family is GENESIS else \
        {"default_over_fast": round(median["default"] / median["fast"], 1)}
    if family is ROBOSUITE:
        ratio["every_over_fast"] = round(median["every"] / median["fast"], 2)
    evidence = {
        "machine": f"{fingerprint.describe_cpu()}, {available_cores()} cores; " + (
            f"Genesis over PYOPENGL_PLATFORM={'/'.join(sorted(platforms))}" if family is GENESIS
            else f"MUJOCO_GL={'/'.join(sorted(platforms))}"),
        "cpu_kind": fingerprint.cpu_kind(),
        "date": datetime.date.today().isoformat(), "commit": fingerprint.source_commit() or "unknown",
        "command": "scripts/render_cost.py " + " ".join(sys.argv[1:]),
        "figures": {**{f"{s}_ms": m for s, m in median.items()}, **ratio,
                    "build_s": [round(min(builds), 1), round(max(builds), 1)]},
        "tables": {"cost": {"columns": ["setting", "ms a step (median)", "rounds"],
                            "rows": [[settings[s], median[s], ", ".join(f"{t:.2f}" for t in times[s])]
                                     for s in settings]}},
    }
    if write_result("render_cost.py", output, lambda path: write_text(path, json.dumps(evidence, indent=1) + "\n")):
        return 1
    print(f"{args.env}, {args.steps} steps: " + ", ".join(f"{s} {m} ms" for s, m in median.items()) + f"; {output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
