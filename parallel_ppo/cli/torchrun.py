"""torchrun for `make train-distributed`: torch's launcher, ending as the ranks end. A Ctrl-C (or SIGTERM), which the
ranks stop on cleanly and say so, exits 128 + the signal instead of torchrun's traceback; a rank that failed, whose
own lines are above, is one line naming it instead of torchrun's report."""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    """Run torchrun with `argv` (default: this command's arguments); returns its exit status."""
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import parse_args, run

    try:
        run(parse_args(argv))
    except SignalException as e:
        return 128 + int(e.sigval)
    except ChildFailedError as e:
        rank, failure = e.get_first_failure()
        how = (f"was killed by {failure.signal_name()}" if failure.exitcode < 0
               else f"exited with status {failure.exitcode} (its lines are above)")
        print(f"torchrun: rank {rank} {how}; the other ranks were stopped", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
