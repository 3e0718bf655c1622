"""The PPO objective and update: pure functions of a model, an optimizer and tensors."""

from __future__ import annotations

import contextlib
import copy
import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import torch
from torch import nn

from parallel_ppo.core.buffer import RolloutBuffer, minibatch_indices
from parallel_ppo.core.config import Config, TrainingConfig
from parallel_ppo.core.distributions import kl_divergence, log_prob_entropy
from parallel_ppo.core.metrics import metric
from parallel_ppo.core.model import autocast, module_device, network, tf32_products
from parallel_ppo.envs.spaces import EnvSpaces


@dataclass
class TrainBatch:
    """Flattened rollout data, one row per env step."""

    obs: torch.Tensor
    actions: torch.Tensor
    logprobs: torch.Tensor
    values: torch.Tensor
    advantages: torch.Tensor
    returns: torch.Tensor
    shifted: torch.Tensor | None = None
    """The observations augmented, for a regularizer beside the loss (`training.augment_regularizer`); None
    where the loss reads augmented observations itself, or none."""
    proximal: torch.Tensor | None = None
    """The actions' log-probs under the policy the update started from, on the observations the loss reads, where
    its ratio is taken against them (`training.augment_anchor`, `parallel.decoupled_clip`); None: against
    `logprobs`, as collected."""

    def __getitem__(self, idx: torch.Tensor | slice) -> TrainBatch:
        return self._map(lambda v: v[idx])

    def __len__(self) -> int:
        return self.actions.shape[0]

    def to(self, device: torch.device) -> TrainBatch:
        """The batch on `device` (itself when it is there already)."""
        return self._map(lambda v: v.to(device))

    def _map(self, fn: Callable[[torch.Tensor], torch.Tensor]) -> TrainBatch:
        """`fn` of every field, None where a field is None (`shifted` unused)."""
        return TrainBatch(*(None if (v := getattr(self, f.name)) is None else fn(v) for f in dataclasses.fields(self)))


POLICY_LOSS = metric("losses/policy_loss", "clipped surrogate loss, mean over the update's minibatches",
                     summary=True)
VALUE_LOSS = metric("losses/value_loss", "value loss (clipped around the old values if clip_vloss), mean over "
                    "minibatches", summary=True)
ENTROPY = metric("losses/entropy", "mean entropy of the policy, mean over minibatches", summary=True)
APPROX_KL = metric("losses/approx_kl", "approximate KL of the new policy from the old, E[(r − 1) − log r], mean over "
                   "minibatches", summary=True)
CLIP_FRACTION = metric("losses/clipfrac", "fraction of samples whose ratio left the clip range", summary=True)
RATIO_MEAN = metric("losses/ratio_mean", "mean probability ratio new/old (1 at the first minibatch of an on-policy "
                    "update on unshifted frames; drifts as the epochs move the policy)", summary=True)
EXPLAINED_VARIANCE = metric("losses/explained_variance", "1 − Var(returns − values) / Var(returns) of the steps "
                            "learned from (the values GAE read: an overlapped learner's own on lagged steps, "
                            "parallel.fresh_values)", summary=True)
PRIVILEGED_PREDICTION = metric("losses/privileged_prediction", "mean squared error of the vector keys only the critic "
                               "reads (as it reads them) as the actor's features predict them "
                               "(training.predict_privileged; empty without)", summary=True)
AUGMENT_PENALTY = metric("losses/augment_penalty", "DrAC's penalty: KL of the policy on shifted frames from it on the "
                         "frames as collected, plus half the values' squared difference (training.augment_regularizer; "
                         "empty without)", summary=True)
UPDATE_METRICS = (POLICY_LOSS, VALUE_LOSS, ENTROPY, APPROX_KL, CLIP_FRACTION, RATIO_MEAN, EXPLAINED_VARIANCE,
                  PRIVILEGED_PREDICTION, AUGMENT_PENALTY)
"""The update's metrics (declared above, where it computes them), as the writers ask for them."""


