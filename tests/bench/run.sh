#!/usr/bin/env bash
# Reproduces the figures in docs/BENCHMARKS.md on this machine.
#
#   tests/bench/run.sh             single-node scenarios (a)-(d) (a few minutes)
#   tests/bench/run.sh replication acks=all on a three-node cluster (RF=3) beside
#                                  one node (RF=1): records/s, broker CPU per
#                                  record, latency; REPLICATION_PARTITIONS
#                                  (default "1 6"), REPLICATION_ROUNDS (1; even
#                                  rounds run the cluster first)
#   tests/bench/run.sh txn         `samsa bench txn` (transactions vs idempotent
#                                  producing, commit latency, 16 producers) on
#                                  one node, then on a three-node RF=3 cluster;
#                                  TXN_SECONDS per scenario (default 10),
#                                  TXN_RUNS repetitions (default 1), TXN_FLUSH
#                                  the single node's log.flush (default every-ack),
#                                  TXN_SETUPS="single" or "cluster" for one of them,
#                                  TXN_ARGS more `samsa bench txn` arguments
#                                  (e.g. "--txn-sizes 10 --producers 16"); a
#                                  second table splits each transaction's time
#                                  on the brokers (their /metrics, read around it)
#   tests/bench/run.sh pipeline    consume-transform-produce on a three-node
#                                  cluster: transactional stage (a transaction
#                                  every 100 ms) vs the plain one (no
#                                  transactions, auto-commit), same run;
#                                  PIPELINE_RECORDS (default 200000) of
#                                  RECORD_SIZE bytes, PIPELINE_ROUNDS (2)
#   tests/bench/run.sh compression produce throughput (`samsa bench produce`,
#                                  acks=all, idempotent, one partition, one
#                                  node) to a topic with compression.type
#                                  producer vs each codec, the producer
#                                  sending uncompressed (and lz4 → producer,
#                                  lz4 → zstd); broker CPU per record from
#                                  /proc; COMPRESSION_RECORDS (default
#                                  200000), COMPRESSION_ROUNDS (2, interleaved,
#                                  even rounds in reverse order),
#                                  COMPRESSION_PAYLOADS ("text same")
#   tests/bench/run.sh pipelining  kafka-python produce throughput with 1 and 5
#                                  requests in flight, batches of one partition
#                                  pipelined or not, idempotent and
#                                  transactional (see the mode below); one node
#                                  and a three-node cluster
#   tests/bench/run.sh compaction  group-coordinator load time after
#                                  COMPACTION_COMMITS (default 1000000) offset
#                                  commits to 4 groups, before and after the
#                                  log cleaner compacted __consumer_offsets,
#                                  and the cleaner's MB/s (tests/bench/compaction.py,
#                                  the compat venv's python)
#   tests/bench/run.sh cleaner     the log cleaner's MB/s on two ~1 GB dirty
#                                  topics of 500,000 keys, and a producer's
#                                  throughput and p99 beside it: idle, while an
#                                  unthrottled pass runs, while a throttled one
#                                  runs (tests/bench/cleaner.py; CLEANER_ARGS
#                                  passes flags to it)
#   tests/bench/run.sh security    produce/consume MB/s and broker CPU per MB
#                                  over PLAINTEXT, SSL and SASL_SSL (SCRAM-SHA-512)
#                                  in one run, and connection setup time
#                                  (tests/bench/security.py; SECURITY_ARGS
#                                  passes flags to it)
#   tests/bench/run.sh metrics     what recording metrics costs: produce
#                                  throughput (rdkafka_performance, acks=all,
#                                  idempotent, 6 partitions) and broker CPU
#                                  per record of METRICS_BEFORE_BIN (a build
#                                  without the change) against this build,
#                                  interleaved, METRICS_ROUNDS (default 3)
#                                  rounds of RECORDS records of RECORD_SIZE
#   tests/bench/run.sh traces      what OpenTelemetry traces cost: the same
#                                  produce run with traces off, on with every
#                                  trace kept, and on keeping 1 in 100, spans
#                                  exported to a local OTLP receiver
#                                  (tests/src/bin/otlp_sink.rs), TRACES_ROUNDS
#                                  (default 3) rounds; TRACES_LINGER_MS (default
#                                  5) sets the producer's linger.ms: 0 makes
#                                  many small requests, the most spans per record;
#                                  TRACES_CLIENT_ARGS adds -X options (e.g.
#                                  "-X batch.num.messages=1": a request per record
#                                  and partition)
#   tests/bench/run.sh reassign    reassignment MB/s unthrottled and throttled,
#                                  and a steady producer's p50/p99 of another
#                                  topic idle and during each move, on
#                                  `samsa dev --nodes 4` (tests/bench/reassign.py,
#                                  the compat venv's python; REASSIGN_ARGS
#                                  passes flags to it: --bulk-mb, --throttle,
#                                  --rate)
#   tests/bench/run.sh scale       a single node's cost by partitions hosted
#                                  (SCALE_PARTITIONS, default 10,1000,10000):
#                                  CreateTopics time, produce records/s and
#                                  p50/p99, RSS, open descriptors, idle CPU,
#                                  restart after SIGKILL (tests/bench/scale.py,
#                                  the compat venv's python; SCALE_ARGS passes
#                                  flags to it)
#   tests/bench/run.sh groups      a single node's cost by consumer groups
#                                  with committed offsets (GROUPS_COUNTS,
#                                  default 10,1000): commits/s,
#                                  __consumer_offsets bytes, RSS, idle CPU,
#                                  restart until every offset is read back
#                                  (tests/bench/groups.py; GROUPS_ARGS)
#   tests/bench/run.sh fetch-sessions  consumers caught up on many partitions
#                                  (FETCH_SESSIONS_PARTITIONS, default
#                                  1000,10000), fetching with every partition
#                                  named vs in a KIP-227 session, alternating
#                                  windows on one broker: broker CPU per
#                                  round, bytes per round
#                                  (tests/bench/fetch_sessions.py;
#                                  FETCH_SESSIONS_ARGS)
#   tests/bench/run.sh producers   a single node's cost by idempotent
#                                  producer ids (PRODUCERS_COUNTS, default
#                                  1000,10000,100000): ids taken/s, first
#                                  batches/s, RSS, idle CPU, snapshot bytes,
#                                  restart after a clean stop and after
#                                  SIGKILL until every batch sent again is
#                                  recognised (tests/bench/producers.py;
#                                  PRODUCERS_ARGS)
#   tests/bench/run.sh failover    controller failover as a client sees it:
#                                  three nodes, the controller leader
#                                  SIGKILLed, CreateTopics from kafka-python
#                                  retried until it succeeds; election and
#                                  first success times per round
#                                  (tests/bench/failover.py; FAILOVER_ARGS)
#   tests/bench/run.sh cluster-scale   three nodes by partitions (RF 3;
#                                  CLUSTER_SCALE_PARTITIONS, default
#                                  300,3000,9000): CreateTopics until every
#                                  node lists all, the idle cluster's CPU,
#                                  quorum store size, a
#                                  broker's leaderships moved after SIGKILL
#                                  and after SIGTERM, its restart
#                                  (tests/bench/cluster_scale.py;
#                                  CLUSTER_SCALE_ARGS, e.g. "--idle-only
#                                  --idle-windows 2" for the idle CPU alone)
#   RECORDS=200000 tests/bench/run.sh   a quicker, noisier pass
#   BENCH_PAGE_CACHE_MIB=3072 tests/bench/run.sh replication
#                                  in a memory cgroup with a full page cache
#                                  (see below; root only)
#   SINGLE_QUICK=1 tests/bench/run.sh   (a)-(c) only: no dd, no 5 GiB (d)
#                                  (for before/after pairs of one run)
#   SAMSA_BIN=/path/to/samsa tests/bench/run.sh txn   use that binary, no build
#   SAMSA_SERVER_BIN=/path/to/old/samsa tests/bench/run.sh txn
#                                  brokers from that binary, clients from this build
#
# Each scenario starts a fresh release-built samsa on a free port with a fresh
# data directory (under BENCH_DIR, default ./target/bench — on the same disk as
# the repo), and drives it with librdkafka's own load generator
# `rdkafka_performance` (built from the librdkafka tree bundled in rdkafka-sys,
# the same build tests/librdkafka/run.sh makes) and with `samsa bench`.
# Client and broker share the machine. Nothing here is a test: it prints
# numbers, it asserts nothing.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
target=${CARGO_TARGET_DIR:-$root/target}
records=${RECORDS:-1000000}
size=${RECORD_SIZE:-1024}
bench_dir=${BENCH_DIR:-$target/bench}
mode=${1:-single}
log() { echo "[bench] $*" >&2; }

