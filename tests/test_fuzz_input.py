"""Fuzz-style input checks: malformed YAML, CLI values and --set items give ConfigError / exit 2, never a traceback."""

from __future__ import annotations

import dataclasses
import random
import subprocess
import sys
from pathlib import Path

import pytest

from parallel_ppo.cli.common import default_config
from parallel_ppo.cli.train import run
from parallel_ppo.core.config import Config
from parallel_ppo.core.config_yaml import load_yaml
from parallel_ppo.core.configure import build_config
from parallel_ppo.errors import ConfigError

ROOT = Path(__file__).resolve().parents[1]

BAD_VALUES = ["abc", "", "[]", "{}", "[1, 2", "null", "-1", "-1e9", "0", "1e999", "-.inf", ".nan", "nan",
              "99999999999999999999999999", "true", "3.5", "{a: 1}", "'", "!!python/object:os.system ls",
              "\x00", "\u2603", "*alias", "&anchor", "0x7fffffffffffffffff"]


def _fields() -> list[str]:
    cfg = Config()
    return [f"{section.name}.{field.name}" for section in dataclasses.fields(cfg)
            for field in dataclasses.fields(getattr(cfg, section.name))]


def test_random_set_items_never_escape_as_other_errors():
    """Hundreds of random `--set key=value` items: each is either valid or a ConfigError, nothing else."""
    rng = random.Random(1234)
    keys = _fields() + ["training", "nosuch.key", "training.", ".n_steps", "training.n_steps.x", "=", ""]
    rejected = 0
    for _ in range(600):
        item = f"{rng.choice(keys)}={rng.choice(BAD_VALUES)}"
        try:
            build_config(None, {}, [item, "env.id=CartPole-v1"], parallel=rng.random() < 0.5)
        except ConfigError:
            rejected += 1
    assert rejected > 400, "most random items are malformed and must be rejected"


@pytest.mark.parametrize("text", [
    "", "   \n", "- a\n- b\n", "just a string", "42", "env: [1, 2]", "env:\n  id: [CartPole-v1]\n",
    "training:\n  n_steps: -5\n", "training:\n  n_steps: 1e999\n", "training:\n  batch_size: abc\n",
    "nosuch:\n  key: 1\n", "env:\n  nosuch: 1\n", "env: {id: CartPole-v1\n", "\t- bad indent",
    "training:\n  n_steps: !!python/object/apply:os.system ['true']\n", "[" * 5000, "a: &x [*x]\n",
    "run:\n  duration: .inf\n", "run:\n  seed: 99999999999999999999\n", "env:\n  num_envs: 1000000000\n",
])
def test_malformed_yaml_is_a_config_error(tmp_path, text):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError):
        build_config(str(path), {}, [], parallel=False)


def test_binary_and_directory_configs(tmp_path):
    binary = tmp_path / "binary.yaml"
    binary.write_bytes(bytes(range(256)) * 4)
    for path in (binary, tmp_path):
        with pytest.raises(ConfigError):
            build_config(str(path), {}, [], parallel=False)


CLI_CASES = [
    ["--seed", "abc"], ["--duration", "-1"], ["--duration", "nan"], ["--duration", "inf"], ["--duration", ""],
    ["--total-steps", "1e999"], ["--total-steps", "-5"], ["--batch-size", "0"], ["--batch-size", "3"],
    ["--num-envs", "-2"], ["--num-envs", "99999999"], ["--env", ""], ["--env", "NoSuchEnv-v9"],
    ["--set", "garbage"], ["--set", "training.n_steps=[1,2]"], ["--set", "model.impala_depths=[0]"],
    ["--config", "/nonexistent.yaml"], ["--unknown-flag"], ["positional"],
]


