"""How trained weights reach vf-vllm: one push interface (base.WeightPush) with its two ways,
merged weights (merged, streamed by merged_stream) and LoRA adapters (adapter); choosing the way
(connect), the server's HTTP client (control), the exact check and the model probe, and the
trainer-server rendezvous."""
