"""Worker processes that step envs into a shared rollout buffer, and the coordinator that drives them.

Nothing here knows about PPO: workers run `collect.EnvRunner` with parameters read from shared memory.
"""
