"""What every command line shares: the one-line error report and argparse types and parser."""

from __future__ import annotations

import argparse
import contextlib
import math
import multiprocessing
import re
import signal
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, NoReturn

import psutil

from parallel_ppo.bench.trainer_runs import end_processes
from parallel_ppo.cli.flags import with_flags
from parallel_ppo.core.configure import maximum_of
from parallel_ppo.core.files import new_folders, path_problem, writing
from parallel_ppo.core.units import SECONDS_PER, to_unit
from parallel_ppo.errors import ConfigError, WriteFailed


def fail(prog: str, error: Exception, status: int, flags: bool = False) -> int:
    """Report `error` as the one line `PROG: error: ...` on stderr (`flags`, for the trainers: each config key it
    names with the trainers' flag for it, `with_flags`); returns the exit status to end with."""
    text = re.sub(r"\s*\n\s*", " ", (with_flags(str(error)) if flags else str(error)).strip())  # an env's has lines
    print(f"{prog}: error: {text}", file=sys.stderr)
    return status


class Terminated(KeyboardInterrupt):
    """SIGTERM, stopping a command that runs others as Ctrl-C does (`stop_on_sigterm`)."""


def stop_on_sigterm() -> None:
    """Make SIGTERM (`kill PID`, a scheduler's time limit) stop this command as Ctrl-C does, raising `Terminated`
    where it is, once the processes under it have stopped: Ctrl-C reaches the terminal's whole process group, SIGTERM
    this process alone, and a benchmark killed by its pid left its trainer running on. The commands it started are
    sent SIGTERM (a trainer then writes its checkpoint), SIGKILL after 10 s (`commands_under`); later SIGTERMs are
    ignored while it stops."""

    signal.signal(signal.SIGTERM, _raising_terminated(lambda: end_processes(commands_under())))


@contextlib.contextmanager
def terminated_as_interrupt() -> Iterator[None]:
    """SIGTERM raises `Terminated` (a KeyboardInterrupt) within the block, later ones ignored while it unwinds; the
    handler before it put back after."""
    previous = signal.signal(signal.SIGTERM, _raising_terminated(lambda: None))
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _raising_terminated(first: Callable[[], None]) -> Callable[[int, Any], None]:
    """A SIGTERM handler that ignores the SIGTERMs after it, does `first`, then raises `Terminated` where it is."""

    def handler(signum: int, frame: Any) -> None:
        signal.signal(signal.SIGTERM, lambda *_: None)  # not SIG_IGN, which a command started now would inherit
        first()
        raise Terminated

    return handler


def commands_under() -> list[psutil.Process]:
    """The processes this one started as commands (subprocess), each with every process under it; not
    multiprocessing's own (workers, a forkserver, the resource tracker), which the code that started them stops."""
    own = {p.pid for p in multiprocessing.active_children()}  # forked ones; spawned ones say so in their command
    tree: list[psutil.Process] = []
    for child in psutil.Process().children():
        with contextlib.suppress(psutil.Error):
            if child.pid not in own and "from multiprocessing" not in " ".join(child.cmdline()):
                tree += [child, *child.children(recursive=True)]
    return tree


def interrupted(prog: str, outcome: str) -> int:
    """Ctrl-C (or SIGTERM, `Terminated`, being handled): one line saying what was left, and the shell's status for
    the signal."""
    if isinstance(sys.exc_info()[1], Terminated):
        print(f"{prog}: terminated; {outcome}", file=sys.stderr)
        return 128 + signal.SIGTERM
    print(f"\n{prog}: interrupted; {outcome}", file=sys.stderr)
    return 128 + signal.SIGINT


def write_result(prog: str, path: Path, write: Callable[[Path], None]) -> int:
    """A script's result file: `write(path)`, its folders made where missing (removed again where the write fails);
    returns 0, or 1 with one line naming the file where the disk does not take it."""
    try:
        with writing(path), new_folders(path.parent):
            write(path)
    except WriteFailed as e:
        print(f"{prog}: error: {e}", file=sys.stderr)
        return 1
    return 0


def last_line(stderr: str, status: int) -> str:
    """What a failed child process said last (a traceback's last line: its error), else its exit status."""
    return (stderr.strip().splitlines() or [f"exit status {status}"])[-1]


