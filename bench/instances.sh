#!/usr/bin/env bash
# What Redis pays per proxied request as gateway instances are added: 1, 2 and 4 instances of
# poolgate on one redis-server and on a 3-master Redis Cluster, driven together (one wrk per
# instance), one pool of the fake upstreams of bench_fixture (8 unless told), least-used, no cap
# and one store pool (no shards) unless told. For each row: total req/s, script runs per request
# (EVALSHA calls: the gateways batch the acquires and releases that queue up while a call is under
# way), Redis calls per request (INFO commandstats: the calls scripts make included), Redis CPU
# per request (used_cpu_user + used_cpu_sys of every Redis process over the load, in µs), and
# from it requests/s one Redis core carries: 1e6 / (CPU µs per request). Last, the busiest Redis
# process's CPU per request (the same measure for the one process that used the most over the
# load, in µs): on one redis-server it is the total; on the cluster it is what the master owning
# the most of the pool's work pays, so total / busiest is how many masters' worth the load is
# spread over (a pool without shards is one hash tag, so one master does nearly all of it; with
# `--shards K` its K hash tags spread evenly over the slots, hence the masters). On
# stderr: each cluster row's CPU by node, with --shards where each shard is and how many
# members it holds, and any warning or error the gateways logged.
#
#   bench/instances.sh                 # 1 2 4 instances, 5 s each
#   bench/instances.sh --seconds 10 --counts "1 2"
#   bench/instances.sh --cap 1000                       # a pool with a cap: leases listed
#   bench/instances.sh --strategy least-connections     # (listed too)
#   bench/instances.sh --upstreams 48 --shards 6        # 48 upstreams, in 6 store pools
#
# On a machine of few cores the gateways, wrk and Redis share them: req/s is what this machine
# does, while Redis's CPU and commands per request hold whatever the load. Everything binds
# 127.0.0.1 and is stopped on exit. Installs wrk, redis-server and curl with apt-get when missing.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
log() { printf 'instances: %s\n' "$*" >&2; }
# shellcheck source=bench/common.sh
. "$root/bench/common.sh"

counts="1 2 4"
secs=5
upstreams=8
shards=1
pool_extra=""
while [ $# -gt 0 ]; do
  case "$1" in
    --counts) counts=${2:?--counts needs a list}; shift ;;
    --seconds) secs=${2:?--seconds needs a number}; shift ;;
    --cap)
      case "${2:-}" in '' | *[!0-9]*) echo "instances: --cap takes a number" >&2; exit 64 ;; esac
      pool_extra+="max_concurrency = $2"$'\n'; shift ;;
    --strategy)
      case "${2:-}" in
        least-used | least-connections | round-robin | weighted) ;;
        *) echo "instances: unknown strategy ${2:-}" >&2; exit 64 ;;
      esac
      pool_extra+="strategy = \"$2\""$'\n'; shift ;;
    --shards)
      case "${2:-}" in '' | *[!0-9]*) echo "instances: --shards takes a number" >&2; exit 64 ;; esac
      shards=$2; pool_extra+="shards = $2"$'\n'; shift ;;
    --upstreams)
      case "${2:-}" in '' | *[!0-9]* | 0) echo "instances: --upstreams takes a number > 0" >&2; exit 64 ;; esac
      upstreams=$2; shift ;;
    -h | --help) sed -n '2,26p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "instances: unknown option $1" >&2; exit 64 ;;
  esac
  shift
done

install_missing wrk:wrk redis-server:redis-server curl:curl
build_release

bench_workdir
free_ports() { timeout 10 "$fixture" free-ports --count "$1"; }

lifetime=--max-lifetime=3600s
start origin "$fixture" "$lifetime" origin
wait_for 10 grep -q '^ready' "$work/origin.out"
origin=$(sed -n 's/^origin=//p' "$work/origin.out")
start pool "$fixture" "$lifetime" upstream --count "$upstreams"
wait_for 10 grep -q '^ready' "$work/pool.out"
mapfile -t ups < <(sed -n 's/^upstream=//p' "$work/pool.out")

