"""The learner's machine-dependent settings: `auto` precision and microbatch chosen by a measurement (a fake
one decides here, and real ones on a clock that a busy machine slows) and cached, bf16 only where it is native,
small networks unmeasured; fp32 quantities under bf16; the device on a CPU-only machine."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from fake_runs import STEADY, write_run

from parallel_ppo.cli import compare as compare_cli
from parallel_ppo.core import model as model_module
from parallel_ppo.core.config import Config
from parallel_ppo.core.configure import build_config
from parallel_ppo.core.distributions import sample_actions
from parallel_ppo.core.model import resolve_device
from parallel_ppo.core.ppo import TrainBatch, build_learner, minibatch_step, ppo_loss
from parallel_ppo.envs.spaces import ActionSpace, EnvSpaces
from parallel_ppo.errors import ConfigError
from parallel_ppo.runs import fingerprint
from parallel_ppo.tuning import compute_limit, learner_settings
from parallel_ppo.tuning.compute_limit import Candidate, extra_passes, measure_compute_limit
from parallel_ppo.tuning.learner_settings import (
    ROUNDS,
    LearnerChoice,
    candidates,
    choose,
    clearly_faster,
    is_small,
    pick,
    pick_measured,
)

ROOT = Path(__file__).resolve().parent.parent
OBS, ACTIONS = (64, 64, 3), 15
PROCGEN = EnvSpaces(OBS, np.dtype(np.uint8), ActionSpace(ACTIONS))
CARTPOLE = EnvSpaces((4,), np.dtype(np.float32), ActionSpace(2))


class FakeMeasure:
    """Stands in for `compute_limit.measure_compute_limit`: each candidate's compute limit comes from `limits`, the same
    in every round."""

    def __init__(self, limits: dict[str, float], other_load: float = 0.0) -> None:
        self.limits, self.calls, self.other_load, self.threads = limits, [], other_load, []

    def __call__(self, cfg, spaces, seconds, *, candidates, rounds, **iterations):
        self.calls.append([c.label for c in candidates])
        self.threads.append((torch.get_num_threads(), seconds))
        rates = {c.label: {"forward_rate": 1000.0, "train_rate": 300.0, "limit_sps": self.limits[c.label],
                           "round_sps": [self.limits[c.label]] * rounds} for c in candidates}
        best = max(candidates, key=lambda c: self.limits[c.label])
        return {**rates[best.label], "precision": best.precision, "microbatch_size": best.microbatch_size,
                "candidates": rates, "other_load_cores": self.other_load, "threads": torch.get_num_threads()}


@pytest.fixture(autouse=True)
def native_bf16(monkeypatch):
    """The tests here choose as on a CPU with native bf16 (bf16 a candidate), unless they say otherwise."""
    monkeypatch.setattr(learner_settings, "cpu_has_native_bf16", lambda: True)


def refuse(*args, **kwargs):
    raise AssertionError("nothing should be measured")


def auto_config(**training) -> Config:
    cfg = Config()
    cfg.env.num_envs = 16
    for key, value in training.items():
        setattr(cfg.training, key, value)
    return cfg


LIMITS = {"fp32/64": 190.0, "fp32/128": 183.0, "fp32/whole": 177.0, "bf16/64": 151.0, "bf16/128": 230.0,
          "bf16/whole": 150.0}


def test_candidates_cover_what_is_auto(monkeypatch):
    assert [c.label for c in candidates(auto_config())] == list(LIMITS)
    assert [c.label for c in candidates(auto_config(precision="bf16"))] == ["bf16/64", "bf16/128", "bf16/whole"]
    assert [c.label for c in candidates(auto_config(microbatch_size=32))] == ["fp32/32", "bf16/32"]
    assert [c.label for c in candidates(auto_config(batch_size=128))] == ["fp32/64", "fp32/whole", "bf16/64",
                                                                           "bf16/whole"]
    assert candidates(auto_config(precision="fp32", microbatch_size=0)) == [Candidate("fp32", 0)]
    assert [c.label for c in candidates(auto_config(), with_bf16=False)] == ["fp32/64", "fp32/128", "fp32/whole"]
    assert candidates(auto_config(precision="bf16", microbatch_size=0), with_bf16=False) == [Candidate("bf16", 0)]
    monkeypatch.setattr(learner_settings, "learner_device", lambda cfg: torch.device("cuda"))
    assert [c.label for c in candidates(auto_config())] == ["fp32/whole", "bf16/whole"]  # no chunks on a GPU
    assert [c.label for c in candidates(auto_config(microbatch_size=64))] == ["fp32/64", "bf16/64"]
    assert [c.label for c in candidates(auto_config(), with_tf32=True)] == ["fp32/whole", "bf16/whole", "tf32/whole"]
    assert candidates(auto_config(precision="tf32")) == [Candidate("tf32", 0)]


def test_tf32_is_cudas_products_within_the_block_and_plain_fp32_elsewhere():
    """tf32 sets CUDA's fp32 products and convolutions to TF32 for the block and puts back what was there; on the
    CPU (workers acting for a CUDA learner) it changes nothing; a learner on the CPU cannot ask for it."""
    from parallel_ppo.core.model import autocast

    flags = (torch.backends.cuda.matmul, torch.backends.cudnn.conv)
    torch_defaults = [flag.fp32_precision for flag in flags]
    try:
        for flag in flags:
            flag.fp32_precision = "ieee"
        with autocast("tf32", "cuda"):
            assert [flag.fp32_precision for flag in flags] == ["tf32", "tf32"]
        assert [flag.fp32_precision for flag in flags] == ["ieee", "ieee"]
        with autocast("tf32", "cpu"):
            assert [flag.fp32_precision for flag in flags] == ["ieee", "ieee"]
    finally:
        for flag, value in zip(flags, torch_defaults, strict=True):
            flag.fp32_precision = value
    for refused in (choose, learner_settings.measure_candidates):
        with pytest.raises(ConfigError, match="training.precision tf32 needs an NVIDIA GPU .* runs on cpu"):
            refused(auto_config(precision="tf32", device="cpu"), CARTPOLE, 1.0, measure=refuse)


def test_the_fastest_candidate_is_chosen_then_cached(tmp_path):
    cache = tmp_path / "cache.json"
    measure = FakeMeasure(LIMITS)
    cfg = auto_config()
    choice = choose(cfg, PROCGEN, 10.0, measure=measure, path=cache)
    assert (choice.precision, choice.microbatch_size, choice.source) == ("bf16", 128, "measured")
    assert choice.rates == LIMITS and choice.limit["limit_sps"] == 230.0
    assert measure.calls == [list(LIMITS)]
    assert cfg.training.precision == "auto"  # choose does not change the config; resolve makes a new one
    t = choice.resolve(cfg).training
    assert (t.precision, t.microbatch_size, t.device) == ("bf16", 128, "cpu") and cfg.training.precision == "auto"

    again = choose(auto_config(), PROCGEN, 10.0, measure=measure, path=cache)
    assert (again.precision, again.microbatch_size, again.source) == ("bf16", 128, "cached")
    assert again.rates == LIMITS and again.limit is None and len(measure.calls) == 1  # no second measurement
    assert "from the measurement cached in" in again.describe() and "bf16/128 230" in again.describe()

    other = choose(auto_config(batch_size=512), PROCGEN, 10.0, measure=measure, path=cache)
    assert other.source == "measured" and len(measure.calls) == 2  # other settings, another entry
    assert len(json.loads(cache.read_text())) == 2


@pytest.mark.parametrize("limits, chosen", [
    ({"fp32/64": 169.0, "fp32/128": 160.0, "fp32/whole": 180.0, "bf16/64": 143.0, "bf16/128": 153.0,
      "bf16/whole": 144.0}, "fp32/64"),  # measured on our Xeon: whole looked 6.5% faster, ran 5% slower
    ({"fp32/64": 169.0, "fp32/128": 160.0, "fp32/whole": 186.0, "bf16/64": 143.0, "bf16/128": 153.0,
      "bf16/whole": 144.0}, "fp32/whole"),  # 10.1% faster: another chunk
    ({"fp32/64": 100.0, "fp32/128": 105.0, "fp32/whole": 90.0, "bf16/64": 170.0, "bf16/128": 200.0,
      "bf16/whole": 150.0}, "bf16/128"),  # AMD-like: bf16 far ahead, its best chunk 17.6% over 64
    ({"fp32/64": 100.0, "fp32/128": 100.0, "fp32/whole": 90.0, "bf16/64": 109.0, "bf16/128": 110.0,
      "bf16/whole": 90.0}, "fp32/64"),  # bf16 at its default chunk 9% faster: within the margin
    ({"fp32/64": 100.0, "fp32/128": 100.0, "fp32/whole": 90.0, "bf16/64": 112.0, "bf16/128": 117.0,
      "bf16/whole": 90.0}, "bf16/128"),  # both bf16 chunks clearly beat the default: the faster one
])
def test_the_defaults_stay_unless_beaten_by_more_than_the_margins(limits, chosen, tmp_path):
    choice = choose(auto_config(), PROCGEN, 10.0, measure=FakeMeasure(limits),
                    path=tmp_path / "c.json")
    assert f"{choice.precision}/{choice.microbatch_size or 'whole'}" == chosen
    assert choice.limit["limit_sps"] == limits[chosen] and choice.limit["precision"] == choice.precision


def test_a_fixed_precision_keeps_its_default_chunk(tmp_path):
    choice = choose(auto_config(precision="bf16"), PROCGEN, 10.0,
                    measure=FakeMeasure({"bf16/64": 150.0, "bf16/128": 155.0, "bf16/whole": 140.0}),
                    path=tmp_path / "c.json")
    assert (choice.precision, choice.microbatch_size) == ("bf16", 64)


@pytest.mark.parametrize("other", [{"cpu_model": "Other CPU"}, {"cpu_kind": ["avx512"]}, {"cpu_family": "25/1"}])
def test_a_cached_choice_depends_on_the_machine(tmp_path, monkeypatch, other):
    """Another CPU model, the same model name without native bf16 (our two AMD EPYC kinds) or of another family and
    model (a home directory several machines share) measures again."""
    cache = tmp_path / "cache.json"
    machine = {"cpu_model": "AMD EPYC", "cpu_kind": ["avx512", "bf16"], "cpu_family": "25/17", "logical_cores": 2}
    monkeypatch.setattr("parallel_ppo.runs.fingerprint.hardware", lambda: machine)
    first = choose(auto_config(), PROCGEN, 10.0, measure=FakeMeasure(LIMITS), path=cache)
    assert choose(auto_config(), PROCGEN, 10.0, measure=refuse, path=cache).source == "cached"
    monkeypatch.setattr("parallel_ppo.runs.fingerprint.hardware", lambda: {**machine, **other})
    choice = choose(auto_config(), PROCGEN, 10.0, measure=FakeMeasure(
        {**LIMITS, "fp32/64": 400.0}), path=cache)
    assert first.source == "measured"
    assert (choice.source, choice.precision, choice.microbatch_size) == ("measured", "fp32", 64)


def test_a_corrupt_cache_is_measured_again_and_rewritten(tmp_path):
    cache = tmp_path / "cache.json"
    cache.write_text("{not json")
    choice = choose(auto_config(), PROCGEN, 10.0, measure=FakeMeasure(LIMITS), path=cache)
    assert choice.source == "measured"
    assert len(json.loads(cache.read_text())) == 1


@pytest.mark.parametrize("damage", [{"rates": [["fp32/64"]]}, {"rates": {"bf16/128": "fast"}},
                                    {"rates": {"bf16/128": 10**400}}, {"microbatch_size": 128.0},
                                    {"precision": None}])
def test_a_cache_entry_edited_into_nonsense_is_measured_again(tmp_path, damage):
    """Valid JSON whose entry holds rates that are no mapping of numbers, a float chunk (128.0 == 128 passed the
    check, then broke the update) or no precision: measured again and rewritten, not a traceback."""
    cache = tmp_path / "cache.json"
    choose(auto_config(), PROCGEN, 10.0, measure=FakeMeasure(LIMITS), path=cache)
    (key, entry), = json.loads(cache.read_text()).items()
    cache.write_text(json.dumps({key: {**entry, **damage}}))
    choice = choose(auto_config(), PROCGEN, 10.0, measure=FakeMeasure(LIMITS), path=cache)
    assert choice.source == "measured" and json.loads(cache.read_text())[key]["microbatch_size"] == 128


def test_matmul_peaks_measured_beside_other_work_are_not_cached(tmp_path, monkeypatch):
    """A peak measured while other processes kept the machine busy would stay, too low, in every later run's share
    of the peak; a peak of 0 or text in the file is measured again."""
    cache, loads = tmp_path / "cache.json", iter([2.0, 0.0, 0.0])

    class Load:
        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.cores = next(loads)

    monkeypatch.setattr(learner_settings, "OtherLoad", Load)
    monkeypatch.setattr(learner_settings, "matmul_peak", lambda dtype, seconds, device: 100.0)
    cfg = auto_config()
    assert set(learner_settings.matmul_peaks(cfg, path=cache).values()) == {100.0} and not cache.exists()
    learner_settings.matmul_peaks(cfg, path=cache)  # quiet: cached
    (key, entry), = json.loads(cache.read_text()).items()
    cache.write_text(json.dumps({key: {**entry, "bf16": 0}}))
    learner_settings.matmul_peaks(cfg, path=cache)  # measured again (the third load), and rewritten
    assert json.loads(cache.read_text())[key]["bf16"] == 100.0
    ranks = tmp_path / "ranks.json"  # a distributed run's own ranks measure at once: their load is no reason
    loads = iter([2.0])
    learner_settings.matmul_peaks(cfg, path=ranks, beside_ranks=True)
    assert len(json.loads(ranks.read_text())) == 1


def test_runs_storing_at_once_keep_every_entry(tmp_path):
    """Two runs that start together each read the cache, add their entry and write it back: under the file's lock
    neither write loses the other's entry (each write alone was atomic, but the read-add-write was not)."""
    from concurrent.futures import ThreadPoolExecutor

    from parallel_ppo.tuning.cache import store

    cache = tmp_path / "cache.json"
    with ThreadPoolExecutor(4) as pool:
        assert all(pool.map(lambda i: store(cache, f"key{i}", {"threads": 1}), range(200)))
    assert len(json.loads(cache.read_text())) == 200
    (tmp_path / "other").mkdir()  # a lock that cannot be taken (no flock there, another user's file): unlocked
    (tmp_path / "other" / "cache.json.lock").mkdir()
    assert store(tmp_path / "other" / "cache.json", "key", {"threads": 1})