class Reducer(Protocol):
    """Sums or averages a tensor in place over data-parallel learners (`distributed.Ranks`); None where one
    process learns alone. The update needs nothing else from the processes it runs in."""

    def sum_(self, tensor: torch.Tensor) -> torch.Tensor: ...

    def mean_(self, tensor: torch.Tensor) -> torch.Tensor: ...


class Augment(Protocol):
    """Augments a minibatch's observations by its samples' draws (`core.augment.RandomShift`)."""

    def __call__(self, obs: torch.Tensor, draws: torch.Tensor) -> torch.Tensor: ...


def build_learner(spaces: EnvSpaces, cfg: Config,
                  device: torch.device | None = None) -> tuple[nn.Module, torch.optim.Optimizer]:
    """The network (initialized on the CPU, so every device starts from the same weights) and its Adam optimizer
    (eps 1e-5, as in the reference PPOs), as every learner builds them. Adam is torch's fused kernel on the CPU and
    CUDA: one pass over the parameters instead of a dozen, 0.48 → 0.13 ms a step for CartPole's MLP."""
    model = network(cfg, spaces).to(device or "cpu")
    fused = next(model.parameters()).device.type in ("cpu", "cuda")
    return model, torch.optim.Adam(model.parameters(), lr=cfg.training.learning_rate, eps=1e-5, fused=fused)


def normalize_advantages(batch: TrainBatch, cfg: TrainingConfig,
                         moments: tuple[float, float] | None = None) -> TrainBatch:
    """The minibatch with its advantages scaled to mean 0 and std 1 (unbiased) when `cfg.norm_adv` is set: by
    their own mean and std, or by `moments` (mean, std) given for the whole minibatch of several learners."""
    adv = batch.advantages
    if not cfg.norm_adv:
        return batch
    if moments is None:
        if adv.numel() < 2:
            return batch
        mean, std = adv.mean(), adv.std()
    else:
        mean, std = moments
    return dataclasses.replace(batch, advantages=(adv - mean) / (std + 1e-8))


def advantage_moments(parts: list[torch.Tensor], reducer: Reducer) -> list[tuple[float, float] | None]:
    """Mean and unbiased std of each minibatch's advantages over every learner's share of it, for a whole epoch
    in one all-reduce (of count, sum and sum of squares per minibatch); None where fewer than 2 samples."""
    local = torch.stack([torch.stack([a.new_tensor(a.numel(), dtype=torch.float64), a.double().sum(),
                                      a.double().square().sum()]) for a in parts])
    out: list[tuple[float, float] | None] = []
    for n, total, squares in reducer.sum_(local).tolist():
        mean = total / n if n else 0.0
        out.append((mean, (max(squares - n * mean * mean, 0.0) / (n - 1)) ** 0.5) if n >= 2 else None)
    return out


