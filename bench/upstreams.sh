#!/usr/bin/env bash
# How poolgate's cost grows with the size of one pool: 10, 1k, 10k and 100k members, on the
# memory store and on Redis. For each size and store it prints one row: start-up time (launch to
# the first proxied 200), reload time (SIGHUP with one member changed, to the new generation in
# /status), RSS after start and after the load, HTTP req/s (wrk, absolute form, 32 keep-alive
# connections, least-used) with idle upstream connections kept (the default) and with none kept
# (`upstream_max_idle_per_key = 0`, a restart: every request opens an upstream connection, at
# every size alike), and the size and time of GET /status (default page of 1,000 members),
# /status?upstreams=none and /metrics.
#
# Kept idle connections are what makes the first req/s figure fall with size: least-used spreads
# requests over every member, so a pool of N members keeps up to N idle connections, each used
# once every N requests (and each holding a connection of the fake upstream to the origin: at 10k
# members the 8 fakes, one process, reach its open-file limit). The second figure is the pool's
# own cost.
#
#   bench/upstreams.sh                    # sizes 10 1000 10000 100000, both stores
#   bench/upstreams.sh --sizes "10 1000"  # other sizes
#   bench/upstreams.sh --seconds 5        # wrk duration per row (default 5)
#   bench/upstreams.sh --stores redis     # one store
#
# The members are named entries (`{ url, name }`) over the 8 fake upstream proxies of
# bench_fixture, so a pool of 100,000 members has 100,000 ids, leases and health records while
# the machine runs 8 proxies. Everything binds 127.0.0.1 and is stopped on exit. Installs wrk,
# redis-server and curl with apt-get when they are missing.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
log() { printf 'upstreams: %s\n' "$*" >&2; }
# shellcheck source=bench/common.sh
. "$root/bench/common.sh"

sizes="10 1000 10000 100000"
stores="memory redis"
secs=5
while [ $# -gt 0 ]; do
  case "$1" in
    --sizes) sizes=${2:?--sizes needs a list}; shift ;;
    --seconds) secs=${2:?--seconds needs a number}; shift ;;
    --stores) stores=${2:?--stores needs a list}; shift ;;
    -h | --help) sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "upstreams: unknown option $1" >&2; exit 64 ;;
  esac
  shift
done

install_missing wrk:wrk redis-server:redis-server curl:curl
build_release

bench_workdir
now_ms() { date +%s%3N; }
k() { awk -v n="$1" 'BEGIN { printf "%.0f", n / 1024 }'; } # KiB → MiB, bytes → KiB
kib() { awk -v k="$2" '$1 == k":" { print $2 }' "/proc/$1/status"; }

lifetime=--max-lifetime=3600s
start origin "$fixture" "$lifetime" origin
wait_for 10 grep -q '^ready' "$work/origin.out"
origin=$(sed -n 's/^origin=//p' "$work/origin.out")
start pool "$fixture" "$lifetime" upstream --count 8
wait_for 10 grep -q '^ready' "$work/pool.out"
mapfile -t ups < <(sed -n 's/^upstream=//p' "$work/pool.out")

redis_port=$(timeout 10 "$fixture" free-ports --count 1)
mkdir -p "$work/redis"
start redis redis-server --bind 127.0.0.1 --port "$redis_port" --dir "$work/redis" --save '' \
  --appendonly no
wait_for 10 redis-cli -p "$redis_port" ping

members() { # members N SHIFT: N named entries over the fake upstreams; SHIFT renames one
  awk -v n="$1" -v shift="$2" -v ups="${ups[*]}" 'BEGIN {
    k = split(ups, u, " ")
    for (i = 0; i < n; i++) {
      name = (i == 0 && shift) ? "m0-renamed" : "m" i
      printf "{ url = \"http://%s\", name = \"%s\" },\n", u[i % k + 1], name
    }
  }'
}
write_config() { # write_config FILE STORE N SHIFT [SERVER-LINE]
  local store="kind = \"memory\""
  [ "$2" = redis ] && store="kind = \"redis\""$'\n'"url = \"redis://127.0.0.1:$redis_port\""$'\n'"key_prefix = \"$prefix\""
  {
    printf '[server]\nlisten = "127.0.0.1:%s"\nadmin_listen = "127.0.0.1:%s"\n%s\n' "$port" "$admin" "${5:-}"
    printf '[store]\n%s\n' "$store"
    printf '[policy]\nallow_private_targets = true\n'
    printf '[pools.default]\nupstreams = [\n'
    members "$3" "$4"
    printf ']\n'
  } >"$1"
}
timed_get() { # timed_get URL: prints "bytes ms"
  curl -s -o /dev/null -m 120 -w '%{size_download} %{time_total}\n' "$1" |
    awk '{ printf "%d %.0f\n", $1, $2 * 1000 }'
}
reloaded() { [ "$(generation)" -gt "$1" ]; }
generation() {
  curl -s -m 10 "http://127.0.0.1:$admin/status?upstreams=none" |
    sed -nE 's/.*"generation": *([0-9]+).*/\1/p' | head -1
}

