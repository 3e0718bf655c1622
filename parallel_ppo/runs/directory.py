"""The run directory: created only where it can be written, never mixed with an earlier run's results unless
asked to replace them."""

from __future__ import annotations

import csv
import errno
import json
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

from parallel_ppo.core.config import Config
from parallel_ppo.core.config_yaml import dump_yaml
from parallel_ppo.core.files import atomic_write, path_problem, resolved, write_text, writing
from parallel_ppo.errors import ConfigError, RunDataError
from parallel_ppo.runs.summary import RUN_FILES, short_repr

try:
    import fcntl
except ImportError:  # Windows: runs go unlocked
    fcntl = None  # type: ignore[assignment]

CHECKPOINT_READ = "checkpoint_read"
"""The resumed checkpoint's `file_identity` as it was loaded, under this key of the resume state."""

EARLIER_RUN = "replaced_run"
"""The folder of a run directory where an earlier run's files wait while a run that replaces them starts."""


def check_writable(path: Path, what: str = "") -> None:
    """Refuse a directory that cannot be created or written, before anything starts: probe its nearest existing
    ancestor with a temporary file (permission bits alone say nothing for root or a read-only mount). `what` is
    written there, named in the message (default: the output directory `path`)."""
    what = what or f"output directory {path}"
    ancestor = path.absolute()
    while not ancestor.exists():
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        raise ConfigError(f"cannot create {what}: {ancestor} is not a directory")
    try:
        with tempfile.TemporaryFile(dir=ancestor):
            pass
    except OSError as e:  # ENOENT from a folder that exists: a file system that takes no new files (/proc)
        reason = "it takes no new files" if e.errno == errno.ENOENT else e.strerror
        raise ConfigError(f"cannot write {what}: {ancestor}: {reason}") from None


def check_output_file(path: Path, what: str) -> None:
    """Refuse a result file that is a directory, or whose folder cannot be created or written (`check_writable`),
    before the measurement that fills it, not after; `what` names it in the message (`--output out.json`)."""
    if path.is_dir():
        raise ConfigError(f"{what} is a directory; give a file name such as result.json")
    check_writable(path.parent, what)


def default_run_dir(mode: str) -> str:
    return f"benchmarks/{mode}_{time.strftime('%Y%m%d-%H%M%S')}"


def resolve_run_dir(cfg: Config, mode: str, overwrite: bool) -> Path:
    """The run directory (not yet created); refuses to mix with an earlier run's results unless told to."""
    path = Path(cfg.run.output_dir or default_run_dir(mode))
    if problem := path_problem(path):
        raise ConfigError(f"output directory: {problem}")
    if path.exists() and not path.is_dir():
        raise ConfigError(f"output directory {path} exists and is not a directory")
    real = resolved(path, "output directory")
    if real == Path(real.anchor):  # a run's files and, overwritten, its replaced_run at /
        raise ConfigError(f"output directory {path} is the file system's root ({real}); give the run a directory of "
                          "its own")
    if not overwrite and holds_run(path):
        found = "" if (path / "checkpoint.pt").is_file() else " but no checkpoint.pt (nothing to resume)"
        raise ConfigError(f"{path} already holds a run's files{found}; pass --overwrite to replace them or choose "
                          "another --output-dir")
    if overwrite and os.path.lexists(path / EARLIER_RUN):
        raise ConfigError(in_the_way(path))
    check_writable(path)
    return path


def holds_run(path: Path) -> bool:
    """Whether `path` is a directory with a run's files in it."""
    return path.is_dir() and any((path / name).exists() for name in RUN_FILES)


def file_identity(path: Path) -> tuple[int, int, int] | None:
    """What tells a file from one written in its place since (inode, mtime in ns, size; None: no file)."""
    try:
        st = path.stat()
    except OSError:
        return None
    return st.st_ino, st.st_mtime_ns, st.st_size


def resume_state(path: Path) -> dict:
    """The checkpoint a resume of `path` goes on from, the run directory checked (`check_resumable`), with the
    file's identity as it was read (CHECKPOINT_READ: `resumed_run_dir` checks it again under the directory's lock)."""
    from parallel_ppo.core.checkpoint import load_checkpoint  # torch's: not for compare's imports of this module

    read = file_identity(path / "checkpoint.pt")  # before the load: a file written since is told from this one
    state = {**load_checkpoint(path / "checkpoint.pt"), CHECKPOINT_READ: read}
    check_resumable(path)
    return state


