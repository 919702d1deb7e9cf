#!/usr/bin/env bash
# A soak with chaos (issue #35): two poolgate instances sharing one redis-server, under a mixed
# load for a bounded time, while a chaos loop restarts Redis, kills and restarts fake upstreams,
# makes one upstream answer captchas, sends SIGHUP reloads and flips an upstream list file. Not
# run in CI. Prints one table:
#
#   - requests by outcome (status and X-Pool-Error), each judged: a success, an error the docs
#     promise for the fault at hand, or UNEXPECTED (a hang, a reset or EOF without a response, an
#     error the docs do not promise for that fault);
#   - leases left after the run, from /status of both instances and from Redis (0);
#   - cap violations: the fake upstreams count exchanges in flight against max_concurrency (0;
#     counts up to (instances + 1) × cap while an instance serves from its local view, and 15 s
#     after, are the documented degraded mode, shown apart);
#   - RSS and open file descriptors of each instance after warm-up, in the middle and at the end
#     (medians of the samples around each point; flat: ≤ 10% growth);
#   - p50/p99 latency of plain HTTP, sticky and tunnel requests against direct fetches of the
#     same origin.
#
#   bench/soak.sh                 # 10 minutes of load (1 of warm-up) after the build
#   bench/soak.sh --minutes 30    # longer
#   bench/soak.sh --short         # 2 minutes, for a smoke check
#   bench/soak.sh --redis-wipe    # each Redis restart also loses its data (default: kept, AOF)
#
# Builds target/release/poolgate (POOLGATE_BIN=path uses that binary instead) and the soak
# example (the fixture profile, as bench/run.sh builds its fixtures). Installs redis-server and
# curl with apt-get when missing. Everything binds 127.0.0.1 and is stopped on exit, whatever the
# exit; raw files go to bench/out/soak-<timestamp>/ (not tracked). Exit status 0 when every
# verdict is ok, 1 otherwise.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD

usage() { # the comment block at the top
  awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"
}

minutes=10
short=0
redis_wipe=0
while [ $# -gt 0 ]; do
  case "$1" in
    --minutes) minutes=${2:?--minutes needs a number}; shift ;;
    --short) short=1 ;;
    --redis-wipe) redis_wipe=1 ;;
    -h | --help) usage; exit 0 ;;
    *) echo "soak: unknown option $1" >&2; usage >&2; exit 64 ;;
  esac
  shift
done
case "$minutes" in '' | *[!0-9]*) echo "soak: --minutes takes a whole number" >&2; exit 64 ;; esac
if [ "$short" -eq 1 ]; then
  duration=120 warmup=20 captcha_for=30
else
  [ "$minutes" -ge 3 ] || { echo "soak: at least 3 minutes (or --short)" >&2; exit 64; }
  duration=$((minutes * 60)) warmup=60 captcha_for=60
fi
cap=3 # max_concurrency of the default pool, and the cap its fake upstreams check

log() { printf 'soak: %s\n' "$*" >&2; }
# shellcheck source=bench/common.sh
. "$root/bench/common.sh"

