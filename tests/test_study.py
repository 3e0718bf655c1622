"""The many-core study (`bench.py study`): its points and scaling rule, its arithmetic against the runs' own
figures, its files, and a results folder built over several calls. No test asserts a speed."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from fake_runs import STEADY, write_run

import parallel_ppo.bench.study as study_module
import parallel_ppo.tuning.learner_settings as learner_settings
from parallel_ppo.bench.copies import copies_row, copy_commands
from parallel_ppo.bench.study import (
    StudySettings,
    drawing_tag,
    family_points,
    machine_folder,
    machine_results_dir,
    plan_study,
    point_command,
    process_counts,
    recorded_families,
    results_name,
    results_slug,
)
from parallel_ppo.bench.study_arithmetic import no_points_reasons
from parallel_ppo.bench.study_merge import config_digest, earlier_points
from parallel_ppo.bench.study_pages import (
    add_ratios,
    chunks,
    copies_note,
    cut_note,
    learner_minibatch,
    merge_rows,
    mesa_threads,
    pace_note,
    point_chunk_text,
    results_files,
    study_table,
)
from parallel_ppo.bench.trainer_runs import BenchRunCrashed, run_together
from parallel_ppo.core.configure import build_config
from parallel_ppo.core.threads import OWN_DRAW_THREADS
from parallel_ppo.engines.distributed import Ranks
from parallel_ppo.errors import ConfigError, RunDataError
from parallel_ppo.runs.fingerprint import DRAWING_VARIABLES, drawing
from parallel_ppo.runs.reading import load_run

ROOT = Path(__file__).resolve().parents[1]
SETTINGS = StudySettings("config/ppo_parallel.yaml", "starpilot", 30.0)


def flag(cmd: list[str], name: str) -> str:
    return cmd[cmd.index(name) + 1]


def sets(cmd: list[str]) -> dict[str, str]:
    return dict(cmd[i + 1].split("=", 1) for i, a in enumerate(cmd) if a == "--set")


def test_points_cover_powers_of_two_up_to_the_cores_and_ranks_start_at_two():
    assert process_counts(16) == [1, 2, 4, 8, 16] and process_counts(6) == [1, 2, 4, 6] and process_counts(1) == [1]
    assert family_points(["threads", "ranks"], [1, 2, 4], cores=4) == [
        ("threads", 1), ("threads", 2), ("threads", 4), ("ranks", 2), ("ranks", 4)]
    # past the cores (a simulated study's sleeping workers), only the worker families run, and sleeping ranks
    assert family_points(["threads", "workers", "overlap", "ranks"], [1, 2, 16], cores=2) == [
        ("threads", 1), ("threads", 2), ("workers", 1), ("workers", 2), ("workers", 16), ("overlap", 1),
        ("overlap", 2), ("overlap", 16), ("ranks", 2)]
    assert family_points(["threads", "ranks"], [1, 2, 16], cores=2, sleeping=True) == [
        ("threads", 1), ("threads", 2), ("ranks", 2), ("ranks", 16)], "sleeping ranks too"
    assert family_points(["copies"], [1, 2, 16], cores=2, sleeping=True) == [("copies", 2)], \
        "one copy is threads_1; the copies are the yardstick of the cores there are, sleeping or not"
    assert no_points_reasons(["threads", "copies"], [1, 4], cores=2) == [
        "threads at 4: more than the 2 cores here", "copies start at 2", "copies at 4: more than the 2 cores here"]


def test_copies_are_that_many_one_core_runs_each_its_own_folder_and_seed(tmp_path):
    one = point_command("threads", 1, SETTINGS, tmp_path / "copies_4", cores=16)
    commands = copy_commands(point_command("copies", 4, SETTINGS, tmp_path / "copies_4", cores=16), 4)
    assert len(commands) == 4
    for i, cmd in enumerate(commands):  # threads_1's run, but for its folder and seed (after the user's settings)
        expected = [*one, "--set", f"run.seed={i + 1}"]
        expected[one.index("--output-dir") + 1] = f"{tmp_path / 'copies_4'}/copy_{i}"
        assert cmd == expected
    assert sets(one)["parallel.learner_threads"] == "1" and flag(one, "--num-envs") == "8"
    assert flag(one, "--batch-size") == "128" and "--num-workers" not in one


def test_copies_run_at_once_and_the_first_failure_is_raised(tmp_path):
    def meets(i: int) -> list[str]:  # says it started, then waits for the other: run one after the other, it hangs
        return [sys.executable, "-c", f"import pathlib, time; d = pathlib.Path({str(tmp_path)!r}); "
                f"(d / '{i}').touch(); [time.sleep(0.05) for _ in range(400) if not (d / '{1 - i}').exists()]; "
                f"assert (d / '{1 - i}').exists()"]

    run_together([meets(0), meets(1)], "copies_2", timeout=60)
    bad = [sys.executable, "-c", "import sys; sys.exit('x: error: broke')"]
    with pytest.raises(BenchRunCrashed, match=r"copies_2 \(copy 1\) crashed \(exit status 1\): x: error: broke"):
        run_together([[sys.executable, "-c", "pass"], bad], "copies_2", timeout=60)


def test_a_copies_row_sums_the_copies_over_their_common_span_and_sets_the_others_against_it(tmp_path):
    runs = [load_run("copies_2", write_run(tmp_path / f"copy_{i}", peak_rss_mb=100.0 * (i + 1),
                                           phase_fractions={"env": 0.5 + 0.2 * i}))
            for i in range(2)]
    copies = {"family": "copies", "processes": 2, "label": "copies_2", "measured_at": "x",
              **copies_row(runs, ended=[100.0, 100.0])}
    assert copies["steps_per_second"] == pytest.approx(2 * STEADY) and copies["copies_sps"] == [STEADY, STEADY]
    assert copies["copies_span"] == pytest.approx(1.0) and copies["updates"] == 3
    assert copies["envs"] == 16 and copies["peak_rss_mb"] == 300.0
    assert copies["phase_fractions"] == pytest.approx({"env": 0.6}) and copies["run_dir"] == str(tmp_path)
    rows = [row("threads", 1, STEADY), copies, row("workers", 2, 1.5 * STEADY), row("overlap", 4, 3 * STEADY)]
    add_ratios(rows)
    assert copies["speedup"] == pytest.approx(2.0) and copies["efficiency"] == pytest.approx(1.0)
    note = copies_note(rows)
    assert "copies_2 2.00× threads_1 over a common steady span 1.00 of a copy's, each copy 256–256 steps/s " \
           "(workers_2 0.75 of it)" in note
    assert "overlap" not in note and copies_note(rows[2:]) == ""
    # copy 1 started 2 s later and ran on alone at twice the pace: its last 2 s are not the machine's shared pace
    late = load_run("copies_2", write_run(tmp_path / "late", [(1, 1024, 9.0, 1.0), (2, 2048, 13.0, 1.0),
                                                                (3, 4096, 17.0, 1.0)], wall_seconds=19.5))
    skewed = copies_row([runs[0], late], ended=[100.0, 104.0])  # it closed 2 s slower: it started at 84.5, not 86.5
    assert skewed["copies_sps"] == [STEADY, 384.0], "each copy's own steady steps/s: 640 summed"
    assert skewed["copies_span"] == pytest.approx(0.75), "6 s in common of each copy's 8"
    assert skewed["steps_per_second"] == pytest.approx((256 * 6 + 1024 + 2 * 512) / 6)
    with pytest.raises(RunDataError, match="its 2 copies never ran steady together"):
        copies_row([runs[0], late], ended=[100.0, 120.0])


@pytest.mark.parametrize("family", ["threads", "workers", "overlap", "ranks", "cuda", "cuda_overlap"])
def test_a_point_of_p_processes_uses_p_cores_and_the_same_work_per_process(family, tmp_path):
    cmd = point_command(family, 4, SETTINGS, tmp_path / "run", cores=16)
    given = sets(cmd)
    assert given["training.n_steps"] == "64" and flag(cmd, "--env") == "starpilot"
    assert given["eval.interval_seconds"] == "0" and given["run.limit_seconds"] == "0"
    assert given["training.precision"] == "fp32", "the same arithmetic at every point, not a choice per thread count"
    gpu = family.startswith("cuda")  # a GPU learner takes the whole minibatch, a CPU one the settings' (64 here)
    assert given["training.microbatch_size"] == ("0" if gpu else "64")
    if family == "ranks":  # the scaling rule: each rank its own 8 envs and minibatch of 128, one thread
        assert flag(cmd, "--nproc_per_node") == "4" and "--distributed" in cmd and "--num-envs-total" not in cmd
        assert flag(cmd, "--num-envs") == "8" and flag(cmd, "--batch-size") == "128"
        assert given["parallel.learner_threads"] == "1"
    else:  # one process's 8 envs and 128 samples, × 4 (an overlapped learner: one thread beside the workers)
        learner = "1" if family.endswith("overlap") else "4"
        assert flag(cmd, "--batch-size") == "512" and given["parallel.learner_threads"] == learner
        if family == "threads":
            assert flag(cmd, "--num-envs") == "32" and given["env.env_threads"] == "4"
        else:
            assert flag(cmd, "--num-workers") == "4" and flag(cmd, "--num-envs-per-worker") == "8"
            assert given["env.env_threads"] == "1", "a worker steps and draws on one thread, not a share of all cores"
            assert given["parallel.overlap"] == str(family.endswith("overlap")).lower()
    assert flag(cmd, "--device") == ("cuda" if gpu else "cpu")


def test_the_users_sets_come_after_the_studys_own_and_win(tmp_path):
    mine = ("--set", "training.precision=bf16", "--set", "parallel.learner_threads=4")
    cmd = point_command("cuda_overlap", 16, StudySettings("config/robosuite_lift.yaml", "robosuite/Lift", 30.0,
                                                           extra=mine), tmp_path / "run", cores=16)
    given = [cmd[i + 1] for i, a in enumerate(cmd)
             if a == "--set" and cmd[i + 1].startswith(("training.precision=", "parallel.learner_threads="))]
    assert len(given) == 4, "the study's own and the user's"
    cfg = build_config("config/robosuite_lift.yaml", {}, given, parallel=True)  # the trainer's rule: the last wins
    assert cfg.training.precision == "bf16" and cfg.parallel.learner_threads == 4
    for family, threads in (("threads", "1"), ("ranks", "1")):  # but a family's defining thread counts stay
        cmd = point_command(family, 1 if family == "threads" else 2,
                            StudySettings("config/robosuite_lift.yaml", "robosuite/Lift", 30.0, extra=mine),
                            tmp_path / "run", cores=16)
        learner = [cmd[i + 1] for i, a in enumerate(cmd) if a == "--set" and "learner_threads" in cmd[i + 1]]
        assert learner[-1] == f"parallel.learner_threads={threads}", family


def test_a_learner_never_gets_more_threads_than_the_cores(tmp_path):
    cmd = point_command("workers", 16, SETTINGS, tmp_path / "run", cores=2)
    assert sets(cmd)["parallel.learner_threads"] == "2" and flag(cmd, "--num-workers") == "16"
    for processes, cores in ((16, 2), (8, 16), (1, 16)):  # an overlapped learner: one thread beside its workers,
        cmd = point_command("overlap", processes, SETTINGS, tmp_path / "run", cores=cores)  # P once they wait
        given = sets(cmd)
        assert given["parallel.learner_threads"] == "1"
        assert given["parallel.idle_learner_threads"] == str(min(processes, cores))


def test_results_folder_names_the_cpu_cores_and_gpu():
    xeon = "Intel(R) Xeon(R) Platinum 8480+ CPU @ 2.00GHz"
    assert results_slug(xeon, 16, None) == "intel-xeon-platinum-8480-16c"
    assert results_slug(xeon, 16, "NVIDIA H100 80GB HBM3") == "intel-xeon-platinum-8480-16c-h100-80gb-hbm3"
    assert results_slug("AMD EPYC 9R14 96-Core Processor", 2, None) == "amd-epyc-9r14-2c"
    assert results_slug(xeon, 8, "NVIDIA GeForce RTX 3090") != results_slug(xeon, 8, "NVIDIA GeForce RTX 4090")
    assert results_slug("", 4, None) == "cpu-4c"
    assert results_slug("AMD EPYC", 2, None, ["avx512", "bf16"]) == "amd-epyc-avx512-bf16-2c"
    assert results_slug("AMD EPYC", 2, None, []) == "amd-epyc-2c"


def test_another_cpu_family_of_the_same_name_gets_a_folder_of_its_own(tmp_path):
    zen4, zen5 = ({"cpu_model": "AMD EPYC", "cpu_kind": ["avx512", "bf16"], "cpu_family": f} for f in ("25/17", "26/2"))
    plain = tmp_path / "amd-epyc-avx512-bf16-2c"
    assert machine_folder(tmp_path, zen5, 2, None) == plain, "nothing there yet"
    plain.mkdir()
    (plain / "notes.json").write_text("[1, 2]")  # evidence of no family, or not a record at all, names none
    point = {"family": "threads", "label": "threads_1", "measured_at": "x", "hardware": {"cpu_family": "25/17"}}
    (plain / "study.json").write_text(json.dumps({"hardware": {}, "points": [point]}))
    assert machine_folder(tmp_path, zen4, 2, None) == plain
    assert machine_folder(tmp_path, zen5, 2, None) == tmp_path / "amd-epyc-avx512-bf16-family26-model2-2c"
    assert machine_folder(tmp_path, {**zen5, "cpu_family": None}, 2, None) == plain, "an unknown family: the name's"
    (plain / "pairs.json").write_text(json.dumps({"cpu_family": "26/2"}))  # both kinds in it (written by hand)
    assert recorded_families(plain) == {"25/17", "26/2"}, "a file's own, its hardware's and its points'"
    assert machine_folder(tmp_path, zen4, 2, None) == plain == machine_folder(tmp_path, zen5, 2, None), \
        "a kind with evidence there keeps its folder"
    with pytest.raises(RunDataError, match="points measured on CPU family 25/17, not this machine's 26/2"):
        earlier_points(plain / "study.json", {}, "26/2")  # but a study file never merges two kinds' points
    assert earlier_points(plain / "study.json", {}, "25/17")[0] and earlier_points(plain / "study.json", {})[0]
    (tmp_path / "amd-epyc-avx512-bf16-family26-model2-2c").mkdir()  # once a kind has a folder of its own, it is its
    assert machine_folder(tmp_path, zen5, 2, None) == tmp_path / "amd-epyc-avx512-bf16-family26-model2-2c"


def row(family: str, n: int, sps: float, when: str = "2026-11-23 10:00:00") -> dict:
    return {"family": family, "processes": n, "label": f"{family}_{n}", "steps_per_second": sps, "measured_at": when}


def test_speedups_are_against_one_core_and_a_gpu_learner_against_its_cpu_twin():
    rows = [row("threads", 1, 100.0), row("workers", 4, 300.0), row("cuda", 2, 500.0), row("cuda", 4, 600.0),
            {**row("ranks", 2, 0.0), "error": "crashed"}, row("overlap", 4, 400.0), row("cuda_overlap", 4, 1000.0),
            {**row("workers", 8, 0.0), "error": "crashed"}, row("cuda", 8, 900.0)]
    add_ratios(rows)
    assert rows[1]["base"] == "threads_1" and rows[1]["speedup"] == pytest.approx(3.0)
    assert rows[1]["efficiency"] == pytest.approx(0.75) and "speedup" not in rows[4]
    # a GPU learner against the CPU learner of as many workers, synchronous or overlapped: its gain, no efficiency
    assert rows[3]["base"] == "workers_4" and rows[3]["speedup"] == pytest.approx(2.0)
    assert rows[6]["base"] == "overlap_4" and rows[6]["speedup"] == pytest.approx(2.5)
    assert all("efficiency" not in r for r in rows if r["family"].startswith("cuda"))
    # without its twin (not measured, or failed), none: not a ratio of another kind in the same column
    assert all("base" not in r and "speedup" not in r for r in (rows[2], rows[8]))
    one, lent = {"learner": 1}, {"learner": 1, "learner_while_workers_wait": 4}  # the second: overlapped, on the CPU
    table = study_table([{**r, "envs": 8, "threads": t, "device": "cuda", "precision": "fp32",
                          "phase_fractions": {}, "updates": 3, "microbatch": m}
                         for r, m, t in ((rows[3], 0, one), (rows[2], 0, one), (rows[5], 64, lent))])
    cuda_4, cuda_2, overlap_4 = table.splitlines()[2:]
    assert "| 2.00× | - |" in cuda_4 and "| - | - | - |" in cuda_2, "a ratio where its twin was measured, else none"
    assert "1 thr, fp32, whole |" in cuda_4 and "1 (then 4) thr, fp32, chunks of 64 |" in overlap_4


def test_a_later_call_replaces_its_points_and_keeps_the_others():
    old = [row("threads", 1, 100.0), row("workers", 2, 150.0), row("workers", 4, 250.0)]
    new = [row("workers", 4, 260.0, "2026-11-24 09:00:00"), row("threads", 2, 180.0, "2026-11-24 09:00:00")]
    merged = merge_rows(old, new)
    assert [(r["label"], r["steps_per_second"]) for r in merged] == [
        ("threads_1", 100.0), ("threads_2", 180.0), ("workers_2", 150.0), ("workers_4", 260.0)]
    failed = {**row("workers", 2, 0.0), "error": "crashed"}
    again = merge_rows(merged, [failed, {**row("threads", 4, 0.0), "error": "hung"}])
    assert [(r["label"], r.get("error"), r.get("steps_per_second")) for r in again] == [
        ("threads_1", None, 100.0), ("threads_2", None, 180.0), ("threads_4", "hung", 0.0), ("workers_2", None, 150.0),
        ("workers_4", None, 260.0)], "a point that fails again keeps its figure; one never measured records its error"


@pytest.mark.slow  # starts bench.py (a Python that imports torch)
def test_bad_families_are_refused_before_anything_runs(tmp_path):
    proc = subprocess.run([sys.executable, "bench.py", "study", "--families", "threads,gpu", "--runs-dir",
                           str(tmp_path / "runs"), "--results-dir", str(tmp_path / "res")],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1 and "--families" in proc.stderr
    assert not (tmp_path / "runs").exists() and not (tmp_path / "res").exists()


@pytest.mark.slow  # starts bench.py
def test_a_results_file_of_another_study_is_refused_before_the_study_starts(tmp_path):
    """One line, exit 2, before the study's first line and its first run; the file is left as it was."""
    res = tmp_path / "res"
    settings = StudySettings(str(ROOT / "config" / "sim_lift.yaml"), "sim/Sleep", 2.0)
    path = results_files(machine_results_dir(res) / results_name(settings, drawing()))["json"]
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"settings": {"env": "sim/Sleep", "seconds": 60.0}, "points": []}))
    before = path.read_text()
    proc = subprocess.run([sys.executable, "bench.py", "study", "--config", "config/sim_lift.yaml", "--env",
                           "sim/Sleep", "--seconds", "2", "--families", "threads", "--processes", "1", "--runs-dir",
                           str(tmp_path / "runs"), "--results-dir", str(res)],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert "holds a study of other settings" in proc.stderr and proc.stdout == ""
    assert not (tmp_path / "runs").exists() and path.read_text() == before


@pytest.mark.parametrize("blocked", ["folder", "png"])
def test_results_that_could_not_be_written_are_refused_before_the_first_point(blocked, tmp_path, monkeypatch, capsys):
    """The machine's results folder a file, or a results file a directory: one line, exit 2, no point run (these were
    found after the first point, exit 1, in an errno's words)."""
    from parallel_ppo.cli import bench
    from parallel_ppo.cli import study as study_cli

    res = tmp_path / "res"
    stem = machine_results_dir(res) / results_name(StudySettings("config/sim_lift.yaml", "sim/Sleep", 2.0), drawing())
    res.mkdir()
    if blocked == "folder":
        stem.parent.write_text("")
    else:
        results_files(stem)["png"].mkdir(parents=True)
    monkeypatch.setattr(study_cli, "run_study", lambda *a: pytest.fail("a point ran"))
    assert bench.main(["study", "--config", str(ROOT / "config" / "sim_lift.yaml"), "--families", "threads",
                       "--processes", "1", "--seconds", "2", "--runs-dir", str(tmp_path / "runs"),
                       "--results-dir", str(res)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and ("not a directory" if blocked == "folder" else "is a directory, where the study") in err[0]
    assert not (tmp_path / "runs").exists()


def test_a_study_of_gpu_families_alone_without_cuda_says_so(tmp_path, monkeypatch):
    monkeypatch.setattr(study_module, "gpu_name", lambda: None)
    with pytest.raises(ConfigError, match=r"no points to run here \(cuda, cuda_overlap: no CUDA device here\)"):
        plan_study(["cuda", "cuda_overlap"], [16], SETTINGS, tmp_path)
    plan = plan_study(["threads", "cuda"], [1], SETTINGS, tmp_path)
    assert plan.points == [("threads", 1)] and plan.skipped == ["cuda"] and plan.kept == plan.dropped == []


def test_an_earlier_study_is_kept_only_for_the_same_machine_and_settings(tmp_path):
    path = tmp_path / "study.json"
    identity = {"settings": {"env": "starpilot", "seconds": 30.0}, "cores": 16, "gpu": None, "cpu_model": "X"}
    path.write_text(json.dumps({**identity, "points": [row("threads", 1, 100.0)]}))
    assert [p["label"] for p in earlier_points(path, identity)[0]] == ["threads_1"]
    with pytest.raises(RunDataError, match=r"other settings .*\(settings\.seconds 30\.0, not 20\.0\)"):
        earlier_points(path, {**identity, "settings": {"env": "starpilot", "seconds": 20.0}})  # its points kept
    assert json.loads(path.read_text())["points"][0]["label"] == "threads_1"
    path.write_text("{not json")
    with pytest.raises(RunDataError, match="is not the results of a study"):
        earlier_points(path, identity)
    # a CUDA point of before the GPU took the whole minibatch (no microbatch recorded) is not kept beside new ones
    path.write_text(json.dumps({**identity, "points": [row("threads", 1, 100.0), row("cuda", 16, 500.0),
                                                       {**row("cuda_overlap", 16, 900.0), "microbatch": 0},
                                                       {**row("cuda", 8, 0.0), "error": "crashed"}]}))
    kept, dropped = earlier_points(path, identity)
    assert [p["label"] for p in kept] == ["threads_1", "cuda_overlap_16", "cuda_8"] and dropped == ["cuda_16"]
    # a study whose CPU points take the whole minibatch keeps none measured in chunks of 64 (recorded or not)
    path.write_text(json.dumps({**identity, "points": [row("threads", 1, 100.0), {**row("workers", 2, 190.0),
                                                       "microbatch": 0}, {**row("overlap", 2, 0.0), "error": "x"},
                                                       {**row("overlap", 4, 380.0), "microbatch": 64}]}))
    kept, dropped = earlier_points(path, identity, microbatch=0)
    assert [p["label"] for p in kept] == ["workers_2", "overlap_2"] and dropped == ["threads_1", "overlap_4"]


def test_a_study_drops_the_points_measured_with_other_values_of_its_config(tmp_path, monkeypatch):
    """Each point records the values of the config file it ran with; a later call keeps those measured with the same
    values (its comments aside) and those recording none (of before), and drops the others, saying so."""
    config = tmp_path / "sim.yaml"
    text = (ROOT / "config" / "sim_lift.yaml").read_text()
    config.write_text(text)
    settings = StudySettings(str(config), "sim/Sleep", 30.0)
    plan = plan_study(["workers"], [2], settings, tmp_path / "results")
    monkeypatch.setattr(study_module, "run_study_point", lambda family, n, *a: {**row(family, n, 100.0),
                                                                                 "updates": 3, "microbatch": 0})
    written = []
    monkeypatch.setattr(study_module, "write_results", lambda rows, stem, meta: written.append(rows))
    study_module.run_study(plan, tmp_path / "runs")
    assert [p["config_digest"] for p in written[-1]] == [config_digest(config)]
    earlier = {**row("workers", 4, 180.0), "microbatch": 0}  # measured before points recorded theirs
    path = results_files(plan.stem)["json"]
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({**plan.identity, "points": [*written[-1], earlier]}))
    config.write_text(f"# a comment\n{text}")
    assert [p["label"] for p in plan_study(["workers"], [2], settings, tmp_path / "results").kept] == [
        "workers_2", "workers_4"]
    config.write_text(text.replace("gamma: 0.99", "gamma: 0.98"))
    replanned = plan_study(["workers"], [2], settings, tmp_path / "results")
    assert [p["label"] for p in replanned.kept] == ["workers_4"] and replanned.edited == ["workers_2"]


def test_the_cpu_points_chunk_their_update_as_the_config_says(tmp_path, monkeypatch):
    """Lift's MLP and the simulated study's: the whole minibatch, as their configs say; starpilot's network,
    `auto`, 64 as a run takes it unmeasured (never a cached choice: the resolved chunk comes last); the user's `--set`
    decides the CPU's, a GPU point takes the whole minibatch. A later call keeps every point of such a study."""
    auto, m32 = ("--set", "training.microbatch_size=auto"), ("--set", "training.microbatch_size=32")
    for config, env, extra, chunk in (("robosuite_lift", "robosuite/Lift", (), 0), ("sim_lift", "sim/Sleep", (), 0),
                                      ("ppo_parallel", "starpilot", (), 64), ("ppo_parallel", "starpilot", auto, 64),
                                      ("sim_lift", "sim/Sleep", auto, 0), ("sim_lift", "sim/Sleep", m32, 32)):
        settings = StudySettings(f"config/{config}.yaml", env, 30.0, extra=extra)
        plan = plan_study(["threads", "overlap", "cuda"], [2], settings, tmp_path)
        assert plan.settings.microbatch == chunk and "microbatch" not in plan.identity["settings"], config
        for family, want in (("overlap", chunk), ("cuda", 0)):
            cmd = point_command(family, 2, plan.settings, tmp_path / "run", cores=2)
            chunk_sets = [a for a in cmd if a.startswith("training.microbatch_size=")]
            assert chunk_sets[-1] == f"training.microbatch_size={want}", (config, extra, family)
        points = [{**row("overlap", 2, 400.0), "microbatch": chunk}, {**row("cuda", 2, 900.0), "microbatch": 0}]
        path = tmp_path / "earlier.json"
        path.write_text(json.dumps({**plan.identity, "points": points}))
        assert earlier_points(path, plan.identity, microbatch=plan.settings.microbatch) == (points, [])
    # on a CUDA host, `auto` resolves the CPU points' chunk for the CPU, where they run
    monkeypatch.setattr(learner_settings, "learner_device",
                        lambda cfg: torch.device("cpu" if cfg.training.device == "cpu" else "cuda"))
    on_gpu_host = StudySettings("config/ppo_parallel.yaml", "starpilot", 30.0)
    assert plan_study(["threads", "cuda"], [2], on_gpu_host, tmp_path).settings.microbatch == 64
    assert chunks(32) == "in chunks of 32 on the CPU (a minibatch no larger whole, as on a GPU)"
    assert chunks(0) == "the whole minibatch at once (on the CPU and a GPU)"
    # a row's learner column: a chunk no smaller than the point's minibatch runs it whole
    assert [point_chunk_text(m, b) for m, b in ((None, 128), (0, 128), (64, 128), (256, 128), (128, 128))] == [
        "", ", whole", ", chunks of 64", ", whole", ", whole"]
    # a rank or a copy chunks its own share of the point's minibatch
    rows = [{"family": f, "processes": 2, "batch_size": 256} for f in ("ranks", "copies", "overlap")]
    shares = [learner_minibatch(r) for r in rows]
    assert shares == [128, 128, 256]


def test_frames_drawn_another_way_make_another_studys_files(monkeypatch):
    """The drawing variables the user set name the study's files (the trainer's own LP_NUM_THREADS does not):
    a study of Mesa's drawing on a GPU box sits beside the GPU's."""
    for k in (*DRAWING_VARIABLES, OWN_DRAW_THREADS):
        monkeypatch.setenv(k, "0")
        monkeypatch.delenv(k)
    lift = StudySettings(str(ROOT / "config" / "robosuite_lift_camera.yaml"), "robosuite/Lift", 30.0)
    assert drawing() == {} and results_name(lift, drawing()) == "study-robosuite_lift_camera"
    monkeypatch.setenv("__EGL_VENDOR_LIBRARY_FILENAMES", "/tmp/offline_mesa/50_mesa.json")
    monkeypatch.setenv("MUJOCO_GL", "egl")
    assert results_name(lift, drawing()) == "study-robosuite_lift_camera-mesa"
    monkeypatch.setenv("LP_NUM_THREADS", "1")
    assert results_name(lift, drawing()) == "study-robosuite_lift_camera-mesa-lp1"
    monkeypatch.setenv(OWN_DRAW_THREADS, "1")  # the trainer's, not the user's
    assert "LP_NUM_THREADS" not in drawing() and drawing_tag(drawing()) == "-mesa"
    monkeypatch.setenv("__EGL_VENDOR_LIBRARY_FILENAMES", "/usr/share/glvnd/egl_vendor.d/10_nvidia.json")
    assert drawing_tag(drawing()) == "" and drawing_tag({"MUJOCO_GL": "osmesa"}) == "-osmesa"


def test_a_page_says_where_mesa_drew_with_threads_of_its_own():
    """Workers' points without `draw_per_worker` were measured before the trainer set LP_NUM_THREADS: drawn by Mesa
    without the user's LP_NUM_THREADS, their page says a point may have used more cores than its processes."""
    old = [{"label": "threads_1", "commit": "a", "threads": {"learner": 1, "env": 1}},
           {"label": "workers_2", "commit": "a", "threads": {"learner": 2, "worker": 1, "env_per_worker": 1}}]
    new = [old[0] | {"commit": "b"}, old[1] | {"commit": "b", "threads": {**old[1]["threads"], "draw_per_worker": 1}}]
    mesa = {"drawing": {"MUJOCO_GL": "egl", "__EGL_VENDOR_LIBRARY_FILENAMES": "/tmp/50_mesa.json"}}
    assert ": threads_1, workers_2 were measured before" in mesa_threads(mesa, old)
    assert ": threads_1, workers_2 were measured before" in mesa_threads(mesa, [*old, new[1] | {"label": "workers_4"}])
    assert mesa_threads(mesa, new) == ""
    assert mesa_threads({"drawing": {**mesa["drawing"], "LP_NUM_THREADS": "1"}}, old) == ""
    assert mesa_threads({"drawing": None}, old) == mesa_threads({}, old) == ""
    nvidia = {"MUJOCO_GL": "egl", "__EGL_VENDOR_LIBRARY_FILENAMES": "/usr/share/glvnd/egl_vendor.d/10_nvidia.json"}
    assert mesa_threads({"drawing": nvidia}, old) == ""  # a GPU drew
    assert ": threads_1, workers_2 were measured before" in mesa_threads({"drawing": {"MUJOCO_GL": "osmesa"}}, old)


def test_a_page_names_the_points_that_cut_steps_and_their_share_and_which_worker_they_waited_for():
    rows = [{"label": "threads_1", "rollout_cut": None}, {"label": "overlap_8", "rollout_cut": 0.0061},
            {"label": "overlap_16", "rollout_cut": 0.0}, {"label": "workers_16"}]  # the last: measured before the key
    assert "): overlap_8 0.61%." in cut_note(rows)
    assert not any(label in cut_note(rows) for label in ("threads_1", "overlap_16", "workers_16"))
    assert cut_note(rows[2:]) == ""
    rows[1] |= {"pace_rollouts": 12, "pace_slowest_share": 0.75, "pace_slowest_excess_seconds": 1.094}
    assert pace_note(rows).endswith(": overlap_8 0.75 of 12, 1.09 s.\n\n") and pace_note(rows[2:]) == ""


def test_each_task_has_its_own_results_files(tmp_path):
    """Studies of several tasks on one machine sit side by side: the Procgen study keeps `study`, another config is
    named by its file and an env other than the config's own by the env too."""
    def name(config: str, env: str) -> str:
        return results_name(StudySettings(str(ROOT / "config" / config), env, 30.0), {})

    assert name("ppo_parallel.yaml", "starpilot") == "study"
    assert name("ppo_parallel.yaml", "bigfish") == "study-bigfish"
    assert name("robosuite_lift.yaml", "robosuite/Lift") == "study-robosuite_lift"
    assert name("robosuite_lift_camera.yaml", "robosuite/Lift") == "study-robosuite_lift_camera"
    assert name("mujoco.yaml", "Hopper-v5") == "study-mujoco-hopper-v5"
    # a study with settings of the user's sits beside the default's instead of replacing it
    lift = StudySettings(str(ROOT / "config" / "robosuite_lift_camera.yaml"), "robosuite/Lift", 30.0,
                         extra=("--set", "parallel.learner_threads=4"))
    assert results_name(lift, {"MUJOCO_GL": "osmesa"}) == \
        "study-robosuite_lift_camera-parallel-learner-threads-4-osmesa"
    signed = [StudySettings(lift.config, lift.env, 30.0, extra=("--set", f"training.ent_coef={v}"))
              for v in ("-1", "1")]  # a value's sign is kept: neither study replaces the other
    assert [results_name(s, {}) for s in signed] == ["study-robosuite_lift_camera-training-ent-coef-minus1",
                                                      "study-robosuite_lift_camera-training-ent-coef-1"]
    mine = tmp_path / "mine.yaml"  # no env.id: its env is the built-in one
    mine.write_text("training:\n  n_steps: 64\n")
    default_env = build_config(str(mine), {}, [], parallel=False).env.id
    assert results_name(StudySettings(str(mine), default_env, 30.0), {}) == "study-mine"
    files = results_files(tmp_path / "study-fetch")
    assert files == {ext: tmp_path / f"study-fetch.{ext}" for ext in ("md", "json", "png")}


def test_the_rank_minibatch_is_its_own_unless_the_envs_are_split():
    """The distributed scaling rule: a rank learns on `training.batch_size` samples of its own rollout; with
    `distributed.num_envs_total` the minibatch is all ranks' and each takes its share."""
    rank = SimpleNamespace(world_size=4)
    own = build_config(None, {"env.num_envs": 8, "training.n_steps": 16, "training.batch_size": 128}, [], False, 4)
    split = build_config(None, {"distributed.num_envs_total": 32, "training.n_steps": 16, "training.batch_size": 128},
                         [], False, 4)
    assert Ranks.local_training(rank, own).batch_size == 128 and Ranks.local_training(rank, split).batch_size == 32
    # a minibatch of a rank's whole rollout that 2 ranks could not share is valid per rank, refused when split
    build_config(None, {"env.num_envs": 1, "training.n_steps": 3, "training.batch_size": 3}, [], False, 2)
    with pytest.raises(ConfigError, match="does not split evenly over 2 ranks"):
        build_config(None, {"distributed.num_envs_total": 2, "training.n_steps": 3, "training.batch_size": 3}, [],
                     False, 2)


@pytest.mark.slow
def test_study_on_this_machine_writes_its_table_and_plots(tmp_path):
    """A simulated study (sim/Sleep, 1 ms a step), threads and overlap at 1 and 2 with tiny budgets: the table holds
    SPS, speed-up, efficiency and the phase split of every point, each figure the run's own, and says it is
    simulated (the other families' commands are checked above; a distributed run by the per-rank rule runs in
    test_bench_suite's sweep)."""
    res = tmp_path / "results"
    proc = subprocess.run([sys.executable, "bench.py", "study", "--config", "config/sim_lift.yaml",  # its env
                           "--set", "env.options=[step_ms=1]", "--processes", "1 2", "--families",
                           "threads,copies,overlap", "--seconds", "2", "--n-steps", "16",
                           "--runs-dir", str(tmp_path / "runs"), "--results-dir", str(res)],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    [folder] = list(res.iterdir())
    stem = "study-sim_lift-env-options-step-ms-1"  # the config's name, then the user's setting
    assert sorted(p.name for p in folder.iterdir()) == [f"{stem}.{ext}" for ext in ("json", "md", "png")]
    study = json.loads((folder / f"{stem}.json").read_text())
    assert folder.name == results_slug(study["cpu_model"], study["cores"], study["gpu"], study["hardware"]["cpu_kind"])
    assert study["date"] and study["command"].endswith(f"--results-dir {res}") and study["simulated"]
    assert study["settings"]["env"] == "sim/Sleep", "the config's env, no --env given"
    assert (folder / f"{stem}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    points = {p["label"]: p for p in study["points"]}
    assert list(points) == ["threads_1", "threads_2", "copies_2", "overlap_1", "overlap_2"], study["points"]
    assert {Path(p["run_dir"]).parent for p in points.values()} == {tmp_path / "runs" / stem}  # the study's own
    copies = [load_run("copy", Path(points["copies_2"]["run_dir"]) / f"copy_{i}") for i in range(2)]
    assert points["copies_2"]["copies_sps"] == pytest.approx([run.steady_sps for run in copies])
    assert 0 < points["copies_2"]["copies_span"] <= 1 and points["copies_2"]["steps_per_second"] > 0
    table = (folder / f"{stem}.md").read_text()
    assert [run.config.run.seed for run in copies] == [1, 2] and "What N busy cores give the one-core job" in table
    assert table.startswith("# Simulated many-core study") and "**Simulated.**" in table
    assert "summary.json's `worker_pace`): the share" in table and "overlap_2 " in table.split("worker_pace")[1]
    for p in (p for p in points.values() if p["family"] != "copies"):
        run = load_run(p["label"], Path(p["run_dir"]))
        base = load_run("base", Path(points["threads_1"]["run_dir"])).steady_sps
        assert p["base"] == "threads_1" and p["steps_per_second"] == pytest.approx(run.steady_sps)
        assert p["speedup"] == pytest.approx(run.steady_sps / base)
        assert p["efficiency"] == pytest.approx(p["speedup"] / p["processes"])
        assert f"| {p['family']} | {p['processes']} |" in table and f"{p['speedup']:.2f}×" in table
        assert p["phase_fractions"] and p["phase_fractions"] == run.summary.phase_fractions
        assert run.summary.policy_lag == (1 if p["family"] == "overlap" and run.summary.updates > 1 else 0)
        paced = p["processes"] > 1 and p["family"] == "overlap"  # every rollout whole: each shows who was slowest
        assert p["pace_rollouts"] == (run.summary.updates if paced else None)
    for two in (points["threads_2"], points["copies_2"]):
        assert two["batch_size"] == 256 and two["envs"] == 16, "2 × one process's work"
