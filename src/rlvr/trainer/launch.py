"""The `rlvr-train` and `rlvr-sft` commands (also `scripts/train.py`, `scripts/sft.py`).

Each parses the command line into a validated config first, so a bad option fails before
anything heavy loads (torch, the model, the environment), then runs the trainer. Usage:
docs/training.md#commands and docs/training.md#sft.
"""

from __future__ import annotations

import logging

from rlvr.config import SFTConfig
from rlvr.config.cli import config_from_argv

SFT_USAGE = """Supervised fine-tuning (loss on assistant tokens only), e.g. a warm-up before GRPO.

    accelerate launch --config-file configs/single.yaml scripts/sft.py \\
        --config configs/examples/sft_smollm2_cpu.yaml train.max_steps=20 optim.lr=2e-4
    python scripts/sft.py --config configs/examples/sft_smollm2_cpu.yaml   # CPU, one process

Every option is a field of `rlvr.config.SFTConfig` (file + dotted overrides): `data.*` (files,
format, columns, max_seq_len, truncation), `model.*`, `lora.*`, `optim.*`, `train.*` (epochs or
max_steps, batch sizes, eval cadence), `checkpoint.*`, `wandb.*`, `seed`, `output_dir`.
"""


def _log_to_stderr() -> None:
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )


def train_main() -> None:
    """GRPO training for any verifiers environment against a running vf-vllm (`rlvr-train`).
    Every option is a field of `rlvr.config.Config` (file + dotted overrides); see --help."""
    config = config_from_argv()  # fails fast on a bad option, before anything heavy loads
    _log_to_stderr()
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per request otherwise

    from rlvr.config import ConfigError
    from rlvr.trainer.grpo import Trainer

    try:
        Trainer(config).run()
    except ConfigError as e:  # a setting or a server the run cannot use: the reason is enough
        raise SystemExit(f"config error: {e}") from None


def sft_main() -> None:
    """Supervised fine-tuning (`rlvr-sft`); see SFT_USAGE or --help."""
    # fails fast on a bad option, before anything heavy loads
    config = config_from_argv(cls=SFTConfig, usage=SFT_USAGE)
    _log_to_stderr()

    from rlvr.data.sft_rows import DataError
    from rlvr.trainer.sft import SFTTrainer

    try:
        SFTTrainer(config).run()
    except DataError as e:
        raise SystemExit(f"data error: {e}") from None
