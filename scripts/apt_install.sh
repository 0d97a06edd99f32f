#!/usr/bin/env bash
# Install those of the named Debian packages this machine lacks: the set-up steps of
# `make` and the tests (the engine, podman, debootstrap, nftables...). `make test` runs
# set-up beside a tier (its background jobs), and apt takes one caller at a time, so
# a second caller failed at once on apt's lock (a fresh machine, 2026-11-29: the image
# tier's engine install beside the trained model's). Here each caller waits its turn
# on one lock, and apt waits for a lock another program (unattended-upgrades) holds.
set -euo pipefail

missing() {
    local package
    for package in "$@"; do
        dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q 'ok installed' ||
            echo "$package"
    done
}

[[ -n $(missing "$@") ]] || exit 0
if ((EUID != 0)); then # a developer's `make test-fast`: the tests that need them say so
    echo "apt: not root, so not installing Debian's $(missing "$@" | xargs)" >&2
    exit 0
fi
exec 9>/run/lock/zenvllm-apt.lock
flock 9
mapfile -t wanted < <(missing "$@") # another caller may have installed some meanwhile
((${#wanted[@]})) || exit 0
echo "apt: installing Debian's ${wanted[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
wait_lock=(-o DPkg::Lock::Timeout=600)
apt-get "${wait_lock[@]}" update -qq
apt-get "${wait_lock[@]}" install -y -qq --no-install-recommends "${wanted[@]}" >/dev/null
