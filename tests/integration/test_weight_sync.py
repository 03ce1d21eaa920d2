"""Pushing trainer weights into a running vf-vllm (CPU engine: shm and gloo transports) and what
vLLM then serves."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
import torch
from support import assert_engine_goes_idle, engine_processes, server_logprobs, trainer_logprobs

pytestmark = pytest.mark.integration

PROMPT = "The quick brown fox jumps over the lazy dog"
COMPLETION = " and runs far away into the forest"


@pytest.fixture
def trainer_model(tiny_server):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(tiny_server.model_dir, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(tiny_server.model_dir)
    return model, tokenizer(PROMPT + COMPLETION)["input_ids"]


@pytest.mark.parametrize("transport", ["shm", "gloo"])
def test_pushed_weights_are_what_vllm_serves(tiny_server, trainer_model, transport):
    from rlvr.weight_sync.merged import MergedPush

    model, ids = trainer_model
    with MergedPush(tiny_server.base_url, tiny_server.model, backend=transport) as sync:
        sync.connect(model)
        sync.push(0)  # the server may hold weights from an earlier test: start from ours
        before = server_logprobs(tiny_server, ids)
        assert (before - trainer_logprobs(model, ids)).abs().mean() < 1e-2

        torch.manual_seed(1)
        with torch.no_grad():
            for p in model.parameters():
                p.add_(0.2 * torch.randn_like(p))
        expected = trainer_logprobs(model, ids)
        stale = server_logprobs(tiny_server, ids)
        seconds = sync.push(1)
        after = server_logprobs(tiny_server, ids)

    assert seconds > 0
    assert (stale - before).abs().max() < 1e-5, "weights changed before the push"
    assert (after - expected).abs().mean() < 1e-2, "vLLM does not serve the pushed weights"
    assert (after - before).abs().mean() > 0.1, "the push changed nothing"


DYING_TRAINER = textwrap.dedent(
    """
    import os, sys, torch
    from transformers import AutoModelForCausalLM
    from vllm.distributed.weight_transfer.base import ModuleSource
    from rlvr.weight_sync.merged import MergedPush

    class DiesMidway(ModuleSource):
        def __iter__(self):
            for i, pair in enumerate(super().__iter__()):
                if i == 5:
                    os._exit(3)  # the trainer process dies mid-transfer
                yield pair

    model = AutoModelForCausalLM.from_pretrained(sys.argv[2], dtype=torch.float32)
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(0)  # had these arrived, the model would produce garbage
    sync = MergedPush(sys.argv[1], sys.argv[2], backend="gloo", transfer_timeout_s=30,
                      chunk_bytes=4096)
    sync.connect(DiesMidway(model))
    sync.push(0)
    """
)


def test_server_survives_a_trainer_dying_mid_update(tiny_server, trainer_model):
    from rlvr.weight_sync.merged import MergedPush

    model, ids = trainer_model
    with MergedPush(tiny_server.base_url, tiny_server.model) as sync:
        sync.connect(model)
        sync.push(0)
    reference = server_logprobs(tiny_server, ids)

    dead = subprocess.run(
        [sys.executable, "-c", DYING_TRAINER, tiny_server.base_url, str(tiny_server.model_dir)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert dead.returncode == 3, dead.stderr[-2000:]

    # A new trainer connects (un-pausing the server) and the old weights are still intact:
    # the worker loads only after every byte arrived.
    with MergedPush(tiny_server.base_url, tiny_server.model) as sync:
        assert sync.resolve() == "shm"  # auto: a local server on a machine without CUDA
        sync.connect(model)
        assert (server_logprobs(tiny_server, ids) - reference).abs().max() < 1e-5
        sync.push(0)
    assert (server_logprobs(tiny_server, ids) - reference).abs().max() < 1e-5


def test_a_new_trainer_takes_over_an_update_a_dead_one_left_open(tiny_server, trainer_model):
    from rlvr.weight_sync.merged import MergedPush

    model, ids = trainer_model
    with MergedPush(tiny_server.base_url, tiny_server.model) as sync:
        sync.connect(model)
        sync.control.start_weight_update()  # ... and the trainer dies before sending
    with MergedPush(tiny_server.base_url, tiny_server.model) as sync:
        sync.connect(model)
        with torch.no_grad():
            model.lm_head.weight.mul_(2)
        sync.push(0)
        assert (
            server_logprobs(tiny_server, ids) - trainer_logprobs(model, ids)
        ).abs().mean() < 1e-2


def test_control_errors_carry_the_servers_message(tiny_server):
    from rlvr.weight_sync.control import ServerControl, ServerError

    control = ServerControl(tiny_server.base_url, timeout_s=30)
    with pytest.raises(ServerError, match="update_weights -> 4|update_weights -> 5"):
        control.post("/update_weights", json={"update_info": {"names": ["x"]}})
    assert control.health()


def _vllm_has_cuda() -> bool:
    if not torch.cuda.is_available():
        return False
    from vllm.platforms import current_platform

    return current_platform.is_cuda()


@pytest.mark.gpu
@pytest.mark.skipif(not _vllm_has_cuda(), reason="needs CUDA and vLLM's CUDA build")
def test_ipc_push_into_vllm_sharing_the_trainers_gpu(tiny_model_dir, tmp_path):
    """One process holds the model on the GPU; vf-vllm serves from the same GPU; CUDA IPC."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rlvr.server.process import VLLMServer
    from rlvr.weight_sync.merged import MergedPush

    flags = [
        "--dtype",
        "float32",
        "--gpu-memory-utilization",
        "0.3",
        "--enforce-eager",
        "--weight-transfer-backend",
        "ipc",
    ]
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).cuda()
    ids = AutoTokenizer.from_pretrained(tiny_model_dir)(PROMPT + COMPLETION)["input_ids"]
    with VLLMServer(str(tiny_model_dir), extra_args=flags, log_path=tmp_path / "log") as server:
        server.model_dir = tiny_model_dir
        with MergedPush(server.base_url, server.model, backend="ipc") as sync:
            sync.connect(model)
            before = server_logprobs(server, ids)
            with torch.no_grad():
                for p in model.parameters():
                    p.add_(0.2 * torch.randn_like(p))
            sync.push(0)
            after = server_logprobs(server, ids)
    expected = trainer_logprobs(model.cpu(), ids)
    assert (after - expected).abs().mean() < 1e-2
    assert (after - before).abs().mean() > 0.1


