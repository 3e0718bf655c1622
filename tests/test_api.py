"""The public API: README's "From Python" example run as written but for a tenth of its step budget (CartPole learned in
both modes, a policy that acts as the trainer's, evaluate and compare from Python), and its refusals before
anything starts."""

from __future__ import annotations

import inspect
import json
import os
import platform
import re
import subprocess
import sys
import typing
from pathlib import Path
from types import SimpleNamespace

import gymnasium as gym
import numpy as np
import pytest
import setproctitle
import torch
from fake_runs import write_run

import parallel_ppo as ppo
from parallel_ppo.core.allocator import release_freed_memory
from parallel_ppo.core.configure import build_config
from parallel_ppo.core.distributions import sample_actions
from parallel_ppo.core.model import autocast, build_model
from parallel_ppo.engines.parallel.worker import PRELOAD_ENV_VAR

ROOT = Path(__file__).resolve().parents[1]
STEPS = 10_240
"""The example runs here with a tenth of the config's 100k-step budget, to keep `make test` short (how well it learns
in the full budget is a benchmark's question: scripts/learning_matrix.py)."""
THRESHOLD = 50  # at 10,240 steps seeds 1-5 reached 88-107 (fp32) on our AMD EPYC; random play scores ~22


def readme_example() -> str:
    section = (ROOT / "README.md").read_text().split("## From Python", 1)[1]
    example = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    shorter = example.replace('overrides={"logging.tensorboard": False}',
                              f'overrides={{"logging.tensorboard": False, "run.total_steps": {STEPS}}}')
    assert shorter != example, "the README example no longer sets overrides as this test expects"
    return shorter


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_the_readme_example_trains_both_modes_and_acts_as_the_trainer(tmp_path):
    (tmp_path / "config").symlink_to(ROOT / "config")
    (tmp_path / "example.py").write_text(readme_example())
    proc = subprocess.run([sys.executable, "example.py"], cwd=tmp_path, capture_output=True, text=True, timeout=580)
    assert proc.returncode == 0, proc.stderr
    for mode in ("sequential", "parallel"):
        summary = json.loads((tmp_path / "benchmarks" / f"cartpole_{mode}" / "summary.json").read_text())
        assert summary["mode"] == mode and summary["stop_reason"] == "total_steps"
        assert STEPS <= summary["total_env_steps"] < STEPS + 256 and summary["episodes"] >= 20
        assert summary["episodic_return_mean"] >= THRESHOLD, (mode, summary["episodic_return_mean"])
    assert re.search(r"evaluation: \d+ over 10 episodes", proc.stdout), proc.stdout
    assert (tmp_path / "benchmarks" / "cartpole_comparison" / "comparison.json").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["benchmarks", "config", "example.py"], \
        "the example writes only under benchmarks/, which git ignores"

    # predict acts as the trainer's own network does (its precision, its sampling), on a batch and on one observation
    run_dir = tmp_path / "benchmarks" / "cartpole_parallel"
    policy = ppo.load_policy(run_dir, seed=7)
    network = build_model((4,), 2, policy.cfg.model)
    network.load_state_dict(torch.load(run_dir / "checkpoint.pt", weights_only=True)["model"])
    env = gym.make("CartPole-v1")
    obs = np.stack([env.reset(seed=s)[0] for s in range(64)]).astype(np.float32)
    with torch.no_grad(), autocast(policy.cfg.training.precision):
        logits = network(torch.from_numpy(obs))[0].float()
    assert np.array_equal(policy.predict(obs, deterministic=True), logits.argmax(-1).numpy())
    assert policy.predict(obs[3], deterministic=True).shape == ()
    assert policy.predict(obs[3], True) == logits[3].argmax().item()
    sampled = sample_actions(logits, np.random.default_rng(7).random(64))[0].numpy()
    assert np.array_equal(policy.predict(obs), sampled), "sampled as the trainer samples, from the policy's seed"
    assert ppo.evaluate(run_dir, episodes=2, num_envs=2).levels == "train", "a gymnasium env has no test levels"