missing=()
command -v redis-server >/dev/null 2>&1 || missing+=(redis-server)
command -v redis-cli >/dev/null 2>&1 || missing+=(redis-tools)
command -v curl >/dev/null 2>&1 || missing+=(curl)
[ ${#missing[@]} -eq 0 ] || install_packages "${missing[@]}"

target_dir=${CARGO_TARGET_DIR:-$root/target}
log "building poolgate (release) and the soak example (fixture profile)"
timeout 3600 nice -n 5 cargo build --release --quiet --bin poolgate
timeout 1800 nice -n 5 cargo build --profile fixture --quiet --example soak
poolgate=${POOLGATE_BIN:-$target_dir/release/poolgate}
soak=$target_dir/fixture/examples/soak

# --- scratch space, cleanup, watchdog -------------------------------------------------------
work=$(mktemp -d "${TMPDIR:-/tmp}/poolgate-soak.XXXXXX")
chaos_pid="" sampler_pid="" watchdog=""

cleanup() {
  local status=$?
  trap - EXIT INT TERM
  local p
  for p in "$chaos_pid" "$sampler_pid"; do
    [ -n "$p" ] || continue
    kill -TERM "$p" 2>/dev/null || true
    wait "$p" 2>/dev/null || true
  done
  # Every process started here has a pid file (the chaos loop restarts some from a subshell).
  local f started_pids=()
  for f in "$work"/*.pid; do [ -s "$f" ] && started_pids+=("$(cat "$f")"); done
  stop_all "${started_pids[@]}"
  if [ -n "$watchdog" ]; then
    kill -TERM "$watchdog" 2>/dev/null || true
    wait "$watchdog" 2>/dev/null || true
  fi
  if [ "$status" -ne 0 ] && [ "$status" -ne 1 ]; then
    log "stopped (status $status); last lines of the logs that have any:"
    for f in "$work"/*.err; do
      [ -s "$f" ] || continue
      echo "  ${f##*/}:"
      tail -n 5 "$f" | sed 's/^/    /'
    done >&2
    local keep
    keep=$root/bench/out/soak-failed-$(date -u +%Y%m%dT%H%M%SZ)
    mkdir -p "$keep" && cp -r "$work"/. "$keep"/ 2>/dev/null && log "kept the raw files in $keep"
  fi
  rm -rf "$work"
  exit "$status"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

budget=$((duration + 600))
bash -c 'sleep "$1" & s=$!; trap "kill \$s 2>/dev/null; exit 0" TERM; wait $s;
         echo "soak: time budget of $1 s exceeded, stopping" >&2; kill -TERM "$2"' \
  _ "$budget" "$$" &
watchdog=$!
lifetime="--max-lifetime=$((budget + 60))s"

# start NAME CMD...: runs CMD in the background, output in $work/NAME.{out,err}, its pid in
# $work/NAME.pid; sets $started.
start() {
  local name=$1
  shift
  "$@" >"$work/$name.out" 2>>"$work/$name.err" &
  started=$!
  echo "$started" >"$work/$name.pid"
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
now_ms() { date +%s%3N; }
chaos_log=$work/chaos.log
: >"$chaos_log"
event() { echo "$(now_ms) $*" >>"$chaos_log"; }

# --- Redis, origin, fake upstreams ----------------------------------------------------------
mapfile -t ports < <(timeout 10 "$soak" free-ports --count 5)
redis_port=${ports[0]}
proxy_port=("${ports[1]}" "${ports[2]}")
admin_port=("${ports[3]}" "${ports[4]}")
up_port=() # u1..u6: the default pool; u7..u9: the list-fed pool

mkdir -p "$work/redis"
redis_pid=""
start_redis() {
  # AOF on, so a restart keeps the leases and sessions (a restart, not a loss of data).
  start redis redis-server --bind 127.0.0.1 --port "$redis_port" --dir "$work/redis" \
    --save '' --appendonly yes --appendfsync everysec --daemonize no
  redis_pid=$started
  local i
  for i in $(seq 100); do
    redis-cli -p "$redis_port" ping >/dev/null 2>&1 && return 0
    sleep 0.1
  done
  return 1
}
stop_redis() { # a clean shutdown (SIGTERM: Redis flushes its AOF and exits)
  local pid i
  pid=$(cat "$work/redis.pid")
  kill -TERM "$pid" 2>/dev/null || true
  # Until its port is closed (a process started by the parent shell stays a zombie for kill -0).
  for i in $(seq 100); do redis-cli -p "$redis_port" ping >/dev/null 2>&1 || break; sleep 0.1; done
  kill -KILL "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
  if [ "$redis_wipe" -eq 1 ]; then rm -rf "$work/redis" && mkdir -p "$work/redis"; fi
}
start_redis || { log "redis-server did not start"; exit 2; }

start origin "$soak" "$lifetime" origin
origin_pid=$started
wait_line "$work/origin.out" '^ready' 10 "$origin_pid" || { log "origin did not start"; exit 2; }
origin=$(sed -n 's/^origin=//p' "$work/origin.out")

captcha_flag=$work/captcha-u2
start_upstream() { # start_upstream N: fake upstream uN, on a port of the kernel's choice the
  # first time, on the same port again after a kill
  local n=$1 c=0 port=${up_port[$(($1 - 1))]:-0}
  [ "$n" -le 6 ] && c=$cap
  start "u$n" "$soak" "$lifetime" upstream --listen "127.0.0.1:$port" \
    --cap "$c" --events "$work/u$n.events" --captcha-flag "$work/captcha-u$n"
  disown "$started" # killed by the chaos loop: no job report
  wait_line "$work/u$n.out" '^ready' 10 "$started" || return 1
  up_port[$((n - 1))]=$(sed -n 's/^upstream=.*://p' "$work/u$n.out")
}
for n in $(seq 9); do start_upstream "$n" || { log "fake upstream u$n did not start"; exit 2; }; done
up() { echo "127.0.0.1:${up_port[$(($1 - 1))]}"; }

# --- the two gateways -----------------------------------------------------------------------
list_a="http://$(up 7)"$'\n'"http://$(up 8)"
list_b="http://$(up 8)"$'\n'"http://$(up 9)"
write_list() { # atomic: a new file renamed over the old one
  printf '# written by bench/soak.sh\n%s\n' "$1" >"$work/listed.txt.tmp"
  mv "$work/listed.txt.tmp" "$work/listed.txt"
}
write_list "$list_a"
write_config() { # write_config INSTANCE QUEUE_TIMEOUT
  local i=$1 name=gw-$1
  cat >"$work/$name.toml.tmp" <<EOF
# Generated by bench/soak.sh.
[server]
listen = "127.0.0.1:${proxy_port[$i]}"
admin_listen = "127.0.0.1:${admin_port[$i]}"
shutdown_grace = "2s"
connect_timeout = "2s"
response_timeout = "10s"

[store]
kind = "redis"
url = "redis://127.0.0.1:$redis_port"

[policy]
connect_ports = [${origin##*:}]
allow_private_targets = true

[pools.default]
upstreams = [$(for n in 1 2 3 4 5 6; do printf '"http://%s", ' "$(up "$n")"; done)]
max_concurrency = $cap
queue_timeout = "$2"
retries = 2

[pools.listed]
upstreams_file = "$work/listed.txt"
queue_timeout = "$2"

[pools.listed.probe]
targets = ["http://$origin/1k"]
interval = "10s"
timeout = "2s"
EOF
  mv "$work/$name.toml.tmp" "$work/$name.toml"
}
gw_pid=()
for i in 0 1; do
  write_config "$i" 5s
  if ! timeout 10 "$poolgate" check --config "$work/gw-$i.toml" >"$work/check-$i.log" 2>&1; then
    log "poolgate check rejects the config: $(tr '\n' ' ' <"$work/check-$i.log")"
    exit 2
  fi
  # Warnings, and the store's switches to its local view and back (for the cap check).
  POOLGATE_LOG=warn,poolgate::store::redis::conn=info start "gw-$i" "$poolgate" --config "$work/gw-$i.toml"
  gw_pid[$i]=$started
done
for i in 0 1; do
  deadline=$((SECONDS + 30))
  until [ "$(curl -s -m 2 -o /dev/null -w '%{http_code}' -x "http://127.0.0.1:${proxy_port[$i]}" "http://$origin/1k")" = 200 ] &&
    [ "$(curl -s -m 2 -o /dev/null -w '%{http_code}' -H 'X-Pool-Name: listed' -x "http://127.0.0.1:${proxy_port[$i]}" "http://$origin/1k")" = 200 ]; do
    if ! kill -0 "${gw_pid[$i]}" 2>/dev/null || [ "$SECONDS" -ge "$deadline" ]; then
      log "gateway $i did not come up: $(tail -n 3 "$work/gw-$i.err")"
      exit 2
    fi
    sleep 0.3
  done
done
log "redis :$redis_port, origin $origin, gateways :${proxy_port[0]} :${proxy_port[1]}, 9 fake upstreams; ${duration}s of load, ${warmup}s warm-up"

# --- load, sampler, chaos -------------------------------------------------------------------
start load "$soak" "$lifetime" load --proxy "127.0.0.1:${proxy_port[0]}" \
  --proxy "127.0.0.1:${proxy_port[1]}" --origin "$origin" --duration "${duration}s" \
  --warmup "${warmup}s" --chaos-log "$chaos_log" --out "$work/load.json"
load_pid=$started
load_start=$SECONDS

samples=$work/samples.tsv
: >"$samples"
sample() { # <seconds since the load began> <instance> <VmRSS KiB> <open fds>
  local i rss fds
  for i in 0 1; do
    rss=$(awk '$1 == "VmRSS:" { print $2 }' "/proc/${gw_pid[$i]}/status" 2>/dev/null || true)
    fds=$(find "/proc/${gw_pid[$i]}/fd" -mindepth 1 -maxdepth 1 2>/dev/null | wc -l)
    [ -z "$rss" ] || echo "$((SECONDS - load_start)) gw-$i $rss $fds" >>"$samples"
  done
}
(
  trap 'exit 0' TERM
  for _ in $(seq $((duration / 5 + 2))); do
    sample
    sleep 5
  done
) &
sampler_pid=$!

chaos() {
  trap 'exit 0' TERM
  local t down_n=0 down_until=0 flip=0 hup=0 qt=5s redis_at=$((warmup + 25))
  local captcha_at=$((warmup + (duration - warmup) / 4)) chaos_end=$((duration - 15))
  local kill_pool=(1 2 3 4 5 6 8)
  for t in $(seq "$warmup" "$chaos_end"); do
    while [ $((SECONDS - load_start)) -lt "$t" ]; do sleep 0.2; done
    # An upstream killed (SIGKILL) every 20 s, started again on its port 4–8 s later.
    if [ "$down_n" -gt 0 ] && [ "$t" -ge "$down_until" ] && start_upstream "$down_n"; then
      event start-upstream "$(up "$down_n")"
      down_n=0
    fi
    if [ "$down_n" -eq 0 ] && [ $(((t - warmup) % 20)) -eq 10 ] && [ "$t" -lt $((chaos_end - 10)) ]; then
      down_n=${kill_pool[$((RANDOM % ${#kill_pool[@]}))]}
      event kill-upstream "$(up "$down_n")"
      kill -KILL "$(cat "$work/u$down_n.pid")" 2>/dev/null || true
      down_until=$((t + 4 + RANDOM % 5))
    fi
    # Redis stopped for 5 s every 90 s.
    if [ "$t" -eq "$redis_at" ] && [ "$t" -lt $((chaos_end - 10)) ]; then
      event redis-stop
      stop_redis
      sleep 5
      for _ in 1 2 3 4 5; do # its port taken meanwhile: try again
        start_redis && break
        stop_redis
      done
      event redis-start
      redis_at=$((t + 90))
    fi
    # One upstream answers captchas for a while.
    if [ "$t" -eq "$captcha_at" ]; then
      event captcha-on "$(up 2)"
      : >"$captcha_flag"
    fi
    if [ "$t" -eq $((captcha_at + captcha_for)) ]; then
      event captcha-off "$(up 2)"
      rm -f "$captcha_flag"
    fi
    # A reload every 15 s, the instances in turn, queue_timeout changing each time.
    if [ $(((t - warmup) % 15)) -eq 5 ]; then
      [ "$qt" = 5s ] && qt=4s || qt=5s
      write_config "$hup" "$qt"
      event sighup "gw-$hup"
      kill -HUP "${gw_pid[$hup]}"
      hup=$((1 - hup))
    fi
    # The list file flips between {u7, u8} and {u8, u9} every 40 s.
    if [ $(((t - warmup) % 40)) -eq 30 ]; then
      flip=$((1 - flip))
      if [ "$flip" -eq 1 ]; then write_list "$list_b"; else write_list "$list_a"; fi
      event list-flip "$flip"
    fi
  done
  # Everything back up before the load ends.
  if [ "$down_n" -gt 0 ]; then start_upstream "$down_n" && event start-upstream "$(up "$down_n")"; fi
  rm -f "$captcha_flag"
}
chaos &
chaos_pid=$!

wait "$load_pid" || { log "the load failed: $(tail -n 3 "$work/load.err")"; exit 2; }
wait "$chaos_pid" 2>/dev/null || true
chaos_pid=""
kill -TERM "$sampler_pid" 2>/dev/null || true
wait "$sampler_pid" 2>/dev/null || true
sampler_pid=""

# --- after the run: leases left -------------------------------------------------------------
leases_live() {
  local i total=0 n
  for i in 0 1; do
    n=$(curl -s -m 5 "http://127.0.0.1:${admin_port[$i]}/status" |
      grep -o '"leases_live": *[0-9]*' | awk -F': *' '{ s += $2 } END { print s + 0 }')
    total=$((total + n))
  done
  echo "$total"
}
deadline=$((SECONDS + 60))
while [ "$(leases_live)" != 0 ] && [ "$SECONDS" -lt "$deadline" ]; do sleep 1; done
sleep 2
for i in 0 1; do curl -s -m 5 "http://127.0.0.1:${admin_port[$i]}/status" >"$work/status-$i.json"; done
rc() { timeout 5 redis-cli -p "$redis_port" "$@"; }
redis_leases=(
  "default:leases=$(rc ZCOUNT 'pg:{default}:leases' -inf '(+inf')"
  "default:lease_up=$(($(rc HLEN 'pg:{default}:lease_up') - $(rc HEXISTS 'pg:{default}:lease_up' '~')))"
  "default:live=$(rc HVALS 'pg:{default}:live' | awk '{ s += $1 } END { print s + 0 }')"
  "listed:held=$(rc HVALS 'pg:{listed}:held' | awk '{ s += $1 } END { print s + 0 }')"
)
warnings=$(cat "$work"/gw-*.err | grep -c ' WARN \| ERROR ' || true)
# When each instance served from its local view: its own log says when it switched and back.
for i in 0 1; do
  grep -E 'store degraded|\(store ok\)' "$work/gw-$i.err" | while read -r ts line; do
    case "$line" in *"store degraded"*) what=degraded ;; *) what=ok ;; esac
    echo "$(date -d "$ts" +%s%3N) $what gw-$i"
  done
done >"$work/degraded.log"

stamp=$(date -u +%Y%m%dT%H%M%SZ)
rev=$(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo unknown)
git -C "$root" diff --quiet HEAD 2>/dev/null || rev="$rev+dirty"
cpu=$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -n 1)
status_files=("$work/status-0.json" "$work/status-1.json")
events_files=("$work"/u[1-6].events)
out_dir=$root/bench/out/soak-$stamp
mkdir -p "$out_dir"
echo
echo "poolgate soak with chaos: $((duration / 60)) min $((duration % 60)) s of load (${warmup} s warm-up), commit $rev, $(nproc) cores ($cpu), $(redis-server --version | cut -d' ' -f3)"
echo
timeout 60 "$soak" report --load "$work/load.json" --samples "$samples" \
  --status "${status_files[0]}" --status "${status_files[1]}" \
  $(for f in "${events_files[@]}"; do printf -- '--events %s ' "$f"; done) \
  --chaos-log "$chaos_log" $(for r in "${redis_leases[@]}"; do printf -- '--redis-leases %s ' "$r"; done) \
  --warmup-s "$warmup" --duration-s "$duration" --cap "$cap" \
  --captcha-upstream "http://$(up 2)" --degraded "$work/degraded.log" \
  --meta "gateway log lines at warn level or above: $warnings (in $out_dir/gw-*.err)" \
  --meta "load average at the end: $(cut -d' ' -f1-3 /proc/loadavg)" >"$work/report.md" ||
  { log "the report failed"; exit 2; }
cat "$work/report.md"
cp "$work"/*.json "$work"/*.tsv "$work"/*.log "$work"/*.err "$work"/*.events "$work"/*.toml "$work/report.md" "$out_dir"/ 2>/dev/null || true
echo
echo "raw files: ${out_dir#"$root"/}"
grep -q '^soak: PASSED' "$work/report.md" || exit 1
