"""The learner's machine-dependent settings: `auto` precision and microbatch chosen by a measurement (a fake
one decides here) and cached; fp32 quantities under bf16; the device on a CPU-only machine."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from fake_runs import STEADY, write_run

from parallel_ppo.bench.learner_settings import LearnerChoice, candidates, choose
from parallel_ppo.bench.roofline import Candidate
from parallel_ppo.cli import compare as compare_cli
from parallel_ppo.core import model as model_module
from parallel_ppo.core.config import Config
from parallel_ppo.core.configure import build_config
from parallel_ppo.core.distributions import sample_actions
from parallel_ppo.core.model import resolve_device
from parallel_ppo.core.ppo import TrainBatch, build_learner, minibatch_step, ppo_loss
from parallel_ppo.errors import ConfigError

ROOT = Path(__file__).resolve().parent.parent
OBS, ACTIONS = (64, 64, 3), 15


class FakeMeasure:
    """Stands in for `roofline.measure_compute_limit`: each candidate's compute limit comes from `limits`."""

    def __init__(self, limits: dict[str, float]) -> None:
        self.limits, self.calls = limits, []

    def __call__(self, cfg, obs_shape, num_actions, seconds, *, obs_dtype, candidates, rounds, **iterations):
        self.calls.append([c.label for c in candidates])
        rates = {c.label: {"forward_rate": 1000.0, "train_rate": 300.0, "limit_sps": self.limits[c.label]}
                 for c in candidates}
        best = max(candidates, key=lambda c: self.limits[c.label])
        return {**rates[best.label], "precision": best.precision, "microbatch_size": best.microbatch_size,
                "candidates": rates}


def auto_config(**training) -> Config:
    cfg = Config()
    cfg.env.num_envs = 16
    for key, value in training.items():
        setattr(cfg.training, key, value)
    return cfg


LIMITS = {"fp32/64": 190.0, "fp32/128": 183.0, "fp32/whole": 177.0, "bf16/64": 151.0, "bf16/128": 200.0,
          "bf16/whole": 150.0}


def test_candidates_cover_what_is_auto():
    assert [c.label for c in candidates(auto_config())] == list(LIMITS)
    assert [c.label for c in candidates(auto_config(precision="bf16"))] == ["bf16/64", "bf16/128", "bf16/whole"]
    assert [c.label for c in candidates(auto_config(microbatch_size=32))] == ["fp32/32", "bf16/32"]
    assert [c.label for c in candidates(auto_config(batch_size=128))] == ["fp32/64", "fp32/whole", "bf16/64",
                                                                           "bf16/whole"]
    assert candidates(auto_config(precision="fp32", microbatch_size=0)) == [Candidate("fp32", 0)]


def test_the_fastest_candidate_is_chosen_then_cached(tmp_path):
    cache = tmp_path / "cache.json"
    measure = FakeMeasure(LIMITS)
    cfg = auto_config()
    choice = choose(cfg, OBS, np.dtype(np.uint8), ACTIONS, 10.0, measure=measure, path=cache)
    assert (choice.precision, choice.microbatch_size, choice.source) == ("bf16", 128, "measured")
    assert choice.rates == LIMITS and choice.limit["limit_sps"] == 200.0
    assert measure.calls == [list(LIMITS)]
    assert cfg.training.precision == "auto"  # choose does not change the config; resolve makes a new one
    t = choice.resolve(cfg).training
    assert (t.precision, t.microbatch_size, t.device) == ("bf16", 128, "cpu") and cfg.training.precision == "auto"

    again = choose(auto_config(), OBS, np.dtype(np.uint8), ACTIONS, 10.0, measure=measure, path=cache)
    assert (again.precision, again.microbatch_size, again.source) == ("bf16", 128, "cached")
    assert again.rates == LIMITS and again.limit is None and len(measure.calls) == 1  # no second measurement
    assert "from the measurement cached in" in again.describe() and "bf16/128 200" in again.describe()

    other = choose(auto_config(batch_size=512), OBS, np.dtype(np.uint8), ACTIONS, 10.0, measure=measure, path=cache)
    assert other.source == "measured" and len(measure.calls) == 2  # other settings, another entry
    assert len(json.loads(cache.read_text())) == 2


