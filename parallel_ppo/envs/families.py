"""Env families in one place: how an env id is recognized, what must be installed for it, which env settings and
options it takes, which shipped config suits it and which function builds its envs. The rest of the trainer asks
`family_of(id)`; a new family is one entry in FAMILIES."""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import io
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from parallel_ppo.envs.config import EnvConfig
from parallel_ppo.envs.procgen_envs import PROCGEN_GAMES, PROCGEN_SPACES, check_procgen, preload_procgen
from parallel_ppo.envs.spaces import EnvSpaces
from parallel_ppo.errors import ConfigError


@dataclass(frozen=True)
class Option:
    """A family's option (`env.options`, or the id's query: `robosuite/Lift?robot=Panda`); a value given is read
    as the default's type."""

    default: str | int | float | bool
    doc: str
    choices: tuple[str, ...] = ()
    camera: bool = False
    """Whether a value that is set (not empty, not off) makes the env draw frames: it needs OpenGL."""


@dataclass(frozen=True)
class Family:
    """One kind of env: everything the trainer needs to know about it."""

    name: str
    config: str
    """The shipped config (in config/) a benchmark uses for it without `--config`."""
    make: str
    """`module:function` that builds its envs: a BatchEnv maker (Procgen) or one gymnasium env's maker, given the
    seed of its first reset too (for an env that draws at random while it is built: robosuite's cube size)."""
    settings: tuple[str, ...] = ()
    """The env settings of FAMILY_SETTINGS it takes."""
    options: dict[str, Option] = field(default_factory=dict)
    extra: str = ""
    """The pip extra that installs it ("" = the base install)."""
    needs: str = ""
    """The module that extra installs."""
    levels: bool = False
    """Whether it has levels to hold out for a test (Procgen's)."""
    native: bool = False
    """Whether `make` builds a whole BatchEnv itself (else one gymnasium env, batched by envs.gym_envs)."""
    spaces: EnvSpaces | None = None
    """Its spaces, where they are known without building an env."""
    frame_stack: int = 1
    """Frames stacked by default (`env.frame_stack` 0) where it observes images."""
    check: Callable[[EnvConfig], None] | None = None
    """Its own checks of the env settings (ConfigError), beyond which settings it takes."""
    preload: Callable[[str], None] | None = None
    """What loads, given the env id, what its envs use that every worker can share (Procgen's game assets, ~350 MB
    per process): the parallel engine calls it once in the process it forks the workers from (`preload`). None:
    nothing to share."""
    sight: tuple[str, ...] = ()
    """Options of which one at least must be on (set, not off): with all of them off, nothing observed shows the
    policy the object of its task (a camera or the object's state)."""
    gl: bool = False
    """Whether its render (a video's frame) draws through OpenGL (MuJoCo's or Genesis's renderer): a failure to draw
    it names the renderer a machine needs (`RENDERER_HELP`)."""

    def maker(self) -> Any:
        """The function `make` names."""
        module, _, name = self.make.partition(":")
        return getattr(importlib.import_module(module), name)


RENDERER_HELP = ("rendering needs OpenGL on the CPU: Mesa's EGL (Debian/Ubuntu: apt install libegl1 libgl1-mesa-dri; "
                 "the default, MUJOCO_GL=egl) or OSMesa (apt install libosmesa6, then MUJOCO_GL=osmesa, or "
                 "PYOPENGL_PLATFORM=osmesa for Genesis)")


def mujoco_refusal(env_id: str, module: str, e: Exception) -> ConfigError:
    """The one line for `module` (MuJoCo, or a package that imports it) failing to import: where MUJOCO_GL is set,
    MuJoCo set up the OpenGL it names as it was imported, so the line gives OpenGL's fix; else the error alone."""
    if (gl := os.environ.get("MUJOCO_GL")) is None:
        return ConfigError(f"{env_id} needs {module}, which failed to import ({type(e).__name__}: {e})")
    return ConfigError(f"{env_id} needs {module}, which failed to import with MUJOCO_GL={gl} ({type(e).__name__}: "
                       f"{e}): MuJoCo sets up the OpenGL that MUJOCO_GL names as it is imported; {RENDERER_HELP}")


FAMILY_SETTINGS = {
    "distribution_mode": "Procgen's difficulty", "num_levels": "Procgen's levels", "start_level": "Procgen's levels",
    "pixels": "frames rendered from a MuJoCo env", "frame_size": "rendered or preprocessed frames",
    "frame_stack": "image observations", "fast_render": "MuJoCo's renderer",
    "episodic_life": "Atari's lives", "fire_reset": "Atari's FIRE button",
}
"""The env settings that only some families take (what each is about): a value other than the default is refused
for a family that does not take it."""

