#!/usr/bin/env bash
# Builds the container image offline (deploy/build-image.sh) and checks it for
# real: one node on free host ports (health check, produce and consume from
# the host, non-root process, data in the /var/lib/samsa volume, data kept
# across a restart), then three containers samsa-0..2 on a user-defined
# network that form a quorum from identical configuration: the same
# environment, only the host names differ. Every container, network, volume
# and the test image it creates are removed on exit, failed or not. Exits
# non-zero on the first failed check.
#
# Usage: tests/deploy/image.sh    (needs docker; root for the first base build)
# Environment: SAMSA_IMAGE=<image> tests that image instead of building one
#              (tests/run-all.sh passes the one it built).
set -euo pipefail

repo=$(cd "$(dirname "$0")/../.." && pwd)
cd "$repo"
run=samsa-it-$$
image=${SAMSA_IMAGE:-samsa-test:$$}
own_image=$([[ -z ${SAMSA_IMAGE:-} ]] && echo yes || echo no)
samsa=${SAMSA_BIN:-${CARGO_TARGET_DIR:-$repo/target}/release/samsa}
started=$SECONDS

containers=()
networks=()
volumes=()
cleanup() {
    local status=$?
    if [[ $status -ne 0 ]]; then
        for c in "${containers[@]}"; do
            echo "--- logs of $c (last 40 lines)" >&2
            docker logs --tail 40 "$c" >&2 2>&1 || true
        done
    fi
    for c in "${containers[@]}"; do docker rm -fv "$c" >/dev/null 2>&1 || true; done
    for n in "${networks[@]}"; do docker network rm "$n" >/dev/null 2>&1 || true; done
    for v in "${volumes[@]}"; do docker volume rm "$v" >/dev/null 2>&1 || true; done
    [[ $own_image == yes ]] && docker image rm "$image" >/dev/null 2>&1 || true
    echo "image.sh: $([[ $status -eq 0 ]] && echo passed || echo FAILED) in $((SECONDS - started)) s" >&2
    exit "$status"
}
trap cleanup EXIT
# An interrupted run cleans up too: exit, and the EXIT trap runs.
trap 'exit 130' INT TERM

fail() { echo "FAIL: $*" >&2; exit 1; }
ok() { echo "ok: $*"; }

# shellcheck source=tests/deploy/ports.sh
source tests/deploy/ports.sh

# Polls the container's health status until it is healthy (the image's
# HEALTHCHECK runs `samsa health` on /readyz) or the deadline passes.
wait_healthy() {
    local c=$1 deadline=$((SECONDS + $2)) status
    while :; do
        status=$(docker inspect -f '{{.State.Health.Status}}' "$c" 2>/dev/null || echo gone)
        [[ $status == healthy ]] && return 0
        [[ $(docker inspect -f '{{.State.Running}}' "$c" 2>/dev/null) == true ]] ||
            fail "$c stopped (health: $status)"
        ((SECONDS < deadline)) || fail "$c not healthy after $2 s (health: $status)"
        sleep 1
    done
}

echo "== build"
if [[ $own_image == yes ]]; then
    cargo build --release -p samsa
    deploy/build-image.sh "$image"
fi
size=$(docker image inspect "$image" --format '{{.Size}}')
ok "image $image built, $((size / 1000000)) MB"
[[ $(docker image inspect "$image" --format '{{.Config.User}}') == samsa:samsa ]] ||
    fail "image user is not samsa"

echo "== one node"
take_free_port kafka_port
node=$run-single
volume=$run-data
volumes+=("$volume")
containers+=("$node")
docker run -d --name "$node" \
    -p "127.0.0.1:$kafka_port:9092" -p 127.0.0.1::9644 \
    -v "$volume:/var/lib/samsa" \
    -e SAMSA_ADVERTISED_LISTENER="127.0.0.1:$kafka_port" \
    -e SAMSA_NUM_PARTITIONS=2 \
    "$image" >/dev/null
wait_healthy "$node" 60
ok "single node healthy (docker health check on /readyz)"
http=$(docker port "$node" 9644/tcp | head -n1)
curl -fsS "http://$http/readyz" | grep -qx ready || fail "/readyz from the host"
# Read whole before matching: grep -q stops at its first match, and a curl
# still writing the (OpenMetrics, several KiB) page then fails with SIGPIPE.
metrics=$(curl -fsS "http://$http/metrics") || fail "/metrics from the host"
grep -qx 'samsa_broker_ready 1' <<<"$metrics" || fail "/metrics from the host: no samsa_broker_ready 1"
[ "$(tail -n1 <<<"$metrics")" = "# EOF" ] || fail "/metrics from the host: not OpenMetrics (no # EOF)"
ok "/readyz and /metrics answer on the published port $http"

