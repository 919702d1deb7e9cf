#!/usr/bin/env bash
# Measures poolgate as a pool gateway against the ceiling of one fake upstream proxy and against
# Squid, Apache Traffic Server, tinyproxy and Dante, on loopback only, bounded in time, and prints
# one table (every figure with its ratio to the ceiling, then poolgate ÷ each peer) that it also
# writes to bench/out/results-<timestamp>.json.
#
#   bench/run.sh            # full run, about 6 minutes after the build (7 columns)
#   bench/run.sh --quick    # shorter measurements, for a smoke run
#   bench/run.sh --runs 3   # repeat everything three times and report medians
#
# Columns:
#   direct           client → one fake upstream proxy → origin (the ceiling)
#   squid            Squid with the 8 fake upstreams as round-robin parents, never direct, no cache
#   trafficserver    Apache Traffic Server, the 8 fake upstreams as parents (parent.config,
#                    round_robin=strict, go_direct=false), no cache, forward proxy; it is given the
#                    origin as localhost:PORT, as it sends every request for 127.0.0.1 direct
#   tinyproxy        tinyproxy with one `upstream http` rule: a single upstream, no pooling (the
#                    last rule matching a host wins, so one target always has one upstream)
#   dante            danted, a SOCKS5 server going direct to the origin (no upstreams, no
#                    pooling): the SOCKS5 rows only
#   poolgate-memory  poolgate on its embedded store, the same 8 upstreams
#   poolgate-redis   poolgate on a Redis store (a redis-server started here), when this build
#                    accepts store.kind = "redis"; otherwise skipped with a note
#
# Rows: plain HTTP through the proxy with wrk (absolute-form, 64 keep-alive connections, 2 threads)
# → req/s, p50, p99; for poolgate the same load inside a label filter (X-Pool-Labels, half of the
# upstreams match); CONNECT setups/s (new connection + CONNECT + one request + close, 32 at a
# time); MB/s through one tunnel (the bulk duration), through one fresh tunnel for a short 3 s,
# and through 8 tunnels at once (their sum); for poolgate and Dante, setups and MB/s through the
# SOCKS5 port (against the ceiling's CONNECT figures, issue #34); the proxy's CPU per GB through
# one tunnel and through many (user + system time over the transfer, warm-up bytes included);
# peak RSS of the proxy under the HTTP load (VmHWM); RSS per idle tunnel with 10,000 tunnels open (VmRSS before and after, on a freshly started proxy); Redis
# commands sent per request (scripts count once; MONITOR during a short extra load) and Redis
# calls per request including those scripts make (INFO commandstats around the HTTP load).
#
# POOLGATE_BIN=path measures that poolgate binary instead of the one just built (to compare two
# builds on the same machine, one run after the other).
#
# Installs wrk, squid, redis-server and curl with apt-get when they are missing (Debian/Ubuntu;
# run as root or with sudo available), like scripts/test, and the peers trafficserver, tinyproxy
# and dante-server; a peer that cannot be installed or started is skipped with a note. Builds target/release/poolgate (or under
# $CARGO_TARGET_DIR) and the bench_fixture example. Everything it starts binds 127.0.0.1 and is
# stopped on exit, whatever the exit.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD

usage() {
  sed -n '2,10p' "$0" | sed 's/^# \{0,1\}//'
  cat <<'EOF'

Options:
  --quick        3 s HTTP load, 3 s CONNECT load, 2 s bulk (default 10 s, 5 s, 5 s)
  --runs N       repeat every measurement N times and report medians; ratios are taken within
                 each run, whose columns are measured one measure at a time (default 1)
  --tunnels N    idle tunnels to hold (default 10000)
  --short-bulk S seconds of the short single-tunnel transfer (default 3)
  --bulk-tunnels N  tunnels streaming at once in the many-tunnel transfer (default 8)
  --only LIST    comma-separated columns to run: direct,squid,ats,tinyproxy,dante,memory,redis
                 (default all; direct is always run, every ratio needs it)
  --micro        also run the placement micro-benchmark (cargo bench --bench hot_paths --
                 placement) and report its target: 100k upstreams within 10x of 1k
EOF
}

