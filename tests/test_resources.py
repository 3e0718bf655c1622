"""Resource accounting and the allocator setting: peaks between samples, and freed memory kept for reuse."""

from __future__ import annotations

import json
import os
import platform
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


MALLINFO2 = """
    import ctypes, ctypes.util, json, sys
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    class Mallinfo2(ctypes.Structure):
        _fields_ = [(name, ctypes.c_size_t) for name in
                    "arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks fordblks keepcost".split()]
    libc.mallinfo2.restype = Mallinfo2
    libc.malloc.argtypes, libc.malloc.restype = [ctypes.c_size_t], ctypes.c_void_p
    libc.free.argtypes = [ctypes.c_void_p]
    if sys.argv[1] in ("retain", "release"):
        from parallel_ppo.core.allocator import release_freed_memory, retain_freed_memory
        assert not release_freed_memory()  # nothing retained: the process's own settings stay
        assert retain_freed_memory()
        if sys.argv[1] == "release":
            assert release_freed_memory() and not release_freed_memory()
    def info():
        m = libc.mallinfo2()
        return {name: getattr(m, name) for name, _ in Mallinfo2._fields_}
    before = info()
    block = libc.malloc(8 * 2**20)
    allocated = info()
    libc.free(block)
    print(json.dumps([before, allocated, info()]))
"""


def _has_mallinfo2() -> bool:
    import ctypes
    import ctypes.util

    if platform.libc_ver()[0] != "glibc":
        return False
    try:
        return hasattr(ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6"), "mallinfo2")
    except OSError:
        return False


@pytest.mark.skipif(not _has_mallinfo2(), reason="needs glibc 2.33+ (mallinfo2)")
def test_retain_freed_memory_serves_large_blocks_from_the_heap_and_keeps_them():
    """retain_freed_memory raises glibc's mmap threshold (an 8 MiB block comes from the heap, not from its own
    mmap, which glibc's default gives it) and its trim threshold (freeing the block does not shrink the heap);
    release_freed_memory (the Python API's, after a run) gives the block its own mmap again.
    Read from glibc's own accounting (mallinfo2) in a fresh process each: no timing, no page counts. How many
    page faults that saves a PPO step is a measurement: scripts/allocator_faults.py."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MALLOC_", "GLIBC_TUNABLES"))}  # the defaults

    def run(mode: str) -> tuple[dict, dict, dict]:
        out = subprocess.run([sys.executable, "-c", textwrap.dedent(MALLINFO2), mode], capture_output=True, env=env,
                             text=True, check=True, cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        return tuple(json.loads(out.stdout))

    block = 8 * 2**20
    before, allocated, _ = run("default")
    assert allocated["hblkhd"] >= before["hblkhd"] + block  # glibc's default: a block of its own, mmapped
    assert allocated["uordblks"] < before["uordblks"] + block
    before, allocated, freed = run("retain")
    assert allocated["hblkhd"] == before["hblkhd"]  # retained: no mmap ...
    assert allocated["uordblks"] >= before["uordblks"] + block  # ... the heap serves it
    assert freed["arena"] == allocated["arena"]  # freed, it stays in the heap for the next step
    assert freed["uordblks"] < allocated["uordblks"]
    before, allocated, _ = run("release")
    assert allocated["hblkhd"] >= before["hblkhd"] + block  # glibc's starting threshold again


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


def test_the_learner_does_not_wait_for_a_sample_after_the_first(tmp_path, monkeypatch):
    """A sample due after the first runs on the sampler's thread: the update's row has the latest one finished and
    the hook returns at once; the next row has the new one. The first row waits for its own; an error is raised,
    but not by the last sample, which only the mean CPU would take."""
    import threading
    import types
    from concurrent import futures

    from parallel_ppo.core.config import Config
    from parallel_ppo.runs import training

    now = [100.0]
    monkeypatch.setattr(training, "time", types.SimpleNamespace(monotonic=lambda: now[0]))
    cfg = Config()
    cfg.logging.tensorboard = False
    hook = training.MetricsHook(cfg, tmp_path, "sequential", None)
    logged, release, fail, values = [], threading.Event(), threading.Event(), iter([10.0, 20.0])

    def sample() -> dict[str, float]:
        value = next(values, None)
        if value is None:
            assert fail.wait(5)  # held until the hook has returned
            raise RuntimeError("no /proc here")
        if value == 20.0:
            assert release.wait(5)  # held until the hook has returned
        return {"system/cpu_percent": value}

    monkeypatch.setattr(hook.sampler, "sample", sample)
    monkeypatch.setattr(hook.logger, "log", lambda row: logged.append(row.get("system/cpu_percent")))
    try:
        for t in (101.0, 112.0):  # the second is due, and held
            now[0] = t
            hook.after_update(None, {})
        assert logged == [10.0, 10.0]
        release.set()
        hook._pending.result(30)  # the thread is done with it
        now[0] = 113.0  # not due: the row takes the one finished
        hook.after_update(None, {})
        assert logged == [10.0, 10.0, 20.0] and hook.cpu_samples == [(10.0, 1.0), (20.0, 11.0)]
        now[0] = 124.0
        hook.after_update(None, {})  # asked for; its error comes with the next row
        fail.set()
        futures.wait([hook._pending], 30)
        with pytest.raises(RuntimeError, match="no /proc"):
            hook.after_update(None, {})
        hook.finish()  # the last sample fails too: the mean stands on those before, and the run's files get written
        assert hook.cpu_samples == [(10.0, 1.0), (20.0, 11.0)]
    finally:
        hook.close()
