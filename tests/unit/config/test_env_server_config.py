"""`env_server:` (a verifiers 0.4 taskset through its EnvServer) in the run config: it replaces
`env:`, each mixture entry may carry its own, and its values are checked with their names."""

from __future__ import annotations

import pytest

from rlvr.config import ConfigError, load_config

TASKSET = "env_server.taskset=vf04-reverse-text"


def test_env_server_replaces_env_and_names_the_run() -> None:
    cfg = load_config(overrides=[TASKSET, "env_server.taskset_args={num_rows: 4}"])
    assert cfg.env_server.enabled and cfg.env_label == "vf04-reverse-text"
    assert cfg.env_server.taskset_args == {"num_rows": 4}
    assert not load_config().env_server.enabled


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ([TASKSET, "env.id=vf-planner"], "env_server.taskset='vf04-reverse-text': replaces env"),
        ([TASKSET, "envs=[{id: vf-planner}]"], "in a mixture, set envs[i].env_server"),
        ([TASKSET, "env_server.workers=0"], "env_server.workers=0: must be positive"),
        ([TASKSET, "env_server.episode_timeout_s=0"], "env_server.episode_timeout_s=0"),
        ([TASKSET, "env_server.harness=bash"], "env_server.harness='bash': choose one of ['null']"),
        ([TASKSET, "env_server.runtime=prime"], "choose one of ['subprocess']"),
        (["env_server.tasks_file=x.jsonl"], "unknown config key env_server.tasks_file"),
        (
            ["envs=[{id: rev, env_server: {taskset: t, max_concurrent: 0}}]"],
            "envs[0].env_server.max_concurrent=0",
        ),
    ],
)
def test_bad_env_server_values_name_the_field(overrides, message) -> None:
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace("[", r"\[")):
        load_config(overrides=overrides)


def test_a_mixture_entry_carries_its_own_env_server() -> None:
    cfg = load_config(
        overrides=["envs=[{id: vf-planner}, {id: rev, weight: 2, env_server: {taskset: t}}]"]
    )
    classic, served = cfg.envs
    assert not classic.env_server.enabled and served.env_server.taskset == "t"
    assert cfg.env_label == "mixture of vf-planner, rev"
