"""The training core, over the envs (`parallel_ppo.envs`): config schema and validation, networks, rollout buffer
and GAE, the PPO update, collection, the group protocol, the one training loop, a loaded policy and evaluation. No
worker processes, run directories, reports, benchmarks or flags: the layers above bring those."""
