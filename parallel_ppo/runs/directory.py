"""The run directory: created only where it can be written, never mixed with an earlier run's results unless
asked to replace them."""

from __future__ import annotations

import csv
import errno
import os
import shutil
import tempfile
import time
from pathlib import Path

import yaml

from parallel_ppo.core.config import Config
from parallel_ppo.core.files import path_problem, write_text
from parallel_ppo.errors import ConfigError
from parallel_ppo.runs.summary import RUN_FILES

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


def default_run_dir(mode: str) -> str:
    return f"benchmarks/{mode}_{time.strftime('%Y%m%d-%H%M%S')}"


def resolve_run_dir(cfg: Config, mode: str, overwrite: bool) -> Path:
    """The run directory (not yet created); refuses to mix with an earlier run's results unless told to."""
    path = Path(cfg.run.output_dir or default_run_dir(mode))
    if problem := path_problem(path):
        raise ConfigError(f"output directory: {problem}")
    if path.exists() and not path.is_dir():
        raise ConfigError(f"output directory {path} exists and is not a directory")
    if not overwrite and path.is_dir() and any((path / name).exists() for name in RUN_FILES):
        found = "" if (path / "checkpoint.pt").is_file() else " but no checkpoint.pt (nothing to resume)"
        raise ConfigError(f"{path} already holds a run's files{found}; pass --overwrite to replace them or choose "
                          "another --output-dir")
    check_writable(path)
    return path


def check_resumable(path: Path) -> None:
    """Refuse to resume a run directory whose metrics.csv or summary.json the run would fail on once its workers had
    started, config.yaml rewritten: a folder in the place of either, or a metrics.csv that is not CSV text."""
    for name in ("metrics.csv", "summary.json"):
        if (path / name).is_dir():
            raise ConfigError(f"cannot resume: {path / name} is a folder, not the run's file; move it away")
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


def prepare_run_dir(path: Path, cfg: Config, overwrite: bool) -> None:
    """Create the run directory and write config.yaml; overwriting, an earlier run's files are set aside in
    EARLIER_RUN until `settle_run_dir` (a start killed outright leaves them there)."""
    path.mkdir(parents=True, exist_ok=True)
    if overwrite:
        aside = path / EARLIER_RUN
        shutil.rmtree(aside, ignore_errors=True)  # what an earlier start killed outright left: replaced, as asked
        aside.mkdir()
        for name in RUN_FILES:
            if (path / name).exists() or (path / name).is_symlink():
                os.replace(path / name, aside / name)
    write_text(path / "config.yaml", yaml.safe_dump(cfg.to_dict(), sort_keys=False))


def settle_run_dir(path: Path, started: bool) -> None:
    """The end of a new run's start: an earlier run's files set aside are deleted once it has `started`; if it has
    not, its own files go and the earlier run's are put back (a directory left empty is removed)."""
    aside = path / EARLIER_RUN
    if started:
        shutil.rmtree(aside, ignore_errors=True)
        return
    remove_run_files(path)
    if aside.is_dir():
        for earlier in aside.iterdir():
            os.replace(earlier, path / earlier.name)
        aside.rmdir()
    if path.is_dir() and not any(path.iterdir()):
        path.rmdir()


def remove_run_files(path: Path) -> None:
    """Delete the files of a run (RUN_FILES) in `path`; other files stay."""
    for name in RUN_FILES:
        target = path / name
        if target.is_dir():
            shutil.rmtree(target)
        else:
            target.unlink(missing_ok=True)
