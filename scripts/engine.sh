#!/usr/bin/env bash
# Make sure a container engine answers on $DOCKER_HOST, the way the host role decides
# (scripts/zenvllm/runtime/hostengine.py): the engine the host has, whatever it is;
# Debian's docker.io, installed and started as the `docker` service, only where no
# engine is installed; a refusal, before anything changes, where the operator's
# engine packages conflict with Debian's.
#
# Where systemd is not PID 1 (CI sandboxes, containers) no engine service can run,
# so this starts zenvllm's own dockerd on /run/zenvllm/docker.sock, and says so:
# nothing starts it again after a reboot. It runs with --bridge=none and no iptables
# or masquerading rules, so the machine's network is left alone: builds and
# containers use --network host (zenvllm passes it everywhere). Containers get a
# 1 GiB /dev/shm by default: vLLM 0.32's message queues need ~400 MiB and Docker's
# 64 MiB default makes a bare `docker run IMAGE --model DIR` fail. BuildKit's
# cache is garbage-collected down to ZENVLLM_BUILD_CACHE (default 20GB): left
# alone it grew to 70 GB in a day of image builds and filled the disk.
set -euo pipefail
# One caller at a time (`make test` starts set-up beside a tier): a second waits, then
# finds the engine the first installed or started.
exec 8>/run/lock/zenvllm-engine.lock
flock 8

hostengine=(python3 "$(dirname "$0")/zenvllm/runtime/hostengine.py")
: "${DOCKER_HOST:=$("${hostengine[@]}" socket)}"
export DOCKER_HOST
sock=${DOCKER_HOST#unix://}
state=${ZENVLLM_ENGINE_STATE:-/var/lib/zenvllm/docker}
run=$(dirname "$sock")

# "use", "start", "install PKG...", "private [PKG...]"; a refusal exits 2 with its reason.
read -r action packages < <("${hostengine[@]}" decide --private-ok --docker-host "$DOCKER_HOST" \
    || echo refuse)
[[ $action == refuse ]] && exit 2
[[ $action == use ]] && exit 0

if [[ -n ${packages:-} ]]; then
    echo "engine: installing Debian's $packages (no engine is installed)" >&2
    # shellcheck disable=SC2086
    "$(dirname "$0")/apt_install.sh" $packages
    # shellcheck disable=SC2086
    "${hostengine[@]}" record $packages
fi

if [[ $action != private ]]; then
    echo "engine: starting the host's docker service (systemd is PID 1)" >&2
    systemctl enable --now docker
    exit 0
fi

mkdir -p "$state" "$run/exec"
# Images, build cache and the test hosts need room; fail here, not deep in a build.
min_free_gib=${ZENVLLM_MIN_FREE_GIB:-10}
free_gib=$(( $(df --output=avail -k "$state" | tail -1) / 1048576 ))
if (( free_gib < min_free_gib )); then
    echo "engine: $state has ${free_gib} GiB free, below ${min_free_gib} GiB;" \
        "free some (ZENVLLM_MIN_FREE_GIB=0 make engine; docker builder prune -f)" \
        "or put the engine's data on a bigger disk with ZENVLLM_ENGINE_STATE=DIR" >&2
    exit 1
fi
cat >"$run/daemon.json" <<EOF
{"builder": {"gc": {"enabled": true, "defaultKeepStorage": "${ZENVLLM_BUILD_CACHE:-20GB}"}}}
EOF
echo "engine: systemd is not PID 1 here, so zenvllm starts its own dockerd on $DOCKER_HOST" \
    "(data in $state); nothing restarts it after a reboot" >&2
nohup dockerd --iptables=false --ip-masq=false --bridge=none --default-shm-size=1g \
    --config-file "$run/daemon.json" --data-root "$state" --exec-root "$run/exec" \
    -H "unix://$sock" --pidfile "$run/dockerd.pid" \
    >"$run/dockerd.log" 2>&1 8>&- & # 8>&-: the daemon must not hold the lock

for _ in $(seq 60); do
    if docker version --format '{{.Server.Version}}' >/dev/null 2>&1; then
        exit 0
    fi
    sleep 0.5
done
echo "engine: dockerd did not answer on $DOCKER_HOST within 30 s; see $run/dockerd.log" >&2
exit 1
