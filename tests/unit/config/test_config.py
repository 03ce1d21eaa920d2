"""The trainer config: file + dotted overrides, type checks, clear errors, saved in full."""

from __future__ import annotations

import pytest
import yaml

from rlvr.config import Config, ConfigError, load_config, parse_override, save_config, to_dict


def test_defaults_are_valid_and_lora_is_on():
    config = load_config()
    assert config.lora.enabled is True
    assert config.loss.beta == 0.0
    assert config.model.name == "smollm2-135m"
    assert config.served_model == "smollm2-135m"
    assert config.examples_per_step == config.batch.batch_size // config.batch.rollouts_per_example


def test_file_then_overrides(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text(
        yaml.safe_dump(
            {"env": {"id": "vf-musique", "args": {"retriever": "bm25"}}, "optim": {"lr": 2e-5}}
        )
    )
    config = load_config(
        path,
        [
            "optim.lr=1e-6",
            "lora.enabled=false",
            "lora.target_modules=[q_proj, v_proj]",
            "env.args.max_turns=3",
            "batch.async_level=0",
            "checkpoint.resume=null",
            "--wandb.mode=disabled",
        ],
    )
    assert config.env.id == "vf-musique"
    assert config.env.args == {"retriever": "bm25", "max_turns": 3}
    assert config.optim.lr == 1e-6 and isinstance(config.optim.lr, float)
    assert config.lora.enabled is False
    assert config.lora.target_modules == ["q_proj", "v_proj"]
    assert config.batch.async_level == 0
    assert config.checkpoint.resume is None
    assert config.wandb.mode == "disabled"


def test_int_is_accepted_for_float():
    assert load_config(overrides=["optim.max_grad_norm=2"]).optim.max_grad_norm == 2.0


@pytest.mark.parametrize(
    "override, message",
    [
        ("optim.lrr=1e-5", "unknown config key optim.lrr"),
        ("nope.x=1", "unknown config key nope"),
        ("batch.batch_size=abc", "batch.batch_size='abc': expected an integer"),
        ("lora.enabled=maybe", "lora.enabled='maybe': expected true or false"),
        ("optim.scheduler=step", "optim.scheduler='step': choose one of"),
        ("batch.batch_size=10", "multiple of batch.rollouts_per_example"),
        ("batch.async_level=-1", "batch.async_level=-1"),
        ("server.backend=tcp", "server.backend='tcp'"),
        ("loss.ratio_mask_low=2", "loss.ratio_mask_low/high"),
        ("server.probe_noise=0.01", "server.probe_noise was removed: the exact check"),
    ],
)
def test_bad_values_name_the_field(override, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace("[", r"\[")):
        load_config(overrides=[override])


def test_override_syntax_errors():
    with pytest.raises(ConfigError, match="not of the form"):
        parse_override("optim.lr")
    with pytest.raises(ConfigError, match="does not exist"):
        load_config("/nonexistent/run.yaml")


def test_saved_config_round_trips(tmp_path):
    config = load_config(overrides=["seed=7", "env.args.n=2", "sampling.temperature=0.7"])
    save_config(config, tmp_path / "config.yaml")
    again = load_config(tmp_path / "config.yaml")
    assert to_dict(again) == to_dict(config)
    assert isinstance(again, Config)


def test_example_configs_load():
    from pathlib import Path

    from rlvr.config import SFTConfig

    examples = sorted((Path(__file__).parents[3] / "configs" / "examples").glob("*.yaml"))
    assert examples, "configs/examples/ holds example run configs"
    for path in examples:  # sft_*.yaml are scripts/sft.py's, the rest scripts/train.py's
        load_config(path, cls=SFTConfig if path.name.startswith("sft_") else Config)


def test_command_line_shortcuts_and_overrides(tmp_path):
    from rlvr.config.cli import config_from_argv, parse_args

    path, overrides = parse_args(
        [
            "--config",
            "run.yaml",
            "--env",
            "vf-musique",
            "optim.lr=1e-5",
            "--batch.async_level",
            "0",
            "--model=smollm2-135m",
            "--output-dir",
            "out",
        ]
    )
    assert path == "run.yaml"
    assert overrides == [
        "env.id=vf-musique",
        "optim.lr=1e-5",
        "batch.async_level=0",
        "model.name=smollm2-135m",
        "output_dir=out",
    ]
    config = config_from_argv(["--env", "vf-openspiel", "lora.rank=8"])
    assert config.env.id == "vf-openspiel" and config.lora.rank == 8
    with pytest.raises(SystemExit, match="unknown config key lora.rnk"):
        config_from_argv(["lora.rnk=8"])
    with pytest.raises(SystemExit, match="needs a value"):
        config_from_argv(["--env"])
