#!/usr/bin/env bash
# Runs librdkafka's own integration tests (tests/librdkafka/allowlist.txt)
# against a real samsa broker.
#
#   tests/librdkafka/run.sh            build (once, cached) and run the allowlist
#   tests/librdkafka/run.sh --build    only build the suite
#   TESTS=0090,0012 tests/librdkafka/run.sh   run these instead of the allowlist
#   tests/librdkafka/run.sh --each 0090 0103@3/fenced 0111:noautocreate@3
#                                      triage: each test alone, fresh brokers
#
# A test is given as NNNN[:SCENARIO][@NODES][+SECURITY][/SUBTESTS][&]:
#   SCENARIO  librdkafka's test scenario (default, noautocreate): samsa is
#             configured like it and the runner gets -s SCENARIO;
#   NODES     how many samsa nodes (default 1); more than one starts a
#             cluster of combined controller+broker nodes, needed by tests
#             that create replication-factor-3 topics;
#   SECURITY  sasl_ssl: the clients connect to a SASL_SSL listener
#             (SCRAM-SHA-512, a throwaway CA from deploy/make-certs.sh, a
#             user declared with scram_users_dir, connections_max_reauth_ms
#             10 s for 0142's re-authentication) with the authorizer on and
#             that user a super user (so is the plaintext listener's
#             ANONYMOUS, for run.sh itself); ssl: an SSL listener that
#             requires a client certificate of the same CA, the client's
#             key and certificate in the forms 0097 reads (PEM with an
#             encrypted key, DER, PKCS#12; the SSL_* variables trivup would
#             set); default plaintext;
#   SUBTESTS  the runner's SUBTESTS filter (a substring of subtest names);
#   &[LANE]   run this setup concurrently with the others (a child run.sh
#             with its own brokers, started first): for long tests that
#             mostly wait on group timers (--each ignores it). Setups in
#             different lanes (names) are different runner invocations
#             running side by side.
# allowlist.txt says the same in columns: "NNNN [SCENARIO] [nodes=N]
# [security=S] [subtests=S] [concurrent[=LANE]]  # comment".
#
# The librdkafka source is the one bundled in the rdkafka-sys crate that the
# workspace already depends on; it is copied and built under
# <target>/librdkafka-suite (reused while the version and build flags match).
# Environment: SAMSA_BIN (default <target>/debug/samsa), CARGO_TARGET_DIR,
# JOBS (make parallelism, default 2), SUITE_DEBUG=1 keeps the samsa logs,
# TEST_TIMEOUT (seconds per runner invocation, default 1800: the longest,
# 0113 alone, takes ~11 min on 2 cores; the group lane ~10 min).
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
# OpenSSL (libssl-dev) for SSL and the built-in SASL PLAIN and SCRAM;
# --disable-sasl only leaves out Cyrus SASL (GSSAPI), which samsa does not serve.
configure_flags="--disable-gssapi --disable-curl --disable-zstd --disable-lz4-ext --disable-sasl --enable-ssl"
# RapidJSON (rapidjson-dev) enables the tests that check statistics JSON
# (0053, 0110…); rebuild when its presence changes.
rapidjson=no
[ -f /usr/include/rapidjson/schema.h ] && rapidjson=yes
stamp="$suite/.built-$ver-rapidjson_$rapidjson-$(echo "$configure_flags" | cksum | cut -d' ' -f1)-leavegroup_null_broker"
if [ ! -f "$stamp" ] || [ ! -x "$suite/librdkafka/tests/test-runner" ]; then
    log "building librdkafka $ver test suite in $suite (a few minutes on 2 cores)"
    rm -rf "$suite"
    mkdir -p "$suite"
    cp -r "$src" "$suite/librdkafka"
    chmod -R u+w "$suite/librdkafka"
    (
        cd "$suite/librdkafka"
        # A client crash, not a broker's: before 2.14.2 (upstream #5327) the
        # LeaveGroup handler logs through its broker argument, which is NULL
        # when a consumer leaves after its group subsystem terminated; 0018
        # races unsubscribe() against close() to provoke that, and a CI run
        # died of SIGSEGV in it. Log through the client handle instead, as
        # 2.14.2 does; a version without the pattern needs nothing.
        sed -i '/^static void rd_kafka_cgrp_handle_LeaveGroup(/,/^}/ s/rd_kafka_dbg(rkb->rkb_rk, CGRP, "LEAVEGROUP"/rd_kafka_dbg(rk, CGRP, "LEAVEGROUP"/' src/rdkafka_cgrp.c
        if sed -n '/^static void rd_kafka_cgrp_handle_LeaveGroup(/,/^}/p' src/rdkafka_cgrp.c | grep -q 'rkb->rkb_rk'; then
            log "rdkafka_cgrp.c: the LeaveGroup handler still logs through its broker argument"
            exit 1
        fi
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
mode=allowlist
if [ "${1:-}" = "--each" ]; then
    mode=each
    shift
    tokens="${*:-${TESTS:-}}"
    tokens=${tokens//,/ }
elif [ -n "${TESTS:-}" ]; then
    tokens=${TESTS//,/ }
else
    tokens=$(sed -e 's/#.*//' "$here/allowlist.txt" | awk 'NF>=1{
        tok = $1
        for (i = 2; i <= NF; i++) {
            if ($i ~ /^nodes=/) tok = tok "@" substr($i, 7)
            else if ($i ~ /^security=/) security = substr($i, 10)
            else if ($i ~ /^subtests=/) subtests = substr($i, 10)
            else if ($i == "concurrent") bg = "&"
            else if ($i ~ /^concurrent=/) bg = "&" substr($i, 12)
            else tok = tok ":" $i
        }
        if (security != "") tok = tok "+" security
        if (subtests != "") tok = tok "/" subtests
        print tok bg
        security = ""; subtests = ""; bg = "" }')
fi
tokens=$(echo $tokens)
[ -n "$tokens" ] || { log "empty test list"; exit 1; }
[ -x "$samsa_bin" ] || { log "samsa binary not found at $samsa_bin (cargo build -p samsa)"; exit 1; }

# parse_token TOKEN: sets $t (test number), $scenario, $nodes, $security
# (empty: plaintext), $subtests, $concurrent ("&", "&LANE" or empty).
parse_token() {
    if [[ ! $1 =~ ^([0-9]{4})(:([A-Za-z0-9_]+))?(@([0-9]+))?(\+(sasl_ssl|ssl))?(/([^,&[:space:]]+))?(&[A-Za-z0-9_]*)?$ ]]; then
        log "bad test token '$1' (NNNN[:SCENARIO][@NODES][+sasl_ssl|+ssl][/SUBTESTS][&[LANE]])"
        exit 1
    fi
    t=${BASH_REMATCH[1]}
    scenario=${BASH_REMATCH[3]:-default}
    nodes=${BASH_REMATCH[5]:-1}
    security=${BASH_REMATCH[7]:-}
    subtests=${BASH_REMATCH[9]:-}
    concurrent=${BASH_REMATCH[10]:-}
}
for tok in $tokens; do parse_token "$tok"; done
# The setup a parsed token runs in, as a token without the number.
setup_of() { echo "$scenario@$nodes${security:++$security}${subtests:+/$subtests}$concurrent"; }

work=$(mktemp -d /tmp/samsa-librdkafka.XXXXXX)
samsa_pids=()
stop_samsa() {
    local pid
    for pid in "${samsa_pids[@]}"; do
        kill -KILL "$pid" 2>/dev/null || true
        wait "$pid" 2>/dev/null || true
    done
    samsa_pids=()
}
# Child run.sh processes running concurrent setups, each the leader of its
# own process group (setsid), so that stopping one reaches its test-runner
# and samsa nodes too.
child_pids=()
declare -A child_log=()
stop_children() {
    local pid
    for pid in "${child_pids[@]}"; do
        kill -TERM -- "-$pid" 2>/dev/null || true
        wait "$pid" 2>/dev/null || true
        log "stopped concurrent child $pid; its output (last 40 lines):"
        tail -40 "${child_log[$pid]}" >&2 || true
    done
    child_pids=()
}
cleanup() {
    local rc=$? f
    if [ -n "$runner_pid" ]; then
        kill -TERM "$runner_pid" 2>/dev/null || true
        wait "$runner_pid" 2>/dev/null || true
    fi
    stop_children
    stop_samsa
    if [ "$rc" -ne 0 ] || [ -n "${SUITE_DEBUG:-}" ]; then
        for f in "$work"/samsa-*.log; do
            [ -f "$f" ] || continue
            log "samsa log (last 60 lines of $f):"
            tail -60 "$f" >&2 || true
        done
    fi
    if [ -z "${SUITE_DEBUG:-}" ]; then rm -rf "$work"; else log "kept $work"; fi
    exit "$rc"
}
trap cleanup EXIT INT TERM

# The SCRAM user of +sasl_ssl setups (declared in scram_users_dir).
sasl_user=suite
sasl_password=suite-secret
# The password of the client key and keystore of +ssl setups.
ssl_password=suite-keystore-secret
# Variables the runner gets for the current setup (the SSL_* of +ssl).
runner_env=()

# make_client_pki DIR: a client certificate of DIR/ca.pem (made by
# deploy/make-certs.sh) in every form 0097 loads.
make_client_pki() (
    cd "$1"
    openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes \
        -subj "/CN=librdkafka suite client" -keyout client-plain.key -out client.csr 2>/dev/null
    printf 'basicConstraints=CA:FALSE\n' >client.ext
    openssl x509 -req -in client.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 2 \
        -extfile client.ext -out client.pem 2>/dev/null
    openssl pkcs8 -topk8 -in client-plain.key -out client.key -passout "pass:$ssl_password"
    openssl x509 -in client.pem -outform DER -out client.der
    openssl pkcs8 -topk8 -nocrypt -in client-plain.key -outform DER -out client-key.der
    openssl x509 -in ca.pem -outform DER -out ca.der
    openssl pkcs12 -export -in client.pem -inkey client-plain.key -certfile ca.pem \
        -out client.p12 -passout "pass:$ssl_password"
    rm -f client.csr client.ext ca.srl
)

# start_samsa SCENARIO NODES [SECURITY]: fresh samsa nodes (new ports, empty data dirs)
# configured like the suite's scenario file (tests/scenarios/*.json in the
# librdkafka tree: default = auto_create_topics true, num_partitions 4), and
# the runner's test.conf (in $work) pointing at every node. NODES > 1: a cluster of combined
# controller+broker nodes, ready once a node's Metadata lists all of them.
# SECURITY sasl_ssl: each node also has a SASL_SSL listener, the one
# test.conf points the clients at (see the top of this file).
start_samsa() {
    local scenario=$1 n=$2 security=${3:-} autocreate=true id voters= bootstrap= i
    local -a ports cports sports settings
    [ "$scenario" = noautocreate ] && autocreate=false
    stop_samsa
    rm -rf "$work"/data-* "$work"/samsa-*.log
    # Group settings stay at Kafka's defaults, as on the brokers the suite
    # is written against: 0118 relies on the 3 s initial rebalance delay
    # letting both of its consumers into the first generation.
    settings=(--set num_partitions=4 --set auto_create_topics_enable=$autocreate
        --set http_listen=127.0.0.1:0)
    runner_env=()
    if [ -n "$security" ]; then
        [ -f "$work/pki/node.pem" ] || bash "$root/deploy/make-certs.sh" "$work/pki" >/dev/null
        settings+=(--set "ssl_cert_file=$work/pki/node.pem" --set "ssl_key_file=$work/pki/node.key")
    fi
    if [ "$security" = ssl ]; then
        [ -f "$work/pki/client.p12" ] || make_client_pki "$work/pki"
        settings+=(--set "ssl_ca_file=$work/pki/ca.pem" --set ssl_client_auth=required)
        runner_env=(SSL_password="$ssl_password" SSL_client_auth=required
            SSL_pkcs="$work/pki/client.p12" SSL_pub_pem="$work/pki/client.pem"
            SSL_priv_pem="$work/pki/client.key" SSL_pub_der="$work/pki/client.der"
            SSL_priv_der="$work/pki/client-key.der" SSL_ca_der="$work/pki/ca.der"
            SSL_ca_pem="$work/pki/ca.pem" SSL_all_cas_pem="$work/pki/ca.pem")
    fi
    if [ "$security" = sasl_ssl ]; then
        mkdir -p "$work/users"
        printf '%s\n' "$sasl_password" >"$work/users/$sasl_user"
        settings+=(--set "scram_users_dir=$work/users" --set connections_max_reauth_ms=10000
            --set authorizer_enable=true --set "super_users=[\"User:ANONYMOUS\",\"User:$sasl_user\"]")
    fi
    local -a drawn
    read -ra drawn < <(python3 "$here/broker.py" free-ports $((3 * n)))
    for ((id = 1; id <= n; id++)); do
        ports[id]=${drawn[3 * id - 3]}
        cports[id]=${drawn[3 * id - 2]}
        voters+="${voters:+,}$id@127.0.0.1:${cports[id]}"
        if [ -n "$security" ]; then
            sports[id]=${drawn[3 * id - 1]}
            bootstrap+="${bootstrap:+,}127.0.0.1:${sports[id]}"
        else
            bootstrap+="${bootstrap:+,}127.0.0.1:${ports[id]}"
        fi
    done
    if [ "$n" -gt 1 ]; then
        # Short broker sessions so a cluster registers and unfences in
        # seconds (the cluster tests' settings, tests/src/cluster.rs).
        settings+=(--set "controller_quorum_voters=$voters"
            --set broker_session_timeout_ms=3000 --set broker_heartbeat_interval_ms=500
            --set controller_request_timeout_ms=5000)
    fi
    for ((id = 1; id <= n; id++)); do
        local -a cluster_args=()
        [ "$n" -gt 1 ] && cluster_args=(--set "controller_listen=127.0.0.1:${cports[id]}")
        [ -n "$security" ] && cluster_args+=(--set "listeners.secure.listen=127.0.0.1:${sports[id]}"
            --set "listeners.secure.security_protocol=${security^^}")
        RUST_LOG=${RUST_LOG:-info} "$samsa_bin" server --node-id "$id" \
            --listen "127.0.0.1:${ports[id]}" --advertised-listener "127.0.0.1:${ports[id]}" \
            --data-dir "$work/data-$id" "${settings[@]}" "${cluster_args[@]}" \
            >"$work/samsa-$id.log" 2>&1 &
        samsa_pids+=($!)
    done
    for ((id = 1; id <= n; id++)); do
        i=$((id - 1))
        if ! python3 "$here/broker.py" wait "${ports[id]}" "${samsa_pids[i]}" 90 "$n"; then
            log "samsa node $id did not come up on port ${ports[id]} (with $n brokers)"
            return 1
        fi
    done
    # Each node writes the declared user once it serves: wait until every
    # node lists it (through its plaintext listener).
    if [ "$security" = sasl_ssl ]; then
        local deadline=$((SECONDS + 60))
        for ((id = 1; id <= n; id++)); do
            until "$samsa_bin" user list -b "127.0.0.1:${ports[id]}" 2>/dev/null |
                grep -q "^$sasl_user .*SCRAM-SHA-512"; do
                if [ "$SECONDS" -ge "$deadline" ]; then
                    log "samsa node $id does not list the declared user $sasl_user"
                    return 1
                fi
                sleep 0.1
            done
        done
    fi
    # request.timeout.ms: the client's default, which CI (see run_runner)
    # would lower to 10 s for every client the suite creates.
    cat >"$work/test.conf" <<CONF
bootstrap.servers=$bootstrap
broker.address.family=v4
test.timeout.multiplier=2
request.timeout.ms=30000
CONF
    if [ "$security" = sasl_ssl ]; then
        cat >>"$work/test.conf" <<CONF
security.protocol=SASL_SSL
sasl.mechanism=SCRAM-SHA-512
sasl.username=$sasl_user
sasl.password=$sasl_password
ssl.ca.location=$work/pki/ca.pem
CONF
    fi
    if [ "$security" = ssl ]; then
        cat >>"$work/test.conf" <<CONF
security.protocol=SSL
ssl.ca.location=$work/pki/ca.pem
ssl.certificate.location=$work/pki/client.pem
ssl.key.location=$work/pki/client.key
ssl.key.password=$ssl_password
CONF
    fi
}

# run_runner TESTS SCENARIO SUBTESTS OUT: the test-runner on comma-separated
# numbers. It runs as a background job waited for, so that a signal runs the
# cleanup trap at once (bash defers traps until a foreground job ends);
# $runner_pid is `timeout`, which leads the runner's process group and
# passes a TERM on to it.
runner_pid=
run_runner() {
    local tests=$1 scenario=$2 subtests=$3 out=$4 rc
    set +e
    rm -f "$suite/librdkafka/tests"/core "$suite/librdkafka/tests"/core.*
    (
        cd "$suite/librdkafka/tests"
        if [ -n "$subtests" ]; then export SUBTESTS="$subtests"; fi
        # A crash of the runner (a client bug, or one a broker reply
        # provokes) leaves a core for crash_report; where the kernel pipes
        # cores elsewhere, the report says so.
        ulimit -c unlimited 2>/dev/null || true
        # CI set: the suite's duration checks (TIMING_ASSERT, 0053's stats
        # interval window) warn instead of failing, since how long a call
        # took on a loaded 2-core machine is no verdict on the broker;
        # timing_violations below still fails a duration shorter than its
        # minimum, which no slow machine causes. Every other check stays
        # fatal. CI's other effects are undone: -p1 keeps one test at a
        # time (CI would run 3), test.conf sets request.timeout.ms back to
        # the client default (CI lowers it to 10 s), and test.conf's
        # test.timeout.multiplier is read again at every client creation
        # (CI adds 2 to it at start-up).
        # The runner reads its client config from RDKAFKA_TEST_CONF: one per
        # run, so runs of this script do not share it.
        exec env "${runner_env[@]}" CI=true LD_LIBRARY_PATH=../src:../src-cpp TEST_KAFKA_VERSION=3.7.0 \
            RDKAFKA_TEST_CONF="$work/test.conf" TESTS="$tests" timeout -k 10 "${TEST_TIMEOUT:-1800}" \
            ./test-runner -p1 -L -s "$scenario"
    ) >"$out" 2>&1 &
    runner_pid=$!
    wait "$runner_pid"
    rc=$?
    runner_pid=
    set -e
    if [ "$rc" -gt 128 ] && [ "$rc" -ne 137 ] && [ "$rc" -ne 143 ]; then crash_report "$out" "$rc"; fi
    return "$rc"
}

# crash_report OUT RC: the runner died of a signal; the end of its output
# and, from its core, the crashing thread's stack, so that a CI log names
# the test and the frame without a rerun.
crash_report() {
    local out=$1 rc=$2 core
    log "test-runner killed by signal $(($2 - 128)); the last lines of its output:"
    sed 's/\x1b\[[0-9;]*m//g' "$out" | tail -25 | cut -c1-200 >&2
    core=$(ls -t "$suite/librdkafka/tests"/core "$suite/librdkafka/tests"/core.* 2>/dev/null | head -1 || true)
    if [ -z "$core" ]; then
        log "no core file (kernel.core_pattern is '$(cat /proc/sys/kernel/core_pattern 2>/dev/null)')"
    elif ! command -v gdb >/dev/null; then
        log "core in $core; gdb is not installed to read it"
    else
        log "the crashing thread's stack ($core):"
        # From the tests directory: the runner found librdkafka through a
        # relative LD_LIBRARY_PATH, and the core names it so.
        (cd "$suite/librdkafka/tests" && LD_LIBRARY_PATH=../src:../src-cpp gdb -batch -ex bt ./test-runner "$core" 2>/dev/null) | awk '!seen[$0]++' |
            grep -E '^#' | head -20 | cut -c1-200 >&2 || true
    fi
}

# The runner's summary table (colour codes stripped), one row per test.
table() {
    sed 's/\x1b\[[0-9;]*m//g' "$1" | sed -n '/SUMMARY/,$p' | grep -E '^\| [0-9]{4}_' | sort -u || true
}
# Names of the tests the runner reports PASSED: by their summary row, or by
# the "Test NNNN_name PASSED" banner (the runner's main thread can print into
# the middle of a summary row, leaving it without its verdict); never a test
# whose row says FAILED.
passed_tests() {
    local failed
    failed=$(table "$1" | grep '| *FAILED' | awk '{print $2}' || true)
    {
        table "$1" | grep '| *PASSED' | awk '{print $2}'
        sed 's/\x1b\[[0-9;]*m//g' "$1" | grep -oE '=+ Test [0-9]{4}_[A-Za-z0-9_]+ PASSED =+' | awk '{print $3}'
    } | sort -u | grep -vxF -f <(printf '%s\n' "$failed" | grep .) || true
}
# The duration checks a runner log (run with CI) only warned about, one per
# line; `timing_violations OUT short` lists only those whose duration was
# below the check's minimum: a test that ended too soon, which a slow
# machine cannot cause.
timing_warnings() {
    sed 's/\x1b\[[0-9;]*m//g' "$1" | grep -E 'expected duration -?[0-9]+ <= -?[0-9]+ <= -?[0-9]+ ms|WARNING: Elapsed time' || true
}
timing_violations() {
    timing_warnings "$1" | awk '{
        if (match($0, /expected duration -?[0-9]+ <= -?[0-9]+ <= /)) {
            split(substr($0, RSTART + 18, RLENGTH - 18), v, " <= ")
            if (v[2] + 0 < v[1] + 0) print
        }
    }'
}
# The first failure message of a runner log.
first_failure() {
    sed 's/\x1b\[[0-9;]*m//g' "$1" | grep -A1 '^### Test' | grep -v '^###\|^--' | head -1 | cut -c1-160 || true
}
# A file-name-safe form of a token or setup.
slug() { printf '%s' "$1" | tr -c 'A-Za-z0-9_.@-' '_'; }

# ------------------------------------------------------------------- run ---
if [ "$mode" = each ]; then
    # Triage: every test alone against fresh brokers; one line each.
    log "running each of: $tokens"
    mkdir -p "$suite/triage"
    for tok in $tokens; do
        parse_token "$tok"
        name=$(slug "$tok")
        start_samsa "$scenario" "$nodes" "$security"
        s=$SECONDS
        if run_runner "$t" "$scenario" "$subtests" "$work/$name.log"; then rc=0; else rc=$?; fi
        passed=$(passed_tests "$work/$name.log" | grep -c . || true)
        skipped=$(table "$work/$name.log" | grep -c '| *SKIPPED' || true)
        why=$(first_failure "$work/$name.log")
        if [ "$rc" -eq 0 ] && [ -n "$(timing_violations "$work/$name.log")" ]; then
            rc=1
            why="ended too soon: $(timing_violations "$work/$name.log" | head -1 | sed 's/.*WARN: //' | cut -c1-120)"
        fi
        if [ "$rc" -ne 0 ]; then verdict="FAIL($rc)"
        elif [ "$passed" -eq 0 ]; then
            verdict=SKIPPED
            why=$(table "$work/$name.log" | grep '| *SKIPPED' | sed 's/.*| //' | sort -u | paste -sd';' - || true)
        else verdict=PASS; fi
        printf '%s %-9s %4ss passed=%s skipped=%s %s\n' "$tok" "$verdict" $((SECONDS - s)) "$passed" "$skipped" "$why"
        cp "$work/$name.log" "$suite/triage/$name.log"
        for f in "$work"/samsa-*.log; do cp "$f" "$suite/triage/$name.$(basename "$f")"; done
    done
    exit 0
fi

# Tests sharing a setup (scenario, node count, subtest filter) run in one
# runner invocation against one fresh set of brokers.
rc=0
total_passed=0
run_start=$SECONDS
setups=$(for tok in $tokens; do parse_token "$tok"; setup_of; done | sort -u)
# The tokens of setup $1, without their concurrency mark.
setup_tokens() {
    local tok
    for tok in $tokens; do
        parse_token "$tok"
        if [ "$(setup_of)" = "$1" ]; then echo "${tok%%&*}"; fi
    done | paste -sd, -
}
# Concurrent setups first: each runs in a child run.sh (own work dir, own
# brokers, own verdicts) while this one goes through the rest in turn.
for setup in $setups; do
    [[ $setup == *'&'* ]] || continue
    lane=${setup#*&}
    clog=$work/concurrent-$(slug "$setup").log
    # Without job control here a background job is no group leader, so
    # setsid makes it one in place and $! names the new group.
    TESTS=$(setup_tokens "$setup") SUITE_KEEP_PREFIX=concurrent-${lane:+$lane-} \
        setsid bash "${BASH_SOURCE[0]}" >"$clog" 2>&1 &
    child_pids+=($!)
    child_log[$!]=$clog
    log "setup ${setup%%&*}: concurrent${lane:+ lane $lane} (child run.sh pid $!, TESTS=$(setup_tokens "$setup"))"
done
for setup in $setups; do
    [[ $setup != *'&'* ]] || continue
    nums=$(for tok in $tokens; do
        parse_token "$tok"
        if [ "$(setup_of)" = "$setup" ]; then echo "$t"; fi
    done | paste -sd, -)
    parse_token "0000:$setup"
    start_samsa "$scenario" "$nodes" "$security"
    log "setup $setup: $nodes samsa node(s) (pids ${samsa_pids[*]}) up; TESTS=$nums${subtests:+ SUBTESTS=$subtests}"
    out=$work/test-runner-$(slug "$setup").log
    start=$SECONDS
    src=0
    run_runner "$nums" "$scenario" "$subtests" "$out" || src=$?
    table "$out" >&2
    log "setup $setup: test-runner exited $src after $((SECONDS - start)) s"
    warned=$(timing_warnings "$out" | grep -c . || true)
    if [ "$warned" -gt 0 ]; then
        log "setup $setup: $warned duration check(s) outside their window (warnings under CI):"
        timing_warnings "$out" | cut -c1-200 >&2
    fi
    if [ -n "$(timing_violations "$out")" ]; then
        log "setup $setup: a duration below its check's minimum (the test ended too soon):"
        timing_violations "$out" | cut -c1-200 >&2
        [ "$src" -ne 0 ] || src=1
    fi
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
        keep=$suite/last-test-runner-${SUITE_KEEP_PREFIX:-}$(slug "$setup")
        mkdir -p "$keep"
        cp "$out" "$work"/samsa-*.log "$keep/" || true
        log "runner output and samsa logs kept in $keep/"
    fi
    total_passed=$((total_passed + $(passed_tests "$out" | grep -c . || true)))
done
stop_samsa
for pid in "${child_pids[@]}"; do
    crc=0
    wait "$pid" || crc=$?
    clog=${child_log[$pid]}
    sed 's/^\[librdkafka-suite\] /[librdkafka-suite] (concurrent) /' "$clog" >&2
    if [ "$crc" -ne 0 ]; then rc=1; fi
    n=$(sed -n 's/.*\] \([0-9][0-9]*\) librdkafka tests passed in .*/\1/p' "$clog" | tail -1)
    total_passed=$((total_passed + ${n:-0}))
done
child_pids=()
log "$total_passed librdkafka tests passed in $((SECONDS - run_start)) s$([ "$rc" -ne 0 ] && echo ', SOME FAILED')"
exit "$rc"
