"""GRPO training for any verifiers environment against a running vf-vllm.

    accelerate launch --config-file configs/zero3.yaml scripts/train.py \
        --config configs/examples/deepscaler_zero3.yaml optim.lr=2e-5

Every option is a field of `rlvr.config.Config` (file + dotted overrides); see --help.
"""

import logging

from rlvr.config.cli import config_from_argv


def main() -> None:
    config = config_from_argv()  # fails fast on a bad option, before anything heavy loads
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per request otherwise

    from rlvr.trainer.grpo import Trainer

    Trainer(config).run()


if __name__ == "__main__":
    main()