quick=0
runs=1
tunnels=10000
only="direct,squid,ats,tinyproxy,dante,memory,redis"
short_s=3
bulk_tunnels=8
micro=0
while [ $# -gt 0 ]; do
  case "$1" in
    --quick) quick=1 ;;
    --micro) micro=1 ;;
    --runs) runs=${2:?--runs needs a number}; shift ;;
    --tunnels) tunnels=${2:?--tunnels needs a number}; shift ;;
    --short-bulk) short_s=${2:?--short-bulk needs a number of seconds}; shift ;;
    --bulk-tunnels) bulk_tunnels=${2:?--bulk-tunnels needs a number}; shift ;;
    --only) only="direct,${2:?--only needs a list}"; shift ;;
    -h | --help) usage; exit 0 ;;
    *) echo "bench: unknown option $1" >&2; usage >&2; exit 64 ;;
  esac
  shift
done
case "$runs$tunnels$short_s$bulk_tunnels" in
  *[!0-9]*) echo "bench: --runs, --tunnels, --short-bulk and --bulk-tunnels take numbers" >&2; exit 64 ;;
esac
[ "$runs" -ge 1 ] || runs=1
[ "$short_s" -ge 1 ] || short_s=1
[ "$bulk_tunnels" -ge 1 ] || bulk_tunnels=1
columns=()
for column in direct squid ats tinyproxy dante memory redis; do
  case ",$only," in *",$column,"*) columns+=("$column") ;; esac
done

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
# The peers: each is installed on its own, and one that cannot be is skipped later with a note
# rather than failing the run.
peer_bin() { command -v "$1" 2>/dev/null || { [ -x "/usr/sbin/$1" ] && echo "/usr/sbin/$1"; } || true; }
declare -A peer_package=([ats]=trafficserver [tinyproxy]=tinyproxy [dante]=dante-server)
declare -A peer_program=([ats]=traffic_server [tinyproxy]=tinyproxy [dante]=danted)
for column in ats tinyproxy dante; do
  case ",$only," in *",$column,"*) ;; *) continue ;; esac
  [ -z "$(peer_bin "${peer_program[$column]}")" ] || continue
  install_packages "${peer_package[$column]}" || log "apt-get install ${peer_package[$column]} failed"
