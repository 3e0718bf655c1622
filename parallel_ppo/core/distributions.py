"""The policy's action distributions, read from the network's output: a categorical over logits for discrete
actions, a diagonal Gaussian (the output's first half the mean, its second half a state-independent log-std)
for continuous ones. Sampling takes noise drawn outside (per env), so a split of the envs samples the same."""

from __future__ import annotations

import math

import numpy as np
import torch

from parallel_ppo.envs.spaces import ActionSpace

HALF_LOG_2PI = 0.5 * math.log(2 * math.pi)


def sample_actions(logits: torch.Tensor, uniforms: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
    """Inverse-CDF sampling from categorical logits with one uniform number per row; returns (actions, log-probs)."""
    log_probs = torch.log_softmax(logits.float(), dim=-1)
    cdf = log_probs.exp().cumsum(-1)
    u = torch.from_numpy(uniforms).to(cdf.dtype).unsqueeze(1)
    actions = (cdf < u).sum(-1).clamp_(max=logits.shape[-1] - 1)
    return actions, log_probs.gather(1, actions.unsqueeze(1)).squeeze(1)


def gaussian_log_prob(params: torch.Tensor, actions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-density of `actions` (B, n) under the diagonal Gaussian in `params` (B, 2n), summed over dimensions,
    and the distribution's entropy per row."""
    mean, log_std = params.float().chunk(2, dim=-1)
    z = (actions - mean) * torch.exp(-log_std)
    log_prob = (-0.5 * z.square() - log_std - HALF_LOG_2PI).sum(-1)
    entropy = (0.5 + HALF_LOG_2PI + log_std).sum(-1)
    return log_prob, entropy


def sample(space: ActionSpace, params: torch.Tensor, noise: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
    """Actions and their log-probs from the network's output and per-row noise (`ActionSpace.noise`). Continuous
    actions are the unclipped samples: the env clips them to its bounds, PPO learns from these."""
    if not space.continuous:
        return sample_actions(params, noise)
    mean, log_std = params.float().chunk(2, dim=-1)
    actions = mean + torch.exp(log_std) * torch.from_numpy(noise)
    return actions, gaussian_log_prob(params, actions)[0]


def log_prob_entropy(params: torch.Tensor, actions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per row: the log-prob of the taken action and the entropy; the action's dtype tells the distribution
    (int64 indices: categorical; floats: Gaussian)."""
    if actions.is_floating_point():
        return gaussian_log_prob(params, actions)
    log_probs = torch.log_softmax(params.float(), dim=-1)
    return log_probs.gather(1, actions.unsqueeze(1)).squeeze(1), -(log_probs.exp() * log_probs).sum(-1)


def kl_divergence(p: torch.Tensor, q: torch.Tensor, continuous: bool) -> torch.Tensor:
    """KL(P ‖ Q) per row between two of the network's outputs: diagonal Gaussians (`continuous`) or categoricals."""
    if continuous:
        p_mean, p_log_std = p.float().chunk(2, dim=-1)
        q_mean, q_log_std = q.float().chunk(2, dim=-1)
        ratio = torch.exp(2 * (p_log_std - q_log_std))
        return (q_log_std - p_log_std + 0.5 * (ratio + (p_mean - q_mean).square() * torch.exp(-2 * q_log_std))
                - 0.5).sum(-1)
    log_p, log_q = torch.log_softmax(p.float(), dim=-1), torch.log_softmax(q.float(), dim=-1)
    return (log_p.exp() * (log_p - log_q)).sum(-1)


def most_likely(space: ActionSpace, params: torch.Tensor) -> torch.Tensor:
    """The distribution's mode: the arg-max logit, or the Gaussian's mean."""
    params = params.float()
    return params.chunk(2, dim=-1)[0] if space.continuous else params.argmax(-1)
