#!/usr/bin/env bash
# Requests/s through one pool as the number of distinct target hosts grows: 10, 1k and 100k
# hosts, each request's host drawn at random (bench/targets.lua), on the memory store, with the
# pool's default health settings (`max_targets = 1000`: past it, the least recently seen target's
# statistics are forgotten). Each row starts a fresh gateway; rounds alternate the sizes, and each
# row's req/s is also given as a ratio to the first size of its round (the machine drifts between
# rounds). Also the gateway's RSS after the load.
#
#   bench/targets.sh                          # 10 1000 100000 hosts, 3 rounds, 10 s a row
#   bench/targets.sh --sizes "10 100000" --rounds 5 --seconds 5
#
# The 8 fake upstreams of bench_fixture run with `--sink`: every request goes to the one loopback
# origin whatever host it names, and nothing else is dialled. Everything binds 127.0.0.1 and is
# stopped on exit. Installs wrk and curl with apt-get when they are missing.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
log() { printf 'targets: %s\n' "$*" >&2; }
# shellcheck source=bench/common.sh
. "$root/bench/common.sh"

sizes="10 1000 100000"
rounds=3
secs=10
while [ $# -gt 0 ]; do
  case "$1" in
    --sizes) sizes=${2:?--sizes needs a list}; shift ;;
    --rounds) rounds=${2:?--rounds needs a number}; shift ;;
    --seconds) secs=${2:?--seconds needs a number}; shift ;;
    -h | --help) sed -n '2,14p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "targets: unknown option $1" >&2; exit 64 ;;
  esac
  shift
done

install_missing wrk:wrk curl:curl
build_release

bench_workdir
lifetime=--max-lifetime=3600s
start origin "$fixture" "$lifetime" origin
wait_for 10 grep -q '^ready' "$work/origin.out"
origin=$(sed -n 's/^origin=//p' "$work/origin.out")
start pool "$fixture" "$lifetime" upstream --count 8 --sink "$origin"
wait_for 10 grep -q '^ready' "$work/pool.out"
mapfile -t ups < <(sed -n 's/^upstream=//p' "$work/pool.out")
upstream_list=$(printf '"http://%s", ' "${ups[@]}")

printf '| round | target hosts | req/s | ÷ first size | RSS MiB after |\n'
printf '|---:|---:|---:|---:|---:|\n'
for round in $(seq "$rounds"); do
  first=""
  for n in $sizes; do
    mapfile -t pa < <(timeout 10 "$fixture" free-ports --count 2)
    port=${pa[0]} admin=${pa[1]}
    cfg="$work/gateway-$round-$n.toml"
    printf '[server]\nlisten = "127.0.0.1:%s"\nadmin_listen = "127.0.0.1:%s"\n[policy]\nallow_private_targets = true\n[pools.default]\nupstreams = [%s]\n' \
      "$port" "$admin" "$upstream_list" >"$cfg"
    POOLGATE_LOG=warn start "gw-$round-$n" "$poolgate" --config "$cfg"
    gw=$started
    wait_for 30 curl -sf -m 5 -o /dev/null -x "http://127.0.0.1:$port" "http://198.18.0.1/1k"
    line=$(timeout $((secs + 30)) wrk -t2 -c32 -d"${secs}s" --timeout 5s -s "$root/bench/targets.lua" \
      "http://127.0.0.1:$port/" -- "$n" /1k | grep '^wrk-result' || true)
    r=$(sed -nE 's/.* requests=([0-9]+).*/\1/p' <<<"$line")
    d=$(sed -nE 's/.* duration_us=([0-9]+).*/\1/p' <<<"$line")
    bad=$(sed -nE 's/.* non2xx=([0-9]+).*/\1/p' <<<"$line")
    [ "${bad:-0}" = 0 ] || log "round $round, $n hosts: $bad responses were not 2xx"
    rps=$(awk -v r="${r:-0}" -v d="${d:-0}" 'BEGIN { if (d > 0) printf "%.0f", r / (d / 1e6); else print 0 }')
    [ -n "$first" ] || first=$rps
    rss=$(awk '$1 == "VmRSS:" { printf "%.1f", $2 / 1024 }' "/proc/$gw/status")
    stop_all "$gw"
    awk -v round="$round" -v n="$n" -v rps="$rps" -v first="$first" -v rss="$rss" \
      'BEGIN { printf "| %d | %d | %d | %.2f | %s |\n", round, n, rps, (first > 0 ? rps / first : 0), rss }'
  done
done