redis_node() { # redis_node NAME PORT [ARGS...]
  local name=$1 port=$2
  shift 2
  mkdir -p "$work/$name"
  start "$name" redis-server --bind 127.0.0.1 --port "$port" --dir "$work/$name" --save '' \
    --appendonly no "$@"
  wait_for 10 redis-cli -p "$port" ping
}

single_port=$(free_ports 1)
redis_node single "$single_port"
mapfile -t cluster_ports < <(free_ports 3)
for p in "${cluster_ports[@]}"; do
  redis_node "node-$p" "$p" --cluster-enabled yes --cluster-config-file "$work/node-$p.conf"
done
redis-cli --cluster create $(printf '127.0.0.1:%s ' "${cluster_ports[@]}") --cluster-yes \
  >"$work/cluster.log" 2>&1
wait_for 30 sh -c "redis-cli -p ${cluster_ports[0]} cluster info | grep -q cluster_state:ok"

# redis_cpu_us PORTS...: the CPU each node has used (user + sys, µs), one line a node, in order.
redis_cpu_us() {
  local p
  for p in "$@"; do
    redis-cli -p "$p" info cpu | tr -d '\r' | awk -F: \
      '$1 == "used_cpu_user" || $1 == "used_cpu_sys" { t += $2 * 1e6 } END { printf "%.0f\n", t }'
  done
}
redis_evalsha() { # EVALSHA calls, summed over the nodes
  local p total=0 v
  for p in "$@"; do
    v=$(redis-cli -p "$p" info commandstats | tr -d '\r' |
      sed -nE 's/^cmdstat_evalsha:calls=([0-9]+).*/\1/p')
    total=$((total + ${v:-0}))
  done
  echo "$total"
}
redis_calls() { # every call, those of scripts included (INFO commandstats)
  local p total=0 v
  for p in "$@"; do
    v=$(redis-cli -p "$p" info commandstats | tr -d '\r' |
      sed -nE 's/^cmdstat_[^:]*:calls=([0-9]+).*/\1/p' | awk '{ t += $1 } END { print t + 0 }')
    total=$((total + v))
  done
  echo "$total"
}

upstream_list=$(printf '"http://%s", ' "${ups[@]}")
printf '| Redis | instances | req/s | script runs / request | calls / request | Redis CPU µs / request | requests/s per Redis core | busiest Redis CPU µs / request |\n'
printf '|---|---:|---:|---:|---:|---:|---:|---:|\n'
for topology in single cluster; do
  if [ "$topology" = single ]; then
    url="redis://127.0.0.1:$single_port"
    nodes=("$single_port")
  else
    url="redis+cluster://$(printf '127.0.0.1:%s,' "${cluster_ports[@]}" | sed 's/,$//')"
    nodes=("${cluster_ports[@]}")
  fi
  for k in $counts; do
    prefix="pg$RANDOM"
    gws=()
    addrs=()
    for i in $(seq "$k"); do
      mapfile -t pa < <(free_ports 2)
      port=${pa[0]} admin=${pa[1]}
      cat >"$work/gw-$topology-$k-$i.toml" <<EOF
[server]
listen = "127.0.0.1:$port"
admin_listen = "127.0.0.1:$admin"
workers = 1

[store]
kind = "redis"
url = "$url"
key_prefix = "$prefix"

[policy]
allow_private_targets = true

