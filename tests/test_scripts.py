"""The helper scripts in scripts/ as a user meets them: bad input refused in one line (exit 2) before anything is
measured, a Ctrl-C one line (exit 130) with nothing half-written, a failed step's figure not recorded. Each script
runs in this process with its measurement replaced by a stand-in: nothing is measured or trained."""

from __future__ import annotations

import contextlib
import errno
import functools
import importlib.util
import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path
from types import ModuleType

import pytest

from parallel_ppo.envs.batch import env_spaces
from parallel_ppo.errors import ConfigError

ROOT = Path(__file__).resolve().parents[1]
CARTPOLE = str(ROOT / "config" / "cartpole.yaml")


@functools.cache
def script(name: str) -> ModuleType:
    """scripts/<name>.py loaded as a module (its `main` not run)."""
    spec = importlib.util.spec_from_file_location(f"script_{name}", ROOT / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run(module: ModuleType, argv: list[str], monkeypatch, capsys) -> tuple[int, list[str], str]:
    """`main()` of a script given `argv`: its exit status, the lines it wrote on stderr and its stdout."""
    monkeypatch.setattr(sys, "argv", [Path(module.__file__).name, *argv])
    try:
        status = module.main()
    except SystemExit as e:  # argparse's refusal, or a message passed to sys.exit (status 1)
        status = e.code if isinstance(e.code, int) else print(e.code, file=sys.stderr) or 1
    except KeyboardInterrupt:
        pytest.fail("the Ctrl-C left main() as a traceback")
    captured = capsys.readouterr()
    return status, captured.err.strip().splitlines(), captured.out


def interrupt(*args, **kwargs):
    raise KeyboardInterrupt


def measured(*args, **kwargs):
    raise AssertionError("measured before its input was checked")


def mujoco_or_skip() -> None:
    if importlib.util.find_spec("mujoco") is None:
        pytest.skip("render_cost.py times MuJoCo envs: MuJoCo is not installed")


INTERRUPTED = {  # script: its arguments ({out}: the output file) and what the Ctrl-C lands in
    "inference_cost": (["--env", "CartPole-v1", "--threads", "1", "--output", "{out}"], "measure"),
    "memory_cost": (["--config", CARTPOLE, "--output", "{out}"], "child"),
    "render_cost": (["--output", "{out}"], "subprocess.run"),
    "learner_choice": ([CARTPOLE, "--output", "{out}"], "choose"),
    "learner_threads": (["--config", CARTPOLE, "--output", "{out}"], "measure"),
    "allocator_faults": (["--output", "{out}"], "subprocess.run"),
    "update_ab": (["--config", CARTPOLE, "--updates", "4"], "parallel_ppo.tuning.learner_settings.choose"),
    "time_targets": (["ok", "--cwd", "{tmp}", "--output", "{out}"], "time_target"),
}


@pytest.mark.parametrize("name", INTERRUPTED)
def test_a_ctrl_c_in_a_measuring_script_is_one_line_and_status_130(tmp_path, monkeypatch, capsys, name):
    """Ctrl-C during the measurement: `PROG: interrupted; ...` alone on stderr, status 130 (the shell's for
    SIGINT), no evidence file (was a KeyboardInterrupt traceback)."""
    argv, target = INTERRUPTED[name]
    module, out = script(name), tmp_path / "out.json"
    if name == "render_cost":
        mujoco_or_skip()
    (tmp_path / "Makefile").write_text("ok:\n\t@true\n")
    monkeypatch.setattr("parallel_ppo.core.allocator.retain_freed_memory", lambda: True)  # update_ab's: not here
    if "." in target:
        monkeypatch.setattr(target, interrupt)
    else:
        monkeypatch.setattr(module, target, interrupt)
    status, err, _ = run(module, [a.format(out=out, tmp=tmp_path) for a in argv], monkeypatch, capsys)
    assert status == 130 and len(err) == 1 and ": interrupted; " in err[0], err
    assert not out.exists()


def test_a_ctrl_c_in_learning_matrix_starts_no_other_run(tmp_path, monkeypatch, capsys):
    """Ctrl-C while the first of three runs trains: the runs not started are cancelled (the pool's exit started
    each, to its end, before the interrupt was seen), one line, status 130, no JSON."""
    module, started, stopping = script("learning_matrix"), [], threading.Event()

    class Pool(module.ThreadPoolExecutor):
        def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
            super().shutdown(wait=False, cancel_futures=cancel_futures)  # the runs not started: cancelled now
            stopping.set()  # the run under way may end (a Ctrl-C stops it): no timing decides the order
            super().shutdown(wait=wait)

    def train_once(config, mode, seed, *args):
        started.append(seed)
        if len(started) == 1:  # the Ctrl-C, as the terminal's reaches this process
            signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)
        assert stopping.wait(60), "the pool was not shut down"
        return {"failed": "interrupted"}

    monkeypatch.setattr(module, "ThreadPoolExecutor", Pool)
    monkeypatch.setattr(module, "train_once", train_once)
    out = tmp_path / "matrix.json"
    # Python's own handler, as a terminal's python has it: a process started in the background inherits SIGINT ignored
    inherited = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        status, err, _ = run(module, ["--seeds", "1", "2", "3", "--threads", "1", "--modes", "sequential", "--output",
                                   str(out)], monkeypatch, capsys)
    finally:
        signal.signal(signal.SIGINT, inherited)
    assert status == 130 and len(err) == 1 and ": interrupted; " in err[0], err
    assert started == [1] and not out.exists()


