"""The compute-limit benchmark: positive rates, a limit that follows its own formula, bad input exits 2."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from parallel_ppo.cli.bench import main
from parallel_ppo.core.config import Config
from parallel_ppo.envs.procgen_envs import PROCGEN_ACTIONS, PROCGEN_OBS_SHAPE
from parallel_ppo.envs.spaces import ActionSpace, EnvSpaces
from parallel_ppo.errors import ConfigError
from parallel_ppo.tuning import compute_limit, learner_settings
from parallel_ppo.tuning.compute_limit import Candidate, limit_sps, measure_compute_limit, network_flops

ROOT = Path(__file__).resolve().parent.parent
PROCGEN = EnvSpaces(PROCGEN_OBS_SHAPE, np.dtype(np.uint8), ActionSpace(PROCGEN_ACTIONS))
CARTPOLE = EnvSpaces((4,), np.dtype(np.float32), ActionSpace(2))


def small_config(precision: str = "fp32") -> Config:
    cfg = Config()
    cfg.env.num_envs = 2
    cfg.training.batch_size = 4
    cfg.training.n_epochs = 3
    cfg.training.precision = precision
    cfg.training.microbatch_size = 0
    cfg.model.impala_depths = [4, 8, 8]
    cfg.model.hidden_size = 32
    return cfg


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_rates_are_positive_and_limit_follows_the_formula(precision: str) -> None:
    cfg = small_config(precision)
    result = measure_compute_limit(cfg, PROCGEN, seconds=0.2,
                                   warmup_iters=1, min_iters=2)
    assert result["forward_rate"] > 0 and result["train_rate"] > 0
    expected = 1.0 / (1.0 / result["forward_rate"] + 3 / result["train_rate"])
    assert result["limit_sps"] == pytest.approx(expected, rel=1e-12)
    assert result["limit_sps"] == limit_sps(result["forward_rate"], result["train_rate"], 3)
    assert result["limit_sps"] < min(result["forward_rate"], result["train_rate"] / 3)
    assert (result["rollout_batch"], result["minibatch"], result["precision"]) == (2, 4, precision)
    assert result["forward_iters"] >= 2 and result["train_iters"] >= 2
    assert json.loads(json.dumps(result)) == result  # JSON-serializable as is


def test_candidates_are_timed_in_alternating_rounds(monkeypatch) -> None:
    """ABBA...: each round times every candidate, in reverse order every other round, and keeps its own limit."""
    order = []
    train = compute_limit.NetworkSteps.train

    def recording(steps: compute_limit.NetworkSteps, candidate: Candidate):
        order.append(candidate.label)
        return train(steps, candidate)

    monkeypatch.setattr(compute_limit.NetworkSteps, "train", recording)
    options = [Candidate("fp32", 0), Candidate("fp32", 2)]
    result = measure_compute_limit(small_config(), PROCGEN, 0.1, candidates=options,
                                   rounds=3, warmup_iters=0, min_iters=1)
    assert order == ["fp32/whole", "fp32/2", "fp32/2", "fp32/whole", "fp32/whole", "fp32/2"]
    for figures in result["candidates"].values():
        assert len(figures["round_sps"]) == 3 and min(figures["round_sps"]) > 0
        assert figures["train_iters"] >= 3


def test_vector_observations_use_the_mlp() -> None:
    cfg = small_config()
    result = measure_compute_limit(cfg, CARTPOLE, seconds=0.05, warmup_iters=1, min_iters=1)
    assert result["model"] == "MlpActorCritic" and result["limit_sps"] > 0


def test_non_positive_budget_is_a_config_error() -> None:
    with pytest.raises(ConfigError):
        measure_compute_limit(small_config(), PROCGEN, seconds=0)


BAD_INPUT = [["roofline", "--no-such-flag"], ["roofline", "--seconds", "-1"], ["roofline", "--threads", "0"],
             ["roofline", "--set", "training.nope=1"], ["roofline", "--batch-size", "300"],
             ["roofline", "--env", "no-such-game"], ["speed-check", "--num-envs", "0"], []]


@pytest.mark.parametrize("args", BAD_INPUT)
def test_bad_input_exits_2_with_one_line(args: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    try:
        status = main(args)
    except SystemExit as e:  # argparse errors exit from inside the parser
        status = e.code
    out, err = capsys.readouterr()
    assert status == 2 and out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "error" in lines[0]


@pytest.mark.slow  # starts bench.py (a Python that imports torch)
def test_bench_py_bad_flag_exits_2_with_one_line() -> None:
    proc = subprocess.run([sys.executable, str(ROOT / "bench.py"), "roofline", "--no-such-flag"],
                          capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.strip() == "bench.py: error: unrecognized arguments: --no-such-flag (see --help)"


def test_network_flops_count_the_mlp_by_hand() -> None:
    """CartPole's MLP: two towers 4→64→64→(2 or 1), 2 FLOPs per multiply-add; the update adds the backward."""
    cfg = Config()
    flops = network_flops(cfg, CARTPOLE)
    assert flops["forward_flops"] == 2 * (4 * 64 + 64 * 64 + 64 * 2) + 2 * (4 * 64 + 64 * 64 + 64 * 1)
    assert 2 * flops["forward_flops"] < flops["train_flops"] <= 3 * flops["forward_flops"]
    assert flops["flops_per_env_step"] == flops["forward_flops"] + cfg.training.n_epochs * flops["train_flops"]


