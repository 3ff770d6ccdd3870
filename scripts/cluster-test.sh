#!/usr/bin/env bash
# The emulated cluster test (issue 30): N hosts (default 4) as network namespaces on
# one bridge, each with its own address in a private /24 that this script picks
# (checked unused on this machine) and a rate-limited egress (tbf, default 1 Gbit/s);
# a Mooncake master and its HTTP metadata server on the last host; trainer ranks on
# hosts 1-2, server ranks on hosts 3-4, one process per rank. The driver
# (tests/cluster/driver.py) runs live transfers (pull and push), sparse delta steps
# (prepared pushes with notifications over TE, then published generations pulled by
# delta-enabled prepared readers, 1/3/10 % density against full updates),
# a store snapshot and restore, and fault trials (link cut, host crash, master crash),
# and ends with the `figure:` lines.
#
#   scripts/cluster-test.sh [--python PY] [--hosts N] [--rate 1gbit] [--trials K]
#                           [--layers L] [--hidden H] [--experts E] [--phases live,delta,store,faults]
#                           [--delta-dims L,H,E] [--delta-generations K]
#
# PY: a Python with the mooncake_weight_store package and the Mooncake wheel
# (mooncake-transfer-engine-non-cuda) and numpy installed; default $MWS_CLUSTER_PYTHON,
# else $MWS_VENV/bin/python (the venv .ci/python.sh made). --trials (or
# $MWS_CLUSTER_TRIALS): fault trials per kind (default 3; `--trials 20` for the long run).
#
# Needs root (network namespaces). Without them, or without such a Python, it prints
# one "SKIP" line and exits 0, unless MWS_REQUIRE_CLUSTER=1 (CI): then it fails.
#
# Sandbox: only addresses this script assigns, to interfaces it creates, in namespaces
# it creates (named mwsc<pid>-*); the bridge lives in its own namespace, so the root
# namespace gets no interface, address or route; no default route anywhere. On every
# exit path the trap kills the processes left in those namespaces (by PID, from
# `ip netns pids`) and deletes the namespaces (which removes the veths and the bridge).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD

HOSTS=4
RATE=1gbit
TRIALS=${MWS_CLUSTER_TRIALS:-3}
PY=${MWS_CLUSTER_PYTHON:-}
[[ -z "$PY" && -n "${MWS_VENV:-}" ]] && PY="$MWS_VENV/bin/python"
DRIVER_ARGS=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --python) PY=$2; shift 2 ;;
    --hosts) HOSTS=$2; shift 2 ;;
    --rate) RATE=$2; shift 2 ;;
    --trials) TRIALS=$2; shift 2 ;;
    --layers|--hidden|--experts|--phases|--generations|--routing|--segment-mib|--delta-dims|--delta-generations) DRIVER_ARGS+=("$1" "$2"); shift 2 ;;
    -h|--help) sed -n '2,28p' "$0"; exit 0 ;;
    *) echo "cluster-test: unknown argument $1" >&2; exit 2 ;;
  esac
done

skip() {
  if [[ "${MWS_REQUIRE_CLUSTER:-0}" == 1 ]]; then
    echo "cluster-test: FAIL: cannot run the cluster tests ($1) but MWS_REQUIRE_CLUSTER=1" >&2
    exit 1
  fi
  echo "SKIP cluster tests: $1"
  exit 0
}

# -- prerequisites -------------------------------------------------------------------
[[ $(id -u) -eq 0 ]] || skip "not root (network namespaces need CAP_SYS_ADMIN / CAP_NET_ADMIN)"
command -v ip >/dev/null && command -v tc >/dev/null || skip "iproute2 (ip, tc) not installed"
[[ -n "$PY" && -x "$PY" ]] || skip "no Python with mooncake_weight_store and the Mooncake wheel (pass --python or set MWS_VENV)"
"$PY" -c 'import numpy, mooncake.engine, mooncake.store, mooncake_weight_store' 2>/dev/null \
  || skip "$PY cannot import numpy, mooncake.engine, mooncake.store and mooncake_weight_store"
[[ "$HOSTS" =~ ^[0-9]+$ && $HOSTS -ge 4 && $HOSTS -le 16 ]] || { echo "cluster-test: --hosts must be 4..16" >&2; exit 2; }
[[ "$TRIALS" =~ ^[0-9]+$ && $TRIALS -le 200 ]] || { echo "cluster-test: --trials must be 0..200" >&2; exit 2; }
RATE_BPS=$(python3 - "$RATE" <<'EOF'
import re, sys
m = re.fullmatch(r"([0-9.]+)(k|m|g)?bit", sys.argv[1].lower())
if not m:
    sys.exit("cluster-test: --rate must look like 1gbit, 500mbit")
print(int(float(m.group(1)) * {"k": 1e3, "m": 1e6, "g": 1e9, None: 1}[m.group(2)]))
EOF
)
# tbf needs a bucket of at least rate/HZ; 2 ms of traffic, at least 256 KiB
BURST=$(( RATE_BPS / 8 / 500 )); (( BURST < 262144 )) && BURST=262144

PREFIX="mwsc$$"
SW="$PREFIX-sw"
WORK=$(mktemp -d "${TMPDIR:-/tmp}/mws-cluster.XXXXXX")
CREATED=()    # namespaces this script created, in order
DRIVER_PID=""

