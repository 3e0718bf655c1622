"""What the docs and the Makefile promise matches the code: cited documents exist, output paths are the
ones written, and TensorBoard is not served to the network unless asked."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SOURCES = sorted({*ROOT.glob("*.py"), *ROOT.glob("parallel_ppo/**/*.py"), *ROOT.glob("tests/*.py"),
                  *ROOT.glob("scripts/*.py")})


def test_documents_cited_in_the_code_are_in_the_repository():
    """A docstring or comment that points a reader to a document (README.md, ...) points to one that exists."""
    missing = set()
    for path in SOURCES:
        for name in re.findall(r"\b([A-Z][A-Za-z_]*\.md)\b", path.read_text()):
            if not list(ROOT.glob(f"**/{name}")):
                missing.add(f"{path.relative_to(ROOT)} cites {name}")
    assert not missing, sorted(missing)


def test_speed_check_directory_in_the_docs_is_the_one_written():
    """Both READMEs name the directory `make bench-speed` writes by default."""
    from parallel_ppo.cli.bench import SPEED_CHECK_DIR

    assert "<time>" in SPEED_CHECK_DIR
    readme = (ROOT / "README.md").read_text()
    row = next(line for line in readme.splitlines() if line.startswith("| `make bench-speed`"))
    assert f"`{SPEED_CHECK_DIR}/`" in row
    bench_readme = (ROOT / "benchmarks" / "README.md").read_text()
    row = next(line for line in bench_readme.splitlines() if line.startswith("| `make bench-speed`"))
    assert f"`{SPEED_CHECK_DIR.removeprefix('benchmarks/')}/`" in row


@pytest.mark.skipif(shutil.which("make") is None, reason="needs make")
@pytest.mark.parametrize("host", [None, "0.0.0.0"])
def test_tensorboard_serves_this_machine_only_unless_asked(host):
    """`make tensorboard` binds to localhost; TB_HOST=0.0.0.0 (documented) opens it to the network."""
    args = ["make", "-n", "tensorboard"] + ([f"TB_HOST={host}"] if host else [])
    lines = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, check=True).stdout.splitlines()
    command = next(line for line in lines if "tensorboard --logdir" in line)
    assert "--bind_all" not in command
    assert f"--host {host or '127.0.0.1'}" in command
    if host:
        assert f"TB_HOST={host}" in (ROOT / "README.md").read_text()
