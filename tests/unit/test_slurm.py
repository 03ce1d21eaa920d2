"""The SLURM job scripts (slurm/*.sbatch) run as sbatch would run them, with stand-ins for
`srun`, `scontrol`, `vf-vllm`, `accelerate` and `curl` on PATH that record how they were
called: each srun task sees its own SLURM_PROCID and node name, as under SLURM, so the test sees
what every node would run: its machine rank, the trainer's world size, the server URL and the
weight-transfer address. The trainer's arguments go through the real config loader."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CONFIG = "configs/examples/deepscaler_zero3.yaml"  # model.name: Qwen/Qwen2.5-7B-Instruct
SFT_CONFIG = "configs/examples/sft_smollm2_cpu.yaml"

# Shared by the stand-ins: SLURM's hostlist expansion and the call log.
FAKE_COMMON = r'''
import json, os, re, sys

def expand(hostlist):
    """gpu[01-03],cpu7 -> gpu01 gpu02 gpu03 cpu7, as `scontrol show hostnames` does."""
    hosts = []
    for prefix, ranges, plain in re.findall(r"([^,\[]+)\[([^\]]+)\]|([^,]+)", hostlist):
        if plain:
            hosts.append(plain)
            continue
        for part in ranges.split(","):
            first, _, last = part.partition("-")
            for i in range(int(first), int(last or first) + 1):
                hosts.append(f"{prefix}{i:0{len(first)}d}")
    return hosts

ENV_KEYS = ["CUDA_VISIBLE_DEVICES", "HF_HOME", "RLVR_CACHE", "NCCL_SOCKET_IFNAME",
            "TRITON_CACHE_DIR", "VLLM_CACHE_ROOT"]

def record(tool, **extra):
    entry = {"tool": tool, "argv": sys.argv[1:], "node": os.environ.get("SLURMD_NODENAME"),
             "procid": os.environ.get("SLURM_PROCID"),
             "env": {k: os.environ.get(k) for k in ENV_KEYS}, **extra}
    with open(os.environ["FAKE_SLURM_LOG"], "a") as f:
        f.write(json.dumps(entry) + "\n")
'''

FAKES = {
    "scontrol": """
assert sys.argv[1:3] == ["show", "hostnames"], sys.argv
record("scontrol")
print("\\n".join(expand(sys.argv[3])))
""",
    # Runs its tasks at once, each with the environment srun gives a task.
    "srun": """
import subprocess
args, options = sys.argv[1:], {}
while args and args[0].startswith("-"):
    key, _, value = args.pop(0).partition("=")
    options[key] = value
nodes = expand(options.get("--nodelist") or os.environ["SLURM_JOB_NODELIST"])
ntasks = int(options.get("--ntasks", len(nodes)))
record("srun", options=options, command=args)
import signal
procs = []
signal.signal(signal.SIGTERM, lambda *_: [p.terminate() for p in procs])
procs += [
    subprocess.Popen(args, env={**os.environ, "SLURM_PROCID": str(task), "SLURM_NODEID":
                     str(task), "SLURMD_NODENAME": nodes[task], "SLURM_NTASKS": str(ntasks)})
    for task in range(ntasks)
]
sys.exit(max(p.wait() for p in procs))
""",
    # Serves until stopped, and says it was stopped.
    "vf-vllm": """
import signal, time
def stop(*_):
    record("vf-vllm", stopped=True)
    sys.exit(0)
signal.signal(signal.SIGTERM, stop)
record("vf-vllm")
time.sleep(120)
""",
    "accelerate": 'record("accelerate")',
    # Answers once the server is up (has logged its start), as a health check would; the job's
    # background server step thus always comes first in the log, and is stoppable by then.
    "curl": """
import time
for _ in range(300):
    log = os.environ["FAKE_SLURM_LOG"]
    if os.path.exists(log) and any(json.loads(line)["tool"] == "vf-vllm" for line in open(log)):
        record("curl")
        sys.exit(0)
    time.sleep(0.1)
