"""The benchmarks: the network's compute limit (`roofline`), learner settings by measurement, the speed check,
raw env throughput, scaling sweeps, layouts and autotune, the learning benchmark and the many-core study."""