[pools.default]
upstreams = [$upstream_list]
$pool_extra
EOF
      POOLGATE_LOG=warn start "gw-$topology-$k-$i" "$poolgate" --config "$work/gw-$topology-$k-$i.toml"
      gws+=("$started")
      addrs+=("127.0.0.1:$port")
    done
    for a in "${addrs[@]}"; do
      wait_for 30 curl -sf -m 5 -o /dev/null -x "http://$a" "http://$origin/1k"
    done
    # A short warm-up, then the measured load.
    warm=()
    for a in "${addrs[@]}"; do
      timeout 30 wrk -t1 -c8 -d1s -s "$root/bench/proxy.lua" "http://$a/" -- "http://$origin/1k" \
        >/dev/null &
      warm+=($!)
    done
    wait "${warm[@]}"
    mapfile -t cpu0 < <(redis_cpu_us "${nodes[@]}")
    cmd0=$(redis_evalsha "${nodes[@]}")
    calls0=$(redis_calls "${nodes[@]}")
    wrks=()
    for i in "${!addrs[@]}"; do
      timeout $((secs + 30)) wrk -t1 -c16 -d"${secs}s" --timeout 5s -s "$root/bench/proxy.lua" \
        "http://${addrs[$i]}/" -- "http://$origin/1k" >"$work/wrk-$i.out" &
      wrks+=($!)
    done
    wait "${wrks[@]}"
    mapfile -t cpu1 < <(redis_cpu_us "${nodes[@]}")
    cmd1=$(redis_evalsha "${nodes[@]}")
    calls1=$(redis_calls "${nodes[@]}")
    reqs=0
    dur=0
    for i in "${!addrs[@]}"; do
      r=$(sed -nE 's/.* requests=([0-9]+).*/\1/p' "$work/wrk-$i.out")
      d=$(sed -nE 's/.* duration_us=([0-9]+).*/\1/p' "$work/wrk-$i.out")
      n=$(sed -nE 's/.* non2xx=([0-9]+).*/\1/p' "$work/wrk-$i.out")
      [ "${n:-0}" = 0 ] || log "$topology $k: instance $i had $n responses not 2xx"
      e=$(sed -nE 's/.* connect_errors=([0-9]+) read_errors=([0-9]+) write_errors=([0-9]+) timeouts=([0-9]+).*/\1 \2 \3 \4/p' \
        "$work/wrk-$i.out")
      [ "${e:-0 0 0 0}" = "0 0 0 0" ] ||
        log "$topology $k: instance $i had socket errors (connect read write timeout): $e"
      reqs=$((reqs + ${r:-0}))
      [ "${d:-0}" -gt "$dur" ] && dur=$d
    done
    # Each node's CPU over the load: the total, and the busiest node's.
    cpu=0
    busiest=0
    each=()
    for j in "${!nodes[@]}"; do
      c=$((cpu1[j] - cpu0[j]))
      cpu=$((cpu + c))
      [ "$c" -gt "$busiest" ] && busiest=$c
      each+=("${nodes[$j]}:$c")
    done
    [ "$topology" = single ] || log "$topology $k: Redis CPU µs by node (port:µs): ${each[*]}"
    # Where the shards are (the store names them `default~<n>`, spread over the slots) and how
    # many members each holds (by a hash of their id).
    if [ "$shards" -gt 1 ] && [ "$k" = "${counts%% *}" ]; then
      split=()
      for p in "${nodes[@]}"; do
        while read -r key; do
          [ -n "$key" ] || continue
          name=${key#*\{}
          split+=("${name%%\}*}@$p:$(redis-cli -p "$p" hlen "$key")")
        done < <(redis-cli -p "$p" --scan --pattern "$prefix:{default~*}:state")
      done
      log "$topology: shards (name@port:members): ${split[*]}"
    fi
    awk -v t="$topology" -v k="$k" -v r="$reqs" -v d="$dur" -v c=$((cmd1 - cmd0)) \
      -v calls=$((calls1 - calls0)) -v cpu="$cpu" -v busiest="$busiest" 'BEGIN {
        if (r == 0 || d == 0) { printf "| %s | %d | — | — | — | — | — | — |\n", t, k; exit }
        us = cpu / r
        printf "| %s | %d | %.0f | %.2f | %.2f | %.1f | %.0f | %.1f |\n", t, k, r / (d / 1e6), c / r, calls / r, us, 1e6 / us, busiest / r
      }'
    stop_all "${gws[@]}"
    # What the gateways logged (warnings and errors only), so that a failure under load shows.
    for i in $(seq "$k"); do
      f="$work/gw-$topology-$k-$i.err"
      [ -s "$f" ] || continue
      log "$topology $k: instance $i logged $(wc -l <"$f") lines, the first:"
      head -n 5 "$f" | sed 's/^/  /' >&2
    done
  done
done
