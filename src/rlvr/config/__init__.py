"""Run configuration: `checks` (ConfigError, require), `loader` (YAML + dotted overrides,
type-checked), `sections` (shared by both trainers), `grpo` (`Config`), `sampling`, `server` and
`distill` (GRPO sections with rules of their own), `sft` (`SFTConfig`), `cli` (the scripts' command
lines). Every section checks its own values in `validate()`; the public names are re-exported
here. Design: docs/training.md#configuration.
"""

from rlvr.config.checks import ConfigError
from rlvr.config.distill import DistillConfig
from rlvr.config.grpo import (
    BatchConfig,
    Config,
    CurriculumConfig,
    EnvConfig,
    EvalConfig,
    LoggingConfig,
    LossConfig,
    MixtureEnvConfig,
    RolloutsConfig,
)
from rlvr.config.loader import (
    AnyConfig,
    apply_overrides,
    from_dict,
    load_config,
    parse_override,
    save_config,
    to_dict,
    to_yaml,
)
from rlvr.config.sampling import SamplingConfig
from rlvr.config.sections import (
    CheckpointConfig,
    DistributedConfig,
    LoraConfig,
    ModelConfig,
    OptimConfig,
    WandbConfig,
    delimiters_ok,
)
from rlvr.config.server import ServerConfig
from rlvr.config.sft import SFTConfig, SFTDataConfig, SFTTrainConfig

__all__ = [
    "AnyConfig",
    "BatchConfig",
    "CheckpointConfig",
    "Config",
    "ConfigError",
    "DistillConfig",
    "DistributedConfig",
    "EnvConfig",
    "MixtureEnvConfig",
    "CurriculumConfig",
    "EvalConfig",
    "LoggingConfig",
    "LoraConfig",
    "LossConfig",
    "ModelConfig",
    "OptimConfig",
    "RolloutsConfig",
    "SFTConfig",
    "SFTDataConfig",
    "SFTTrainConfig",
    "SamplingConfig",
    "ServerConfig",
    "WandbConfig",
    "apply_overrides",
    "delimiters_ok",
    "from_dict",
    "load_config",
    "parse_override",
    "save_config",
    "to_dict",
    "to_yaml",
]