if [ -n "${SAMSA_BIN:-}" ]; then
    samsa=$SAMSA_BIN # e.g. a copy of an earlier build, for before/after figures
else
    log "building release samsa"
    (cd "$root" && nice cargo build --release -p samsa >/dev/null)
    samsa=$target/release/samsa
fi
# The broker processes may come from another build than the client tools
# (before/after figures of a broker change with the same `samsa bench`).
server=${SAMSA_SERVER_BIN:-$samsa}
# Ports below the ephemeral range, distinct within one call (tests/ports.py).
free_ports() { python3 "$here/../ports.py" "$1"; }
perf_tool=$target/librdkafka-suite/librdkafka/examples/rdkafka_performance
build_perf_tool() {
    "$here/../librdkafka/run.sh" --build
    if [ ! -x "$perf_tool" ]; then
        log "building rdkafka_performance"
        make -C "$target/librdkafka-suite/librdkafka/examples" rdkafka_performance >/dev/null
    fi
    export LD_LIBRARY_PATH=$target/librdkafka-suite/librdkafka/src
}

# The Python with confluent-kafka and kafka-python (the compat venv) the
# Python benchmarks run on; exits when there is none.
compat_python() {
    local python=${SAMSA_COMPAT_PYTHON:-$target/compat-venv/bin/python}
    if [ ! -x "$python" ]; then
        log "no python with confluent-kafka and kafka-python at $python: bash tests/run-all.sh creates the compat venv, or set SAMSA_COMPAT_PYTHON"
        exit 1
    fi
    echo "$python"
}

