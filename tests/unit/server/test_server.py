"""vf-vllm as users run it: our launcher, clear start-up errors, and no orphaned engines."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest

VF_VLLM = str(Path(sys.executable).with_name("vf-vllm"))


def run_launcher(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([VF_VLLM, *args], capture_output=True, text=True, timeout=timeout)


@pytest.mark.slow
def test_vf_vllm_on_path_is_ours_not_verifiers_shim():
    result = run_launcher("--help", timeout=60)
    assert result.returncode == 0
    assert "rlvr's vf-vllm" in result.stdout
    assert "--weight-transfer-backend" in result.stdout


@pytest.mark.slow
def test_missing_model_path_fails_fast_with_a_clear_error(tmp_path):
    result = run_launcher("--model", str(tmp_path / "no-such-model"), timeout=60)
    assert result.returncode == 2
    assert "does not exist" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.slow
def test_port_in_use_is_reported(tiny_model_dir):
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        result = run_launcher("--model", str(tiny_model_dir), "--port", str(port), timeout=60)
    assert result.returncode == 2
    assert f"port {port}" in result.stderr and "already in use" in result.stderr


@pytest.mark.slow
def test_a_port_taken_before_the_launcher_binds_it_is_replaced_unless_it_was_asked_for(tmp_path):
    """VLLMServer picks a free port, which another process may take before the launcher starts:
    it tries a fresh one. The missing model makes the retry fail fast, after the port check."""
    from rlvr.server.process import PortTaken, VLLMServer

    missing = str(tmp_path / "no-such-model")
    with socket.socket() as held:
        server = VLLMServer(missing, log_path=tmp_path / "log.txt")
        held.bind(("127.0.0.1", server.port))  # taken between the pick and the start
        held.listen()
        with pytest.raises(RuntimeError, match="does not exist") as failed:
            server.start()
        assert failed.type is RuntimeError and server.port != held.getsockname()[1]
        asked = VLLMServer(missing, port=held.getsockname()[1], log_path=tmp_path / "log.txt")
        with pytest.raises(PortTaken, match="already in use"):
            asked.start()


@pytest.mark.parametrize(
    ("cuda", "user_flags", "expect_off"),
    [
        (False, [], True),
        (False, ["--enable-chunked-prefill"], False),  # the user's choice wins
        (True, [], False),  # CUDA generators rewind fine: keep vLLM's default
    ],
)
def test_cpu_servers_default_to_whole_prompt_prefill(cuda, user_flags, expect_off, tiny_model_dir):
    cmd = command(tiny_model_dir, user_flags, cuda)
    assert ("--no-enable-chunked-prefill" in cmd) == expect_off
    assert cmd[len(cmd) - len(user_flags) :] == user_flags  # passed through, last


@pytest.mark.parametrize(
    ("user_flags", "expect_on"), [([], True), (["--no-enable-scale-out"], False)]
)
def test_the_token_in_generate_route_is_served_unless_turned_off(
    user_flags, expect_on, tiny_model_dir
):
    """verifiers 0.4 environments sample through vLLM's token-in route, which vLLM registers
    only with --enable-scale-out: vf-vllm passes it unless told otherwise."""
    cmd = command(tiny_model_dir, user_flags)
    assert ("--enable-scale-out" in cmd) == expect_on


def command(model_dir, user_flags: list[str], cuda: bool = False) -> list[str]:
    import argparse

    from rlvr.server.launcher import vllm_command

    args = argparse.Namespace(
        model=str(model_dir),
        served_model_name=None,
        host="127.0.0.1",
        port=8000,
        api_key=None,
        weight_transfer_backend="auto",
    )
    return vllm_command(args, user_flags, cuda=cuda)


def flag(cmd: list[str], name: str) -> str | None:
    return cmd[cmd.index(name) + 1] if name in cmd else None


def test_sampling_parity_vllm_ignores_the_models_generation_defaults(tiny_model_dir):
    """vLLM would apply generation_config.json's top_k/top_p/penalties to every request
    otherwise; the trainer's log-probabilities could not follow."""
    assert flag(command(tiny_model_dir, []), "--generation-config") == "vllm"
    mine = command(tiny_model_dir, ["--generation-config", "auto"])
    assert mine.count("--generation-config") == 1 and flag(mine, "--generation-config") == "auto"


def test_workers_get_the_extension_that_reports_their_devices(tiny_model_dir):
    from rlvr.server.launcher import WORKER_EXTENSION
    from rlvr.server.worker_extension import WorkerExtension

    assert flag(command(tiny_model_dir, []), "--worker-extension-cls") == WORKER_EXTENSION
    module, name = WORKER_EXTENSION.rsplit(".", 1)
    assert getattr(__import__(module, fromlist=[name]), name) is WorkerExtension
    info = WorkerExtension().rlvr_device_info()  # no device attribute: not a worker
    assert info["gpu_uuid"] is None and info["host"]


@pytest.mark.parametrize(
    ("workers", "cores", "binding"),
    [(2, [0, 1], "0|1"), (2, [0, 1, 2, 3], "0,1|2,3"), (4, [0, 1], "0|1|0|1"), (1, [5, 7], "5,7")],
)
def test_cpu_workers_get_disjoint_cores(workers, cores, binding):
    """vLLM binds several CPU workers only by NUMA node and refuses more workers than nodes,
    i.e. TP=2 on any single-socket machine; vf-vllm hands out the cores itself."""
    from rlvr.server.launcher import cpu_thread_binding

    assert cpu_thread_binding(workers, cores) == binding


def test_tensor_parallel_cpu_server_binds_its_workers(monkeypatch):
    from rlvr.server.launcher import engine_env, local_workers

    monkeypatch.delenv("VLLM_CPU_OMP_THREADS_BIND", raising=False)
    monkeypatch.delenv("VLLM_ENABLE_V1_MULTIPROCESSING", raising=False)
    assert local_workers(["--tensor-parallel-size", "2", "-pp=2"]) == 4
    assert "VLLM_CPU_OMP_THREADS_BIND" not in engine_env(False, "cpu", workers=1)
    assert engine_env(False, "cpu", workers=1)["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"
    assert "VLLM_ENABLE_V1_MULTIPROCESSING" not in engine_env(False, "cpu", workers=2)
    assert "VLLM_ENABLE_V1_MULTIPROCESSING" not in engine_env(True, "nccl", workers=1)
    assert engine_env(False, "cpu", workers=2)["VLLM_CPU_OMP_THREADS_BIND"].count("|") == 1
    assert "VLLM_CPU_OMP_THREADS_BIND" not in engine_env(True, "nccl", workers=2)
    monkeypatch.setenv("VLLM_CPU_OMP_THREADS_BIND", "nobind")  # the user's choice wins
    assert engine_env(False, "cpu", workers=2)["VLLM_CPU_OMP_THREADS_BIND"] == "nobind"
