"""Data-parallel runs under torchrun (2 ranks on loopback): the same step as one process over all the envs,
identical parameters on every rank, one writer, agreed stops, and no rank left behind when another dies."""

from __future__ import annotations

import csv
import json
import os
import signal
import sys
import time
from pathlib import Path

import psutil
import pytest
import torch
import yaml
from conftest import toy_envs_environ
from sessions import assert_nothing_left, session_pids, sessions_of, shm_entries, start, torchrun, wait_for

from parallel_ppo.core.checkpoint import load_checkpoint
from parallel_ppo.core.config import share_waited_for
from parallel_ppo.core.configure import build_config, config_from_dict
from parallel_ppo.core.pause import PAUSE_ENV_VAR, release_file
from parallel_ppo.core.ppo import build_learner
from parallel_ppo.envs.batch import env_spaces
from parallel_ppo.errors import ConfigError
from parallel_ppo.runs.metrics import metric_columns
from parallel_ppo.runs.reading import load_run
from parallel_ppo.runs.summary import RunSummary

ROOT = Path(__file__).resolve().parents[1]
CARTPOLE = ["--config", "config/cartpole.yaml", "--set", "logging.progress=off", "--set", "run.limit_seconds=0"]
ONE_STEP = [*CARTPOLE, "--seed", "3", "--batch-size", "512", "--total-steps", "512", "--set", "training.n_epochs=1",
            "--set", "training.normalize_reward=true"]
"""One update of 16 envs × 32 steps, one epoch, one minibatch of the whole rollout: one optimizer step, the same
data however the envs are split (reward normalization on, so its statistics must span all ranks too)."""


def finish(proc, timeout: float = 240) -> tuple[int, str, str]:
    out, err = proc.communicate(timeout=timeout)
    return proc.returncode, out, err