def test_nothing_auto_or_no_budget_measures_nothing(tmp_path):
    fixed = choose(auto_config(precision="bf16", microbatch_size=0), PROCGEN, 10.0,
                   measure=refuse, path=tmp_path / "c.json")
    assert (fixed.precision, fixed.microbatch_size, fixed.source) == ("bf16", 0, "config")
    assert fixed.describe() == "bf16, microbatch whole minibatch, on cpu (auto): as configured"
    unmeasured = choose(auto_config(), PROCGEN, 0.0, measure=refuse, path=tmp_path / "c.json")
    assert (unmeasured.precision, unmeasured.microbatch_size, unmeasured.source) == ("fp32", 64, "unmeasured")
    assert not (tmp_path / "c.json").exists()


def test_an_unwritable_cache_does_not_stop_the_run(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    choice = choose(auto_config(), PROCGEN, 10.0, measure=FakeMeasure(LIMITS),
                    path=blocker / "cache.json")
    assert choice.source == "measured" and not choice.to_dict()["stored"]
    assert choice.describe().endswith(f"; not cached: {blocker / 'cache.json'} is not writable")


def test_the_real_measurement_picks_among_the_candidates(tmp_path):
    cfg = auto_config(batch_size=8)
    cfg.env.num_envs = 2
    cfg.model.impala_depths, cfg.model.hidden_size = [4, 8, 8], 32  # 4.5 MFLOP a frame: measured
    choice = choose(cfg, PROCGEN, 0.3, path=tmp_path / "c.json")
    assert set(choice.rates) == {"fp32/whole", "bf16/whole"} and all(r > 0 for r in choice.rates.values())
    rounds = {label: r["round_sps"] for label, r in choice.limit["candidates"].items()}
    assert all(len(r) == ROUNDS and min(r) > 0 for r in rounds.values())
    options = [Candidate("fp32", 0), Candidate("bf16", 0)]
    if choice.measured_threads is None:  # not ranked again on one thread beside other work (another test file)
        assert pick_measured(choice.limit, options, options[0]) == Candidate(choice.precision, choice.microbatch_size)
        assert choice.limit["limit_sps"] == choice.rates[f"{choice.precision}/whole"]
    else:  # the run's own threads' figures stay its compute limit; the one-thread ones ranked the candidates
        assert choice.rates == choice.limit["ranking"]["rates"] and choice.limit["threads"] == torch.get_num_threads()


def drifting(ratios: list[float]) -> tuple[list[float], list[float]]:
    """Per-round compute limits of a default whose speed drifts from round to round, and of a rival at `ratios` to
    it in the same rounds."""
    base = [100.0, 60.0, 110.0, 95.0, 120.0, 80.0, 100.0]
    return [b * r for b, r in zip(base, ratios, strict=True)], base


def test_the_pick_rule_tells_a_clear_win_from_noise():
    """A rival replaces the default only when it wins every interleaved round by more than the margin, by a median
    gain larger than the rounds' spread."""
    assert not clearly_faster(*drifting([1.15, 0.9, 1.2, 1.12, 1.3, 1.18, 1.14]))  # median +15%, one round lost
    assert not clearly_faster(*drifting([1.11, 1.12, 1.13, 1.5, 1.9, 2.0, 1.14]))  # spread ±44% over the gain +14%
    assert not clearly_faster(*drifting([1.08] * 7))  # steady, under the margin
    assert clearly_faster(*drifting([1.45, 1.6, 1.5, 1.55, 1.38, 1.52, 1.49]))
    options = [Candidate(p, m) for p in ("fp32", "bf16") for m in (64, 0)]
    noisy, base = drifting([1.15, 0.9, 1.2, 1.12, 1.3, 1.18, 1.14])
    clear, _ = drifting([1.45, 1.6, 1.5, 1.55, 1.38, 1.52, 1.49])
    assert pick(options, {"fp32/64": base, "fp32/whole": noisy, "bf16/64": noisy, "bf16/whole": noisy},
                options[0]) == options[0]  # noisy ties all round: the default
    whole = [1.1 * c for c in clear]  # bf16 wins clearly at both chunks; of the two, the faster
    assert pick(options, {"fp32/64": base, "fp32/whole": noisy, "bf16/64": clear, "bf16/whole": whole},
                options[0]) == Candidate("bf16", 0)
    beside = drifting([1.15, 1.05, 1.2, 1.12, 1.3, 1.18, 1.14])[0]  # bf16 at 64 not clearly faster; whole 1.5x is
    assert pick(options, {"fp32/64": base, "fp32/whole": noisy, "bf16/64": beside, "bf16/whole": clear},
                options[0]) == Candidate("bf16", 0)
    rng = np.random.default_rng(0)  # 10,000 simulated ties, each round's timings off by ±30%: about 0.1% switch
    ties = 100 * np.exp(rng.normal(0, 0.3, (2, 10_000, ROUNDS)))
    assert sum(clearly_faster(a, b) for a, b in zip(*ties, strict=True)) < 20
    quiet = 100 * np.exp(rng.normal(0, 0.3, (1000, 1)) + rng.normal(0, 0.03, (1000, ROUNDS)))  # 1.5x at ±5%: all do
    assert all(clearly_faster(1.5 * q * np.exp(rng.normal(0, 0.05, ROUNDS)), q) for q in quiet)


def test_a_choice_measured_beside_other_work_is_not_cached(tmp_path):
    """Measured while other processes kept 1.5 cores busy: this run takes the choice, the cache does not, and the
    next run (on a quiet machine) measures again and caches its own."""
    cache = tmp_path / "cache.json"
    busy = FakeMeasure(LIMITS, other_load=1.5)
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        choice = choose(auto_config(), PROCGEN, 10.0, measure=busy, path=cache)
        assert busy.threads == [(2, 10.0), (1, 10.0 * learner_settings.BUSY_BUDGET)]  # again on one thread, longer
        assert torch.get_num_threads() == 2  # then restored
    finally:
        torch.set_num_threads(threads)
    assert "cores busy, ranked on one thread (such load" in choice.describe() and choice.measured_threads == 1
    assert choice.limit["threads"] == 2 and choice.limit["limit_sps"] == LIMITS["bf16/128"]  # the run's own limit
    assert (choice.precision, choice.microbatch_size, choice.source) == ("bf16", 128, "measured")
    assert not choice.to_dict()["stored"] and not cache.exists()
    assert "measured now while other processes kept 1.50 cores busy" in choice.describe()
    assert choice.describe().endswith("; not cached: the next run measures again")
    quiet = FakeMeasure(LIMITS)
    assert choose(auto_config(), PROCGEN, 10.0, measure=quiet, path=cache).source == "measured"
    assert len(quiet.calls) == 1 and len(json.loads(cache.read_text())) == 1
    # the ranks of a distributed run measure at once: their load is the run's own, and the choice is cached
    ranks = choose(auto_config(batch_size=512), PROCGEN, 10.0, measure=busy, path=cache, beside_ranks=True)
    assert ranks.stored and ranks.cache == str(cache) and len(json.loads(cache.read_text())) == 2
    assert "fastest iterations" not in ranks.describe()  # the ranks' own load: the rounds alone decide


def test_a_large_gain_measured_under_load_is_kept_and_a_tie_rarely_switches():
    """Beside other work a round can be slowed for any candidate, so the rounds' rule keeps the default even where
    the whole minibatch is 2.6x faster (the camera config on a loaded Xeon); load only ever adds time, so each
    candidate's fastest iterations (`best`) still tell the gain. Simulated: every iteration slowed by a random
    extra time (exponential, half the iteration on average), one to three iterations a candidate and round."""
    rng = np.random.default_rng(1)
    options = [Candidate("fp32", 64), Candidate("fp32", 0)]

    def measured(seconds: dict[str, float]) -> tuple[dict[str, list[float]], dict[str, float]]:
        times = {k: [t * (1 + rng.exponential(0.5, rng.integers(1, 4))) for _ in range(ROUNDS)]
                 for k, t in seconds.items()}
        return ({k: [1 / float(np.median(r)) for r in rs] for k, rs in times.items()},
                {k: 1 / min(min(r) for r in rs) for k, rs in times.items()})

    for _ in range(200):
        rounds, best = measured({"fp32/64": 2.6, "fp32/whole": 1.0})
        assert pick(options, rounds, options[0], best) == options[1]
    switched = 0
    for _ in range(1000):
        rounds, best = measured({"fp32/64": 1.0, "fp32/whole": 1.0})
        switched += pick(options, rounds, options[0], best) == options[1]
    assert switched < 200, switched  # a tie switched costs nothing


ITERATION = 0.004
"""Seconds an iteration of the network takes on LoadedClock where nothing else runs: the same for every candidate."""


class LoadedClock:
    """`compute_limit`'s clock, moved only by the iterations it times (at each `synchronizer` call): ITERATION seconds
    times how much slower other processes make the machine then (`slowdown`, a function of the clock)."""

    def __init__(self, slowdown) -> None:
        self.now, self.slowdown, self.reads = 0.0, slowdown, 0

    def __call__(self) -> float:
        self.reads += 1
        if self.reads > 100_000:  # a timed loop that no longer calls its synchronizer would wait here for ever
            pytest.fail("the measurement read LoadedClock 100,000 times without an iteration")
        return self.now

    def iteration(self) -> None:
        self.now += ITERATION * self.slowdown(self.now)
        self.reads = 0


LOADS = {
    "busy": lambda t: 2.0,  # a process taking half of the cores the whole time
    "drift": lambda t: 1 + 2 * t / 0.7,  # busier and busier: three times as slow by the end of the measurement
    "bursts": lambda t: 3.0 if t % 0.11 < 0.04 else 1.0,  # another job's bursts, out of step with the rounds
}


def test_a_busy_machine_does_not_flip_the_choice(monkeypatch, tmp_path):
    """Issue 36: beside a busy process, CartPole's MLP on a CPU without native bf16 trained bf16. It measures nothing
    now, and a measurement of two candidates doing the same work (chunks of 64 in a minibatch of 64 are the whole
    minibatch), timed on a clock that other processes slow all along, more and more, or in bursts, keeps the
    default under each load."""
    monkeypatch.setattr(learner_settings, "cpu_has_native_bf16", lambda: False)
    cartpole = choose(auto_config(), CARTPOLE, 10.0, measure=refuse, path=tmp_path / "c.json")
    assert (cartpole.precision, cartpole.microbatch_size, cartpole.source) == ("fp32", 0, "default")
    cfg = auto_config(batch_size=64)
    cfg.model.mlp_hidden = [256, 256]  # 0.27 MFLOP a sample: above the small-network threshold
    assert not is_small(cfg, CARTPOLE)
    same = [Candidate("fp32", 64), Candidate("fp32", 0)]
    for load, slowdown in LOADS.items():
        clock = LoadedClock(slowdown)
        monkeypatch.setattr(compute_limit, "time", SimpleNamespace(perf_counter=clock))
        monkeypatch.setattr(compute_limit, "synchronizer", lambda device, clock=clock: clock.iteration)
        result = measure_compute_limit(cfg, CARTPOLE, 0.6, candidates=same, rounds=ROUNDS, warmup_iters=1,
                                       min_iters=1)
        measured = result["candidates"].values()
        rounds = {label: r["round_sps"] for label, r in result["candidates"].items()}
        best = {label: r["best_sps"] for label, r in result["candidates"].items()}
        assert pick(same, rounds, same[0]) == same[0], (load, rounds)
        assert pick(same, rounds, same[0], best, busy=True) == same[0], (load, best)  # the rule for a busy machine
        if load == "busy":  # timed on this clock alone: an iteration, 4 ms, twice as slow
            assert [r["train_ms_median"] for r in measured] == pytest.approx([2000 * ITERATION] * 2)


def test_bf16_is_a_candidate_only_where_it_is_native(monkeypatch, tmp_path):
    monkeypatch.setattr(learner_settings, "cpu_has_native_bf16", lambda: False)
    alone = choose(auto_config(microbatch_size=64), PROCGEN, 10.0, measure=refuse,
                   path=tmp_path / "c.json")
    assert (alone.precision, alone.microbatch_size, alone.source, alone.native_bf16) == (
        "fp32", 64, "no-native-bf16", False)
    assert alone.describe() == "fp32, microbatch 64, on cpu (auto): fp32, as no native bf16 on this cpu"
    measure = FakeMeasure(LIMITS)
    chunks = choose(auto_config(), PROCGEN, 10.0, measure=measure, path=tmp_path / "c.json")
    assert measure.calls == [["fp32/64", "fp32/128", "fp32/whole"]]
    assert (chunks.precision, chunks.source, chunks.native_bf16, chunks.to_dict()["native_bf16"]) == (
        "fp32", "measured", False, False)
    assert "(bf16 not tried: no native bf16 on this cpu): measured now" in chunks.describe()
    asked = choose(auto_config(precision="bf16"), PROCGEN, 10.0,
                   measure=FakeMeasure(LIMITS), path=tmp_path / "c.json")
    assert (asked.precision, asked.native_bf16) == ("bf16", None)  # asked for by name: used, not second-guessed


def test_the_cpu_kind_and_family_are_read_from_cpuinfo(tmp_path):
    def kind(text: str) -> list[str]:
        (tmp_path / "cpuinfo").write_text(text)
        return fingerprint.cpu_kind(fingerprint.read_cpu_flags(tmp_path / "cpuinfo"))

    assert kind("processor\t: 0\nflags\t\t: fpu sse2 avx2 avx512f avx512_bf16 avx512_vnni\n") == ["avx512", "bf16"]
    assert kind("processor\t: 0\nflags\t\t: fpu sse2 avx2 avx512f avx512_vnni\n") == ["avx512"]  # no bf16
    assert kind("processor\t: 0\nflags\t\t: fpu sse2 avx2 amx_bf16 amx_tile\n") == ["bf16"]
    assert kind("processor\t: 0\nFeatures\t: fp asimd sve bf16 i8mm\n") == ["bf16"]  # Arm
    assert fingerprint.read_cpu_flags(tmp_path / "missing") == frozenset()
    (tmp_path / "cpuinfo").write_text("processor\t: 0\ncpu family\t: 25\nmodel\t\t: 17\nmodel name\t: AMD EPYC\n"
                                      "processor\t: 1\ncpu family\t: 26\nmodel\t\t: 2\n")
    assert fingerprint.read_cpu_family(tmp_path / "cpuinfo") == "25/17"  # the first processor's
    (tmp_path / "cpuinfo").write_text("processor\t: 0\nFeatures\t: fp asimd\nCPU part\t: 0xd0c\n")
    assert fingerprint.read_cpu_family(tmp_path / "cpuinfo") is None  # Arm: no family
    assert fingerprint.read_cpu_family(tmp_path / "missing") is None


def test_a_small_network_keeps_the_defaults_unmeasured(tmp_path):
    """CartPole's 64-unit MLP (0.018 MFLOP a sample) is not measured, on any CPU; the IMPALA CNN (61 MFLOP) is."""
    cartpole = auto_config(batch_size=256)
    assert is_small(cartpole, CARTPOLE) and not is_small(Config(), PROCGEN)
    choice = choose(cartpole, CARTPOLE, 10.0, measure=refuse, path=tmp_path / "c.json")
    assert (choice.precision, choice.microbatch_size, choice.source, choice.native_bf16) == (
        "fp32", 0, "default", True)
    assert "too small for the choice to matter" in choice.describe() and not (tmp_path / "c.json").exists()
    fixed = choose(auto_config(microbatch_size=128), CARTPOLE, 10.0, measure=refuse,
                   path=tmp_path / "c.json")
    assert (fixed.precision, fixed.microbatch_size, fixed.source) == ("fp32", 128, "default")


def small_learner(seed: int):
    cfg = Config()
    cfg.model.impala_depths, cfg.model.hidden_size = [4, 8, 8], 32
    torch.manual_seed(seed)
    return build_learner(PROCGEN, cfg)


def random_batch(seed: int, size: int = 8) -> TrainBatch:
    g = torch.Generator().manual_seed(seed)
    values = torch.randn(size, generator=g)
    return TrainBatch(torch.randint(0, 256, (size, *OBS), dtype=torch.uint8, generator=g),
                      torch.randint(0, ACTIONS, (size,), generator=g), torch.full((size,), -2.7), values,
                      torch.randn(size, generator=g), values + torch.randn(size, generator=g))


@pytest.mark.parametrize("capability, cuda", [((7, 5), "12.4"), ((9, 0), None)], ids=["below-8.0", "rocm"])
def test_tf32_is_refused_on_a_gpu_without_it(monkeypatch, capability, cuda):
    monkeypatch.setattr(learner_settings, "learner_device", lambda cfg: torch.device("cuda"))
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    monkeypatch.setattr(torch.version, "cuda", cuda)
    with pytest.raises(ConfigError, match="needs an NVIDIA GPU of compute capability 8.0 or later; .* on cuda"):
        learner_settings.check_precision(auto_config(precision="tf32"))
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 0))
    monkeypatch.setattr(torch.version, "cuda", "12.4")
    learner_settings.check_precision(auto_config(precision="tf32"))  # an Ampere GPU has it


