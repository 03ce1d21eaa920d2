"""Supervised fine-tuning (loss on assistant tokens only), e.g. a warm-up before GRPO.

    accelerate launch --config-file configs/single.yaml scripts/sft.py \
        --config configs/examples/sft_smollm2_cpu.yaml train.max_steps=20 optim.lr=2e-4
    python scripts/sft.py --config configs/examples/sft_smollm2_cpu.yaml   # CPU, one process

Every option is a field of `rlvr.config.SFTConfig` (file + dotted overrides): `data.*` (files,
format, columns, max_seq_len, truncation), `model.*`, `lora.*`, `optim.*`, `train.*` (epochs or
max_steps, batch sizes, eval cadence), `checkpoint.*`, `wandb.*`, `seed`, `output_dir`.
"""

import logging

from rlvr.config import SFTConfig
from rlvr.config.cli import config_from_argv


def main() -> None:
    # fails fast on a bad option, before anything heavy loads
    config = config_from_argv(cls=SFTConfig, usage=__doc__)
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )

    from rlvr.data.sft_rows import DataError
    from rlvr.trainer.sft import SFTTrainer

    try:
        SFTTrainer(config).run()
    except DataError as e:
        raise SystemExit(f"data error: {e}") from None


if __name__ == "__main__":
    main()
