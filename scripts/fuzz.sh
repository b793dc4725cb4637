#!/usr/bin/env bash
# Runs every fuzz target (fuzz/fuzz_targets/) for SECONDS each (default
# 300) on nightly with cargo-fuzz, growing fuzz/corpus/<target>, and prints
# each target's executions. A crash leaves its input in
# fuzz/artifacts/<target>/ and stops the script.
#   cargo install cargo-fuzz; SECONDS_EACH=600 scripts/fuzz.sh [TARGET ...]
set -euo pipefail
cd "$(dirname "$0")/../fuzz"
SECONDS_EACH=${SECONDS_EACH:-300}
targets=("$@")
[ ${#targets[@]} -gt 0 ] || mapfile -t targets < <(ls fuzz_targets | sed 's/\.rs$//')
# Build once, then run the binaries: a change to the sources while the
# targets run does not rebuild them half way.
cargo +nightly fuzz build -O
bin=target/x86_64-unknown-linux-gnu/release
for target in "${targets[@]}"; do
    log=$(mktemp)
    mkdir -p "artifacts/$target"
    "$bin/$target" "corpus/$target" -artifact_prefix="artifacts/$target/" \
        -max_total_time="$SECONDS_EACH" -rss_limit_mb=2048 -timeout=10 -print_final_stats=1 >"$log" 2>&1 || {
        tail -40 "$log"
        exit 1
    }
    execs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' || echo "?")
    cov=$(grep -o 'cov: [0-9]*' "$log" | tail -1)
    echo "$target: $execs executions in ${SECONDS_EACH}s, $cov, corpus $(ls "corpus/$target" | wc -l) inputs"
    rm -f "$log"
done
