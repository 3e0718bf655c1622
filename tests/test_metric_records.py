"""Metrics are declared where their values are computed (`core.metrics`): a metric added there, in one line, reaches
metrics.csv, TensorBoard and summary.json as declared; a key nobody declared stops the run naming it; and an env
is built once per env before the first rollout (plus at most once for its spaces)."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import parallel_ppo as ppo
from parallel_ppo.core import metrics
from parallel_ppo.core import ppo as ppo_update_module
from parallel_ppo.runs.metrics import metric_columns

ROOT = Path(__file__).resolve().parents[1]
CARTPOLE = str(ROOT / "config" / "cartpole.yaml")
TINY = {"run.total_steps": 2 * 16 * 8, "env.num_envs": 8, "training.n_steps": 16, "training.batch_size": 64,
        "run.limit_seconds": 0, "training.precision": "fp32", "training.microbatch_size": 0}
"""Two updates of CartPole, nothing measured before."""


def test_every_metric_is_namespaced_and_every_column_is_declared_once():
    columns = metric_columns()
    assert len(columns) == len(set(columns))
    assert columns[:3] == ["update", "env_steps", "wall_time"]
    assert {"sps", "episodic_return_mean", "approx_kl", "clipfrac", "ratio_mean", "time_env", "cpu_percent",
            "rss_mb", "test_return_mean"} <= set(columns)
    assert all("/" in key for key in metrics.REGISTRY)
    assert metrics.declared("system/worker3_cpu_percent").column is None  # numbered keys: TensorBoard only
    for wrong in ("system/worker1_main_cpu_percent", "system/worker1/x_cpu_percent", "system/workerx_cpu_percent"):
        with pytest.raises(KeyError, match="never declared"):
            metrics.declared(wrong)
    with pytest.raises(KeyError, match="'losses/nobody_declared_me' was never declared"):
        metrics.declared("losses/nobody_declared_me")
    with pytest.raises(ValueError, match="namespace/name"):
        metrics.metric("no_namespace", "a key without its namespace")


def test_a_second_metric_for_one_column_is_refused(monkeypatch):
    monkeypatch.setattr(metrics, "REGISTRY", dict(metrics.REGISTRY))
    with pytest.raises(ValueError, match="already has a column 'entropy'"):
        metrics.metric("charts/entropy", "another entropy")


@pytest.mark.slow  # a Python that imports torch and the trainer
def test_the_column_order_does_not_depend_on_the_import_order():
    code = ("import parallel_ppo.core.evaluate, parallel_ppo.runs.training; "
            "from parallel_ppo.runs.metrics import metric_columns; print(','.join(metric_columns()))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert out.stdout.strip().split(",") == metric_columns()


@pytest.fixture
def extra_metric(monkeypatch):
    """`losses/ratio_spread` added in one line (`metric(...)`) where the update computes its statistics; returns
    the key. The registry is restored afterwards."""
    monkeypatch.setattr(metrics, "REGISTRY", dict(metrics.REGISTRY))
    key = metrics.metric("losses/ratio_spread", "|ratio − 1|, mean over minibatches (a test's metric)", summary=True)
    update = ppo_update_module.ppo_update

    def with_spread(*args, **kwargs):
        stats = update(*args, **kwargs)
        return {**stats, key: abs(stats[ppo_update_module.RATIO_MEAN] - 1) + 1.0}  # the value born here

    monkeypatch.setattr("parallel_ppo.core.loop.ppo_update", with_spread)
    return key


def test_a_metric_declared_in_one_place_reaches_csv_tensorboard_and_summary(tmp_path, extra_metric):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run = ppo.train(CARTPOLE, output_dir=tmp_path / "run", overrides=TINY, verbose=False)
    with open(run.path / "metrics.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 2 and all(float(r["ratio_spread"]) >= 1.0 for r in rows)
    assert all(float(r["ratio_mean"]) > 0 for r in rows)  # computed by the loss, and now written too
    acc = EventAccumulator(str(run.path / "logs"))
    acc.Reload()
    assert {extra_metric, "losses/ratio_mean", "charts/SPS", "time/update"} <= set(acc.Tags()["scalars"])
    assert [e.step for e in acc.Scalars(extra_metric)] == [int(r["env_steps"]) for r in rows]
    summary = json.loads((run.path / "summary.json").read_text())
    assert summary["final_metrics"]["ratio_spread"] == pytest.approx(float(rows[-1]["ratio_spread"]), rel=1e-5)
    assert "sps" not in summary["final_metrics"]  # only what is declared for the summary


def test_an_undeclared_key_stops_the_run_naming_it(tmp_path, monkeypatch):
    update = ppo_update_module.ppo_update
    monkeypatch.setattr("parallel_ppo.core.loop.ppo_update",
                        lambda *a, **k: {**update(*a, **k), "losses/forgotten": 1.0})
    with pytest.raises(ppo.RunFailed, match="logging the metrics after update 1 failed: KeyError: \"metric "
                                            "'losses/forgotten' was never declared"):
        ppo.train(CARTPOLE, output_dir=tmp_path / "run", overrides=TINY, verbose=False)
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["updates"] == 1  # its files written


COUNTING_ENV = '''
import os
import gymnasium
from gymnasium.envs.classic_control import CartPoleEnv

COUNT_FILE = {count_file!r}


class CountedCartPole(CartPoleEnv):
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        with open(COUNT_FILE, "a") as f:
            f.write(f"{{os.getpid()}}\\n")


gymnasium.register("CountedCartPole-v0", entry_point=CountedCartPole, max_episode_steps=500)
'''


@pytest.mark.parametrize("mode", ["sequential", pytest.param("parallel", marks=pytest.mark.slow)])  # workers
def test_each_env_is_built_once_before_the_first_rollout(tmp_path, monkeypatch, mode):
    """One construction per env, plus at most one for its spaces, in every process together (the parallel
    workers build theirs in their own processes, seen through the file they append to: named in the module, since a
    forkserver another test of this process started keeps the environment it started with)."""
    count_file = tmp_path / "constructions"
    (tmp_path / "counted_env.py").write_text(COUNTING_ENV.format(count_file=str(count_file)))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]))
    layout = {"parallel.num_workers": 2, "parallel.num_envs_per_worker": 4} if mode == "parallel" else {}
    overrides = {**TINY, "env.id": "counted_env:CountedCartPole-v0", "run.total_steps": 16 * 8, **layout,
                 "logging.tensorboard": False}
    if mode == "parallel":
        del overrides["env.num_envs"]
    ppo.train(CARTPOLE, mode=mode, output_dir=tmp_path / "run", overrides=overrides, verbose=False)
    constructions = count_file.read_text().split()
    assert 8 <= len(constructions) <= 8 + 1, constructions


def test_the_run_directory_contract_lists_every_declared_metric():
    text = (ROOT / "docs" / "run-directory.md").read_text()
    table = text.split("<!-- metrics table: generated from the declarations -->\n", 1)[1].split("<!-- /metrics", 1)[0]
    assert table == metrics.markdown_table(), "docs/run-directory.md's metrics table differs from the declarations"
