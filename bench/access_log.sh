#!/usr/bin/env bash
# The access log's cost: plain HTTP req/s through poolgate without an access log and with the JSON
# access log to a file, measured alternately (off, on, off, on, ...) so that a machine whose load
# drifts affects both alike. Prints each run and the ratios of the medians (on / off) of req/s and
# of the gateway's CPU time per request (steadier than req/s on a machine shared with other work).
#
#   bench/access_log.sh              # 3 runs of each, 10 s of wrk each after a 2 s warm-up
#   bench/access_log.sh --runs 5 --seconds 5
#
# Uses target/release/poolgate and the bench_fixture example (cargo build --release --bin poolgate
# --example bench_fixture), wrk with bench/proxy.lua (64 keep-alive connections, 2 threads), the
# fixture's origin (1 KiB bodies) and 8 fixture upstreams. Everything binds 127.0.0.1 and is stopped
# on exit. POOLGATE_BIN and FIXTURE_BIN name other builds of the two (a debug build measures the
# code paths, not the release figures).
set -euo pipefail
cd "$(dirname "$0")/.."
runs=3
seconds=10
while [ $# -gt 0 ]; do
  case $1 in
    --runs) runs=$2; shift 2 ;;
    --seconds) seconds=$2; shift 2 ;;
    *) sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//'; exit 64 ;;
  esac
done
target=${CARGO_TARGET_DIR:-target}
poolgate=${POOLGATE_BIN:-$target/release/poolgate}
fixture=${FIXTURE_BIN:-$target/release/examples/bench_fixture}
for bin in "$poolgate" "$fixture"; do
  [ -x "$bin" ] || { echo "missing $bin: cargo build --release --bin poolgate --example bench_fixture" >&2; exit 1; }
done
command -v wrk >/dev/null || { echo "wrk is needed (apt-get install wrk)" >&2; exit 1; }

work=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

wait_ready() {
  for _ in $(seq 100); do
    grep -q '^ready' "$1" 2>/dev/null && return 0
    sleep 0.1
  done
  echo "$1 never said ready" >&2
  exit 1
}
"$fixture" --max-lifetime=3600s origin >"$work/origin.out" 2>/dev/null &
pids+=($!)
wait_ready "$work/origin.out"
origin=$(sed -n 's/^origin=//p' "$work/origin.out")
"$fixture" --max-lifetime=3600s upstream --count 8 >"$work/pool.out" 2>/dev/null &
pids+=($!)
wait_ready "$work/pool.out"
upstreams=$(sed -n 's/^upstream=//p' "$work/pool.out" | sed 's/.*/"http:\/\/&"/' | paste -sd, -)

# measure MODE: req/s of one run.
measure() {
  read -r port admin < <("$fixture" free-ports --count 2 | tr '\n' ' '; echo)
  local log=""
  if [ "$1" = on ]; then
    log=$(printf '[log]\naccess = "%s/access.log"\naccess_format = "json"' "$work")
  fi
  cat >"$work/gateway.toml" <<EOF
[server]
listen = "127.0.0.1:$port"
admin_listen = "127.0.0.1:$admin"
shutdown_grace = "1s"
[policy]
allow_private_targets = true
$log
[pools.default]
upstreams = [$upstreams]
EOF
  "$poolgate" --config "$work/gateway.toml" 2>"$work/gateway.err" &
  local gw=$!
  for _ in $(seq 100); do
    curl -sf "http://127.0.0.1:$admin/readyz" >/dev/null 2>&1 && break
    sleep 0.1
  done
  wrk -t2 -c64 -d2s -s bench/proxy.lua "http://127.0.0.1:$port/" -- "http://$origin/1k" >/dev/null
  local out t0 t1
  t0=$(ticks "$gw")
  out=$(wrk -t2 -c64 -d"${seconds}s" -s bench/proxy.lua "http://127.0.0.1:$port/" -- "http://$origin/1k")
  sleep 0.1
  t1=$(ticks "$gw")
  kill "$gw"
  wait "$gw" 2>/dev/null || true
  local requests duration
  requests=$(sed -nE 's/.*wrk-result requests=([0-9]+).*/\1/p' <<<"$out")
  duration=$(sed -nE 's/.* duration_us=([0-9]+).*/\1/p' <<<"$out")
  if [ "$1" = on ]; then
    echo "access log: $(wc -l <"$work/access.log") lines" >&2
    rm -f "$work/access.log"
  fi
  # req/s, and the gateway's CPU per request (µs, user + system, its writer thread included).
  awk -v r="$requests" -v d="$duration" -v t=$((t1 - t0)) -v hz="$(getconf CLK_TCK)" \
    'BEGIN { printf "%.0f %.1f\n", r / (d / 1e6), t * 1e6 / hz / r }'
}
ticks() { awk '{ print $14 + $15 }' "/proc/$1/stat" 2>/dev/null || echo 0; }

off=()
on=()
off_cpu=()
on_cpu=()
for i in $(seq "$runs"); do
  read -r a a_cpu < <(measure off)
  read -r b b_cpu < <(measure on)
  echo "run $i: off $a req/s ($a_cpu µs CPU/request), on $b req/s ($b_cpu µs CPU/request)"
  off+=("$a")
  on+=("$b")
  off_cpu+=("$a_cpu")
  on_cpu+=("$b_cpu")
done
median() { printf '%s\n' "$@" | sort -n | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
m_off=$(median "${off[@]}")
m_on=$(median "${on[@]}")
awk -v a="$m_off" -v b="$m_on" 'BEGIN { printf "median req/s: without access log %.0f, with JSON access log to a file %.0f, ratio %.3f\n", a, b, b / a }'
c_off=$(median "${off_cpu[@]}")
c_on=$(median "${on_cpu[@]}")
awk -v a="$c_off" -v b="$c_on" 'BEGIN { printf "median gateway CPU per request: without %.1f µs, with %.1f µs, ratio %.3f\n", a, b, b / a }'