def check_sim(cfg: EnvConfig) -> None:
    """ConfigError for a sim task other than `sim/Sleep` (checked here: the sim module imports gymnasium), or a
    slowest episode faster than the step."""
    if split_id(cfg.id)[0] != "sim/Sleep":
        raise ConfigError(f"{cfg.id}: the sim family has one task, sim/Sleep")
    if (slowest := options_of(cfg, SIM)["slowest"]) < 1:
        raise ConfigError(f"env option slowest={slowest}: a factor of step_ms, at least 1")


PROCGEN = Family(  # Procgen's 16 games (starpilot, ...): 64×64 frames, 15 actions, held-out test levels
    "procgen", "ppo_parallel.yaml", "parallel_ppo.envs.procgen_envs:ProcgenBatchEnv",
    settings=("distribution_mode", "num_levels", "start_level"), levels=True, native=True, spaces=PROCGEN_SPACES,
    check=check_procgen, preload=preload_procgen)
ATARI = Family(  # ale-py's games (ALE/Breakout-v5, ...) with the standard preprocessing
    "atari", "atari.yaml", "parallel_ppo.envs.gym_envs:make_atari",
    settings=("frame_size", "frame_stack", "episodic_life", "fire_reset"),
    frame_stack=4)
MUJOCO = Family(  # gymnasium's MuJoCo envs (HalfCheetah-v5, ...), from their state or from frames (env.pixels)
    "mujoco", "mujoco.yaml", "parallel_ppo.envs.gym_envs:make_mujoco",
    settings=("pixels", "frame_size", "frame_stack", "fast_render"), frame_stack=3, gl=True)
ROBOSUITE = Family(  # robosuite's arm tasks (robosuite/Lift?robot=Panda, ...), from state and named cameras
    "robosuite", "robosuite_lift.yaml", "parallel_ppo.envs.robot_envs:make_robosuite",
    settings=("frame_size", "frame_stack", "fast_render"), extra="robot", needs="robosuite",
    options={
        "robot": Option("Panda", "the arm (`Sawyer`, `IIWA`, `Jaco`, `Kinova3`, `UR5e`, ...)"),
        "cameras": Option("", "cameras observed as uint8 RGB frames of `env.frame_size`, `+` between names "
                              "(`robot0_eye_in_hand`, `agentview`, `frontview`, ...)", camera=True),
        "object_state": Option(True, "observe the objects' state; off, the cameras must show them"),
        "reward": Option("dense", "robosuite's staged reward, or `sparse`: 1 on success", ("dense", "sparse")),
        "horizon": Option(500, "steps an episode lasts at most: a time limit, so the value is bootstrapped (a task "
                               "that ends sooner, as Wipe on a collision, ends terminated)"),
        "control_freq": Option(20, "actions per simulated second"),
    }, sight=("cameras", "object_state"), gl=True)
GENESIS = Family(  # Genesis's CPU backend (genesis/FrankaLift: the Genesis devlog's task; the extra `genesis`)
    "genesis", "genesis_lift.yaml", "parallel_ppo.envs.genesis_envs:make_genesis",
    settings=("frame_size", "frame_stack"), extra="genesis", needs="genesis",
    options={
        "wrist_camera": Option(True, "observe the wrist camera as uint8 RGB frames of `env.frame_size`", camera=True),
        "object_state": Option(False, "observe the cube's position, orientation and offset from the fingertips"),
        "reward": Option("dense", "robosuite Lift's reach, grasp and lift stages, or `sparse`: 1 while the cube is "
                                  "lifted", ("dense", "sparse")),
        "horizon": Option(200, "steps an episode lasts: a time limit, so the value is bootstrapped"),
        "control_freq": Option(20, "actions per simulated second"),
    }, sight=("wrist_camera", "object_state"), gl=True)
SIM = Family(  # sim/Sleep: robosuite Lift from state for measuring the trainer, its step a sleep (`make study-sim`)
    "sim", "sim_lift.yaml", "parallel_ppo.envs.sim_envs:make_sim", check=check_sim,
    options={
        "step_ms": Option(7.0, "milliseconds each step sleeps: the physics time it stands for"),
        "slowest": Option(1.0, "each episode's steps sleep `step_ms` times a factor drawn from 1 to this (the "
                               "env's seed): slow episodes make straggling workers; 1: every step alike"),
        "obs_size": Option(60, "floats observed (robosuite Lift's proprioception and cube state: 60)"),
        "action_size": Option(7, "continuous actions (the Panda's OSC controller and gripper: 7)"),
        "horizon": Option(500, "steps an episode lasts: a time limit, so the value is bootstrapped"),
    })
