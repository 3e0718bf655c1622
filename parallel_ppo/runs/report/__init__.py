"""Timed runs side by side: `numbers` computes the comparison (table rows, reference points, warnings, figures
across seeds), `text` words it (text and markdown reports, JSON, console summary), `plots` draws its figures and
writes the output files, and `make` is the whole of compare_results.py below its flags; `formatting` holds the
number formats they share. Import each name from the module that defines it."""
