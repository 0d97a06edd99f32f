#!/usr/bin/env bash
# `make test`: run each tier (`make test-<tier>`) in turn, name it and its time as it
# goes, and end with which tiers passed, failed or did not run. A failed tier does
# not stop the next (later tiers build what they need themselves), so one run
# shows every failure; Ctrl-C or SIGTERM stops the run and still prints the summary.
set -uo pipefail

declare -A status seconds
tiers=("$@")
make=${MAKE:-make}

summary() {
    local failed=()
    echo
    echo "make test: summary"
    for tier in "${tiers[@]}"; do
        local s=${status[$tier]:-not run}
        local t=${seconds[$tier]:+$((seconds[$tier] / 60))m$((seconds[$tier] % 60))s}
        printf '  %-12s %-11s %s\n' "$tier" "$s" "$t"
        [[ $s == passed ]] || failed+=("$tier")
    done
    if ((${#failed[@]})); then
        echo "make test: not passed: ${failed[*]} (each tier's output is above; rerun one with make test-<tier>)"
        return 1
    fi
    echo "make test: every tier passed"
}

trap 'echo; echo "make test: interrupted"; summary; exit 130' INT TERM

for tier in "${tiers[@]}"; do
    echo "==> tier $tier: started $(date -u +%H:%M:%S)"
    start=$SECONDS
    status[$tier]=interrupted
    if "$make" --no-print-directory "test-$tier"; then status[$tier]=passed; else status[$tier]=failed; fi
    seconds[$tier]=$((SECONDS - start))
    echo "==> tier $tier: ${status[$tier]} in $((seconds[$tier] / 60))m$((seconds[$tier] % 60))s"
done
summary
