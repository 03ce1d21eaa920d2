"""The rollout side of a GRPO run, started on the main process: its environment and worker.

`load_env` loads the run's environment (or mixture) and refuses one whose sampling defaults or
rollout stages the trainer cannot reproduce; `start_worker` starts the `RolloutWorker` that
generates the run's batches, one client per server.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rlvr.config import Config, ConfigError, EnvConfig, MixtureEnvConfig
from rlvr.config.sampling import SamplingFilterError
from rlvr.distill.teacher import Teacher
from rlvr.envserver.environment import EnvServerEnv, load_env_server
from rlvr.rollouts.client import make_client
from rlvr.rollouts.groups import UnsupportedEnvironmentError, check_rollout_stage_only
from rlvr.rollouts.mixture import leaves, load_mixture, routed_filter
from rlvr.rollouts.prompts import prompt_length_filter
from rlvr.rollouts.request_args import build_sampling_args
from rlvr.rollouts.servers import ServerPool
from rlvr.rollouts.worker import RolloutWorker, StepBatch


def load_env(cfg: Config, env: Any = None) -> Any:
    """`env`, else the mixture of `cfg.envs`, else the 0.4 taskset of `cfg.env_server`, else
    `cfg.env`'s environment; with its sampling defaults checked against what the trainer can
    reproduce. A 0.4 taskset's EnvServer is started here (`close_rollouts` stops it)."""
    if env is None and cfg.envs:
        env = load_mixture(cfg.envs, lambda entry: _load_one(cfg, entry))
    elif env is None:
        env = _load_one(cfg, cfg.env)
    for name, leaf in leaves(env).items():
        try:
            build_sampling_args(cfg.sampling, leaf.sampling_args)
            check_rollout_stage_only(leaf)
        except (SamplingFilterError, UnsupportedEnvironmentError) as e:
            raise ConfigError(f"environment {name or cfg.env_label}: {e}") from None
    return env


def _load_one(cfg: Config, entry: EnvConfig | MixtureEnvConfig) -> Any:
    """One environment: a 0.4 taskset through its EnvServer, or a classic verifiers one."""
    import verifiers as vf

    mixed = isinstance(entry, MixtureEnvConfig)
    server = entry.env_server if mixed else cfg.env_server
    if server.enabled:
        label = entry.label if mixed else server.taskset
        out = Path(cfg.output_dir) / "env_server" / label
        return load_env_server(server, cfg.model.name, cfg.sampling.temperature, out)
    return vf.load_environment(entry.id, **entry.args)


def close_rollouts(worker: RolloutWorker | None, env: Any) -> None:
    """Stop the worker, then what the environment started beside the run (a 0.4 taskset's
    EnvServer and bridges)."""
    if worker is not None:
        worker.close()
    for leaf in leaves(env).values() if env is not None else ():
        if isinstance(leaf, EnvServerEnv):
            leaf.close()


def start_worker(
    cfg: Config,
    env: Any,
    tokenizer: Any,
    *,
    start_step: int,
    data_position: int,
    in_flight: list[StepBatch],
    curriculum_state: dict[int, Any] | None,
    served_name: Any,
    pool: ServerPool,
) -> RolloutWorker:
    """The started rollout worker of a run at `start_step` (its weight version too), its
    prompts filtered to `batch.max_prompt_len` tokens and `in_flight` batches preloaded; with
    `distill:`, the teacher that grades its training groups, checked first."""
    teacher = None
    if cfg.distill.enabled:
        teacher = Teacher.checked(cfg.distill, tokenizer, cfg.batch.max_seq_len)
    env.set_max_seq_len(cfg.batch.max_seq_len)
    fits = routed_filter(
        env,
        lambda leaf: prompt_length_filter(
            tokenizer, cfg.batch.max_prompt_len, getattr(leaf, "tool_defs", None)
        ),
    )

    def client(url: str) -> Any:
        return make_client(
            url,
            cfg.server.api_key,
            cfg.server.timeout_s,
            max_connections=max(cfg.batch.batch_size * 2, 64),
            temperature=cfg.sampling.temperature,
            rollouts=cfg.rollouts,
        )

    return RolloutWorker(
        env,
        env.get_dataset(),
        cfg,
        client_factory=client,
        start_step=start_step,
        version=start_step,
        data_position=data_position,
        prompt_fits=fits,
        preloaded=in_flight,
        curriculum_state=curriculum_state,
        served_name=served_name,
        pool=pool,
        teacher=teacher,
    ).start()
