"""What the docs and the Makefile promise matches the code: cited documents exist, output paths are the
ones written, TensorBoard is not served to the network unless asked, the README's links lead somewhere and the
documentation site builds with every link checked."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import make_environ

ROOT = Path(__file__).resolve().parents[1]
SOURCES = sorted({*ROOT.glob("*.py"), *ROOT.glob("parallel_ppo/**/*.py"), *ROOT.glob("tests/*.py"),
                  *ROOT.glob("scripts/*.py")})


def test_documents_cited_in_the_code_are_in_the_repository():
    """A docstring or comment that points a reader to a document (README.md, ...) points to one that exists."""
    missing, present = set(), {p.name for p in ROOT.glob("**/*.md")}  # one walk of the tree, not one per citation
    for path in SOURCES:
        for name in re.findall(r"\b([A-Z][A-Za-z_]*\.md)\b", path.read_text()):
            if name not in present:
                missing.add(f"{path.relative_to(ROOT)} cites {name}")
    assert not missing, sorted(missing)


def test_speed_check_directory_in_the_docs_is_the_one_written():
    """Both READMEs and the benchmarks page name the directory `make bench-speed` writes by default."""
    from parallel_ppo.cli.bench import SPEED_CHECK_DIR

    assert "<time>" in SPEED_CHECK_DIR
    for page in ("README.md", "docs/benchmarking.md"):
        text = (ROOT / page).read_text()
        row = next(line for line in text.splitlines() if line.startswith("| `make bench-speed`"))
        assert f"`{SPEED_CHECK_DIR}/`" in row, page
    bench_readme = (ROOT / "benchmarks" / "README.md").read_text()
    row = next(line for line in bench_readme.splitlines() if line.startswith("| `make bench-speed`"))
    assert f"`{SPEED_CHECK_DIR.removeprefix('benchmarks/')}/`" in row


@pytest.mark.skipif(shutil.which("make") is None, reason="needs make")
@pytest.mark.parametrize("host", [None, "0.0.0.0"])
def test_tensorboard_serves_this_machine_only_unless_asked(host):
    """`make tensorboard` binds to localhost; TB_HOST=0.0.0.0 (documented) opens it to the network."""
    args = ["make", "-n", "tensorboard"] + ([f"TB_HOST={host}"] if host else [])
    lines = subprocess.run(args, cwd=ROOT, env=make_environ(), capture_output=True, text=True,
                           check=True).stdout.splitlines()
    command = next(line for line in lines if "tensorboard --logdir" in line)
    assert "--bind_all" not in command
    assert f"--host {host or '127.0.0.1'}" in command
    if host:
        assert f"TB_HOST={host}" in (ROOT / "README.md").read_text()


def _install_command(env: dict[str, str], *assignments: str) -> str:
    """The pip line `make install` would run for a fresh virtual environment (make -n: nothing runs)."""
    out = subprocess.run(["make", "-n", "install", "VENV=/nonexistent/venv", f"PYTHON={sys.executable}", *assignments],
                         cwd=ROOT, env=env, capture_output=True, text=True, check=True).stdout  # PYTHON: no search
    return next(line for line in out.splitlines() if "pip install" in line and "-e " in line)


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
def test_make_install_adds_the_cpu_index_only_where_pip_has_no_sources_of_its_own(tmp_path):
    """No pip configuration: PyTorch's CPU index is an extra index. Sources in pip's configuration (a variable or a
    config file, as on our machines) are used alone; TORCH_INDEX overrides either way."""
    bare = {k: v for k, v in make_environ().items() if not k.startswith("PIP_")} | {"PIP_CONFIG_FILE": os.devnull}
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
    commands = subprocess.run(["make", "-n", "smoke", "VENV=.venv"], cwd=ROOT, env=make_environ(), capture_output=True,
                              text=True, check=True).stdout
    assert commands.count("--duration 10s") == 2 and "train_parallel_timed.py" in commands


LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")


def test_relative_links_in_the_readme_point_to_files_that_exist():
    """Every relative link and image of the README (the repository's front page, outside the site) names a file or
    folder of the repository."""
    targets = [t for t in LINK.findall((ROOT / "README.md").read_text())
               if not re.match(r"[a-z][a-z0-9+.-]*:", t) and not t.startswith("#")]
    assert any(t.startswith("docs/") for t in targets), "the README links to the guides"
    missing = [t for t in targets if not (ROOT / t.split("#", 1)[0]).exists()]
    assert not missing, missing


def _build_site(config: Path, site: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file", str(config),
                           "--site-dir", str(site)], capture_output=True, text=True, timeout=240,
                          env=os.environ | {"NO_MKDOCS_2_WARNING": "1"})


@pytest.mark.timeout(300)
def test_the_documentation_site_builds_with_every_link_checked(tmp_path):
    """`make docs` in a temporary folder: mkdocs --strict turns a broken link, a missing image, an unknown anchor or
    a page left out of the navigation (mkdocs.yml's validation settings) into a failed build."""
    proc = _build_site(ROOT / "mkdocs.yml", tmp_path / "site")
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert (tmp_path / "site" / "index.html").is_file() and (tmp_path / "site" / "training" / "index.html").is_file()


@pytest.mark.slow  # a second mkdocs build, of a copy of the pages
@pytest.mark.timeout(300)
def test_the_documentation_build_fails_on_a_broken_link_image_or_anchor(tmp_path):
    """The same settings on a copy of the pages with one broken link, one missing image and one unknown anchor."""
    shutil.copytree(ROOT / "docs", tmp_path / "docs")
    shutil.copy(ROOT / "mkdocs.yml", tmp_path / "mkdocs.yml")
    with (tmp_path / "docs" / "index.md").open("a") as page:
        page.write("\n[gone](no_such_page.md) ![plot](no_such_plot.png) [anchor](training.md#no-such-section)\n")
    proc = _build_site(tmp_path / "mkdocs.yml", tmp_path / "site")
    assert proc.returncode != 0
    for name in ("no_such_page.md", "no_such_plot.png", "no-such-section"):
        assert name in proc.stderr, (name, proc.stderr[-4000:])
