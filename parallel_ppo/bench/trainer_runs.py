"""Running a benchmark's trainer commands to their end, one (`run_bench_trainer`) or several at once
(`run_together`: the study's copies), with what each adds to its command: a failure named, a run that hangs or is
interrupted stopped with every process under it."""

from __future__ import annotations

import contextlib
import re
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import psutil

from parallel_ppo.errors import ConfigError


class BenchRunCrashed(RuntimeError):
    """A benchmark run failed for a reason other than its settings (which the trainer refuses with exit 2)."""


def checkout_path(path: str, root: Path) -> str:
    """A file named to a script that runs a checkout's trainers (`--config`): from the current directory where a file
    is there, else from the checkout `root`, as given; one inside `root` relative to it, so that another checkout's
    copy has the same name."""
    if not Path(path).is_file():
        return path
    full = Path(path).resolve()
    return str(full.relative_to(root.resolve())) if full.is_relative_to(root.resolve()) else str(full)


def trainer_command(workers: int, ranks: int = 0) -> list[str]:
    """The trainer, run as a module of the installed package, so the sweep works outside a checkout too; with
    `ranks`, as that many ranks of a distributed run under torchrun on this host."""
    command = "train-parallel" if workers else "train"
    if ranks:
        return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(ranks),
                "-m", "parallel_ppo", command, "--distributed"]
    return [sys.executable, "-m", "parallel_ppo", command]


BENCH_RUN_SETS = ("--set", "logging.progress=off", "--set", "run.limit_seconds=0", "--set", "eval.interval_seconds=0")
"""What every benchmark run adds to its trainer command: no progress line, no compute-limit measurement and no
periodic evaluation, so the run's time is training alone."""

RANK_REFUSED = re.compile(r"exitcode\s*:\s*2\b")
"""How torchrun reports a rank that exited with status 2 (it exits 1 itself)."""


def run_bench_trainer(cmd: list[str], name: str, timeout: float | None = None, cwd: Path | None = None,
                      env: dict[str, str] | None = None) -> None:
    """Run a benchmark's trainer command to its end: exit 2 (settings refused; for torchrun, a rank's exit 2) is
    a ConfigError, any other failure a BenchRunCrashed, each naming the run and the trainer's error line (its
    last line when it printed none: torchrun ends with its own report). A run still going after `timeout`
    seconds counts as crashed; it is stopped with every process under it (torchrun's ranks live in sessions of
    their own, so a process group would miss them), as it is when this process is interrupted. `cwd` and `env`:
    where and with what environment it runs (this process's by default)."""
    with subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, cwd=cwd,
                          env=env) as child:
        try:
            _, stderr = child.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            stop_tree(child)
            raise BenchRunCrashed(f"benchmark run {name} hung: stopped after {timeout:.0f} s") from None
        except BaseException:
            stop_tree(child)
            raise
    if child.returncode != 0:
        lines = stderr.strip().splitlines() or ["no output"]
        last = next((line for line in reversed(lines) if ": error: " in line), lines[-1])
        if child.returncode == 2 or RANK_REFUSED.search(stderr):
            raise ConfigError(f"benchmark run {name} refused its settings: {last}")
        raise BenchRunCrashed(f"benchmark run {name} crashed (exit status {child.returncode}): {last}")


def run_together(commands: list[list[str]], name: str, timeout: float) -> list[float]:
    """Run every command at once to its end (`run_bench_trainer` each, command i named `<name> (copy i)`) and return
    when each ended (`time.monotonic`); once all have ended, the failure of the lowest-numbered failed command is
    raised. Interrupted, it stops the runs it started first."""
    stopping = threading.Event()  # set when interrupted: a thread not yet started starts no run

    def run(i: int) -> float:
        if stopping.is_set():
            raise KeyboardInterrupt
        run_bench_trainer(commands[i], name if len(commands) == 1 else f"{name} (copy {i})", timeout)
        return time.monotonic()

    if len(commands) == 1:
        return [run(0)]
    before = {proc.pid for proc in psutil.Process().children()}
    with ThreadPoolExecutor(len(commands)) as pool:
        try:
            futures = [pool.submit(run, i) for i in range(len(commands))]
            failures = [f.exception() for f in futures]
        except BaseException:  # a thread stops its own run only when it is the one interrupted
            stopping.set()
            tree: list[psutil.Process] = []
            for proc in (proc for proc in psutil.Process().children() if proc.pid not in before):
                with contextlib.suppress(psutil.NoSuchProcess):
                    tree += [proc, *proc.children(recursive=True)]
            end_processes(tree)
            raise
    failed = next((e for e in failures if e is not None), None)
    if failed is not None:
        raise failed
    return [f.result() for f in futures]


def _ended(proc: psutil.Process) -> bool:
    """Whether `proc` has exited: gone, or a zombie that its parent has yet to reap."""
    try:
        return proc.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def end_processes(procs: list[psutil.Process], grace: float = 10.0) -> None:
    """SIGTERM to each of `procs` (a trainer then writes its checkpoint and frees its shared memory), SIGKILL to
    those left after `grace` seconds. It reaps none of them: the code that started each still reads its exit status
    (a reaped child reads as status 0 to its `Popen`)."""
    for proc in procs:
        with contextlib.suppress(psutil.NoSuchProcess):
            proc.terminate()
    deadline = time.monotonic() + grace
    while (alive := [proc for proc in procs if not _ended(proc)]) and time.monotonic() < deadline:
        time.sleep(0.05)
    for proc in alive:
        with contextlib.suppress(psutil.NoSuchProcess):
            proc.kill()


def stop_tree(child: subprocess.Popen, grace: float = 10.0) -> None:
    """`end_processes` for `child` and every process under it; then read what remains of its output."""
    try:
        procs = [psutil.Process(child.pid), *psutil.Process(child.pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        procs = []
    end_processes(procs, grace)
    try:
        child.communicate(timeout=grace)
    except subprocess.TimeoutExpired:  # a grandchild we could not see still holds the pipe
        pass
