#!/usr/bin/env bash
# Runs librdkafka's own integration tests (tests/librdkafka/allowlist.txt)
# against a real samsa broker.
#
#   tests/librdkafka/run.sh            build (once, cached) and run the allowlist
#   tests/librdkafka/run.sh --build    only build the suite
#   TESTS=0090,0012 tests/librdkafka/run.sh   run these instead of the allowlist
#
# The librdkafka source is the one bundled in the rdkafka-sys crate that the
# workspace already depends on; it is copied and built under
# <target>/librdkafka-suite (reused while the version and build flags match).
# Environment: SAMSA_BIN (default <target>/debug/samsa), CARGO_TARGET_DIR,
# JOBS (make parallelism, default 2), SUITE_DEBUG=1 keeps the samsa log.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
target=${CARGO_TARGET_DIR:-$root/target}
suite=$target/librdkafka-suite
samsa_bin=${SAMSA_BIN:-$target/debug/samsa}
jobs=${JOBS:-2}
log() { echo "[librdkafka-suite] $*" >&2; }

# ---------------------------------------------------------------- source ---
ver=$(awk '/^name = "rdkafka-sys"/{getline; gsub(/[" ]/,""); sub("version=",""); print; exit}' "$root/Cargo.lock")
[ -n "$ver" ] || { log "rdkafka-sys not found in Cargo.lock"; exit 1; }
cargo_home=${CARGO_HOME:-$HOME/.cargo}
find_src() { ls -d "$cargo_home"/registry/src/*/"rdkafka-sys-$ver"/librdkafka 2>/dev/null | head -1; }
src=$(find_src || true)
if [ -z "$src" ]; then
    log "fetching crates (rdkafka-sys $ver)"
    (cd "$root" && cargo fetch --locked)
    src=$(find_src || true)
fi
[ -n "$src" ] || { log "rdkafka-sys-$ver/librdkafka not found under $cargo_home/registry/src"; exit 1; }

# ----------------------------------------------------------------- build ---
configure_flags="--disable-gssapi --disable-curl --disable-zstd --disable-lz4-ext --disable-sasl --disable-ssl"
# RapidJSON (rapidjson-dev) enables the tests that check statistics JSON
# (0053, 0110…); rebuild when its presence changes.
rapidjson=no
[ -f /usr/include/rapidjson/schema.h ] && rapidjson=yes
stamp="$suite/.built-$ver-rapidjson_$rapidjson-$(echo "$configure_flags" | cksum | cut -d' ' -f1)"
if [ ! -f "$stamp" ] || [ ! -x "$suite/librdkafka/tests/test-runner" ]; then
    log "building librdkafka $ver test suite in $suite (a few minutes on 2 cores)"
    rm -rf "$suite"
    mkdir -p "$suite"
    cp -r "$src" "$suite/librdkafka"
    chmod -R u+w "$suite/librdkafka"
    (
        cd "$suite/librdkafka"
        # shellcheck disable=SC2086
        ./configure $configure_flags >"$suite/configure.log" 2>&1 || { tail -50 "$suite/configure.log"; exit 1; }
        make -j"$jobs" libs >"$suite/make-libs.log" 2>&1 || { tail -50 "$suite/make-libs.log"; exit 1; }
        make -j"$jobs" -C tests build >"$suite/make-tests.log" 2>&1 || { tail -50 "$suite/make-tests.log"; exit 1; }
    )
    touch "$stamp"
    log "built"
else
    log "reusing build in $suite"
fi
[ "${1:-}" = "--build" ] && exit 0

# ------------------------------------------------------------- test list ---
# Tests are given as tokens NNNN or NNNN:SCENARIO (librdkafka test scenario,
# e.g. noautocreate: the broker runs without topic auto-creation and the
# runner gets -s SCENARIO). allowlist.txt: "NNNN [SCENARIO]  # comment".
mode=allowlist
if [ "${1:-}" = "--each" ]; then
    mode=each
    shift
    tokens="${*:-${TESTS:-}}"
    tokens=${tokens//,/ }
elif [ -n "${TESTS:-}" ]; then
    tokens=${TESTS//,/ }
else
    tokens=$(sed -e 's/#.*//' "$here/allowlist.txt" | awk 'NF==1{print $1} NF>=2{print $1":"$2}')
fi
tokens=$(echo $tokens)
[ -n "$tokens" ] || { log "empty test list"; exit 1; }
[ -x "$samsa_bin" ] || { log "samsa binary not found at $samsa_bin (cargo build -p samsa)"; exit 1; }

work=$(mktemp -d /tmp/samsa-librdkafka.XXXXXX)
samsa_pid=
stop_samsa() {
    if [ -n "$samsa_pid" ] && kill -0 "$samsa_pid" 2>/dev/null; then
        kill -KILL "$samsa_pid" 2>/dev/null || true
        wait "$samsa_pid" 2>/dev/null || true
    fi
    samsa_pid=
}
cleanup() {
    local rc=$?
    stop_samsa
    if [ "$rc" -ne 0 ] || [ -n "${SUITE_DEBUG:-}" ]; then
        if [ -f "$work/samsa.log" ]; then
            log "samsa log (last 60 lines of $work/samsa.log):"
            tail -60 "$work/samsa.log" >&2 || true
        fi
    fi
    if [ -z "${SUITE_DEBUG:-}" ]; then rm -rf "$work"; else log "kept $work"; fi
    exit "$rc"
}
trap cleanup EXIT INT TERM

# start_samsa SCENARIO: a fresh samsa (new port, empty data dir) configured
# like the suite's scenario file (tests/scenarios/*.json in the librdkafka
# tree: default = auto_create_topics true, num_partitions 4), and test.conf.
start_samsa() {
    local scenario=$1 port autocreate=true
    [ "$scenario" = noautocreate ] && autocreate=false
    stop_samsa
    rm -rf "$work/data"
    port=$(python3 "$here/broker.py" free-port)
    RUST_LOG=${RUST_LOG:-info} "$samsa_bin" server --node-id 1 \
        --listen "127.0.0.1:$port" --advertised-listener "127.0.0.1:$port" \
        --data-dir "$work/data" --set num_partitions=4 \
        --set http_listen=127.0.0.1:0 \
        --set auto_create_topics_enable=$autocreate \
        >"$work/samsa.log" 2>&1 &
    samsa_pid=$!
    if ! python3 "$here/broker.py" wait "$port" "$samsa_pid" 60; then
        log "samsa did not come up on port $port"
        return 1
    fi
    cat >"$suite/librdkafka/tests/test.conf" <<CONF
bootstrap.servers=127.0.0.1:$port
broker.address.family=v4
test.timeout.multiplier=2
CONF
}

# run_runner TESTS SCENARIO OUT: the test-runner on comma-separated numbers.
run_runner() {
    local tests=$1 scenario=$2 out=$3 rc
    set +e
    (
        cd "$suite/librdkafka/tests"
        # CI=... would make the runner use 3 concurrent tests; -p1 keeps it at one.
        exec env -u CI LD_LIBRARY_PATH=../src:../src-cpp TEST_KAFKA_VERSION=3.7.0 \
            TESTS="$tests" timeout -k 10 "${TEST_TIMEOUT:-900}" \
            ./test-runner -p1 -L -s "$scenario"
    ) >"$out" 2>&1
    rc=$?
    set -e
    return "$rc"
}

# The runner's summary table (colour codes stripped), one row per test.
table() {
    sed 's/\x1b\[[0-9;]*m//g' "$1" | sed -n '/SUMMARY/,$p' | grep -E '^\| [0-9]{4}_' | sort -u || true
}
# Names of the tests the runner reports PASSED.
passed_tests() {
    table "$1" | grep '| *PASSED' | awk '{print $2}' || true
}
# The first failure message of a runner log.
first_failure() {
    sed 's/\x1b\[[0-9;]*m//g' "$1" | grep -A1 '^### Test' | grep -v '^###\|^--' | head -1 | cut -c1-160 || true
}

# ------------------------------------------------------------------- run ---
if [ "$mode" = each ]; then
    # Triage: every test alone against a fresh broker; one line each.
    log "running each of: $tokens"
    mkdir -p "$suite/triage"
    for tok in $tokens; do
        t=${tok%%:*}; scenario=default
        [ "$tok" != "$t" ] && scenario=${tok#*:}
        start_samsa "$scenario"
        s=$SECONDS
        if run_runner "$t" "$scenario" "$work/$t.log"; then rc=0; else rc=$?; fi
        passed=$(passed_tests "$work/$t.log" | grep -c . || true)
        skipped=$(table "$work/$t.log" | grep -c '| *SKIPPED' || true)
        why=$(first_failure "$work/$t.log")
        if [ "$rc" -ne 0 ]; then verdict="FAIL($rc)"
        elif [ "$passed" -eq 0 ]; then
            verdict=SKIPPED
            why=$(table "$work/$t.log" | grep '| *SKIPPED' | sed 's/.*| //' | sort -u | paste -sd';' - || true)
        else verdict=PASS; fi
        printf '%s %-9s %4ss passed=%s skipped=%s %s\n' "$tok" "$verdict" $((SECONDS - s)) "$passed" "$skipped" "$why"
        cp "$work/$t.log" "$suite/triage/$t.log"
        cp "$work/samsa.log" "$suite/triage/$t.samsa.log"
    done
    exit 0
fi

rc=0
total_passed=0
scenarios=$(for tok in $tokens; do if [ "${tok#*:}" != "$tok" ]; then echo "${tok#*:}"; else echo default; fi; done | sort -u)
for scenario in $scenarios; do
    nums=$(for tok in $tokens; do
        sc=default; [ "${tok#*:}" != "$tok" ] && sc=${tok#*:}
        [ "$sc" = "$scenario" ] && echo "${tok%%:*}"
    done | paste -sd, -)
    start_samsa "$scenario"
    log "scenario $scenario: samsa (pid $samsa_pid) up; TESTS=$nums"
    out=$work/test-runner-$scenario.log
    start=$SECONDS
    src=0
    run_runner "$nums" "$scenario" "$out" || src=$?
    table "$out" >&2
    log "scenario $scenario: test-runner exited $src after $((SECONDS - start)) s"
    # Every allowlisted number must have run and passed: a test the runner
    # skipped (missing dependency, flags, scenario) proves nothing.
    for t in ${nums//,/ }; do
        if ! passed_tests "$out" | grep -q "^${t}_"; then
            log "allowlisted test $t did not pass (failed, skipped or not run)"
            [ "$src" -ne 0 ] || src=1
        fi
    done
    if [ "$src" -ne 0 ]; then
        rc=1
        log "first failure: $(first_failure "$out")"
        cp "$out" "$suite/last-test-runner-$scenario.log" || true
        log "full output kept in $suite/last-test-runner-$scenario.log"
    fi
    total_passed=$((total_passed + $(passed_tests "$out" | grep -c . || true)))
done
log "$total_passed librdkafka tests passed$([ "$rc" -ne 0 ] && echo ', SOME FAILED')"
exit "$rc"
