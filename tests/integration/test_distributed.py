"""The trainer where users run it, on the CPU with the same code as on GPUs: vf-vllm on another
"host" (a network namespace) with tensor parallelism, ZeRO-3 across two trainer ranks, and a
model whose generation_config.json carries sampling defaults.

docs/scaling.md shows the commands these tests run.
"""

from __future__ import annotations

import json
import time

import pytest
import torch
from hosts import NamespaceError, NetworkNamespace
from safetensors.torch import load_file
from support import (
    assert_engine_goes_idle,
    config,
    engine_processes,
    launch,
    measured,
    server_logprobs,
    target_id,
    trainer_logprobs,
    zero3_launch,
)
from toy_env import target_share_env

from rlvr.server.process import EXACT_FLAGS
from rlvr.trainer.checkpoint import list_checkpoints
from rlvr.trainer.grpo import Trainer
from rlvr.weight_sync.rendezvous import RendezvousError, route_address

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def remote_tp_server(tiny_model_dir, tmp_path_factory):
    """vf-vllm with --tensor-parallel-size 2 in its own network namespace: it reaches this
    host only over a veth link, so a rendezvous on 127.0.0.1 (what the trainer hard-coded
    before) cannot work, and the transfer group has three members (trainer + 2 workers)."""
    from rlvr.server.process import VLLMServer

    namespace = NetworkNamespace()
    try:
        namespace.__enter__()
    except NamespaceError as e:
        pytest.skip(f"this kernel or user cannot create a network namespace: {e}")
    server = VLLMServer(
        str(tiny_model_dir),
        host=namespace.address,
        prefix=namespace.prefix,
        extra_args=[*EXACT_FLAGS, "--tensor-parallel-size", "2"],
        log_path=tmp_path_factory.mktemp("remote-tp-server") / "vf-vllm.log",
    )
    try:
        server.start()
        server.model_dir = tiny_model_dir
        server.namespace = namespace
        yield server
    finally:
        server.stop()
        namespace.__exit__()


def test_two_hosts_gloo_training_pushes_arrive(remote_tp_server, tmp_path):
    """Two GRPO steps from this namespace against the server in the other one: the trainer
    hosts the rendezvous on its own address on the veth link, sized from the server's
    reported workers, and every push arrives (sampler and trainer agree)."""
    ns = remote_tp_server.namespace
    assert route_address(ns.address) == ns.host_address != "127.0.0.1"
    cfg = config(
        remote_tp_server,
        tmp_path / "run",
        "max_steps=2",
        "server.backend=gloo",
        "server.transfer_timeout_s=120",
    )
    trainer = Trainer(cfg, env=target_share_env(target_id(remote_tp_server.model_dir)))
    history = trainer.run()
    (push,) = trainer.weights.pushes  # the one server's merged push
    assert push.meeting.master_address == ns.host_address
    assert push.meeting.world_size == 3  # the trainer + 2 tensor-parallel workers
    assert len(history) == 2 and trainer.worker.clock.current == 2  # each step published
    kls = measured(history, "mismatch_kl")
    assert max(kls) < 1e-3, kls
    assert all(h["time/weight_push"] > 0 for h in history)


def pushes_arrive(server, backend: str, device: str = "cpu") -> None:
    """Perturb a trainer copy of the server's model twice; after each push the served
    log-probabilities are the trainer's (each tensor-parallel worker takes its shard of the
    whole stream), and differ from the previous push's; the exact check adds the workers'
    shards up to what was sent."""
    from transformers import AutoModelForCausalLM

    from rlvr.weight_sync.merged import MergedPush

    model = AutoModelForCausalLM.from_pretrained(server.model_dir, dtype=torch.float32)
    model = model.to(device)
    ids = list(range(3, 60, 3))
    with MergedPush(server.base_url, server.model, backend=backend, transfer_timeout_s=120) as sync:
        sync.connect(model)
        previous = None
        for version, seed in enumerate((1, 2)):
            torch.manual_seed(seed)
            with torch.no_grad():
                for p in model.parameters():
                    p.add_(0.05 * torch.randn_like(p))
            sync.push(version)
            assert sync.check is not None, "the tensor-parallel server was not checked exactly"
            assert sync.verified.failed == [], [m.describe() for m in sync.verified.failed]
            served = server_logprobs(server, ids)
            assert (served - trainer_logprobs(model.cpu(), ids)).abs().max() < 1e-4
            model.to(device)
            if previous is not None:
                assert (served - previous).abs().mean() > 1e-2, "the push changed nothing"
            previous = served


def test_tensor_parallel_server_logprobs_match_after_each_push(remote_tp_server):
    pushes_arrive(remote_tp_server, "gloo")


def test_tensor_parallel_cpu_workers_go_idle_right_after_a_request(remote_tp_server):
    """Separate CPU workers wait for the engine's next message: vf-vllm's plugin caps their
    busy-wait (`rlvr.server.plugin.cap_idle_spin`), which would otherwise take both cores for
    a second after every request."""
    names = [p.name() for p in engine_processes(remote_tp_server)]
    assert sum("Worker" in name for name in names) == 2, names
    assert_engine_goes_idle(remote_tp_server)


