"""Supervised fine-tuning (loss on assistant tokens only), e.g. a warm-up before GRPO.

    accelerate launch --config-file configs/single.yaml scripts/sft.py \
        --config configs/examples/sft_smollm2_cpu.yaml train.max_steps=20 optim.lr=2e-4
    python scripts/sft.py --config configs/examples/sft_smollm2_cpu.yaml   # CPU, one process

Thin wrapper: the command is `rlvr.trainer.launch.sft_main`, installed as `rlvr-sft`; its
--help lists the options (`rlvr.config.SFTConfig`).
"""

from rlvr.trainer.launch import sft_main

if __name__ == "__main__":
    sft_main()
