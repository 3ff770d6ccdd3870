#!/usr/bin/env bash
# Python package (the wheel with the native library inside) + real Mooncake Store
# (loopback, TCP) tests.
#
#   bash .ci/python.sh [extra pytest args]
#
# 1. installs libibverbs1 if missing (the Mooncake wheel links it; no RDMA is used);
# 2. builds the wheel: `pip wheel ./python` (setuptools-rust runs cargo on the crate
#    at the repository root and puts the .so inside the package);
# 3. creates a FRESH venv (default: a temporary one; MWS_VENV names another path,
#    which is deleted and recreated) and
#    installs the wheel, the pinned Mooncake wheel, pytest, numpy, ml-dtypes,
#    safetensors and the pinned torch into it. torch: PyPI's Linux wheel and its
#    CUDA library wheels (about 2.8 GB of wheels, 5.2 GB installed; the tests use CPU
#    tensors, but PyPI has no CPU-only build, download.pytorch.org's CPU wheels are
#    out of CI's reach (package registries only), and torch does not import
#    without those libraries). The wheels are kept in MWS_TORCH_WHEELS (default
#    ~/.cache/mooncake-weight-store/torch-wheels/<version>): installed offline from
#    there when it holds a complete set, else downloaded into a new directory that
#    replaces it, so a lost, partial or stale cache costs one download, never a
#    wrong install;
# 4. starts mooncake_master on free loopback ports (stopped by PID on every exit);
# 5. runs pytest on a copy of python/tests in a temporary directory, against the
#    installed wheel: no MWS_LIBRARY, no repository checkout on sys.path
#    (MOONCAKE_MASTER=127.0.0.1:<port>, MWS_EXPECT_INSTALLED_WHEEL=1,
#    MWS_REQUIRE_TORCH=1: a torch test that would skip fails);
# 6. runs the examples in examples/python with the installed wheel.
# pytest exit 5 ("no tests collected") is a failure.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD

MOONCAKE_WHEEL="mooncake-transfer-engine-non-cuda==0.3.13.post1"
TEST_DEPS=("pytest>=7" "numpy>=1.22" "ml-dtypes>=0.3" "safetensors>=0.4")
TORCH_VERSION="2.15.0"
TORCH_CACHE_ROOT="${XDG_CACHE_HOME:-$HOME/.cache}/mooncake-weight-store/torch-wheels"
TORCH_WHEELS=${MWS_TORCH_WHEELS:-$TORCH_CACHE_ROOT/$TORCH_VERSION}
TORCH_PARTIAL=""
PY=${PYTHON:-python3}
LOG_DIR=${MWS_CI_LOG_DIR:-$(mktemp -d "${TMPDIR:-/tmp}/mws-python-ci.XXXXXX")}
WORK_DIR=$(mktemp -d "${TMPDIR:-/tmp}/mws-python-run.XXXXXX")
VENV=${MWS_VENV:-$WORK_DIR/venv}
MASTER_LOG="$LOG_DIR/mooncake_master.log"
MC_MASTER_PID=""
unset MWS_LIBRARY MWS_PREFIX PYTHONPATH

log() { printf '== %s\n' "$*"; }

cleanup() {
  local rc=$?
  if [[ -n "$MC_MASTER_PID" ]] && kill -0 "$MC_MASTER_PID" 2>/dev/null; then
    kill "$MC_MASTER_PID" 2>/dev/null || true
    for _ in $(seq 1 50); do kill -0 "$MC_MASTER_PID" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$MC_MASTER_PID" 2>/dev/null || true
    wait "$MC_MASTER_PID" 2>/dev/null || true
  fi
  if [[ $rc -ne 0 && -s "$MASTER_LOG" ]]; then
    echo "---- last lines of $MASTER_LOG"; tail -n 30 "$MASTER_LOG" || true
  fi
  rm -rf "$WORK_DIR"
  [[ -z "$TORCH_PARTIAL" ]] || rm -rf "$TORCH_PARTIAL"
  exit $rc
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# -- 1. system library -----------------------------------------------------------
if ! ldconfig -p 2>/dev/null | grep -q 'libibverbs\.so\.1 '; then
  log "installing libibverbs1"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends libibverbs1 >/dev/null
fi

# -- 2. wheel ----------------------------------------------------------------------
if ! "$PY" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))'; then
  echo "error: $PY is not CPython 3.11 (the Mooncake wheel is cp311); set PYTHON=python3.11" >&2
  exit 1
fi
WHEEL_DIR="$WORK_DIR/wheelhouse"
log "pip wheel ./python (cargo build of the crate inside)"
"$PY" -m pip wheel -q --disable-pip-version-check --no-deps -w "$WHEEL_DIR" ./python
rm -rf python/build python/mooncake_weight_store.egg-info  # setuptools leftovers in the source tree
WHEEL=$(ls "$WHEEL_DIR"/mooncake_weight_store-*.whl)
"$PY" - "$WHEEL" <<'PYEOF'
import sys, zipfile
whl = sys.argv[1]
names = zipfile.ZipFile(whl).namelist()
libs = [n for n in names if n.startswith("mooncake_weight_store/libmooncake_weight_store") and n.endswith(".so")]
assert libs, f"{whl}: no native library inside: {names}"
assert "-py3-none-linux_" in whl.rsplit("/", 1)[-1], f"unexpected wheel tag: {whl}"
print(f"== wheel {whl.rsplit('/', 1)[-1]}: {libs[0]}")
PYEOF

