# Shared by the bench scripts (sourced, not run): installing what they need, building what they
# measure, stopping what they started. Each script sets `root` (the repository) and `log` first.

# install_packages PKG...: installs Debian/Ubuntu packages with apt-get (as root, or with sudo).
install_packages() {
  [ $# -gt 0 ] || return 0
  log "installing: $*"
  local sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  # The package lists once per script, however many installs follow.
  if [ -z "${apt_updated:-}" ]; then
    timeout 300 $sudo apt-get update -qq
    apt_updated=1
  fi
  DEBIAN_FRONTEND=noninteractive timeout 600 $sudo apt-get install -y -qq "$@" >/dev/null
}

# build_release: builds the poolgate binary (release) and the bench_fixture example (the
# `fixture` profile, see Cargo.toml) and sets `target_dir`, `poolgate` (POOLGATE_BIN when given,
# which is then not built) and `fixture`.
#
# Two invocations on purpose: building the example pulls in the dev-dependencies, and cargo
# unifies their features (tokio "full" and "test-util") into everything built in the same
# invocation. The binary measured must be the one users run.
build_release() {
  target_dir=${CARGO_TARGET_DIR:-$root/target}
  if [ -z "${POOLGATE_BIN:-}" ]; then
    log "building poolgate (release) and bench_fixture (fixture profile)"
    timeout 1800 cargo build --release --quiet --bin poolgate
  else
    log "measuring $POOLGATE_BIN; building bench_fixture (fixture profile)"
  fi
  timeout 1800 cargo build --profile fixture --quiet --example bench_fixture
  poolgate=${POOLGATE_BIN:-$target_dir/release/poolgate}
  fixture=$target_dir/fixture/examples/bench_fixture
}

# stop_all PID...: TERM to each, up to 5 s for each to go, then KILL.
stop_all() {
  local pid
  for pid in "$@"; do kill -TERM "$pid" 2>/dev/null || true; done
  for pid in "$@"; do
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
  done
}

# Shared by the curve scripts (upstreams.sh, instances.sh): a work directory, processes started
# in the background and stopped on exit whatever the exit, and a bounded wait.

# bench_workdir: makes $work and arranges for every process in $pids to be stopped and $work
# removed on exit (and on INT/TERM).
bench_workdir() {
  work=$(mktemp -d)
  pids=()
  trap bench_cleanup EXIT
  trap 'exit 130' INT
  trap 'exit 143' TERM
}
bench_cleanup() {
  local status=$?
  trap - EXIT INT TERM
  stop_all "${pids[@]}"
  rm -rf "$work"
  exit "$status"
}

# start NAME CMD...: runs CMD in the background, output in $work/NAME.{out,err}; sets $started.
start() {
  local name=$1
  shift
  "$@" >"$work/$name.out" 2>"$work/$name.err" &
  started=$!
  pids+=("$started")
}

# wait_for SECONDS CMD...: runs CMD until it succeeds, for at most SECONDS.
wait_for() {
  local deadline=$((SECONDS + $1))
  shift
  until "$@" >/dev/null 2>&1; do
    [ "$SECONDS" -lt "$deadline" ] || return 1
    sleep 0.05
  done
}

# install_missing CMD:PACKAGE...: installs the packages whose command is missing.
install_missing() {
  local missing=() tool
  for tool in "$@"; do
    command -v "${tool%%:*}" >/dev/null || missing+=("${tool#*:}")
  done
  install_packages "${missing[@]}"
}