sys.exit(7)
""",
}


@pytest.fixture
def slurm(tmp_path: Path):
    """Run a job script under the stand-ins: slurm(script, *args, **env) -> (process, calls)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "fake_common.py").write_text(FAKE_COMMON)
    for name, body in FAKES.items():
        path = bin_dir / name
        path.write_text(
            f"#!{sys.executable}\nimport sys\nsys.path.insert(0, {str(bin_dir)!r})\n"
            f"from fake_common import *\n{body}"
        )
        path.chmod(0o755)
    log = tmp_path / "calls.jsonl"
    base = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM", "HF_", "RLVR_"))}
    base.pop("CUDA_VISIBLE_DEVICES", None)
    base.update(
        PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
        FAKE_SLURM_LOG=str(log),
        SLURM_SUBMIT_DIR=str(ROOT),
        SLURM_JOB_ID="4242",
        RLVR_VENV="",  # the stand-ins, not the checkout's venv, must be found on PATH
        PYTHON=sys.executable,
        PYTHONPATH=os.environ.get("PYTHONPATH", ""),
        LOG_DIR=str(tmp_path / "logs"),
    )

    def run(script: str, *args: str, **env: str):
        proc = subprocess.run(
            ["bash", str(ROOT / "slurm" / script), *args],
            env={**base, **env},
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=120,
        )
        calls = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
        log.unlink(missing_ok=True)
        return proc, calls

    return run


def option(argv: list[str], flag: str) -> str:
    return argv[argv.index(flag) + 1]


def of(calls: list[dict], tool: str) -> list[dict]:
    return [c for c in calls if c["tool"] == tool]


def test_slurm_multinode_puts_the_server_first_and_ranks_each_trainer_node(slurm, tmp_path):
    proc, calls = slurm(
        "train_multinode.sbatch",
        "--config",
        CONFIG,
        "optim.lr=2e-5",
        SLURM_JOB_NODELIST="gpu[01-03]",
        SLURM_GPUS_ON_NODE="4",
        NCCL_SOCKET_IFNAME="ib0",
    )
    assert proc.returncode == 0, proc.stderr

    (server, stopped) = of(calls, "vf-vllm")
    assert server["node"] == "gpu01" and stopped["stopped"]  # stopped when training ended
    argv = server["argv"]
    assert option(argv, "--model") == "Qwen/Qwen2.5-7B-Instruct"  # the config's model.name
    assert (option(argv, "--host"), option(argv, "--port")) == ("0.0.0.0", "8000")
    assert (option(argv, "--tensor-parallel-size"), option(argv, "--data-parallel-size")) == (
        "1",
        "4",
    )
    assert [c["argv"][-1] for c in of(calls, "curl")] == ["http://gpu01:8000/v1/models"]

    trainers = sorted(of(calls, "accelerate"), key=lambda c: c["procid"])
    assert [(t["node"], option(t["argv"], "--machine_rank")) for t in trainers] == [
        ("gpu02", "0"),
        ("gpu03", "1"),
    ]
    for trainer in trainers:
        argv = trainer["argv"]
        assert argv[0] == "launch" and option(argv, "--config_file") == "configs/zero3.yaml"
        assert option(argv, "--num_machines") == "2"
        assert option(argv, "--num_processes") == "8"  # 2 nodes x 4 GPUs
        assert option(argv, "--main_process_ip") == "gpu02"
        assert option(argv, "--main_process_port") == "29500"
        assert option(argv, "--rdzv_backend") == "c10d"
        assert option(argv, "--deepspeed_multinode_launcher") == "standard"
        script = argv.index("scripts/train.py")
        assert argv[script + 1 :] == [
            "--config",
            CONFIG,
            "optim.lr=2e-5",
            "model.name=Qwen/Qwen2.5-7B-Instruct",
            "server.base_url=http://gpu01:8000/v1",
            "server.transfer_host=gpu02",
        ]
        # shared caches under the checkout, compile caches node-local, NCCL settings passed on
        assert trainer["env"]["HF_HOME"] == str(ROOT / ".cache" / "huggingface")
        assert trainer["env"]["RLVR_CACHE"] == str(ROOT / ".cache" / "rlvr")
        assert trainer["env"]["TRITON_CACHE_DIR"].startswith("/tmp/")
        assert trainer["env"]["NCCL_SOCKET_IFNAME"] == "ib0"
    assert server["env"]["HF_HOME"] == trainers[0]["env"]["HF_HOME"]
    # Found by node list: which step is the server's is what matters, not the log's order.
    steps = {c["options"]["--nodelist"]: c for c in of(calls, "srun")}
    assert steps.keys() == {"gpu01", "gpu02,gpu03"}
    assert steps["gpu01"]["options"] == {"--nodes": "1", "--ntasks": "1", "--nodelist": "gpu01"}
    assert steps["gpu02,gpu03"]["command"][:2] == ["bash", "-c"]  # the rank is expanded per task


