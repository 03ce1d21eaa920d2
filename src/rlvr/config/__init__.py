"""Run configuration: typed sections, the GRPO and SFT schemas, the YAML + dotted-override
loader, and the command lines of the scripts.

    rlvr.config.loader    load_config(path, overrides, cls): YAML file + dotted overrides, checked
    rlvr.config.sections  the sections both trainers share (model, LoRA, optimizer, ...)
    rlvr.config.grpo      Config, the GRPO run
    rlvr.config.sft       SFTConfig, the supervised fine-tuning run
    rlvr.config.cli       the scripts' command lines (--config FILE, shortcuts, overrides)

The public names are re-exported here: `from rlvr.config import Config, load_config`.
"""

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
    SamplingConfig,
    ServerConfig,
)
from rlvr.config.loader import (
    AnyConfig,
    ConfigError,
    apply_overrides,
    from_dict,
    load_config,
    parse_override,
    save_config,
    to_dict,
    to_yaml,
)
from rlvr.config.sections import (
    CheckpointConfig,
    DistributedConfig,
    LoraConfig,
    ModelConfig,
    OptimConfig,
    WandbConfig,
    delimiters_ok,
)
from rlvr.config.sft import SFTConfig, SFTDataConfig, SFTTrainConfig

__all__ = [
    "AnyConfig",
    "BatchConfig",
    "CheckpointConfig",
    "Config",
    "ConfigError",
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
