"""Worker processes that step envs into a shared rollout buffer, and the coordinator that drives them.

Nothing here runs PPO's update: workers run `collect.EnvRunner` with parameters read from shared memory. Of PPO
it knows one thing, `core.ppo.anchor_pass`, which tells whether an overlapped run's lagged steps are clipped around
the policy that took them (the note of `idle.LaggedSteps`).
"""