def test_network_flops_of_the_impala_cnn() -> None:
    """61.2 MFLOP per 64×64 frame (the figure the design notes measured), about 3× that to learn from it, 0.6 GFLOP
    per step at 3 epochs."""
    flops = network_flops(Config(), PROCGEN)
    assert flops["forward_flops"] == pytest.approx(61.2e6, rel=1e-3)
    assert flops["train_flops"] == pytest.approx(3 * flops["forward_flops"], rel=0.05)
    assert flops["flops_per_env_step"] == pytest.approx(0.60e9, rel=0.01)


def test_roofline_reports_candidates_flops_and_peaks(tmp_path, capsys, monkeypatch) -> None:
    """Both precisions are measured (on a CPU with native bf16, faked here) and shown; the result is told from the
    setting a trainer keeps, which for CartPole's small MLP is the unmeasured default, fp32."""
    monkeypatch.setattr(learner_settings, "cpu_has_native_bf16", lambda: True)
    peak = learner_settings.matmul_peak  # each peak measured for a tenth of the trainer's second: as real, cheaper
    monkeypatch.setattr(learner_settings, "matmul_peak", lambda dtype, seconds, device: peak(dtype, 0.1, device))
    out = tmp_path / "r.json"
    status = main(["roofline", "--env", "CartPole-v1", "--seconds", "0.3", "--batch-size", "64",
                   "--output", str(out)])
    text = capsys.readouterr().out
    assert status == 0
    result = json.loads(out.read_text())
    assert set(result["candidates"]) == {"fp32/whole", "bf16/whole"}  # CartPole defaults: 64 has no smaller chunk
    assert (result["precision"], result["microbatch_size"]) == ("fp32", 0)
    assert result["limit_sps"] == result["candidates"]["fp32/whole"]["limit_sps"]
    assert result["peak_gflops"]["fp32"] > 0 and result["peak_gflops"]["bf16"] > 0
    assert "network FLOPs" in text and "matmul peak" in text and "→ fp32/whole" in text


def test_roofline_run_without_figures_exits_2(tmp_path, capsys) -> None:
    assert main(["roofline", "--env", "CartPole-v1", "--run", str(tmp_path)]) == 2
    assert "no summary.json" in capsys.readouterr().err
    kept = ROOT / "docs/results/intel-xeon-avx512-bf16-2c/runs/overlap_cartpole/synchronous/seed_1/summary.json"
    (tmp_path / "summary.json").write_text(json.dumps({**json.loads(kept.read_text()), "sps": None}))
    assert main(["roofline", "--env", "CartPole-v1", "--run", str(tmp_path)]) == 2
    assert "no SPS or FLOP figures" in capsys.readouterr().err
