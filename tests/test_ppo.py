"""PPO loss and update on fixed batches, explained variance, and inverse-CDF action sampling."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from parallel_ppo.core.buffer import RolloutBuffer
from parallel_ppo.core.config import ModelConfig, TrainingConfig
from parallel_ppo.core.distributions import sample_actions
from parallel_ppo.core.model import build_model
from parallel_ppo.core.ppo import (
    TrainBatch,
    anchored,
    explained_variance,
    minibatch_step,
    normalize_advantages,
    ppo_loss,
    ppo_update,
    revalue_lagged,
)

OBS_SIZE, NUM_ACTIONS, BATCH = 6, 4, 64


def fixed(**fields) -> TrainingConfig:
    """A training config with its machine-dependent settings fixed (the trainers resolve `auto` before a run)."""
    return TrainingConfig(**{"precision": "fp32", "microbatch_size": 64, **fields})


def small_model(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return build_model((OBS_SIZE,), NUM_ACTIONS, ModelConfig(kind="mlp", mlp_hidden=[32, 32]))


def rollout_batch(model: nn.Module, seed: int = 0) -> TrainBatch:
    """A batch as the collector would produce it: actions sampled from the model, its log-probs and values."""
    g = torch.Generator().manual_seed(seed)
    obs = torch.randn(BATCH, OBS_SIZE, generator=g)
    with torch.no_grad():
        logits, values = model(obs)
        actions = torch.multinomial(F.softmax(logits, -1), 1, generator=g).squeeze(1)
        logprobs = F.log_softmax(logits, -1).gather(1, actions.unsqueeze(1)).squeeze(1)
    advantages = torch.randn(BATCH, generator=g)
    returns = values + advantages + 0.5 * torch.randn(BATCH, generator=g)
    return TrainBatch(obs, actions, logprobs, values, advantages, returns)


def test_loss_before_any_step_has_unit_ratio():
    """On the data it was collected with, the policy has ratio 1, no clipping and zero KL."""
    model = small_model()
    cfg = fixed()
    batch = normalize_advantages(rollout_batch(model), cfg)
    loss, stats = ppo_loss(model, batch, cfg)
    assert torch.isfinite(loss)
    assert stats["losses/ratio_mean"].item() == pytest.approx(1.0, abs=1e-6)
    assert stats["losses/clipfrac"].item() == 0.0
    assert stats["losses/approx_kl"].item() == pytest.approx(0.0, abs=1e-7)
    # normalized advantages have mean 0, so the unclipped surrogate at ratio 1 is 0
    assert stats["losses/policy_loss"].item() == pytest.approx(0.0, abs=1e-6)
    # the untrained policy head is nearly uniform
    assert stats["losses/entropy"].item() == pytest.approx(math.log(NUM_ACTIONS), rel=1e-3)


def full_batch_stats(model, batch, cfg):
    with torch.no_grad():
        loss, stats = ppo_loss(model, normalize_advantages(batch, cfg), cfg)
    return loss.item(), {k: v.item() for k, v in stats.items()}


def test_normalize_advantages():
    """Mean 0 and std 1 with norm_adv; the batch untouched without it."""
    batch = rollout_batch(small_model())
    adv = normalize_advantages(batch, fixed(norm_adv=True)).advantages
    assert adv.mean().item() == pytest.approx(0.0, abs=1e-6)
    assert adv.std().item() == pytest.approx(1.0, abs=1e-4)
    assert normalize_advantages(batch, fixed(norm_adv=False)) is batch


@pytest.mark.parametrize("microbatch", [1, 7, 16, 64])
def test_microbatches_give_the_minibatch_step(microbatch):
    """Chunked forward/backward (even and uneven chunks) takes the same optimizer step as one pass."""
    cfg_whole = fixed(microbatch_size=0)
    cfg_chunk = fixed(microbatch_size=microbatch)
    results = []
    for cfg in (cfg_whole, cfg_chunk):
        model = small_model(3)
        batch = rollout_batch(model, 4)
        noise = 0.3 * torch.randn(BATCH, generator=torch.Generator().manual_seed(5))
        batch.logprobs = batch.logprobs + noise  # as if an older policy collected it: some ratios clip
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        stats = minibatch_step(model, optimizer, batch, cfg)
        results.append((stats, [p.detach().clone() for p in model.parameters()]))
    (whole_stats, whole_params), (chunk_stats, chunk_params) = results
    assert whole_stats["losses/clipfrac"] > 0
    assert set(chunk_stats) == set(whole_stats)
    for key, value in whole_stats.items():
        assert chunk_stats[key] == pytest.approx(value, rel=1e-5, abs=1e-6), key
    moved = False
    for p_whole, p_chunk, p_init in zip(whole_params, chunk_params, small_model(3).parameters(), strict=True):
        torch.testing.assert_close(p_chunk, p_whole, rtol=1e-5, atol=1e-6)
        moved |= not torch.equal(p_whole, p_init.detach())
    assert moved


def test_updates_on_the_same_batch_decrease_the_loss():
    """Repeated ppo_update calls on one batch lower the loss, the surrogate and the value loss."""
    model = small_model(1)
    batch = rollout_batch(model, 1)
    cfg = fixed(batch_size=16, n_epochs=4, learning_rate=3e-3, ent_coef=0.0)
    optimizer = torch.optim.Adam(model.parameters(), lr=cfg.learning_rate, eps=1e-5)
    loss0, stats0 = full_batch_stats(model, batch, cfg)
    history = []
    for _ in range(3):
        result = ppo_update(model, optimizer, batch, cfg, torch.Generator().manual_seed(0))
        assert set(result) >= {f"losses/{name}" for name in ("policy_loss", "value_loss", "entropy", "approx_kl",
                                                             "clipfrac", "ratio_mean", "explained_variance")}
        history.append(full_batch_stats(model, batch, cfg)[0])
    loss1, stats1 = full_batch_stats(model, batch, cfg)
    assert loss1 < loss0 - 0.05
    assert history[-1] < history[0]
    assert stats1["losses/policy_loss"] < stats0["losses/policy_loss"]
    assert stats1["losses/value_loss"] < stats0["losses/value_loss"]
    assert stats1["losses/approx_kl"] > 0  # the policy moved


def test_a_decoupled_update_clips_around_the_policy_it_starts_from():
    """Steps taken by an older policy (their stored log-probs off the model's): PPO's clip counts that lag as the
    update's move (the first step's KL and clip fraction above 0); the decoupled update clips around the policy it
    starts from (0 at its first step) and still moves it in later steps."""
    model = small_model(1)
    batch = rollout_batch(model, 1)
    lagged = dataclasses.replace(batch, logprobs=batch.logprobs + 0.3 * torch.randn(len(batch),
                                                                                   generator=torch.Generator().manual_seed(2)))
    first = {}
    for decoupled in (False, True):
        copy = small_model(1)
        copy.load_state_dict(model.state_dict())
        first[decoupled] = ppo_update(copy, torch.optim.Adam(copy.parameters(), lr=3e-3), lagged,
                                      fixed(batch_size=len(batch), n_epochs=1), torch.Generator().manual_seed(0),
                                      decoupled=decoupled)
    assert first[False]["losses/clipfrac"] > 0.1 and first[False]["losses/approx_kl"] > 0.01
    assert first[True]["losses/clipfrac"] == 0 and first[True]["losses/approx_kl"] == pytest.approx(0, abs=1e-7)
    later = ppo_update(model, torch.optim.Adam(model.parameters(), lr=3e-3), lagged,
                       fixed(batch_size=16, n_epochs=3), torch.Generator().manual_seed(0), decoupled=True)
    assert later["losses/approx_kl"] > 1e-5


class GaussianAtZero(nn.Module):
    """A continuous policy that ignores its observation: a Gaussian at 0 whose log-std is its one parameter."""

    def __init__(self) -> None:
        super().__init__()
        self.log_std = nn.Parameter(torch.zeros(1))

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        rows = obs.shape[0]
        return torch.cat([torch.zeros(rows, 1), self.log_std.expand(rows, 1)], 1), torch.zeros(rows)


@pytest.mark.parametrize("acting_std", [1.25, 0.8])
def test_a_lagged_policys_steps_move_the_spread_only_through_the_clip_around_it(acting_std):
    """Steps taken by an older policy wider (or narrower) than the model, each action once with an advantage of +1
    and once with -1: no signal about the spread. PPO's clip around the acting policy drops the gradient of the
    steps that would narrow a policy (widen it) and keeps those that would widen it, so its loss widens (narrows)
    the model; the decoupled loss, clipped around the model itself, does not push it (the weight it adds moves
    nothing here: no unclipped loss pushes where the advantages say nothing). Why a lag kept HalfCheetah's policy
    wide: docs/training.md."""
    n = 2000  # the acting policy's quantiles, each taken once with an advantage of +1 and once with -1
    actions = (acting_std * torch.distributions.Normal(0.0, 1.0).icdf((torch.arange(n) + 0.5) / n)).repeat(2)[:, None]
    acting = -0.5 * (actions[:, 0] / acting_std) ** 2 - math.log(acting_std) - 0.5 * math.log(2 * math.pi)
    batch = TrainBatch(torch.zeros(2 * n, 1), actions, acting, torch.zeros(2 * n),
                       torch.cat([torch.ones(n), -torch.ones(n)]), torch.zeros(2 * n))
    cfg = fixed(microbatch_size=2 * n, clip_vloss=False, ent_coef=0.0)
    widening = {}
    for decoupled in (False, True):
        model = GaussianAtZero()
        loss, _ = ppo_loss(model, anchored(model, batch, cfg) if decoupled else batch, cfg)
        loss.backward()
        widening[decoupled] = -float(model.log_std.grad)  # a gradient step's push on the log-std
    wider = 1 if acting_std > 1 else -1
    assert wider * widening[False] > 0.1, widening  # about 0.35 and 0.22
    assert widening[True] == pytest.approx(0, abs=1e-4), widening


def test_the_lagged_steps_are_valued_again_by_the_learner():
    """`revalue_lagged` (`parallel.fresh_values`): the values of the lagged steps, and each env's last value where its
    last step taken lagged (env 2's rollout was cut after 3 steps), are the learner's on the stored observations,
    computed in chunks smaller than the rollout; every other value stays as stored."""
    old, new = small_model(0), small_model(1)
    buf = RolloutBuffer.allocate(5, 4, (OBS_SIZE,), np.dtype(np.float32))
    buf.obs.copy_(torch.randn(5, 4, OBS_SIZE))
    buf.last_obs.copy_(torch.randn(4, OBS_SIZE))
    buf.lengths[2] = 3
    with torch.no_grad():
        buf.values.copy_(old(buf.obs.flatten(0, 1))[1].reshape(5, 4))
        buf.last_values.copy_(old(buf.last_obs)[1])
        fresh, fresh_last = new(buf.obs.flatten(0, 1))[1].reshape(5, 4), new(buf.last_obs)[1]
    stored, stored_last = buf.values.clone(), buf.last_values.clone()
    lagged = torch.zeros(5, 4, dtype=torch.bool)
    lagged[:, 0] = True  # env 0 lagged throughout: its last value too
    lagged[:2, 1] = True  # env 1 took the new parameters at step 2: its last value was the new policy's
    lagged[:3, 2] = True  # env 2, cut after step 2, lagged to its end
    revalue_lagged(new, buf, lagged, fixed(microbatch_size=3))
    torch.testing.assert_close(buf.values[lagged], fresh[lagged])
    assert torch.equal(buf.values[~lagged], stored[~lagged])
    torch.testing.assert_close(buf.last_values[[0, 2]], fresh_last[[0, 2]])
    assert torch.equal(buf.last_values[[1, 3]], stored_last[[1, 3]])
    assert not torch.allclose(stored[lagged], fresh[lagged]), "the two models value them apart"


def test_an_update_on_some_rows_never_reads_the_others():
    """`ppo_update(rows=...)` (a cut rollout's steps taken) learns from those rows alone, in as many minibatches as
    the whole batch makes: NaN everywhere else leaves the parameters finite, and the result equals an update on a
    batch of those rows alone cut into the same number of minibatches."""
    batch = rollout_batch(small_model(4), 4)
    rows = torch.arange(0, BATCH, 3)  # 22 of 64
    poisoned = dataclasses.replace(batch, **{name: getattr(batch, name).clone() for name in
                                             ("obs", "advantages", "returns", "values", "logprobs")})
    others = torch.ones(BATCH, dtype=torch.bool)
    others[rows] = False
    for name in ("obs", "advantages", "returns", "values", "logprobs"):
        getattr(poisoned, name)[others] = float("nan")
    cfg = fixed(batch_size=16, n_epochs=2, microbatch_size=0)
    model = small_model(5)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3, eps=1e-5)
    first, steps_before = next(model.parameters()), []  # before_step: called before each of them
    stats = ppo_update(model, optimizer, poisoned, cfg, torch.Generator().manual_seed(0), rows=rows,
                       before_step=lambda: steps_before.append(int(optimizer.state.get(first, {}).get("step", 0))))
    assert all(math.isfinite(v) for v in stats.values()), stats
    assert int(optimizer.state[first]["step"]) == 2 * BATCH // 16  # 4 minibatches an epoch
    assert steps_before == list(range(2 * BATCH // 16))
    alone = small_model(5)
    alone_optimizer = torch.optim.Adam(alone.parameters(), lr=1e-3, eps=1e-5)
    ppo_update(alone, alone_optimizer, batch[rows], fixed(batch_size=len(rows) // 4, n_epochs=2, microbatch_size=0),
               torch.Generator().manual_seed(0))
    assert int(alone_optimizer.state[next(alone.parameters())]["step"]) == 2 * 4
    for ours, theirs in zip(model.parameters(), alone.parameters(), strict=True):
        torch.testing.assert_close(ours, theirs)


def test_big_steps_are_clipped():
    """After large steps the ratio leaves [1 - clip, 1 + clip] for some samples, and clipfrac reports it."""
    model = small_model(2)
    batch = rollout_batch(model, 2)
    cfg = fixed(batch_size=BATCH, n_epochs=30, learning_rate=0.05, max_grad_norm=100.0)
    optimizer = torch.optim.Adam(model.parameters(), lr=cfg.learning_rate)
    ppo_update(model, optimizer, batch, cfg, torch.Generator().manual_seed(0))
    _, stats = full_batch_stats(model, batch, cfg)
    assert stats["losses/clipfrac"] > 0
    assert stats["losses/approx_kl"] > 1e-3
    # clipfrac matches its definition on the same data
    with torch.no_grad():
        logits, _ = model(batch.obs)
        new_lp = F.log_softmax(logits, -1).gather(1, batch.actions.unsqueeze(1)).squeeze(1)
        ratio = (new_lp - batch.logprobs).exp()
    assert stats["losses/clipfrac"] == pytest.approx(((ratio - 1).abs() > cfg.clip_coef).float().mean().item())


class TablePolicy(nn.Module):
    """A 'network' whose logits and value for observation i are free parameters (rows are independent)."""

    def __init__(self, logits: torch.Tensor, values: torch.Tensor) -> None:
        super().__init__()
        self.logits = nn.Parameter(logits.clone())
        self.values = nn.Parameter(values.clone())

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.logits[obs], self.values[obs]


def test_clipped_surrogate_value_and_gradients():
    """With known ratios the policy loss is mean(max(-A r, -A clip(r))) and clipped rows get no gradient."""
    ratios = torch.tensor([0.5, 0.9, 1.0, 1.1, 1.5, 0.5, 1.5])
    adv = torch.tensor([1.0, 1.0, -1.0, -1.0, 1.0, -1.0, -1.0])
    n = len(ratios)
    model = TablePolicy(torch.randn(n, 3, generator=torch.Generator().manual_seed(0)), torch.zeros(n))
    actions = torch.zeros(n, dtype=torch.int64)
    with torch.no_grad():
        cur_lp = F.log_softmax(model.logits, -1)[:, 0]
    batch = TrainBatch(torch.arange(n), actions, cur_lp - ratios.log(), torch.zeros(n), adv, torch.zeros(n))
    cfg = fixed(norm_adv=False, clip_coef=0.2, ent_coef=0.0, vf_coef=0.0)
    loss, stats = ppo_loss(model, batch, cfg)

    expected = torch.max(-adv * ratios, -adv * ratios.clamp(0.8, 1.2)).mean()
    assert stats["losses/policy_loss"].item() == pytest.approx(expected.item(), rel=1e-5)
    assert stats["losses/clipfrac"].item() == pytest.approx(4 / 7)
    assert stats["losses/ratio_mean"].item() == pytest.approx(ratios.mean().item(), rel=1e-5)

    loss.backward()
    row_grad = model.logits.grad.abs().sum(1)
    # clipping is active where it would pay to move further: A > 0 with r > 1.2, A < 0 with r < 0.8
    active = torch.tensor([False, False, False, False, True, True, False])
    assert torch.all(row_grad[active] == 0)
    assert torch.all(row_grad[~active] > 0)


def test_value_loss_clipping():
    """With clip_vloss the value loss is 0.5 * max(unclipped, clipped)² around the old values."""
    n = 4
    old_values = torch.zeros(n)
    new_values = torch.tensor([0.1, 0.5, -0.5, 1.0])
    returns = torch.tensor([1.0, 1.0, 1.0, 0.0])
    model = TablePolicy(torch.zeros(n, 2), new_values)
    actions = torch.zeros(n, dtype=torch.int64)
    batch = TrainBatch(torch.arange(n), actions, torch.full((n,), math.log(0.5)), old_values,
                       torch.zeros(n), returns)
    cfg = fixed(clip_coef=0.2, clip_vloss=True)
    _, stats = ppo_loss(model, batch, cfg)
    clipped = new_values.clamp(-0.2, 0.2)
    expected = 0.5 * torch.max((new_values - returns) ** 2, (clipped - returns) ** 2).mean()
    assert stats["losses/value_loss"].item() == pytest.approx(expected.item(), rel=1e-6)

    cfg.clip_vloss = False
    _, stats = ppo_loss(model, batch, cfg)
    unclipped = (0.5 * (new_values - returns) ** 2).mean()
    assert stats["losses/value_loss"].item() == pytest.approx(unclipped.item(), rel=1e-6)


def test_explained_variance():
    """1 for a perfect fit, 0 for predicting the mean, negative for a bad fit, NaN for constant returns."""
    g = torch.Generator().manual_seed(0)
    returns = torch.randn(200, generator=g)
    assert explained_variance(returns.clone(), returns) == pytest.approx(1.0)
    mean_prediction = torch.full_like(returns, returns.mean().item())
    assert explained_variance(mean_prediction, returns) == pytest.approx(0.0, abs=1e-6)
    assert explained_variance(-returns, returns) == pytest.approx(-3.0, rel=1e-5)
    noisy = returns + 0.5 * torch.randn(200, generator=g)
    assert 0.5 < explained_variance(noisy, returns) < 0.95
    assert math.isnan(explained_variance(torch.randn(5), torch.ones(5)))


def test_sample_actions_follows_the_probabilities():
    """Sampled frequencies match softmax(logits); the returned log-probs are those of the chosen actions."""
    probs = torch.tensor([0.1, 0.2, 0.3, 0.4])
    n = 40_000
    logits = probs.log().expand(n, -1) + 3.0  # a shift does not change the distribution
    uniforms = np.random.default_rng(0).random(n)
    actions, logprobs = sample_actions(logits, uniforms)
    assert actions.dtype == torch.int64 and actions.shape == (n,)
    freq = torch.bincount(actions, minlength=4).double() / n
    # standard error of each frequency is below 0.0025; allow about 4 of them
    torch.testing.assert_close(freq, probs.double(), atol=0.01, rtol=0)
    torch.testing.assert_close(logprobs, probs.log()[actions], atol=1e-5, rtol=0)


def test_sample_actions_inverse_cdf_boundaries():
    """Uniform u picks the first action whose cumulative probability reaches u, even for u just below 1."""
    probs = torch.tensor([0.1, 0.2, 0.3, 0.4])
    uniforms = np.array([0.0, 0.05, 0.15, 0.29, 0.31, 0.59, 0.61, 0.99, 1 - 1e-12])
    actions, logprobs = sample_actions(probs.log().expand(len(uniforms), -1), uniforms)
    assert actions.tolist() == [0, 0, 1, 1, 2, 2, 3, 3, 3]
    torch.testing.assert_close(logprobs, probs.log()[actions])


def test_sample_actions_never_picks_a_zero_probability_action():
    """Actions with probability 0 (logit -inf) are never drawn, also for u just above 0 and just below 1."""
    logits = torch.tensor([[-math.inf, 0.0, -math.inf, 0.0, -math.inf]]).expand(1000, -1)
    uniforms = np.concatenate([[1e-12, 1 - 1e-12], np.random.default_rng(1).random(998)])
    actions, logprobs = sample_actions(logits, uniforms)
    assert set(actions.tolist()) <= {1, 3}
    torch.testing.assert_close(logprobs, torch.full((1000,), math.log(0.5)))


def test_sample_actions_independent_of_batch_split():
    """The same uniforms give the same actions whether the rows are sampled together or in pieces."""
    g = torch.Generator().manual_seed(3)
    logits = torch.randn(12, 5, generator=g) * 2
    uniforms = np.random.default_rng(3).random(12)
    whole_actions, whole_lp = sample_actions(logits, uniforms)
    parts = [sample_actions(logits[a:b], uniforms[a:b]) for a, b in [(0, 1), (1, 5), (5, 12)]]
    assert torch.equal(torch.cat([p[0] for p in parts]), whole_actions)
    assert torch.equal(torch.cat([p[1] for p in parts]), whole_lp)
    # and a row's action depends only on its own logits and uniform
    shuffled = torch.randperm(12, generator=g)
    perm_actions, _ = sample_actions(logits[shuffled], uniforms[shuffled.numpy()])
    assert torch.equal(perm_actions, whole_actions[shuffled])


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_reference_init_starts_near_uniform_with_small_values(seed):
    """On Procgen-sized frames the reference init (CleanRL's) starts with a near-uniform policy and values near
    0; orthogonal gain √2 on every layer starts with values of 2 to 35 in magnitude (seeds 0-5), far from the
    first returns."""
    frames = torch.randint(0, 256, (32, 64, 64, 3), dtype=torch.uint8, generator=torch.Generator().manual_seed(seed))
    values = {}
    for init in ("reference", "orthogonal"):
        torch.manual_seed(seed)
        model = build_model((64, 64, 3), 15, ModelConfig(kind="impala", init=init))
        with torch.no_grad():
            logits, values[init] = model(frames)
        if init == "reference":
            assert logits.abs().max() < 0.05
    assert values["reference"].abs().max() < 0.5
    assert values["orthogonal"].abs().mean() > 1.0
