"""Short real runs (CartPole, Procgen starpilot) write every file of the run-directory contract."""

from __future__ import annotations

import csv
import dataclasses
import json
import math
import os
import platform
from dataclasses import dataclass
from pathlib import Path

import gymnasium
import numpy
import pytest
import torch
import yaml

from parallel_ppo.cli.train import make_parser, request_of
from parallel_ppo.core.checkpoint import load_checkpoint
from parallel_ppo.core.config import Config
from parallel_ppo.core.configure import build_config, config_from_dict
from parallel_ppo.core.model import build_model
from parallel_ppo.envs.batch import make_batch_env
from parallel_ppo.runs.metrics import metric_columns
from parallel_ppo.runs.reading import load_run
from parallel_ppo.runs.summary import RunSummary
from parallel_ppo.tuning.learner_settings import LearnerChoice, cpu_has_native_bf16
from parallel_ppo.tuning.learner_threads import ThreadChoice

pytestmark = pytest.mark.slow  # every test here trains or starts trainers

CONTRACT_COLUMNS = [
    "update", "env_steps", "wall_time", "sps", "episodic_return_mean", "episodic_length_mean", "policy_loss",
    "value_loss", "entropy", "approx_kl", "clipfrac", "explained_variance", "learning_rate", "time_env",
    "time_inference", "time_sync", "time_gae", "time_update", "cpu_percent", "rss_mb",
]
"""metrics.csv columns of the output contract (docs/run-directory.md)."""

SUMMARY_FIELDS = [f.name for f in dataclasses.fields(RunSummary)]
"""Every field of the typed summary (the contract's fields among them) is written."""
HARDWARE_FIELDS = ["cpu_model", "logical_cores", "physical_cores", "memory_gb", "cpu_kind", "cpu_family"]
VERSION_FIELDS = ["python", "torch", "numpy", "procgen", "gymnasium", "mujoco", "robosuite"]

RUNS = {
    "cartpole": ["--config", "config/cartpole.yaml", "--total-steps", "2048", "--seed", "3"],
    "starpilot": ["--env", "starpilot", "--num-envs", "2", "--batch-size", "16", "--total-steps", "32",
                  "--set", "training.n_steps=8", "--set", "training.n_epochs=1",
                  "--set", "run.limit_seconds=1"],  # every measurement still runs, for a second instead of ten
}


@dataclass
class Run:
    name: str
    args: list[str]
    dir: Path
    stdout: str

    @property
    def microbatch(self) -> int | str:
        """cartpole.yaml fixes the whole minibatch; the defaults leave it auto (and 16 has no smaller chunk)."""
        return 0 if self.name == "cartpole" else "auto"

    def expected_config(self) -> Config:
        """The config the same command line resolves to, built in-process."""
        request = request_of(make_parser("train_timed.py", parallel=False).parse_args(self.args), parallel=False)
        config = request.config and str(Path(__file__).resolve().parent.parent / request.config)
        return build_config(config, request.flags, list(request.sets), parallel=False)

    @property
    def summary(self) -> dict:
        return json.loads((self.dir / "summary.json").read_text())

    @property
    def rows(self) -> list[dict[str, str]]:
        with open(self.dir / "metrics.csv", newline="") as f:
            return list(csv.DictReader(f))


@pytest.fixture(scope="module", params=list(RUNS))
def run(request, tmp_path_factory, train_timed) -> Run:
    """One finished training run per env kind (run once per module)."""
    out = tmp_path_factory.mktemp(request.param) / "run"
    args = [*RUNS[request.param], "--output-dir", str(out)]
    proc = train_timed(*args, timeout=600)
    assert proc.returncode == 0, proc.stderr
    return Run(request.param, args, out, proc.stdout)


def test_run_directory_holds_every_contract_file(run):
    """config.yaml, metrics.csv, logs/ (with event files), checkpoint.pt and summary.json all exist."""
    for name in ("config.yaml", "metrics.csv", "checkpoint.pt", "summary.json"):
        assert (run.dir / name).is_file(), name
    assert list((run.dir / "logs").glob("events.out.tfevents.*"))


def test_every_file_takes_the_umask(run):
    """Files written atomically (checkpoint, summary, config) get the permissions the umask gives, as metrics.csv
    does, not mkstemp's 0600: another account, TensorBoard or a CI user can read them all."""
    umask = os.umask(0o022)
    os.umask(umask)
    modes = {p.name: p.stat().st_mode & 0o777 for p in run.dir.iterdir() if p.is_file()}
    assert set(modes.values()) == {0o666 & ~umask}, modes


def test_no_leftover_temp_files(run):
    """Atomic writes leave no temp files (hidden names or *.tmp) anywhere in the run directory."""
    leftovers = [p for p in run.dir.rglob("*") if p.name.startswith(".") or p.name.endswith(".tmp")]
    assert leftovers == []


