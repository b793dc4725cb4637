#!/usr/bin/env bash
# Long fault-harness runs (tests/faults.rs): every seed in SEEDS on 3 and 5
# nodes, in log and metadata mode, CYCLES fault cycles each. Prints each
# run's figure line; stops at the first failure, prints its report (which
# names the replay) and keeps the whole output in OUT (default
# fault-sweep.log).
# CARGO_FLAGS (e.g. --release) go to every cargo test.
#   SEEDS="1 2 3" CYCLES=100 CARGO_FLAGS=--release scripts/fault-sweep.sh
set -uo pipefail
cd "$(dirname "$0")/.."
SEEDS=${SEEDS:-"11 12 13"}
CYCLES=${CYCLES:-100}
OUT=${OUT:-fault-sweep.log}
CARGO_FLAGS=${CARGO_FLAGS:-}
# shellcheck disable=SC2086 # CARGO_FLAGS is a list of flags
cargo test --locked $CARGO_FLAGS --test faults --no-run 2>/dev/null || exit 1
for seed in $SEEDS; do
    for mode in log metadata; do
        for nodes in 3 5; do
            if ! KRAFT_FAULT_SEED=$seed KRAFT_FAULT_NODES=$nodes KRAFT_FAULT_CYCLES=$CYCLES KRAFT_FAULT_MODE=$mode \
                cargo test --locked $CARGO_FLAGS --test faults long_fault_run -- --ignored --nocapture >"$OUT" 2>&1; then
                grep -A12 'panicked' "$OUT" | head -40
                echo "(the nodes' last log lines are in $OUT)"
                exit 1
            fi
            grep -E '^faults\[' "$OUT"
        done
    done
done