def test_slurm_multinode_settings_reach_server_and_trainers(slurm):
    proc, calls = slurm(
        "train_multinode.sbatch",
        "--config",
        CONFIG,
        SLURM_JOB_NODELIST="n1,n2",
        GPUS_PER_NODE="8",
        SERVER_TP="2",
        SERVER_DP="2",
        MODEL="org/other",
        TRANSFER_HOST="10.1.0.2",
        SERVER_PORT="8100",
        VLLM_ARGS="--max-model-len 8192",
    )
    assert proc.returncode == 0, proc.stderr
    server = of(calls, "vf-vllm")[0]["argv"]
    assert option(server, "--model") == "org/other" and option(server, "--port") == "8100"
    assert server[-2:] == ["--max-model-len", "8192"]
    assert option(server, "--tensor-parallel-size") == "2"
    (trainer,) = of(calls, "accelerate")
    assert option(trainer["argv"], "--num_processes") == "8"
    assert trainer["argv"][-3:] == [
        "model.name=org/other",
        "server.base_url=http://n1:8100/v1",
        "server.transfer_host=10.1.0.2",
    ]


def test_slurm_multinode_runs_a_server_on_each_inference_node(slurm):
    """SERVER_NODES=2: a vf-vllm on each of the first two nodes, each waited for and stopped;
    the trainers on the others get both as server.base_urls."""
    proc, calls = slurm(
        "train_multinode.sbatch",
        "--config",
        CONFIG,
        SLURM_JOB_NODELIST="gpu[01-04]",
        GPUS_PER_NODE="4",
        SERVER_NODES="2",
    )
    assert proc.returncode == 0, proc.stderr
    servers = [c for c in of(calls, "vf-vllm") if not c.get("stopped")]
    assert sorted(s["node"] for s in servers) == ["gpu01", "gpu02"]
    assert len([c for c in of(calls, "vf-vllm") if c.get("stopped")]) == 2
    urls = ["http://gpu01:8000/v1", "http://gpu02:8000/v1"]
    assert sorted(c["argv"][-1] for c in of(calls, "curl")) == [f"{u}/models" for u in urls]
    trainers = sorted(of(calls, "accelerate"), key=lambda c: c["procid"])
    assert [t["node"] for t in trainers] == ["gpu03", "gpu04"]
    for trainer in trainers:
        assert option(trainer["argv"], "--num_processes") == "8"
        assert trainer["argv"][-2:] == [
            f"server.base_urls=[{','.join(urls)}]",
            "server.transfer_host=gpu03",
        ]


TWO_NODES = {"SLURM_JOB_NODELIST": "gpu[01-02]", "GPUS_PER_NODE": "4"}


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({**TWO_NODES, "SLURM_JOB_NODELIST": "gpu01"}, "this job needs at least 2 nodes"),
        ({**TWO_NODES, "SERVER_NODES": "2"}, "this job needs at least 3 nodes (vf-vllm on 2,"),
        ({"SLURM_JOB_NODELIST": "gpu[01-02]"}, "no GPU count: submit with --gpus-per-node"),
        ({**TWO_NODES, "GPUS_PER_NODE": "four"}, "GPUS_PER_NODE='four' is not a whole number"),
        ({**TWO_NODES, "GPUS_PER_NODE": "0"}, "GPUS_PER_NODE=0 must be at least 1"),
        ({**TWO_NODES, "SERVER_TP": "8"}, "SERVER_TP=8 is more than the server's 4 GPUs"),
        ({**TWO_NODES, "SERVER_DP": "8"}, "SERVER_TP x SERVER_DP = 1 x 8 needs more than the"),
        ({**TWO_NODES, "SERVER_PORT": "http"}, "SERVER_PORT='http' is not a whole number"),
        ({"GPUS_PER_NODE": "4"}, "SLURM_JOB_NODELIST is not set: submit this script with sbatch"),
        ({**TWO_NODES, "RLVR_VENV": "/nowhere"}, "RLVR_VENV=/nowhere has no bin/activate"),
    ],
)
def test_slurm_multinode_refuses_bad_input_before_starting_anything(slurm, env, message):
    proc, calls = slurm("train_multinode.sbatch", "--config", CONFIG, **env)
    assert proc.returncode == 2 and f"rlvr-slurm: error: {message}" in proc.stderr
    assert not of(calls, "srun") and not of(calls, "vf-vllm")