MATRIX_TRAINER = """
import os, signal, sys, time
from pathlib import Path
seed, marks = sys.argv[sys.argv.index("--seed") + 1], Path(os.environ["MATRIX_MARKS"])
(marks / f"started_{seed}").touch()
if signal.getsignal(signal.SIGTERM) is signal.SIG_IGN:  # inherited: the matrix's SIGTERM could not stop it
    (marks / f"ignored_{seed}").touch()
if seed == "1":  # a scheduler's SIGTERM reaches the matrix while its first run trains; that run ends on it at once
    signal.signal(signal.SIGTERM, lambda *a: sys.exit(1))
    os.kill(os.getppid(), signal.SIGTERM)
time.sleep(120)
(marks / f"finished_{seed}").touch()
"""
MATRIX = """
import sys
sys.path.insert(0, "scripts")
import learning_matrix
learning_matrix.ENTRY = {"sequential": sys.argv[1]}
sys.argv = ["learning_matrix.py", "--seeds", "1", "2", "3", "--threads", "1", "--modes", "sequential"]
sys.exit(learning_matrix.main())
"""


def test_a_sigterm_to_learning_matrix_stops_every_run_it_started(tmp_path):
    """SIGTERM while the first run trains: that run ends, and the run the pool's thread started in its place before
    the interrupt was seen (before: waited for to its end, SIGTERM ignored meanwhile) is stopped too, by SIGTERM (it
    inherited SIGTERM ignored, and took a SIGKILL 10 s later); one line, 143."""
    trainer = tmp_path / "trainer.py"
    trainer.write_text(MATRIX_TRAINER)
    matrix = subprocess.Popen([sys.executable, "-c", MATRIX, str(trainer)], cwd=ROOT, stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, text=True, start_new_session=True,
                              env={**os.environ, "MATRIX_MARKS": str(tmp_path)})
    try:
        _, err = matrix.communicate(timeout=100)  # a safety net: the runs sleep 120 s
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(matrix.pid, signal.SIGKILL)
    assert (matrix.returncode, err) == (143, "learning_matrix.py: terminated; no result was written\n")
    assert {p.name for p in tmp_path.glob("started_*")} <= {"started_1", "started_2"}
    assert not list(tmp_path.glob("finished_*")) and not list(tmp_path.glob("ignored_*"))


@pytest.mark.parametrize("argv", [["--set", "env.id=Nope-v0"], ["--set", "bogus"], ["--threads", "0"],
                                  ["--set", "training.batch_size=0"], ["--output", "{tmp}"],
                                  ["--output", "{tmp}/file/out.json"]])