def setting_item(text: str) -> str:
    """argparse type of `--set`: `section.key=value` (the value is read and checked with the config)."""
    key, eq, _ = text.partition("=")
    if not eq or "." not in key or not key.strip():
        raise argparse.ArgumentTypeError(f"expects section.key=value, got {text!r}")
    return text


class OneLineParser(argparse.ArgumentParser):
    """argparse that reports a bad flag in one line (no usage dump) and exits with status 2. A value that starts
    with `-` after a flag that takes one (`--duration -5m`) is that flag's value, so its real problem is named
    (argparse would take it for a flag and say the value is missing)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")

    def parse_known_args(self, args: Sequence[str] | None = None,
                         namespace: argparse.Namespace | None = None) -> tuple[argparse.Namespace, list[str]]:
        return super().parse_known_args(self._dash_values_attached(sys.argv[1:] if args is None else list(args)),
                                        namespace)

    def _dash_values_attached(self, args: list[str]) -> list[str]:
        """`--flag -5m` as `--flag=-5m` where `--flag` takes one value and `-5m` is a negative number (with a unit or
        not; a list that starts with one, `-1,2`; -inf, -nan), so that its own check names the problem; anything else
        that starts with a dash stays a flag."""
        out: list[str] = []
        i = 0
        while i < len(args):
            action = self._option_string_actions.get(args[i])
            follows = args[i + 1] if i + 1 < len(args) else ""
            if args[i] == "--":
                return out + args[i:]
            if (args[i].startswith("--") and action is not None and action.nargs is None
                    and re.fullmatch(r"-((\d+\.?\d*|\.\d+)(e-?\d+)?[smhd]?(,\S*)?|inf|infinity|nan)", follows)):
                out.append(f"{args[i]}={follows}")
                i += 2
            else:
                out.append(args[i])
                i += 1
        return out


def duration_in(unit: str) -> Callable[[str], float]:
    """argparse type: a positive duration with a unit (`90s`, `10m`, `1.5h`) or a bare number in `unit`, returned
    in `unit` (core/units.py)."""

    def duration(text: str) -> float:
        try:
            value = to_unit(text, unit)
        except ValueError as e:
            if text.strip().startswith("-"):
                raise argparse.ArgumentTypeError(f"must be a positive duration, got {text!r}") from None
            raise argparse.ArgumentTypeError(str(e)) from None
        if value <= 0:
            raise argparse.ArgumentTypeError(f"must be a positive duration, got {text!r}")
        return value

    return duration


LONGEST_RUN_DAYS = 7
"""The longest budget of one benchmark run, a week: the trainer takes up to a year, but a study stops a run as hung
after 3 × its budget + 2 min, a wait Python's poll() must hold in milliseconds (below 2**31 ms, about 24.8 days)."""


def run_budget(unit: str) -> Callable[[str], float]:
    """argparse type of a benchmark run's budget: a duration (`duration_in(unit)`) of 0.1 s to a week."""
    duration = duration_in(unit)

    def budget(text: str) -> float:
        value = duration(text)
        if value * SECONDS_PER[unit] > LONGEST_RUN_DAYS * SECONDS_PER["d"]:
            raise argparse.ArgumentTypeError(f"a benchmark run takes at most {LONGEST_RUN_DAYS}d, got {text!r}")
        if value * SECONDS_PER[unit] < 0.1:  # 1e-9 minutes reached the trainer as a --duration of 0 hours
            raise argparse.ArgumentTypeError(f"a benchmark run takes at least 0.1s, got {text!r}")
        return value

    return budget


def some_path(text: str) -> str:
    """argparse type of a path flag: any text but one `path_problem` refuses (found before any work, not by the
    first file written)."""
    if problem := path_problem(text):
        raise argparse.ArgumentTypeError(problem)
    return text


def step_count(text: str) -> int:
    """argparse type of a number of env steps: a whole number, also written 1e6 or 1_000_000 (as --set takes it);
    its range is the config's rule."""
    try:
        return int(text)
    except ValueError:
        pass
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value.is_integer() and abs(value) < 2**62):
        raise argparse.ArgumentTypeError(f"expected a whole number (1000000, 1e6), got {text!r}")
    return int(value)


