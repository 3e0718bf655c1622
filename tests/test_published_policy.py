"""The policy the coordinator publishes and a worker's copy of it: taken whole, and from the next step on."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from parallel_ppo.core.buffer import RolloutBuffer
from parallel_ppo.core.collect import EnvRunner
from parallel_ppo.core.configure import build_config
from parallel_ppo.core.distributions import log_prob_entropy
from parallel_ppo.core.lifetime import parent_process_watch
from parallel_ppo.core.model import autocast, kept_casts, network, policy_tensors
from parallel_ppo.engines.parallel.published import PolicyCopy, PublishedPolicy, await_newer, hold_step, lagged_steps
from parallel_ppo.envs.batch import env_spaces, make_batch_env

ROOT = Path(__file__).resolve().parents[1]


def _models(cfg, count: int) -> list[torch.nn.Module]:
    out = []
    for seed in range(count):
        torch.manual_seed(seed)
        out.append(network(cfg, env_spaces(cfg.env)))
    return out


def test_a_copy_takes_a_publication_only_when_asked_and_owns_its_tensors(monkeypatch):
    monkeypatch.chdir(ROOT)
    cfg = build_config("config/cartpole.yaml", {"env.id": "CartPole-v1"}, [], False)
    a, b, worker = _models(cfg, 3)
    published = PublishedPolicy.allocate(sum(t.numel() for t in policy_tensors(a)))
    copy = PolicyCopy(published, worker)
    assert copy.version == -1
    first = published.publish(a)
    assert first == 2 and first % 2 == 0, "a whole publication has an even version"
    assert copy.refresh() == first
    assert all(torch.equal(x, y) for x, y in zip(policy_tensors(worker), policy_tensors(a), strict=True))
    second = published.publish(b)
    assert all(torch.equal(x, y) for x, y in zip(policy_tensors(worker), policy_tensors(a), strict=True)), \
        "the worker's model keeps its parameters until it refreshes (they are not views of the shared ones)"
    assert copy.refresh() == second == 4
    assert all(torch.equal(x, y) for x, y in zip(policy_tensors(worker), policy_tensors(b), strict=True))


@pytest.mark.parametrize("switch, precision", [(0, "fp32"), (5, "fp32"), (32, "fp32"), (5, "bf16")])
def test_a_rollout_acts_with_each_publication_from_its_next_step(monkeypatch, switch, precision):
    """A policy published before step `switch` acts from that step on, the first one before it: the stored
    log-probs are those of the model that acted (in bf16 too, where the rollout keeps the weights' bf16 casts until a
    publication changes them), the buffer keeps the version each step acted with, and the steps before
    `switch` lag the second."""
    monkeypatch.chdir(ROOT)
    cfg = build_config("config/cartpole.yaml", {"env.id": "CartPole-v1", "run.seed": 3},
                       ["env.num_envs=4", "training.n_steps=32", "training.batch_size=32",
                        f"training.precision={precision}"], False)
    spaces = env_spaces(cfg.env)
    a, b, worker = _models(cfg, 3)
    published = PublishedPolicy.allocate(sum(t.numel() for t in policy_tensors(a)))
    copy = PolicyCopy(published, worker)
    first = published.publish(a)
    copy.refresh()
    steps, second = 0, None

    def refresh() -> int:
        nonlocal steps, second
        if steps == switch:
            second = published.publish(b)
        steps += 1
        return copy.refresh()

    runner = EnvRunner.for_run(make_batch_env(cfg.env, 3, 0, 4, 1), cfg, 0, (0, 0))
    buf = RolloutBuffer.allocate(32, 4, spaces.obs_shape, spaces.obs_dtype, spaces.actions)
    try:
        runner.collect(worker, buf, refresh=refresh)
    finally:
        runner.close()
    with torch.no_grad(), autocast(precision):  # step by step, as the rollout acted: a bf16 sum's order is the same
        acted = [torch.stack([log_prob_entropy(m(buf.obs[t])[0].float(), buf.actions[t])[0] for t in range(32)])
                 for m in (a, b)]
    torch.testing.assert_close(buf.logprobs[:switch], acted[0][:switch])
    torch.testing.assert_close(buf.logprobs[switch:], acted[1][switch:])
    assert not torch.allclose(acted[0], acted[1]), "the two models act differently"
    if second is None:  # published once the rollout had ended: every step lags
        second = published.publish(b)
    assert (buf.versions[:switch] == first).all() and (buf.versions[switch:] == second).all()
    lagged = lagged_steps(buf, second, True)
    if switch == 0:
        assert lagged is None, "no step lags"
    else:
        assert lagged.tolist() == [[t < switch] * 4 for t in range(32)]


def test_only_bf16_rollouts_hold_an_autocast_block():
    """A device without autocast (DirectML's privateuseone) acts in fp32 as before: nothing to hold there."""
    with kept_casts("fp32", "privateuseone"), kept_casts("tf32", "cuda"):
        assert not torch.is_autocast_enabled("cpu")
    with kept_casts("bf16"):
        assert not torch.is_autocast_enabled("cpu"), "held, not enabled: what runs between forwards is as outside"


@pytest.mark.parametrize("refreshed", [True, False])
def test_the_lagged_steps_of_a_cut_rollout_are_among_those_taken(refreshed):
    """`lagged_steps` on a rollout whose envs 2 and 3 stopped after 5 of 16 steps: refreshed workers' steps before
    the new version lag (those after the cut hold an older rollout's and are not among them); without refreshing,
    a rollout for a model never published lags on every step taken, one for the published model on none."""
    buf = RolloutBuffer.allocate(16, 4, (2,), np.float32)
    buf.lengths[2:] = 5
    buf.versions[3:] = 6  # version 4 acted for 3 steps, then 6
    taken = torch.arange(16)[:, None] < buf.lengths
    lagged = lagged_steps(buf, 6 if refreshed else None, refreshed)
    expected = taken & (torch.arange(16)[:, None] < 3) if refreshed else taken
    assert torch.equal(lagged, expected) and int(lagged.sum()) == (4 * 3 if refreshed else 2 * 16 + 2 * 5)
    if refreshed:  # for a version no step acted with, every step taken lags
        assert torch.equal(lagged_steps(buf, 8, True), taken)
    else:  # a rollout for the published model
        assert lagged_steps(buf, 4, False) is None


def test_a_worker_holds_until_a_newer_policy_is_published_or_its_rollout_is_abandoned():
    """`parallel.max_lagged_share`: the step a worker waits at (that share of the rollout, rounded down; none at 1),
    and the wait, which ends once the version moves on (here as its third look at `stopping` publishes) or at once
    when the rollout is abandoned."""
    assert (hold_step(0.25, 32), hold_step(0.29, 100), hold_step(0.001, 512), hold_step(1.0, 32)) == (8, 29, 0, None)
    published = PublishedPolicy.allocate(3)
    published.version.fill_(2)
    looks = []

    def stopping() -> bool:
        looks.append(int(published.version))
        if len(looks) == 3:
            published.version += 2  # a publication, whole
        return False

    await_newer(published, 2, stopping)
    assert looks == [2, 2, 2] and int(published.version) == 4, "it waited until the version moved on"
    await_newer(published, 4, lambda: True)  # abandoned: no newer policy comes, and it returns


def test_a_copy_stops_waiting_for_a_publication_whose_publisher_is_gone(monkeypatch):
    """A publication left half-written (an odd version) by a coordinator that died: the copy waits while the
    coordinator lives, then keeps what it holds (a wait that never ended fails here, not at the suite's timeout)."""
    yields = []

    def sched_yield() -> None:
        yields.append(1)
        assert len(yields) < 10_000, "it waited on after the publisher was gone"

    monkeypatch.setattr(os, "sched_yield", sched_yield)
    published = PublishedPolicy.allocate(3)
    looks = []
    copy = PolicyCopy(published, torch.nn.Linear(1, 1), gone=lambda: looks.append(1) or len(looks) >= 3)
    published.version.fill_(2)
    assert copy.refresh() == 2 and not looks
    published.version.fill_(3)
    assert copy.refresh() == 2 and copy.version == 2
    assert len(looks) == 3 and len(yields) == 2, "it waited while the publisher lived"


STARTER = """
import multiprocessing, os, signal, sys, time
from parallel_ppo.core.lifetime import parent_process_watch

def watch(path):
    gone = parent_process_watch()
    print(gone(), file=open(path, "a"), flush=True)
    deadline = time.monotonic() + 20
    while not gone() and time.monotonic() < deadline:
        time.sleep(0.01)
    print(gone(), file=open(path, "a"), flush=True)

if __name__ == "__main__":
    child = multiprocessing.get_context("forkserver").Process(target=watch, args=(sys.argv[1],))
    child.start()
    while not os.path.getsize(sys.argv[1]):  # until the child has looked once
        if not child.is_alive():
            sys.exit(f"the child ended first (exit status {child.exitcode})")
        time.sleep(0.01)
    os.kill(os.getpid(), signal.SIGKILL)
"""


def test_a_forkserver_child_sees_its_starter_killed(tmp_path):
    """`parent_process_watch` in a forkserver's child: false while the process that started it lives, true once that
    one is SIGKILLed (the forkserver, kept alive by its child, is no sign). Never true where multiprocessing did not
    start the process."""
    assert parent_process_watch()() is False
    script, lines = tmp_path / "starter.py", tmp_path / "watch.txt"
    script.write_text(STARTER)
    lines.touch()
    proc = subprocess.run([sys.executable, str(script), str(lines)], cwd=ROOT, timeout=60, capture_output=True,
                          text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    deadline = time.monotonic() + 30
    while len(lines.read_text().split()) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert lines.read_text().split() == ["False", "True"]
