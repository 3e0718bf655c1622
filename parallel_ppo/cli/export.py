"""`python -m parallel_ppo export`: a trained policy as one ONNX or TorchScript file (`runs.export`)."""

from __future__ import annotations

from parallel_ppo.cli.common import OneLineParser, fail, interrupted, some_path
from parallel_ppo.errors import ExportMismatch, ParallelPPOError, WriteFailed


def export_parser(prog: str) -> OneLineParser:
    p = OneLineParser(prog=prog, description="Write a run's policy as one file for inference without parallel_ppo: "
                      "observations in (a batch, as the env gives them, normalized inside when the run normalized "
                      "them); the action, the distribution's parameters and the value out "
                      "(docs/evaluation.md, \"Export\").")
    p.add_argument("run_dir", type=some_path, metavar="RUN_DIR",
                   help="a run directory (its checkpoint.pt) or a checkpoint file")
    p.add_argument("--format", choices=("onnx", "torchscript"), default="onnx",
                   help="onnx (needs the onnx and onnxruntime packages) or torchscript (torch.jit.load); default "
                        "onnx")
    p.add_argument("--output", type=some_path, metavar="PATH", help="default RUN_DIR/policy.onnx or RUN_DIR/policy.pt")
    return p


def export_main(argv: list[str] | None = None, prog: str = "python -m parallel_ppo export") -> int:
    args = export_parser(prog).parse_args(argv)
    try:
        from parallel_ppo.runs.export import export_policy  # torch: a Ctrl-C while it loads is one line too

        done = export_policy(args.run_dir, args.format, args.output)
    except ParallelPPOError as e:
        return fail(prog, e, 2)
    except (ExportMismatch, WriteFailed) as e:  # a file that would not be the policy's, a full disk
        return fail(prog, e, 1)
    except KeyboardInterrupt:  # the file is written whole or not at all (atomic_write)
        return interrupted(prog, "nothing was written")
    info = done.metadata
    inputs = ", ".join(f"{spec['name']} ({', '.join(['batch', *map(str, spec['shape'])])}) {spec['dtype']}"
                       for spec in info["inputs"])
    print(f"wrote {done.path} ({done.bytes / 1024:.0f} KiB, {done.seconds:.1f} s): {info['env_id']} policy at "
          f"{info['checkpoint_env_steps']:,} env steps; input {inputs}"
          f"{', normalized inside' if info['normalize_obs'] else ''}; outputs {', '.join(info['outputs'])}; "
          f"reproduces the policy to {done.max_difference:.1g}")
    return 0
