#!/usr/bin/env bash
# Counts the gateway's user-space instructions per plain-HTTP request and per CONNECT setup, with
# valgrind's callgrind, on loopback only. Instruction counts hardly move with the machine's load,
# so two builds can be compared on a shared machine where timings swing by a third.
#
#   bench/instructions.sh                      # the release build of this tree
#   POOLGATE_BIN=old/poolgate bench/instructions.sh   # another build, for an A/B
#   bench/instructions.sh --keep DIR           # also keep the callgrind files in DIR
#   bench/instructions.sh --redis              # the Redis store (a redis-server started here)
#   bench/instructions.sh --scripts            # redis-server's own, per request, for the scripts
#   bench/instructions.sh --scripts --listed   # ... with listed leases, as in a pool with a cap
#   bench/instructions.sh --scripts --listed --stats-every-call   # ... statistics with every release
#
# The gateway runs under callgrind (about 50 times slower) on its memory store with the 8 fake
# upstreams of bench_fixture; a warm-up load runs first, then the counters are zeroed, the
# measured load runs, and the counters are dumped: HTTP is wrk (1 thread, 16 keep-alive
# connections, 1 KiB body, absolute form), CONNECT is bench_fixture's connect-load (8 at a time).
# Read a kept file with `callgrind_annotate --inclusive=yes FILE`.
#
# --scripts counts redis-server instead, under callgrind, while examples/script_load.rs drives
# acquire.lua as a busy gateway does in a pool without a cap (batches of 11 unlisted leases, 8
# upstreams; nothing to release); with --listed, as in a pool with a cap, acquire.lua and
# release.lua (batches of 11 acquires and 11 releases, 64 leases live). A unit is one request.
#
# Installs valgrind, wrk and curl with apt-get when they are missing (Debian/Ubuntu; root or sudo).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD

keep=""
seconds=5
redis=0
scripts=0
load_args=()
while [ $# -gt 0 ]; do
  case "$1" in
    --keep) keep=${2:?--keep needs a directory}; shift ;;
    --seconds) seconds=${2:?--seconds needs a number}; shift ;;
    --redis) redis=1 ;;
    --scripts) scripts=1 ;;
    --listed) load_args+=(--listed) ;;
    --stats-every-call) load_args+=(--stats-every-call) ;;
    -h | --help) sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "instructions: unknown option $1" >&2; exit 64 ;;
  esac
  shift
done
case "$seconds" in '' | *[!0-9]*) echo "instructions: --seconds takes a number" >&2; exit 64 ;; esac

log() { printf 'instructions: %s\n' "$*" >&2; }
# shellcheck source=bench/common.sh
. "$root/bench/common.sh"

missing=()
command -v valgrind >/dev/null 2>&1 || missing+=(valgrind)
command -v wrk >/dev/null 2>&1 || missing+=(wrk)
command -v curl >/dev/null 2>&1 || missing+=(curl)
[ "$redis" -eq 0 ] && [ "$scripts" -eq 0 ] || command -v redis-server >/dev/null 2>&1 ||
  missing+=(redis-server)
