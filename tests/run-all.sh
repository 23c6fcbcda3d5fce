#!/usr/bin/env bash
# THE one command that runs every test of samsa, on a fresh Debian machine as
# root (CI runs it through .ci/run):
#
#   1. installs what is missing (apt: compilers, python3 venv, kcat,
#      rapidjson-dev for librdkafka's statistics tests;
#      cargo-nextest; a Python venv with tests/compat/requirements.txt)
#   2. builds the workspace once (all targets)
#   3. cargo fmt --check, cargo clippy -D warnings, the code map of
#      docs/ARCHITECTURE.md checked against the tree
#   4. cargo nextest (unit tests of every crate + tests/it integration tests)
#   5. pytest tests/compat (confluent-kafka, kafka-python, kcat)
#   6. tests/librdkafka/run.sh (librdkafka's own suite, allowlisted tests)
#
# Every step after the build runs even if an earlier one failed; the script
# exits non-zero if any step failed and prints a summary with durations.
# SKIP_LIBRDKAFKA=1 / SKIP_COMPAT=1 skip those steps for quick local runs.
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
command -v perl >/dev/null 2>&1 || apt_pkgs+=(perl)
command -v python3 >/dev/null 2>&1 || apt_pkgs+=(python3)
if command -v python3 >/dev/null 2>&1; then
    python3 -c 'import venv, ensurepip' >/dev/null 2>&1 || apt_pkgs+=(python3-venv python3-pip)
else
    apt_pkgs+=(python3-venv python3-pip)
fi
[ -f /usr/include/rapidjson/schema.h ] || apt_pkgs+=(rapidjson-dev) # librdkafka stats tests
command -v kcat >/dev/null 2>&1 || command -v kafkacat >/dev/null 2>&1 || apt_pkgs+=(kcat)
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

# -------------------------------------------------------------- 2. build ---
say "cargo build --workspace --all-targets"
build_start=$SECONDS
if ! cargo build --workspace --all-targets; then
    summary+=("FAILED  $((SECONDS - build_start))s  cargo build (nothing else can run)")
    print_summary
    exit 1
fi
summary+=("ok      $((SECONDS - build_start))s  cargo build --workspace --all-targets")
export SAMSA_BIN=${SAMSA_BIN:-$target/debug/samsa}

# ---------------------------------------------------------- 3. lint -------
run_step "cargo fmt --check" cargo fmt --all -- --check
run_step "cargo clippy -D warnings" cargo clippy --workspace --all-targets -- -D warnings
run_step "code map (docs/ARCHITECTURE.md names what exists)" python3 tests/check-code-map.py

# ---------------------------------------------------------- 4. nextest ----
run_step "cargo nextest (unit + integration)" \
    cargo nextest run --workspace --profile ci --no-fail-fast

# ---------------------------------------------------------- 5. pytest -----
if [ "${SKIP_COMPAT:-}" = "" ]; then
    run_step "pytest tests/compat (Python clients, kcat)" \
        "$venv/bin/python" -m pytest tests/compat
fi

# ---------------------------------------------------------- 6. librdkafka -
if [ "${SKIP_LIBRDKAFKA:-}" = "" ]; then
    run_step "librdkafka test suite (tests/librdkafka/allowlist.txt)" \
        bash tests/librdkafka/run.sh
fi

print_summary
exit "$failed"
