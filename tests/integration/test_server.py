"""vf-vllm as users run it: our launcher, clear start-up errors, and no orphaned engines."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from unit.server.test_server import VF_VLLM, run_launcher


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
            [
                VF_VLLM,
                "--model",
                str(model_dir),
                "--served-model-name",
                marker,
                "--port",
                str(port),
                "--enforce-eager",
                "--dtype",
                "float32",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
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