def test_slurm_rejects_a_bad_trainer_option_before_starting_anything(slurm):
    proc, calls = slurm("train_multinode.sbatch", "--config", CONFIG, "optim.lrr=1", **TWO_NODES)
    assert proc.returncode != 0 and "config error:" in proc.stderr and "optim.lrr" in proc.stderr
    assert not of(calls, "srun")


@pytest.mark.slow
def test_slurm_server_that_dies_stops_the_job_with_its_log(slurm, tmp_path):
    bin_dir = tmp_path / "bin"
    (bin_dir / "curl").write_text("#!/bin/sh\nexit 7\n")  # never ready
    (bin_dir / "vf-vllm").write_text("#!/bin/sh\necho 'CUDA out of memory'\nexit 1\n")
    proc, calls = slurm("train_multinode.sbatch", "--config", CONFIG, **TWO_NODES)
    assert proc.returncode == 2 and "vf-vllm exited before serving" in proc.stderr
    assert "CUDA out of memory" in proc.stderr and not of(calls, "accelerate")


def test_slurm_single_node_splits_the_visible_gpus(slurm):
    proc, calls = slurm(
        "train_single_node.sbatch",
        "--config",
        CONFIG,
        SLURM_JOB_NODELIST="gpu07",
        GPUS_PER_NODE="4",
        CUDA_VISIBLE_DEVICES="4,5,6,7",
        SERVER_GPUS="1",
    )
    assert proc.returncode == 0, proc.stderr
    server, stopped = of(calls, "vf-vllm")
    assert server["env"]["CUDA_VISIBLE_DEVICES"] == "4" and stopped["stopped"]
    assert option(server["argv"], "--data-parallel-size") == "1"
    assert "--host" not in server["argv"]  # vf-vllm's default: 127.0.0.1
    (trainer,) = of(calls, "accelerate")
    assert trainer["env"]["CUDA_VISIBLE_DEVICES"] == "5,6,7"
    assert option(trainer["argv"], "--num_processes") == "3"
    assert trainer["argv"][-2:] == [
        "server.base_url=http://127.0.0.1:8000/v1",
        "server.transfer_host=127.0.0.1",
    ]
    assert not of(calls, "srun")
    proc, _ = slurm(
        "train_single_node.sbatch",
        "--config",
        CONFIG,
        SLURM_JOB_NODELIST="gpu[07-08]",
        GPUS_PER_NODE="4",
    )
    assert proc.returncode == 2 and "this job runs on 1 node, got 2" in proc.stderr
    proc, _ = slurm(
        "train_single_node.sbatch",
        "--config",
        CONFIG,
        SLURM_JOB_NODELIST="gpu07",
        GPUS_PER_NODE="2",
        SERVER_GPUS="2",
    )
    assert proc.returncode == 2 and "SERVER_GPUS=2 leaves none of the node's 2 GPUs" in proc.stderr


def test_slurm_sft_trains_on_every_node(slurm):
    proc, calls = slurm(
        "sft.sbatch",
        "--config",
        SFT_CONFIG,
        "train.max_steps=10",
        SLURM_JOB_NODELIST="gpu[01-02]",
        SLURM_GPUS_PER_NODE="h100:8",
    )
    assert proc.returncode == 0, proc.stderr
    assert not of(calls, "vf-vllm")
    trainers = sorted(of(calls, "accelerate"), key=lambda c: c["procid"])
    assert [(t["node"], option(t["argv"], "--machine_rank")) for t in trainers] == [
        ("gpu01", "0"),
        ("gpu02", "1"),
    ]
    for trainer in trainers:
        argv = trainer["argv"]
        assert option(argv, "--num_processes") == "16" and option(argv, "--num_machines") == "2"
        assert option(argv, "--main_process_ip") == "gpu01"
        assert argv[argv.index("scripts/sft.py") + 1 :] == [
            "--config",
            SFT_CONFIG,
            "train.max_steps=10",
        ]
    proc, calls = slurm(
        "sft.sbatch",
        "--config",
        SFT_CONFIG,
        "train.epochs=0",
        SLURM_JOB_NODELIST="gpu01",
        GPUS_PER_NODE="1",
    )
    assert proc.returncode != 0 and "config error: train.epochs=0" in proc.stderr