cleanup() {
  local rc=$?
  trap - EXIT INT TERM
  if [[ -n "$DRIVER_PID" ]] && kill -0 "$DRIVER_PID" 2>/dev/null; then
    kill "$DRIVER_PID" 2>/dev/null || true
    for _ in $(seq 1 100); do kill -0 "$DRIVER_PID" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$DRIVER_PID" 2>/dev/null || true
  fi
  local ns pids
  for ns in "${CREATED[@]}"; do
    pids=$(ip netns pids "$ns" 2>/dev/null || true)
    [[ -n "$pids" ]] && kill $pids 2>/dev/null || true
  done
  for _ in $(seq 1 50); do
    pids=""
    for ns in "${CREATED[@]}"; do pids+=$(ip netns pids "$ns" 2>/dev/null || true); done
    [[ -z "$pids" ]] && break
    sleep 0.1
  done
  for ns in "${CREATED[@]}"; do
    pids=$(ip netns pids "$ns" 2>/dev/null || true)
    [[ -n "$pids" ]] && { echo "cluster-test: killing leftover pids in $ns: $pids" >&2; kill -9 $pids 2>/dev/null || true; }
  done
  for ns in "${CREATED[@]}"; do ip netns del "$ns" 2>/dev/null || true; done
  local left
  left=$(ip netns list 2>/dev/null | grep -c "^$PREFIX-" || true)
  [[ "$left" == 0 ]] || echo "cluster-test: WARNING: $left namespaces named $PREFIX-* remain" >&2
  if [[ $rc -ne 0 ]]; then
    echo "cluster-test: failed (rc $rc); logs kept in $WORK" >&2
  else
    rm -rf "$WORK"
  fi
  exit $rc
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# -- a private /24 that nothing on this machine uses ---------------------------------
# Candidates in 10.0.0.0/8, seeded by the PID; a candidate is refused when it overlaps
# any address or route of the root namespace or of any existing namespace.
used_nets() {
  { ip -4 -o addr show; ip -4 route show table all; } 2>/dev/null | grep -oE '([0-9]{1,3}\.){3}[0-9]{1,3}(/[0-9]{1,2})?' || true
  local ns
  for ns in $(ip netns list 2>/dev/null | awk '{print $1}'); do
    { ip -n "$ns" -4 -o addr show; ip -n "$ns" -4 route show table all; } 2>/dev/null \
      | grep -oE '([0-9]{1,3}\.){3}[0-9]{1,3}(/[0-9]{1,2})?' || true
  done
}
SUBNET=$(used_nets | python3 -c '
import ipaddress, random, sys
used = []
for tok in sys.stdin.read().split():
    try:
        used.append(ipaddress.ip_network(tok if "/" in tok else tok + "/32", strict=False))
    except ValueError:
        pass
rng = random.Random(int(sys.argv[1]))
for _ in range(200):
    net = ipaddress.ip_network(f"10.{rng.randrange(64, 250)}.{rng.randrange(1, 255)}.0/24")
    if not any(net.overlaps(u) for u in used if u.prefixlen > 0):
        print(str(net.network_address).rsplit(".", 1)[0])
        sys.exit(0)
sys.exit("no free /24 found")
' "$$") || { echo "cluster-test: no unused private /24 found" >&2; exit 1; }

# -- namespaces, bridge, veths, addresses, rate limits --------------------------------
if ! ip netns add "$SW" 2>"$WORK/netns.err"; then
  skip "cannot create network namespaces ($(head -c 200 "$WORK/netns.err"))"
fi
CREATED+=("$SW")
ip -n "$SW" link add br0 type bridge
ip -n "$SW" link set br0 up
for i in $(seq 1 "$HOSTS"); do
  ns="$PREFIX-h$i"
  ip netns add "$ns"
  CREATED+=("$ns")
  ip link add "vh$i" netns "$SW" type veth peer name eth0 netns "$ns"
  ip -n "$SW" link set "vh$i" master br0
  ip -n "$SW" link set "vh$i" up
  ip -n "$ns" link set lo up
  ip -n "$ns" addr add "$SUBNET.$((10 + i))/24" dev eth0
  ip -n "$ns" link set eth0 up
  tc -n "$ns" qdisc add dev eth0 root tbf rate "$RATE_BPS" burst "$BURST" latency 10ms
done
# no default route anywhere: only the /24 is reachable
for i in $(seq 1 "$HOSTS"); do
  if ip -n "$PREFIX-h$i" route show default | grep -q .; then echo "cluster-test: unexpected default route" >&2; exit 1; fi
done
echo "cluster-test: $HOSTS hosts $PREFIX-h1..h$HOSTS on $SUBNET.0/24 (bridge in $SW), egress $RATE (tbf burst $BURST B); python $PY"

# -- the driver -------------------------------------------------------------------------
"$PY" "$ROOT/tests/cluster/driver.py" --ns-prefix "$PREFIX" --hosts "$HOSTS" --subnet "$SUBNET" \
  --rate-bps "$RATE_BPS" --trials "$TRIALS" --workdir "$WORK" "${DRIVER_ARGS[@]}" &
DRIVER_PID=$!
set +e
wait "$DRIVER_PID"
rc=$?
set -e
DRIVER_PID=""
exit $rc
