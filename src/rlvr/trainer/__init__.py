"""The GRPO and SFT loops (reading top to bottom) and what they are built from: loss and
advantages, log-probabilities, micro-batches, optimizer, cadence, checkpoints, metrics, memory."""
