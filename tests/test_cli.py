"""train_timed.py user errors: one line on stderr, exit status 2, no traceback, nothing written."""

from __future__ import annotations

import pytest

TINY = ["--env", "CartPole-v1", "--num-envs", "2", "--set", "training.n_steps=8", "--batch-size", "8",
        "--set", "training.n_epochs=1", "--set", "model.mlp_hidden=[8]", "--set", "logging.progress=off"]

BAD_RUNS = {
    "bad flag": (["--bogus-flag"], "--bogus-flag"),
    "unknown key via --set": (["--set", "training.not_a_key=3"], "training.not_a_key"),
    "unknown key in YAML": (["--config", "{yaml_bad_key}"], "training.n_stepz"),
    "batch larger than rollout": (["--batch-size", "64"], "batch size 64"),
    "unknown game": (["--env", "starpylot"], "starpylot"),
    "missing config file": (["--config", "{missing}"], "not found"),
    "malformed config file": (["--config", "{yaml_malformed}"], "not valid YAML"),
}


@pytest.mark.parametrize("case", list(BAD_RUNS), ids=list(BAD_RUNS))
def test_user_error_is_one_line_exit_2(case, tmp_path, train_timed):
    """Each user error prints exactly one stderr line naming the problem, exits 2, and creates nothing."""
    (tmp_path / "bad_key.yaml").write_text("env:\n  id: CartPole-v1\ntraining:\n  n_stepz: 8\n")
    (tmp_path / "malformed.yaml").write_text("training: {n_steps: [1, 2\n")
    paths = {"yaml_bad_key": tmp_path / "bad_key.yaml", "missing": tmp_path / "nope.yaml",
             "yaml_malformed": tmp_path / "malformed.yaml"}
    extra, needle = BAD_RUNS[case]
    extra = [a.format(**paths) for a in extra]
    out_dir = tmp_path / "run"
    proc = train_timed(*TINY, "--output-dir", str(out_dir), "--total-steps", "16", *extra, timeout=120)

    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert needle in lines[0]
    assert lines[0].startswith("train_timed.py: error:")
    assert "Traceback" not in proc.stderr + proc.stdout
    assert not out_dir.exists()


def test_existing_run_is_refused_without_overwrite(tmp_path, train_timed):
    """A directory that already holds a run's file is refused (exit 2, one line) and left as it was."""
    out_dir = tmp_path / "run"
    out_dir.mkdir()
    existing = "metrics.csv"
    (out_dir / existing).write_text("earlier run\n")
    proc = train_timed(*TINY, "--output-dir", str(out_dir), "--total-steps", "16", timeout=120)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "--overwrite" in lines[0], proc.stderr
    assert "Traceback" not in proc.stderr
    assert sorted(p.name for p in out_dir.iterdir()) == [existing]
    assert (out_dir / existing).read_text() == "earlier run\n"


def test_output_dir_that_is_a_file_is_refused(tmp_path, train_timed):
    """--output-dir naming an existing file is a one-line error; the file is untouched."""
    target = tmp_path / "afile"
    target.write_text("keep")
    proc = train_timed(*TINY, "--output-dir", str(target), "--total-steps", "16", timeout=120)
    assert proc.returncode == 2
    assert len(proc.stderr.strip().splitlines()) == 1 and "not a directory" in proc.stderr
    assert target.read_text() == "keep"


def test_overwrite_replaces_an_earlier_run(tmp_path, train_timed):
    """With --overwrite the run goes ahead and the earlier run's files are replaced; other files stay."""
    out_dir = tmp_path / "run"
    out_dir.mkdir()
    (out_dir / "metrics.csv").write_text("stale\n")
    (out_dir / "notes.txt").write_text("mine\n")
    proc = train_timed(*TINY, "--output-dir", str(out_dir), "--total-steps", "16", "--overwrite", timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert (out_dir / "metrics.csv").read_text().startswith("update,env_steps,")
    assert (out_dir / "summary.json").is_file()
    assert (out_dir / "notes.txt").read_text() == "mine\n"