def ppo_loss(model: nn.Module, batch: TrainBatch, cfg: TrainingConfig) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Clipped-surrogate PPO loss, averaged over `batch`; returns (loss, detached statistics).

    The advantages are used as given: normalize them over the whole minibatch first
    (`normalize_advantages`), so that a minibatch split into chunks has the loss of the whole. With
    `predict_privileged`, the actor's prediction of the critic's own keys adds its error, so weighted; with shifted
    frames given apart (`augment_regularizer`), DrAC's penalty adds in its weight. Each adds its statistic.
    """
    with autocast(cfg.precision, batch.obs.device.type):
        logits, new_values, predicted = (model.forward_privileged(batch.obs) if cfg.predict_privileged > 0
                                         else (*model(batch.obs), None))
    new_values = new_values.float()
    new_logprob, entropy = log_prob_entropy(logits, batch.actions)
    entropy = entropy.mean()

    log_ratio = new_logprob - (batch.logprobs if batch.proximal is None else batch.proximal)
    ratio = log_ratio.exp()
    adv = batch.advantages
    surrogate = torch.max(-adv * ratio, -adv * ratio.clamp(1 - cfg.clip_coef, 1 + cfg.clip_coef))
    if batch.proximal is not None:  # the decoupled objective's weight: proximal over behaviour probability
        surrogate = (batch.proximal - batch.logprobs).exp() * surrogate
    policy_loss = surrogate.mean()

    if cfg.clip_vloss:
        clipped = batch.values + (new_values - batch.values).clamp(-cfg.clip_coef, cfg.clip_coef)
        value_loss = 0.5 * torch.max((new_values - batch.returns) ** 2, (clipped - batch.returns) ** 2).mean()
    else:
        value_loss = 0.5 * ((new_values - batch.returns) ** 2).mean()

    loss = policy_loss - cfg.ent_coef * entropy + cfg.vf_coef * value_loss
    stats = {}
    if batch.shifted is not None:
        penalty = augment_penalty(model, batch.shifted, logits, new_values, batch.actions.is_floating_point(), cfg)
        loss = loss + cfg.augment_regularizer * penalty
        stats[AUGMENT_PENALTY] = penalty.detach()
    if predicted is not None:
        predicted = predicted.mean()
        loss = loss + cfg.predict_privileged * predicted
        stats[PRIVILEGED_PREDICTION] = predicted.detach()
    with torch.no_grad():
        stats |= {
            POLICY_LOSS: policy_loss.detach(),
            VALUE_LOSS: value_loss.detach(),
            ENTROPY: entropy.detach(),
            APPROX_KL: ((ratio - 1) - log_ratio).mean(),
            CLIP_FRACTION: ((ratio - 1).abs() > cfg.clip_coef).float().mean(),
            RATIO_MEAN: ratio.mean(),
        }
    return loss, stats


def anchored(model: nn.Module, batch: TrainBatch, cfg: TrainingConfig) -> TrainBatch:
    """`batch` anchored to `model` (`ppo_update`'s `decoupled`, `augment_anchor`): its actions' log-probs under
    `model` on its observations as `proximal`, and `model`'s values there as the values the value loss clips
    around; without gradient, in chunks of `cfg.microbatch_size` (else of a minibatch) as the loss runs."""
    chunk = cfg.microbatch_size or cfg.batch_size
    logprobs, values = [], []
    with torch.no_grad(), autocast(cfg.precision, batch.obs.device.type):
        for start in range(0, len(batch), chunk):
            logits, part_values = model(batch.obs[start:start + chunk])
            logprobs.append(log_prob_entropy(logits, batch.actions[start:start + chunk])[0])
            values.append(part_values.float())
    return dataclasses.replace(batch, proximal=torch.cat(logprobs), values=torch.cat(values))


def revalue_lagged(model: nn.Module, buf: RolloutBuffer, lagged: torch.Tensor, cfg: TrainingConfig) -> None:
    """Value again with `model` (the parameters the update starts from) the observations of the steps `lagged`
    ((T, N) bool), and the one after each env's last step where that step lagged, in place of the values stored with
    older parameters (`parallel.fresh_values`); without gradient, in chunks as the loss runs, each gathered on its
    own (no copy of the whole rollout). A time limit's bootstrap keeps its stored value: its observation is not kept."""
    last_lagged = lagged[buf.lengths - 1, torch.arange(buf.num_envs)]
    device, chunk = module_device(model), cfg.microbatch_size or cfg.batch_size
    with torch.no_grad(), autocast(cfg.precision, device.type):
        for obs, values, where in ((buf.obs.flatten(0, 1), buf.values.view(-1), lagged.flatten()),
                                   (buf.last_obs, buf.last_values, last_lagged)):
            rows = where.nonzero().squeeze(1)
            for start in range(0, len(rows), chunk):
                part = rows[start:start + chunk]
                values[part] = model(obs[part].to(device))[1].float().cpu()


def anchor_pass(cfg: TrainingConfig, shifted: bool, decoupled: bool) -> str:
    """Where the update runs the policy it starts from (`anchored`): "minibatch", on each minibatch, where the loss
    reads frames shifted (`shifted`, not for the regularizer) and `augment_anchor` or `decoupled` asks for it;
    "rollout", once on the rollout as collected, for `decoupled` alone; "" where it does not."""
    if shifted and not cfg.augment_regularizer and (cfg.augment_anchor or decoupled):
        return "minibatch"
    return "rollout" if decoupled else ""


def augment_penalty(model: nn.Module, shifted: torch.Tensor, logits: torch.Tensor, values: torch.Tensor,
                    continuous: bool, cfg: TrainingConfig) -> torch.Tensor:
    """DrAC's regularizer (Raileanu et al. 2021): how far augmenting the observations moves the policy and the value
    from what they are on the observations as collected (held fixed), KL(π(·|s) ‖ π(·|shift(s))) + ½(V(shift(s)) −
    V(s))², averaged over the batch (the ½ as in DrAC's code and this loss's value term)."""
    with autocast(cfg.precision, shifted.device.type):
        moved_logits, moved_values = model(shifted)
    kl = kl_divergence(logits.detach(), moved_logits, continuous)
    return (kl + 0.5 * (moved_values.float() - values.detach()) ** 2).mean()


def explained_variance(values: torch.Tensor, returns: torch.Tensor) -> float:
    """1 − Var(returns − values) / Var(returns); NaN when the returns do not vary."""
    var = returns.var()
    return float("nan") if var == 0 else float(1 - (returns - values).var() / var)


def minibatch_step(model: nn.Module, optimizer: torch.optim.Optimizer, batch: TrainBatch,
                   cfg: TrainingConfig, reducer: Reducer | None = None,
                   moments: tuple[float, float] | None = None) -> dict[str, float]:
    """One optimizer step on a minibatch; returns its loss statistics.

    Advantages are normalized over the whole minibatch (by `moments` when given), then the forward and backward
    passes run on chunks of `cfg.microbatch_size` samples whose gradients add up, each weighted by its share, to the
    gradient of the whole minibatch. Only one chunk's activations are alive at a time: at minibatch
    256 on 64×64 frames that saves about 300 MB, and a working set that fits the CPU caches makes the
    update faster, not slower. With a `reducer`, the gradients are then averaged over the learners in one flat
    all-reduce, so each takes the step one process would take on all their data. Then the global gradient norm
    is clipped and the optimizer steps.
    """
    batch = normalize_advantages(batch, cfg, moments)
    size = len(batch)
    if cfg.microbatch_size == "auto":
        raise ValueError("training.microbatch_size auto must be resolved first (learner_settings)")
    chunk = cfg.microbatch_size or size
    optimizer.zero_grad(set_to_none=True)
    totals: dict[str, float] = {}
    with tf32_products(batch.obs.device.type) if cfg.precision == "tf32" else contextlib.nullcontext():
        for start in range(0, size, chunk):  # TF32 in the backward pass's products too
            part = batch[start:start + chunk]
            weight = len(part) / size
            loss, stats = ppo_loss(model, part, cfg)
            (loss * weight).backward()
            for key, value in stats.items():
                totals[key] = totals.get(key, 0.0) + weight * float(value)
    if reducer is None:
        nn.utils.clip_grad_norm_(model.parameters(), cfg.max_grad_norm)
    else:
        average_gradients(model, reducer, cfg.max_grad_norm)
    optimizer.step()
    return totals


def average_gradients(model: nn.Module, reducer: Reducer, max_norm: float) -> None:
    """Replace every gradient by its mean over the learners (one flat buffer, one all-reduce), clipped to a global
    norm of `max_norm` as `clip_grad_norm_` does. The norm is summed in float64, so that learners with other
    thread counts or CPUs (other summation orders) take the same clip factor and keep identical parameters."""
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    flat = reducer.mean_(torch.cat([g.reshape(-1) for g in grads]))
    norm = float(torch.linalg.vector_norm(flat.double()))
    flat.mul_(min(1.0, max_norm / (norm + 1e-6)))
    offset = 0
    for g in grads:
        g.copy_(flat[offset:offset + g.numel()].view_as(g))
        offset += g.numel()


def minibatch(data: TrainBatch, idx: torch.Tensor, cfg: TrainingConfig, augment: Augment | None,
              draws: torch.Tensor | None, anchor: nn.Module | None) -> TrainBatch:
    """The rows `idx` of `data` as the loss reads them: their observations shifted by `draws` (`augment`; for a
    regularizer beside the loss with `augment_regularizer`), anchored to `anchor` on those (`anchored`)."""
    batch = data[idx]
    if augment is not None:
        shifted = augment(batch.obs, draws)
        batch = dataclasses.replace(batch, **{"shifted" if cfg.augment_regularizer else "obs": shifted})
    return batch if anchor is None else anchored(anchor, batch, cfg)


def ppo_update(model: nn.Module, optimizer: torch.optim.Optimizer, data: TrainBatch, cfg: TrainingConfig,
               generator: torch.Generator, reducer: Reducer | None = None, augment: Augment | None = None,
               draws: torch.Tensor | None = None, rows: torch.Tensor | None = None,
               decoupled: bool = False, before_step: Callable[[], None] | None = None) -> dict[str, float]:
    """`n_epochs` passes of minibatch SGD over `data`; returns the statistics averaged over minibatches, calling
    `before_step` (if given) before each step (an overlapped learner takes its idle workers' cores there). With
    `augment` (`core.augment`), each minibatch's observations are augmented first, in epoch e by their samples'
    `draws[:, e]` (a row per sample of `data`). With `rows`, only those samples of `data` are learned from (a cut
    rollout's steps taken: `RolloutBuffer.taken`), in as many minibatches as all of `data` makes, each smaller.
    `decoupled` (or `augment_anchor` with `augment`): the ratio is taken against the policy as the update starts,
    on the observations the loss reads (`anchored`): once for the rollout where they are those collected, on each
    minibatch (by a copy of that policy) where the loss reads shifted frames.

    With a `reducer` (data-parallel learners, each with its share of every minibatch): gradients are averaged
    before each step, the KL that may stop an epoch early is every learner's mean, and so are the statistics."""
    totals: dict[str, float] = {}
    count, rows = 0, torch.arange(len(data)) if rows is None else rows
    explained = explained_variance(data.values[rows], data.returns[rows])  # of the values GAE read
    where = anchor_pass(cfg, augment is not None, decoupled)
    anchor = copy.deepcopy(model) if where == "minibatch" else None  # other frames each epoch
    data = anchored(model, data, cfg) if where == "rollout" else data  # the frames as collected: once is enough
    for epoch in range(cfg.n_epochs):
        kl_sum, kl_count = 0.0, 0
        minibatches = list(minibatch_indices(rows, min(len(data) // cfg.batch_size, len(rows)), generator))
        moments: list[tuple[float, float] | None] = [None] * len(minibatches)
        if reducer is not None and cfg.norm_adv:
            moments = advantage_moments([data.advantages[idx] for idx in minibatches], reducer)
        for idx, minibatch_moments in zip(minibatches, moments, strict=True):
            batch = minibatch(data, idx, cfg, augment, None if augment is None else draws[idx, epoch], anchor)
            if before_step is not None:
                before_step()
            stats = minibatch_step(model, optimizer, batch, cfg, reducer, minibatch_moments)
            for key, value in stats.items():
                totals[key] = totals.get(key, 0.0) + value
            count += 1
            kl_sum, kl_count = kl_sum + stats[APPROX_KL], kl_count + 1
        kl = kl_sum / kl_count
        if cfg.target_kl and reducer is not None:
            kl = reducer.mean_(torch.tensor([kl], dtype=torch.float64)).item()
        if cfg.target_kl and kl > cfg.target_kl:
            break
    result = {key: value / count for key, value in totals.items()}
    if reducer is not None:
        keys = sorted(result)
        means = reducer.mean_(torch.tensor([result[k] for k in keys], dtype=torch.float64)).tolist()
        result = dict(zip(keys, means, strict=True))
    result[EXPLAINED_VARIANCE] = explained
    return result
