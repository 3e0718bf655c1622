"""compute_gae against a plain scalar reference, with episode ends inside the rollout."""

from __future__ import annotations

import pytest
import torch

from parallel_ppo.core.buffer import compute_gae


def reference_gae(rewards, values, dones, last_values, gamma, lam):
    """A_t = sum_k (gamma*lam)^k delta_{t+k}, summed explicitly until the episode or the rollout ends.

    delta_t = r_t + gamma * V(next) - V_t, where V(next) is 0 after a done, `last_values` after the
    last step, and values[t + 1] otherwise. Plain Python floats, one env at a time.
    """
    n_steps, n_envs = len(rewards), len(rewards[0])

    def delta(t, n):
        if dones[t][n]:
            next_value = 0.0
        elif t == n_steps - 1:
            next_value = last_values[n]
        else:
            next_value = values[t + 1][n]
        return rewards[t][n] + gamma * next_value - values[t][n]

    adv = [[0.0] * n_envs for _ in range(n_steps)]
    for n in range(n_envs):
        for t in range(n_steps):
            total, k = 0.0, 0
            while t + k < n_steps:
                total += (gamma * lam) ** k * delta(t + k, n)
                if dones[t + k][n]:
                    break
                k += 1
            adv[t][n] = total
    ret = [[adv[t][n] + values[t][n] for n in range(n_envs)] for t in range(n_steps)]
    return adv, ret


def as_tensors(rewards, values, dones, last_values):
    f64 = torch.float64
    return (torch.tensor(rewards, dtype=f64), torch.tensor(values, dtype=f64),
            torch.tensor(dones, dtype=f64), torch.tensor(last_values, dtype=f64))


def random_rollout(seed: int, n_steps: int = 9, n_envs: int = 4, p_done: float = 0.25):
    """Random float64 (T, N) rewards, values and dones, and (N,) last values."""
    g = torch.Generator().manual_seed(seed)
    rewards = torch.randn(n_steps, n_envs, generator=g, dtype=torch.float64)
    values = torch.randn(n_steps, n_envs, generator=g, dtype=torch.float64)
    dones = (torch.rand(n_steps, n_envs, generator=g, dtype=torch.float64) < p_done).double()
    last_values = torch.randn(n_envs, generator=g, dtype=torch.float64)
    return rewards, values, dones, last_values


@pytest.mark.parametrize("gamma,lam", [(0.99, 0.95), (0.9, 0.5), (1.0, 1.0), (0.5, 0.0), (0.0, 0.7)])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_matches_scalar_reference(seed, gamma, lam):
    """Advantages and returns equal the explicit-sum reference for random rollouts with mid-rollout dones."""
    rewards, values, dones, last_values = random_rollout(seed)
    dones[3, 0] = 1.0  # an episode end in the middle
    dones[-1, 1] = 1.0  # one on the last step
    dones[:, 2] = 0.0  # an env with no episode end at all
    dones[2:4, 3] = 1.0  # and two ends in a row (a one-step episode)
    adv, ret = compute_gae(rewards, values, dones, last_values, gamma, lam)
    ref_adv, ref_ret = reference_gae(rewards.tolist(), values.tolist(), dones.tolist(), last_values.tolist(),
                                     gamma, lam)
    torch.testing.assert_close(adv, torch.tensor(ref_adv, dtype=torch.float64))
    torch.testing.assert_close(ret, torch.tensor(ref_ret, dtype=torch.float64))


def test_hand_computed_numbers():
    """A 4-step, 1-env rollout with a done at step 1, checked against numbers worked out by hand."""
    gamma, lam = 0.5, 0.5
    rewards = [[1.0], [2.0], [3.0], [4.0]]
    values = [[0.5], [1.0], [2.0], [1.0]]
    dones = [[0.0], [1.0], [0.0], [0.0]]
    last_values = [2.0]
    # deltas: t3 = 4 + 0.5*2 - 1 = 4;  t2 = 3 + 0.5*1 - 2 = 1.5;  t1 = 2 - 1 = 1 (done);
    #         t0 = 1 + 0.5*1 - 0.5 = 1
    # advantages: A3 = 4;  A2 = 1.5 + 0.25*4 = 2.5;  A1 = 1 (nothing from after the done);
    #             A0 = 1 + 0.25*1 = 1.25
    adv, ret = compute_gae(*as_tensors(rewards, values, dones, last_values), gamma, lam)
    assert adv[:, 0].tolist() == pytest.approx([1.25, 1.0, 2.5, 4.0])
    assert ret[:, 0].tolist() == pytest.approx([1.75, 2.0, 4.5, 5.0])


def test_nothing_bootstraps_across_a_done():
    """A huge value or reward right after an episode end leaves every advantage before it untouched."""
    rewards, values, dones, last_values = random_rollout(3, n_steps=8, n_envs=2, p_done=0.0)
    dones[4] = 1.0  # both episodes end at step 4
    base_adv, _ = compute_gae(rewards, values, dones, last_values, 0.99, 0.95)

    values[5] = 1e9
    rewards[5:] = -1e9
    last_values[:] = 1e9
    adv, _ = compute_gae(rewards, values, dones, last_values, 0.99, 0.95)
    torch.testing.assert_close(adv[:5], base_adv[:5])
    assert adv[:5].abs().max() < 100
    # the step that ended the episode is a one-step return without bootstrap
    torch.testing.assert_close(adv[4], rewards[4] - values[4])


