"""GRPO training for any verifiers environment against a running vf-vllm.

    accelerate launch --config-file configs/zero3.yaml scripts/train.py \
        --config configs/examples/deepscaler_zero3.yaml optim.lr=2e-5

Every option is a field of `rlvr.config.Config` (file + dotted overrides); see --help.
Thin wrapper: the command is `rlvr.trainer.launch.train_main`, installed as `rlvr-train`.
"""

from rlvr.trainer.launch import train_main

if __name__ == "__main__":
    train_main()
