#!/usr/bin/env bash
# Measures poolgate as a pool gateway against the ceiling of one fake upstream proxy and against
# Squid, on loopback only, bounded in time, and prints one table (every figure with its ratio to
# the ceiling) that it also writes to bench/out/results-<timestamp>.json.
#
#   bench/run.sh            # full run, about 5 minutes after the build
#   bench/run.sh --quick    # shorter measurements, for a smoke run
#   bench/run.sh --runs 3   # repeat everything three times and report medians
#
# Columns:
#   direct           client → one fake upstream proxy → origin (the ceiling)
#   squid            Squid with the 8 fake upstreams as round-robin parents, never direct, no cache
#   poolgate-memory  poolgate on its embedded store, the same 8 upstreams
#   poolgate-redis   poolgate on a Redis store (a redis-server started here), when this build
#                    accepts store.kind = "redis"; otherwise skipped with a note
#
# Rows: plain HTTP through the proxy with wrk (absolute-form, 64 keep-alive connections, 2 threads)
# → req/s, p50, p99; for poolgate the same load inside a label filter (X-Pool-Labels, half of the
# upstreams match); CONNECT setups/s (new connection + CONNECT + one request + close, 32 at a
# time); MB/s through one tunnel; for poolgate, the same two through its SOCKS5 port (setups and
# MB/s, against the ceiling's CONNECT figures, issue #34); peak RSS of the proxy under the HTTP load (VmHWM); RSS per idle
# tunnel with 10,000 tunnels open (VmRSS before and after, on a freshly started proxy); Redis
# commands sent per request (scripts count once; MONITOR during a short extra load) and Redis
# calls per request including those scripts make (INFO commandstats around the HTTP load).
#
# POOLGATE_BIN=path measures that poolgate binary instead of the one just built (to compare two
# builds on the same machine, one run after the other).
#
# Installs wrk, squid, redis-server and curl with apt-get when they are missing (Debian/Ubuntu;
# run as root or with sudo available), like scripts/test. Builds target/release/poolgate (or under
# $CARGO_TARGET_DIR) and the bench_fixture example. Everything it starts binds 127.0.0.1 and is
# stopped on exit, whatever the exit.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD

usage() {
  sed -n '2,8p' "$0" | sed 's/^# \{0,1\}//'
  cat <<'EOF'

Options:
  --quick        3 s HTTP load, 3 s CONNECT load, 2 s bulk (default 10 s, 5 s, 5 s)
  --runs N       repeat every measurement N times and report medians; ratios are taken within
                 each run, whose columns are measured one measure at a time (default 1)
  --tunnels N    idle tunnels to hold (default 10000)
  --only LIST    comma-separated columns to run: direct,squid,memory,redis (default all;
                 direct is always run, every ratio needs it)
  --micro        also run the placement micro-benchmark (cargo bench --bench hot_paths --
                 placement) and report its target: 100k upstreams within 10x of 1k
EOF
}

quick=0
runs=1
tunnels=10000
only="direct,squid,memory,redis"
micro=0
while [ $# -gt 0 ]; do
  case "$1" in
    --quick) quick=1 ;;
    --micro) micro=1 ;;
    --runs) runs=${2:?--runs needs a number}; shift ;;
    --tunnels) tunnels=${2:?--tunnels needs a number}; shift ;;
    --only) only="direct,${2:?--only needs a list}"; shift ;;
    -h | --help) usage; exit 0 ;;
    *) echo "bench: unknown option $1" >&2; usage >&2; exit 64 ;;
  esac
  shift
done
case "$runs$tunnels" in *[!0-9]*) echo "bench: --runs and --tunnels take numbers" >&2; exit 64 ;; esac
[ "$runs" -ge 1 ] || runs=1

if [ "$quick" -eq 1 ]; then
  mode=quick warm_s=1 http_s=3 connect_s=3 bulk_s=2
else
  mode=full warm_s=2 http_s=10 connect_s=5 bulk_s=5
fi
wrk_threads=2
wrk_conns=64
connect_concurrency=32
pool_size=8

log() { printf 'bench: %s\n' "$*" >&2; }
# shellcheck source=bench/common.sh
. "$root/bench/common.sh"

