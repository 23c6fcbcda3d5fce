#!/usr/bin/env bash
# The compose cluster's `monitoring` profile for real: builds its Prometheus
# image (deploy/monitoring/prometheus.Dockerfile: Debian's package on the
# offline base image), starts deploy/compose.yaml with the profile on free
# host ports, and checks that Prometheus scrapes the three nodes without an
# error, loads and evaluates every rule of deploy/monitoring/alerts.yml
# without one, and sees one active controller and three ready brokers. The
# compose project and the Prometheus image it built are removed on exit,
# failed or not. Exits non-zero on the first failed check.
#
# Usage: tests/deploy/monitoring.sh    (needs docker and docker compose or
#                                       docker-compose 1.28+)
# Environment: SAMSA_IMAGE=<image> the samsa image to run (tests/run-all.sh
#              passes the one it built); default samsa:latest, which
#              deploy/build-image.sh makes. The base image samsa-base:bookworm
#              must exist (deploy/build-image.sh makes it too).
set -euo pipefail

repo=$(cd "$(dirname "$0")/../.." && pwd)
cd "$repo"
project=samsa-mon-$$
export SAMSA_IMAGE=${SAMSA_IMAGE:-samsa:latest}
export SAMSA_PROMETHEUS_IMAGE=samsa-prometheus-test:$$
started=$SECONDS

if docker compose version >/dev/null 2>&1; then
    compose_cmd=(docker compose)
else
    compose_cmd=(docker-compose)
fi
compose() {
    "${compose_cmd[@]}" -p "$project" -f deploy/compose.yaml --profile monitoring "$@"
}

cleanup() {
    local status=$?
    if [[ $status -ne 0 ]]; then
        echo "--- logs (last 40 lines of each service)" >&2
        compose logs --no-color --tail 40 >&2 2>&1 || true
    fi
    compose down -v --remove-orphans -t 2 >/dev/null 2>&1 || true
    docker image rm "$SAMSA_PROMETHEUS_IMAGE" >/dev/null 2>&1 || true
    echo "monitoring.sh: $([[ $status -eq 0 ]] && echo passed || echo FAILED) in $((SECONDS - started)) s" >&2
    exit "$status"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

fail() { echo "FAIL: $*" >&2; exit 1; }
ok() { echo "ok: $*"; }

# shellcheck source=tests/deploy/ports.sh
source tests/deploy/ports.sh
for i in 0 1 2; do
    take_free_port "SAMSA_PORT_$i"
    take_free_port "SAMSA_HTTP_PORT_$i"
done
take_free_port SAMSA_PROMETHEUS_PORT
api="http://127.0.0.1:$SAMSA_PROMETHEUS_PORT/api/v1"

# Reads a Prometheus API answer on stdin and runs the Python expression
# $1 on its `data` (`d`); prints the result.
json() {
    python3 -c "import json, sys; d = json.load(sys.stdin)['data']; print($1)"
}

# Polls `command` until its output is `expected` or `seconds` pass.
wait_for() {
    local what=$1 expected=$2 seconds=$3 got=
    shift 3
    local deadline=$((SECONDS + seconds))
    while :; do
        got=$("$@" 2>/dev/null || true)
        [[ $got == "$expected" ]] && return 0
        ((SECONDS < deadline)) || fail "$what: '$got' after $seconds s, expected '$expected'"
        sleep 1
    done
}

echo "== the Prometheus image"
build_start=$SECONDS
out=$(compose build prometheus 2>&1) || { echo "$out" >&2; fail "building the Prometheus image"; }
size=$(docker image inspect "$SAMSA_PROMETHEUS_IMAGE" --format '{{.Size}}')
ok "$SAMSA_PROMETHEUS_IMAGE built from Debian's prometheus package in $((SECONDS - build_start)) s, $((size / 1000000)) MB"

echo "== the cluster with the monitoring profile"
out=$(compose up -d 2>&1) || { echo "$out" >&2; fail "compose up"; }

targets() { curl -fsS "$api/targets" | json "sorted(t['health'] + ':' + t['lastError'] for t in d['activeTargets'])"; }
wait_for "the scrape targets" "['up:', 'up:', 'up:']" 120 targets
ok "Prometheus scrapes samsa-0..2 without an error"

rules=$(grep -c '^ *- alert:' deploy/monitoring/alerts.yml)
evaluated() { curl -fsS "$api/rules" | json "sum(r['health'] == 'ok' for g in d['groups'] for r in g['rules'])"; }
wait_for "rules evaluated without error" "$rules" 60 evaluated
ok "the $rules rules of deploy/monitoring/alerts.yml evaluate without error"

query() { curl -fsS "$api/query" --data-urlencode "query=$1" | json "d['result'][0]['value'][1] if d['result'] else None"; }
wait_for "sum(samsa_broker_ready)" 3 60 query 'sum(samsa_broker_ready)'
wait_for "sum(samsa_controller_active)" 1 30 query 'sum(samsa_controller_active)'
ok "Prometheus sees three ready brokers and one active controller"