def test_the_package_exports_its_api_without_loading_torch():
    code = ("import sys, parallel_ppo as p; names = dir(p); "
            "print('torch' in sys.modules, all(n in names for n in ('train', 'load_policy', 'evaluate', 'compare', "
            "'Config', 'ConfigError')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert out.stdout.split() == ["False", "True"]
    with pytest.raises(AttributeError):
        ppo.no_such_thing  # noqa: B018


def test_each_export_is_documented_as_the_code_has_it():
    """python.md names every export but the config's sections (it gives two as examples): build_config, the config
    loading's internal, is not one; compare's return is `ppo.Comparison`; ExportMismatch is among the package's
    errors; the documented first argument of each function is the code's."""
    documented = (ROOT / "docs" / "python.md").read_text()
    sections = {name for name in ppo.__all__ if name.endswith("Config") and name != "Config"}
    missing = [name for name in ppo.__all__ if name not in sections | {"__version__"}
               and not re.search(rf"\b{name}\b", documented)]
    assert not missing and "build_config" not in ppo.__all__, missing
    assert typing.get_type_hints(ppo.compare)["return"] is ppo.Comparison
    assert typing.get_type_hints(ppo.load_run)["path"] == str | Path
    assert ppo.ExportMismatch.__module__ == "parallel_ppo.errors" and issubclass(ppo.ExportMismatch, RuntimeError)
    for name in ("train", "load_policy", "evaluate", "export"):
        first = next(iter(inspect.signature(getattr(ppo, name)).parameters))
        assert f"`{name}({first}" in documented and f"`{name}({first}" in ppo.__doc__, name


@pytest.mark.parametrize("kwargs, message", [
    ({"mode": "distributed"}, "mode must be one of"),
    ({"overrides": {"training.batch_size": 7}}, "does not divide the rollout"),
    ({"overrides": {"env.nope": 1}}, "unknown config key"),
])
def test_bad_settings_raise_config_error_before_anything_starts(tmp_path, kwargs, message):
    with pytest.raises(ppo.ConfigError, match=message):
        ppo.train("config/cartpole.yaml" if "overrides" in kwargs else None, output_dir=tmp_path / "run", **kwargs)
    assert not (tmp_path / "run").exists()


def _section_gone() -> ppo.Config:
    cfg = ppo.Config()
    cfg.env = None
    return cfg


def _ill_typed() -> ppo.Config:
    cfg = ppo.Config()
    cfg.training.gamma = "high"
    return cfg


CARTPOLE = str(ROOT / "config" / "cartpole.yaml")
WRONG_ARGUMENTS = {  # each raised TypeError, AttributeError or ValueError from inside, or was misread
    "a number for the config": (lambda out: ppo.train(123, output_dir=out), "config must be a YAML file's path, a "
                                "Config or None, got int"),
    "a string for overwrite (read as True)": (lambda out: ppo.train(CARTPOLE, output_dir=out, overwrite="no"),
                                              "overwrite must be True or False, got 'no'"),
    "an empty output_dir (the default used)": (lambda out: ppo.train(CARTPOLE, output_dir=""),
                                               "output_dir: an empty path"),
    "a --set item for overrides": (lambda out: ppo.train(CARTPOLE, output_dir=out, overrides="run.seed=2"),
                                   "overrides must be a mapping of 'section.key' names to values"),
    "a section replaced": (lambda out: ppo.train(_section_gone(), output_dir=out),
                           "config section env must be EnvConfig, got NoneType"),
    "an ill-typed field of a Config (not named as a file's)": (lambda out: ppo.train(_ill_typed(), output_dir=out),
                                                              "the Config given: training.gamma must be a number"),
    "a number for a policy": (lambda out: ppo.load_policy(123), "where must be a Run, a run directory or a "
                              "checkpoint file, got int"),
    "a negative seed": (lambda out: ppo.load_policy(out, seed=-1), "seed must be a whole number of at least 0"),
    "a fraction of episodes": (lambda out: ppo.evaluate(out, episodes=1.5), "episodes must be a whole number of at "
                               "least 1, got 1.5"),
    "an unknown export format": (lambda out: ppo.export(out, format="xyz"), "export format must be one of onnx, "
                                 "torchscript"),
    "a string for the runs": (lambda out: ppo.compare("runs/a"), "runs (and references) must be mappings"),
    "a number for a run": (lambda out: ppo.compare({"a": 123, "b": out}), "run a must be a path"),
    "a file for the output_dir": (lambda out: ppo.compare({"a": out, "b": out}, output_dir=CARTPOLE),
                                  "cartpole.yaml is not a directory"),
    "text for the threshold": (lambda out: ppo.compare({"a": out, "b": out}, threshold="x"),
                               "threshold must be a number a float holds, got 'x'"),
    "a number no float holds": (lambda out: ppo.compare({"a": out, "b": out}, at_steps=10**400),
                                "at_steps must be a number a float holds, got 1000"),
    "a label that is no string": (lambda out: ppo.compare({0: out, "b": out}), "a label must be a string, got 0"),
    "an empty label": (lambda out: ppo.compare({" ": out, "b": out}), "a label must not be empty, got ' '"),
    "a number for a run directory": (lambda out: ppo.load_run("a", 5), "path must be a path (a str, bytes or "
                                     "pathlib.Path), got int"),
    "a number for a run's label (kept as the label)": (lambda out: ppo.load_run(5, out),
                                                        "label must be a string, got 5"),
    "an empty label for a run": (lambda out: ppo.load_run("", out), "label must not be empty, got ''"),
    "levels 0 (read as auto)": (lambda out: ppo.evaluate(out, levels=0), "levels must be auto, train or test, got 0"),
    "empty levels (read as auto)": (lambda out: ppo.evaluate(out, levels=""),
                                    "levels must be auto, train or test, got ''"),
}


@pytest.mark.parametrize("case", WRONG_ARGUMENTS)
def test_an_argument_of_the_wrong_kind_is_a_config_error_before_any_work(tmp_path, monkeypatch, case):
    def started(*args: object) -> None:  # an argument let through must not train here
        raise AssertionError("the argument was not refused before the run started")

    monkeypatch.setattr("parallel_ppo.launch.join", started)
    call, message = WRONG_ARGUMENTS[case]
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ppo.ConfigError, match=re.escape(message)):
        call(tmp_path / "run")
    assert not list(tmp_path.iterdir())