def test_learning_matrix_refuses_a_bad_setting_before_any_run(tmp_path, monkeypatch, capsys, argv):
    """An env id or a --set the trainers refuse, a folder as --output: one line, status 2, no run started (each
    run was started and failed on it)."""
    (tmp_path / "file").write_text("")
    monkeypatch.setattr(script("learning_matrix"), "train_once", measured)
    status, err, _ = run(script("learning_matrix"), [a.format(tmp=tmp_path) for a in argv], monkeypatch, capsys)
    assert status == 2 and len(err) == 1 and "learning_matrix.py: error: " in err[0], err


def test_learning_matrix_runs_a_seed_given_twice_once_and_says_the_steps_trained(monkeypatch, capsys):
    """`--seeds 1 1`: one run (two shared a directory); the closing line names the steps the runs trained (whole
    rollouts), not only the --total-steps asked for."""
    module, started = script("learning_matrix"), []

    def train_once(config, mode, seed, threads, steps, sets, out):
        started.append((mode, threads, seed))
        return {"episodic_return_mean": 500.0, "total_env_steps": 256}

    monkeypatch.setattr(module, "train_once", train_once)
    status, _, out = run(module, ["--seeds", "1", "1", "--threads", "1", "1", "--modes", "sequential",
                                  "sequential", "--total-steps", "100"], monkeypatch, capsys)
    assert status == 0 and started == [("sequential", 1, 1)]
    assert "1 of 1 runs reached a mean return of 475 (last 100 episodes) within 256 steps" in out
    monkeypatch.setattr(module, "train_once", lambda *a: {"failed": "exit status 1: no such env"})
    status, _, out = run(module, ["--seeds", "1", "--threads", "1", "--modes", "sequential"], monkeypatch, capsys)
    assert status == 1 and "0 of 1 runs reached a mean return of 475 (last 100 episodes) (every run failed" in out


OUTPUT_FIRST = {  # script: its arguments and what would measure
    "memory_cost": (["--config", CARTPOLE], "child"),
    "render_cost": ([], "subprocess.run"),
    "allocator_faults": ([], "subprocess.run"),
    "time_targets": (["ok", "--cwd", "{tmp}"], "time_target"),
}


@pytest.mark.parametrize("output", ["{tmp}", "{tmp}/file/out.json"])
@pytest.mark.parametrize("name", OUTPUT_FIRST)
def test_an_output_no_file_can_be_written_to_is_refused_before_measuring(tmp_path, monkeypatch, capsys, name,
                                                                          output):
    """--output a folder, or in a file: one line, status 2, before the measurement (was a traceback after it)."""
    argv, target = OUTPUT_FIRST[name]
    if name == "render_cost":
        mujoco_or_skip()
    (tmp_path / "Makefile").write_text("ok:\n\t@true\n")
    (tmp_path / "file").write_text("")
    if target == "subprocess.run":
        monkeypatch.setattr(subprocess, "run", measured)
    else:
        monkeypatch.setattr(script(name), target, measured)
    status, err, _ = run(script(name), [*(a.format(tmp=tmp_path) for a in argv), "--output",
                                     output.format(tmp=tmp_path)], monkeypatch, capsys)
    assert status == 2 and len(err) == 1 and ": error: " in err[0], err


def unbuildable(cfg_env):
    """`env_spaces` for an env that cannot be built (MUJOCO_GL=bogus): any but CartPole."""
    if cfg_env.id != "CartPole-v1":
        raise ConfigError(f"{cfg_env.id} needs MuJoCo, which failed to import")
    return env_spaces(cfg_env)


def test_an_env_that_cannot_be_built_is_one_line_before_any_measurement(tmp_path, monkeypatch, capsys):
    """update_ab.py and learner_threads.py (its second config's env; the first was measured, then a traceback)
    refuse an env that cannot be built in one line, status 2, before measuring."""
    mujoco = str(ROOT / "config" / "mujoco.yaml")
    monkeypatch.setattr("parallel_ppo.envs.batch.env_spaces", unbuildable)
    monkeypatch.setattr("parallel_ppo.tuning.learner_settings.choose", measured)
    status, err, _ = run(script("update_ab"), ["--config", mujoco, "--updates", "4"], monkeypatch, capsys)
    assert status == 2 and err == ["update_ab.py: error: HalfCheetah-v5 needs MuJoCo, which failed to import"]
    threads = script("learner_threads")
    monkeypatch.setattr(threads, "env_spaces", unbuildable)
    monkeypatch.setattr(threads, "choose", measured)
    status, err, _ = run(threads, ["--config", CARTPOLE, mujoco, "--output", str(tmp_path / "out.json")], monkeypatch,
                      capsys)
    assert status == 2 and err == ["learner_threads.py: error: HalfCheetah-v5 needs MuJoCo, which failed to import"]


