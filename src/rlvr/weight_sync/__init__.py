"""How trained weights reach vf-vllm: choosing the way (connect), the merged-weight stream,
adapter pushes, the push probe, and the trainer-server rendezvous."""