# --- tools -----------------------------------------------------------------------------------
squid_bin=$(command -v squid || true)
[ -n "$squid_bin" ] || { [ -x /usr/sbin/squid ] && squid_bin=/usr/sbin/squid; } || true
missing=()
command -v wrk >/dev/null 2>&1 || missing+=(wrk)
[ -n "$squid_bin" ] || missing+=(squid)
command -v redis-server >/dev/null 2>&1 || missing+=(redis-server)
command -v redis-cli >/dev/null 2>&1 || missing+=(redis-tools)
command -v curl >/dev/null 2>&1 || missing+=(curl)
if [ ${#missing[@]} -gt 0 ]; then
  install_packages "${missing[@]}"
  squid_bin=$(command -v squid || echo /usr/sbin/squid)
fi

# --- build -----------------------------------------------------------------------------------
build_release

# --- limits, scratch space, cleanup ----------------------------------------------------------
# The proxy holds two descriptors per tunnel, and so does the fake upstream behind it.
want_fds=$((tunnels * 2 + 4096))
if [ "$(ulimit -n)" -lt "$want_fds" ]; then
  ulimit -n "$want_fds" 2>/dev/null || ulimit -n "$(ulimit -Hn)" 2>/dev/null || true
fi
fds=$(ulimit -n)
fd_note=""
if [ "$fds" != unlimited ] && [ $((tunnels * 2 + 1024)) -gt "$fds" ]; then
  fd_note="the open-file limit is $fds and cannot be raised here: $(((fds - 1024) / 2)) idle tunnels instead of $tunnels"
  tunnels=$(((fds - 1024) / 2))
  log "$fd_note"
fi

work=$(mktemp -d "${TMPDIR:-/tmp}/poolgate-bench.XXXXXX")
chmod 755 "$work"
pids=()
watchdog=""

stop() { # stop PID: TERM, up to 5 s, then KILL
  local pid=$1 i
  kill -TERM "$pid" 2>/dev/null || true
  for i in $(seq 50); do
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
  done
  kill -KILL "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
  local kept=() p
  for p in "${pids[@]}"; do [ "$p" = "$pid" ] || kept+=("$p"); done
  pids=("${kept[@]}")
}

cleanup() {
  local status=$?
  trap - EXIT INT TERM
  stop_all "${pids[@]}"
  if [ -n "$watchdog" ]; then
    kill -TERM "$watchdog" 2>/dev/null || true
    wait "$watchdog" 2>/dev/null || true
  fi
  if [ "$status" -ne 0 ] && [ -d "$work" ]; then
    log "stopped (status $status); last lines of the logs that have any:"
    local f
    for f in "$work"/*.err; do
      [ -s "$f" ] || continue
      echo "  ${f##*/}:"
      tail -n 5 "$f" | sed 's/^/    /'
    done >&2
  fi
  rm -rf "$work"
  exit "$status"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# start NAME CMD...: runs CMD in the background, output in $work/NAME.{out,err}; sets $started.
start() {
  local name=$1
  shift
  "$@" >"$work/$name.out" 2>"$work/$name.err" &
  started=$!
  pids+=("$started")
}

# wait_line FILE REGEX SECONDS PID: waits for a line of FILE matching REGEX while PID lives.
wait_line() {
  local deadline=$((SECONDS + $3))
  while [ "$SECONDS" -lt "$deadline" ]; do
    grep -qE "$2" "$1" 2>/dev/null && return 0
    kill -0 "$4" 2>/dev/null || return 1
    sleep 0.1
  done
  return 1
}

free_ports() { timeout 10 "$fixture" free-ports --count "$1"; }
json_field() { sed -nE "s/.*\"$1\":(\"[^\"]*\"|[^,}]*).*/\1/p" <<<"$2" | tr -d '"'; }
kib() { awk -v k="$2" '$1 == k":" { print $2 }' "/proc/$1/status" 2>/dev/null || true; }
# CPU a process has used (user + system), in clock ticks.
clk_tck=$(getconf CLK_TCK)
ticks() { awk '{ print $14 + $15 }' "/proc/$1/stat" 2>/dev/null || echo 0; }
# per_unit_us TICKS UNITS: microseconds of CPU per unit.
per_unit_us() { awk -v t="$1" -v n="$2" -v hz="$clk_tck" 'BEGIN { if (n > 0) printf "%.1f", t * 1e6 / hz / n }'; }

# Time budget for everything after the build: a watchdog ends the script past it.
per_target=$((warm_s + http_s + 2 * connect_s + 2 * bulk_s + 120))
budget=$((runs * 4 * per_target + 120 + micro * 900))
bash -c 'sleep "$1" & s=$!; trap "kill \$s 2>/dev/null; exit 0" TERM; wait $s;
         echo "bench: time budget of $1 s exceeded, stopping" >&2; kill -TERM "$2"' \
  _ "$budget" "$$" &
watchdog=$!

raw=$work/raw.tsv
: >"$raw"
run=0
[ -z "$fd_note" ] || printf 'note\t%s\t%s\n' all "$fd_note" >>"$raw"
record() { printf '%s\t%s\t%s\t%s\n' "$run" "$1" "$2" "$3" >>"$raw"; }
note() {
  printf 'note\t%s\t%s\n' "$1" "$2" >>"$raw"
  log "$1: $2"
}

# --- fixtures --------------------------------------------------------------------------------
lifetime="--max-lifetime=$((budget + 60))s"
start origin "$fixture" "$lifetime" origin
wait_line "$work/origin.out" '^ready' 10 "$started" || { log "origin did not start"; exit 1; }
origin=$(sed -n 's/^origin=//p' "$work/origin.out")
tunnel_src=$(sed -n 's/^tunnel=//p' "$work/origin.out")
start pool "$fixture" "$lifetime" upstream --count "$pool_size"
wait_line "$work/pool.out" '^ready' 10 "$started" || { log "upstream pool did not start"; exit 1; }
mapfile -t upstreams < <(sed -n 's/^upstream=//p' "$work/pool.out")
log "origin $origin, tunnel source $tunnel_src, $pool_size upstreams, mode $mode, $runs run(s)"

redis_port=""
redis_pid=""
start_redis() {
  [ -z "$redis_pid" ] || return 0
  redis_port=$(free_ports 1)
  mkdir -p "$work/redis"
  start redis redis-server --bind 127.0.0.1 --port "$redis_port" --dir "$work/redis" \
    --save '' --appendonly no --daemonize no
  redis_pid=$started
  local i
  for i in $(seq 50); do
    redis-cli -p "$redis_port" ping >/dev/null 2>&1 && return 0
    sleep 0.1
  done
  return 1
}
redis_calls() {
  timeout 5 redis-cli -p "$redis_port" INFO commandstats |
    awk -F'[:=,]' '/^cmdstat_/ && $1 != "cmdstat_info" { s += $3 } END { print s + 0 }'
}

# --- proxies under test ----------------------------------------------------------------------
# start_proxy COLUMN: starts a fresh proxy; sets proxy_addr and proxy_pid. Non-zero (with a note)
# when the column cannot run.
launch=0
start_proxy() {
  local column=$1 dir port admin
  launch=$((launch + 1))
  dir=$work/$column-$launch
  mkdir -p "$dir"
  case "$column" in
    direct)
      start "direct-$launch" "$fixture" "$lifetime" upstream --count 1
      proxy_pid=$started
      if ! wait_line "$work/direct-$launch.out" '^ready' 10 "$proxy_pid"; then
        note direct "the fake upstream did not start"
        return 1
      fi
      proxy_addr=$(sed -n 's/^upstream=//p' "$work/direct-$launch.out")
      ;;
    squid)
      port=$(free_ports 1)
      {
        echo "# Generated by bench/run.sh: a pool gateway over the fake upstreams, no cache."
        echo "http_port 127.0.0.1:$port"
        echo "visible_hostname poolgate-bench"
        echo "pid_filename $dir/squid.pid"
        echo "cache_log $dir/cache.log"
        echo "access_log none"
        echo "cache_store_log none"
        echo "coredump_dir $dir"
        echo "netdb_filename none"
        echo "pinger_enable off"
        echo "cache deny all"
        echo "cache_mem 0"
        echo "max_filedescriptors $([ "$fds" = unlimited ] && echo 65536 || echo "$fds")"
        echo "shutdown_lifetime 1 seconds"
        echo "acl bench_clients src 127.0.0.1/32"
        echo "http_access allow bench_clients"
        echo "http_access deny all"
        echo "never_direct allow all"
        local i=0 u
        for u in "${upstreams[@]}"; do
          i=$((i + 1))
          echo "cache_peer ${u%:*} parent ${u##*:} 0 no-query no-digest no-netdb-exchange round-robin name=up$i"
        done
      } >"$dir/squid.conf"
      # Started as root, Squid runs as its own user (cache_effective_user), which must be able to
      # write its pid and log files.
      if [ "$(id -u)" -eq 0 ]; then chown -R proxy:proxy "$dir" 2>/dev/null || true; fi
      if ! timeout 30 "$squid_bin" -k parse -f "$dir/squid.conf" >"$dir/parse.log" 2>&1; then
        note squid "squid -k parse rejected the generated config: $(tail -n 1 "$dir/parse.log")"
        return 1
      fi
      start "squid-$launch" "$squid_bin" -N -f "$dir/squid.conf"
      proxy_pid=$started
      proxy_addr=127.0.0.1:$port
      ;;
    memory | redis)
      local socks
      read -r port admin socks < <(free_ports 3 | tr '\n' ' ')
      local store="kind = \"memory\""
      if [ "$column" = redis ]; then
        store="kind = \"redis\""$'\n'"url = \"redis://127.0.0.1:${redis_port:-6379}\""
      fi
      # The upstreams carry labels, two countries taking turns, so that a label filter has half
      # of them to choose from (issue #33); requests without labels use them all as before.
      labelled_upstreams() {
        local i=0 u
        for u in "${upstreams[@]}"; do
          printf '{ url = "http://%s", labels = { country = "c%d" } }, ' "$u" $((i % 2))
          i=$((i + 1))
        done
      }
      write_gateway_config() {
        cat >"$dir/gateway.toml" <<EOF
# Generated by bench/run.sh.
[server]
listen = "127.0.0.1:$port"
admin_listen = "127.0.0.1:$admin"
socks_listen = "127.0.0.1:$socks"
max_connections = $((tunnels + 10000))
shutdown_grace = "1s"

[store]
$store

[policy]
connect_ports = [${origin##*:}, ${tunnel_src##*:}]
allow_private_targets = true

[pools.default]
upstreams = [$(labelled_upstreams)]
EOF
      }
      write_gateway_config
      if ! timeout 10 "$poolgate" check --config "$dir/gateway.toml" >"$dir/check.log" 2>&1; then
        note "$column" "skipped: poolgate check rejects the config: $(tr '\n' ' ' <"$dir/check.log")"
        return 1
      fi
      if [ "$column" = redis ]; then
        if ! start_redis; then
          note redis "skipped: redis-server did not start"
          return 1
        fi
        store="kind = \"redis\""$'\n'"url = \"redis://127.0.0.1:$redis_port\""
        write_gateway_config
      fi
      proxy_admin=127.0.0.1:$admin
      proxy_socks=127.0.0.1:$socks
      POOLGATE_LOG=warn start "$column-$launch" "$poolgate" --config "$dir/gateway.toml"
      proxy_pid=$started
      proxy_addr=127.0.0.1:$port
      ;;
  esac
  # Ready when a request and a tunnel get through it.
  local deadline=$((SECONDS + 20))
  until [ "$(curl -s -m 2 -o /dev/null -w '%{http_code}' -x "http://$proxy_addr" "http://$origin/1k")" = 200 ]; do
    if ! kill -0 "$proxy_pid" 2>/dev/null || [ "$SECONDS" -ge "$deadline" ]; then
      local why
      why=$(tail -n 1 "$work/$column-$launch.err" 2>/dev/null)
      stop "$proxy_pid"
      note "$column" "skipped: the proxy did not come up${why:+ (its last words: $why)}"
      return 1
    fi
    sleep 0.2
  done
  if [ "$(curl -s -m 5 -p -x "http://$proxy_addr" "http://$origin/1k" | wc -c)" -ne 1024 ]; then
    stop "$proxy_pid"
    note "$column" "skipped: a CONNECT tunnel through the proxy did not work"
    return 1
  fi
}

# --- measurements ----------------------------------------------------------------------------
wrk_run() { # wrk_run SECONDS [LABELS]: prints the wrk-result line; LABELS is an X-Pool-Labels value
  timeout $(($1 + 30)) wrk -t"$wrk_threads" -c"$wrk_conns" -d"${1}s" --timeout 5s \
    -s "$root/bench/proxy.lua" "http://$proxy_addr/" -- "http://$origin/1k" "${2:-}" | grep '^wrk-result'
}

# Commands the gateway sends per request, a script counting once: INFO commandstats also counts
# every call a script makes, so this watches a short extra load with MONITOR, which marks calls
# made inside scripts "lua", and counts the other lines.
# The gateway's background work (events, health, probes) is counted over an idle window of the
# same length first and taken off.
monitor_count() { # monitor_count SECONDS [CMD...]: commands sent while CMD runs (or SECONDS pass)
  local seconds=$1 mon
  shift
  timeout $((seconds + 10)) redis-cli -p "$redis_port" MONITOR >"$work/monitor.txt" 2>/dev/null &
  mon=$!
  sleep 0.5
  if [ $# -gt 0 ]; then "$@" >"$work/monitor-load.txt" || true; else sleep "$seconds"; fi
  sleep 0.5
  kill -TERM "$mon" 2>/dev/null || true
  wait "$mon" 2>/dev/null || true
  grep -E '^[0-9.]+ \[' "$work/monitor.txt" | grep -vc '\[[0-9]* lua\]' || true
}
# Requests are counted by the gateway itself (/metrics): wrk leaves out the ones still in flight
# when it stops, which the gateway served all the same (up to one per connection).
gateway_requests() {
  curl -s -m 5 "http://$proxy_admin/metrics" |
    awk '/^poolgate_requests_total/ { s += $NF } END { printf "%d", s }'
}
measure_redis_sent() {
  local idle sent requests before
  idle=$(monitor_count "$warm_s")
  before=$(gateway_requests)
  sent=$(monitor_count "$warm_s" wrk_run "$warm_s")
  requests=$(($(gateway_requests) - before))
  if [ "${requests:-0}" -gt 0 ]; then
    record redis redis_cmds_per_req "$(awk -v s="$sent" -v i="$idle" -v r="$requests" 'BEGIN { printf "%.2f", (s - i) / r }')"
  fi
}

measure_http() { # HTTP load, its latency and the proxy's peak RSS
  local column=$1 line before after cpu0 redis_cpu0=0
  wrk_run "$warm_s" >/dev/null || true
  [ "$column" != redis ] || before=$(redis_calls)
  cpu0=$(ticks "$proxy_pid")
  [ "$column" != redis ] || redis_cpu0=$(ticks "$redis_pid")
  if line=$(wrk_run "$http_s"); then
    local cpu=$(($(ticks "$proxy_pid") - cpu0)) redis_cpu=0
    [ "$column" != redis ] || redis_cpu=$(($(ticks "$redis_pid") - redis_cpu0))
    v() { sed -nE "s/.* $1=([0-9]+).*/\1/p" <<<"$line"; }
    local requests duration_us
    requests=$(v requests)
    duration_us=$(v duration_us)
    record "$column" http_rps "$(awk -v r="$requests" -v d="$duration_us" 'BEGIN { printf "%.1f", r / (d / 1e6) }')"
    record "$column" http_p50_ms "$(awk -v u="$(v p50_us)" 'BEGIN { printf "%.3f", u / 1000 }')"
    record "$column" http_p99_ms "$(awk -v u="$(v p99_us)" 'BEGIN { printf "%.3f", u / 1000 }')"
    record "$column" http_errors $(($(v connect_errors) + $(v read_errors) + $(v write_errors) + $(v timeouts) + $(v non2xx)))
    record "$column" http_cpu_us "$(per_unit_us "$cpu" "$requests")"
    if [ "$column" = redis ]; then
      record "$column" http_redis_cpu_us "$(per_unit_us "$redis_cpu" "$requests")"
      after=$(redis_calls)
      record "$column" redis_calls_per_req "$(awk -v a="$after" -v b="$before" -v r="$requests" 'BEGIN { if (r > 0) printf "%.2f", (a - b) / r }')"
      measure_redis_sent
    fi
  else
    note "$column" "wrk failed or timed out"
  fi
  if [ "$column" = memory ] || [ "$column" = redis ]; then
    # The same load inside a label filter (half the upstreams match): issue #33.
    if line=$(wrk_run "$http_s" "country=c1") && [ "$(sed -nE 's/.* non2xx=([0-9]+).*/\1/p' <<<"$line")" = 0 ]; then
      record "$column" http_filtered_rps "$(awk -v r="$(sed -nE 's/.* requests=([0-9]+).*/\1/p' <<<"$line")" \
        -v d="$(sed -nE 's/.* duration_us=([0-9]+).*/\1/p' <<<"$line")" 'BEGIN { printf "%.1f", r / (d / 1e6) }')"
    else
      note "$column" "wrk inside a label filter failed, timed out or got errors"
    fi
  fi
  record "$column" peak_rss_mib "$(awk -v k="$(kib "$proxy_pid" VmHWM)" 'BEGIN { printf "%.1f", k / 1024 }')"
}

measure_connect() { # CONNECT setups: new connection + CONNECT + one request + close
  local column=$1 out errors cpu0
  cpu0=$(ticks "$proxy_pid")
  if out=$(timeout $((connect_s + 30)) "$fixture" connect-load --proxy "$proxy_addr" --target "$origin" \
    --concurrency "$connect_concurrency" --duration "${connect_s}s"); then
    record "$column" connect_per_s "$(json_field setups_per_s "$out")"
    record "$column" connect_cpu_us "$(per_unit_us $(($(ticks "$proxy_pid") - cpu0)) "$(json_field setups "$out")")"
    record "$column" connect_p99_ms "$(json_field p99_ms "$out")"
    errors=$(json_field errors "$out")
    [ "${errors:-0}" = 0 ] || note "$column" "run $run: $errors CONNECT setups failed, first: $(json_field first_error "$out")"
  else
    note "$column" "run $run: connect-load failed or timed out"
  fi
}

measure_bulk() { # MB/s through one tunnel
  local column=$1 out
  if out=$(timeout $((bulk_s + 30)) "$fixture" bulk --proxy "$proxy_addr" --target "$tunnel_src" \
    --duration "${bulk_s}s"); then
    record "$column" tunnel_mb_s "$(json_field mb_per_s "$out")"
  else
    note "$column" "run $run: bulk transfer failed or timed out"
  fi
}

measure_socks() { # SOCKS5 setups and MB/s through one SOCKS5 tunnel (poolgate's columns only)
  local column=$1 out errors
  [ -n "$proxy_socks" ] || return 0
  if out=$(timeout $((connect_s + 30)) "$fixture" connect-load --socks --proxy "$proxy_socks" \
    --target "$origin" --concurrency "$connect_concurrency" --duration "${connect_s}s"); then
    record "$column" socks_connect_per_s "$(json_field setups_per_s "$out")"
    record "$column" socks_connect_p99_ms "$(json_field p99_ms "$out")"
    errors=$(json_field errors "$out")
    [ "${errors:-0}" = 0 ] || note "$column" "run $run: $errors SOCKS5 setups failed, first: $(json_field first_error "$out")"
  else
    note "$column" "run $run: SOCKS5 connect-load failed or timed out"
  fi
  if out=$(timeout $((bulk_s + 30)) "$fixture" bulk --socks --proxy "$proxy_socks" \
    --target "$tunnel_src" --duration "${bulk_s}s"); then
    record "$column" socks_tunnel_mb_s "$(json_field mb_per_s "$out")"
  else
    note "$column" "run $run: SOCKS5 bulk transfer failed or timed out"
  fi
}

measure_idle() { # RSS per idle tunnel on a freshly started proxy
  local column=$1 before after out holder
  sleep 0.5
  before=$(kib "$proxy_pid" VmRSS)
  start "holder-$launch" timeout $((budget + 60)) "$fixture" "$lifetime" idle-tunnels \
    --proxy "$proxy_addr" --target "$tunnel_src" --count "$tunnels" --hold "$((budget))s"
  holder=$started
  if ! wait_line "$work/holder-$launch.out" '"opened"' 150 "$holder"; then
    note "$column" "run $run: idle tunnels were not opened in time"
    stop "$holder"
    return
  fi
  sleep 1
  after=$(kib "$proxy_pid" VmRSS)
  out=$(cat "$work/holder-$launch.out")
  stop "$holder"
  local opened
  opened=$(json_field opened "$out")
  if [ "${opened:-0}" -gt 0 ]; then
    record "$column" idle_kib_per_tunnel "$(awk -v a="$after" -v b="$before" -v n="$opened" 'BEGIN { printf "%.2f", (a - b) / n }')"
  fi
  if [ "${opened:-0}" != "$tunnels" ]; then
    note "$column" "run $run: $opened of $tunnels idle tunnels opened, first error: $(json_field first_error "$out")"
  fi
}

# Each run starts every column's proxy, then takes one measure at a time across all of them, so
# a column and the ceiling it is divided by are measured seconds apart, not minutes: the machine's
# speed drifts within a run. The column order turns by one every run, so no column always goes
# first. Ratios are taken within a run and the report gives their median over the runs.
columns=()
for column in direct squid memory redis; do
  case ",$only," in *",$column,"*) columns+=("$column") ;; esac
done
declare -A pid_of addr_of admin_of socks_of
use() { proxy_pid=${pid_of[$1]} proxy_addr=${addr_of[$1]} proxy_admin=${admin_of[$1]:-} proxy_socks=${socks_of[$1]:-}; }
# A column that was skipped once (the Redis store not built yet) is not retried.
skipped() { grep -q "^note	$1	skipped" "$raw"; }

for run in $(seq "$runs"); do
  turn=$(((run - 1) % ${#columns[@]}))
  order=("${columns[@]:turn}" "${columns[@]:0:turn}")
  live=()
  for column in "${order[@]}"; do
    skipped "$column" && continue
    log "run $run/$runs: starting $column"
    proxy_admin="" proxy_socks=""
    start_proxy "$column" || continue
    pid_of[$column]=$proxy_pid addr_of[$column]=$proxy_addr admin_of[$column]=$proxy_admin
    socks_of[$column]=$proxy_socks
    live+=("$column")
  done
  for measure in http connect bulk socks; do
    for column in "${live[@]}"; do
      log "run $run/$runs: $measure, $column"
      use "$column"
      "measure_$measure" "$column"
    done
  done
  for column in "${live[@]}"; do stop "${pid_of[$column]}"; done
  for column in "${live[@]}"; do
    log "run $run/$runs: idle tunnels, $column"
    start_proxy "$column" || continue
    measure_idle "$column"
    stop "$proxy_pid"
  done
done

# --- report ----------------------------------------------------------------------------------
criterion_args=()
if [ "$micro" -eq 1 ]; then
  log "placement micro-benchmark"
  if timeout 900 cargo bench --quiet --bench hot_paths -- placement >"$work/criterion.log" 2>&1; then
    criterion_args=(--criterion "$target_dir/criterion")
  else
    note all "cargo bench --bench hot_paths -- placement failed: $(tail -n 1 "$work/criterion.log")"
  fi
fi
stamp=$(date -u +%Y%m%dT%H%M%SZ)
mkdir -p "$root/bench/out"
out_json=$root/bench/out/results-$stamp.json
cpu=$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -n 1)
rev=$(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo unknown)
git -C "$root" diff --quiet HEAD 2>/dev/null || rev="$rev+dirty"
echo
echo "poolgate bench ($mode, $runs run(s), $(nproc) cores: $cpu, commit $rev)"
echo "HTTP: wrk -t$wrk_threads -c$wrk_conns -d${http_s}s; CONNECT: $connect_concurrency at a time for ${connect_s}s; bulk: ${bulk_s}s; idle tunnels: $tunnels"
echo
timeout 30 "$fixture" report --raw "$raw" --out "$out_json" "${criterion_args[@]}" \
  --meta "timestamp=$stamp" --meta "mode=$mode" --meta "runs=$runs" \
  --meta "cores=$(nproc)" --meta "cpu=$cpu" --meta "kernel=$(uname -r)" --meta "commit=$rev" \
  --meta "http=wrk -t$wrk_threads -c$wrk_conns -d${http_s}s (warm-up ${warm_s}s)" \
  --meta "connect=$connect_concurrency concurrent for ${connect_s}s" \
  --meta "bulk=${bulk_s}s through one tunnel" --meta "idle_tunnels=$tunnels" \
  --meta "upstreams=$pool_size" \
  --meta "squid=$("$squid_bin" -v 2>/dev/null | head -n 1)" \
  --meta "wrk=$(wrk -v 2>&1 | head -n 1)" \
  --meta "loadavg_at_end=$(cut -d' ' -f1-3 /proc/loadavg)"
echo
echo "written: ${out_json#"$root"/}"
