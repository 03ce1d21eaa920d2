"""Models and tokenizers: loading, the policy with LoRA, chat template, publishing, tiny model.

Models load from a hub id, a local dir or the embedded default."""