def test_tf32_covers_the_backward_pass_as_well_as_the_forward(monkeypatch):
    """Every gradient of a tf32 step is computed inside the TF32 block (a spy in its place, as no GPU is here)."""
    import contextlib

    from parallel_ppo.core import ppo

    inside = []

    @contextlib.contextmanager
    def spy(device_type):
        inside.append(device_type)
        yield
        inside.append("left")

    monkeypatch.setattr(ppo, "tf32_products", spy)
    model, optimizer = small_learner(0)
    in_block = []
    for p in model.parameters():
        p.register_hook(lambda grad: in_block.append(inside[-1:] == ["cpu"]) or grad)
    cfg = Config().training
    cfg.precision, cfg.microbatch_size = "tf32", 4
    minibatch_step(model, optimizer, random_batch(0), cfg)
    assert inside == ["cpu", "left"] and in_block and all(in_block)


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


def test_auto_device_takes_cuda_then_xpu_mps_directml_then_the_cpu(monkeypatch):
    from parallel_ppo.core import model

    present = {"cuda": False, "xpu": False, "mps": False}
    monkeypatch.setattr(torch.cuda, "is_available", lambda: present["cuda"])
    monkeypatch.setattr(torch.xpu, "is_available", lambda: present["xpu"])
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: present["mps"])
    monkeypatch.setattr(model, "directml_device", lambda: None)
    assert resolve_device("auto") == torch.device("cpu") == resolve_device("cpu")
    monkeypatch.setattr(model, "directml_device", lambda: "privateuseone:0")
    assert model.available_device() == "privateuseone:0"
    for name in ("mps", "xpu", "cuda"):  # each wins over the ones before it
        present[name] = True
        assert model.available_device() == name