# -- 3. fresh venv ------------------------------------------------------------------
log "creating $VENV"
rm -rf "$VENV"
"$PY" -m venv "$VENV"
log "installing the wheel, $MOONCAKE_WHEEL and ${TEST_DEPS[*]}"
"$VENV/bin/python" -m pip install -q --disable-pip-version-check "$WHEEL" "$MOONCAKE_WHEEL" "${TEST_DEPS[@]}"
# torch==$TORCH_VERSION from the wheel cache; pip resolves before it installs, so an
# incomplete cache fails here without installing anything. --no-compile: byte-compiling the
# ~5,800 modules of torch, sympy, networkx, ... is a third of the install; the few the
# tests import compile on first import.
install_torch() {
  "$VENV/bin/python" -m pip install -q --disable-pip-version-check --no-compile --no-index \
    --find-links "$TORCH_WHEELS" "$@" "torch==$TORCH_VERSION"
}
torch_start=$SECONDS
if [[ -d "$TORCH_WHEELS" ]] && install_torch 2>/dev/null; then
  log "torch $TORCH_VERSION installed from the cached wheels in $TORCH_WHEELS ($((SECONDS - torch_start)) s)"
else
  log "downloading torch $TORCH_VERSION and its dependencies into $TORCH_WHEELS (no usable cache)"
  mkdir -p "$(dirname "$TORCH_WHEELS")"
  TORCH_PARTIAL=$(mktemp -d "$TORCH_WHEELS.partial.XXXXXX")
  "$VENV/bin/python" -m pip download -q --disable-pip-version-check --no-cache-dir -d "$TORCH_PARTIAL" \
    "torch==$TORCH_VERSION"
  rm -rf "$TORCH_WHEELS"
  mv "$TORCH_PARTIAL" "$TORCH_WHEELS"
  TORCH_PARTIAL=""
  install_torch --force-reinstall  # over whatever a failed install from the old cache left
  log "torch $TORCH_VERSION downloaded and installed ($((SECONDS - torch_start)) s)"
fi
if [[ -z "${MWS_TORCH_WHEELS:-}" ]]; then
  # the default cache keeps one version: other pins' wheel sets (and their partial downloads) go
  find "$TORCH_CACHE_ROOT" -mindepth 1 -maxdepth 1 ! -name "$TORCH_VERSION*" -exec rm -rf {} + 2>/dev/null || true
fi
"$VENV/bin/python" -c 'import torch; torch.ones(2, dtype=torch.bfloat16).sum(); print("== torch", torch.__version__, "(cuda available:", torch.cuda.is_available(), ")")'

# -- 4. master -------------------------------------------------------------------
free_port() { "$VENV/bin/python" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
MC_RPC_PORT=$(free_port)
MC_METRICS_PORT=$(free_port)
while [[ "$MC_METRICS_PORT" == "$MC_RPC_PORT" ]]; do MC_METRICS_PORT=$(free_port); done
log "starting mooncake_master on 127.0.0.1:$MC_RPC_PORT (log: $MASTER_LOG)"
"$VENV/bin/mooncake_master" \
  --rpc_address=127.0.0.1 --rpc_port="$MC_RPC_PORT" \
  --metrics_host=127.0.0.1 --metrics_port="$MC_METRICS_PORT" \
  --default_kv_lease_ttl=500ms --enable_metric_reporting=false \
  --logtostderr >"$MASTER_LOG" 2>&1 &
MC_MASTER_PID=$!
up=0
for _ in $(seq 1 150); do
  if (exec 3<>"/dev/tcp/127.0.0.1/$MC_RPC_PORT") 2>/dev/null; then up=1; break; fi
  kill -0 "$MC_MASTER_PID" 2>/dev/null || { echo "error: mooncake_master exited" >&2; exit 1; }
  sleep 0.1
done
[[ $up == 1 ]] || { echo "error: mooncake_master did not open port $MC_RPC_PORT" >&2; exit 1; }

# -- 5. tests --------------------------------------------------------------------
export MOONCAKE_MASTER="127.0.0.1:$MC_RPC_PORT" MC_TCP_BIND_ADDRESS=127.0.0.1
export MWS_TEST_LOG_DIR="$LOG_DIR" MWS_REQUIRE_MOONCAKE=1 MWS_EXPECT_INSTALLED_WHEEL=1 MWS_REQUIRE_TORCH=1
export MWS_CONFORMANCE_DIR="${MWS_CONFORMANCE_DIR:-$ROOT/tests/fixtures/conformance}"
export MWS_HEADER="$ROOT/include/mooncake_weight_store.h"
export MWS_EXAMPLES_DIR="$ROOT/examples/python"
RUN_DIR="$WORK_DIR/run"
mkdir -p "$RUN_DIR"
cp -r python/tests "$RUN_DIR/tests"
find "$RUN_DIR/tests" -name __pycache__ -prune -exec rm -rf {} +
printf '[pytest]\n' > "$RUN_DIR/pytest.ini"
log "pytest (a copy of python/tests in $RUN_DIR, against the installed wheel)"
set +e
(cd "$RUN_DIR" && "$VENV/bin/python" -m pytest -q -p no:cacheprovider --rootdir="$RUN_DIR" -c "$RUN_DIR/pytest.ini" tests "$@")
rc=$?
set -e
if [[ $rc -eq 5 ]]; then
  echo "error: pytest collected no tests" >&2
  exit 1
fi
[[ $rc -eq 0 ]] || exit $rc

# -- 6. examples, as a user runs them from the installed wheel ----------------------
for ex in examples/python/*.py; do
  log "example $ex"
  (cd "$RUN_DIR" && TMPDIR="$WORK_DIR" "$VENV/bin/python" "$ROOT/$ex")
done
