"""The benchmarking suite's outputs: phase times that account for the wall time, and the scaling sweep's
files and arithmetic (checked against the runs' own metrics; no test asserts a speed)."""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from conftest import make_environ, toy_envs_environ

from parallel_ppo.bench.trainer_runs import end_processes
from parallel_ppo.cli.common import Terminated
from parallel_ppo.runs.reading import load_run

ROOT = Path(__file__).resolve().parents[1]
QUICK = ["--set", "logging.tensorboard=false", "--set", "run.limit_seconds=0.5"]


@pytest.mark.slow
@pytest.mark.parametrize("script", ["train_timed.py", "train_parallel_timed.py"])
def test_phase_times_add_up_to_wall_time(tmp_path, script):
    out = tmp_path / "run"
    proc = subprocess.run([sys.executable, script, "--config", "config/cartpole.yaml", "--total-steps", "4096",
                           "--output-dir", str(out), *QUICK], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    summary = json.loads((out / "summary.json").read_text())
    total = sum(summary["phase_seconds"].values())
    assert abs(total - summary["wall_seconds"]) <= 0.05 * summary["wall_seconds"], (total, summary["wall_seconds"])
    assert abs(sum(summary["phase_fractions"].values()) - 1) <= 0.05
    limit = summary["compute_limit"]
    formula = 1 / (1 / limit["forward_rate"] + limit["n_epochs"] / limit["train_rate"])
    assert limit["limit_sps"] == pytest.approx(formula)
    assert summary["limit_efficiency"] == pytest.approx(summary["sps"] / limit["limit_sps"])


@pytest.mark.slow
def test_scaling_sweep_writes_consistent_results(tmp_path):
    out = tmp_path / "scaling"
    proc = subprocess.run([sys.executable, "bench.py", "scaling", "--config", "config/cartpole.yaml",
                           "--workers", "2", "--envs-per-worker", "8", "--seconds", "2", "--output-dir", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    for name in ("scaling.json", "scaling.md", "scaling.png"):
        assert (out / name).stat().st_size > 0
    assert (out / "scaling.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    points = json.loads((out / "scaling.json").read_text())["points"]
    assert [(p["workers"], p["envs"], p["ranks"]) for p in points] == [(0, 8, 0), (2, 16, 0), (2, 16, 2)]
    distributed = json.loads((Path(points[2]["run_dir"]) / "summary.json").read_text())
    assert distributed["mode"] == "distributed" and distributed["world_size"] == 2
    base = load_run("base", Path(points[0]["run_dir"])).steady_sps
    for p in points:
        own = load_run("point", Path(p["run_dir"])).steady_sps
        assert p["steps_per_second"] == pytest.approx(own)
        assert p["speedup"] == pytest.approx(own / base)
        assert p["efficiency"] == pytest.approx(p["speedup"] / max(p["workers"], 1))
        summary = json.loads((Path(p["run_dir"]) / "summary.json").read_text())
        assert p["peak_rss_mb"] == summary["peak_rss_mb"]
    table = (out / "scaling.md").read_text()
    for p in points[1:]:
        assert f"{p['speedup']:.2f}×" in table and f"{100 * p['efficiency']:.0f}%" in table


@pytest.mark.slow
def test_env_bench_reports_every_path(tmp_path):
    """On a dict observation with normalization on, as robosuite Lift's config has, and an asymmetric actor-critic
    whose actor predicts the critic's extra keys (the random policy reads and predicts nothing)."""
    out = tmp_path / "envs.json"
    args = ["--config", "config/cartpole.yaml", "--env", "toy_envs:CameraReach-v0", "--set", "model.kind=auto",
            "--set", "training.normalize_obs=true", "--set", "model.actor_keys=[camera,state]",
            "--set", "training.predict_privileged=0.5", "--num-workers", "2", "--num-envs-per-worker", "4",
            "--seconds", "0.5", "--output", str(out)]
    proc = subprocess.run([sys.executable, "bench.py", "envs", *args],
                          cwd=ROOT, capture_output=True, text=True, timeout=300, env=toy_envs_environ())
    assert proc.returncode == 0, proc.stderr
    rows = json.loads(out.read_text())["rows"]
    assert [(r["path"], r["policy"]) for r in rows] == [
        ("bare envs", "random"), ("sequential", "random"), ("parallel", "random"),
        ("sequential", "network"), ("parallel", "network")]
    assert all(r["steps_per_second"] > 0 and r["envs"] == 8 for r in rows)
    for r in rows[1:]:
        assert 0 <= r["env_share"] + r["inference_share"] + r["sync_share"] <= 1.05


@pytest.mark.slow  # starts bench.py (a Python that imports torch)
def test_sweep_rejects_bad_input_before_running(tmp_path):
    proc = subprocess.run([sys.executable, "bench.py", "scaling", "--workers", "1 zero",
                           "--output-dir", str(tmp_path / "s")], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "s").exists()


@pytest.mark.slow
def test_a_crashed_benchmark_run_is_a_crash_and_refused_settings_are_not(tmp_path, monkeypatch):
    """A point whose trainer fails (here a worker fault) raises BenchRunCrashed, which the sweep reports with
    exit 1; one whose settings the trainer refuses (exit 2) is a ConfigError, which autotune skips."""
    from parallel_ppo.bench.scaling import run_point
    from parallel_ppo.bench.trainer_runs import BenchRunCrashed
    from parallel_ppo.errors import ConfigError

    monkeypatch.chdir(ROOT)
    monkeypatch.setenv("PARALLEL_PPO_INJECT_FAULT", "0:1")  # worker 0 raises in its first rollout
    with pytest.raises(BenchRunCrashed, match="crashed .*worker 0 failed"):
        run_point(tmp_path / "crash", 2, 4, 5.0, "config/cartpole.yaml", ["--set", "logging.tensorboard=false"])
    monkeypatch.delenv("PARALLEL_PPO_INJECT_FAULT")
    with pytest.raises(ConfigError, match="refused its settings: .*batch size 3"):
        run_point(tmp_path / "refused", 2, 4, 5.0, "config/cartpole.yaml", ["--batch-size", "3"])


def test_autotune_writes_the_env_and_settings_it_measured_with_the_fastest_layout():
    """ppo_autotuned.yaml is the config file with the runs' --env and --set items (a --set env.id after --env wins),
    then the fastest layout: what was measured, not the file alone."""
    from parallel_ppo.bench.scaling import _autotuned_config

    best = {"ranks": 0, "workers": 2, "envs_per_worker": 8, "worker_threads": 1}
    extra = ["--env", "Acrobot-v1", "--set", "training.n_epochs=2", "--set", "env.num_envs=4", "--set",
             "training.learning_rate=1e-4"]
    cfg, trainer, command = _autotuned_config(best, str(ROOT / "config/cartpole.yaml"), extra, Path("t.yaml"))
    assert cfg["env"]["id"] == "Acrobot-v1" and "num_envs" not in cfg["env"]  # the layout sets the envs
    assert cfg["training"]["n_epochs"] == 2 and cfg["training"]["learning_rate"] == 1e-4
    assert cfg["parallel"].items() >= {"num_workers": 2, "num_envs_per_worker": 8, "worker_threads": 1}.items()
    assert (trainer, command) == ("train-parallel", "python -m parallel_ppo train-parallel --config t.yaml")
    cfg, _, _ = _autotuned_config({**best, "workers": 0}, str(ROOT / "config/cartpole.yaml"),
                                  ["--env", "Acrobot-v1", "--set", "env.id=MountainCar-v0"], Path("t.yaml"))
    assert cfg["env"]["id"] == "MountainCar-v0" and cfg["env"]["num_envs"] == 8


@pytest.mark.slow
def test_the_package_runs_outside_a_checkout(tmp_path):
    """`python -m parallel_ppo train` from any directory: the sweeps launch trainers this way."""
    proc = subprocess.run([sys.executable, "-m", "parallel_ppo", "train", "--env", "CartPole-v1", "--num-envs", "2",
                           "--set", "training.n_steps=16", "--batch-size", "32", "--total-steps", "64",
                           "--set", "run.limit_seconds=0", "--output-dir", "run"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["updates"] == 2


@pytest.mark.slow  # starts bench.py (a Python that imports torch)
def test_layouts_refuse_envs_that_do_not_split_before_running(tmp_path):
    proc = subprocess.run([sys.executable, "bench.py", "layouts", "--config", "config/cartpole.yaml", "--envs", "16",
                           "--processes", "2 3", "--output-dir", str(tmp_path / "l")], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1
    assert "16 envs do not split evenly over 3 processes" in proc.stderr
    assert not (tmp_path / "l").exists()


@pytest.mark.slow  # four short CartPole runs
def test_setting_pairs_writes_an_evidence_file(tmp_path):
    """scripts/setting_pairs.py: one pair of two settings (here the sequential trainer against overlapped workers,
    as `make overlap-speed` runs them), its table and an evidence file docs/results can use."""
    out = tmp_path / "pairs"
    proc = subprocess.run([sys.executable, "scripts/setting_pairs.py", "--config", "config/cartpole.yaml", "--pairs",
                           "1", "--minutes", "0.02", "--sequential-a", "--a", "small:",
                           "--b", "big: --set training.n_epochs=8 --set parallel.overlap=true",
                           "--a-checkout", str(ROOT),  # A from a checkout named (this one): its commit recorded
                           "--output-dir", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    evidence = json.loads((out / "pairs.json").read_text())
    assert {"machine", "cpu_kind", "cpu_family", "date", "commit", "command", "figures", "tables"} <= set(evidence)
    assert (evidence["a"]["trainer"], evidence["b"]["trainer"]) == ("sequential", "parallel")
    assert evidence["a"]["commit"] == evidence["commit"]
    modes = [json.loads((out / run / "summary.json").read_text())["mode"] for run in ("small_1", "big_1")]
    assert modes == ["sequential", "parallel"]
    (row,) = evidence["tables"]["pairs"]["rows"]
    assert row[3] == pytest.approx(row[2] / row[1], rel=1e-2) == evidence["figures"]["ratio_median"]
    assert row[4] == row[5] == "fp32/whole" and "| 1 |" in (out / "pairs.md").read_text()


def test_inference_cost_writes_an_evidence_file(tmp_path):
    """scripts/inference_cost.py on one core (its affinity): a worker's forward pass, the workers' batched and a round
    trip timed, the evidence file's figures those of its table, named for its settings; the batched pass set
    against the one core three workers would share, a step's saving only where one worker has the core."""
    def one_core() -> None:
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})

    def inference(*args: str) -> dict:
        proc = subprocess.run([sys.executable, "scripts/inference_cost.py", "--env", "CartPole-v1", "--steps", "2",
                               "--rounds", "1", "--results-dir", str(tmp_path), *args], cwd=ROOT, capture_output=True,
                              text=True, timeout=120, preexec_fn=one_core)
        assert proc.returncode == 0, proc.stderr
        (written,) = [line.removeprefix("wrote ") for line in proc.stdout.splitlines() if line.startswith("wrote ")]
        return {"path": Path(written), **json.loads(Path(written).read_text())}

    three = inference("--workers", "3", "--set", "training.gamma=0.9")
    assert three["path"].name == \
        "inference_cost-cartpole-cartpole-v1-training-gamma-0-9-3-workers-cpu-1-threads.json"
    assert {"machine", "cpu_kind", "date", "commit", "command", "figures", "tables"} <= set(three)
    (worker, batched, trip), f = three["tables"]["cost"]["rows"], three["figures"]
    assert (worker[1], batched[1], trip[1]) == (4, 12, 0)  # cartpole.yaml: 4 envs a worker
    assert (worker[2], batched[2], trip[2]) == (f["worker_ms"], f["batched_ms"], f["round_trip_ms"])
    assert three["setting"]["cores"] == 1 and f["saved_ms_a_worker_step"] is None  # 3 workers on 1 core
    assert f["batched_over_workers"] == pytest.approx(f["batched_obs_per_s"] / f["worker_obs_per_s"], rel=0.02,
                                                      abs=0.006)  # 1 core: the workers' own rate is one worker's
    one = inference("--workers", "1")
    (worker, batched, trip), f = one["tables"]["cost"]["rows"], one["figures"]
    assert f["saved_ms_a_worker_step"] == pytest.approx(worker[2] - batched[2] - trip[2], abs=2e-3)


def test_an_interrupted_benchmark_or_comparison_is_one_line_and_status_130(tmp_path, monkeypatch, capsys):
    """Ctrl-C in bench.py (its runs stopped by then) or compare_results.py: one line, the shell's status for SIGINT;
    a speed check whose trainer a Ctrl-C stopped before its first update is interrupted, not crashed."""
    from parallel_ppo.bench import speedcheck
    from parallel_ppo.cli import bench, compare

    def interrupt(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(bench, "roofline", interrupt)
    assert bench.main(["roofline", "--config", str(ROOT / "config/cartpole.yaml")]) == 130
    assert capsys.readouterr().err == "\nbench.py: interrupted; what it wrote before stays\n"
    monkeypatch.setattr(compare, "make_report", interrupt)
    assert compare.main(["--run", f"a={tmp_path}", "--run", f"b={tmp_path}"]) == 130
    assert capsys.readouterr().err == "\ncompare_results.py: interrupted; the report was not written\n"

    class Trainer:  # waited for, interrupted (Ctrl-C, then SIGTERM), then ended before its first update
        calls = 0
        stop: type[KeyboardInterrupt] = KeyboardInterrupt

        def __init__(self, cmd):
            pass

        def wait(self):
            Trainer.calls += 1
            if Trainer.calls % 2:
                raise Trainer.stop
            return 130

    monkeypatch.setattr(speedcheck.subprocess, "Popen", Trainer)
    for Trainer.stop in (KeyboardInterrupt, Terminated):  # a SIGTERM stays one: bench.py says terminated, 143
        with pytest.raises(Trainer.stop) as stopped:
            speedcheck.run_trainer(["trainer"])
        assert type(stopped.value) is Trainer.stop


def test_ending_a_benchmarks_trainers_leaves_their_exit_status_to_the_code_that_started_them():
    """`end_processes` (a benchmark's SIGTERM, an interrupted study) stops its trainers without reaping them: a
    reaped child reads as status 0 to its Popen, so a speed check went on to measure a trainer killed mid-run."""
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        end_processes([psutil.Process(child.pid)])
        assert child.wait(timeout=10) == -signal.SIGTERM
    finally:
        child.kill()
        child.wait()


def test_a_benchmark_result_the_disk_does_not_take_is_one_line_and_status_1(tmp_path, monkeypatch, capsys):
    """bench.py's result files (roofline's and envs' --output, speed-check's, the sweeps') on a full disk: one line
    naming the file, status 1, no folder left that was made for it."""
    import errno

    from parallel_ppo.cli import bench

    def full(path, data):
        raise OSError(errno.ENOSPC, "No space left on device")

    def measured(args, prog):
        bench._write_json(tmp_path / "new" / "r.json", {"sps": 1})
        return 0

    monkeypatch.setattr(bench, "write_json", full)
    monkeypatch.setattr(bench, "roofline", measured)
    assert bench.main(["roofline", "--config", str(ROOT / "config/cartpole.yaml")]) == 1
    assert capsys.readouterr().err == (f"bench.py: error: could not write {tmp_path / 'new' / 'r.json'}: OSError: "
                                       "[Errno 28] No space left on device\n")
    assert not (tmp_path / "new").exists()


def test_the_pair_scripts_read_a_config_from_where_they_are_called(tmp_path, monkeypatch):
    """`--config` names a file from the current directory where one is there (as --output-dir does), else from the
    checkout; one inside the checkout is named relative to it, so that --a-checkout's copy is found by that name."""
    from parallel_ppo.bench.trainer_runs import checkout_path

    monkeypatch.chdir(tmp_path)
    (tmp_path / "mine.yaml").write_text("env: {id: CartPole-v1}\n")
    assert checkout_path("mine.yaml", ROOT) == str(tmp_path / "mine.yaml")
    assert checkout_path("config/cartpole.yaml", ROOT) == "config/cartpole.yaml"  # not here: the checkout's
    assert checkout_path(str(ROOT / "config" / "cartpole.yaml"), ROOT) == "config/cartpole.yaml"
    monkeypatch.chdir(ROOT / "config")
    assert checkout_path("cartpole.yaml", ROOT) == "config/cartpole.yaml"


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
def test_make_bench_robot_checks_its_pairs_before_the_render_measurement(tmp_path):
    """`make bench-robot` with ARGS the trainers refuse: one line and exit 2 before render_cost.py's minutes (the
    pairs checked it only after them); `mode_pairs.py --check` with good ones runs and writes nothing."""
    env = make_environ()
    out = tmp_path / "robot"
    proc = subprocess.run(["make", "-s", "--no-print-directory", "-o", "install", "bench-robot", f"PY={sys.executable}",
                           f"OUT={out}", "ARGS=--set training.bogus=1"], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=120)
    lines = [line for line in proc.stderr.strip().splitlines() if not line.startswith("make: ***")]
    assert proc.returncode == 2 and len(lines) == 1 and "unknown config key 'training.bogus'" in lines[0], proc.stderr
    assert proc.stdout == "" and not out.exists()
    checked = subprocess.run([sys.executable, "scripts/mode_pairs.py", "--check", "--config", "config/cartpole.yaml",
                              "--output-dir", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert (checked.returncode, checked.stdout, checked.stderr) == (0, "", "") and not out.exists()


@pytest.mark.parametrize("argv", [
    ["scripts/inference_cost.py", "--config", "no.yaml", "--output", "{out}"],
    ["scripts/inference_cost.py", "--env", "CartPole-v1", "--threads", "99999", "--output", "{out}"],
    ["scripts/inference_cost.py", "--env", "CartPole-v1", "--output", "{bad}/x.json"],
    ["scripts/mode_pairs.py", "--config", "no.yaml", "--output-dir", "{out}"],
    ["scripts/setting_pairs.py", "--config", "no.yaml", "--a", "a:", "--b", "b:", "--output-dir", "{out}"],
    ["scripts/mode_pairs.py", "--pairs", "0", "--output-dir", "{out}"],
    ["scripts/mode_pairs.py", "--output-dir", "{bad}/out"],
    ["scripts/setting_pairs.py", "--config", "config/cartpole.yaml", "--a", "a:", "--b", "a: --set training.gamma=0.9",
     "--output-dir", "{out}"],
    ["scripts/setting_pairs.py", "--config", "config/cartpole.yaml", "--a", "a: --set nope.key=1", "--b", "b:",
     "--output-dir", "{out}"],
    ["scripts/learning_matrix.py", "--jobs", "0", "--output", "{out}"],
    ["scripts/memory_cost.py", "--config", "config/cartpole.yaml", "--envs", "2", "2", "--output", "{out}"],
    ["scripts/time_targets.py", "lint", "--output", "{bad}"],
])
def test_scripts_refuse_bad_input_in_one_line_before_they_write(tmp_path, argv):
    """A missing config, a count of 0, one env count (no slope), an evidence file that is not JSON, an output folder
    inside a file, one label for both settings: exit 2 and one line, before any run and without writing (the bad
    evidence file left as it was)."""
    bad = tmp_path / "bad.json"
    bad.write_text('{"figures": [')
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, *(a.format(out=out, bad=bad) for a in argv)], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert not out.exists() and bad.read_text() == '{"figures": ['


BENCH_REFUSALS = {
    "an empty --processes": (["study", "--processes", ""], "--processes must be positive whole numbers, got ''"),
    "an empty --workers": (["scaling", "--workers", ""], "--workers must be positive whole numbers, got ''"),
    "a study run of over a week": (["study", "--seconds", "1000d"], "--seconds: a benchmark run takes at most 7d"),
    "a learning run of over a week": (["learning", "--minutes", "8d"], "--minutes: a benchmark run takes at most 7d"),
    "a learning run under 0.1 s": (["learning", "--minutes", "1e-9"], "--minutes: a benchmark run takes at least"),
    "a study point the trainer refuses": (
        ["study", "--env", "CartPole-v1", "--processes", "1000", "--families", "workers", "--seconds", "5"],
        "workers point at 1000 processes would be refused by the trainer: 1000 workers (parallel.num_workers) × 8 "
        "envs per worker (parallel.num_envs_per_worker) = 8000 envs, more than the supported maximum"),
    "a layout the trainer refuses": (["layouts", "--processes", "3", "--envs", "6"],
                                     "run r3_e2 would be refused by the trainer: batch size 256"),
    "a sweep point the trainer refuses": (["scaling", "--workers", "1 2", "--envs-per-worker", "8 3"],
                                          "run w1_e3 would be refused by the trainer: batch size 256"),
    "a seed the trainer refuses": (["learning", "--seeds", "0,99999999999"],  # seed 0 passes, as the trainers take it
                                   "seed 99999999999 would be refused by the trainer: run.seed"),
    "a count twice": (["scaling", "--workers", "1 2 1"], "--workers lists 1 twice, got '1 2 1'"),
    "a family twice": (["study", "--families", "threads,workers,threads"], "--families lists threads twice"),
    "a study with no point here": (["study", "--families", "copies", "--processes", "1"],
                                   "no points to run here (copies start at 2)"),
    "a seed set for every seed": (["learning", "--variant", "a:run.seed=7"],
                                  "--set run.seed would give every seed's run the same one"),
    "a results folder no file goes in": (["study", "--results-dir", "/proc/x"], "cannot write --results-dir /proc/x"),
    "a sweep's folder no file goes in": (["scaling", "--output-dir", "/proc/x"], "cannot write --output-dir /proc/x"),
    "a learning folder no file goes in": (["learning", "--output-dir", "/proc/x"], "cannot write --output-dir /proc/x"),
    "a speed check's folder no file goes in": (["speed-check", "--output-dir", "/proc/x"],
                                               "cannot write --output-dir /proc/x"),
    "a precision the CPU learner lacks": (["scaling", "--set", "training.precision=tf32"],
                                          "would be refused by the trainer: training.precision tf32 needs"),
}


@pytest.mark.slow  # starts bench.py (a Python that imports torch)
@pytest.mark.parametrize("case", list(BENCH_REFUSALS), ids=list(BENCH_REFUSALS))
def test_benchmarks_refuse_bad_input_in_one_line_before_any_run(tmp_path, case):
    """A list left empty, a run too long to time out, any run whose settings the trainer would refuse (a late one
    too): exit 2 and one line, before the first run starts and before anything is written."""
    argv, needle = BENCH_REFUSALS[case]
    out = tmp_path / "out"
    where = (["--runs-dir", str(out / "runs"), "--results-dir", str(out / "results")] if argv[0] == "study"
             else ["--output-dir", str(out)])
    proc = subprocess.run([sys.executable, "bench.py", argv[0], *where, *argv[1:]], cwd=ROOT,  # the case's dirs win
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert needle in proc.stderr and proc.stdout == "" and not out.exists(), proc.stderr


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
@pytest.mark.parametrize("target", ["bench-learning", "bench-mujoco", "bench-atari"])
def test_make_passes_seeds_as_one_argument(target):
    """SEEDS="1 2" reaches bench.py as one --seeds value (make -n: nothing runs)."""
    env = make_environ()
    out = subprocess.run(["make", "-n", "-o", "install", target, "SEEDS=1 2"], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=60, check=True).stdout
    words = shlex.split(out.replace("\\\n", " "))
    assert words[words.index("--seeds") + 1] == "1 2", out


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
@pytest.mark.parametrize("env_id, config", [("sim/Sleep?step_ms=1&horizon=50", "sim_lift.yaml"),
                                            ("CartPole-v1", "cartpole.yaml"), ("", "ppo_sequential.yaml")])
def test_make_passes_an_env_id_and_a_run_folder_as_one_argument_each(env_id, config):
    """ENV with an id's options (? and &, which the shell would take for a glob and a background job) and OUT with
    a space, & or a quote reach the trainer as one value each (make -n: nothing runs), the config the family's
    shipped one for an env that is no Procgen game (chosen by this Python, PY: a venv other than the checkout's
    .venv, as `make test VENV=...` has, runs it too)."""
    env = make_environ()
    out = subprocess.run(["make", "-n", "-o", "install", "train", f"ENV={env_id}", "OUT=it's a&b",
                          f"PY={sys.executable}"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60,
                         check=True).stdout
    words = shlex.split(out.replace("\\\n", " "))
    assert (words[words.index("--env") + 1] if env_id else "") == env_id
    assert words[words.index("--output-dir") + 1] == "it's a&b"
    chosen = subprocess.run(["bash", "-c", f'echo "{words[words.index("--config") + 1]}"'], cwd=ROOT,
                            capture_output=True, text=True, timeout=60, check=True).stdout.strip()
    assert Path(chosen) == ROOT / "config" / config, out


STAND_IN = """
import multiprocessing, signal, sys, time
import psutil
from pathlib import Path
from parallel_ppo.bench import learning
from parallel_ppo.cli.bench import main

trainer = ("import os, signal, sys, time; from pathlib import Path; "
           "signal.signal(signal.SIGTERM, lambda *a: (Path(sys.argv[1], 'stopped').touch(), sys.exit(0))); "
           "Path(sys.argv[1], 'pid').write_text(str(os.getpid())); time.sleep(120)")
real = learning.run_bench_trainer  # run as it is, on a stand-in trainer
learning.run_bench_trainer = lambda cmd, name: real([sys.executable, "-c", trainer, sys.argv[1]], name)
helper = multiprocessing.get_context("spawn").Process(target=time.sleep, args=(120,), daemon=True)
helper.start()  # multiprocessing's, with its resource tracker: stopped by the code that started them, not by SIGTERM
status = main(["learning", "--env", "CartPole-v1", "--minutes", "10", "--seeds", "1", "--output-dir",
               str(Path(sys.argv[1], "runs"))])
alive = psutil.pid_exists(helper.pid) and psutil.Process(helper.pid).status() != psutil.STATUS_ZOMBIE
Path(sys.argv[1], "helper").write_text(str(alive))  # not is_alive(): a process reaped by psutil reads alive
sys.exit(status)
"""


def test_a_benchmark_killed_by_its_pid_stops_its_trainer_and_says_so(tmp_path):
    """SIGTERM to bench.py alone (`kill PID`, a scheduler's limit; Ctrl-C reaches the trainer too): its trainer is sent
    SIGTERM and has stopped by the time bench.py ends, with one line and status 143. Before, bench.py died silently
    and its trainer trained on for its whole duration."""
    bench = subprocess.Popen([sys.executable, "-c", STAND_IN, str(tmp_path)], cwd=ROOT, stdout=subprocess.DEVNULL,
                             stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        for _ in range(600):  # the stand-in trainer is up once it has written its pid (a safety net of 60 s)
            if (tmp_path / "pid").is_file() and (tmp_path / "pid").read_text():
                break
            assert bench.poll() is None, bench.stderr.read()
            time.sleep(0.1)
        bench.send_signal(signal.SIGTERM)
        _, err = bench.communicate(timeout=60)
    finally:  # whatever is left of its process group (before the fix: the trainer)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(bench.pid, signal.SIGKILL)
    assert (bench.returncode, err) == (143, "bench.py: terminated; what it wrote before stays\n")
    assert (tmp_path / "stopped").is_file()  # its trainer had SIGTERM, not a SIGKILL after 10 s
    assert not psutil.pid_exists(int((tmp_path / "pid").read_text()))
    assert (tmp_path / "helper").read_text() == "True"