@pytest.mark.parametrize("limits, chosen", [
    ({"fp32/64": 169.0, "fp32/128": 160.0, "fp32/whole": 180.0, "bf16/64": 143.0, "bf16/128": 153.0,
      "bf16/whole": 144.0}, "fp32/64"),  # measured on our Xeon: whole looked 6.5% faster, ran 5% slower
    ({"fp32/64": 169.0, "fp32/128": 160.0, "fp32/whole": 186.0, "bf16/64": 143.0, "bf16/128": 153.0,
      "bf16/whole": 144.0}, "fp32/whole"),  # 10.1% faster: another chunk
    ({"fp32/64": 100.0, "fp32/128": 105.0, "fp32/whole": 90.0, "bf16/64": 170.0, "bf16/128": 200.0,
      "bf16/whole": 150.0}, "bf16/128"),  # AMD-like: bf16 far ahead, its best chunk 17.6% over 64
    ({"fp32/64": 100.0, "fp32/128": 100.0, "fp32/whole": 90.0, "bf16/64": 103.0, "bf16/128": 104.0,
      "bf16/whole": 90.0}, "fp32/64"),  # bf16 at its default chunk 3% faster: within the precision margin
    ({"fp32/64": 100.0, "fp32/128": 100.0, "fp32/whole": 90.0, "bf16/64": 103.5, "bf16/128": 109.0,
      "bf16/whole": 90.0}, "bf16/64"),  # bf16 3.5% faster; its 128 chunk only 5% over its 64
])
def test_the_defaults_stay_unless_beaten_by_more_than_the_margins(limits, chosen, tmp_path):
    choice = choose(auto_config(), OBS, np.dtype(np.uint8), ACTIONS, 10.0, measure=FakeMeasure(limits),
                    path=tmp_path / "c.json")
    assert f"{choice.precision}/{choice.microbatch_size or 'whole'}" == chosen
    assert choice.limit["limit_sps"] == limits[chosen] and choice.limit["precision"] == choice.precision


def test_a_fixed_precision_keeps_its_default_chunk(tmp_path):
    choice = choose(auto_config(precision="bf16"), OBS, np.dtype(np.uint8), ACTIONS, 10.0,
                    measure=FakeMeasure({"bf16/64": 150.0, "bf16/128": 155.0, "bf16/whole": 140.0}),
                    path=tmp_path / "c.json")
    assert (choice.precision, choice.microbatch_size) == ("bf16", 64)


def test_a_cached_choice_depends_on_the_machine(tmp_path, monkeypatch):
    cache = tmp_path / "cache.json"
    measure = FakeMeasure(LIMITS)
    choose(auto_config(), OBS, np.dtype(np.uint8), ACTIONS, 10.0, measure=measure, path=cache)
    monkeypatch.setattr("parallel_ppo.runs.fingerprint.hardware",
                        lambda: {"cpu_model": "Other CPU", "logical_cores": 64})
    choice = choose(auto_config(), OBS, np.dtype(np.uint8), ACTIONS, 10.0, measure=FakeMeasure(
        {**LIMITS, "fp32/64": 400.0}), path=cache)
    assert (choice.source, choice.precision, choice.microbatch_size) == ("measured", "fp32", 64)


def test_a_corrupt_cache_is_measured_again_and_rewritten(tmp_path):
    cache = tmp_path / "cache.json"
    cache.write_text("{not json")
    choice = choose(auto_config(), OBS, np.dtype(np.uint8), ACTIONS, 10.0, measure=FakeMeasure(LIMITS), path=cache)
    assert choice.source == "measured"
    assert len(json.loads(cache.read_text())) == 1


def test_nothing_auto_or_no_budget_measures_nothing(tmp_path):
    def refuse(*args, **kwargs):
        raise AssertionError("nothing should be measured")

    fixed = choose(auto_config(precision="bf16", microbatch_size=0), OBS, np.dtype(np.uint8), ACTIONS, 10.0,
                   measure=refuse, path=tmp_path / "c.json")
    assert (fixed.precision, fixed.microbatch_size, fixed.source) == ("bf16", 0, "config")
    assert fixed.describe() == "bf16, microbatch whole minibatch, on cpu (auto): as configured"
    unmeasured = choose(auto_config(), OBS, np.dtype(np.uint8), ACTIONS, 0.0, measure=refuse, path=tmp_path / "c.json")
    assert (unmeasured.precision, unmeasured.microbatch_size, unmeasured.source) == ("fp32", 64, "unmeasured")
    assert not (tmp_path / "c.json").exists()


