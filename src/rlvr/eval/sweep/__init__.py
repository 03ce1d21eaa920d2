"""Sweeps of vf-eval runs over checkpoints and settings: inputs, the runs, the report."""
