"""The errors a user can cause, one type per kind: every entry point prints one as a single line (`PROG: error: ...`)
and exits with status 2, leaving nothing half-written. Beside them the runtime failures a user meets (`RunFailed`,
`WriteFailed`, `ExportMismatch`: one line, exit status 1) and `one_line`, how any error is said on one line."""

from __future__ import annotations

from pathlib import Path


class ParallelPPOError(Exception):
    """Base of the errors a user can cause: bad settings or bad input files (not a crash, not a lost peer)."""


class ConfigError(ParallelPPOError, ValueError):
    """Impossible, unknown or conflicting settings: a config file, a flag, a `--set`, a layout, an output
    directory that holds another run."""


class TrackingError(ConfigError):
    """W&B tracking that could not start (no login, a refused project): raised before the first update, with a new
    run's directory left as it was."""


class RunDataError(ParallelPPOError):
    """A run's files (config.yaml, metrics.csv, summary.json, checkpoint.pt, eval.json, a study's results) are
    missing, corrupt, or written by another version."""


class RunFailed(RuntimeError):
    """A run that stopped on an error (a worker that kept failing, a lost rank): not the user's input, so not a
    ParallelPPOError. Its checkpoint and summary.json are in `run_dir`, but where a rank was lost or the disk did not
    take them: the message then says whether a checkpoint written before stands. `run_dir` is None for a run whose
    workers or ranks failed to start: nothing was written."""

    def __init__(self, message: str, run_dir: Path | None) -> None:
        super().__init__(message)
        self.run_dir = run_dir


class WriteFailed(RuntimeError):
    """A file that could not be written (a full disk, a lost mount): a runtime failure, not the user's input. A run
    stops on it, each of its files written before as it was; the message names the file."""


class ExportMismatch(RuntimeError):
    """An exported policy file that does not reproduce the policy within the export's tolerance (nothing is
    written): a defect of the export, not the user's input."""


def one_line(error: BaseException, limit: int = 300) -> str:
    """`Type: message` of an error on one line (its lines joined), cut to about `limit` characters."""
    message = " ".join(str(error).split())
    text = f"{type(error).__name__}: {message}" if message else type(error).__name__
    return text if len(text) <= limit else text[:limit] + "…"
