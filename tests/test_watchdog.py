"""The worker watchdog: a worker that steps or computes is alive, one that does neither for its bound is hung."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from conftest import toy_envs_environ

from parallel_ppo.core.configure import build_config
from parallel_ppo.core.threads import thread_plan
from parallel_ppo.engines.parallel import coordinator
from parallel_ppo.engines.parallel.coordinator import ParallelCoordinator
from parallel_ppo.engines.parallel.watchdog import CEILING, FACTOR, FLOOR, Watchdog, auto_bound, work_seconds
from parallel_ppo.envs.batch import env_spaces
from parallel_ppo.runs.training import RunPlan, train_run

ROOT = Path(__file__).resolve().parents[1]


def test_the_auto_bound_follows_the_measured_start_with_a_floor():
    assert auto_bound(0.05) == FLOOR
    assert auto_bound(7.0) == FACTOR * 7.0 > FLOOR


def test_steps_or_cpu_time_count_as_progress_and_neither_does_not():
    dog = Watchdog(bound=10.0)
    assert dog.read(0, steps=0, cpu=1.0, now=100.0) == (0.0, 0.0)  # the first reading marks the start
    assert dog.read(0, steps=5, cpu=1.0, now=130.0) == (0.0, 0.0)  # it stepped
    assert dog.read(0, steps=5, cpu=4.0, now=160.0) == (0.0, 30.0)  # no step for 30 s, but 3 s of CPU: a long reset
    assert dog.hung(0, steps=5, cpu=4.0, now=165.0) is None
    assert dog.read(0, steps=5, cpu=4.01, now=170.0) == (10.0, 40.0)  # a trickle of CPU is not work
    assert dog.hung(0, steps=5, cpu=4.02, now=171.0) == "neither stepped nor computed for 10 s"
    dog.forget(0)  # a restarted worker starts afresh
    assert dog.read(0, steps=0, cpu=0.0, now=172.0) == (0.0, 0.0)


def test_a_share_of_a_core_is_measured_over_the_whole_silence():
    """A worker that uses under 5% of a core while it takes no step is idle however long it is watched: small
    readings do not add up to progress once the silence is long."""
    dog = Watchdog(bound=20.0)
    dog.read(1, steps=3, cpu=0.0, now=0.0)
    for second in range(1, 31):
        idle, _ = dog.read(1, steps=3, cpu=0.01 * second, now=float(second))
    assert idle == 30.0
    assert dog.read(1, steps=3, cpu=2.0, now=31.0) == (0.0, 31.0)  # then it works: busy again, still no step


def test_computing_forever_without_a_step_is_a_hang_too():
    dog = Watchdog(bound=2.0)
    assert dog.ceiling == CEILING and Watchdog(bound=500.0).ceiling == 1000.0
    assert all(dog.hung(2, steps=7, cpu=float(t), now=float(t)) is None for t in range(0, int(CEILING) + 1, 10))
    assert dog.hung(2, steps=7, cpu=CEILING + 1, now=CEILING + 1) == "computed without taking a step for 600 s"


def test_a_gone_process_has_no_cpu_time():
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    assert work_seconds(child.pid) is None
    assert work_seconds(os.getpid()) > 0


def _run_queue_accounted() -> bool:
    try:
        with open("/proc/self/schedstat") as f:
            return f.read().split()[0] != "0"
    except OSError:
        return False


@pytest.mark.skipif(not _run_queue_accounted(), reason="no run-queue account in /proc")
def test_a_worker_kept_waiting_for_a_core_is_working():
    """A process at the lowest priority on one core beside a spinning one runs for a sliver of the time and waits
    for the core the rest: the time it runs or waits adds up to about the time that passed, which the watchdog counts
    as work (a sleeping process does neither)."""
    core = {min(os.sched_getaffinity(0))}
    spin = "import os, sys; os.sched_setaffinity(0, {%d}); os.nice(int(sys.argv[1])); exec('while True: pass')"
    spinners = [subprocess.Popen([sys.executable, "-c", spin % min(core), nice]) for nice in ("0", "19")]
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; print(flush=True); time.sleep(60)"],
                               stdout=subprocess.PIPE)
    try:
        sleeper.stdout.readline()  # asleep from here on
        time.sleep(1.0)  # the spinners started
        before = [work_seconds(p.pid) for p in (*spinners, sleeper)]
        time.sleep(3.0)
        grew = [work_seconds(p.pid) - b for p, b in zip((*spinners, sleeper), before, strict=True)]
    finally:
        for p in (*spinners, sleeper):
            p.kill()
            p.wait()
    assert grew[1] > 1.0, grew  # the low-priority one ran or waited for most of the 3 s (a wait counts once it runs)
    assert grew[2] < 0.05, grew  # asleep: no work


def test_a_lower_reading_moves_the_mark_down_and_a_missing_one_does_not():
    """A thread that ends takes its run-queue wait with it: the work is counted from the lower reading. A process
    gone for a reading (None) leaves the mark as it was."""
    dog = Watchdog(bound=2.0)
    dog.read(3, steps=1, cpu=5.0, now=0.0)
    assert dog.read(3, steps=1, cpu=None, now=0.5) == (0.5, 0.5)  # gone for a reading: no mark below 0
    assert dog.read(3, steps=1, cpu=4.0, now=1.0) == (1.0, 1.0)  # a thread ended with its wait: counted from 4 s
    assert dog.read(3, steps=1, cpu=4.2, now=2.0) == (0.0, 2.0)  # 0.2 s of work since: it works


def _trainer(tmp_path: Path, env_id: str, timeout: str, steps: int,
             extra_env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    env = {**toy_envs_environ(), **(extra_env or {})}
    args = ["--config", "config/mujoco.yaml", "--env", f"toy_envs:{env_id}", "--num-workers", "2",
            "--num-envs-per-worker", "1", "--total-steps", str(steps), "--set", "training.n_steps=32",
            "--set", "training.batch_size=64", "--set", "training.n_epochs=1", "--set", "run.limit_seconds=0",
            "--set", "logging.tensorboard=false", "--set", f"parallel.worker_timeout={timeout}",
            "--set", "training.normalize_obs=false", "--output-dir", str(tmp_path / "run")]
    return subprocess.run([sys.executable, "train_parallel_timed.py", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)


@pytest.mark.slow
def test_a_long_reset_beside_busy_processes_is_not_a_hang(tmp_path):
    """Each worker's reset computes for 5 s of CPU time with the cores taken by two spinning processes, which start
    spinning as the first such reset starts (two workers and two spinners on 2 cores: 10 s of wall time or more; 5 s
    where cores are free): it takes no step for longer than the 4-second bound, but it computes, so it is not
    restarted. (A 1-second bound restarted one beside a training run as well: a stretch of a second in which a worker
    gets under 5% of a core, the watchdog's sign of work, is rare but not unheard of on a shared 2-core machine; 4 s
    leaves room for a stall of seconds.)"""
    flag = tmp_path / "slow_reset"
    spin = f"import os, time\nwhile not os.path.exists({str(flag)!r}): time.sleep(0.01)\nwhile True: pass"
    spinners = [subprocess.Popen([sys.executable, "-c", spin]) for _ in range(2)]
    try:
        out = _trainer(tmp_path, "SlowResetReach-v0", "4s", 64, {"SLOW_RESET_FLAG": str(flag)})
    finally:
        for spinner in spinners:
            spinner.kill()
            spinner.wait()
    assert out.returncode == 0, out.stderr
    assert flag.exists(), "no long reset ran"
    assert "a worker that neither steps nor computes for 4 s is restarted (parallel.worker_timeout)" in out.stdout
    assert "restarting" not in out.stderr, out.stderr


class HangClock:
    """The coordinator's `monotonic` clock, the watchdog's: still while the worker runs, so that no stall of a busy
    machine counts against it; HOP seconds on at each reading once it hangs (its env created the flag file) until it
    is restarted; still again from then on."""

    HOP = 0.5  # a quarter of the 2 s bound: a restart before the bound shows in `now`

    def __init__(self, flag: Path) -> None:
        self.flag, self.now, self.source = flag, 0.0, None

    def monotonic(self) -> float:
        if self.source is not None and self.source.restarts == 0 and self.flag.exists():
            self.now += self.HOP
            if self.now > 60:  # far past the bound: a watchdog that never restarts fails here, not at a timeout
                pytest.fail("the hung worker was not restarted within 60 s of the watchdog's clock")
        return self.now


@pytest.mark.slow
def test_a_hung_worker_is_restarted_after_its_bound(tmp_path, monkeypatch, capsys):
    """A worker whose env hangs (sleeps: no step, no CPU) is restarted once the watchdog has seen it neither step nor
    compute for over its 2 s bound, and its slot's rollout is collected again: the run ends its budget with that one
    restart. One worker, on HangClock: no other worker, nor the new one, can look hung however busy the machine."""
    monkeypatch.chdir(ROOT)
    monkeypatch.syspath_prepend(str(ROOT / "tests"))  # toy_envs, in the spawned workers too
    flag = tmp_path / "hung"
    monkeypatch.setenv("HANGING_REACH_FLAG", str(flag))  # spawned workers start with this environment
    clock = HangClock(flag)
    monkeypatch.setattr(coordinator, "time", SimpleNamespace(monotonic=clock.monotonic, perf_counter=time.perf_counter))
    cfg = build_config("config/mujoco.yaml", {"env.id": "toy_envs:HangingReach-v0", "run.output_dir": str(tmp_path),
                                              "run.total_steps": 128},
                       ["env.num_envs=2", "parallel.num_workers=1", "parallel.num_envs_per_worker=2",
                        "parallel.start_method=spawn", "parallel.worker_timeout=2", "training.n_steps=32",
                        "training.batch_size=64", "training.n_epochs=1", "training.normalize_obs=false",
                        "run.limit_seconds=0", "eval.interval_seconds=0", "logging.tensorboard=false",
                        "logging.progress=off"], True)
    spaces = env_spaces(cfg.env)
    source = clock.source = ParallelCoordinator(cfg, spaces, thread_plan(cfg, parallel=True))
    summary = train_run(RunPlan(cfg, spaces, tmp_path, source.mode, {}), source)
    err = capsys.readouterr().err
    assert flag.exists(), "no worker hung"
    assert clock.now > 2, clock.now  # restarted after the bound on this clock, not before it
    assert ("worker 0 neither stepped nor computed for 2 s (parallel.worker_timeout); restarting it with fresh envs "
            "(1/3)") in err, err
    assert (summary["stop_reason"], summary["worker_restarts"], summary["total_env_steps"]) == ("total_steps", 1, 128)