def test_lambda_zero_is_one_step_td():
    """With lambda = 0 every advantage is the one-step TD error r + gamma * V(next) * (1 - done) - V."""
    gamma = 0.9
    rewards, values, dones, last_values = random_rollout(4)
    adv, _ = compute_gae(rewards, values, dones, last_values, gamma, 0.0)
    next_values = torch.cat([values[1:], last_values.unsqueeze(0)])
    expected = rewards + gamma * next_values * (1 - dones) - values
    torch.testing.assert_close(adv, expected)


def test_lambda_one_gamma_one_is_monte_carlo_return_minus_value():
    """gamma = lambda = 1 with no done: advantage = sum of remaining rewards + last value - value."""
    rewards, values, _, last_values = random_rollout(5)
    dones = torch.zeros_like(rewards)
    adv, ret = compute_gae(rewards, values, dones, last_values, 1.0, 1.0)
    reward_to_go = rewards.flip(0).cumsum(0).flip(0)
    torch.testing.assert_close(ret, reward_to_go + last_values)
    torch.testing.assert_close(adv, reward_to_go + last_values - values)


def test_lambda_one_with_episode_end_on_last_step_is_pure_monte_carlo():
    """When every episode ends on the last step, the returns are the plain reward-to-go (no last value)."""
    rewards, values, _, last_values = random_rollout(6)
    dones = torch.zeros_like(rewards)
    dones[-1] = 1.0
    _, ret = compute_gae(rewards, values, dones, last_values * 1e6, 1.0, 1.0)
    torch.testing.assert_close(ret, rewards.flip(0).cumsum(0).flip(0))


def test_last_values_used_only_when_last_step_not_done():
    """Changing last_values moves the advantages of an env only if its last step did not end an episode."""
    gamma, lam = 0.9, 0.8
    rewards, values, dones, last_values = random_rollout(7, n_steps=6, n_envs=2, p_done=0.0)
    dones[-1, 0] = 1.0  # env 0 ends on the last step, env 1 does not
    adv0, _ = compute_gae(rewards, values, dones, last_values, gamma, lam)
    shift = 10.0
    adv1, _ = compute_gae(rewards, values, dones, last_values + shift, gamma, lam)
    torch.testing.assert_close(adv1[:, 0], adv0[:, 0])
    # env 1: step t gains gamma * shift discounted by (gamma * lam) per step from the end
    t = torch.arange(6, dtype=torch.float64)
    expected_gain = gamma * shift * (gamma * lam) ** (5 - t)
    torch.testing.assert_close(adv1[:, 1] - adv0[:, 1], expected_gain)


def test_float32_inputs_keep_dtype_and_shape():
    """The trainer's float32 (T, N) tensors give float32 (T, N) advantages and returns."""
    rewards, values, dones, last_values = (x.float() for x in random_rollout(8))
    adv, ret = compute_gae(rewards, values, dones, last_values, 0.99, 0.95)
    assert adv.dtype == ret.dtype == torch.float32
    assert adv.shape == ret.shape == rewards.shape
    ref_adv, _ = reference_gae(rewards.tolist(), values.tolist(), dones.tolist(), last_values.tolist(),
                               0.99, 0.95)
    torch.testing.assert_close(adv, torch.tensor(ref_adv, dtype=torch.float32), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_ragged_rollout_matches_scalar_reference_of_each_envs_own_steps(seed):
    """A rollout cut short for some envs (`parallel.sync_fraction`): each env's advantages are the reference's over
    its own steps, bootstrapped from its last value where it stopped; the steps it did not take are 0, whatever the
    stale data there."""
    gamma, lam = 0.99, 0.9
    rewards, values, dones, last_values = random_rollout(seed, n_steps=10, n_envs=4)
    lengths = torch.tensor([10, 3, 7, 5])
    dones[2, 1] = 1.0  # an episode end one step before a cut
    dones[4, 3] = 1.0  # one on the step a cut came after
    dones[8, 2] = 1.0  # and one among the steps not taken
    taken = torch.arange(10)[:, None] < lengths
    adv, ret = compute_gae(rewards, values, dones, last_values, gamma, lam, taken)
    for n, length in enumerate(lengths.tolist()):
        ref_adv, ref_ret = reference_gae(rewards[:length, n:n + 1].tolist(), values[:length, n:n + 1].tolist(),
                                         dones[:length, n:n + 1].tolist(), last_values[n:n + 1].tolist(), gamma, lam)
        torch.testing.assert_close(adv[:length, n], torch.tensor(ref_adv, dtype=torch.float64)[:, 0])
        torch.testing.assert_close(ret[:length, n], torch.tensor(ref_ret, dtype=torch.float64)[:, 0])
        assert (adv[length:, n] == 0).all()
    full, _ = compute_gae(rewards, values, dones, last_values, gamma, lam)
    torch.testing.assert_close(adv[:, 0], full[:, 0])  # the env that took every step: as without a cut