def test_config_yaml_loads_back_to_the_same_config(run):
    """config.yaml is the resolved config: it rebuilds to what the command line resolves to."""
    stored = yaml.safe_load((run.dir / "config.yaml").read_text())
    cfg = config_from_dict(stored)
    expected = run.expected_config()
    expected.run.output_dir = str(run.dir)
    assert (expected.training.precision, expected.training.microbatch_size) == ("auto", run.microbatch)
    learner = run.summary["learner"]  # `auto` is stored as what it resolved to, so a resume trains the same way
    expected.training.precision, expected.training.device = learner["precision"], learner["device"]
    expected.training.microbatch_size = learner["microbatch_size"]
    assert cfg == expected
    assert cfg.to_dict() == stored


def test_metrics_csv(run):
    """Every required column, one row per update, env_steps rising by one rollout per row, sane values."""
    with open(run.dir / "metrics.csv", newline="") as f:
        header = next(csv.reader(f))
    assert set(CONTRACT_COLUMNS) <= set(header)
    assert header == metric_columns()
    rows, summary = run.rows, run.summary
    rollout = run.expected_config().rollout_size
    assert len(rows) == summary["updates"] >= 2
    assert [int(r["update"]) for r in rows] == list(range(1, len(rows) + 1))
    assert [int(r["env_steps"]) for r in rows] == [rollout * i for i in range(1, len(rows) + 1)]
    walls = [float(r["wall_time"]) for r in rows]
    assert all(b > a for a, b in zip(walls, walls[1:], strict=False))
    for r in rows:
        assert float(r["sps"]) > 0
        for col in ("policy_loss", "value_loss", "entropy", "approx_kl", "clipfrac", "learning_rate",
                    "time_env", "time_inference", "time_update", "rss_mb"):
            assert math.isfinite(float(r[col])), col
        assert float(r["value_loss"]) >= 0 and 0 <= float(r["clipfrac"]) <= 1
        assert float(r["time_update"]) > 0 and float(r["rss_mb"]) > 0
    assert int(rows[-1]["episodes"]) == summary["episodes"]