ROBOTICS = Family(  # gymnasium-robotics' tasks (FetchReachDense-v4, ...; the extra `robot`), dict observations
    "gymnasium-robotics", "fetch.yaml", "parallel_ppo.envs.robot_envs:make_robotics", settings=("frame_stack",),
    gl=True)
GYMNASIUM = Family(  # any other registered id (CartPole-v1, ...), or module:EnvId for one a module of yours registers
    "gymnasium", "cartpole.yaml", "parallel_ppo.envs.gym_envs:make_plain", settings=("frame_stack",))

ROBOTICS_PREFIXES = ("Fetch", "HandManipulate", "HandReach", "AdroitHand", "PointMaze", "AntMaze", "FrankaKitchen")
"""How gymnasium-robotics' ids begin: one of these, unknown while it is not installed, is taken as one of its."""

FAMILIES = (PROCGEN, ATARI, MUJOCO, ROBOSUITE, GENESIS, SIM, ROBOTICS, GYMNASIUM)
PREFIXED = {"robosuite": ROBOSUITE, "genesis": GENESIS, "sim": SIM}
"""Families whose ids are `<prefix>/<task>`, outside gymnasium's registry."""


def split_id(env_id: str) -> tuple[str, str]:
    """(`name`, `query`) of `name?query`."""
    name, _, query = env_id.partition("?")
    return name, query


def family_of(env_id: str) -> Family:
    """The family of `env_id` (a query `?key=value&...` aside); ConfigError for an unknown id or a family whose
    extra is not installed."""
    name, query = split_id(env_id)
    prefix, slash, _ = name.partition("/")
    if name in PROCGEN_GAMES:
        family = PROCGEN
    elif slash and prefix in PREFIXED:
        family = PREFIXED[prefix]
    else:
        entry_point = str(registry_entry(name).entry_point)
        family = (ATARI if "ale_py" in entry_point else ROBOTICS if entry_point.startswith("gymnasium_robotics")
                  else MUJOCO if "mujoco" in entry_point else GYMNASIUM)
    if "?" in env_id and not (query and family.options):
        raise ConfigError(f"env.id = {env_id!r}: " + (f"a {family.name} env takes no options" if not family.options
                                                       else "nothing after '?' (options are key=value&key=value)"))
    if family.needs and importlib.util.find_spec(family.needs) is None:
        raise needs_extra(f"{name} is a {family.name} env", family.extra)
    return family


def preload(env_id: str) -> None:
    """Load, in this process, what the envs of `env_id` let the processes forked from it share (its family's
    `preload`; nothing for a family that has none)."""
    load = family_of(env_id).preload
    if load is not None:
        load(env_id)


def needs_extra(what: str, extra: str) -> ConfigError:
    """The refusal of an env whose extra is not installed, with the command that installs it."""
    return ConfigError(f"{what}, which needs the extra {extra!r}: pip install -e '.[{extra}]' "
                       f"(make install EXTRAS={extra})")


def registry_entry(env_id: str) -> Any:
    """gymnasium's EnvSpec for `env_id` (`module:EnvId` imports the module first; Atari ids register ale-py's
    envs); ConfigError if unknown."""
    import gymnasium  # here: a Procgen run needs none of it

    module, _, name = env_id.rpartition(":")
    if module:
        try:
            importlib.import_module(module)
        except Exception as e:  # ImportError, or the module failed while registering
            where = ("; its folder must be on PYTHONPATH (parallel-ppo does not look in the current directory, python "
                     "-m parallel_ppo does)" if isinstance(e, ModuleNotFoundError) and e.name == module.split(".")[0]
                     else "")
            raise ConfigError(f"env.id = {env_id!r}: cannot import module {module!r} ({type(e).__name__}: "
                              f"{e}){where}") from None
    for registers in ("ale_py", "gymnasium_robotics"):  # ALE/Breakout-v5, FetchReachDense-v4, ...
        if name not in gymnasium.envs.registry and importlib.util.find_spec(registers) is not None:
            try:
                with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):  # notices
                    gymnasium.register_envs(importlib.import_module(registers))
            except Exception as e:  # gymnasium_robotics imports MuJoCo, which sets up OpenGL (MUJOCO_GL) as it loads
                if registers == "ale_py":
                    raise
                if name.startswith(ROBOTICS_PREFIXES):  # else not one of its ids: unknown, below
                    raise mujoco_refusal(name, registers, e) from None
    if name not in gymnasium.envs.registry and name.startswith(ROBOTICS_PREFIXES) and \
            importlib.util.find_spec("gymnasium_robotics") is None:
        raise needs_extra(f"{name} looks like a gymnasium-robotics env", "robot")
    if name not in gymnasium.envs.registry:
        hint = f" (is it registered by {module}?)" if module else ""
        raise ConfigError(f"unknown game or env id {env_id!r}{hint}: use a Procgen game, a gymnasium id such as "
                          "CartPole-v1, HalfCheetah-v5 or ALE/Breakout-v5, robosuite/Lift or FetchReachDense-v4 "
                          "(the extra 'robot'), genesis/FrankaLift (the extra 'genesis'), or module:EnvId for your "
                          "own env")
    return gymnasium.envs.registry[name]


