"""Evaluation sweeps: models x environment settings x seeds, each cell one vf-eval run, then one
report with a table per metric and plots. Shared settings live in `OUT/sweep.json` (cells made
with others are refused); cells are renamed into place when finished, so a sweep resumes with
the missing ones. Design: docs/evaluation.md#evaluation-sweeps.
"""
