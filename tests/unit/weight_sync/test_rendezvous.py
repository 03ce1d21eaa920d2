"""Where the trainer and vf-vllm meet for a weight transfer: the group's size and address,
deadlines that turn a wrong address into a clear error, the gloo group itself, the backend
`auto` picks, and the example configs' remote settings."""

from __future__ import annotations

import socket
import threading
import time
from pathlib import Path

import pytest
import torch

from rlvr.config import load_config
from rlvr.weight_sync.rendezvous import (
    GlooGroup,
    Meeting,
    RendezvousError,
    free_port,
    plan_meeting,
    route_address,
    with_deadline,
)

ROOT = Path(__file__).resolve().parents[3]


def is_local(address: str) -> bool:
    with socket.socket() as s:
        try:
            s.bind((address, 0))
        except OSError:
            return False
    return True


def test_route_address_is_loopback_for_a_local_server_and_an_interface_otherwise():
    assert route_address("127.0.0.1") == route_address("localhost") == "127.0.0.1"
    remote = route_address("10.0.0.2")  # no packet is sent: the kernel only picks a route
    assert remote != "127.0.0.1" and is_local(remote)


def test_the_group_is_the_trainer_plus_every_server_worker():
    meeting = plan_meeting("127.0.0.1", server_world=4, timeout_s=5)
    assert meeting.world_size == 5 and meeting.master_address == "127.0.0.1"
    fixed = plan_meeting("10.0.0.2", 2, 5, transfer_host="127.0.0.1", transfer_port=29555)
    assert (fixed.master_address, fixed.master_port, fixed.world_size) == ("127.0.0.1", 29555, 3)
    with pytest.raises(RendezvousError, match="at least 1"):
        plan_meeting("127.0.0.1", 0, 5)


def test_a_transfer_host_that_is_not_ours_is_refused_at_once():
    with pytest.raises(RendezvousError, match="203.0.113.9: it is not an address of this"):
        free_port("203.0.113.9")


def test_a_party_that_never_arrives_fails_at_the_deadline_naming_both_addresses():
    meeting = Meeting("127.0.0.1", 29599, 3, "10.0.0.2", timeout_s=1.0)
    never = threading.Event()
    began = time.monotonic()
    with pytest.raises(RendezvousError) as failure:
        with_deadline(meeting, "the test rendezvous", [never.wait, lambda: 1])
    assert time.monotonic() - began < 5
    message = str(failure.value)
    assert "did not complete within 1s" in message
    assert "127.0.0.1:29599" in message and "server at 10.0.0.2" in message
    with pytest.raises(RendezvousError, match="failed: .*boom"):
        with_deadline(meeting, "x", [lambda: (_ for _ in ()).throw(OSError("boom"))])
    never.set()


def test_gloo_group_broadcasts_from_rank_0():
    port = free_port()
    received = torch.zeros(4)

    def member():
        group = GlooGroup("127.0.0.1", port, 1, 2, timeout_s=30)
        group.broadcast(received)
        group.close()

    thread = threading.Thread(target=member)
    thread.start()
    group = GlooGroup("127.0.0.1", port, 0, 2, timeout_s=30, local_address="127.0.0.1")
    group.broadcast(torch.arange(4.0))
    thread.join(30)
    group.close()
    assert received.tolist() == [0.0, 1.0, 2.0, 3.0]


@pytest.mark.parametrize("example", ["deepscaler_zero3.yaml", "openspiel_full_ft.yaml"])
def test_remote_example_configs_build_their_rendezvous_without_hanging(example):
    """Both examples serve from a TP=4 vf-vllm on 10.0.0.2 (their header comments): the group
    has 5 members and meets on this machine's address on the route to the server, and with
    nobody there the trainer's side gives up at the configured deadline."""
    from rlvr.weight_sync.control import server_host

    cfg = load_config(ROOT / "configs" / "examples" / example, ["server.transfer_timeout_s=2"])
    host = server_host(cfg.server.base_url)
    assert host == "10.0.0.2"
    meeting = plan_meeting(
        host, 4, cfg.server.transfer_timeout_s, cfg.server.transfer_host, cfg.server.transfer_port
    )
    assert meeting.world_size == 5 and meeting.master_address != "127.0.0.1"

    def trainer_side():
        return GlooGroup(meeting.master_address, meeting.master_port, 0, 5, 2.0)

    began = time.monotonic()
    with pytest.raises(RendezvousError, match="world 5"):
        with_deadline(meeting, "the gloo weight-transfer rendezvous", [trainer_side])
    assert time.monotonic() - began < 10


@pytest.mark.parametrize(
    ("server_gpus", "expected"), [(["GPU-a"], "ipc"), (["GPU-b"], "nccl"), (None, "nccl")]
)
def test_auto_backend_on_cuda_shares_a_gpu_through_ipc(monkeypatch, server_gpus, expected):
    """NCCL cannot put two ranks on one GPU: a trainer on the server's own GPU needs ipc."""
    from rlvr.weight_sync.merged import resolve_backend

    class Properties:
        uuid = "GPU-a"

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda _: Properties())
    assert resolve_backend("auto", "http://127.0.0.1:8000/v1", server_gpus) == expected
    assert resolve_backend("gloo", "http://127.0.0.1:8000/v1", ["GPU-a"]) == "gloo"


def test_auto_backend_on_cpu_uses_shared_memory_only_on_this_host():
    from rlvr.weight_sync.merged import resolve_backend

    assert resolve_backend("auto", "http://127.0.0.1:8000/v1") == "shm"
    assert resolve_backend("auto", "http://10.0.0.2:8000/v1") == "gloo"
    with pytest.raises(ValueError, match="unknown weight-transfer backend"):
        resolve_backend("tcp", "http://127.0.0.1:8000/v1")