def test_numpy_numbers_and_any_iterable_of_run_directories_are_taken(tmp_path):
    seeds = [write_run(tmp_path / "a" / f"seed_{seed}", seed=seed) for seed in (1, 2)]
    cmp = ppo.compare({"a": (path for path in seeds), "b": write_run(tmp_path / "b")}, threshold=np.float32(15),
                      at_steps=np.int64(2048), output_dir=tmp_path / "out")
    assert [g.label for g in cmp.groups] == ["a", "b"] and len(cmp.groups[0].runs) == 2
    assert cmp.threshold == 15 and cmp.equal_steps == 2048
    assert json.loads((tmp_path / "out" / "comparison.json").read_text())["return_threshold"] == 15


def test_numpy_numbers_in_overrides_are_taken_as_python_numbers(monkeypatch):
    class Built(Exception):
        pass

    def built(cfg, distributed):  # the config as the run would start with it
        raise Built(cfg)

    monkeypatch.setattr("parallel_ppo.launch.join", built)
    with pytest.raises(Built) as caught:
        ppo.train(CARTPOLE, mode="parallel", overrides={"parallel.num_workers": np.int64(2), "run.seed": np.uint8(3),
                                                        "parallel.sync_fraction": np.float32(0.5),
                                                        "parallel.overlap": np.bool_(True),
                                                        "model.mlp_hidden": [np.int64(8), 8]}, verbose=False)
    cfg = caught.value.args[0]
    assert (cfg.parallel.num_workers, cfg.run.seed, cfg.parallel.sync_fraction, cfg.model.mlp_hidden) == (2, 3, 0.5,
                                                                                                         [8, 8])
    assert cfg.parallel.overlap is True and type(cfg.parallel.num_workers) is int


