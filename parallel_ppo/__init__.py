"""parallel_ppo: PPO on CPUs, sequential or across worker processes, with an honest benchmarking suite."""

__version__ = "0.1.0"