# BENCH_PAGE_CACHE_MIB=N: the brokers (not the clients) run in a memory
# cgroup of N MiB whose page cache is filled first (a scratch file, synced,
# kept until the end), so their writes recycle page-cache pages the way a
# long-running broker's do once its page cache is full. Without it, a VM
# whose balloon takes freed memory back (free page reporting, as on these
# machines) makes every write into never-used or long-freed memory cost
# ~2-3 s of system time per GiB, and a three-node cluster on one machine
# writes three times the bytes of one node: docs/BENCHMARKS.md,
# "Replication efficiency". Needs root (cgroup v1 or v2).
broker_prefix=()
if [ -n "${BENCH_PAGE_CACHE_MIB:-}" ]; then
    cgroup_name=samsa-bench-$$
    if [ -d /sys/fs/cgroup/memory ]; then
        cgroup=/sys/fs/cgroup/memory/$cgroup_name
        mkdir "$cgroup" && echo $((BENCH_PAGE_CACHE_MIB * 1024 * 1024)) >"$cgroup/memory.limit_in_bytes"
    else
        cgroup=/sys/fs/cgroup/$cgroup_name
        mkdir "$cgroup" && echo $((BENCH_PAGE_CACHE_MIB * 1024 * 1024)) >"$cgroup/memory.max"
    fi
    # Prefixed to a command, runs it (as the same process) inside the
    # cgroup; its children stay there too.
    broker_prefix=(bash -c 'echo $$ >"$0/cgroup.procs" && exec "$@"' "$cgroup")
    page_cache_fill=$target/bench-page-cache-fill
    log "filling a ${BENCH_PAGE_CACHE_MIB} MiB page cache (memory cgroup $cgroup)"
    "${broker_prefix[@]}" dd if=/dev/zero of="$page_cache_fill" bs=1M count="$BENCH_PAGE_CACHE_MIB" \
        conv=fsync status=none
fi
release_page_cache() {
    if [ -n "${page_cache_fill:-}" ]; then
        rm -f "$page_cache_fill"
        rmdir "$cgroup" 2>/dev/null || true
    fi
}

broker_pid=
stop_broker() {
    if [ -n "$broker_pid" ] && kill -0 "$broker_pid" 2>/dev/null; then
        kill -TERM "$broker_pid"
        wait "$broker_pid" 2>/dev/null || true
    fi
    broker_pid=
}
trap 'stop_broker; release_page_cache' EXIT

# start_broker <flush policy toml> [server args...] : starts samsa, sets
# $port, $data and $metrics_endpoints (its HTTP listener)
start_broker() {
    stop_broker
    local http_port; read -r port http_port < <(free_ports 2)
    metrics_endpoints=127.0.0.1:$http_port
    data=$bench_dir/data-$port
    rm -rf "$bench_dir" && mkdir -p "$data"
    "${broker_prefix[@]}" "$server" server --listen "127.0.0.1:$port" --data-dir "$data" --set "log.flush=$1" \
        --set "http_listen=$metrics_endpoints" "${@:2}" \
        >"$bench_dir/broker.log" 2>&1 &
    broker_pid=$!
    for _ in $(seq 100); do
        if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then return 0; fi
        sleep 0.1
    done
    log "broker did not start"; cat "$bench_dir/broker.log"; exit 1
}

