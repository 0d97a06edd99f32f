#!/usr/bin/env bash
# `make test`: run each tier (`make test-<tier>`) in turn, name it and its time as it
# goes, and end with which tiers passed, failed or did not run. A failed tier does
# not stop the next (later tiers build what they need themselves), so one run
# shows every failure; Ctrl-C or SIGTERM stops the run and still prints the summary.
# Each argument is TIER or TIER=MINUTES, its share of the time budget: a tier over its
# share is named at the end (not a failure: CI's own limit is the guard that fails).
# BACKGROUND=JOB:AFTER:BEFORE runs `make test-JOB` beside the tiers from the end of tier
# AFTER, its output in .cache/background-JOB.log; tier BEFORE waits for it. It prepares
# what a later tier would build anyway, so its failure fails nothing: that tier builds
# it again and says why.
set -uo pipefail

declare -A status seconds share
tiers=()
for arg in "$@"; do
    tier=${arg%%=*}
    tiers+=("$tier")
    [[ $arg == *=* ]] && share[$tier]=$((${arg#*=} * 60))
done
make=${MAKE:-make}
IFS=: read -r bg_job bg_after bg_before <<<"${BACKGROUND:-}"
bg_pid='' bg_log=.cache/background-${bg_job}.log

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

start_background() {
    mkdir -p .cache
    echo "==> background $bg_job: started $(date -u +%H:%M:%S) beside the next tiers (log: $bg_log)"
    bg_start=$SECONDS
    "$make" --no-print-directory "test-$bg_job" >"$bg_log" 2>&1 &
    bg_pid=$!
}

wait_background() {
    local waited=$SECONDS result=passed
    wait "$bg_pid" || result=failed
    bg_pid=''
    echo "==> background $bg_job: $result in $(mmss $((SECONDS - bg_start)))," \
        "waited for $(mmss $((SECONDS - waited)))"
    [[ $result == passed ]] || tail -n 20 "$bg_log"
}

trap 'echo; echo "make test: interrupted"; [[ -n $bg_pid ]] && kill "$bg_pid"; summary; exit 130' INT TERM

for tier in "${tiers[@]}"; do
    [[ -n $bg_pid && $tier == "$bg_before" ]] && wait_background
    echo "==> tier $tier: started $(date -u +%H:%M:%S)"
    start=$SECONDS
    status[$tier]=interrupted
    if "$make" --no-print-directory "test-$tier"; then status[$tier]=passed; else status[$tier]=failed; fi
    seconds[$tier]=$((SECONDS - start))
    echo "==> tier $tier: ${status[$tier]} in $(mmss "${seconds[$tier]}")${share[$tier]:+ (share $(mmss "${share[$tier]}"))}"
    [[ -n $bg_job && $tier == "$bg_after" ]] && start_background
done
[[ -n $bg_pid ]] && wait_background
summary
