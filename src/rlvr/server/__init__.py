"""vf-vllm: the launcher, and the CPU weight-transfer engine registered as a vLLM plugin."""
