"""The env section of the run configuration (`env:`, `EnvConfig`) and the rules every field of the configuration
carries (`Rules`, `setting`): declared here, below the core, so that the envs read their settings without it.
`core.config` builds the other sections on these rules and re-exports them; loading, overriding and validating the
configuration is `core.configure`'s job."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

PROCGEN_MODES = ("easy", "hard", "extreme", "memory", "exploration")
"""Procgen's difficulties: the choices of `env.distribution_mode`."""
MAX_THREADS = 4096
"""The most threads a setting may ask for (more than any CPU has logical cores; torch takes a C int)."""


@dataclass(frozen=True)
class Rules:
    """What a field's value must satisfy and how a value for it is read: `core.configure` applies them to every
    field, so a rule is written once, on its field."""

    positive: bool = False
    non_negative: bool = False
    maximum: float | None = None
    unit_interval: bool = False
    """Within [0, 1]."""
    choices: tuple[str, ...] = ()
    unit: str = ""
    """A duration: the unit of a bare number (`h` or `s`); text with a unit (`90m`, `30s`; core/units.py) is
    taken too."""
    auto: bool = False
    """An integer (a duration, with `unit`) that also takes `auto` (chosen by measurement before or during a run)."""
    names: bool = False
    """A list of names (strings), which also takes a comma-separated string."""
    widths: bool = False
    """A non-empty list of layer widths, each in 1..4096."""
    resume: bool = False
    """It makes the envs or the network: a checkpoint resumes only with the same value."""
    command_line: bool = False
    """The trainers' command lines set it with a flag of their own."""


def setting(default: Any, **rules: Any) -> Any:
    """A dataclass field with `default` (a list is copied for each instance) and its `Rules` (keywords)."""
    metadata = {"rules": Rules(**rules)}
    if isinstance(default, list):
        return field(default_factory=lambda: list(default), metadata=metadata)
    return field(default=default, metadata=metadata)


def rules_of(f: dataclasses.Field) -> Rules:
    """The rules of a field (none for one declared without `setting`)."""
    return f.metadata.get("rules", Rules())


@dataclass
class EnvConfig:
    id: str = setting("starpilot", command_line=True, resume=True)
    """Procgen game (e.g. `starpilot`), or any gymnasium id with Box or Dict observations (vectors, uint8 HWC
    images) and Discrete or Box actions: classic control (`CartPole-v1`), MuJoCo (`HalfCheetah-v5`), Atari
    (`ALE/Breakout-v5`, with the standard preprocessing), gymnasium-robotics (`FetchReachDense-v4`), robosuite
    (`robosuite/Lift`, options after `?`), Genesis (`genesis/FrankaLift`), or `module:EnvId` for an env a module of
    yours registers (the module is imported in every process that builds envs). Each family:
    `envs.families`."""
    num_envs: int = setting(16, positive=True, maximum=4096, command_line=True, resume=True)
    """Total envs. Sequential: stepped by the one process. Parallel: derived, workers × envs per worker (a
    different value given for it is refused)."""
    distribution_mode: str = setting("easy", choices=PROCGEN_MODES, resume=True)
    """Procgen difficulty: easy, hard, extreme, memory or exploration (exploration plays one fixed hard level
    per game, so num_levels and start_level do not apply; only the games Procgen has one for)."""
    num_levels: int = setting(200, non_negative=True, maximum=2**31 - 1, resume=True)
    """Procgen: number of distinct levels (0 = unlimited)."""
    start_level: int = setting(0, non_negative=True, maximum=2**31 - 1, resume=True)
    """Procgen: seed of the first level."""
    env_threads: int = setting(0, non_negative=True, maximum=MAX_THREADS, resume=True)
    """The env's own threads per process, Procgen's stepping and Mesa's drawing threads (LP_NUM_THREADS, unless
    set): 0 = automatic, the CPUs this process may use (a distributed rank: its share of them) in a sequential
    process; in a worker one to step and its share of those CPUs (CPUs / workers, at least one) to draw."""
    pixels: bool = setting(False, resume=True)
    """gymnasium's MuJoCo envs: observe RGB frames rendered on the CPU instead of the state vector. Rendering
    happens in the process that steps the env (workers in parallel mode)."""
    frame_size: int = setting(84, positive=True, maximum=1024, resume=True)
    """Pixels and the cameras of robosuite and Genesis: width and height of the rendered frames. Atari: of the
    preprocessed grayscale frames."""
    frame_stack: int = setting(0, non_negative=True, maximum=64, resume=True)
    """Frames stacked along the channels, per image key of a dict (0 = automatic: 4 for Atari, 3 for pixels, else
    1)."""
    fast_render: bool = setting(True, resume=True)
    """Pixels and robosuite's cameras: render without shadows, reflections, skybox and multisampling, and (robosuite)
    hand the renderer only the geoms the camera can see (the same frames): many times faster on Mesa's software
    renderer (`scripts/render_cost.py` measures them; docs/results has its figures for MuJoCo's pixels)."""
    episodic_life: bool = setting(False, resume=True)
    """Atari: a life lost ends the episode for learning (the value is not bootstrapped across it) while the game
    plays on, as CleanRL's ppo_atari does; returns in the metrics and in evaluation stay whole games."""
    options: list[str] = setting([], names=True, resume=True)
    """The env family's options as `key=value` (e.g. `[robot=Panda, cameras=robot0_eye_in_hand]`); the id's query
    (`robosuite/Lift?robot=Panda`) takes them too and overrides these. docs/envs.md lists each family's."""
    fire_reset: bool = setting(False, resume=True)
    """Atari: press FIRE after every reset (games such as Breakout wait for it), and so after every life lost when
    `episodic_life` ends an episode there, as CleanRL's ppo_atari does; games without FIRE (action 1) start by
    themselves and are left as they are."""