# start_cluster: `samsa dev --nodes 3` on free ports; sets $port (node 1's
# Kafka port) and $metrics_endpoints (the three HTTP listeners) once three
# brokers can host a replication-factor-3 topic.
start_cluster() {
    stop_broker
    port=$(python3 - <<'PY'
import random, socket
for _ in range(200):
    base = random.randrange(20000, 31700)  # below the ephemeral range, as tests/ports.py
    ports = [base + d for d in (0, 1, 2, 100, 101, 102, 200, 201, 202)]
    try:
        socks = []
        for p in ports:
            s = socket.socket(); s.bind(("127.0.0.1", p)); socks.append(s)
        print(base); break
    except OSError:
        pass
    finally:
        for s in socks: s.close()
PY
)
    data=$bench_dir/cluster-$port
    metrics_endpoints=127.0.0.1:$((port + 2)),127.0.0.1:$((port + 102)),127.0.0.1:$((port + 202))
    rm -rf "$bench_dir" && mkdir -p "$data"
    "${broker_prefix[@]}" "$server" dev --nodes 3 --port "$port" --controller-port "$((port + 1))" \
        --http-port "$((port + 2))" --data-dir "$data" \
        >"$bench_dir/broker.log" 2>&1 &
    broker_pid=$!
    for _ in $(seq 300); do
        if "$samsa" topic create ready --partitions 1 --replication-factor 3 \
            --bootstrap-server "127.0.0.1:$port" >/dev/null 2>&1; then return 0; fi
        sleep 0.2
    done
    log "cluster did not start"; cat "$bench_dir/broker.log"; exit 1
}

# produce <partitions> <extra rdkafka_performance args...> : prints msgs/s
produce() {
    local partitions=$1; shift
    "$samsa" topic create perf --partitions "$partitions" --bootstrap-server "127.0.0.1:$port" >/dev/null
    "$perf_tool" -P -t perf -b "127.0.0.1:$port" -s "$size" -c "$records" \
        -X linger.ms=5 "$@" 2>&1 | tee "$bench_dir/perf.out" | grep -o '[0-9]* msgs/s' | tail -1
}

consume() {
    local partitions=$1 args=()
    for p in $(seq 0 $((partitions - 1))); do args+=(-p "$p"); done
    "$perf_tool" -C -t perf -b "127.0.0.1:$port" -o beginning -e -c "$records" "${args[@]}" \
        2>&1 | grep -o '[0-9]* msgs/s' | tail -1
}

rss_peak_mib() { awk '/VmHWM/ {printf "%d", $2/1024}' "/proc/$broker_pid/status"; }
# The broker's CPU (user + system) so far, in milliseconds: its process and
# its children (`samsa dev` runs each node as a child process).
broker_cpu_ms() {
    local stats=() pid
    for pid in "$broker_pid" $(pgrep -P "$broker_pid" || true); do stats+=("/proc/$pid/stat"); done
    awk -v t="$(getconf CLK_TCK)" '{ c += $14 + $15 } END { print int(c * 1000 / t) }' "${stats[@]}"
}

if [ "$mode" = pipeline ]; then
    # samsa pipeline bench drives `samsa pipeline stage` processes (the same
    # release binary) against `samsa dev --nodes 3`; it prints the 1-minute
    # load average beside each figure (the machine may be shared).
    start_cluster
    bootstrap="127.0.0.1:$port,127.0.0.1:$((port + 100)),127.0.0.1:$((port + 200))"
    echo "## samsa pipeline benchmark $(date -u +%Y-%m-%dT%H:%MZ), ${PIPELINE_RECORDS:-200000} records of $size bytes, 3 nodes (RF=3, min ISR 2)"
    echo
    echo "load before: $(uptime)"
    "$samsa" pipeline bench --bootstrap-server "$bootstrap" --records "${PIPELINE_RECORDS:-200000}" \
        --record-size "$size" --partitions "${PIPELINE_PARTITIONS:-6}" --processes "${PIPELINE_PROCESSES:-2}" \
        --txn-interval-ms 100 --rounds "${PIPELINE_ROUNDS:-2}" --log-dir "$bench_dir/stages" 2>"$bench_dir/pipeline-bench.err"
    echo "load after: $(uptime)"
    stop_broker
    rm -rf "$bench_dir"
    exit 0
fi

