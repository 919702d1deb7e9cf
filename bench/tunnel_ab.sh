#!/usr/bin/env bash
# Two poolgate binaries side by side on tunnel bulk transfers: MB/s through N tunnels at once and
# the gateway's CPU per GB moved (user + system ticks of its process, from /proc/PID/stat, over
# the transfer), in alternated rounds A, B, A, B, ... so that a shared machine's load falls on
# both alike. Each round starts the binary afresh on the memory store, with the 8 fake upstream
# proxies and the bulk source of bench_fixture; it prints one line per round and the medians.
#
#   bench/tunnel_ab.sh OLD_BINARY NEW_BINARY                      # 5 rounds, 1 and 8 tunnels, 5 s
#   bench/tunnel_ab.sh A B --rounds 3 --tunnels "8" --seconds 3
#
# Builds the bench_fixture example (fixture profile). Everything binds 127.0.0.1 and is stopped on
# exit.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
log() { printf 'tunnel_ab: %s\n' "$*" >&2; }
# shellcheck source=bench/common.sh
. "$root/bench/common.sh"

[ $# -ge 2 ] || { sed -n '2,11p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 64; }
bin_a=$(realpath "$1")
bin_b=$(realpath "$2")
shift 2
rounds=5
tunnel_counts="1 8"
secs=5
while [ $# -gt 0 ]; do
  case "$1" in
    --rounds) rounds=${2:?--rounds needs a number}; shift ;;
    --tunnels) tunnel_counts=${2:?--tunnels needs a list}; shift ;;
    --seconds) secs=${2:?--seconds needs a number}; shift ;;
    *) echo "tunnel_ab: unknown option $1" >&2; exit 64 ;;
  esac
  shift
done

POOLGATE_BIN=$bin_a build_release
install_missing curl:curl
bench_workdir
clock_ticks=$(getconf CLK_TCK)

start origin "$fixture" origin
wait_for 10 grep -q '^ready' "$work/origin.out" || { log "origin did not start"; exit 1; }
tunnel_src=$(sed -n 's/^tunnel=//p' "$work/origin.out")
start pool "$fixture" upstream --count 8
wait_for 10 grep -q '^ready' "$work/pool.out" || { log "upstreams did not start"; exit 1; }
upstreams=$(sed -n 's/^upstream=//p' "$work/pool.out" | sed 's|.*|"http://&"|' | paste -sd,)

# cpu_ticks PID: user + system clock ticks of the process so far.
cpu_ticks() { awk '{ print $14 + $15 }' "/proc/$1/stat"; }

# round BINARY TUNNELS: prints "MB/s ticks-per-GB" of one transfer through a fresh gateway.
round() {
  local ports port admin pid before after out mb_s
  read -r port admin < <(timeout 10 "$fixture" free-ports --count 2 | paste -sd' ')
  cat >"$work/gateway.toml" <<EOF
[server]
listen = "127.0.0.1:$port"
admin_listen = "127.0.0.1:$admin"

[policy]
connect_ports = [${tunnel_src##*:}]
allow_private_targets = true

[pools.default]
upstreams = [$upstreams]
EOF
  POOLGATE_LOG=warn "$1" --config "$work/gateway.toml" >"$work/gateway.log" 2>&1 &
  pid=$!
  if ! wait_for 10 curl -sf "http://127.0.0.1:$admin/status"; then
    log "gateway did not start: $(tail -2 "$work/gateway.log")"
    stop_all "$pid"
    return 1
  fi
  before=$(cpu_ticks "$pid")
  out=$(timeout $((secs + 30)) "$fixture" bulk --proxy "127.0.0.1:$port" --target "$tunnel_src" \
    --duration "${secs}s" --tunnels "$2")
  after=$(cpu_ticks "$pid")
  stop_all "$pid"
  mb_s=$(printf '%s' "$out" | sed -n 's/.*"mb_per_s": *\([0-9.]*\).*/\1/p')
  awk -v mb="$mb_s" -v s="$secs" -v t=$((after - before)) -v hz="$clock_ticks" \
    'BEGIN { printf "%.0f %.1f\n", mb, t * 100 / hz / (mb * s / 1000) }'
}

# show "MB/s TICKS": the pair with its units, or "failed".
show() { [ -n "$1" ] && printf '%s MB/s, %s ticks/GB' $1 || printf failed; }

# median: of the numbers on stdin.
median() { sort -n | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }

echo "A = $bin_a"
echo "B = $bin_b"
echo "CPU is in 10 ms ticks per GB through the gateway"
for n in $tunnel_counts; do
  : >"$work/a" && : >"$work/b"
  for r in $(seq "$rounds"); do
    a=$(round "$bin_a" "$n") && echo "$a" >>"$work/a"
    b=$(round "$bin_b" "$n") && echo "$b" >>"$work/b"
    echo "tunnels=$n round $r: A $(show "${a:-}")   B $(show "${b:-}")"
  done
  for v in a b; do
    printf 'tunnels=%s median %s: %s MB/s, %s ticks/GB\n' "$n" "${v^^}" \
      "$(cut -d' ' -f1 "$work/$v" | median)" "$(cut -d' ' -f2 "$work/$v" | median)"
  done
done