def positive_int(text: str) -> int:
    """argparse type: a whole number above 0."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be positive, got {text!r}")
    return value


def positive_up_to(setting: str) -> Callable[[str], int]:
    """argparse type: a whole number above 0 and at most the maximum of the config's `setting` (`eval.episodes`)."""
    maximum = maximum_of(setting)

    def parse(text: str) -> int:
        value = positive_int(text)
        if value > maximum:
            raise argparse.ArgumentTypeError(f"at most {maximum:,} (as {setting}), got {text!r}")
        return value

    return parse


def seed_number(text: str) -> int:
    """argparse type: a seed, a whole number in 0..2**31-1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if not 0 <= value < 2**31:
        raise argparse.ArgumentTypeError(f"must be in 0..2147483647, got {text!r}")
    return value


def int_list(text: str, name: str, least: int = 1) -> list[int]:
    """`1,2,4` or `1 2 4` as distinct whole numbers of at least `least` (flag `name` in the error): a number twice
    would run its point twice, into one directory."""
    try:
        values = [int(v) for v in text.replace(",", " ").split()]
    except ValueError:
        raise ConfigError(f"{name} must be whole numbers, got {text!r}") from None
    if not values or any(v < least for v in values):
        kind = {1: "positive whole numbers", 0: "non-negative whole numbers"}.get(
            least, f"whole numbers of at least {least}")
        raise ConfigError(f"{name} must be {kind}, got {text!r}")
    if twice := sorted({v for v in values if values.count(v) > 1}):
        raise ConfigError(f"{name} lists {twice[0]} twice, got {text!r}")
    return values


CONFIG_DIR = Path(__file__).resolve().parents[2] / "config"


def add_config_flags(p: Any, procgen: str, env_note: str = "") -> None:
    """`--config` and `--env` of a benchmark: without `--config`, the config that fits the env (`default_config`;
    `procgen`, in config/, for a Procgen game); without `--env`, the env the config names
    (`core.config_yaml.config_env`). `env_note` says what else the env decides."""
    from parallel_ppo.envs.families import FAMILIES, PROCGEN

    shipped = [f.config for f in FAMILIES if f is not PROCGEN]
    p.add_argument("--config", type=some_path,
                   help=f"YAML config file (default: config/{procgen} for a Procgen game, else the shipped config of "
                        f"the env's family: {', '.join(shipped[:-1])} or {shipped[-1]})")
    p.add_argument("--env", metavar="ID",
                   help=f"Procgen game or gymnasium id{env_note} (default: the config's, starpilot without one)")


def add_set_flag(p: Any, text: str) -> None:
    """`--set KEY=VALUE`, repeatable: config overrides as the trainers take them; `text` is its help."""
    p.add_argument("--set", action="append", default=[], type=setting_item, metavar="KEY=VALUE", help=text)


def default_config(env_id: str | None, procgen: str) -> str:
    """The config a benchmark uses without `--config`: `procgen` (in config/) for a Procgen game or no env given;
    for another env the shipped config of its family (`Family.config`; cartpole.yaml, an MLP for vector
    observations, for an unknown id), so that the Procgen config's held-out test levels and CNN are not forced on
    it."""
    from parallel_ppo.envs.families import GYMNASIUM, PROCGEN, family_of

    try:
        family = family_of(env_id) if env_id else PROCGEN
    except ConfigError:  # an unknown id or a missing extra: the run's config check says so
        family = GYMNASIUM
    return str(CONFIG_DIR / (procgen if family is PROCGEN else family.config))


def run_args(args: Any, parallel: bool = True) -> list[str]:
    """`--env` and `--set` as every run of a benchmark takes them (checked first, so a typo fails before any run)."""
    from parallel_ppo.core.configure import build_config

    build_config(args.config, {"env.id": args.env}, args.set, parallel=parallel)
    return [*(["--env", args.env] if args.env else []), *(a for item in args.set for a in ("--set", item))]


SEEDED_KEYS = ("run.seed", "run.output_dir")
"""What a command of several seeds sets for each seed's run (`--seeds`)."""


def refuse_seeded_sets(sets: Sequence[str], whose: str) -> None:
    """A `--set` of a key that `whose` sets for each seed's run would give every run the same one: refused."""
    from parallel_ppo.core.config_yaml import set_keys

    if owned := [key for key in SEEDED_KEYS if key in set_keys(sets)]:
        raise ConfigError(f"--set {owned[0]} would give every seed's run the same one: {whose} sets each run's seed "
                          "and directory (seed_<n> under --output-dir)")