if [ "$mode" = compression ]; then
    n=${COMPRESSION_RECORDS:-200000}
    echo "## samsa topic compression benchmark $(date -u +%Y-%m-%dT%H:%MZ), $n records of $size bytes per run"
    echo
    echo "samsa bench produce --records $n --record-size $size --partitions 1 --acks all --idempotent --payload P -X compression.type=C,"
    echo "to a topic created with --config compression.type=T; a fresh broker (log.flush every-ack) per run."
    echo
    echo "load before: $(uptime | sed 's/.*load average: //')"
    echo
    echo "| round | payload | topic compression.type | producer codec | records/s | broker CPU s | broker CPU µs/record | stored MiB |"
    echo "|---|---|---|---|---|---|---|---|"
    for round in $(seq "${COMPRESSION_ROUNDS:-2}"); do
        for payload in ${COMPRESSION_PAYLOADS:-text same}; do
            pairs="producer:none uncompressed:none gzip:none snappy:none lz4:none zstd:none producer:lz4 zstd:lz4"
            # Even rounds run the list backwards, so no configuration always
            # follows the same one (each run deletes the last one's data).
            [ $((round % 2)) -eq 0 ] && pairs=$(echo "$pairs" | tr ' ' '\n' | tac | tr '\n' ' ')
            for pair in $pairs; do
                topic_codec=${pair%%:*} producer_codec=${pair##*:}
                start_broker '"every-ack"'
                "$samsa" topic create c --partitions 1 --config "compression.type=$topic_codec" \
                    --bootstrap-server "127.0.0.1:$port" >/dev/null
                cpu0=$(broker_cpu_ms)
                line=$("$samsa" bench produce --bootstrap-server "127.0.0.1:$port" --topic c \
                    --records "$n" --record-size "$size" --partitions 1 --acks all --idempotent \
                    --payload "$payload" -X "compression.type=$producer_codec" 2>"$bench_dir/bench.err" | tail -1)
                cpu1=$(broker_cpu_ms)
                rate=$(echo "$line" | grep -o '[0-9.]* records/sec' | cut -d' ' -f1)
                stored=$(cat "$data"/c-0/*.log | wc -c | awk '{printf "%.1f", $1 / 1048576}')
                per=$(awk -v a="$cpu0" -v b="$cpu1" -v n="$n" 'BEGIN {printf "%.1f", (b - a) * 1e3 / n}')
                cpu=$(awk -v a="$cpu0" -v b="$cpu1" 'BEGIN {printf "%.2f", (b - a) / 1000}')
                echo "| $round | $payload | $topic_codec | $producer_codec | ${rate%.*} | $cpu | $per | $stored |"
            done
        done
    done
    echo
    echo "load after: $(uptime | sed 's/.*load average: //')"
    stop_broker
    rm -rf "$bench_dir"
    exit 0
fi

if [ "$mode" = compaction ]; then
    python=$(compat_python)
    echo "load before: $(uptime | sed 's/.*load average: //')"
    "$python" "$here/compaction.py" --samsa "$server" --dir "$bench_dir/compaction" \
        --commits "${COMPACTION_COMMITS:-1000000}" --segment-bytes "${COMPACTION_SEGMENT_BYTES:-16777216}"
    echo "load after: $(uptime | sed 's/.*load average: //')"
    exit 0
fi

if [ "$mode" = security ]; then
    echo "load before: $(uptime | sed 's/.*load average: //')"
    # shellcheck disable=SC2086
    python3 "$here/security.py" --samsa "$server" --dir "$bench_dir/security" ${SECURITY_ARGS:-}
    echo "load after: $(uptime | sed 's/.*load average: //')"
    exit 0
fi

if [ "$mode" = reassign ]; then
    python=$(compat_python)
    # shellcheck disable=SC2086
    "$python" "$here/reassign.py" --samsa "$server" --dir "$bench_dir/reassign" ${REASSIGN_ARGS:-}
    exit 0
fi

if [ "$mode" = scale ]; then
    python=$(compat_python)
    echo "load before: $(uptime | sed 's/.*load average: //'); open-file limit $(ulimit -n)"
    # shellcheck disable=SC2086
    "$python" "$here/scale.py" --samsa "$server" --dir "$bench_dir/scale" \
        --partitions "${SCALE_PARTITIONS:-10,1000,10000}" ${SCALE_ARGS:-}
    echo "load after: $(uptime | sed 's/.*load average: //')"
    exit 0
fi

if [ "$mode" = groups ]; then
    python=$(compat_python)
    # shellcheck disable=SC2086
    "$python" "$here/groups.py" --samsa "$server" --dir "$bench_dir/groups" \
        --groups "${GROUPS_COUNTS:-10,1000}" ${GROUPS_ARGS:-}
    exit 0
fi

if [ "$mode" = fetch-sessions ]; then
    python=$(compat_python)
    # shellcheck disable=SC2086
    "$python" "$here/fetch_sessions.py" --samsa "$server" --dir "$bench_dir/fetch-sessions" \
        --partitions "${FETCH_SESSIONS_PARTITIONS:-1000,10000}" ${FETCH_SESSIONS_ARGS:-}
    exit 0
fi

if [ "$mode" = producers ]; then
    python=$(compat_python)
    # shellcheck disable=SC2086
    "$python" "$here/producers.py" --samsa "$server" --dir "$bench_dir/producers" \
        --producers "${PRODUCERS_COUNTS:-1000,10000,100000}" ${PRODUCERS_ARGS:-}
    exit 0
fi

if [ "$mode" = cluster-scale ]; then
    python=$(compat_python)
    # shellcheck disable=SC2086
    "$python" "$here/cluster_scale.py" --samsa "$server" --dir "$bench_dir/cluster-scale" \
        --partitions "${CLUSTER_SCALE_PARTITIONS:-300,3000,9000}" ${CLUSTER_SCALE_ARGS:-}
    exit 0
fi

if [ "$mode" = failover ]; then
    python=$(compat_python)
    # shellcheck disable=SC2086
    "$python" "$here/failover.py" --samsa "$server" --dir "$bench_dir/failover" ${FAILOVER_ARGS:-}
    exit 0
fi

if [ "$mode" = cleaner ]; then
    echo "load before: $(uptime | sed 's/.*load average: //')"
    # shellcheck disable=SC2086
    python3 "$here/cleaner.py" --samsa "$server" --dir "$bench_dir/cleaner" ${CLEANER_ARGS:-}
    echo "load after: $(uptime | sed 's/.*load average: //')"
    exit 0
fi

if [ "$mode" = pipelining ]; then
    # kafka-python (tests/compat/pipelined_producer.py, the compat venv's
    # python) producing PIPELINING_RECORDS records of PIPELINING_RECORD_SIZE
    # bytes to 10 partitions, acks=all, one producer, in each configuration:
    # max.in.flight 1; 5 as kafka-python ships it (one batch per partition in
    # flight); 5 pipelined (several batches per partition, as Java's
    # producer); transactional (transactions of 10,000 records) as shipped
    # and pipelined. PIPELINING_SETUPS: "single" (one node, RF=1) and/or
    # "cluster" (samsa dev --nodes 3, RF=3); PIPELINING_RUNS repetitions.
    python=$(compat_python)
    precords=${PIPELINING_RECORDS:-200000}
    psize=${PIPELINING_RECORD_SIZE:-100}
    per_txn=10000
    echo "## kafka-python produce throughput $(date -u +%Y-%m-%dT%H:%MZ), broker $server, $precords records of $psize bytes, 10 partitions, acks=all"
    echo
    echo "load before: $(uptime | sed 's/.*load average: //')"
    echo
    echo "| setup | configuration | run | records/s | outcome |"
    echo "|---|---|---|---|---|"
    for run in $(seq "${PIPELINING_RUNS:-2}"); do
        for setup in ${PIPELINING_SETUPS:-single cluster}; do
            for cfg in "idempotent 1" "idempotent 5 shipped" "idempotent 5" "transactional 5 shipped" "transactional 5"; do
                set -- $cfg
                if [ "$setup" = single ]; then
                    start_broker '"every-ack"'; bootstrap=127.0.0.1:$port; rf=1; name="1 node, RF=1"
                else
                    start_cluster; bootstrap="127.0.0.1:$port,127.0.0.1:$((port + 100)),127.0.0.1:$((port + 200))"; rf=3; name="3 nodes, RF=3"
                fi
                "$samsa" topic create perf --partitions 10 --replication-factor "$rf" \
                    --bootstrap-server "127.0.0.1:$port" >/dev/null
                extra=()
                [ "${3:-}" = shipped ] && extra+=(--mute-partitions)
                label="$1, max.in.flight $2${3:+ (as shipped: one batch per partition)}"
                [ "$2" = 5 ] && [ -z "${3:-}" ] && label="$1, max.in.flight 5, pipelined"
                out=$("$python" "$root/tests/compat/pipelined_producer.py" --bootstrap "$bootstrap" \
                    --topic perf --partitions 10 --mode "$1" --producers 1 \
                    --transactions $((precords / per_txn)) --records "$per_txn" --abort-ratio 0 \
                    --max-in-flight "$2" --value-size "$psize" "${extra[@]}" 2>"$bench_dir/pipelining.err" | tail -1) || true
                rate=$(echo "$out" | grep -o '[0-9-]* records/s' | cut -d' ' -f1)
                outcome=$(echo "$out" | grep -o 'acked [0-9]*, failed [0-9]* (OUT_OF_ORDER_SEQUENCE_NUMBER [0-9]*), committed [0-9]*')
                [ -n "$outcome" ] || outcome="no summary: $(tail -1 "$bench_dir/pipelining.err")"
                echo "| $name | $label | $run | ${rate:--} | $outcome |"
            done
        done
    done
    echo
    echo "load after: $(uptime | sed 's/.*load average: //')"
    stop_broker
    rm -rf "$bench_dir"
    exit 0
fi

if [ "$mode" = metrics ]; then
    before=${METRICS_BEFORE_BIN:?METRICS_BEFORE_BIN=/path/to/samsa, a build without the change}
    rounds=${METRICS_ROUNDS:-3}
    build_perf_tool
    echo "## metrics cost $(date -u +%Y-%m-%dT%H:%MZ): $records records of $size bytes, acks=all, idempotent, 6 partitions"
    echo
    echo "| round | broker | records/s | broker CPU µs/record |"
    echo "|---|---|---|---|"
    for round in $(seq "$rounds"); do
        order="before after"
        [ $((round % 2)) -eq 0 ] && order="after before"
        for which in $order; do
            if [ "$which" = before ]; then server=$before; else server=$samsa; fi
            start_broker '"every-ack"'
            c0=$(broker_cpu_ms)
            r=$(produce 6 -a -1 -X enable.idempotence=true)
            c1=$(broker_cpu_ms)
            echo "| $round | $which | ${r% msgs/s} | $(awk -v c=$((c1 - c0)) -v n="$records" 'BEGIN { printf "%.2f", c * 1000 / n }') |"
        done
    done
    stop_broker
    rm -rf "$bench_dir"
    exit 0
fi

if [ "$mode" = traces ]; then
    rounds=${TRACES_ROUNDS:-3}
    build_perf_tool
    sink_bin=$target/release/otlp-sink
    if [ ! -x "$sink_bin" ]; then
        (cd "$root" && nice cargo build --release -p samsa-tests --bin otlp-sink >/dev/null)
    fi
    sink_out=$(mktemp)
    "$sink_bin" >"$sink_out" &
    sink_pid=$!
    trap 'stop_broker; release_page_cache; kill "$sink_pid" 2>/dev/null || true; rm -f "$sink_out"' EXIT
    for _ in $(seq 100); do [ -s "$sink_out" ] && break; sleep 0.1; done
    endpoint=$(head -1 "$sink_out")
    spans_now() { awk '/^spans/ { n = $2 } END { print n + 0 }' "$sink_out"; }
    echo "## tracing cost $(date -u +%Y-%m-%dT%H:%MZ): $records records of $size bytes, acks=all, idempotent, 6 partitions, linger.ms=${TRACES_LINGER_MS:-5} ${TRACES_CLIENT_ARGS:-}; spans to a local OTLP/gRPC receiver"
    echo
    echo "| round | traces | records/s | broker CPU µs/record | spans received |"
    echo "|---|---|---|---|---|"
    # A first run on a fresh machine is slower whatever it measures (page
    # cache, disk): one unreported run first, and the order turns each round.
    start_broker '"every-ack"'
    produce 6 -a -1 -X enable.idempotence=true >/dev/null
    orders=("off 1.0 0.01" "1.0 0.01 off" "0.01 off 1.0")
    for round in $(seq "$rounds"); do
        for setting in ${orders[$(((round - 1) % 3))]}; do
            if [ "$setting" = off ]; then
                start_broker '"every-ack"'
            else
                start_broker '"every-ack"' --set "otlp_endpoint=$endpoint" --set "trace_sample_ratio=$setting"
            fi
            s0=$(spans_now)
            c0=$(broker_cpu_ms)
            # shellcheck disable=SC2086 # TRACES_CLIENT_ARGS is a list of -X options
            r=$(produce 6 -a -1 -X enable.idempotence=true -X "linger.ms=${TRACES_LINGER_MS:-5}" ${TRACES_CLIENT_ARGS:-})
            c1=$(broker_cpu_ms)
            stop_broker # a stopping broker exports what it has queued
            # The sink's next report counts everything the broker sent.
            reports=$(wc -l <"$sink_out")
            while [ "$(wc -l <"$sink_out")" -le "$reports" ]; do sleep 0.1; done
            s1=$(spans_now)
            label=$([ "$setting" = off ] && echo off || echo "on, ratio $setting")
            echo "| $round | $label | ${r% msgs/s} | $(awk -v c=$((c1 - c0)) -v n="$records" 'BEGIN { printf "%.2f", c * 1000 / n }') | $((s1 - s0)) |"
        done
    done
    rm -rf "$bench_dir"
    exit 0
fi

# `samsa bench txn` is the only client of the txn mode: no rdkafka_performance.
[ "$mode" = txn ] || build_perf_tool

if [ "$mode" = replication ]; then
    rounds=${REPLICATION_ROUNDS:-1}
    echo "## samsa replication benchmark $(date -u +%Y-%m-%dT%H:%MZ), $records records of $size bytes, acks=all, idempotent"
    echo
    echo "| round | setup | partitions | records/s (rdkafka_performance) | broker CPU µs/record | samsa bench p50 / p99 / p99.9 latency |"
    echo "|---|---|---|---|---|---|"
    for round in $(seq "$rounds"); do
        for partitions in ${REPLICATION_PARTITIONS:-1 6}; do
            # Even rounds turn the order, so drift within a run (page cache,
            # a filling disk) does not always favour one setup.
            order="single cluster"
            [ $((round % 2)) -eq 0 ] && order="cluster single"
            for setup in $order; do
                if [ "$setup" = single ]; then start_broker '"every-ack"'; name="1 node, RF=1"; else start_cluster; name="3 nodes, RF=3, min ISR 2"; fi
                c0=$(broker_cpu_ms)
                r=$(produce "$partitions" -a -1 -X enable.idempotence=true)
                c1=$(broker_cpu_ms)
                l=$("$samsa" bench produce --bootstrap-server "127.0.0.1:$port" --topic lat --partitions "$partitions" \
                    --records "$((records / 5))" --record-size "$size" --acks all --idempotent 2>&1 | tail -1 \
                    | grep -o '[0-9.]* ms 50th, [0-9.]* ms 99th, [0-9.]* ms 99.9th')
                per=$(awk -v c=$((c1 - c0)) -v n="$records" 'BEGIN { printf "%.2f", c * 1000 / n }')
                echo "| $round | $name | $partitions | ${r% msgs/s} | $per | $l |"
            done
        done
    done
    stop_broker
    rm -rf "$bench_dir"
    exit 0
fi

if [ "$mode" = txn ]; then
    seconds=${TXN_SECONDS:-10}
    runs=${TXN_RUNS:-1}
    for run in $(seq "$runs"); do
        for setup in ${TXN_SETUPS:-single cluster}; do
            if [ "$setup" = single ]; then
                start_broker "${TXN_FLUSH:-\"every-ack\"}"; name="1 node, RF=1, log.flush=${TXN_FLUSH:-\"every-ack\"}"; rf=1
            else
                start_cluster; name="3 nodes (samsa dev --nodes 3), RF=3, min ISR 2"; rf=3
            fi
            "$samsa" topic create txn --partitions 1 --replication-factor "$rf" \
                --bootstrap-server "127.0.0.1:$port" >/dev/null
            echo "### $name, run $run of $runs, $(date -u +%Y-%m-%dT%H:%M:%SZ), $seconds s per scenario, $size-byte records"
            echo
            echo "load before: $(uptime | sed 's/.*load average: //')"
            echo
            # shellcheck disable=SC2086 # TXN_ARGS is a list of arguments
            "$samsa" bench txn --bootstrap-server "127.0.0.1:$port" --topic txn \
                --seconds "$seconds" --record-size "$size" --metrics "$metrics_endpoints" \
                ${TXN_ARGS:-}
            echo
            echo "load after: $(uptime | sed 's/.*load average: //')"
            echo
        done
    done
    stop_broker
    rm -rf "$bench_dir"
    exit 0
fi

echo "## samsa benchmark run $(date -u +%Y-%m-%dT%H:%MZ), $records records of $size bytes"
echo
mkdir -p "$bench_dir"
if [ -z "${SINGLE_QUICK:-}" ]; then
    dd_out=$(dd if=/dev/zero of="$bench_dir/dd" bs=1M count=2048 conv=fdatasync 2>&1 | tail -1)
    rm -f "$bench_dir/dd"
    echo "- disk, durable sequential write (dd bs=1M count=2048 conv=fdatasync): ${dd_out##*, }"
    echo
fi
echo "| scenario | partitions | records/s | broker peak RSS |"
echo "|---|---|---|---|"
for partitions in 1 8; do
    start_broker '"every-ack"'
    r=$(produce "$partitions" -a 1)
    echo "| (a) acks=1, not idempotent | $partitions | ${r% msgs/s} | $(rss_peak_mib) MiB |"
    c=$(consume "$partitions")
    echo "| (c) consume (rdkafka_performance -C) | $partitions | ${c% msgs/s} | $(rss_peak_mib) MiB |"

    start_broker '"every-ack"'
    r=$(produce "$partitions" -a -1 -X enable.idempotence=true)
    echo "| (b) acks=all, idempotent, fsync before answer (default) | $partitions | ${r% msgs/s} | $(rss_peak_mib) MiB |"

    start_broker '{ interval = { interval_ms = 0 } }'
    r=$(produce "$partitions" -a -1 -X enable.idempotence=true)
    echo "| (b) acks=all, idempotent, fsync off | $partitions | ${r% msgs/s} | $(rss_peak_mib) MiB |"
done
stop_broker
echo
if [ -z "${SINGLE_QUICK:-}" ]; then
    # (d) memory: 5 GiB through one broker; records must live on disk and in the
    # page cache, not on the broker's heap.
    big=$((5 * 1024 * 1024 * 1024 / size))
    start_broker '"every-ack"'
    records=$big produce 8 -a -1 -X enable.idempotence=true >/dev/null
    records=$big consume 8 >/dev/null
    echo "- (d) memory: $big records of $size bytes (5 GiB) produced (acks=all, idempotent, 8 partitions) and consumed: broker peak RSS $(rss_peak_mib) MiB"
    stop_broker
    echo
fi
echo "samsa bench (same machine, same run):"
start_broker '"every-ack"'
"$samsa" bench produce --bootstrap-server "127.0.0.1:$port" --topic sb --records "$records" \
    --record-size "$size" --partitions 1 --acks all --idempotent 2>&1 | tail -1
"$samsa" bench consume --bootstrap-server "127.0.0.1:$port" --topic sb 2>&1 | tail -1
stop_broker
rm -rf "$bench_dir"
