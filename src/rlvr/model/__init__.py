"""Loading models and tokenizers (hub id, local dir, embedded default), the policy with LoRA,
the chat template, publishing checkpoints, and the tiny test model."""
