#!/usr/bin/env bash
# Samples a running benchmark point: what each kraft node's /metrics moved
# by, every thread's CPU, and the disk's work, over SECONDS.
#
#   scripts/sample-point.sh [SECONDS] [SETTLE]
#
# Start a long point first, in another shell, for example
#   bench/target/release/kraft-bench ab --native --baseline target/release/kraft \
#       --candidate target/release/kraft --pairs 1 --concurrency 256 --duration-secs 25
# The script waits for a kraft cluster started by kraft-bench (a data
# directory under kraft-bench-kraft-*) to have run SETTLE seconds (default
# 6, past the warm-up), then samples for SECONDS (default 5). Linux only;
# needs curl. It reads /proc and the nodes' HTTP API and changes nothing.
set -euo pipefail
export LC_ALL=C

seconds=${1:-5}
settle=${2:-6}

# The pids of kraft processes started by kraft-bench, by their config path.
nodes() {
    pgrep -f -- "run --config .*/kraft-bench-kraft-[^/]*/node[0-9]*\.toml" || true
}

config_of() {
    tr '\0' '\n' <"/proc/$1/cmdline" | grep -m1 '\.toml$'
}

waited=0
while :; do
    ready=""
    for pid in $(nodes); do
        age=$(ps -o etimes= -p "$pid" 2>/dev/null | tr -d ' ')
        if [ -n "$age" ] && [ "$age" -ge "$settle" ]; then ready=1; fi
    done
    [ -n "$ready" ] && break
    if [ "$waited" -ge 1200 ]; then
        echo "no kraft-bench cluster ran for ${settle}s within 10 minutes" >&2
        exit 1
    fi
    sleep 0.5
    waited=$((waited + 1))
done

pids=$(nodes)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

metrics() { # $1: before|after
    for pid in $pids; do
        config=$(config_of "$pid")
        http=$(grep -m1 '^http' "$config" | grep -o '[0-9.]*:[0-9]*')
        id=$(grep -m1 '^id' "$config" | grep -o '[0-9]*')
        curl -s --max-time 2 "http://$http/metrics" | grep -v '^#' | sort >"$tmp/$1-$id" || true
    done
}

threads() { # $1: before|after; pid/tid name ticks
    for pid in $pids $(pgrep -f "kraft-bench (ab|cluster)" || true); do
        for task in /proc/"$pid"/task/*; do
            [ -r "$task/stat" ] || continue
            # utime and stime are the 12th and 13th fields after the
            # name, which may hold spaces ("log flusher").
            echo "$pid/$(basename "$task") $(tr ' ' _ <"$task/comm") $(sed 's/.*) //' "$task/stat" | awk '{print $12 + $13}')"
        done
    done 2>/dev/null | sort >"$tmp/threads-$1"
}

disk() { # $1: before|after; the device under the data directories
    grep -w "$device" /proc/diskstats >"$tmp/disk-$1" || true
}

config=$(config_of "$(echo "$pids" | head -1)")
data_dir=$(grep -m1 '^data_dir' "$config" | grep -o '"[^"]*"' | tr -d '"')
device=$(basename "$(df --output=source "$data_dir" | tail -1)")

metrics before
threads before
disk before
sleep "$seconds"
metrics after
threads after
disk after

for before in "$tmp"/before-*; do
    id=${before##*-}
    echo "== node $id: counters, per second"
    join "$before" "$tmp/after-$id" |
        awk -v s="$seconds" '$3 != $2 && $1 ~ /_total$/ { printf "  %-52s %14.1f/s\n", $1, ($3 - $2) / s }'
    awk '$1 == "kraft_storage_flushes_total" { f = $2 } $1 == "kraft_storage_flush_seconds_total" { t = $2 }
        END { if (f > 0) printf "  mean flush since start: %.3f ms\n", 1000 * t / f }' "$tmp/after-$id"
done

echo "== threads, cores (over 1%)"
join "$tmp/threads-before" "$tmp/threads-after" |
    awk -v s="$seconds" -v hz="$(getconf CLK_TCK)" '{ c = ($5 - $3) / hz / s; total += c; if (c > 0.01) printf "  %-16s %-18s %.2f\n", $1, $2, c }
        END { printf "  all of them: %.2f cores\n", total }' | sort -k3 -rn

echo "== disk $device"
if [ ! -s "$tmp/disk-before" ] || [ ! -s "$tmp/disk-after" ]; then
    echo "  not in /proc/diskstats (the data directory is on $(df --output=source "$data_dir" | tail -1))"
    exit 0
fi
paste "$tmp/disk-before" "$tmp/disk-after" | awk -v s="$seconds" -v n="$(awk '{print NF}' "$tmp/disk-before")" '{
    w = $(n + 8) - $8; wms = $(n + 11) - $11; busy = $(n + 13) - $13
    printf "  writes %.0f/s (%.3f ms each), busy %.0f%% of the time", w / s, w ? wms / w : 0, busy / 10 / s
    if (n >= 20) { f = $(n + 19) - $19; printf ", cache flushes %.0f/s", f / s }
    printf "\n" }'