def test_idle_spin_cap_shortens_the_readers_busy_loop(monkeypatch):
    import zmq
    from vllm.distributed.device_communicators.shm_broadcast import SpinCondition
    from vllm.utils.network_utils import get_open_zmq_ipc_path

    from rlvr.server.plugin import cap_idle_spin

    monkeypatch.setattr(SpinCondition, "wait", SpinCondition.wait)  # restored after the test
    cap_idle_spin(0.01)
    cap_idle_spin(0.02)  # loading the plugin again re-wraps vLLM's method, not our wrapper
    assert SpinCondition.wait.rlvr_original is not SpinCondition.wait
    assert not hasattr(SpinCondition.wait.rlvr_original, "rlvr_original")

    context = zmq.Context()
    reader = SpinCondition(is_reader=True, context=context, notify_address=get_open_zmq_ipc_path())
    try:
        assert reader.busy_loop_s == 1  # vLLM's default: a second of sched_yield per message
        reader.wait(timeout_ms=0)
        assert reader.busy_loop_s == 0.02
    finally:
        for sock in (
            reader.local_notify_socket,
            reader.read_cancel_socket,
            reader.write_cancel_socket,
        ):
            sock.close(linger=0)
        context.term()


def test_cpu_worker_goes_idle_right_after_a_request(tiny_server):
    """A one-worker CPU engine rests between requests: its worker runs in the engine-core
    process (`rlvr.server.launcher.engine_env`), which blocks on its queue. The spin cap of
    separate workers is checked on the tensor-parallel server (test_distributed.py)."""
    names = [p.name() for p in engine_processes(tiny_server)]
    assert not any("Worker" in name for name in names), names
    assert_engine_goes_idle(tiny_server)
