#!/usr/bin/env bash
# THE one command that runs every test of samsa, on a fresh Debian machine as
# root (CI runs it through .ci/run):
#
#   1. installs what is missing (apt: compilers, python3 venv, kcat,
#      rapidjson-dev for librdkafka's statistics tests, prometheus;
#      cargo-nextest; a Python venv with tests/compat/requirements.txt)
#   2. builds the workspace once, in release (all targets): the suites and
#      the container image use that one build; meanwhile the offline base
#      image of the container image is made from Debian packages
#   3. cargo fmt --check, the code map of docs/ARCHITECTURE.md checked
#      against the tree; cargo clippy -D warnings starts in the background at
#      the lowest CPU priority (its own target dir), so it uses only the CPU
#      the suites leave idle while they wait
#   4. cargo nextest (unit tests of every crate + tests/it integration tests)
#   5. side by side, as they mostly wait: pytest tests/compat
#      (confluent-kafka, kafka-python, kcat) then tests/librdkafka/run.sh
#      (librdkafka's own suite, allowlisted tests); and the deploy tests —
#      the container image built (deploy/build-image.sh), the compose
#      cluster's Prometheus (tests/deploy/monitoring.sh), the Helm chart
#      rendered, validated and its pods run as containers, a broker-only pod
#      joining (tests/deploy/helm.sh), the compose cluster's
#      container fault tests (tests/containers)
#
# Every step after the build runs even if an earlier one failed; the script
# exits non-zero if any step failed and prints a summary with durations.
# SKIP_LIBRDKAFKA=1 / SKIP_COMPAT=1 / SKIP_DEPLOY=1 skip those steps for
# quick local runs; the deploy tests need a Docker engine.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
target=${CARGO_TARGET_DIR:-$root/target}
export CARGO_TERM_COLOR=${CARGO_TERM_COLOR:-never}
export RUST_BACKTRACE=${RUST_BACKTRACE:-1}

say() { echo; echo "==> [$(date +%T)] $*"; }
declare -a summary=()
failed=0

# run_step NAME COMMAND...: runs, times and records a step; never aborts.
run_step() {
    local name=$1; shift
    say "$name: $*"
    local start=$SECONDS rc=0
    "$@" || rc=$?
    local took=$((SECONDS - start))
    if [ "$rc" -eq 0 ]; then
        summary+=("ok      ${took}s  $name")
    else
        summary+=("FAILED  ${took}s  $name (exit $rc)")
        failed=1
    fi
    return 0
}

print_summary() {
    echo
    echo "==> run-all summary (total $((SECONDS))s)"
    local line
    for line in "${summary[@]}"; do echo "    $line"; done
}

# ------------------------------------------------------------ 1. install ---
say "checking tools"
apt_pkgs=()
command -v cc >/dev/null 2>&1 || apt_pkgs+=(build-essential)
command -v c++ >/dev/null 2>&1 || apt_pkgs+=(g++)
command -v make >/dev/null 2>&1 || apt_pkgs+=(make)
command -v pkg-config >/dev/null 2>&1 || apt_pkgs+=(pkg-config)
# OpenSSL headers: librdkafka (the rdkafka crate, the suite) with SSL and SASL.
[ -f /usr/include/openssl/ssl.h ] || apt_pkgs+=(libssl-dev)
command -v perl >/dev/null 2>&1 || apt_pkgs+=(perl)
command -v python3 >/dev/null 2>&1 || apt_pkgs+=(python3)
if command -v python3 >/dev/null 2>&1; then
    python3 -c 'import venv, ensurepip' >/dev/null 2>&1 || apt_pkgs+=(python3-venv python3-pip)
else
    apt_pkgs+=(python3-venv python3-pip)
fi
[ -f /usr/include/rapidjson/schema.h ] || apt_pkgs+=(rapidjson-dev) # librdkafka stats tests
command -v kcat >/dev/null 2>&1 || command -v kafkacat >/dev/null 2>&1 || apt_pkgs+=(kcat)
# prometheus and promtool: tests/it/monitoring.rs checks deploy/monitoring
# with them and scrapes a cluster with a real Prometheus.
{ command -v prometheus && command -v promtool; } >/dev/null 2>&1 || apt_pkgs+=(prometheus)
deploy=${SKIP_DEPLOY:-}
if [ -z "$deploy" ]; then
    # The base of the container image is made with debootstrap.
    command -v debootstrap >/dev/null 2>&1 || apt_pkgs+=(debootstrap)
    command -v objcopy >/dev/null 2>&1 || apt_pkgs+=(binutils)
    # deploy/make-certs.sh (the SASL_SSL compose cluster's certificates).
    command -v openssl >/dev/null 2>&1 || apt_pkgs+=(openssl)
