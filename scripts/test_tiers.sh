#!/usr/bin/env bash
# `make test`: run each tier (`make test-<tier>`) in turn, name it and its time as it
# goes, and end with which tiers passed, failed or did not run. A failed tier does
# not stop the next (later tiers build what they need themselves), so one run
# shows every failure; Ctrl-C or SIGTERM stops the run and still prints the summary.
# Each argument is TIER or TIER=MINUTES, its share of the time budget: a tier over its
# share is named at the end (not a failure: CI's own limit is the guard that fails).
# BACKGROUND="JOB:AFTER:BEFORE ..." runs each `make test-JOB` beside the tiers from the
# end of tier AFTER ("-": from the start), its output in .cache/background-JOB.log; tier
# BEFORE waits for it.
# A job prepares what a later tier would make anyway, so its failure fails nothing:
# that tier makes it again and says why.
set -uo pipefail

declare -A status seconds share
tiers=()
for arg in "$@"; do
    tier=${arg%%=*}
    tiers+=("$tier")
    [[ $arg == *=* ]] && share[$tier]=$((${arg#*=} * 60))
done
make=${MAKE:-make}
declare -A bg_after bg_before bg_pid bg_start
bg_jobs=()
for entry in ${BACKGROUND:-}; do
    IFS=: read -r job after before <<<"$entry"
    bg_jobs+=("$job") bg_after[$job]=$after bg_before[$job]=$before
done

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
    local job=$1 log=.cache/background-$1.log
    mkdir -p .cache
    echo "==> background $job: started $(date -u +%H:%M:%S) beside the next tiers (log: $log)"
    bg_start[$job]=$SECONDS
    "$make" --no-print-directory "test-$job" >"$log" 2>&1 &
    bg_pid[$job]=$!
}

wait_background() {
    local job=$1 waited=$SECONDS result=passed
    wait "${bg_pid[$job]}" || result=failed
    unset "bg_pid[$job]"
    echo "==> background $job: $result in $(mmss $((SECONDS - bg_start[$job])))," \
        "waited for $(mmss $((SECONDS - waited)))"
    [[ $result == passed ]] || tail -n 20 ".cache/background-$job.log"
}

# Wait for each job still running that tier $1 waits for ("": every job still running).
wait_for_jobs() {
    for job in "${bg_jobs[@]}"; do
        [[ -n ${bg_pid[$job]:-} && ( -z $1 || ${bg_before[$job]} == "$1" ) ]] && wait_background "$job"
    done
    return 0
}

trap 'echo; echo "make test: interrupted"; kill "${bg_pid[@]}" 2>/dev/null; summary; exit 130' INT TERM

for job in "${bg_jobs[@]}"; do
    [[ ${bg_after[$job]} == - ]] && start_background "$job"
done
for tier in "${tiers[@]}"; do
    wait_for_jobs "$tier"
    echo "==> tier $tier: started $(date -u +%H:%M:%S)"
    start=$SECONDS
    status[$tier]=interrupted
    if "$make" --no-print-directory "test-$tier"; then status[$tier]=passed; else status[$tier]=failed; fi
    seconds[$tier]=$((SECONDS - start))
    echo "==> tier $tier: ${status[$tier]} in $(mmss "${seconds[$tier]}")${share[$tier]:+ (share $(mmss "${share[$tier]}"))}"
    for job in "${bg_jobs[@]}"; do
        [[ ${bg_after[$job]} == "$tier" ]] && start_background "$job"
    done
done
wait_for_jobs ""
summary