wrk_rps() { # wrk_rps LABEL: req/s through the gateway on $port
  local line rps non2xx
  line=$(timeout $((secs + 30)) wrk -t2 -c32 -d"${secs}s" --timeout 5s -s "$root/bench/proxy.lua" \
    "http://127.0.0.1:$port/" -- "http://$origin/1k" | grep '^wrk-result' || true)
  rps=$(awk -v r="$(sed -nE 's/.* requests=([0-9]+).*/\1/p' <<<"$line")" \
    -v d="$(sed -nE 's/.* duration_us=([0-9]+).*/\1/p' <<<"$line")" \
    'BEGIN { if (d > 0) printf "%.0f", r / (d / 1e6); else print "—" }')
  non2xx=$(sed -nE 's/.* non2xx=([0-9]+).*/\1/p' <<<"$line")
  [ "${non2xx:-0}" = 0 ] || log "$1: $non2xx responses were not 2xx"
  echo "$rps"
}

printf '| store | members | start s | reload s | RSS MiB (start / after load) | req/s, idle connections kept | req/s, none kept | RSS MiB after load, none kept | /status KiB, ms | /status?upstreams=none KiB, ms | /metrics KiB, ms |\n'
printf '|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n'
for store in $stores; do
  for n in $sizes; do
    mapfile -t pa < <(timeout 10 "$fixture" free-ports --count 2)
    port=${pa[0]} admin=${pa[1]}
    cfg="$work/gateway-$store-$n.toml"
    prefix="pg$n"
    write_config "$cfg" "$store" "$n" 0
    t0=$(now_ms)
    POOLGATE_LOG=warn start "gw-$store-$n" "$poolgate" --config "$cfg"
    gw=$started
    if ! wait_for 600 curl -sf -m 5 -o /dev/null -x "http://127.0.0.1:$port" "http://$origin/1k"; then
      log "$store $n: the gateway did not serve within 600 s: $(tail -n 2 "$work/gw-$store-$n.err")"
      stop_all "$gw"
      continue
    fi
    start_s=$(awk -v a="$t0" -v b="$(now_ms)" 'BEGIN { printf "%.2f", (b - a) / 1000 }')
    rss0=$(kib "$gw" VmRSS)
    # Reload: one member renamed (one leaves, one joins).
    gen0=$(generation)
    write_config "$cfg" "$store" "$n" 1
    t0=$(now_ms)
    kill -HUP "$gw"
    if wait_for 600 reloaded "${gen0:-0}"; then
      reload_s=$(awk -v a="$t0" -v b="$(now_ms)" 'BEGIN { printf "%.2f", (b - a) / 1000 }')
    else
      reload_s="—"
    fi
    rps=$(wrk_rps "$store $n")
    rss1=$(kib "$gw" VmRSS)
    read -r sb sms < <(timed_get "http://127.0.0.1:$admin/status")
    read -r nb nms < <(timed_get "http://127.0.0.1:$admin/status?upstreams=none")
    read -r mb mms < <(timed_get "http://127.0.0.1:$admin/metrics")
    stop_all "$gw"
    # Again with no idle upstream connection kept (fixed at start: a restart).
    write_config "$cfg" "$store" "$n" 0 "upstream_max_idle_per_key = 0"
    POOLGATE_LOG=warn start "gw-$store-$n-new" "$poolgate" --config "$cfg"
    gw=$started
    if wait_for 600 curl -sf -m 5 -o /dev/null -x "http://127.0.0.1:$port" "http://$origin/1k"; then
      rps_new=$(wrk_rps "$store $n, none kept")
      rss_new=$(k "$(kib "$gw" VmRSS)")
    else
      rps_new="—" rss_new="—"
    fi
    stop_all "$gw"
    printf '| %s | %s | %s | %s | %s / %s | %s | %s | %s | %s, %s | %s, %s | %s, %s |\n' \
      "$store" "$n" "$start_s" "$reload_s" "$(k "$rss0")" "$(k "$rss1")" "$rps" "$rps_new" \
      "$rss_new" "$(k "$sb")" "$sms" "$(k "$nb")" "$nms" "$(k "$mb")" "$mms"
  done
done