def options_of(cfg: EnvConfig, family: Family | None = None) -> dict[str, Any]:
    """Every option of the env's family: the defaults, overridden by `env.options`, overridden by the id's query;
    ConfigError for an unknown key, a key given twice in one of them, or an unreadable value."""
    family = family or family_of(cfg.id)
    given: dict[str, str] = {}
    query = split_id(cfg.id)[1]
    for source, items in (("env.options", list(cfg.options)), ("env.id", query.split("&") if query else [])):
        here: dict[str, str] = {}
        for item in items:
            key, eq, value = item.partition("=")
            if not eq or not key:
                raise ConfigError(f"{source}: {item!r} is not key=value")
            if key in here:
                raise ConfigError(f"{source}: option {key!r} is given twice")
            here[key] = value
        given |= here
    unknown = sorted(set(given) - set(family.options))
    if unknown:
        known = ", ".join(family.options) or "none"
        raise ConfigError(f"{cfg.id}: unknown option {unknown[0]!r} for a {family.name} env (its options: {known})")
    return {key: _read_option(key, option, given.get(key)) for key, option in family.options.items()}


def _read_option(key: str, option: Option, text: str | None) -> Any:
    if text is None:
        return option.default
    if isinstance(option.default, bool):
        if text.lower() not in ("true", "false", "1", "0", "yes", "no"):
            raise ConfigError(f"env option {key}={text!r}: expected true or false")
        return text.lower() in ("true", "1", "yes")
    if isinstance(option.default, (int, float)):
        kind = type(option.default)
        try:
            value = kind(text)
        except ValueError:
            raise ConfigError(f"env option {key}={text!r}: expected {'an integer' if kind is int else 'a number'}") \
                from None
        if not 0 < value < float("inf"):
            raise ConfigError(f"env option {key}={value}: must be positive" + (" and finite" if kind is float else ""))
        return value
    if option.choices and text not in option.choices:
        raise ConfigError(f"env option {key}={text!r}: expected one of {', '.join(option.choices)}")
    if option.camera:  # names between `+`: each once, none empty (`+` alone is no camera)
        return "+".join(dict.fromkeys(name for name in text.split("+") if name))
    return text


def check_family(cfg: EnvConfig) -> Family:
    """The env's family, once the settings and options asked for are ones it takes (ConfigError otherwise); the
    env's spaces are checked where it is first built (`envs.batch.env_spaces`)."""
    family = family_of(cfg.id)
    defaults = EnvConfig()
    for name, about in FAMILY_SETTINGS.items():
        if name not in family.settings and getattr(cfg, name) != getattr(defaults, name):
            takers = ", ".join(f.name for f in FAMILIES if name in f.settings)
            raise ConfigError(f"env.{name} ({about}) applies to {takers} envs; {split_id(cfg.id)[0]} is a "
                              f"{family.name} env")
    options = options_of(cfg, family)
    if family.sight and not any(options[name] for name in family.sight):
        raise ConfigError(f"{cfg.id}: {' and '.join(family.sight)} are all off, so nothing observed shows the "
                          f"policy the object of its task: turn one on")
    if family.check is not None:
        family.check(cfg)
    return family


def options_table(family: Family) -> str:
    """The markdown table of a family's options (docs/envs.md holds it; a test keeps them equal)."""
    def shown(default: Any) -> str:  # an empty default is no value to copy
        return "empty" if default == "" else f"`{str(default).lower() if isinstance(default, bool) else default}`"

    rows = [f"| `{key}` | {shown(o.default)} | {o.doc} |" for key, o in family.options.items()]
    return "\n".join(["| option | default | what it does |", "|---|---|---|", *rows])