def rows(out: Path) -> list[dict[str, str]]:
    path = out / "metrics.csv"
    if not path.exists():
        return []
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def wait_rows(proc, out: Path, n: int, timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while len(rows(out)) < n:
        assert proc.poll() is None, proc.communicate()[1]
        assert time.monotonic() < deadline, "the run made no progress"
        time.sleep(0.1)


def assert_no_session_left(sids: list[int], shm_before: set[str]) -> None:
    for sid in sids:
        assert_nothing_left(sid, shm_before)


def params(out: Path) -> dict[str, torch.Tensor]:
    return load_checkpoint(out / "checkpoint.pt")["model"]


# ------------------------------------------------------------------------------------------- without torchrun
@pytest.mark.slow  # starts a trainer
def test_distributed_needs_torchrun(train_timed, tmp_path):
    proc = train_timed("--distributed", *CARTPOLE, "--output-dir", str(tmp_path / "run"))
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0 and "runs under torchrun" in proc.stderr
    assert not (tmp_path / "run").exists()


def test_envs_total_is_split_over_ranks_and_workers():
    cfg = build_config(None, {"distributed.num_envs_total": 16}, [], parallel=False, world_size=2)
    assert cfg.env.num_envs == 8
    cfg = build_config(None, {"distributed.num_envs_total": 16, "parallel.num_workers": 2}, [], parallel=True,
                       world_size=2)
    assert (cfg.env.num_envs, cfg.parallel.num_envs_per_worker) == (8, 4)
    cfg = build_config(None, {"distributed.num_envs_total": 16, "env.num_envs": 8}, [], parallel=False, world_size=2)
    assert cfg.env.num_envs == 8, "a figure on the command line that agrees is taken"


@pytest.mark.parametrize("flags, parallel, world, message", [
    ({"distributed.num_envs_total": 15}, False, 2, "does not split evenly over 2 ranks"),
    ({"distributed.num_envs_total": 16, "parallel.num_workers": 3}, True, 2, "over 3 workers"),
    ({"distributed.num_envs_total": 16, "training.batch_size": 2}, False, 4, r"size 2 \(the minibatch of all"),
    ({"distributed.num_envs_total": 16, "training.batch_size": 384}, False, 2, "does not divide the rollout"),
    ({"distributed.num_envs_total": 16}, False, None, "this one is not distributed"),
    ({"distributed.num_envs_total": 16, "env.num_envs": 4}, False, 2,
     r"^env.num_envs = 4 conflicts with distributed.num_envs_total = 16, which gives 8 over 2 ranks: give one"),
    ({"distributed.num_envs_total": 16, "parallel.num_envs_per_worker": 3}, True, 2,
     r"^parallel.num_envs_per_worker = 3 conflicts with distributed.num_envs_total = 16, which gives 4 over"),
    ({"distributed.num_envs_total": -2}, False, 2, r"^distributed.num_envs_total must not be negative, got -2$"),
    ({"distributed.num_envs_total": 16384}, False, 2, r"^distributed.num_envs_total = 16384 gives 8192 envs per rank, "
                                                       "more than the supported maximum of 4096 a process$"),
    ({"parallel.num_envs_per_worker": 100000}, True, None,
     r"^2 workers \(parallel.num_workers\) × 100000 envs per worker \(parallel.num_envs_per_worker\) = 200000 envs"),
    ({"parallel.sync_fraction": 0.5}, True, 2, "not within 2 distributed ranks: set it to 1"),
    ({"distributed.sync_fraction": 0.6}, False, 2, r"0.6 of 2 ranks waits for all of them: set it to at most 0.5,"),
    ({"distributed.sync_fraction": 0.6}, True, 4, "cuts the rollouts of sequential ranks; these step their"),
    ({"distributed.sync_fraction": 0.5, "training.batch_size": 2}, False, 2,
     "rollout to 256 samples, fewer than its 512 minibatches of 2"),
])
def test_layouts_that_cannot_split_are_refused(flags, parallel, world, message):
    with pytest.raises(ConfigError, match=message):
        build_config(None, {"training.n_steps": 64, **flags}, [], parallel=parallel, world_size=world)


def test_sequential_ranks_ignore_the_worker_settings_sync_fraction_among_them():
    cfg = build_config(None, {"parallel.sync_fraction": 0.5}, [], parallel=False, world_size=2)  # not refused
    assert (cfg.parallel.sync_fraction, cfg.distributed.sync_fraction) == (0.5, 1.0), "no cut among the ranks"


def test_the_ranks_sync_fraction_waits_for_a_share_of_them_and_one_process_ignores_it():
    cfg = build_config(None, {"distributed.sync_fraction": 0.6}, [], parallel=False, world_size=16)
    assert share_waited_for(cfg.distributed.sync_fraction, 16) == 10
    build_config(None, {"distributed.sync_fraction": 0.6}, [], parallel=True)  # one process: no other rank to cut


def test_a_rank_is_cut_once_enough_ranks_have_ended_their_rollout():
    """`RankCut` over one store, as each rank has it: with 2 of 3 ranks needed, a rank's rollout is cut once two
    have ended theirs (the throttle of store reads aside); each rollout counts afresh, and rank 0 drops the count of
    the rollout before once it ends the next."""
    from torch.distributed import HashStore

    from parallel_ppo.engines.distributed import RankCut

    store = HashStore()
    ranks = [RankCut(store, 2, is_main=rank == 0) for rank in range(3)]
    for cut in ranks:
        cut.CHECK_SECONDS = 0.0
    assert not ranks[2]()
    ranks[0].ended()
    assert not ranks[2]()
    ranks[1].ended()
    assert ranks[2]() and ranks[2](), "cut, and stays cut for the rest of the rollout"
    ranks[2].ended()
    assert store.add("0", 0) == 3 and not any(cut() for cut in ranks), "the next rollout counts afresh"
    ranks[1].ended()
    ranks[0].ended()
    assert ranks[2]() and store.num_keys() == 1, "rank 0 dropped rollout 0's count"


def test_a_rank_that_loses_the_store_mid_rollout_ends_it_and_reports_the_ranks_lost():
    """A store read failing inside a rollout ends that rollout, and the loss surfaces when it ends as the other
    ranks' (PeerLost), not as the env's error."""
    from parallel_ppo.engines.distributed import PeerLost, RankCut

    class GoneStore:
        def add(self, key: str, amount: int) -> int:
            raise RuntimeError("Connection reset by peer\nat TCPStore.cpp")

    cut = RankCut(GoneStore(), 2, is_main=True)
    assert cut(), "the rollout ends where the count cannot be read"
    with pytest.raises(PeerLost, match="lost the other ranks' count of ended rollouts: Connection reset by peer$"):
        cut.ended()


# ----------------------------------------------------------------------------------------------- under torchrun
@pytest.fixture(scope="module")
def one_process(tmp_path_factory) -> Path:
    """The reference: one sequential process stepping all 16 envs for one update."""
    out = tmp_path_factory.mktemp("one") / "run"
    proc = start([sys.executable, "train_timed.py", *ONE_STEP, "--num-envs", "16", "--output-dir", str(out)], cwd=ROOT)
    code, _, err = finish(proc)
    assert code == 0, err
    return out


@pytest.mark.slow
@pytest.mark.parametrize("script, layout", [("train_timed.py", []),
                                            ("train_parallel_timed.py", ["--num-workers", "1"])],
                         ids=["sequential-ranks", "parallel-ranks"])
def test_two_ranks_take_the_step_of_one_process(one_process, tmp_path, script, layout):
    """2 ranks × 8 envs (each rank a sequential collector, or a coordinator with one worker) end one update with
    the parameters of one process over the 16 envs, count the episodes of both ranks, agree on their parameters,
    and only rank 0 writes: the files of the output contract, mode distributed. Rank 1 of the sequential ranks
    starts 3 s late, past the 2 s collective timeout: the start waits for it (as for a rank measuring its learner
    settings while the others have them cached)."""
    out = tmp_path / "run"
    late = {PAUSE_ENV_VAR: f"start:1:{tmp_path / 'paused'}"} if not layout else {}
    proc = start([*torchrun(script), *ONE_STEP, *layout, "--num-envs-total", "16", "--output-dir", str(out),
                  "--set", "distributed.timeout_seconds=2"], cwd=ROOT, env={**os.environ, **late})
    code, stdout, err = finish(proc)
    assert code == 0, err
    assert layout or (tmp_path / "paused").exists(), "rank 1 did not start late"
    reference, mine = params(one_process), params(out)
    for name, value in reference.items():
        torch.testing.assert_close(mine[name], value, rtol=1e-5, atol=1e-6, msg=name)
    assert any(not torch.equal(value, params_at_start) for value, params_at_start in
               zip(reference.values(), load_initial(one_process).values(), strict=True)), "the step changed nothing"

    one, two = json.loads((one_process / "summary.json").read_text()), json.loads((out / "summary.json").read_text())
    assert two["mode"] == "distributed" and two["world_size"] == 2 and two["num_envs"] == 16
    assert two["episodes"] == one["episodes"] > 0, "episodes of both ranks are counted"
    assert two["episodic_return_mean"] == pytest.approx(one["episodic_return_mean"])
    assert two["total_env_steps"] == 512 and two["updates"] == 1
    ranks = two["distributed"]["ranks"]
    assert [r["rank"] for r in ranks] == [0, 1] and len({r["checksum"] for r in ranks}) == 1
    assert all(r["num_envs"] == 8 for r in ranks)
    assert two["distributed"]["source"] == ("parallel" if layout else "sequential")
    assert set(two) == {f.name for f in RunSummary.__dataclass_fields__.values()}
    for name in ("config.yaml", "metrics.csv", "checkpoint.pt", "summary.json"):
        assert (out / name).is_file(), name
    assert list((out / "logs").glob("events.out.tfevents.*"))
    with open(out / "metrics.csv", newline="") as f:
        assert next(csv.reader(f)) == metric_columns()
    assert load_run("two", out).layout.startswith("2 ranks × ")
    assert stdout.count("distributed run on CartPole-v1") == 1, "rank 0 alone speaks"


PENDULUM = ["--config", "config/mujoco.yaml", "--env", "Pendulum-v1", "--seed", "3", "--set", "logging.progress=off",
            "--set", "run.limit_seconds=0", "--set", "training.n_steps=32", "--batch-size", "512",
            "--set", "training.n_epochs=1", "--total-steps", "1024"]
"""Two updates of 16 Pendulum envs × 32 steps, one minibatch each: a Gaussian policy with observations and rewards
normalized, the second rollout collected with the statistics the first published."""
CAMERA = [*PENDULUM[:2], "--env", "toy_envs:CameraReach-v0", *PENDULUM[4:], "--set", "model.kind=auto",
          "--set", "model.impala_depths=[4]", "--set", "model.hidden_size=16", "--set", "training.normalize_obs=true",
          "--set", "logging.episode_info=[distance_to_goal]", "--set", "model.actor_keys=[camera,state]",
          "--set", "training.augment_shift=2", "--set", "training.predict_privileged=0.5"]
"""The same with a dict observation (camera image, vector and scalar keys) through an asymmetric actor-critic (the
critic reads `steps` too, which the actor learns to predict), its frames shifted in the update (each sample as in
one process), and a final-info entry of the user's logged besides the env's success."""


@pytest.mark.slow
@pytest.mark.parametrize("args", [PENDULUM, CAMERA], ids=["pendulum", "dict-camera"])
def test_two_ranks_with_continuous_actions_and_observation_statistics_take_the_steps_of_one_process(tmp_path, args):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    one, two = tmp_path / "one", tmp_path / "two"
    env = toy_envs_environ()
    code, _, err = finish(start([sys.executable, "train_timed.py", *args, "--num-envs", "16", "--output-dir",
                                 str(one)], cwd=ROOT, env=env))
    assert code == 0, err
    code, _, err = finish(start([*torchrun("train_timed.py"), *args, "--num-envs-total", "16", "--output-dir",
                                 str(two)], cwd=ROOT, env=env))
    assert code == 0, err
    reference, mine = load_checkpoint(one / "checkpoint.pt"), load_checkpoint(two / "checkpoint.pt")
    assert reference["update"] == mine["update"] == 2
    for name, value in reference["model"].items():  # the network's obs_mean and obs_std buffers included
        torch.testing.assert_close(mine["model"][name], value, rtol=1e-4, atol=1e-5, msg=name)
    for name in ("mean", "var", "count"):
        torch.testing.assert_close(torch.as_tensor(mine["obs_normalizer"][name]),
                                   torch.as_tensor(reference["obs_normalizer"][name]), rtol=1e-6, atol=1e-6)
    ranks = json.loads((two / "summary.json").read_text())["distributed"]["ranks"]
    assert len({r["checksum"] for r in ranks}) == 1
    if args == CAMERA:  # every rank's episodes in the windows, written by rank 0 as one process writes them
        finals = [json.loads((out / "summary.json").read_text())["final_metrics"] for out in (one, two)]
        for column in ("success_rate", "episode_distance_to_goal"):
            assert finals[1][column] == pytest.approx(finals[0][column], rel=1e-5)
            assert float(rows(two)[-1][column]) == pytest.approx(finals[0][column], rel=1e-5)
        events = EventAccumulator(str(two / "logs"))
        events.Reload()
        assert events.Scalars("episode/distance_to_goal")[-1].value == pytest.approx(
            finals[0]["episode_distance_to_goal"], rel=1e-5)


@pytest.mark.slow
def test_the_slowest_rank_is_cut_once_the_others_have_ended_theirs(tmp_path):
    """DD-PPO's pre-emption on 2 sequential ranks (`distributed.sync_fraction` 0.5: one rank's ended rollout ends
    the other's): rank 1's envs sleep 0.05 s a step, so its rollout of 32 steps would take 6.4 s where rank 0's takes
    a fraction of a second; it ends after at least 8 of them (a quarter), in each of the 2 updates. Each update counts
    the steps every rank took, and the ranks keep one set of parameters."""
    out = tmp_path / "run"
    args = [*PENDULUM[:2], "--env", "toy_envs:StragglingReach-v0", *PENDULUM[4:12], "--num-envs", "4",
            "--batch-size", "128", "--set", "training.n_epochs=1", "--total-steps", "300",
            "--set", "distributed.sync_fraction=0.5"]
    code, _, err = finish(start([*torchrun("train_timed.py"), *args, "--output-dir", str(out)], cwd=ROOT,
                                env={**toy_envs_environ(), "STRAGGLING_RANK": "1"}))
    assert code == 0, err
    steps = [int(r["env_steps"]) for r in rows(out)]
    # each update: rank 0's 4 envs × 32 steps, rank 1's 4 × 8 to 31
    taken = [now - before for before, now in zip([0, *steps[:-1]], steps, strict=True)]
    assert len(taken) == 2 and all(128 + 4 * 8 <= n < 256 for n in taken), taken
    assert [float(r["rollout_cut"]) for r in rows(out)] == pytest.approx([1 - n / 256 for n in taken])
    summary = json.loads((out / "summary.json").read_text())
    assert summary["total_env_steps"] == steps[-1]
    assert len({r["checksum"] for r in summary["distributed"]["ranks"]}) == 1


def load_initial(out: Path) -> dict[str, torch.Tensor]:
    """The reference run's initial parameters, rebuilt as the trainer builds them (same seed)."""
    cfg = config_from_dict(yaml.safe_load((out / "config.yaml").read_text()))
    torch.manual_seed(cfg.run.seed)
    model, _ = build_learner(env_spaces(cfg.env), cfg)
    return model.state_dict()


@pytest.mark.slow
def test_sigint_to_torchrun_alone_stops_every_rank_at_one_update(tmp_path):
    """Ctrl-C reaches torchrun, which passes it on: every rank stops at the same update, rank 0's checkpoint is that
    update's (tests/test_signals.py sends SIGTERM to every process and resumes)."""
    out = tmp_path / "run"
    proc = start([*torchrun("train_timed.py"), *CARTPOLE, "--num-envs-total", "16", "--total-steps", "10000000",
                  "--set", "run.checkpoint_interval=0.5", "--output-dir", str(out)], cwd=ROOT)
    wait_rows(proc, out, 3)
    shm_before, sids = shm_entries(), sessions_of(proc.pid)
    assert len(sids) == 3
    os.kill(proc.pid, signal.SIGINT)  # the launcher alone: torchrun passes it on to the ranks
    code, _, err = finish(proc, timeout=60)
    assert code != 0
    first = json.loads((out / "summary.json").read_text())
    assert first["stop_reason"] == "signal" and first["signal"] == "SIGINT", err
    assert load_checkpoint(out / "checkpoint.pt")["update"] == first["updates"] == len(rows(out))
    assert len({r["checksum"] for r in first["distributed"]["ranks"]}) == 1
    assert_no_session_left(sids, shm_before)


def coordinator(launcher: int, rank: int, timeout: float = 60) -> psutil.Process:
    """The rank's process among the launcher's children, by its title (which hides its environment)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for child in psutil.Process(launcher).children():
            try:
                if " ".join(child.cmdline()).startswith(f"parallel_ppo coordinator rank {rank} "):
                    return child
            except psutil.Error:
                continue
        time.sleep(0.1)
    raise AssertionError(f"rank {rank} not found")


@pytest.mark.slow
def test_a_killed_rank_stops_the_others_and_leaves_nothing(tmp_path):
    """Each rank a coordinator with a worker (shared memory, forkserver): SIGKILL of rank 1 ends the whole run
    within 60 s with rank 0's one-line reason (or torchrun's SIGTERM to it), no process and no /dev/shm entry
    left."""
    out = tmp_path / "run"
    shm_before = shm_entries()
    proc = start([*torchrun("train_parallel_timed.py"), *CARTPOLE, "--num-workers", "1", "--num-envs-total", "16",
                  "--total-steps", "10000000", "--output-dir", str(out)], cwd=ROOT)
    wait_rows(proc, out, 2)
    sids = sessions_of(proc.pid)
    assert sum(len(session_pids(sid)) for sid in sids) >= 5, "launcher, 2 ranks and their workers"
    coordinator(proc.pid, 1).kill()
    killed = time.monotonic()
    code, _, err = finish(proc, timeout=90)
    assert time.monotonic() - killed < 60
    assert code != 0
    # a race: rank 0 notices the lost peer in its next collective, or torchrun, seeing rank 1 gone, SIGTERMs it first
    assert "rank 0 lost the other ranks" in err or "Signal 15 (SIGTERM) received by PID" in err, err
    assert_no_session_left(sids, shm_before)


def test_an_error_after_rank_zeros_update_stops_every_rank(monkeypatch):
    """Rank 0's hooks failing ("error": an evaluation, a metrics write) stops the other ranks at the same update; it
    wins over a signal on any rank, as a rollout's error does, and over a budget; a signal's number goes with it."""
    from parallel_ppo.engines import distributed

    ranks = distributed.Ranks.__new__(distributed.Ranks)
    ranks.rank, ranks.world_size, ranks._patient = 1, 2, None

    def agreed(mine: tuple, rank_zeros: tuple) -> tuple:
        sent: list[torch.Tensor] = []
        monkeypatch.setattr(distributed.dist, "all_reduce", lambda flags, *args: sent.append(flags.clone()))
        ranks.agree_stop(*rank_zeros)
        monkeypatch.setattr(distributed.dist, "all_reduce",
                            lambda flags, *args: flags.copy_(torch.maximum(flags, sent[0])))
        return ranks.agree_stop(*mine)

    assert agreed(("", None), ("error", None)) == ("error", None)
    assert agreed(("signal", signal.SIGTERM), ("error", None)) == ("error", None)
    assert agreed(("signal", signal.SIGTERM), ("duration", None)) == ("signal", signal.SIGTERM)
    assert agreed(("duration", None), ("error", None)) == ("error", None)
    assert agreed(("duration", None), ("", None)) == ("duration", None)


@pytest.mark.slow
def test_a_group_torchrun_restarts_resumes_from_its_checkpoint_by_itself(tmp_path):
    """torchrun --max-restarts 1: rank 1 killed mid-run (the ranks held in update 4, so the run cannot end first),
    the new group resumes from the last checkpoint without --resume, finishes the step budget with every update
    counted once, and says so (restarts = 1)."""
    out, target, held = tmp_path / "run", 20 * 512, tmp_path / "held"
    shm_before = shm_entries()
    launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                "--max-restarts", "1", "train_timed.py", "--distributed"]
    proc = start([*launcher, *CARTPOLE, "--num-envs-total", "16", "--total-steps", str(target),
                  "--set", "run.checkpoint_interval=0.01", "--output-dir", str(out)], cwd=ROOT,
                 env={**os.environ, PAUSE_ENV_VAR: f"update:4:{held}"})  # the new group finds it released
    wait_rows(proc, out, 3)
    wait_for(held, proc)
    rank_of = {child.environ().get("RANK"): child for child in psutil.Process(proc.pid).children()}
    rank_of["1"].kill()
    release_file(held).touch()
    code, _, err = finish(proc)
    assert code == 0, err
    summary = json.loads((out / "summary.json").read_text())
    assert summary["restarts"] == summary["resumes"] == 1, err
    assert summary["stop_reason"] == "total_steps" and summary["total_env_steps"] == target
    assert [int(r["update"]) for r in rows(out)] == list(range(1, target // 512 + 1))
    assert len({r["checksum"] for r in summary["distributed"]["ranks"]}) == 1
    assert_nothing_left(proc.pid, shm_before)  # torchrun's session; the ranks of both attempts had their own:
    assert not [p.pid for p in psutil.process_iter(["cmdline"]) if str(out) in " ".join(p.info["cmdline"] or [])]


def test_the_exchanges_where_ranks_wait_on_rank_zero_take_the_long_timeout(monkeypatch):
    """At start (the parameters, rank 0's objects), at each stop agreement (rank 0 logs, checkpoints and evaluates
    before it) and at the end (rank 0 writes its last checkpoint before the ranks' gather) the collective runs on the
    patient group; a rollout's gather keeps the short timeout that catches a hung rank."""
    from parallel_ppo.engines import distributed

    ranks = distributed.Ranks.__new__(distributed.Ranks)
    ranks.rank, ranks.world_size, ranks._patient = 0, 1, object()
    groups: dict[str, object] = {}

    def record(name: str):
        def collective(*args):
            groups[name] = args[-1]
        return collective

    for name in ("broadcast", "broadcast_object_list", "all_reduce", "all_gather_object"):
        monkeypatch.setattr(distributed.dist, name, record(name))
    ranks.broadcast_parameters(torch.nn.Linear(2, 1))
    ranks.broadcast({"settings": 1})
    ranks.agree_stop("", None)
    assert groups == dict.fromkeys(("broadcast", "broadcast_object_list", "all_reduce"), ranks._patient)
    ranks.gather({"rank": 0}, patient=True)
    assert groups["all_gather_object"] is ranks._patient
    ranks.gather({"rollout": 0})
    assert groups["all_gather_object"] is None

    from types import SimpleNamespace

    from parallel_ppo.core.group import Group
    from parallel_ppo.runs.training import gather_ranks

    asked: list[bool] = []

    class Recording(Group):
        def gather(self, obj, patient=False):
            asked.append(patient)
            return [obj]

    gather_ranks(SimpleNamespace(threads={}), SimpleNamespace(layout={}, mode="parallel"),
                 SimpleNamespace(model=torch.nn.Linear(2, 1)), SimpleNamespace(phase_seconds={}), Recording())
    assert asked == [True], "the end-of-run gather waits with the long timeout"


def test_every_rank_takes_rank_zeros_word_on_whether_a_resumed_run_had_finished(tmp_path):
    """`finished_summary`: rank 0 reads summary.json and keeps it only where it is the checkpoint's (its updates and
    env steps); the other ranks read nothing (their host's copy may be another) and take rank 0's answer from the
    broadcast, so that every rank finishes the run (the ranks' gather) or none; a resume that trained on, or whose
    checkpoint ended on a signal, finishes without asking (the ranks agreed on those already)."""
    from types import SimpleNamespace

    from parallel_ppo.core.group import Group
    from parallel_ppo.runs.training import finished_summary

    sent: list[object] = []

    class Rank(Group):
        def __init__(self, rank: int) -> None:
            self.rank, self.is_main = rank, rank == 0

        def broadcast(self, obj):
            if self.is_main:
                sent.append(obj)
            return sent[-1]

    def finished(rank: int, update: int = 4, ended: str | None = "total_steps") -> dict | None:
        plan = SimpleNamespace(run_dir=tmp_path, resume={"update": 4, "env_steps": 128, "stop_reason": ended})
        return finished_summary(plan, SimpleNamespace(update=update), SimpleNamespace(stop_reason="total_steps"),
                                Rank(rank))

    ours = {"updates": 4, "total_env_steps": 128}
    (tmp_path / "summary.json").write_text(json.dumps(ours))
    assert finished(0) == ours
    (tmp_path / "summary.json").write_text(json.dumps({"updates": 2, "total_env_steps": 64}))  # rank 1's host's
    assert finished(1) == ours
    assert finished(0) is None and finished(1) is None  # an earlier session's summary.json: the run finishes now
    (tmp_path / "summary.json").write_text(json.dumps(ours))
    assert finished(0, update=5) is None and finished(0, ended="signal") is None and len(sent) == 2
