#!/usr/bin/env bash
# `make test`: run each tier (`make test-<tier>`) in turn, name it and its time as it
# goes, and end with which tiers passed, failed or did not run. A failed tier does
# not stop the next (later tiers build what they need themselves), so one run
# shows every failure; Ctrl-C or SIGTERM stops the run and still prints the summary.
# Each argument is TIER or TIER=MINUTES, its share of the time budget: a tier over its
# share is named at the end (not a failure: CI's own limit is the guard that fails).
set -uo pipefail

declare -A status seconds share
tiers=()
for arg in "$@"; do
    tier=${arg%%=*}
    tiers+=("$tier")
    [[ $arg == *=* ]] && share[$tier]=$((${arg#*=} * 60))
done
make=${MAKE:-make}

mmss() { echo "$(($1 / 60))m$(($1 % 60))s"; }

summary() {
    local failed=() over=() total=0 budget=0
    echo
    echo "make test: summary"
    for tier in "${tiers[@]}"; do
        local s=${status[$tier]:-not run} t=${seconds[$tier]:-} b=${share[$tier]:-}
        printf '  %-12s %-11s %-9s %s\n' "$tier" "$s" "${t:+$(mmss "$t")}" "${b:+of $(mmss "$b")}"
        [[ $s == passed ]] || failed+=("$tier")
        total=$((total + ${t:-0})) budget=$((budget + ${b:-0}))
        [[ -n $t && -n $b ]] && ((t > b)) && over+=("$tier ($(mmss "$t") > $(mmss "$b"))")
    done
    ((budget)) && printf '  %-12s %-11s %-9s %s\n' all "" "$(mmss $total)" "of $(mmss $budget)"
    if ((${#over[@]})); then
        echo "make test: over its share of the time budget: ${over[*]}"
    fi
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
    echo "==> tier $tier: ${status[$tier]} in $(mmss "${seconds[$tier]}")${share[$tier]:+ (share $(mmss "${share[$tier]}"))}"
done
summary