def test_a_run_trained_in_the_current_directory_is_named_for_it(tmp_path, monkeypatch):
    """output_dir "." (whose Path has no name): the Run's label is the directory's name, not an empty one."""
    write_run(tmp_path / "here")
    monkeypatch.chdir(tmp_path / "here")
    monkeypatch.setattr("parallel_ppo.api.prepare", lambda request: SimpleNamespace(
        plan=SimpleNamespace(run_dir=Path(request.flags["run.output_dir"]))))
    monkeypatch.setattr("parallel_ppo.api.execute", lambda prepared, prog, interrupt: (
        {"stop_reason": "total_steps", "updates": 3}, 0))
    assert ppo.train(output_dir=".", verbose=False).label == "here"


def test_a_run_whose_envs_cannot_start_raises_run_failed_with_nothing_written(tmp_path):
    """Envs that fail to start (in the workers, or the sequential trainer's) stop `train` before anything is
    written: RunFailed, as for any run that stopped on an error, with no run directory (it raised the engine's own
    RolloutError, which a sweep catching RunFailed did not catch)."""
    with pytest.raises(ppo.RunFailed, match="^the run did not start: the envs of toy_envs:UnreachableReach-v0 failed "
                                            "to start: ConnectionError") as caught:
        ppo.train(CARTPOLE, output_dir=tmp_path / "run", verbose=False, overrides={
            "env.id": "toy_envs:UnreachableReach-v0", "run.limit_seconds": 0, "logging.tensorboard": False})
    assert caught.value.run_dir is None and not (tmp_path / "run").exists()


def test_a_config_built_in_code_is_validated_like_a_file():
    cfg = ppo.Config(env=ppo.EnvConfig(id="CartPole-v1", num_envs=4), training=ppo.TrainingConfig(batch_size=3))
    with pytest.raises(ppo.ConfigError, match="batch size 3 does not divide"):
        build_config(cfg, {}, [], parallel=False)
    good = build_config(ppo.Config(env=ppo.EnvConfig(id="CartPole-v1", num_envs=4)), {}, [], parallel=False)
    assert good.env.num_envs == 4 and good.training.batch_size == 256 and good is not cfg


def test_predict_takes_one_observation_or_a_batch_and_refuses_other_shapes(tmp_path):
    cfg = build_config(None, {"env.id": "CartPole-v1"}, ["training.precision=fp32"], parallel=False)
    policy = ppo.Policy(cfg, build_model((4,), 2, cfg.model), tmp_path / "checkpoint.pt", {})
    assert policy.predict(np.zeros(4)).shape == () and policy.predict(np.zeros((5, 4))).shape == (5,)
    with pytest.raises(ppo.ConfigError, match=r"shape \(4,\) or a batch of them, got shape \(5,\)"):
        policy.predict(np.zeros(5))
    with pytest.raises(ppo.ConfigError, match="deterministic must be True or False, got 'no'"):  # not read as True
        policy.predict(np.zeros(4), deterministic="no")
    procgen = ppo.Policy(build_config(None, {}, ["training.precision=fp32"], parallel=False), None, tmp_path, {})
    with pytest.raises(ppo.ConfigError, match="expects uint8 observations"):
        procgen.predict(np.zeros((64, 64, 3), dtype=np.float32))
    with pytest.raises(ppo.ConfigError, match=r"outside uint8's 0..255 \(from 300 to 300\), which it would wrap"):
        procgen.predict(np.full((64, 64, 3), 300, dtype=np.uint16))  # was read as 44
    with pytest.raises(ppo.RunDataError, match="checkpoint not found"):
        ppo.load_policy(tmp_path / "nothing")


