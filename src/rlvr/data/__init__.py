"""Data the trainers read: SFT rows and the arithmetic task of `make demo`."""
