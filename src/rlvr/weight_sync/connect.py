"""Deciding how the trainer's weights reach vf-vllm, and connecting every rank to it.

`connect` runs once at start-up, on every rank. Rank 0 asks the server how it runs and checks
that it can serve this policy: the same vocabulary (a reasoning vocabulary needs the expanded
directory served, `check_served_vocabulary`) and logprobs of the sampled distribution
(`check_served_logprobs`). It then chooses the push (`choose_push`): the LoRA adapter, served
by vLLM on its frozen base (`rlvr.weight_sync.adapter`), or the transfer of merged weights
(`rlvr.weight_sync.merged`, streamed by `rlvr.weight_sync.merged_stream`), and tells the other
ranks, which then connect with it (they only join the trainer-side gathers of ZeRO-3 shards).
Either way the trainer gets a `rlvr.weight_sync.base.WeightPush` and never asks which.

A LoRA policy on a quantized base (QLoRA) computes with the dequantized base, not the server's
original one; under adapter sync that base is pushed once at start through the merged transfer
(`push_trained_base`), and adapters then go onto it. Merged pushes stream it dequantized anyway.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from rlvr.config import Config, ConfigError
from rlvr.model.quantization import quantization_of
from rlvr.rollouts.mixture import leaves
from rlvr.rollouts.request_args import SamplingFilterError, check_logprobs_mode
from rlvr.weight_sync.base import WeightPush
from rlvr.weight_sync.control import ServerControl
from rlvr.weight_sync.probe import PushProbe, probe_ids

if TYPE_CHECKING:  # imports vLLM: loaded when a trainer connects
    from rlvr.weight_sync.merged import MergedPush


@dataclass
class Connection:
    """What the trainer keeps of the server: `weights` pushes them, `control` is the server's
    HTTP client, `way` names how weights travel (`adapter`, or the merged transfer: `shm`,
    `gloo`, `nccl`, `ipc`), `probe` checks pushes (None: not probed)."""

    weights: WeightPush
    control: ServerControl
    way: str
    probe: PushProbe | None


def connect(
    cfg: Config,
    accelerator: Any,
    model: Any,
    *,
    tokenizer: Any,
    reasoning_vocab: Any,
    compute_dtype: Any,
    env: Any,
    start_step: int,
    say: Callable[[str], None],
) -> Connection:
    """Rank 0 picks how weights reach the server (asking it how it runs) and tells the
    others; all ranks then connect together. `model` is the (wrapped) policy, `say` prints
    on the main process."""
    from rlvr.weight_sync.adapter import AdapterPush
    from rlvr.weight_sync.merged_stream import MergedWeightSource

    server, rank = cfg.server, accelerator.process_index
    merged = merged_push(cfg, rank)
    control, unwrapped = merged.control, accelerator.unwrap_model(model)
    way = base_transfer = None
    if accelerator.is_main_process:
        check_served_vocabulary(control, reasoning_vocab, cfg)
        check_served_logprobs(control, cfg)
        way = choose_push(merged, cfg, unwrapped, env, say)
        if way == "adapter" and quantization_of(unwrapped) != "none":
            base_transfer = merged.resolve()
    if accelerator.num_processes > 1:
        from accelerate.utils import broadcast_object_list

        way, base_transfer = broadcast_object_list([(way, base_transfer)])[0]
    if base_transfer is not None:
        push_trained_base(merged, unwrapped, compute_dtype, base_transfer, start_step)
        say(
            f"pushed the dequantized {quantization_of(unwrapped)} base ({base_transfer}): "
            "the server's base model now computes what the trainer's base computes"
        )
    if way == "adapter":
        weights = AdapterPush(control, server.base_url, server.adapter_name, rank)
        weights.connect(unwrapped)
        requested = f"{weights.name(start_step)!r}, one name per weight version"
    else:
        weights = merged
        weights.connect(MergedWeightSource(unwrapped, dtype=compute_dtype), way)
        requested = repr(cfg.served_model)
    say(f"weight push: {way}; rollouts request model {requested}")
    probe = None
    if server.push_probe:
        ids = probe_ids(tokenizer, reasoning_vocab)
        probe = PushProbe(ids, server.probe_kl_max, server.probe_noise)
    return Connection(weights, control, way, probe)


def push_trained_base(
    merged: MergedPush, model: Any, dtype: Any, backend: str, version: int
) -> None:
    """Replace the server's base weights by the base `model` computes with (its quantized
    layers dequantized, no adapter), through the merged transfer `backend`; every rank calls
    it. Without this a QLoRA run's adapters would be served on the unquantized original: the
    sampler would sample from another model than the trainer scores (ratio and push probe
    off by the quantization error, see docs/training.md#quantized-bases-qlora)."""
    from rlvr.weight_sync.merged_stream import MergedWeightSource

    merged.connect(MergedWeightSource(model, dtype=dtype, with_adapters=False), backend)
    merged.push(version)
    merged.disconnect()


def merged_push(cfg: Config, rank: int) -> MergedPush:
    """The merged-weight push `cfg.server` describes, not yet connected (it holds the server's
    `control`, which start-up asks first, whichever way the weights then travel)."""
    from rlvr.weight_sync.merged import MergedPush

    server = cfg.server
    return MergedPush(
        server.base_url,
        cfg.served_model,
        backend=server.backend,
        api_key=server.api_key,
        timeout_s=server.timeout_s,
        transfer_timeout_s=server.transfer_timeout_s,
        transfer_host=server.transfer_host,
        transfer_port=server.transfer_port,
        rank=rank,
    )


def check_served_vocabulary(control: Any, reasoning_vocab: Any, cfg: Config) -> None:
    """The server must sample from the policy's vocabulary: a reasoning vocabulary needs
    vf-vllm serving the expanded directory (with its gate and folding tokenizer), and a
    server with one needs a policy that has it. A server that does not say is trusted."""
    from rlvr.server.plugin import REASONING_VOCAB_TOKENIZER_MODE

    mode = control.tokenizer_mode()
    if mode is None:
        return
    vocab, name = reasoning_vocab, cfg.model.name
    if vocab is not None and mode != REASONING_VOCAB_TOKENIZER_MODE:
        raise ConfigError(
            f"model {name} has a reasoning vocabulary ({vocab.size} ids) but the server at "
            f"{cfg.server.base_url} serves a model without one (tokenizer mode {mode!r}): "
            "write the expanded model with scripts/expand_vocab.py, serve that directory "
            "(vf-vllm switches its gate on) and set model.name to it"
        )
    if vocab is None and mode == REASONING_VOCAB_TOKENIZER_MODE:
        raise ConfigError(
            f"the server at {cfg.server.base_url} serves a model with a reasoning "
            f"vocabulary but model {name} has none: train the directory it serves"
        )


def check_served_logprobs(control: Any, cfg: Config) -> None:
    """The server's logprobs must be the sampled distribution's (see
    `check_logprobs_mode`): otherwise every importance ratio is off, silently."""
    try:
        check_logprobs_mode(control.logprobs_mode(), cfg.sampling.temperature)
    except SamplingFilterError as e:
        raise ConfigError(f"server {cfg.server.base_url}: {e}") from None


def choose_push(merged: Any, cfg: Config, model: Any, env: Any, say: Callable[[str], None]) -> str:
    """`adapter` (push the LoRA adapter, served by vLLM on its frozen base) or the
    transfer of merged weights. `server.lora_sync=auto` takes the adapter whenever the
    server can serve it; otherwise says why in the log and pushes merged weights. `model`
    is the unwrapped policy."""
    mode = cfg.server.lora_sync
    if not cfg.lora.enabled:
        if mode == "adapter":
            raise ConfigError("server.lora_sync=adapter needs lora.enabled=true")
        return check_frozen_helpers(merged.resolve(), env, cfg)
    if mode == "merged":
        return check_frozen_helpers(merged.resolve(), env, cfg)
    from rlvr.weight_sync.adapter import adapter_sync_problem

    problem = adapter_sync_problem(model, merged.control.max_lora_rank())
    if problem is None:
        return "adapter"
    if mode == "adapter":
        raise ConfigError(f"server.lora_sync=adapter: {problem}")
    say(f"pushing merged weights, not the adapter: {problem}")
    return check_frozen_helpers(merged.resolve(), env, cfg)


def check_frozen_helpers(push: str, env: Any, cfg: Config) -> str:
    """Refuse merged pushes into a server whose base model the environment uses as a
    frozen helper (vf_planner's worker without worker_base_url): the helper would train
    along with the policy."""
    frozen = [n for n, e in leaves(env).items() if getattr(e, "frozen_model_on_policy_server", 0)]
    if frozen:
        name = frozen[0] or cfg.env_label
        raise ConfigError(
            f"environment {name} uses the policy's server as a frozen model "
            "(e.g. vf_planner's worker), but this run pushes merged weights into it, so "
            "that model would train too. Use LoRA adapter sync (lora.enabled=true, "
            "server.lora_sync=auto or adapter, vf-vllm --enable-lora) or give the "
            "environment its own server with worker_base_url in env.args."
        )
    return push