[ ${#missing[@]} -eq 0 ] || install_packages "${missing[@]}"
build_release

work=$(mktemp -d "${TMPDIR:-/tmp}/poolgate-instr.XXXXXX")
pids=()
cleanup() {
  local status=$?
  trap - EXIT INT TERM
  stop_all "${pids[@]}"
  rm -rf "$work"
  exit "$status"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

wait_line() { # FILE REGEX SECONDS
  local deadline=$((SECONDS + $3))
  while [ "$SECONDS" -lt "$deadline" ]; do
    grep -qE "$2" "$1" 2>/dev/null && return 0
    sleep 0.1
  done
  return 1
}

if [ "$scripts" -eq 1 ]; then
  timeout 1800 cargo build --profile fixture --quiet --example script_load
  load=${CARGO_TARGET_DIR:-$root/target}/fixture/examples/script_load
  read -r redis_port < <(timeout 10 "$fixture" free-ports --count 1) || true
  mkdir -p "$work/redis"
  valgrind --tool=callgrind --callgrind-out-file="$work/cg.%p" redis-server --bind 127.0.0.1 \
    --port "$redis_port" --dir "$work/redis" --save '' --appendonly no --daemonize no \
    >"$work/redis.out" 2>&1 &
  server=$!
  pids+=("$server")
  for _ in $(seq 150); do
    timeout 2 redis-cli -p "$redis_port" ping >/dev/null 2>&1 && break
    sleep 0.2
  done
  rounds=300
  timeout 600 "$load" --port "$redis_port" --rounds 50 "${load_args[@]}" >/dev/null
  callgrind_control -z "$server" >/dev/null 2>&1
  units=$(timeout 600 "$load" --port "$redis_port" --rounds "$rounds" "${load_args[@]}" |
    sed -n 's/^requests=//p')
  callgrind_control --dump=scripts "$server" >/dev/null 2>&1
  sleep 1
  file=$(ls -t "$work"/cg.* 2>/dev/null | head -n 1 || true)
  [ -n "$file" ] && [ -n "$units" ] && [ "$units" -gt 0 ] || { log "scripts: no data"; exit 1; }
  ir=$(callgrind_annotate "$file" 2>/dev/null | awk '/PROGRAM TOTALS/ { gsub(",", "", $1); print $1 }')
  [ -z "$keep" ] || { mkdir -p "$keep"; cp "$file" "$keep/callgrind.scripts"; }
  echo "redis-server: $(redis-server --version | head -n 1)"
  printf '%-10s %8d units  %9d instructions per unit\n' scripts "$units" $((ir / units))
  exit 0
fi

lifetime="--max-lifetime=$((seconds * 4 + 300))s"
"$fixture" "$lifetime" origin >"$work/origin.out" 2>&1 &
pids+=($!)
"$fixture" "$lifetime" upstream --count 8 >"$work/pool.out" 2>&1 &
pids+=($!)
wait_line "$work/origin.out" '^ready' 10 || { log "origin did not start"; exit 1; }
wait_line "$work/pool.out" '^ready' 10 || { log "upstream pool did not start"; exit 1; }
origin=$(sed -n 's/^origin=//p' "$work/origin.out")
mapfile -t upstreams < <(sed -n 's/^upstream=//p' "$work/pool.out")
read -r port admin redis_port < <(timeout 10 "$fixture" free-ports --count 3 | tr '\n' ' ') || true
store='kind = "memory"'
if [ "$redis" -eq 1 ]; then
  mkdir -p "$work/redis"
  redis-server --bind 127.0.0.1 --port "$redis_port" --dir "$work/redis" --save '' \
    --appendonly no --daemonize no >"$work/redis.out" 2>&1 &
  pids+=("$!")
  store="kind = \"redis\""$'\n'"url = \"redis://127.0.0.1:$redis_port\""
  for _ in $(seq 50); do
    timeout 1 redis-cli -p "$redis_port" ping >/dev/null 2>&1 && break
    sleep 0.1
  done
fi

cat >"$work/gateway.toml" <<EOF
# Generated by bench/instructions.sh.
[server]
listen = "127.0.0.1:$port"
admin_listen = "127.0.0.1:$admin"
shutdown_grace = "1s"

[store]
$store

[policy]
connect_ports = [${origin##*:}]
allow_private_targets = true

[pools.default]
upstreams = [$(printf '"http://%s", ' "${upstreams[@]}")]
EOF

RUST_LOG=warn valgrind --tool=callgrind --callgrind-out-file="$work/cg.%p" \
  "$poolgate" run --config "$work/gateway.toml" >"$work/gateway.out" 2>&1 &
gateway=$!
pids+=("$gateway")
up=0
for _ in $(seq 150); do
  if curl -s -o /dev/null -x "127.0.0.1:$port" "http://$origin/1k"; then up=1; break; fi
  sleep 0.2
done
[ "$up" -eq 1 ] || { log "the gateway did not answer under valgrind"; tail -n 5 "$work/gateway.out" >&2; exit 1; }

http_load() { # SECONDS: prints the number of requests completed
  timeout $(($1 + 60)) wrk -t1 -c16 -d"${1}s" --timeout 10s -s "$root/bench/proxy.lua" \
    "http://127.0.0.1:$port/" -- "http://$origin/1k" | awk '/requests in/ { print $1 }'
}
connect_load() { # SECONDS: prints the number of setups completed
  timeout $(($1 + 60)) "$fixture" connect-load --proxy "127.0.0.1:$port" --target "$origin" \
    --concurrency 8 --duration "${1}s" | sed -nE 's/.*"setups":([0-9]+).*/\1/p'
}
# measure NAME LOAD: zero the counters, run LOAD, dump; prints instructions per unit.
measure() {
  local name=$1 load=$2 units file ir
  $load 2 >/dev/null
  callgrind_control -z "$gateway" >/dev/null 2>&1
  units=$($load "$seconds")
  callgrind_control --dump="$name" "$gateway" >/dev/null 2>&1
  sleep 1
  file=$(ls -t "$work"/cg.* 2>/dev/null | head -n 1 || true)
  [ -n "$file" ] && [ -n "$units" ] && [ "$units" -gt 0 ] || { log "$name: no data"; return 1; }
  ir=$(callgrind_annotate "$file" 2>/dev/null | awk '/PROGRAM TOTALS/ { gsub(",", "", $1); print $1 }')
  [ -z "$keep" ] || { mkdir -p "$keep"; cp "$file" "$keep/callgrind.$name"; }
  printf '%-10s %8d units  %9d instructions per unit\n' "$name" "$units" $((ir / units))
}

echo "binary: $poolgate"
measure http http_load
measure connect connect_load