done
ats_bin=$(peer_bin traffic_server)
tinyproxy_bin=$(peer_bin tinyproxy)
danted_bin=$(peer_bin danted)

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
per_target=$((warm_s + http_s + 2 * connect_s + 4 * bulk_s + short_s + 120))
budget=$((runs * ${#columns[@]} * per_target + 120 + micro * 900))
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
# origin_of COLUMN: the origin as that column's proxy is asked for it. Traffic Server sends every
# request for the host 127.0.0.1 direct, whatever parent.config says, so it is given localhost
# (which it does not look up: no_dns_just_forward_to_parent); the fake upstreams take either.
origin_of() { if [ "$1" = ats ]; then echo "localhost:${origin##*:}"; else echo "$origin"; fi; }
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
    ats)
      if [ -z "$ats_bin" ]; then
        note ats "skipped: traffic_server is not installed and apt-get install trafficserver failed"
        return 1
      fi
      port=$(free_ports 1)
      mkdir -p "$dir/etc" "$dir/run" "$dir/log" "$dir/cache"
      # A runroot: Traffic Server's programs and plugins where the package put them; its
      # configuration, runtime files, logs and cache directory here.
      local layout
      layout=$(timeout 10 traffic_layout info 2>/dev/null || true)
      lay() { sed -n "s/^$1: //p" <<<"$layout" | head -n 1; }
      {
        echo "prefix: $dir"
        echo "exec_prefix: $(dirname "$(dirname "$ats_bin")")"
        echo "bindir: $(lay BINDIR)"
        echo "sbindir: $(lay BINDIR)"
        echo "sysconfdir: $dir/etc"
        echo "datadir: /usr/share/trafficserver"
        echo "includedir: $(lay INCLUDEDIR)"
        echo "libdir: $(lay LIBDIR)"
        echo "libexecdir: $(lay PLUGINDIR)"
        echo "localstatedir: $dir/run"
        echo "runtimedir: $dir/run"
        echo "logdir: $dir/log"
        echo "cachedir: $dir/cache"
      } >"$dir/runroot.yaml"
      local f
      for f in remap.config plugin.config storage.config volume.config hosting.config \
        cache.config splitdns.config socks.config ssl_multicert.config strategies.yaml sni.yaml; do
        : >"$dir/etc/$f"
      done
      # No name lookups: nothing here needs one (no_dns_just_forward_to_parent below), and should
      # one happen all the same it must not leave the machine.
      echo "nameserver 127.0.0.1" >"$dir/etc/resolv.conf"
      echo "127.0.0.1 localhost" >"$dir/etc/hosts"
      printf '%s\n' "ip_allow:" "  - apply: in" "    ip_addrs: 127.0.0.0/8" "    action: allow" \
        "    methods: ALL" >"$dir/etc/ip_allow.yaml"
      # strict: the parents in turn, request by request; round_robin=true hashes the client's
      # address, and every client here is 127.0.0.1, so one parent would take everything.
      echo "dest_domain=. parent=\"$(IFS=';'; echo "${upstreams[*]}")\" round_robin=strict go_direct=false" \
        >"$dir/etc/parent.config"
      # Its connection limit counts both sides of a tunnel; it wants 192 descriptors for itself.
      local throttle=30000
      [ "$fds" = unlimited ] || throttle=$((fds - 256))
      # self_detect 0: the parents are on this machine's own address, which Traffic Server would
      # otherwise mark down as itself. uncacheable_requests_bypass_parent 0: with the cache off
      # every request is uncacheable, and would go direct.
      cat >"$dir/etc/records.config" <<ATS_RECORDS
# Generated by bench/run.sh: a forward proxy over the fake upstreams as parents, no cache.
CONFIG proxy.config.http.server_ports STRING $port:ipv4:ip-in=127.0.0.1
CONFIG proxy.config.admin.user_id STRING #-1
CONFIG proxy.config.exec_thread.autoconfig INT 1
CONFIG proxy.config.exec_thread.autoconfig.scale FLOAT 1.0
CONFIG proxy.config.http.cache.http INT 0
CONFIG proxy.config.url_remap.remap_required INT 0
CONFIG proxy.config.reverse_proxy.enabled INT 0
CONFIG proxy.config.http.connect_ports STRING ${origin##*:} ${tunnel_src##*:}
CONFIG proxy.config.http.parent_proxy.self_detect INT 0
CONFIG proxy.config.http.uncacheable_requests_bypass_parent INT 0
CONFIG proxy.config.http.no_dns_just_forward_to_parent INT 1
CONFIG proxy.config.dns.resolv_conf STRING $dir/etc/resolv.conf
CONFIG proxy.config.hostdb.host_file.path STRING $dir/etc/hosts
CONFIG proxy.config.log.logging_enabled INT 0
CONFIG proxy.config.net.connections_throttle INT $throttle
CONFIG proxy.config.net.max_connections_in INT $throttle
ATS_RECORDS
      if ! TS_RUNROOT=$dir timeout 60 "$ats_bin" -C verify_config >"$dir/verify.log" 2>&1; then
        note ats "skipped: traffic_server -C verify_config rejected the generated config: $(grep -iE 'error|fail' "$dir/verify.log" | head -n 1)"
        return 1
      fi
      start "ats-$launch" env TS_RUNROOT="$dir" "$ats_bin"
      proxy_pid=$started
      proxy_addr=127.0.0.1:$port
      ;;
    tinyproxy)
      if [ -z "$tinyproxy_bin" ]; then
        note tinyproxy "skipped: tinyproxy is not installed and apt-get install tinyproxy failed"
        return 1
      fi
      port=$(free_ports 1)
      {
        echo "# Generated by bench/run.sh: one upstream (tinyproxy takes one per matching rule)."
        echo "Port $port"
        echo "Listen 127.0.0.1"
        echo "Timeout 600"
        # A thread per client connection: room for the idle tunnels and the loads.
        echo "MaxClients $((tunnels + 1024))"
        echo "Allow 127.0.0.0/8"
        echo "LogFile \"$dir/tinyproxy.log\""
        echo "LogLevel Critical"
        echo "PidFile \"$dir/tinyproxy.pid\""
        echo "ConnectPort ${origin##*:}"
        echo "ConnectPort ${tunnel_src##*:}"
        echo "upstream http ${upstreams[0]}"
      } >"$dir/tinyproxy.conf"
      start "tinyproxy-$launch" "$tinyproxy_bin" -d -c "$dir/tinyproxy.conf"
      proxy_pid=$started
      proxy_addr=127.0.0.1:$port
      ;;
    dante)
      if [ -z "$danted_bin" ]; then
        note dante "skipped: danted is not installed and apt-get install dante-server failed"
        return 1
      fi
      port=$(free_ports 1)
      local me
      me=$(id -un)
      cat >"$dir/danted.conf" <<DANTE_CONF
# Generated by bench/run.sh: SOCKS5 without authentication, straight to the origin.
logoutput: $dir/danted.log
internal: 127.0.0.1 port = $port
external: 127.0.0.1
clientmethod: none
socksmethod: none
user.privileged: $me
user.unprivileged: $me
client pass {
  from: 127.0.0.0/8 to: 0.0.0.0/0
  log: error
}
socks pass {
  from: 127.0.0.0/8 to: 127.0.0.0/8
  command: connect
  log: error
}
DANTE_CONF
      if ! timeout 30 "$danted_bin" -V -f "$dir/danted.conf" >"$dir/verify.log" 2>&1; then
        note dante "skipped: danted -V rejected the generated config: $(tail -n 1 "$dir/verify.log")"
        return 1
      fi
      start "dante-$launch" "$danted_bin" -f "$dir/danted.conf" -p "$dir/danted.pid"
      proxy_pid=$started
      proxy_addr=127.0.0.1:$port
      proxy_socks=$proxy_addr
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
  # Ready when a request and a tunnel get through it (for Dante, a request through a SOCKS5
  # tunnel).
  local deadline=$((SECONDS + 20)) via=(-x "http://$proxy_addr") url
  url="http://$(origin_of "$column")/1k"
  [ "$column" != dante ] || via=(--socks5 "$proxy_addr")
  until [ "$(curl -s -m 2 -o /dev/null -w '%{http_code}' "${via[@]}" "$url")" = 200 ]; do
    if ! kill -0 "$proxy_pid" 2>/dev/null || [ "$SECONDS" -ge "$deadline" ]; then
      local why
      why=$(tail -n 1 "$work/$column-$launch.err" 2>/dev/null)
      stop "$proxy_pid"
      note "$column" "skipped: the proxy did not come up${why:+ (its last words: $why)}"
      return 1
    fi
    sleep 0.2
  done
  if [ "$column" != dante ] && [ "$(curl -s -m 5 -p "${via[@]}" "$url" | wc -c)" -ne 1024 ]; then
    stop "$proxy_pid"
    note "$column" "skipped: a CONNECT tunnel through the proxy did not work"
    return 1
  fi
}