TRAINERS = {"sequential": "train_timed.py, or parallel-ppo train", "parallel": "train_parallel_timed.py, or "
            "parallel-ppo train-parallel"}
"""The commands of each trainer, as a refusal to resume names them."""


def trainer_mismatch(path: Path, state: dict, mode: str, parallel: bool) -> str | None:
    """Why the run in `path` (its checkpoint `state`) cannot be resumed by a trainer of `mode` (`sequential`,
    `parallel`, `distributed`; `parallel`: the parallel trainer's), saying how it can; None where it can. A
    distributed run's trainer is read from its summary.json, where one was written. A checkpoint of another mode is
    corrupt (RunDataError)."""
    ran = state.get("mode", mode)
    if ran not in (*TRAINERS, "distributed"):
        raise RunDataError(f"checkpoint {path / 'checkpoint.pt'} is corrupt: its mode is {short_repr(ran)}, not "
                           "sequential, parallel or distributed")
    source = _distributed_source(path) if ran == "distributed" else ran
    asked = "parallel" if parallel else "sequential"
    if ran == mode and source in (None, asked):
        return None
    if ran == "distributed":
        trainer = f"the {source} trainer" if source else "its trainer"
        return (f"cannot resume: {path} holds a distributed run of {state.get('world_size', 'several')} ranks; resume "
                f"it under torchrun with that many ranks of {trainer} ({TRAINERS.get(source or '', 'as it ran')}) "
                "and --distributed")
    return f"cannot resume: {path} holds a {ran} run; resume it with the {ran} trainer ({TRAINERS[ran]}), not under " \
           "torchrun"


def _distributed_source(path: Path) -> str | None:
    """The trainer of a distributed run's ranks (`sequential`, `parallel`), as its summary.json says; None where
    it says nothing readable."""
    with suppress(OSError, ValueError, AttributeError):
        source = json.loads((path / "summary.json").read_text()).get("distributed", {}).get("source")
        return source if source in TRAINERS else None
    return None


def check_resumable(path: Path) -> None:
    """Refuse to resume a run directory whose files the run would fail on once its workers had started, config.yaml
    rewritten: a folder in the place of metrics.csv or summary.json, something other than a folder in the place of
    logs or wandb, or a metrics.csv that is not CSV text."""
    for name in ("metrics.csv", "summary.json"):
        if (path / name).is_dir():
            raise ConfigError(f"cannot resume: {path / name} is a folder, not the run's file; move it away")
    for name in ("logs", "wandb"):
        if os.path.lexists(path / name) and not (path / name).is_dir():
            raise ConfigError(f"cannot resume: {path / name} is a file, not the run's folder; move it away")
    metrics = path / "metrics.csv"
    try:
        with open(metrics, newline="") as f:
            for _ in csv.reader(f):
                pass
    except FileNotFoundError:
        pass  # the resumed run starts a new one
    except (OSError, UnicodeDecodeError, csv.Error) as e:
        raise ConfigError(f"cannot resume: {metrics} cannot be read ({e}); repair it (without it the run would "
                          "lose its earlier rows)") from None


@contextmanager
def run_dir_lock(path: Path) -> Iterator[None]:
    """The run directory, made if need be and locked while the body runs: another run into it meanwhile (a second
    terminal, a requeued job while the first still runs) is refused instead of mixing its files into this one's.
    A directory made here is removed if the body leaves it empty (a start that failed)."""
    made = not path.exists()
    path.mkdir(parents=True, exist_ok=True)
    fd = locked(path)
    try:
        yield
    finally:
        if made:  # before the lock goes, lest another run lock the directory removed
            with suppress(OSError):  # not empty: the run started, or a file of the user's came meanwhile
                path.rmdir()
        if fd is not None:
            os.close(fd)


def locked(path: Path) -> int | None:
    """A descriptor of directory `path` that holds its lock (closing it lets go), or None where nothing locks: a
    system without flock (Windows), a file system that takes no lock (some network ones)."""
    if fcntl is None:
        return None
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except FileNotFoundError:  # removed by another run's failed start since it was made
        raise ConfigError(gone(path)) from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise ConfigError(f"another run is writing into {path} now; wait for it to end, or choose another "
                          "--output-dir") from None
    except OSError:
        os.close(fd)
        return None
    try:
        same = os.path.samestat(os.fstat(fd), os.stat(path))
    except OSError:
        same = False
    if not same:  # removed by another run's failed start meanwhile (and perhaps made again)
        os.close(fd)
        raise ConfigError(gone(path))
    return fd


