"""Data files: SFT rows, exports of rollouts as chat JSONL, the JSONL reader."""
