"""What the docs and the Makefile promise matches the code: cited documents exist, output paths are the
ones written, and TensorBoard is not served to the network unless asked."""

from __future__ import annotations

import os
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


def _install_command(env: dict[str, str], *assignments: str) -> str:
    """The pip line `make install` would run for a fresh virtual environment (make -n: nothing runs)."""
    out = subprocess.run(["make", "-n", "install", "VENV=/nonexistent/venv", *assignments], cwd=ROOT, env=env,
                         capture_output=True, text=True, check=True).stdout
    return next(line for line in out.splitlines() if "pip install" in line and "-e " in line)


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
def test_make_install_adds_the_cpu_index_only_where_pip_has_no_sources_of_its_own(tmp_path):
    """No pip configuration: PyTorch's CPU index is an extra index. Sources in pip's configuration (a variable or a
    config file, as on our machines) are used alone; TORCH_INDEX overrides either way."""
    bare = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")} | {"PIP_CONFIG_FILE": os.devnull}
    assert "--extra-index-url https://download.pytorch.org/whl/cpu -e" in _install_command(bare)
    assert "--extra-index-url" not in _install_command(bare | {"PIP_FIND_LINKS": str(tmp_path)})
    config = tmp_path / "pip.conf"
    config.write_text("[global]\nindex-url = https://mirror.example/simple\n")
    assert "--extra-index-url" not in _install_command(bare | {"PIP_CONFIG_FILE": str(config)})
    assert "--extra-index-url https://x.example/cu128 -e" in _install_command(
        bare | {"PIP_CONFIG_FILE": str(config)}, "TORCH_INDEX=https://x.example/cu128")
    assert "--extra-index-url" not in _install_command(bare, "TORCH_INDEX=none")


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
def test_the_quick_start_proves_the_install_with_a_short_run_first():
    """The README's quick start names `make smoke`, whose two runs are bounded to seconds, not hours."""
    quick_start = (ROOT / "README.md").read_text().split("## Quick start", 1)[1].split("\n## ", 1)[0]
    assert "make smoke" in quick_start
    commands = subprocess.run(["make", "-n", "smoke", "VENV=.venv"], cwd=ROOT, capture_output=True, text=True,
                              check=True).stdout
    assert commands.count("--duration 10s") == 2 and "train_parallel_timed.py" in commands
