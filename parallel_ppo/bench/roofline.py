"""The roofline report of `parallel_ppo bench roofline`: a compute-limit measurement (`tuning.compute_limit`) as an
aligned table, and a finished run's achieved FLOP/s against its matmul peak."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from parallel_ppo.errors import RunDataError
from parallel_ppo.runs.report.formatting import fmt_flop
from parallel_ppo.tuning.compute_limit import PEAK_SIZE, Candidate
from parallel_ppo.tuning.other_load import BUSY_CORES


def format_table(result: dict[str, Any]) -> str:
    """A small aligned table of a `measure_compute_limit` result."""
    rows = [
        ("network", f"{result['model']} ({result['parameters']:,} parameters), "
                    f"obs {tuple(result['obs_shape'])}"),
        ("precision / threads", f"{result['precision']} / {result['threads']}"),
        ("forward rate", f"{result['forward_rate']:,.0f} samples/s at batch {result['rollout_batch']} "
                         f"({result['forward_iters']} iters in {result['forward_seconds']:.1f} s, "
                         f"median {result['forward_ms_median']:.1f} ms)"),
        ("train rate", f"{result['train_rate']:,.0f} samples/s at minibatch {result['minibatch']} "
                       f"({result['train_iters']} iters in {result['train_seconds']:.1f} s, "
                       f"median {result['train_ms_median']:.1f} ms)"),
        ("compute limit", f"{result['limit_sps']:,.0f} env steps/s with {result['n_epochs']} epochs "
                          "= 1 / (1/forward + epochs/train)"),
    ]
    if len(result.get("candidates", {})) > 1:
        ranked = sorted(result["candidates"].items(), key=lambda kv: -kv[1]["limit_sps"])
        rows.append(("candidates", ", ".join(f"{label} {r['limit_sps']:,.0f}" for label, r in ranked)
                     + f" SPS → {Candidate(result['precision'], result['microbatch_size']).label} "
                       "(precision/microbatch: the defaults stay unless clearly beaten, or the network is too small)"))
    if "flops_per_env_step" in result:
        peak = result["peak_gflops"][result["precision"]]
        limit_gflops = result["limit_sps"] * result["flops_per_env_step"] / 1e9
        rows += [
            ("network FLOPs", f"{result['forward_flops'] / 1e6:,.1f} M per forward, "
                              f"{result['train_flops'] / 1e6:,.1f} M per training sample → "
                              f"{fmt_flop(result['flops_per_env_step'])} per env step"),
            ("matmul peak", ", ".join(f"{p} {g:,.0f}" for p, g in result["peak_gflops"].items())
                            + f" GFLOP/s (products up to {PEAK_SIZE}², {result['threads']} threads)"),
            ("limit vs peak", f"the compute limit is {limit_gflops:,.0f} GFLOP/s, {limit_gflops / peak:.0%} of the "
                              f"{result['precision']} peak"),
        ]
    if result["other_load_cores"] > BUSY_CORES:
        rows.append(("WARNING", f"other processes kept {result['other_load_cores']:.2f} cores busy; "
                                "these rates understate a quiet machine"))
    width = max(len(name) for name, _ in rows)
    return "\n".join(f"{name:<{width}}  {value}" for name, value in rows)


def run_roofline_line(run_dir: str) -> str:
    """A finished run's achieved FLOP/s against its peak, as one line (RunDataError for a directory without one)."""
    from parallel_ppo.runs.summary import RunSummary

    path = Path(run_dir) / "summary.json"
    if not path.is_file():
        raise RunDataError(f"--run {run_dir}: no summary.json there (not a finished run)")
    s = RunSummary.read(path)
    if None in (s.achieved_gflops, s.peak_gflops, s.sps, s.flops_per_env_step, s.peak_fraction):
        raise RunDataError(f"--run {run_dir}: its summary has no SPS or FLOP figures (run.limit_seconds was 0, "
                          "no update after the first, or an older run)")
    return (f"run {run_dir}: {s.sps:,.0f} SPS × {fmt_flop(s.flops_per_env_step)} = "
            f"{fmt_flop(s.achieved_gflops * 1e9, '/s')}, {s.peak_fraction:.0%} of its {s.precision} matmul peak "
            f"({s.peak_gflops:,.0f} GFLOP/s)")
