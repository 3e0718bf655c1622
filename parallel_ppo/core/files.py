"""Result files written atomically (temp file + fsync + rename), so a reader never sees half a file; no torch."""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

from parallel_ppo.errors import ConfigError, WriteFailed, one_line


def current_umask() -> int:
    """The process's umask, read from /proc where it can be (setting it to read it is not thread-safe)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except OSError:
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def atomic_write(path: Path, write: Callable[[IO[bytes]], Any]) -> None:
    """Call `write(file_object)` on a temp file beside `path`, fsync it, then rename it over `path`."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(fd, 0o666 & ~current_umask())  # mkstemp makes it 0600; a file written in place would not be
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


@contextlib.contextmanager
def writing(path: Path, kinds: tuple[type[BaseException], ...] = (OSError,)) -> Iterator[None]:
    """An error of `kinds` (an OSError: a full disk) writing `path` as WriteFailed naming it."""
    try:
        yield
    except kinds as e:
        raise WriteFailed(f"could not write {path}: {one_line(e)}") from e


@contextlib.contextmanager
def new_folders(folder: Path) -> Iterator[None]:
    """Create `folder` and its missing parents; where the block within fails, remove again those it created that
    are still empty, so that a failed write leaves nothing behind."""
    missing, ancestor = [], Path(folder).absolute()
    while not ancestor.exists():
        missing.append(ancestor)  # deepest first
        ancestor = ancestor.parent
    Path(folder).mkdir(parents=True, exist_ok=True)
    try:
        yield
    except BaseException:
        for made in missing:
            with contextlib.suppress(OSError):  # not empty, or gone: left as it is
                made.rmdir()
        raise


def write_json(path: Path, data: dict) -> None:
    """`data` as indented JSON, atomically; NaN and infinity are refused (they are not JSON)."""
    atomic_write(path, lambda f: f.write((json.dumps(data, indent=2, allow_nan=False, default=str) + "\n").encode()))


def read_evidence(path: Path) -> dict[str, Any]:
    """An evidence file (docs/results' JSON): an object whose `figures` and `tables`, where given, are objects;
    ValueError naming the file otherwise (OSError where it cannot be read)."""
    try:
        data = json.loads(Path(path).read_text())
    except ValueError as error:  # JSONDecodeError, or bytes that are not UTF-8
        raise ValueError(f"{path} is not JSON ({error})") from None
    parts = [data.get(key, {}) for key in ("figures", "tables")] if isinstance(data, dict) else [None]
    if not all(isinstance(part, dict) for part in parts):
        raise ValueError(f"{path} is not an evidence file (an object, its figures and tables objects)")
    return data


def write_text(path: Path, text: str) -> None:
    """`text` as UTF-8, atomically."""
    atomic_write(path, lambda f: f.write(text.encode()))


NAME_MAX, PATH_MAX = 255, 4096
"""Bytes in a file or folder name, and in a whole path, that Linux's file systems and calls take (ext4, xfs, tmpfs)."""


def path_problem(path: str | Path) -> str | None:
    """What makes `path` no path to give: empty (which would mean the current directory, or a default, unseen), or
    one no file system takes (too long a name, or too long a whole); None where it is fine."""
    if not str(path).strip():
        return "an empty path; give one or leave it out"
    size = len(os.fsencode(str(path)))
    if size >= PATH_MAX:
        return f"a path of {size:,} bytes, longer than the {PATH_MAX - 1:,} a file system takes"
    for part in Path(path).parts:
        if (size := len(os.fsencode(part))) > NAME_MAX:
            return f"a name of {size:,} bytes ({part[:20]}...), longer than the {NAME_MAX} a file system takes"
    return None


def resolved(path: Path, what: str) -> Path:
    """`path` absolute, its symbolic links followed; ConfigError naming `what` (`output directory`) for a loop."""
    try:
        return path.resolve()
    except (OSError, RuntimeError) as e:
        raise ConfigError(f"{what} {path}: {e}") from None
