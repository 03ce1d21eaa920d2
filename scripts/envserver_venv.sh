#!/usr/bin/env bash
# Builds the side venv a verifiers 0.4 EnvServer runs from (0.4 cannot share .venv: same
# distribution name as our 0.1.14, and it needs openai<3, mcp==2.0.0).
#   scripts/envserver_venv.sh [VENV] [PIP_ARGS...]
# VENV defaults to .venv-envserver; PIP_ARGS (e.g. `-r requirements.txt`, `-e path/to/taskset`)
# default to the offline fixture tasksets. A second run with the same inputs returns at once
# (the stamp records a hash of this script, the arguments and every named file).
# `bin/uv` in the venv is an offline stand-in: 0.4's `null` harness prepares its chat program
# with `uv sync --script`, whose dependencies this venv already holds, so the program runs on
# this venv's python instead of a uv environment fetched from the network.
set -euo pipefail
cd "$(dirname "$0")/.."

VENV=${1:-.venv-envserver}
shift || true
PY=${PYTHON:-$(command -v python3.11 || command -v python3)}
FIXTURES=tests/fixtures/envserver/vf04_fixtures
if [ "$#" -eq 0 ]; then set -- -e "$FIXTURES"; fi

hashed=(scripts/envserver_venv.sh)
for arg in "$@"; do
  if [ -f "$arg" ]; then hashed+=("$arg"); elif [ -f "$arg/pyproject.toml" ]; then hashed+=("$arg/pyproject.toml"); fi
done
want=$({ cat "${hashed[@]}"; printf '%s\n' "$@"; } | sha256sum | cut -d' ' -f1)
stamp="$VENV/.rlvr-envserver-stamp"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && [ -x "$VENV/bin/python" ]; then
  exit 0
fi

echo "[envserver-venv] installing verifiers==0.4.0 into $VENV" >&2
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
"$VENV/bin/python" -m pip install -q --disable-pip-version-check "verifiers==0.4.0" "$@"
"$VENV/bin/python" -c "import openai, mcp, httpx, httpx2, tenacity, certifi, verifiers.v1.serve"
cat > "$VENV/bin/uv" <<'SHIM'
#!/bin/sh
# Offline stand-in for the two uv calls verifiers 0.4 makes to prepare a PEP 723 script.
here=$(cd "$(dirname "$0")" && pwd)
case "$*" in
  *--help*) echo "--script" ;;
  "sync --script"*) exit 0 ;;
  "python find --script"*) echo "$here/python" ;;
  *) echo "uv stand-in (rlvr envserver venv): unsupported: uv $*" >&2; exit 2 ;;
esac
SHIM
chmod +x "$VENV/bin/uv"
echo "$want" > "$stamp"
echo "[envserver-venv] done" >&2
