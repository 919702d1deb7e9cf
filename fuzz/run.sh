#!/usr/bin/env bash
# Runs each fuzz target for a bounded time, one after the other, and prints per target the
# executions and the coverage libFuzzer reports at the end.
#
#   fuzz/run.sh [seconds-per-target] [target...]     (default: 60 seconds, every target)
#
# Needs a nightly toolchain and cargo-fuzz (`cargo install cargo-fuzz`). Runs at the lowest CPU
# priority. The committed seeds in fuzz/corpus/<target>/ are only read; what a run adds goes to
# fuzz/target/corpus/<target>/, and logs to fuzz/target/logs/. A crash or hang is written to
# fuzz/artifacts/<target>/ and reproduces with `cargo +nightly fuzz run <target> <file>`.
set -euo pipefail

cd "$(dirname "$0")"
secs="${1:-60}"
shift || true
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
    mapfile -t targets < <(cargo +nightly fuzz list)
fi

# Sanitizer off: the crate forbids unsafe code, and without ASan a target runs several times
# faster. Release with debug assertions, so overflows and debug_assert!s still fail.
flags=(-s none -O -a)
nice -n 19 cargo +nightly fuzz build "${flags[@]}"

mkdir -p target/logs
summary=()
status=0
for t in "${targets[@]}"; do
    mkdir -p "target/corpus/$t" "corpus/$t"
    log="target/logs/$t.log"
    echo "== $t: ${secs}s" >&2
    if nice -n 19 cargo +nightly fuzz run "${flags[@]}" "$t" "target/corpus/$t" "corpus/$t" -- \
        -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
        >"$log" 2>&1; then
        result=ok
    else
        result="FAILED (see $log and artifacts/$t/)"
        status=1
    fi
    execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
    last=$(grep -E '^#[0-9]+' "$log" | tail -1 || true)
    cov=$(sed -n 's/.* cov: \([0-9]*\).*/\1/p' <<<"$last")
    ft=$(sed -n 's/.* ft: \([0-9]*\).*/\1/p' <<<"$last")
    corp=$(sed -n 's/.* corp: \([0-9]*\/[0-9a-zA-Z]*\).*/\1/p' <<<"$last")
    rate=$(sed -n 's/.* exec\/s: \([0-9]*\).*/\1/p' <<<"$last")
    summary+=("$(printf '%-16s %12s %8s %8s %8s %12s  %s' "$t" "${execs:-?}" "${rate:-?}" "${cov:-?}" "${ft:-?}" "${corp:-?}" "$result")")
done

printf '%-16s %12s %8s %8s %8s %12s  %s\n' target executions exec/s cov ft corpus result
printf '%s\n' "${summary[@]}"
exit $status
