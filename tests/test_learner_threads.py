"""The learner's `auto` threads: the fewest that train as fast as the most (a fake measurement decides here, the real
one runs once), cached per machine and settings, one for a small network, the ceiling with no budget; the run
trains on the choice and records it."""

from __future__ import annotations

import json
import os
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from parallel_ppo.core.config import Config
from parallel_ppo.core.configure import build_config
from parallel_ppo.core.threads import thread_plan
from parallel_ppo.envs.spaces import ActionSpace, EnvSpaces
from parallel_ppo.errors import ConfigError
from parallel_ppo.launch import settled
from parallel_ppo.tuning import before_run, learner_threads
from parallel_ppo.tuning.before_run import tune
from parallel_ppo.tuning.cache import CACHE_DIR_VARIABLE
from parallel_ppo.tuning.compute_limit import threads_kept
from parallel_ppo.tuning.learner_settings import ROUNDS
from parallel_ppo.tuning.learner_threads import (
    ThreadChoice,
    choose_threads,
    measure_threads,
    pick_threads,
    thread_counts,
    within_load,
)

PROCGEN = EnvSpaces((64, 64, 3), np.dtype(np.uint8), ActionSpace(15))
CARTPOLE = EnvSpaces((4,), np.dtype(np.float32), ActionSpace(2))


class FakeMeasure:
    """Each count's compute limit from `limits` (by count), the same in every round; the load as given."""

    def __init__(self, limits: dict[int, float], other_load: float = 0.0) -> None:
        self.limits, self.other_load, self.calls = limits, other_load, []

    def __call__(self, cfg, spaces, seconds, counts):
        self.calls.append(counts)
        return {"counts": {str(t): {"limit_sps": self.limits[t], "round_sps": [self.limits[t]] * ROUNDS}
                           for t in counts}, "other_load_cores": self.other_load}


def refuse(*args, **kwargs):
    raise AssertionError("nothing should be measured")


def resolved(threads="auto") -> Config:
    cfg = Config()
    cfg.parallel.learner_threads = threads
    cfg.training.precision, cfg.training.microbatch_size, cfg.training.device = "fp32", 0, "cpu"
    return cfg


def test_the_counts_double_up_to_the_ceiling():
    assert thread_counts(1) == [1] and thread_counts(2) == [1, 2]
    assert thread_counts(6) == [1, 2, 4, 6] and thread_counts(16) == [1, 2, 4, 8, 16]


def test_one_thread_stays_unless_more_are_clearly_faster_then_the_fewest_near_the_best():
    drift = [100.0, 60.0, 110.0, 95.0, 120.0, 80.0, 100.0]
    one = {1: drift}
    assert pick_threads({**one, 2: [1.05 * d for d in drift]}) == 1  # 5%: within the margin
    assert pick_threads({**one, 2: [d * r for d, r in zip(drift, [1.3, 1.0, 1.3, 1.3, 1.3, 1.3, 1.3],
                                                           strict=True)]}) == 1  # one round lost
    assert pick_threads({**one, 2: [1.8 * d for d in drift]}) == 2
    scaling = {t: [g * d for d in drift] for t, g in {1: 1.0, 2: 1.8, 4: 3.0, 8: 3.2, 16: 3.3}.items()}
    assert pick_threads(scaling) == 4  # 8 and 16 threads buy under 10% more than 4
    assert pick_threads({**scaling, 4: [1.2 * d for d in drift]}) == 8  # 4 is well behind 16: the next within 10%


def test_the_choice_is_measured_then_cached_and_not_cached_beside_other_work(tmp_path):
    cache, measure = tmp_path / "c.json", FakeMeasure({1: 100.0, 2: 190.0})
    first = choose_threads(resolved(), PROCGEN, 5.0, 2, measure=measure, path=cache)
    assert (first.threads, first.ceiling, first.source, first.stored) == (2, 2, "measured", True)
    assert first.rates == {"1": 100.0, "2": 190.0} and measure.calls == [[1, 2]]
    again = choose_threads(resolved(), PROCGEN, 5.0, 2, measure=refuse, path=cache, load=lambda: 0.05)
    assert (again.threads, again.source, again.rates) == (2, "cached", first.rates)
    assert "learner threads 2 of 2: from the measurement cached" in again.describe()
    beside = choose_threads(resolved(), PROCGEN, 5.0, 2, measure=refuse, path=cache, load=lambda: 1.5)
    assert (beside.threads, beside.source, beside.busy_cores) == (1, "cached", 1.5)  # two training runs beside it
    assert beside.to_dict()["cached_threads"] == 2 and "1 instead of 2 while other" in beside.describe()
    assert again.cached_threads is None and "instead of" not in again.describe()
    for unprobed in ({"beside_ranks": True}, {}):  # a run's own ranks; no measuring at all (limit_seconds 0)
        kept = choose_threads(resolved(), PROCGEN, 5.0 if unprobed else 0.0, 2, measure=refuse, path=cache,
                              load=refuse, **unprobed)
        assert (kept.threads, kept.busy_cores) == (2, None)
    other = choose_threads(resolved(), PROCGEN, 5.0, 4, measure=FakeMeasure({1: 100.0, 2: 104.0, 4: 105.0}),
                           path=cache)
    assert (other.threads, other.source) == (1, "measured")  # another ceiling: another entry
    assert len(json.loads(cache.read_text())) == 2

    busy = choose_threads(resolved(), PROCGEN, 5.0, 8, measure=FakeMeasure(dict.fromkeys([1, 2, 4, 8], 50.0), 1.5),
                          path=cache)
    assert (busy.threads, busy.stored) == (1, False) and "not cached" in busy.describe()
    assert len(json.loads(cache.read_text())) == 2
    ranks = choose_threads(resolved(), PROCGEN, 5.0, 8, measure=FakeMeasure(dict.fromkeys([1, 2, 4, 8], 50.0), 1.5),
                           path=cache, beside_ranks=True)
    assert ranks.stored  # a distributed run's own ranks measured at once: the rounds alone decided


