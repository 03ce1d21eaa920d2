"""vf-vllm as users run it: our launcher, clear start-up errors, and no orphaned engines."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

VF_VLLM = str(Path(sys.executable).with_name("vf-vllm"))


def engine_processes(marker: str) -> list[str]:
    """API-server processes whose command line carries one test's unique served-model-name."""
    out = subprocess.run(["pgrep", "-af", marker], capture_output=True, text=True).stdout
    return [line for line in out.splitlines() if "pgrep" not in line]


def alive(pids: list[int]) -> list[int]:
    import psutil

    def running(pid: int) -> bool:
        try:
            return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return False

    return [p for p in pids if running(p)]


def gone_within(seconds: float, still_there: Callable[[], list]) -> list:
    """Poll until nothing is left (killed processes holding much memory take a while to go)."""
    deadline = time.monotonic() + seconds
    while (left := still_there()) and time.monotonic() < deadline:
        time.sleep(0.2)
    return left


def run_launcher(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([VF_VLLM, *args], capture_output=True, text=True, timeout=timeout)


def test_vf_vllm_on_path_is_ours_not_verifiers_shim():
    result = run_launcher("--help", timeout=60)
    assert result.returncode == 0
    assert "rlvr's vf-vllm" in result.stdout
    assert "--weight-transfer-backend" in result.stdout


def test_missing_model_path_fails_fast_with_a_clear_error(tmp_path):
    result = run_launcher("--model", str(tmp_path / "no-such-model"), timeout=60)
    assert result.returncode == 2
    assert "does not exist" in result.stderr
    assert "Traceback" not in result.stderr


def test_port_in_use_is_reported(tiny_model_dir):
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        result = run_launcher("--model", str(tiny_model_dir), "--port", str(port), timeout=60)
    assert result.returncode == 2
    assert f"port {port}" in result.stderr and "already in use" in result.stderr


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


@pytest.mark.integration
def test_engine_failure_shows_log_tail_and_leaves_nothing_running(tiny_model_dir, tmp_path):
    # A model directory whose weights file is corrupt passes our checks but kills the engine.
    broken = tmp_path / "broken"
    shutil.copytree(tiny_model_dir, broken)
    (broken / "model.safetensors").write_bytes(b"not a safetensors file")
    from rlvr.weight_sync.rendezvous import free_port

    marker = f"broken-{uuid.uuid4().hex[:8]}"
    port = str(free_port())
    result = run_launcher(
        "--model", str(broken), "--served-model-name", marker, "--enforce-eager", "--port", port
    )
    assert result.returncode == 2
    assert "exited with code" in result.stderr
    assert "last engine log lines" in result.stderr
    assert gone_within(30, lambda: engine_processes(marker)) == []


@contextlib.contextmanager
def served_launcher(
    model_dir: Path, marker: str, log_path: Path
) -> Iterator[tuple[subprocess.Popen, int]]:
    """vf-vllm started as a user starts it, serving `marker` (a name unique to the test), once
    it serves: (its process, its port). The launcher, if still running, is SIGKILLed at the end."""
    from rlvr.weight_sync.rendezvous import free_port

    port = free_port()
    with open(log_path, "w") as log:
        proc = subprocess.Popen(
            [VF_VLLM, "--model", str(model_dir), "--served-model-name", marker,
             "--port", str(port), "--enforce-eager", "--dtype", "float32"],
            stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip
    try:
        deadline = time.monotonic() + 300
        while "vf-vllm: serving" not in log_path.read_text():
            assert proc.poll() is None, log_path.read_text()[-3000:]
            assert time.monotonic() < deadline, "server did not come up"
            time.sleep(1)
        assert f"http://127.0.0.1:{port}/v1" in log_path.read_text()
        yield proc, port
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
        proc.wait()


def engine_tree(launcher: subprocess.Popen, marker: str) -> list[int]:
    """The API server, the engine core and its workers: every descendant of the launcher."""
    import psutil

    tree = [p.pid for p in psutil.Process(launcher.pid).children(recursive=True)]
    assert len(tree) >= 2 and engine_processes(marker), tree
    return tree


def port_free(port: int) -> bool:
    from rlvr.server.launcher import port_in_use

    return not port_in_use("127.0.0.1", port)


@pytest.mark.integration
@pytest.mark.slow
def test_sigint_stops_the_whole_engine_tree(tiny_model_dir, tmp_path):
    marker = f"sigint-{uuid.uuid4().hex[:8]}"
    with served_launcher(tiny_model_dir, marker, tmp_path / "log.txt") as (proc, _):
        tree = engine_tree(proc, marker)
        proc.send_signal(signal.SIGINT)
        proc.wait(60)
        assert gone_within(30, lambda: alive(tree)) == []


@pytest.mark.integration
@pytest.mark.slow
def test_vf_vllm_sigkill_leaves_no_orphans(tiny_model_dir, tmp_path):
    """A SIGKILLed launcher cannot clean up: its API server's parent-death signal and its
    watchdog stop vLLM's whole process group, and the port is free again within seconds."""
    marker = f"sigkill-{uuid.uuid4().hex[:8]}"
    with served_launcher(tiny_model_dir, marker, tmp_path / "log.txt") as (proc, port):
        tree = engine_tree(proc, marker)
        assert not port_free(port)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
        # the tree holds the watchdog too: it exits once the group is gone
        assert gone_within(20, lambda: alive(tree) + [port] * (not port_free(port))) == []
        assert engine_processes(marker) == []


@pytest.mark.integration
def test_concurrent_seeded_long_prompts_do_not_kill_the_cpu_engine(tiny_server):
    """More prompt tokens at once than one engine step takes: with chunked prefill (vLLM's
    default) the engine split them, rewound a CPU generator and died. The launcher turns
    chunking off on CPU, so seeded requests (the trainer's default) are safe, and a seed
    still fixes the sample."""
    import asyncio

    import httpx
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_server.model_dir)
    prompts = [f"{i} " + "the fox runs far " * 300 for i in range(12)]
    assert sum(len(tokenizer(p)["input_ids"]) for p in prompts) > 4 * 4096

    async def complete(client: httpx.AsyncClient, prompt: str, seed: int) -> str:
        body = {
            "model": tiny_server.model,
            "prompt": prompt,
            "max_tokens": 8,
            "min_tokens": 8,
            "temperature": 1.0,
            "seed": seed,
        }
        response = await client.post(f"{tiny_server.base_url}/completions", json=body)
        response.raise_for_status()
        return response.json()["choices"][0]["text"]

    async def run_all() -> list[str]:
        async with httpx.AsyncClient(timeout=300) as client:
            requests = [complete(client, p, seed=i) for i, p in enumerate(prompts)]
            return await asyncio.gather(*requests, complete(client, prompts[0], seed=0))

    texts = asyncio.run(run_all())
    assert texts[-1] == texts[0]
    assert httpx.get(f"{tiny_server.root_url}/health", timeout=10).status_code == 200


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
    assert local_workers(["--tensor-parallel-size", "2", "-pp=2"]) == 4
    assert "VLLM_CPU_OMP_THREADS_BIND" not in engine_env(False, "cpu", workers=1)
    assert engine_env(False, "cpu", workers=2)["VLLM_CPU_OMP_THREADS_BIND"].count("|") == 1
    assert "VLLM_CPU_OMP_THREADS_BIND" not in engine_env(True, "nccl", workers=2)
    monkeypatch.setenv("VLLM_CPU_OMP_THREADS_BIND", "nobind")  # the user's choice wins
    assert engine_env(False, "cpu", workers=2)["VLLM_CPU_OMP_THREADS_BIND"] == "nobind"