fi
if [ ${#apt_pkgs[@]} -gt 0 ]; then
    say "apt-get install ${apt_pkgs[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${apt_pkgs[@]}"
fi
if ! cargo nextest --version >/dev/null 2>&1; then
    say "cargo install cargo-nextest"
    cargo install cargo-nextest --locked
fi
cargo nextest --version

venv=$target/compat-venv
req=$root/tests/compat/requirements.txt
req_stamp=$venv/.requirements-$(cksum <"$req" | cut -d' ' -f1)
# Also with SKIP_COMPAT: the nextest suite runs Python workloads from it
# (tests/it/pipelined_clients.rs).
if [ ! -f "$req_stamp" ]; then
    say "python venv $venv with tests/compat/requirements.txt"
    rm -rf "$venv"
    mkdir -p "$target"
    python3 -m venv "$venv"
    "$venv/bin/python" -m pip install -q -r "$req"
    touch "$req_stamp"
fi

logs=$target/run-all-logs
mkdir -p "$logs"

# The base image needs no binary: made while cargo builds (mostly a download).
base_pid=
if [ -z "$deploy" ]; then
    if docker info >/dev/null 2>&1; then
        say "container base image in the background (log: $logs/base-image.log)"
        bash deploy/build-image.sh --base-only >"$logs/base-image.log" 2>&1 &
        base_pid=$!
    else
        summary+=("FAILED  0s  deploy tests: no usable Docker engine (docker info failed; SKIP_DEPLOY=1 skips them)")
        failed=1
        deploy=no-docker
    fi
fi

# -------------------------------------------------------------- 2. build ---
say "cargo build --workspace --all-targets --release"
build_start=$SECONDS
if ! cargo build --workspace --all-targets --release; then
    summary+=("FAILED  $((SECONDS - build_start))s  cargo build (nothing else can run)")
    [ -n "$base_pid" ] && wait "$base_pid" || true
    print_summary
    exit 1
fi
summary+=("ok      $((SECONDS - build_start))s  cargo build --workspace --all-targets --release")
export SAMSA_BIN=${SAMSA_BIN:-$target/release/samsa}

# start_bg NAME COMMAND...: runs a step in the background, its output in a
# log file; finish_bg prints the log and records the step like run_step.
declare -a bg_names=() bg_pids=() bg_logs=() bg_starts=()
start_bg() {
    local name=$1; shift
    local log
    log="$logs/$(echo "$name" | tr -c 'a-zA-Z0-9\n' '-' | cut -c1-40).log"
    say "$name (in the background, log: $log): $*"
    "$@" >"$log" 2>&1 &
    bg_names+=("$name"); bg_pids+=("$!"); bg_logs+=("$log"); bg_starts+=("$SECONDS")
}
finish_bg() {
    local i rc took
    for i in "${!bg_pids[@]}"; do
        rc=0
        wait "${bg_pids[$i]}" || rc=$?
        took=$((SECONDS - ${bg_starts[$i]}))
        say "${bg_names[$i]}: finished (exit $rc, ${took}s); its output:"
        cat "${bg_logs[$i]}"
        if [ "$rc" -eq 0 ]; then
            summary+=("ok      ${took}s  ${bg_names[$i]}")
        else
            summary+=("FAILED  ${took}s  ${bg_names[$i]} (exit $rc)")
            failed=1
        fi
    done
}

# The deploy tests, in order: the image (once per run, from the release
# build), the chart, the container tests against that image.
deploy_tests() {
    local image=samsa-ci:$$ rc=0
    if [ "$base_ok" != yes ]; then
        echo "FAILED: the base image could not be built:"
        cat "$logs/base-image.log"
        return 1
    fi
    echo "== container image"
    bash deploy/build-image.sh "$image" || return 1
    echo "== the image on its own (tests/deploy/image.sh)"
    SAMSA_IMAGE=$image bash tests/deploy/image.sh || rc=1
    echo "== the compose cluster's monitoring profile (tests/deploy/monitoring.sh)"
    SAMSA_IMAGE=$image bash tests/deploy/monitoring.sh || rc=1
    echo "== helm chart"
    SAMSA_HELM_IMAGE=$image bash tests/deploy/helm.sh || rc=1
    echo "== container tests (the fault tests of docs/RELIABILITY.md included)"
    SAMSA_IMAGE=$image cargo nextest run --release -p samsa-tests --test containers \
        --profile containers --no-fail-fast || rc=1
    docker image rm "$image" >/dev/null 2>&1 || true
    return "$rc"
}

# ---------------------------------------------------------- 3. lint -------
run_step "cargo fmt --check" cargo fmt --all -- --check
run_step "code map (docs/ARCHITECTURE.md names what exists)" python3 tests/check-code-map.py
# Its own target dir: it never waits on a lock the suites' cargo holds.
start_bg "cargo clippy -D warnings (nice 19)" \
    env CARGO_TARGET_DIR="$target/clippy" \
    nice -n 19 cargo clippy --workspace --all-targets -- -D warnings

# ---------------------------------------------------------- 4. nextest ----
run_step "cargo nextest (unit + integration)" \
    cargo nextest run --workspace --release --profile ci --no-fail-fast

# ------------------------- 5. Python clients, librdkafka, deploy side by side
# The Python clients' and librdkafka's suites one after the other, beside
# the deploy tests: each mostly waits on its brokers.
client_suites() {
    local rc=0
    if [ "${SKIP_COMPAT:-}" = "" ]; then
        echo "== pytest tests/compat (Python clients, kcat)"
        local start=$SECONDS
        "$venv/bin/python" -m pytest tests/compat || rc=1
        echo "== pytest tests/compat: exit $rc, $((SECONDS - start))s"
    fi
    if [ "${SKIP_LIBRDKAFKA:-}" = "" ]; then
        echo "== librdkafka test suite (tests/librdkafka/allowlist.txt)"
        bash tests/librdkafka/run.sh || rc=1
    fi
    return "$rc"
}
if [ -z "${SKIP_COMPAT:-}" ] || [ -z "${SKIP_LIBRDKAFKA:-}" ]; then
    start_bg "client suites: pytest tests/compat, then librdkafka's" client_suites
fi
if [ -z "$deploy" ]; then
    # Waited for here: a background step cannot wait for a sibling.
    base_ok=no
    if [ -n "$base_pid" ] && wait "$base_pid"; then base_ok=yes; fi
    start_bg "deploy: image, helm chart, container tests" deploy_tests
fi
finish_bg

print_summary
exit "$failed"