# --- measurements ----------------------------------------------------------------------------
wrk_run() { # wrk_run SECONDS [LABELS]: prints the wrk-result line; LABELS is an X-Pool-Labels value
  timeout $(($1 + 30)) wrk -t"$wrk_threads" -c"$wrk_conns" -d"${1}s" --timeout 5s \
    -s "$root/bench/proxy.lua" "http://$proxy_addr/" -- "http://$(origin_of "$column")/1k" "${2:-}" |
    grep '^wrk-result'
}
# target_opts COLUMN: sets `tgt` to the bench_fixture options that write tunnel targets as that
# column's proxy is given them (see origin_of).
target_opts() { tgt=(); [ "$1" != ats ] || tgt=(--target-host localhost); }

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
  target_opts "$column"
  cpu0=$(ticks "$proxy_pid")
  if out=$(timeout $((connect_s + 30)) "$fixture" connect-load --proxy "$proxy_addr" --target "$origin" \
    "${tgt[@]}" --concurrency "$connect_concurrency" --duration "${connect_s}s"); then
    record "$column" connect_per_s "$(json_field setups_per_s "$out")"
    record "$column" connect_cpu_us "$(per_unit_us $(($(ticks "$proxy_pid") - cpu0)) "$(json_field setups "$out")")"
    record "$column" connect_p99_ms "$(json_field p99_ms "$out")"
    errors=$(json_field errors "$out")
    [ "${errors:-0}" = 0 ] || note "$column" "run $run: $errors CONNECT setups failed, first: $(json_field first_error "$out")"
  else
    note "$column" "run $run: connect-load failed or timed out"
  fi
}

# bulk_run KEY SECONDS TUNNELS [CPU_KEY]: MB/s through TUNNELS tunnels at once, recorded as KEY,
# and the proxy's CPU per GB moved (warm-up included) as CPU_KEY.
bulk_run() {
  local column=$column out cpu0
  target_opts "$column"
  cpu0=$(ticks "$proxy_pid")
  if out=$(timeout $(($2 + 30)) "$fixture" bulk --proxy "$proxy_addr" --target "$tunnel_src" \
    "${tgt[@]}" --duration "${2}s" --tunnels "$3"); then
    record "$column" "$1" "$(json_field mb_per_s "$out")"
    [ -z "${4:-}" ] || record "$column" "$4" "$(awk -v t=$(($(ticks "$proxy_pid") - cpu0)) \
      -v b="$(json_field bytes_all "$out")" -v hz="$clk_tck" 'BEGIN { if (b > 0) printf "%.1f", t * 1e3 / hz / (b / 1e9) }')"
  else
    note "$column" "run $run: bulk transfer ($1, $3 tunnel(s) for $2 s) failed or timed out"
  fi
}
measure_bulk() { bulk_run tunnel_mb_s "$bulk_s" 1 tunnel_cpu_ms_gb; } # one tunnel, the bulk duration
measure_short() { bulk_run tunnel_short_mb_s "$short_s" 1; }      # one fresh tunnel, a short while
measure_many() { bulk_run tunnels_mb_s "$bulk_s" "$bulk_tunnels" tunnels_cpu_ms_gb; } # many at once