def test_memory_cost_says_a_failed_measurement_in_its_last_line(tmp_path, monkeypatch, capsys):
    """A child measurement that failed (an env that cannot be built): its error's line, status 2 (was its whole
    traceback relayed, status 1)."""
    traceback = "Traceback (most recent call last):\n  File \"x.py\", line 1\nConfigError: MUJOCO_GL=bogus\n"
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: subprocess.CompletedProcess(a, 1, "", traceback))
    out = tmp_path / "out.json"
    status, err, _ = run(script("memory_cost"), ["--config", CARTPOLE, "--output", str(out)], monkeypatch, capsys)
    assert status == 2 and err == ["memory_cost.py: error: python: ConfigError: MUJOCO_GL=bogus"]
    assert not out.exists()


@pytest.mark.parametrize("seconds", ["inf", "nan", "-1", "0"])
def test_learner_threads_refuses_seconds_that_are_no_budget(tmp_path, monkeypatch, capsys, seconds):
    """--seconds of inf or nan (a ConfigError traceback) or -1 (exit 0, evidence saying 'unmeasured'): refused as
    learner_choice.py refuses them, one line, status 2."""
    monkeypatch.setattr(script("learner_threads"), "measure", measured)
    status, err, _ = run(script("learner_threads"), ["--config", CARTPOLE, "--seconds", seconds, "--output",
                                                  str(tmp_path / "out.json")], monkeypatch, capsys)
    assert status == 2 and len(err) == 1 and "argument --seconds" in err[0], err


@pytest.fixture
def make_targets(tmp_path, monkeypatch):
    """A checkout with a Makefile of a target that passes and one that fails, and an evidence file that holds the
    failing one's earlier pass; time_targets.py's docs left alone (its ROOT here, not the checkout)."""
    (tmp_path / "Makefile").write_text("ok:\n\t@true\nbad:\n\t@false\n")
    evidence = tmp_path / "make_targets.json"
    evidence.write_text(json.dumps({"figures": {"bad": 5}, "tables": {"times": {"rows": [
        ["make bad", 5, "passed", "2026-01-01", "abc", "scripts/time_targets.py bad"]]}}}))
    module = script("time_targets")
    monkeypatch.setattr(module, "ROOT", tmp_path)
    monkeypatch.setattr(module, "write_docs", lambda: None, raising=False)
    return module, evidence


def test_time_targets_keeps_a_failed_targets_last_pass(make_targets, tmp_path, monkeypatch, capsys):
    """A target that failed leaves its figure and row as its last pass left them (its failed time was the
    figure), the one that passed is recorded, status 1."""
    module, evidence = make_targets
    status, _, _ = run(module, ["ok", "bad", "--cwd", str(tmp_path), "--output", str(evidence)], monkeypatch, capsys)
    written = json.loads(evidence.read_text())
    rows = {row[0]: row for row in written["tables"]["times"]["rows"]}
    assert status == 1 and written["figures"]["bad"] == 5 and "ok" in written["figures"]
    assert rows["make bad"] == ["make bad", 5, "passed", "2026-01-01", "abc", "scripts/time_targets.py bad"]
    assert rows["make ok"][2] == "passed"


def test_time_targets_refuses_a_target_the_makefile_lacks(make_targets, tmp_path, monkeypatch, capsys):
    """A mistyped target: one line, status 2, before any target runs (it was timed as a failure of 0 s and
    saved)."""
    module, evidence = make_targets
    before = evidence.read_text()
    monkeypatch.setattr(module, "time_target", measured)
    status, err, _ = run(module, ["ok", "nope", "--cwd", str(tmp_path), "--output", str(evidence)], monkeypatch, capsys)
    assert status == 2 and len(err) == 1 and err[0].startswith("time_targets: error: make nope: "), err
    assert evidence.read_text() == before


