# Shared by the rlvr SLURM job scripts (sourced, not run): input checks, the node list, the
# environment every node needs, and starting/waiting for vf-vllm. Settings come from the
# environment (sbatch exports the submitting shell's variables); docs/scaling.md, "Multi-node
# training (SLURM)", lists all of them.

die() {
    echo "rlvr-slurm: error: $*" >&2
    exit 2
}

log() {
    echo "rlvr-slurm: $*" >&2
}

# require_int NAME VALUE MIN: VALUE must be an integer >= MIN, else a clear error naming NAME.
require_int() {
    local name=$1 value=$2 min=$3
    [[ $value =~ ^[0-9]+$ ]] || die "$name=${value@Q} is not a whole number"
    ((value >= min)) || die "$name=$value must be at least $min"
}

# The job's nodes, one hostname per line, in SLURM's order (the first runs the batch script).
job_nodes() {
    [[ -n ${SLURM_JOB_NODELIST:-} ]] || die "SLURM_JOB_NODELIST is not set: submit this script with sbatch"
    scontrol show hostnames "$SLURM_JOB_NODELIST"
}

# GPUs per node: GPUS_PER_NODE if set, else what SLURM granted (--gpus-per-node / --gres).
gpus_per_node() {
    local gpus=${GPUS_PER_NODE:-${SLURM_GPUS_ON_NODE:-${SLURM_GPUS_PER_NODE:-}}}
    gpus=${gpus##*:}  # "h100:8" -> "8"
    [[ -n $gpus ]] || die "no GPU count: submit with --gpus-per-node=N or set GPUS_PER_NODE"
    require_int GPUS_PER_NODE "$gpus" 1
    echo "$gpus"
}

# Enter the checkout, activate its virtualenv and point every cache at the right filesystem.
setup_environment() {
    RLVR_ROOT=${RLVR_ROOT:-${SLURM_SUBMIT_DIR:-$PWD}}
    [[ -f $RLVR_ROOT/scripts/train.py ]] || die "RLVR_ROOT=$RLVR_ROOT is not an rlvr checkout (no scripts/train.py)"
    cd "$RLVR_ROOT" || die "cannot enter RLVR_ROOT=$RLVR_ROOT"
    RLVR_VENV=${RLVR_VENV-$RLVR_ROOT/.venv}
    if [[ -n $RLVR_VENV ]]; then
        [[ -f $RLVR_VENV/bin/activate ]] || die "RLVR_VENV=$RLVR_VENV has no bin/activate (set RLVR_VENV= to use PATH as is)"
        # shellcheck disable=SC1091
        source "$RLVR_VENV/bin/activate"
    fi
    PYTHON=${PYTHON:-python}
    # Shared filesystem: every node must see the same model downloads and the embedded model's
    # one-time conversion, so nothing is fetched or converted once per node.
    export HF_HOME=${HF_HOME:-$RLVR_ROOT/.cache/huggingface}
    export RLVR_CACHE=${RLVR_CACHE:-$RLVR_ROOT/.cache/rlvr}
    # Node-local: compile caches are written concurrently by every process of a node and lock
    # badly on network filesystems.
    local scratch=${RLVR_NODE_SCRATCH:-/tmp/rlvr-${USER:-user}}
    export TRITON_CACHE_DIR=${TRITON_CACHE_DIR:-$scratch/triton}
    export TORCHINDUCTOR_CACHE_DIR=${TORCHINDUCTOR_CACHE_DIR:-$scratch/inductor}
    export VLLM_CACHE_ROOT=${VLLM_CACHE_ROOT:-$scratch/vllm}
    export NCCL_DEBUG=${NCCL_DEBUG:-WARN}
    # NCCL_SOCKET_IFNAME, GLOO_SOCKET_IFNAME, NCCL_IB_HCA ... pass through when set.
    LOG_DIR=${LOG_DIR:-$RLVR_ROOT/logs}
    mkdir -p "$LOG_DIR"
}

# Validate the trainer's command line with the trainer's own config loader before any node
# starts, and print the model it trains (which the server must serve).
# usage: config_model CONFIG_CLASS ARGS...   (CONFIG_CLASS: Config or SFTConfig)
config_model() {
    local cls=$1
    shift
    "$PYTHON" -c '
import sys
from rlvr import config
from rlvr.config.cli import config_from_argv
print(config_from_argv(sys.argv[2:], getattr(config, sys.argv[1])).model.name)
' "$cls" "$@"
}

# server_parallelism GPUS: SERVER_TP (default 1) and SERVER_DP (default: as many replicas as
# GPUS holds) for vf-vllm, checked to fit in GPUS.
server_parallelism() {
    local gpus=$1
    SERVER_TP=${SERVER_TP:-1}
    require_int SERVER_TP "$SERVER_TP" 1
    ((SERVER_TP <= gpus)) || die "SERVER_TP=$SERVER_TP is more than the server's $gpus GPUs"
    SERVER_DP=${SERVER_DP:-$((gpus / SERVER_TP))}
    require_int SERVER_DP "$SERVER_DP" 1
    ((SERVER_TP * SERVER_DP <= gpus)) ||
        die "SERVER_TP x SERVER_DP = $SERVER_TP x $SERVER_DP needs more than the server's $gpus GPUs"
}

# Ports: SERVER_PORT (vf-vllm, default 8000) and MASTER_PORT (the trainer's rendezvous, 29500).
check_ports() {
    SERVER_PORT=${SERVER_PORT:-8000}
    MASTER_PORT=${MASTER_PORT:-29500}
    require_int SERVER_PORT "$SERVER_PORT" 1
    require_int MASTER_PORT "$MASTER_PORT" 1
    export SERVER_PORT MASTER_PORT
}

# launch_trainers SCRIPT ARGS...: one srun task per node of TRAIN_NODES (an array), each
# starting `accelerate launch` for GPUS processes on its node. The machine rank is the task's
# SLURM_PROCID, expanded inside the task (in single quotes here), so every node gets its own.
# Node 0 of TRAIN_NODES is the rendezvous host (MASTER_ADDR, MASTER_PORT).
# shellcheck disable=SC2016,SC2153  # the task's shell expands the quoted variables; GPUS is the job's
launch_trainers() {
    export TRAIN_SCRIPT=$1
    shift
    export NUM_TRAIN_NODES=${#TRAIN_NODES[@]}
    export TRAIN_WORLD_SIZE=$((NUM_TRAIN_NODES * GPUS))
    export MASTER_ADDR=${TRAIN_NODES[0]}
    export ACCELERATE_CONFIG=${ACCELERATE_CONFIG:-configs/zero3.yaml}
    local nodelist
    nodelist=$(IFS=,; echo "${TRAIN_NODES[*]}")
    log "training on $nodelist: $NUM_TRAIN_NODES x $GPUS = $TRAIN_WORLD_SIZE processes, $TRAIN_SCRIPT"
    srun --nodes="$NUM_TRAIN_NODES" --ntasks="$NUM_TRAIN_NODES" --ntasks-per-node=1 \
        --nodelist="$nodelist" bash -c '
        exec accelerate launch --config_file "$ACCELERATE_CONFIG" \
            --num_machines "$NUM_TRAIN_NODES" --num_processes "$TRAIN_WORLD_SIZE" \
            --machine_rank "$SLURM_PROCID" --main_process_ip "$MASTER_ADDR" \
            --main_process_port "$MASTER_PORT" --rdzv_backend c10d \
            --deepspeed_multinode_launcher standard \
            "$TRAIN_SCRIPT" "$@"
    ' rlvr-train "$@"
}

# start_server ARGS...: a vf-vllm in the background with ARGS (srun ... or a plain command
# prefix included), its log vf-vllm-<job>.log (vf-vllm-<job>-<SERVER_LABEL>.log when that is
# set, one per server of a job with several). Every server started is stopped on exit.
SERVER_PIDS=()
SERVER_LOGS=()
start_server() {
    local log_file=$LOG_DIR/vf-vllm-${SLURM_JOB_ID:-local}${SERVER_LABEL:+-$SERVER_LABEL}.log
    log "starting vf-vllm (log: $log_file): $*"
    "$@" >"$log_file" 2>&1 &
    SERVER_PIDS+=($!)
    SERVER_LOGS+=("$log_file")
    trap stop_server EXIT
}

stop_server() {
    local pid
    for pid in "${SERVER_PIDS[@]}"; do
        if kill -0 "$pid" 2>/dev/null; then
            log "stopping vf-vllm"
            kill -TERM "$pid" 2>/dev/null || true
            wait "$pid" 2>/dev/null || true
        fi
    done
}

# wait_for_server URL [I]: until URL/models answers; fails if server I (default: the last
# started) exits or SERVER_TIMEOUT seconds (default 1800) pass.
wait_for_server() {
    local url=$1 i=${2:-$((${#SERVER_PIDS[@]} - 1))} waited=0 timeout=${SERVER_TIMEOUT:-1800}
    local pid=${SERVER_PIDS[$i]} log_file=${SERVER_LOGS[$i]}
    require_int SERVER_TIMEOUT "$timeout" 1
    until curl -sf -o /dev/null "$url/models"; do
        if ! kill -0 "$pid" 2>/dev/null; then
            tail -n 40 "$log_file" >&2 || true
            die "vf-vllm exited before serving (log above: $log_file)"
        fi
        ((waited < timeout)) || die "vf-vllm not serving at $url after ${timeout}s (log: $log_file)"
        sleep 10
        waited=$((waited + 10))
    done
    log "vf-vllm serving at $url"
}