def gone(path: Path) -> str:
    return f"{path} was removed (by another run's failed start) while this run locked it; run the command again"


@contextmanager
def new_run_dir(path: Path, cfg: Config, overwrite: bool) -> Iterator[None]:
    """The directory of a new run (made and locked by `run_dir_lock`), with its config.yaml (WriteFailed where the
    disk does not take it), for the run's start (the body). Overwriting, the earlier run's files wait in EARLIER_RUN
    meanwhile: deleted once the body has returned, put back in place of the new run's if it raises. A start killed
    outright leaves them there. The directory is checked again: a run into it may have ended while this one
    started."""
    path.mkdir(parents=True, exist_ok=True)
    if not overwrite and holds_run(path):
        raise ConfigError(f"{path} got another run's files while this run started; run the command again")
    moved = set_aside(path) if overwrite else []
    try:
        with writing(path / "config.yaml"):  # a full disk: WriteFailed, one line
            write_text(path / "config.yaml", dump_yaml(cfg.to_dict()))
        yield
    except BaseException:
        try:
            remove_run_files(path)
        finally:
            put_back(path, moved)
        raise
    if moved:
        shutil.rmtree(path / EARLIER_RUN, ignore_errors=True)  # started: what stays, the next --overwrite names


@contextmanager
def resumed_run_dir(path: Path, cfg: Config, resume: dict) -> Iterator[None]:
    """The directory of a resumed run, its config.yaml written with the settings it goes on with (WriteFailed where
    the disk does not take it), for the run's start (the body): if the body raises, config.yaml is written back as it
    was, where the disk takes it, and a W&B folder made meanwhile is removed (a refused `--track` leaves the run as it
    was). A checkpoint that is no longer the one `resume` was read from (another run into the directory wrote it
    while this one started) is refused."""
    if file_identity(path / "checkpoint.pt") != resume.get(CHECKPOINT_READ):
        raise ConfigError(f"{path / 'checkpoint.pt'} was written again while this run started (by another run into "
                          "the directory, ended since); run the command again to go on from it")
    config, wandb = path / "config.yaml", path / "wandb"
    earlier, had_wandb = config.read_bytes(), wandb.exists()
    try:
        with writing(config):
            write_text(config, dump_yaml(cfg.to_dict()))
        yield
    except BaseException:
        with suppress(OSError):  # best effort: the error on its way out is the one to say
            atomic_write(config, lambda f: f.write(earlier))
        if not had_wandb:
            shutil.rmtree(wandb, ignore_errors=True)
        raise


def set_aside(path: Path) -> list[str]:
    """Move the run files in `path` into EARLIER_RUN, which must not exist yet; returns their names (all are moved
    or none)."""
    present = [name for name in RUN_FILES if os.path.lexists(path / name)]
    if not present:
        return []
    try:
        (path / EARLIER_RUN).mkdir()
    except FileExistsError:
        raise ConfigError(in_the_way(path)) from None
    moved: list[str] = []
    try:
        for name in present:
            os.replace(path / name, path / EARLIER_RUN / name)
            moved.append(name)
    except BaseException:
        put_back(path, moved)
        raise
    return moved


def put_back(path: Path, moved: list[str]) -> None:
    """Undo `set_aside`, which moved the files named `moved` (none: nothing to undo)."""
    if not moved:
        return
    for name in moved:
        os.replace(path / EARLIER_RUN / name, path / name)
    (path / EARLIER_RUN).rmdir()


def in_the_way(path: Path) -> str:
    """The refusal of an overwrite whose folder for the earlier run's files is taken."""
    return (f"{path / EARLIER_RUN} is in the way: --overwrite sets the earlier run's files aside there until the new "
            "run has started (one left there holds a run whose replacement did not finish starting); move it away")


def remove_run_files(path: Path) -> None:
    """Delete the files of a run (RUN_FILES) in `path`; other files stay."""
    for name in RUN_FILES:
        target = path / name
        if target.is_dir():
            shutil.rmtree(target)
        else:
            target.unlink(missing_ok=True)