@pytest.mark.parametrize("name, words", [
    ("cuda", "'cuda': no such device is available"), ("cuda:1", "'cuda:1': no such device"),
    ("xpu", "'xpu': no such device"), ("mps", "'mps': no such device"),
    ("privateuseone:0", "'privateuseone:0': no such device"), ("gpu0", "'gpu0' is not a torch device"),
    ("meta", "holds no data"), ("cpu:5", "the CPU takes no device number"),
])
def test_a_device_that_is_not_here_is_refused_by_name(name, words):
    try:
        torch.empty(1, device=name)
    except Exception:  # not here (a CPU build): refused
        pass
    else:
        if name not in ("meta", "cpu:5"):  # torch takes these, and they are refused all the same
            pytest.skip(f"this machine has {name}")
    with pytest.raises(ConfigError, match=words):
        resolve_device(name)


def test_device_choice_is_recorded(tmp_path):
    cfg = build_config(None, {"training.device": "cpu"}, ["training.precision=fp32", "training.microbatch_size=0"],
                       False)
    choice = choose(cfg, PROCGEN, 1.0, path=tmp_path / "c.json")
    assert choice.to_dict() == {"precision": "fp32", "microbatch_size": 0, "device": "cpu", "source": "config",
                                "device_source": "config", "rates": {}, "cache": None, "stored": False,
                                "native_bf16": None, "busy_cores": None, "measured_threads": None}
    assert LearnerChoice(**{**choice.to_dict(), "limit": None}).describe().endswith("on cpu: as configured")