def test_the_console_command_lists_its_commands_and_refuses_others():
    help_ = subprocess.run([sys.executable, "-m", "parallel_ppo", "--help"], capture_output=True, text=True, cwd=ROOT)
    assert help_.returncode == 0
    assert all(c in help_.stdout for c in ("train", "train-parallel", "eval", "demo", "compare", "bench"))
    bad = subprocess.run([sys.executable, "-m", "parallel_ppo", "fly"], capture_output=True, text=True, cwd=ROOT)
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "unknown command 'fly'" in bad.stderr
    version = subprocess.run([sys.executable, "-m", "parallel_ppo", "--version"], capture_output=True, text=True,
                             cwd=ROOT)
    assert (version.returncode, version.stdout) == (0, f"python -m parallel_ppo {ppo.__version__}\n")
    assert f'\nversion = "{ppo.__version__}"\n' in (ROOT / "pyproject.toml").read_text()  # one version, two places


def test_a_corrupt_config_yaml_is_a_run_data_error_naming_it(tmp_path):
    run = write_run(tmp_path / "run")
    (run / "config.yaml").write_text("env:\n  nope: 1\n")
    with pytest.raises(ppo.RunDataError, match=r"run/config.yaml: unknown config key 'env.nope'"):
        ppo.load_run("run", run)


@pytest.fixture(scope="module")
def caller_state(tmp_path_factory):
    """A notebook's process around one short parallel `train`: torch's random state and the process title before and
    after, the environment after, and what `release_freed_memory` returned each time the run called it. CartPole is
    given a family preload, as Procgen's games have, so that the forkserver is named an env to preload."""
    torch.manual_seed(1234)
    before = {"random": torch.get_rng_state(), "title": setproctitle.getproctitle()}
    released = []
    with pytest.MonkeyPatch.context() as patch:
        patch.delenv(PRELOAD_ENV_VAR, raising=False)
        patch.setattr("parallel_ppo.api.release_freed_memory", lambda: released.append(release_freed_memory()))
        patch.setattr("parallel_ppo.engines.parallel.coordinator.family_of", lambda env_id: SimpleNamespace(
            preload=lambda env_id: None))
        ppo.train(CARTPOLE, mode="parallel", output_dir=tmp_path_factory.mktemp("run"), verbose=False,
                  overrides={"run.total_steps": 256, "run.limit_seconds": 0, "logging.tensorboard": False})
        after = {"random": torch.get_rng_state(), "title": setproctitle.getproctitle(), "environ": dict(os.environ),
                 "released": released}
    return before, after


@pytest.mark.slow
def test_train_leaves_the_callers_torch_random_state_as_it_was(caller_state):
    """The run seeds torch's generator with run.seed (and draws from it): the caller's stream goes on unchanged."""
    before, after = caller_state
    assert torch.equal(after["random"], before["random"])


@pytest.mark.slow
def test_a_parallel_train_leaves_the_callers_title_and_environment_as_they_were(caller_state):
    """The coordinator's process title (`ps`) and the env it names to the forkserver are the run's alone."""
    before, after = caller_state
    assert after["title"] == before["title"]
    assert PRELOAD_ENV_VAR not in after["environ"]


@pytest.mark.slow
def test_train_gives_glibc_its_starting_thresholds_back(caller_state):
    """The run keeps freed memory for its steps (`retain_freed_memory`); `train` undoes that once before it returns
    (what the undoing does to glibc, in a fresh process: test_resources)."""
    _, after = caller_state
    assert after["released"] == [platform.libc_ver()[0] == "glibc"]
