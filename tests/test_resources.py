"""Resource accounting and the allocator setting: peaks between samples, and freed memory kept for reuse."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from parallel_ppo.runs.metrics import ResourceSampler

linux_only = pytest.mark.skipif(not os.path.exists("/proc/self/clear_refs"), reason="needs Linux /proc")


@linux_only
def test_sampler_catches_a_peak_between_samples():
    """Memory touched and freed between two samples (an update's activations) still counts in the peaks."""
    sampler = ResourceSampler()
    before = dict(sampler.peaks)
    block = bytearray(300 * 2**20)  # zero-filled: every page is touched
    del block
    row = sampler.sample()
    assert row["system/main_rss_mb"] < before["main_rss_mb"] + 150  # it is gone by sampling time ...
    assert sampler.peaks["main_rss_mb"] >= before["main_rss_mb"] + 250  # ... but the peak saw it
    assert sampler.peaks["rss_mb"] >= before["rss_mb"] + 250
    assert sampler.peaks["pss_mb"] >= before["pss_mb"] + 250
    # the high-water mark restarts at every sample: a quiet interval does not raise the peak again
    quiet = sampler.sample()
    assert quiet["system/main_rss_mb"] < before["main_rss_mb"] + 150
    sampler.close()


@linux_only
def test_sampler_counts_children_and_their_peaks():
    """A child's memory shows in the tree totals, and its transient peak in the tree's peak."""
    child = subprocess.Popen([sys.executable, "-c", textwrap.dedent("""
        import sys, time
        sys.stdin.readline()  # the block comes after the sampler's first reading, however slow the machine
        block = bytearray(200 * 2**20)
        del block
        print("ready", flush=True)
        time.sleep(60)
    """)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        sampler = ResourceSampler()  # resets the child's high-water mark: its start-up peak is not counted
        child.stdin.write("go\n")
        child.stdin.flush()
        assert child.stdout.readline().strip() == "ready"
        baseline = sampler.peaks["rss_mb"]
        row = sampler.sample()
        assert row["system/rss_mb"] > row["system/main_rss_mb"]  # the child is in the tree
        assert sampler.peaks["rss_mb"] >= baseline + 150
        sampler.close()
    finally:
        child.kill()
        child.wait()


@pytest.mark.slow
@linux_only
def test_retained_memory_is_reused_without_page_faults():
    """With retain_freed_memory, PPO minibatch steps reuse freed memory; glibc's default faults pages back in.

    How many pages a step faults depends on the CPU, glibc and the kernel's huge-page setting (measured
    per step at minibatch 64: 6,600 vs 410 on an Intel Xeon, 17,000-24,000 vs a few hundred on an AMD EPYC),
    so only the direction is checked, with a margin that holds on any of them."""
    script = textwrap.dedent("""
        import math, resource, sys, torch
        from parallel_ppo.core.allocator import retain_freed_memory
        from parallel_ppo.core.config import Config
        from parallel_ppo.core.model import build_model
        from parallel_ppo.core.ppo import TrainBatch, minibatch_step
        if sys.argv[1] == "retain":
            assert retain_freed_memory()
        torch.manual_seed(0)
        cfg = Config()
        cfg.training.microbatch_size = 32
        cfg.training.precision = "fp32"
        model = build_model((64, 64, 3), 15, cfg.model)
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-4)
        n = 64
        batch = TrainBatch(torch.randint(0, 256, (n, 64, 64, 3), dtype=torch.uint8), torch.randint(0, 15, (n,)),
                           torch.full((n,), -math.log(15)), torch.zeros(n), torch.randn(n), torch.randn(n))
        for _ in range(3):  # warm-up: the heap grows to its working size
            minibatch_step(model, optimizer, batch, cfg.training)
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        for _ in range(5):
            minibatch_step(model, optimizer, batch, cfg.training)
        print((resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / 5)
    """)
    faults = {}
    for mode in ("retain", "default"):
        out = subprocess.run([sys.executable, "-c", script, mode], capture_output=True, text=True, check=True,
                             cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        faults[mode] = float(out.stdout.split()[-1])
    assert faults["retain"] < faults["default"] / 3, faults


def test_mean_cpu_weights_each_sample_by_the_seconds_it_covers(tmp_path, monkeypatch):
    """Samples are at least SAMPLE_SECONDS apart and cover unequal stretches (the first from the sampler's first
    reading to the first update, the one `finish` takes the run's last seconds): the mean CPU weights them by time."""
    import types

    from parallel_ppo.core.config import Config
    from parallel_ppo.runs import training

    now = [100.0]
    monkeypatch.setattr(training, "time", types.SimpleNamespace(monotonic=lambda: now[0]))  # this module's clock only
    monkeypatch.setattr(training, "SAMPLE_SECONDS", 4.0)

    def slow_progress(*args: object) -> None:  # set-up after the sampler's first reading takes 2 s
        now[0] += 2.0

    monkeypatch.setattr(training, "make_progress", slow_progress)
    cfg = Config()
    cfg.logging.tensorboard = False
    hook = training.MetricsHook(cfg, tmp_path, "sequential", None)
    cpu = iter([100.0, 200.0, 50.0])
    monkeypatch.setattr(hook.sampler, "sample", lambda: {"system/cpu_percent": next(cpu)})
    try:
        hook.finish()  # no update finished: nothing to add, and no mean to report
        assert hook.cpu_samples == [] and hook.mean_cpu_percent is None
        row = {"progress/update": 1, "progress/env_steps": 10, "progress/wall_time": 1.0}
        for t in (103.0, 105.0, 109.0):  # the update at 105 is under SAMPLE_SECONDS after the one at 103
            now[0] = t
            hook.after_update(None, row)
        now[0] = 110.0
        hook.finish()
        assert hook.cpu_samples == [(100.0, 3.0), (200.0, 6.0), (50.0, 1.0)]
        assert hook.mean_cpu_percent == pytest.approx((300 + 1200 + 50) / 10)  # one vote each would say 116.7
    finally:
        hook.close()
