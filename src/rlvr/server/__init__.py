"""vf-vllm, the inference server: launcher, CPU weight-transfer engine, plugin, serving a model.

The CPU engine is registered as a vLLM plugin; `serve_model` serves a model for evaluation."""