@pytest.mark.parametrize("args", CLI_CASES, ids=lambda a: " ".join(a) or "empty")
def test_malformed_cli_exits_2_with_one_line(tmp_path, capsys, args):
    """In-process through the trainers' command line (tests/test_cli.py runs the same paths as processes)."""
    out = tmp_path / "out"
    try:
        status = run(["--output-dir", str(out), *args], parallel=False, prog="train_timed.py")
    except SystemExit as e:  # argparse's exit for a malformed flag
        status = e.code
    err = capsys.readouterr().err
    assert status == 2, err
    assert len(err.strip().splitlines()) == 1 and err.startswith("train_timed.py: error:"), err
    assert not out.exists()


NAMED_CASES = {  # what a user gave → what the one line must name
    "negative duration": (["--duration", "-5m"], "argument --duration: must be a positive duration, got '-5m'"),
    "negative seed in a list": (["--seeds", "-1,2"], "--seeds must be non-negative whole numbers, got '-1,2'"),
    "-inf duration": (["--duration", "-inf"], "argument --duration: must be a positive duration, got '-inf'"),
    "config directory": (["--config", "{tmp}"], "is a directory"),
    "config not a file": (["--config", "/dev/null"], "config file /dev/null is not a regular file"),
    "duplicate key": (["--config", "{duplicate}"], "the key 'n_steps' is given twice (lines 2 and 3)"),
    "W&B flags without --track": (["--wandb-project", "p", "--wandb-tags", "a"],
                                  "tracking.project (--wandb-project) and tracking.tags (--wandb-tags) set up W&B "
                                  "tracking, which is off: turn on tracking.wandb (--track)"),
}


@pytest.mark.parametrize("case", NAMED_CASES)
def test_the_one_line_names_the_real_problem(tmp_path, capsys, case):
    """Each once passed silently (a key given twice, --wandb-* without --track) or was named as another problem
    (argparse's "expected one argument" for `-5m`, "not found" for a directory)."""
    (tmp_path / "duplicate.yaml").write_text("training:\n  n_steps: 8\n  n_steps: 16\n")
    args, words = NAMED_CASES[case]
    args = [a.format(tmp=tmp_path, duplicate=tmp_path / "duplicate.yaml") for a in args]
    out = tmp_path / "out"
    try:
        status = run(["--output-dir", str(out), *args], parallel=False, prog="train_timed.py")
    except SystemExit as e:
        status = e.code
    err = capsys.readouterr().err
    assert status == 2 and err.count("\n") == 1 and err.startswith("train_timed.py: error:"), err
    assert words in err
    assert not out.exists()


def test_a_merge_key_may_be_overridden(tmp_path):
    """YAML's `<<` brings keys in to be overridden: not a key given twice."""
    path = tmp_path / "merge.yaml"
    path.write_text("base: &base {n_steps: 64, n_epochs: 2}\ntraining:\n  <<: *base\n  n_steps: 32\n")
    assert load_yaml(path)["training"] == {"n_steps": 32, "n_epochs": 2}


@pytest.mark.parametrize("env_id, name", [(None, "ppo_parallel.yaml"), ("starpilot", "ppo_parallel.yaml"),
                                          ("CartPole-v1", "cartpole.yaml"), ("toy_envs:Reach-v0", "cartpole.yaml")])
def test_a_benchmark_of_another_env_takes_a_config_that_fits_it(env_id, name):
    """`bench scaling --env CartPole-v1` was refused: its default config, Procgen's, evaluates on held-out levels
    (and uses a CNN). Without --config, a gymnasium env takes its family's config."""
    path = default_config(env_id, "ppo_parallel.yaml")
    assert Path(path).name == name
    build_config(path, {"env.id": env_id}, [], parallel=True)


@pytest.mark.slow
@pytest.mark.parametrize("with_output_dir", [False, True])
def test_resume_of_a_missing_directory_says_so(tmp_path, with_output_dir):
    """`--resume /nonexistent` is reported as missing first, before any conflict with other flags."""
    extra = ["--output-dir", str(tmp_path / "out")] if with_output_dir else []
    proc = subprocess.run([sys.executable, "train_timed.py", "--resume", "/nonexistent", *extra], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip() == "train_timed.py: error: cannot resume: /nonexistent is not a directory"
