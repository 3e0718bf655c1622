"""What a run measures about this machine before it trains, below both `launch` and `bench`: the network's compute
limit and FLOPs, the matmul peaks, and the learner settings chosen by measurement."""