@pytest.mark.parametrize("damage", [{"threads": 2.0}, {"threads": True}, {"rates": {"1": "slow"}}])
def test_a_cached_count_edited_into_nonsense_is_measured_again(tmp_path, damage):
    """2.0 or true passed `in counts` (2.0 == 2, True == 1), then torch.set_num_threads raised; rates of text broke
    the start line: measured again instead."""
    cache = tmp_path / "c.json"
    choose_threads(resolved(), PROCGEN, 5.0, 2, measure=FakeMeasure({1: 100.0, 2: 190.0}), path=cache)
    (key, entry), = json.loads(cache.read_text()).items()
    cache.write_text(json.dumps({key: {**entry, **damage}}))
    again = choose_threads(resolved(), PROCGEN, 5.0, 2, measure=FakeMeasure({1: 100.0, 2: 190.0}), path=cache)
    assert (again.threads, again.source) == (2, "measured") and type(again.threads) is int


def test_a_cached_count_gives_way_to_the_cores_other_work_keeps_busy():
    assert within_load(2, 2, 0.05) == 2 and within_load(2, 2, 0.3) == 1 and within_load(2, 2, 1.9) == 1
    assert within_load(8, 16, 4.2) == 8 and within_load(8, 16, 9.5) == 6 and within_load(16, 16, 15.9) == 1


def test_no_measurement_where_there_is_nothing_to_choose(tmp_path):
    cache = tmp_path / "c.json"
    assert choose_threads(resolved(3), PROCGEN, 5.0, 16, measure=refuse, path=cache).threads == 3
    assert choose_threads(resolved(0), PROCGEN, 5.0, 16, measure=refuse, path=cache).threads == 16
    assert (choose_threads(resolved(), PROCGEN, 5.0, 1, measure=refuse, path=cache).source) == "ceiling"
    small = choose_threads(resolved(), CARTPOLE, 5.0, 16, measure=refuse, path=cache)
    assert (small.threads, small.source) == (1, "default") and "not measured" in small.describe()
    budget = choose_threads(resolved(), PROCGEN, 0.0, 16, measure=refuse, path=cache)
    assert (budget.threads, budget.source) == (16, "unmeasured") and not cache.exists()


def test_the_real_measurement_times_every_count_and_keeps_the_callers_threads():
    cfg = resolved()
    cfg.model.impala_depths, cfg.model.hidden_size = [4, 8, 8], 32
    cfg.env.num_envs, cfg.training.batch_size = 2, 8
    before = torch.get_num_threads()
    measured = measure_threads(cfg, PROCGEN, 0.2, [1, 2])
    assert torch.get_num_threads() == before
    assert set(measured["counts"]) == {"1", "2"}
    for figures in measured["counts"].values():
        assert len(figures["round_sps"]) == ROUNDS and min(figures["round_sps"]) > 0 and figures["limit_sps"] > 0


def test_auto_plans_the_ceiling_that_the_measurement_chooses_within(monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(16)), raising=False)
    auto = build_config(None, {}, ["parallel.num_workers=4"], True)
    assert auto.parallel.learner_threads == "auto" and thread_plan(auto, True).learner == 16
    overlapped = build_config(None, {}, ["parallel.num_workers=4", "parallel.overlap=true"], True)
    assert thread_plan(overlapped, True).learner == 12


@pytest.mark.parametrize("value", ["-1", "many", "2.5"])
def test_a_bad_thread_count_is_refused(value):
    with pytest.raises(ConfigError, match="learner_threads"):
        build_config(None, {}, [f"parallel.learner_threads={value}"], True)


def test_the_start_line_says_why_a_measured_choice_was_not_cached():
    measured = {"1": 10.0, "2": 19.0, "4": 20.0}
    line = ThreadChoice(2, 4, "measured", measured, 0.0, True).describe()
    assert line.startswith("learner threads 2 of 4: measured now, compute limit SPS 1 thread 10, 2 threads 19") and \
        "not cached" not in line
    assert ThreadChoice(2, 4, "measured", measured, 1.5, False).describe().endswith(
        "not cached: other processes kept the machine busy")
    assert ThreadChoice(2, 4, "measured", measured, 0.0, False).describe().endswith(
        "not cached: the cache is not writable")