@pytest.mark.slow  # starts a trainer (a Python that imports torch) per case
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


def test_a_quiet_large_gain_that_one_round_spoiled_is_kept_and_ties_rarely_switch():
    """Quiet, bf16 on whole minibatches 1.54x the default, but one round disturbed (the camera config's measurement
    that kept fp32/64): the median gain over twice the margin, confirmed by the fastest iterations, wins. Simulated
    ties at ±10% noise per round switch rarely."""
    options = [Candidate("fp32", 64), Candidate("bf16", 0)]
    base = [327.0] * ROUNDS
    spoiled = [504.0] * (ROUNDS - 1) + [300.0]  # one round lost to a disturbance
    assert not clearly_faster(spoiled, base)
    assert pick(options, {"fp32/64": base, "bf16/whole": spoiled}, options[0]) == options[0]  # rounds alone
    best = {"fp32/64": 340.0, "bf16/whole": 520.0}
    assert pick(options, {"fp32/64": base, "bf16/whole": spoiled}, options[0], best) == options[1]
    slow_median = [340.0] * ROUNDS  # 1.04x in the median: the fastest iterations alone do not switch a quiet choice
    assert pick(options, {"fp32/64": base, "bf16/whole": slow_median}, options[0], best) == options[0]
    rng = np.random.default_rng(2)
    switched = 0
    for _ in range(2000):
        times = 1 + rng.exponential(0.1, (2, ROUNDS, 3))  # each round's iterations, a tie
        rounds = {"fp32/64": list(1 / np.median(times[0], 1)), "bf16/whole": list(1 / np.median(times[1], 1))}
        fastest = {"fp32/64": 1 / times[0].min(), "bf16/whole": 1 / times[1].min()}
        switched += pick(options, rounds, options[0], fastest) == options[1]
    assert switched < 20, switched


def test_the_update_passes_besides_the_loss_key_the_measurement():
    """The anchor's pass before each step keys the measurement where the loop runs it: frames shifted in the loss
    with `augment_anchor` (or `decoupled_clip`); overlapped workers' lag alone anchors once a rollout, outside the
    measured step; the regularizer's pass keys it where it weighs shifted frames."""
    def passes(*sets: str) -> dict[str, bool]:
        return extra_passes(build_config("config/cartpole.yaml", {}, list(sets), True))
    assert passes() == {} and passes("parallel.overlap=true") == {}
    assert passes("parallel.overlap=true", "parallel.decoupled_clip=true") == {}
    assert passes("parallel.overlap=true", "parallel.decoupled_clip=true", "training.augment_shift=4") == {
        "anchor": True}
    assert passes("parallel.overlap=true", "parallel.policy_lag=0", "parallel.decoupled_clip=true") == {}
    assert passes("training.augment_shift=4", "training.augment_anchor=true") == {"anchor": True}
    assert passes("training.augment_shift=4", "training.augment_regularizer=0.1") == {"augment_regularizer": True}