def test_an_unwritable_cache_does_not_stop_the_run(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    choice = choose(auto_config(), OBS, np.dtype(np.uint8), ACTIONS, 10.0, measure=FakeMeasure(LIMITS),
                    path=blocker / "cache.json")
    assert choice.source == "measured" and choice.cache.startswith("nowhere")


def test_the_real_measurement_picks_among_the_candidates(tmp_path):
    cfg = auto_config(batch_size=8)
    cfg.env.num_envs = 2
    cfg.model.impala_depths, cfg.model.hidden_size = [4, 8, 8], 32
    choice = choose(cfg, OBS, np.dtype(np.uint8), ACTIONS, 0.3, path=tmp_path / "c.json")
    assert set(choice.rates) == {"fp32/whole", "bf16/whole"} and all(r > 0 for r in choice.rates.values())
    assert choice.rates[f"{choice.precision}/whole"] == max(choice.rates.values())
    assert choice.limit["limit_sps"] == max(choice.rates.values())


def small_learner(seed: int):
    cfg = Config()
    cfg.model.impala_depths, cfg.model.hidden_size = [4, 8, 8], 32
    torch.manual_seed(seed)
    return build_learner(OBS, ACTIONS, cfg)


def random_batch(seed: int, size: int = 8) -> TrainBatch:
    g = torch.Generator().manual_seed(seed)
    values = torch.randn(size, generator=g)
    return TrainBatch(torch.randint(0, 256, (size, *OBS), dtype=torch.uint8, generator=g),
                      torch.randint(0, ACTIONS, (size,), generator=g), torch.full((size,), -2.7), values,
                      torch.randn(size, generator=g), values + torch.randn(size, generator=g))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_bf16_keeps_log_probs_losses_and_optimizer_state_in_fp32(seed):
    model, optimizer = small_learner(seed)
    cfg = Config().training
    cfg.precision, cfg.microbatch_size = "bf16", 4
    batch = random_batch(seed)
    loss, stats = ppo_loss(model, batch, cfg)
    assert loss.dtype == torch.float32 and all(v.dtype == torch.float32 for v in stats.values())
    minibatch_step(model, optimizer, batch, cfg)
    for p in model.parameters():
        assert p.dtype == torch.float32 and p.grad.dtype == torch.float32
        state = optimizer.state[p]
        assert state["exp_avg"].dtype == torch.float32 and state["exp_avg_sq"].dtype == torch.float32
    with torch.no_grad(), model_module.autocast("bf16"):
        logits, values = model(batch.obs)
    assert logits.dtype == torch.bfloat16  # what autocast hands back; the log-probs must not stay in it
    _, logprobs = sample_actions(logits, np.full(len(batch), 0.5))
    assert logprobs.dtype == torch.float32
    expected = torch.log_softmax(logits.float(), -1)
    assert torch.equal(logprobs, expected.gather(1, sample_actions(logits, np.full(len(batch), 0.5))[0][:, None])
                       .squeeze(1))


def test_auto_device_is_the_cpu_without_an_accelerator(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: False)
    assert resolve_device("auto") == torch.device("cpu") == resolve_device("cpu")
    for name in ("cuda", "mps"):
        with pytest.raises(ConfigError, match=f"no {name.upper()} device is available"):
            resolve_device(name)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert resolve_device("auto") == torch.device("cuda")  # the accelerator first, when there is one


def test_device_choice_is_recorded(tmp_path):
    cfg = build_config(None, {"training.device": "cpu"}, ["training.precision=fp32", "training.microbatch_size=0"],
                       False)
    choice = choose(cfg, OBS, np.dtype(np.uint8), ACTIONS, 1.0, path=tmp_path / "c.json")
    assert choice.to_dict() == {"precision": "fp32", "microbatch_size": 0, "device": "cpu", "source": "config",
                                "device_source": "config", "rates": {}, "cache": None}
    assert LearnerChoice(**{**choice.to_dict(), "limit": None}).describe().endswith("on cpu: as configured")


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA device is present")
@pytest.mark.parametrize("args", [["--device", "cuda"], ["--device", "tpu"], ["--set", "training.precision=fp16"],
                                  ["--set", "training.microbatch_size=big"]])
def test_bad_learner_settings_exit_2_with_one_line(args, tmp_path):
    proc = subprocess.run([sys.executable, str(ROOT / "train_timed.py"), "--env", "CartPole-v1", *args,
                           "--output-dir", str(tmp_path / "run")], capture_output=True, text=True, cwd=ROOT,
                          timeout=120)
    assert proc.returncode == 2 and proc.stdout == ""
    assert len(proc.stderr.strip().splitlines()) == 1 and "error" in proc.stderr
    assert not (tmp_path / "run").exists()


def test_compare_shows_achieved_flops_as_a_share_of_the_peak(tmp_path):
    """A run with FLOP figures shows `GFLOP/s (of peak)`; one without (an older run) shows a dash."""
    new, old = write_run(tmp_path / "new"), write_run(tmp_path / "old")
    summary = json.loads((new / "summary.json").read_text())
    summary.update(flops_per_env_step=0.6e9, achieved_gflops=STEADY * 0.6, peak_gflops=245.0,
                   peak_fraction=STEADY * 0.6 / 245.0)
    (new / "summary.json").write_text(json.dumps(summary))
    out = tmp_path / "cmp"
    assert compare_cli.main(["--run", f"new={new}", "--run", f"old={old}", "--output-dir", str(out)]) == 0
    rows: dict[str, str] = {}
    for line in (out / "comparison.md").read_text().splitlines():  # the first table's rows
        if line.startswith(("| new", "| old")):
            rows.setdefault(line.split("|")[1].strip(), line)
    assert "GFLOP/s (of peak)" in (out / "comparison.md").read_text()
    assert f"| {STEADY * 0.6:,.0f} ({STEADY * 0.6 / 245:.0%}) |" in rows["new"] and "| — |" in rows["old"]
    data = json.loads((out / "comparison.json").read_text())
    assert data["runs"][0]["peak_fraction"] == pytest.approx(STEADY * 0.6 / 245.0)