def test_a_learner_on_another_device_keeps_the_ceiling_unmeasured(monkeypatch, tmp_path):
    monkeypatch.setattr(learner_threads, "learner_device", lambda cfg: torch.device("cuda"))
    choice = choose_threads(resolved(), PROCGEN, 5.0, 16, measure=refuse, path=tmp_path / "c.json")
    assert (choice.threads, choice.source) == (16, "device")


def test_tune_trains_on_the_chosen_threads_and_measures_the_limit_on_them(monkeypatch, tmp_path):
    monkeypatch.setenv(CACHE_DIR_VARIABLE, str(tmp_path))
    monkeypatch.setattr(learner_threads, "measure_threads", FakeMeasure({1: 100.0, 2: 150.0, 4: 160.0}))
    monkeypatch.setattr(before_run, "matmul_peaks", lambda cfg, beside_ranks: {"fp32": 100.0, "bf16": 200.0})
    cfg = resolved()
    cfg.model.impala_depths, cfg.model.hidden_size = [4, 8, 8], 32
    cfg.env.num_envs, cfg.training.batch_size, cfg.run.limit_seconds = 2, 8, 0.2
    said = []
    with threads_kept():
        tuning = tune(cfg, PROCGEN, 4, say=said.append)
        assert torch.get_num_threads() == 2
    assert said == [before_run.measuring_line(0.2)] and "--set run.limit_seconds=0 skips it" in said[0]
    assert (tuning.threads.threads, tuning.threads.ceiling, tuning.threads.source) == (2, 4, "measured")
    assert tuning.compute_limit["threads"] == 2
    kept = settled(cfg, tmp_path, tuning.learner, 1)  # config.yaml's: a resumed run chooses again on its machine
    assert kept.parallel.learner_threads == "auto"


def test_an_overlapped_learner_whose_workers_wait_takes_what_auto_chooses_within_every_core(monkeypatch, tmp_path):
    """`parallel.idle_learner_threads`: `auto` is chosen as a synchronous learner's threads on every core (whatever
    the learner's own setting), and shares its cached choice where the settings are alike; a count is kept; none
    where it would be no more than the learner's own, or the update runs on a GPU. The run trains on its own
    threads, and its start lines say both."""
    monkeypatch.setenv(CACHE_DIR_VARIABLE, str(tmp_path))
    monkeypatch.setattr(learner_threads, "measure_threads", FakeMeasure({1: 100.0, 2: 150.0, 4: 190.0, 8: 200.0}))
    cfg = resolved(1)
    cfg.model.impala_depths, cfg.model.hidden_size = [4, 8, 8], 32
    with threads_kept():
        torch.set_num_threads(1)
        idle = before_run.idle_threads(cfg, PROCGEN, 0.2, 1, 8)
        assert (idle.threads, idle.ceiling, idle.source, idle.stored) == (4, 8, "measured", True), idle
        assert torch.get_num_threads() == 1
        torch.set_num_threads(8)  # as `tune` has a synchronous learner's threads while it chooses them
        synchronous = resolved()
        synchronous.model.impala_depths, synchronous.model.hidden_size = [4, 8, 8], 32
        synchronous = choose_threads(synchronous, PROCGEN, 0.0, 8, measure=refuse)
        assert (synchronous.threads, synchronous.source) == (4, "cached"), "one entry for both"
    assert before_run.idle_threads(resolved(1), CARTPOLE, 0.2, 1, 8) is None, "a small network: one, no more"
    assert before_run.idle_threads(cfg, PROCGEN, 0.2, 8, 8) is None
    sent = []  # a distributed run: every rank broadcasts once, whether it wants threads or not; rank 0's, capped
    rank = SimpleNamespace(distributed=True, broadcast=lambda value: sent.append(value) or idle)
    assert before_run.idle_threads(cfg, PROCGEN, 0.2, 8, 8, rank) is None and sent == [None]
    assert before_run.idle_threads(cfg, PROCGEN, 0.2, 1, 2, rank).threads == 2 and len(sent) == 2
    cfg.parallel.idle_learner_threads = 6
    configured = before_run.idle_threads(cfg, PROCGEN, 0.2, 1, 6)
    assert (configured.threads, configured.source) == (6, "config")
    on_cpu = before_run.learner_device
    monkeypatch.setattr(before_run, "learner_device", lambda cfg: torch.device("cuda"))
    assert before_run.idle_threads(cfg, PROCGEN, 0.2, 1, 6) is None
    monkeypatch.setattr(before_run, "learner_device", on_cpu)
    cfg.parallel.idle_learner_threads, cfg.run.limit_seconds = "auto", 0.0
    with threads_kept():
        tuning = tune(cfg, PROCGEN, 1, idle_ceiling=8, say=refuse)  # nothing measured: nothing said
        assert torch.get_num_threads() == 1
    assert (tuning.threads.threads, tuning.idle_threads.threads, tuning.idle_threads.source) == (1, 4, "cached")
    assert tuning.start_lines()[-1].startswith("learner threads 4 of 8 while its workers wait for the update: from the")
    assert tuning.record()["idle_threads"]["threads"] == 4