def test_stress_stops_its_trainer_on_ctrl_c(monkeypatch, capsys):
    """Ctrl-C in stress.py: its trainer, in a session of its own that the terminal's Ctrl-C does not reach, is
    stopped; one line, status 130 (was a traceback, the trainer left running)."""
    module = script("stress")
    trainer = subprocess.Popen(["sleep", "60"], start_new_session=True,  # stopped by SIGINT, as a trainer is,
                               preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))  # whatever we inherited

    def round_(*args):
        getattr(module, "LAUNCHED", []).append(trainer)
        raise KeyboardInterrupt

    monkeypatch.setattr(module, "worker_kill_round", round_)
    try:
        status, err, _ = run(module, ["--rounds", "1"], monkeypatch, capsys)
        assert status == 130 and len(err) == 1 and ": interrupted; " in err[0], err
        assert trainer.poll() is not None
    finally:
        trainer.kill()
        trainer.wait()


@pytest.mark.parametrize("rounds", ["0", "-1", "1.5"])
def test_stress_refuses_rounds_that_are_not_a_whole_number_of_at_least_1(monkeypatch, capsys, rounds):
    """--rounds 0 printed '0/0 passed' and exit 0."""
    monkeypatch.setattr(script("stress"), "worker_kill_round", measured)
    status, err, _ = run(script("stress"), ["--rounds", rounds], monkeypatch, capsys)
    assert status == 2 and len(err) == 1 and "argument --rounds" in err[0], err


@pytest.mark.parametrize("repeats", ["0", "abc", "1.5", ""])
def test_stress_signals_refuses_repeats_that_are_not_a_whole_number_of_at_least_1(repeats):
    """scripts/stress_signals.sh N: 0 passed as '0/0 repeats passed', 1.5 ran once, abc failed in seq."""
    proc = subprocess.run(["bash", str(ROOT / "scripts" / "stress_signals.sh"), repeats], capture_output=True,
                          text=True, timeout=30)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr == f"stress_signals.sh: error: N must be a whole number of at least 1, got '{repeats}'\n"


def test_a_result_file_the_disk_does_not_take_is_one_line_and_leaves_no_folder(tmp_path, capsys):
    """The scripts write their result files through one helper: a full disk is one line naming the file, status 1
    (some scripts raised a traceback, two said it with status 2), and the folders made for it are removed."""
    from parallel_ppo.cli.common import write_result

    def full(path: Path) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    out = tmp_path / "new" / "result.json"
    assert write_result("memory_cost.py", out, full) == 1
    assert capsys.readouterr().err == (f"memory_cost.py: error: could not write {out}: OSError: [Errno 28] No space "
                                       "left on device\n")
    assert not (tmp_path / "new").exists()
    assert write_result("memory_cost.py", out, lambda path: path.write_text("{}")) == 0 and out.read_text() == "{}"


@pytest.mark.parametrize(("plan", "inference", "refused"), [
    ("threads:1 bogus:1", "", "PLAN items are family:counts"), ("threads:1 workers", "", "not 'workers'"),
    ("threads:1 workers:0,2", "", "not 'workers:0,2'"), ("threads:1 workers:8,16,8", "", "not 'workers:8,16,8'"),
    ("threads:1", "abc", "INFERENCE is a number of workers")])
def test_offline_study_refuses_a_bad_plan_item_before_the_first_point(plan, inference, refused, tmp_path):
    """scripts/offline_study.sh: a bad PLAN item (or INFERENCE) is one line, exit 2, before any point: it was found
    once the points before it (the whole study, for INFERENCE) had run, on a lent machine's scarce minutes."""
    env = {k: v for k, v in os.environ.items() if k not in ("GL", "SETS")}
    env.update(PATH=f"{Path(sys.executable).parent}:{env['PATH']}", ENV="sim/Sleep", CONFIG="config/sim_lift.yaml",
               PLAN=plan, INFERENCE=inference)
    proc = subprocess.run(["bash", str(ROOT / "scripts" / "offline_study.sh"), str(tmp_path / "res"), "1"], env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and proc.stdout == "" and not (tmp_path / "res").exists(), proc.stdout
    assert len(proc.stderr.splitlines()) == 1 and refused in proc.stderr, proc.stderr
