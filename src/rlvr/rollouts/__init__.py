"""Generation in the background: the rollout worker, the vf-vllm client, request arguments, and
rollouts turned into token samples with their loss mask."""