uid=$(docker exec "$node" sh -c "awk '/^Uid:/ { print \$2 }' /proc/1/status")
[[ $uid != 0 && -n $uid ]] || fail "the broker runs as uid '$uid'"
[[ $(docker exec "$node" id -un "$uid") == samsa ]] || fail "uid $uid is not samsa"
ok "the broker (pid 1) runs as uid $uid (samsa)"

bootstrap=127.0.0.1:$kafka_port
"$samsa" topic create image-test -b "$bootstrap" >/dev/null
seq 1 200 | "$samsa" produce image-test --idempotent --acks all -b "$bootstrap"
got=$("$samsa" consume image-test --from-beginning --max-messages 200 -b "$bootstrap" | sort -n)
[[ $got == "$(seq 1 200)" ]] || fail "consumed records differ from the 200 produced"
ok "produced and consumed 200 records from the host through $bootstrap"
# SAMSA_NUM_PARTITIONS reached the broker: the topic got 2 partitions.
docker exec "$node" test -d /var/lib/samsa/image-test-1 || fail "no partition image-test-1: SAMSA_NUM_PARTITIONS ignored?"
owner=$(docker exec "$node" stat -c %U /var/lib/samsa/image-test-0)
[[ $owner == samsa ]] || fail "partition directory owned by $owner"
ok "partition logs written to /var/lib/samsa by samsa"

docker restart "$node" >/dev/null
wait_healthy "$node" 60
got=$("$samsa" consume image-test --from-beginning --max-messages 200 -b "$bootstrap" | sort -n)
[[ $got == "$(seq 1 200)" ]] || fail "records lost across a restart"
ok "records kept across a container restart"
docker rm -fv "$node" >/dev/null
docker run --rm -v "$volume:/data" --entrypoint ls "$image" /data | grep -qx image-test-0 ||
    fail "the partition logs are not in the volume $volume"
ok "the partition logs outlive the container in the volume $volume"

echo "== three nodes, identical configuration"
net=$run-net
docker network create "$net" >/dev/null
networks+=("$net")
voters=1@samsa-0:9093,2@samsa-1:9093,3@samsa-2:9093
start_node() {
    local i=$1 c=$run-$1
    containers+=("$c")
    docker run -d --name "$c" --hostname "samsa-$i" --network "$net" --network-alias "samsa-$i" \
        -e SAMSA_NODE_ID=from-hostname \
        -e SAMSA_ADVERTISED_LISTENER='{hostname}:9092' \
        -e SAMSA_CONTROLLER_QUORUM_VOTERS="$voters" \
        "$image" >/dev/null
}
# Alone, samsa-0 runs (/healthz) but has no quorum, so it is not ready: the
# health check must fail until the other two join.
start_node 0
deadline=$((SECONDS + 60))
until docker exec "$run-0" samsa health --url http://127.0.0.1:9644/healthz >/dev/null 2>&1; do
    ((SECONDS < deadline)) || fail "samsa-0 /healthz does not answer"
    sleep 1
done
if docker exec "$run-0" samsa health >/dev/null 2>&1; then
    fail "samsa-0 is ready without a quorum"
fi
ok "samsa-0 alone: /healthz 200, /readyz refused (no quorum), health check fails"
start_node 1
start_node 2
for i in 0 1 2; do wait_healthy "$run-$i" 120; done
ok "samsa-0..2 healthy"

in_net() { docker run --rm -i --network "$net" --entrypoint samsa "$image" "$@"; }
status=$(in_net cluster status --controller samsa-0:9093,samsa-1:9093,samsa-2:9093)
echo "$status" | grep -q '^Controller leader:  [123] ' || fail "no controller leader: $status"
for i in 0 1 2; do
    echo "$status" | grep -Eq "^  $((i + 1)) +samsa-$i:9092 +[0-9]+ +active" ||
        fail "broker $((i + 1)) is not samsa-$i:9092, active: $status"
done
ok "one quorum; brokers 1, 2, 3 are samsa-0, samsa-1, samsa-2 (node id = ordinal + 1)"

in_net topic create replicated --partitions 3 --replication-factor 3 -b samsa-0:9092 >/dev/null
seq 1 300 | in_net produce replicated --idempotent --acks all -b samsa-1:9092
got=$(in_net consume replicated --from-beginning --max-messages 300 -b samsa-2:9092 | sort -n)
[[ $got == "$(seq 1 300)" ]] || fail "consumed records differ from the 300 produced"
ok "300 records produced through samsa-1 (acks all, 3 replicas) and consumed through samsa-2"
