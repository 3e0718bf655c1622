"""The run directory: its contract (`summary`), writing it while training (`training`, `metrics`), reading it
back (`reading`), every figure (`figures`), statistics across seeds, videos, and the comparison report."""
