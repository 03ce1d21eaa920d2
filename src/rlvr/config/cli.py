"""The scripts' command lines: `--config FILE`, shortcuts and dotted overrides, turned into a
checked config (`config_from_argv`); USAGE shows the forms. Design: docs/training.md#configuration.
"""

from __future__ import annotations

import sys

from rlvr.config import AnyConfig, Config, ConfigError, load_config

SHORTCUTS = {"env": "env.id", "model": "model.name", "output-dir": "output_dir"}
USAGE = """Command lines of the training scripts: a config file, shortcuts and dotted overrides.

    scripts/train.py --config run.yaml --env vf-musique optim.lr=1e-5 --batch.async_level 0
    scripts/sft.py --config sft.yaml --model smollm2-135m train.max_steps=20

`--config FILE` reads a YAML file; `--env X`, `--model X` and `--output-dir X` are shortcuts
for `env.id=X` (GRPO only), `model.name=X` and `output_dir=X`; every other `key=value`,
`--key=value` or `--key value` is a dotted override.
"""


def parse_args(argv: list[str]) -> tuple[str | None, list[str]]:
    """Split argv into the config file and the list of dotted overrides."""
    config_path = None
    overrides: list[str] = []
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg.startswith("--"):
            key, eq, value = arg[2:].partition("=")
            if not eq:
                if i + 1 >= len(argv):
                    raise ConfigError(f"{arg} needs a value")
                value = argv[i + 1]
                i += 1
            if key == "config":
                config_path = value
            else:
                overrides.append(f"{SHORTCUTS.get(key, key)}={value}")
        elif "=" in arg:
            overrides.append(arg)
        else:
            raise ConfigError(f"unexpected argument {arg!r} (expected key=value or --key value)")
        i += 1
    return config_path, overrides


def config_from_argv(
    argv: list[str] | None = None, cls: type[AnyConfig] = Config, usage: str = USAGE
) -> AnyConfig:
    """Parse a script's command line into a validated `cls`, or exit with the reason."""
    argv = sys.argv[1:] if argv is None else argv
    if any(a in ("-h", "--help") for a in argv):
        print(usage)
        raise SystemExit(0)
    try:
        path, overrides = parse_args(argv)
        return load_config(path, overrides, cls)
    except (ConfigError, FileNotFoundError) as e:
        raise SystemExit(f"config error: {e}") from None


def json_object(text: str) -> dict:
    """An argparse type for JSON-object options (`--env-args '{"retriever": "bm25"}'`)."""
    import argparse
    import json

    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise argparse.ArgumentTypeError(f"not valid JSON ({e.msg}): {text!r}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"expected a JSON object, got {text!r}")
    return value


def positive_int(text: str) -> int:
    """An argparse type for counts that must be at least 1."""
    import argparse

    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value