measure_socks() { # SOCKS5 setups and MB/s through one SOCKS5 tunnel (poolgate's and Dante's)
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
  target_opts "$column"
  sleep 0.5
  before=$(kib "$proxy_pid" VmRSS)
  start "holder-$launch" timeout $((budget + 60)) "$fixture" "$lifetime" idle-tunnels \
    --proxy "$proxy_addr" --target "$tunnel_src" "${tgt[@]}" --count "$tunnels" --hold "$((budget))s"
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
declare -A pid_of addr_of admin_of socks_of
use() { proxy_pid=${pid_of[$1]} proxy_addr=${addr_of[$1]} proxy_admin=${admin_of[$1]:-} proxy_socks=${socks_of[$1]:-}; }
# A column that was skipped once (the Redis store not built yet) is not retried.
skipped() { grep -q "^note	$1	skipped" "$raw"; }
# What a peer's column is, said once under the table when it runs.
declare -A peer_note=(
  [ats]="parents = the 8 fake upstreams, round_robin=strict, go_direct=false, no cache; asked for the origin as localhost:PORT (it sends requests for the host 127.0.0.1 direct)"
  [tinyproxy]="one upstream rule: a single fake upstream, no pooling (tinyproxy takes one upstream per matching rule); it closes the client connection after each response, which wrk counts as a read error"
  [dante]="no upstreams, no pooling: danted connects straight to the origin; SOCKS5 rows only"
)
# applies COLUMN MEASURE: Dante, a SOCKS5 server only, takes the SOCKS5 measures alone.
applies() { [ "$1" != dante ] || [ "$2" = socks ]; }

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
    [ "$run" != 1 ] || [ -z "${peer_note[$column]:-}" ] || note "$column" "${peer_note[$column]}"
  done
  for measure in http connect bulk short many socks; do
    for column in "${live[@]}"; do
      applies "$column" "$measure" || continue
      log "run $run/$runs: $measure, $column"
      use "$column"
      "measure_$measure" "$column"
    done
  done
  for column in "${live[@]}"; do stop "${pid_of[$column]}"; done
  for column in "${live[@]}"; do
    applies "$column" idle || continue
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
echo "HTTP: wrk -t$wrk_threads -c$wrk_conns -d${http_s}s; CONNECT: $connect_concurrency at a time for ${connect_s}s; bulk: ${bulk_s}s one tunnel, ${short_s}s one tunnel (short), ${bulk_s}s $bulk_tunnels tunnels; idle tunnels: $tunnels"
echo
timeout 30 "$fixture" report --raw "$raw" --out "$out_json" "${criterion_args[@]}" \
  --meta "timestamp=$stamp" --meta "mode=$mode" --meta "runs=$runs" \
  --meta "cores=$(nproc)" --meta "cpu=$cpu" --meta "kernel=$(uname -r)" --meta "commit=$rev" \
  --meta "http=wrk -t$wrk_threads -c$wrk_conns -d${http_s}s (warm-up ${warm_s}s)" \
  --meta "connect=$connect_concurrency concurrent for ${connect_s}s" \
  --meta "bulk=${bulk_s}s through one tunnel" --meta "short_bulk=${short_s}s through one tunnel" \
  --meta "many_tunnel_bulk=${bulk_s}s through $bulk_tunnels tunnels at once" --meta "idle_tunnels=$tunnels" \
  --meta "upstreams=$pool_size" \
  --meta "squid=$("$squid_bin" -v 2>/dev/null | head -n 1)" \
  --meta "trafficserver=$([ -z "$ats_bin" ] || "$ats_bin" --version 2>/dev/null | grep -m1 -o 'Traffic Server [0-9.]*')" \
  --meta "tinyproxy=$([ -z "$tinyproxy_bin" ] || "$tinyproxy_bin" -v 2>/dev/null | head -n 1)" \
  --meta "dante=$([ -z "$danted_bin" ] || "$danted_bin" -v 2>/dev/null | head -n 1)" \
  --meta "wrk=$(wrk -v 2>&1 | head -n 1)" \
  --meta "loadavg_at_end=$(cut -d' ' -f1-3 /proc/loadavg)"
echo
echo "written: ${out_json#"$root"/}"
