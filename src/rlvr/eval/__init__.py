"""Evaluation: vf-eval runs, reports and statistics, plots, sweeps, predictions, publishing."""
