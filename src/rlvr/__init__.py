"""RLVR toolkit: verifiers environments, vf-vllm with weight updates, and a GRPO trainer."""

__version__ = "0.1.0"