@pytest.mark.gpu
@pytest.mark.skipif(
    not torch.cuda.is_available() or torch.cuda.device_count() < 3,
    reason="needs 3 GPUs (trainer on one, a TP=2 vf-vllm on two) and vLLM's CUDA build",
)
def test_tensor_parallel_gpu_server_nccl_pushes_arrive(tiny_model_dir, tmp_path):
    """The same check as the CPU test above, with vLLM's nccl engine: the group is the
    trainer + both tensor-parallel workers, sized from the server's reported world."""
    from rlvr.server.process import VLLMServer

    flags = [
        "--dtype",
        "float32",
        "--enforce-eager",
        "--tensor-parallel-size",
        "2",
        "--gpu-memory-utilization",
        "0.3",
    ]
    env = {"CUDA_VISIBLE_DEVICES": "1,2"}
    with VLLMServer(
        str(tiny_model_dir), extra_args=flags, env=env, log_path=tmp_path / "vllm.log"
    ) as server:
        server.model_dir = tiny_model_dir
        pushes_arrive(server, "nccl", device="cuda:0")


def test_two_hosts_unreachable_transfer_host_fails_within_the_timeout(remote_tp_server):
    """A rendezvous address the server cannot reach (here our loopback, which inside its
    namespace is its own) fails after server.transfer_timeout_s, naming both addresses and
    the port, instead of hanging. Runs last on this server: vLLM leaves the second worker's
    failed reply queued after a failed multi-worker call (see docs/troubleshooting.md)."""
    from rlvr.weight_sync.merged import MergedPush

    sync = MergedPush(
        remote_tp_server.base_url,
        remote_tp_server.model,
        backend="gloo",
        transfer_timeout_s=10,
        transfer_host="127.0.0.1",
    )
    began = time.monotonic()
    with pytest.raises(RendezvousError) as failure:
        sync.connect(torch.nn.Linear(2, 2))
    assert time.monotonic() - began < 60
    message = str(failure.value)
    assert "127.0.0.1:" in message and remote_tp_server.namespace.address in message
    assert "world 3" in message
    sync.control.close()


@pytest.mark.slow
def test_zero3_two_ranks_train_push_checkpoint_and_resume(tiny_server, tmp_path):
    """`accelerate launch` with ZeRO-3 on 2 CPU processes: every rank takes part in every
    gathered push (rank 1 never talks to the server), sampler and trainer agree after each,
    a checkpoint written by both ranks resumes, and the final adapter is gathered."""
    accelerate = zero3_launch()
    env = {"DS_ACCELERATOR": "cpu"}
    extra = ["max_steps=3", "checkpoint.every=2", "batch.micro_batch_size=3"]
    first = launch(tiny_server, tmp_path, accelerate, extra, env, stop_after=2)
    assert [r["world"] for r in first] == [2, 2]
    assert {r["type"] for r in first} == {"DistributedType.DEEPSPEED"}
    assert [len(r["history"]) for r in first] == [2, 2]
    assert all(h["time/weight_push"] > 0 for r in first for h in r["history"])  # both ranks push
    assert [p.name for p in list_checkpoints(tmp_path / "run")] == ["step_000002"]

    resumed = launch(tiny_server, tmp_path, accelerate, [*extra, "checkpoint.resume=auto"], env)
    assert [len(r["history"]) for r in resumed] == [1, 1]  # step 3 only
    assert all(h["time/weight_push"] > 0 for r in resumed for h in r["history"])
    histories = [h for r in first + resumed for h in r["history"]]
    assert max(measured(histories, "mismatch_kl")) < 1e-3
    assert first[0]["history"][0]["grad_norm"] > 0
    for ranks in (first, resumed):  # one optimizer step over both shards: the same norm
        assert [h["grad_norm"] for h in ranks[0]["history"]] == [
            h["grad_norm"] for h in ranks[1]["history"]
        ]
    adapter = load_file(tmp_path / "run" / "final" / "adapter_model.safetensors")
    lora_b = [t for name, t in adapter.items() if "lora_B" in name]
    assert lora_b and all(t.numel() > 0 for t in lora_b)  # gathered, not ZeRO-3's empty shards
    assert any(t.abs().max() > 0 for t in lora_b)  # and trained


def test_sampling_parity_with_generation_config_defaults(tiny_server, tmp_path):
    """The tiny model ships sampling defaults in generation_config.json, as Qwen2.5-Instruct
    does. vLLM would apply them to every request that leaves a field unset; vf-vllm starts it
    with --generation-config vllm and the trainer sends neutral filters, so the sampler's
    distribution is the trainer's and one step trains at float32 agreement."""
    defaults = json.loads((tiny_server.model_dir / "generation_config.json").read_text())
    assert defaults["top_k"] == 20 and defaults["repetition_penalty"] == 1.3
    assert defaults["temperature"] == 0.7 and defaults["top_p"] == 0.8
    cfg = config(tiny_server, tmp_path / "run", "max_steps=1", "sampling.temperature=1.0")
    history = Trainer(cfg, env=target_share_env(target_id(tiny_server.model_dir))).run()
    assert history[0]["mismatch_kl"] < 1e-3, history[0]["mismatch_kl"]
