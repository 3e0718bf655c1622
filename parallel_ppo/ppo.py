"""The PPO objective and update: pure functions of a model, an optimizer and tensors."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from parallel_ppo.buffer import minibatch_indices
from parallel_ppo.config import TrainingConfig


@dataclass
class TrainBatch:
    """Flattened rollout data, one row per env step."""

    obs: torch.Tensor
    actions: torch.Tensor
    logprobs: torch.Tensor
    values: torch.Tensor
    advantages: torch.Tensor
    returns: torch.Tensor

    def __getitem__(self, idx: torch.Tensor) -> TrainBatch:
        return TrainBatch(self.obs[idx], self.actions[idx], self.logprobs[idx], self.values[idx],
                          self.advantages[idx], self.returns[idx])

    def __len__(self) -> int:
        return self.actions.shape[0]


def autocast(precision: str) -> contextlib.AbstractContextManager:
    """bf16 autocast on the CPU for `precision == "bf16"`, otherwise nothing."""
    if precision == "bf16":
        return torch.autocast("cpu", dtype=torch.bfloat16)
    return contextlib.nullcontext()


def ppo_loss(model: nn.Module, batch: TrainBatch, cfg: TrainingConfig) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Clipped-surrogate PPO loss on one minibatch; returns (loss, detached statistics)."""
    with autocast(cfg.precision):
        logits, new_values = model(batch.obs)
    logits, new_values = logits.float(), new_values.float()
    log_probs = F.log_softmax(logits, dim=-1)
    new_logprob = log_probs.gather(1, batch.actions.unsqueeze(1)).squeeze(1)
    entropy = -(log_probs.exp() * log_probs).sum(-1).mean()

    log_ratio = new_logprob - batch.logprobs
    ratio = log_ratio.exp()
    adv = batch.advantages
    if cfg.norm_adv and adv.numel() > 1:
        adv = (adv - adv.mean()) / (adv.std() + 1e-8)
    policy_loss = torch.max(-adv * ratio, -adv * ratio.clamp(1 - cfg.clip_coef, 1 + cfg.clip_coef)).mean()

    if cfg.clip_vloss:
        clipped = batch.values + (new_values - batch.values).clamp(-cfg.clip_coef, cfg.clip_coef)
        value_loss = 0.5 * torch.max((new_values - batch.returns) ** 2, (clipped - batch.returns) ** 2).mean()
    else:
        value_loss = 0.5 * ((new_values - batch.returns) ** 2).mean()

    loss = policy_loss - cfg.ent_coef * entropy + cfg.vf_coef * value_loss
    with torch.no_grad():
        stats = {
            "policy_loss": policy_loss.detach(),
            "value_loss": value_loss.detach(),
            "entropy": entropy.detach(),
            "approx_kl": ((ratio - 1) - log_ratio).mean(),
            "clipfrac": ((ratio - 1).abs() > cfg.clip_coef).float().mean(),
            "ratio_mean": ratio.mean(),
        }
    return loss, stats


def explained_variance(values: torch.Tensor, returns: torch.Tensor) -> float:
    """1 − Var(returns − values) / Var(returns); NaN when the returns do not vary."""
    var = returns.var()
    return float("nan") if var == 0 else float(1 - (returns - values).var() / var)


def ppo_update(model: nn.Module, optimizer: torch.optim.Optimizer, data: TrainBatch, cfg: TrainingConfig,
               generator: torch.Generator) -> dict[str, float]:
    """`n_epochs` passes of minibatch SGD over `data`; returns the statistics averaged over minibatches."""
    totals: dict[str, float] = {}
    count = 0
    for _ in range(cfg.n_epochs):
        kl_sum, kl_count = 0.0, 0
        for idx in minibatch_indices(len(data), cfg.batch_size, generator):
            loss, stats = ppo_loss(model, data[idx], cfg)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            nn.utils.clip_grad_norm_(model.parameters(), cfg.max_grad_norm)
            optimizer.step()
            for key, value in stats.items():
                totals[key] = totals.get(key, 0.0) + float(value)
            count += 1
            kl_sum, kl_count = kl_sum + float(stats["approx_kl"]), kl_count + 1
        if cfg.target_kl and kl_sum / kl_count > cfg.target_kl:
            break
    result = {key: value / count for key, value in totals.items()}
    result["explained_variance"] = explained_variance(data.values, data.returns)
    return result