def test_tensorboard_events(run):
    """The event files hold CleanRL-style scalars, one point per update at its env_steps."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run.dir / "logs"))
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    required = {"charts/SPS", "losses/approx_kl", "losses/policy_loss", "losses/value_loss", "losses/entropy",
                "losses/clipfrac", "charts/learning_rate"}
    if run.name == "cartpole":  # starpilot finishes no episode in 32 steps
        required |= {"charts/episodic_return", "charts/episodic_length"}
    assert required <= tags
    steps = [int(r["env_steps"]) for r in run.rows]
    assert [e.step for e in acc.Scalars("charts/SPS")] == steps
    kl = [e.value for e in acc.Scalars("losses/approx_kl")]
    assert kl == pytest.approx([float(r["approx_kl"]) for r in run.rows], rel=1e-4, abs=1e-9)


def test_summary_json(run):
    """summary.json has every contract field, with values consistent with the config and metrics.csv."""
    s, cfg = run.summary, run.expected_config()
    assert set(SUMMARY_FIELDS) <= set(s)
    assert set(HARDWARE_FIELDS) <= set(s["hardware"])
    assert set(VERSION_FIELDS) <= set(s["versions"])

    assert s["mode"] == "sequential"
    assert s["env_id"] == cfg.env.id
    assert s["num_envs"] == cfg.env.num_envs
    assert s["num_workers"] == 0 and s["num_envs_per_worker"] == cfg.env.num_envs and s["worker_pace"] is None
    assert s["stop_reason"] == "total_steps"
    assert s["total_env_steps"] == s["updates"] * cfg.rollout_size
    assert cfg.run.total_steps <= s["total_env_steps"] < cfg.run.total_steps + cfg.rollout_size
    assert s["wall_seconds"] > 0
    assert s["overall_sps"] == pytest.approx(s["total_env_steps"] / s["wall_seconds"], rel=1e-6)
    assert s["sps"] == pytest.approx(load_run(run.name, run.dir).steady_sps, rel=1e-9)
    assert s["wall_seconds"] >= float(run.rows[-1]["wall_time"])
    learner = s["learner"]
    assert s["precision"] == learner["precision"] in ("fp32", "bf16")
    assert learner["device"] == "cpu" and learner["device_source"] == "auto" and learner["microbatch_size"] == 0
    assert learner["native_bf16"] is cpu_has_native_bf16()
    if run.name == "cartpole":  # a 64-unit MLP: too small for the choice to matter, on any CPU
        assert (learner["source"], learner["precision"], learner["rates"]) == ("default", "fp32", {})
    elif not learner["native_bf16"]:  # fp32 only, and 16 samples have no smaller chunk: nothing to measure
        assert (learner["source"], learner["precision"], learner["rates"]) == ("no-native-bf16", "fp32", {})
    else:  # measured by this run, or by an earlier test's run with the same settings (the session's cache)
        assert learner["source"] in ("measured", "cached")
        assert set(learner["rates"]) == {"fp32/whole", "bf16/whole"}  # microbatch fixed or no smaller candidate
    said = {"measured": "measured now", "cached": "from the measurement cached in", "no-native-bf16": "fp32, as no",
            "default": "too small for the choice to matter"}[learner["source"]]
    threads = ThreadChoice(**learner.pop("threads"))  # how the learner's threads were decided, beside the settings
    assert threads.threads == s["threads"]["learner"] <= threads.ceiling
    assert threads.source in ("config", "default", "measured", "cached", "unmeasured")
    assert (threads.describe() in run.stdout) is (threads.source != "config")
    line = f"learner {LearnerChoice(**learner).describe()}"
    assert line in run.stdout and said in line
    assert line.startswith(f"learner {learner['precision']}, microbatch whole minibatch, on cpu (auto)")
    assert s["compute_limit"]["precision"] == s["precision"]
    flops = s["roofline"]["forward_flops"] + cfg.training.n_epochs * s["roofline"]["train_flops"]
    assert s["flops_per_env_step"] == pytest.approx(flops) and s["roofline"]["forward_flops"] > 0
    assert s["roofline"]["train_flops"] > 2 * s["roofline"]["forward_flops"]  # backward ≈ 2 forwards
    assert s["achieved_gflops"] == pytest.approx(s["sps"] * s["flops_per_env_step"] / 1e9)
    assert s["peak_gflops"] == s["roofline"]["peak_gflops"][s["precision"]] > 0
    assert s["peak_fraction"] == pytest.approx(s["achieved_gflops"] / s["peak_gflops"])
    assert isinstance(s["threads"], dict) and s["threads"] and all(v >= 1 for v in s["threads"].values())
    assert s["peak_rss_mb"] > 0
    assert s["peak_rss_mb"] >= max(float(r["rss_mb"]) for r in run.rows) * (1 - 1e-5)  # csv keeps 6 digits

    returns = [r["episodic_return_mean"] for r in run.rows]
    if run.name == "cartpole":
        assert s["episodes"] > 0
        assert s["episodic_return_mean"] == pytest.approx(float(returns[-1]), rel=1e-5)
        assert s["episodic_return_mean"] >= 8  # CartPole pays 1 per step and cannot end sooner
    elif s["episodes"] == 0:
        assert s["episodic_return_mean"] is None and returns[-1] == ""

    hw = s["hardware"]
    assert isinstance(hw["cpu_model"], str) and hw["cpu_model"]
    assert hw["logical_cores"] >= 1 and hw["physical_cores"] >= 1
    assert hw["logical_cores"] >= hw["physical_cores"]
    assert hw["memory_gb"] > 0
    v = s["versions"]
    assert v["python"] == platform.python_version()
    assert v["torch"] == torch.__version__
    assert v["numpy"] == numpy.__version__
    assert v["gymnasium"] == gymnasium.__version__
    assert isinstance(v["procgen"], str) and v["procgen"]


def test_checkpoint_loads_into_a_fresh_model(run):
    """checkpoint.pt passes load_checkpoint, records the final counters, and its weights fit a new model."""
    state = load_checkpoint(run.dir / "checkpoint.pt")
    s = run.summary
    assert state["env_steps"] == s["total_env_steps"]
    assert state["update"] == s["updates"]
    cfg = config_from_dict(state["config"])
    assert cfg == config_from_dict(yaml.safe_load((run.dir / "config.yaml").read_text()))

    env = make_batch_env(cfg.env, cfg.run.seed, 0, 1, 1)
    try:
        obs_shape, actions = env.obs_shape, env.actions
        obs = torch.from_numpy(env.reset())
    finally:
        env.close()
    torch.manual_seed(12345)
    model = build_model(obs_shape, actions, cfg.model)
    fresh = {k: v.clone() for k, v in model.state_dict().items()}
    model.load_state_dict(state["model"], strict=True)
    loaded = model.state_dict()
    assert all(torch.equal(loaded[k], state["model"][k]) for k in loaded)
    assert any(not torch.equal(loaded[k], fresh[k]) for k in loaded)  # the weights did come from the file
    with torch.no_grad():
        logits, values = model(obs)
    assert logits.shape == (1, actions.n) and values.shape == (1,)
    assert torch.isfinite(logits).all() and torch.isfinite(values).all()

    optimizer = torch.optim.Adam(model.parameters())
    optimizer.load_state_dict(state["optimizer"])
