"""vf-vllm: the launcher, the CPU weight-transfer engine registered as a vLLM plugin, and
serving a model for evaluation."""
