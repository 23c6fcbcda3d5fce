//! Partitions and replication as scraped: per hosted partition its
//! offsets, size and segments; per led partition its ISR, producers,
//! transactions and each follower's lag; and the broker-wide counts Kafka's
//! ReplicaManager reports (partitions, leaders, under-replicated and
//! under-min-ISR partitions).

use samsa_metrics::prometheus_client::encoding::DescriptorEncoder;

use super::{counter, gauge, gauge_family};
use crate::replication::state::ReplicationFigures;
use crate::Broker;

/// One hosted partition as scraped.
struct PartitionRow {
    topic: String,
    partition: i32,
    log_start: i64,
    log_end: i64,
    size_bytes: i64,
    segments: i64,
    /// Led partitions only.
    led: Option<LedRow>,
}

struct LedRow {
    high_watermark: i64,
    last_stable_offset: i64,
    producers: i64,
    /// Transactions open (one per producer).
    open_transactions: i64,
    /// Whether a transaction's producer last wrote more than
    /// `transaction_max_timeout_ms` ago: the coordinator would have aborted
    /// it by now, so nobody is going to end it (see `samsa txn
    /// find-hanging`).
    hanging: bool,
    replication: ReplicationFigures,
}

fn rows(broker: &Broker, now_ms: i64) -> Vec<PartitionRow> {
    let max_timeout = i64::from(broker.config.transaction_max_timeout_ms);
    let mut rows = Vec::new();
    for partition in broker.replicas.all() {
        let leader = partition.is_leader();
        let Ok(row) = partition.with_log(|log| {
            let led = leader.then(|| {
                let producers = log.describe_producers();
                let open: Vec<_> = producers
                    .iter()
                    .filter(|p| p.current_txn_start_offset >= 0)
                    .collect();
                (
                    log.high_watermark(),
                    log.last_stable_offset(),
                    producers.len() as i64,
                    open.len() as i64,
                    open.iter()
                        .any(|p| now_ms.saturating_sub(p.last_timestamp) > max_timeout),
                )
            });
            Ok((
                log.log_start_offset(),
                log.log_end_offset(),
                i64::try_from(log.size_bytes()).unwrap_or(i64::MAX),
                log.segment_count() as i64,
                led,
            ))
        }) else {
            continue; // closed meanwhile
        };
        let (log_start, log_end, size_bytes, segments, led) = row;
        rows.push(PartitionRow {
            topic: partition.topic.clone(),
            partition: partition.index,
            log_start,
            log_end,
            size_bytes,
            segments,
            led: led.map(|(hw, lso, producers, open, hanging)| LedRow {
                high_watermark: hw,
                last_stable_offset: lso,
                producers,
                open_transactions: open,
                hanging,
                replication: partition.replication_figures(log_end, now_ms),
            }),
        });
    }
    rows.sort_by(|a, b| (&a.topic, a.partition).cmp(&(&b.topic, b.partition)));
    rows
}

const TP: [&str; 2] = ["topic", "partition"];

fn tp(row: &PartitionRow) -> [String; 2] {
    [row.topic.clone(), row.partition.to_string()]
}

/// Writes a per-partition gauge over the rows `value` answers for.
fn per_partition(
    out: &mut DescriptorEncoder<'_>,
    rows: &[PartitionRow],
    name: &str,
    help: &str,
    value: impl Fn(&PartitionRow) -> Option<i64>,
) -> std::fmt::Result {
    gauge_family(
        out,
        name,
        help,
        TP,
        rows.iter().filter_map(|r| Some((tp(r), value(r)?))),
    )
}

pub(super) fn encode(
    broker: &Broker,
    now_ms: i64,
    out: &mut DescriptorEncoder<'_>,
) -> std::fmt::Result {
    let rows = rows(broker, now_ms);
    let led = || rows.iter().filter_map(|r| r.led.as_ref());
    gauge(
        out,
        "samsa_partitions",
        "Partition replicas this broker hosts (Kafka: ReplicaManager PartitionCount)",
        rows.len() as i64,
    )?;
    gauge(
        out,
        "samsa_partitions_led",
        "Partitions this broker leads (Kafka: ReplicaManager LeaderCount)",
        led().count() as i64,
    )?;
    gauge(
        out,
        "samsa_under_replicated_partitions",
        "Led partitions whose ISR is smaller than their replica set (Kafka: ReplicaManager UnderReplicatedPartitions)",
        led()
            .filter(|l| l.replication.in_sync < l.replication.replicas)
            .count() as i64,
    )?;
    gauge(
        out,
        "samsa_under_min_isr_partitions",
        "Led partitions whose ISR is smaller than min.insync.replicas: acks=all produce fails with NOT_ENOUGH_REPLICAS (Kafka: ReplicaManager UnderMinIsrPartitionCount)",
        led()
            .filter(|l| l.replication.in_sync < l.replication.min_in_sync)
            .count() as i64,
    )?;
    gauge(
        out,
        "samsa_open_transactions",
        "Transactions open on partitions this broker leads (one per producer and partition)",
        led().map(|l| l.open_transactions).sum::<i64>(),
    )?;
    gauge(
        out,
        "samsa_partitions_with_hanging_transactions",
        "Led partitions with a transaction whose producer last wrote more than transaction_max_timeout_ms ago",
        led().filter(|l| l.hanging).count() as i64,
    )?;
    gauge(
        out,
        "samsa_producer_ids",
        "Producer ids with state on the partitions this broker leads, summed over partitions (Kafka: ProducerStateManager ProducerIdCount)",
        led().map(|l| l.producers).sum::<i64>(),
    )?;
    let partitions = broker.replicas.all();
    gauge(
        out,
        "samsa_partitions_with_failing_writes",
        "Hosted partitions whose last log write failed (a full or failing disk); they answer KAFKA_STORAGE_ERROR to writes until one succeeds",
        partitions
            .iter()
            .filter(|p| p.write_failures.is_failing())
            .count() as i64,
    )?;
    counter(
        out,
        "samsa_log_write_failures",
        "Log writes (appends, replicated appends, fsyncs) that failed on the disk, over all hosted partitions, since start",
        partitions.iter().map(|p| p.write_failures.total()).sum::<u64>(),
    )?;
    per_partition(
        out,
        &rows,
        "samsa_partition_log_start_offset",
        "First offset of each hosted partition's log (Kafka: Log LogStartOffset)",
        |r| Some(r.log_start),
    )?;
    per_partition(
        out,
        &rows,
        "samsa_partition_log_end_offset",
        "Next offset each hosted partition's log will write (Kafka: Log LogEndOffset)",
        |r| Some(r.log_end),
    )?;
    per_partition(
        out,
        &rows,
        "samsa_partition_size_bytes",
        "Bytes of each hosted partition's log segments (Kafka: Log Size)",
        |r| Some(r.size_bytes),
    )?;
    per_partition(
        out,
        &rows,
        "samsa_partition_segments",
        "Segments of each hosted partition's log (Kafka: Log NumLogSegments)",
        |r| Some(r.segments),
    )?;
    per_partition(
        out,
        &rows,
        "samsa_partition_high_watermark",
        "High watermark of each led partition",
        |r| Some(r.led.as_ref()?.high_watermark),
    )?;
    per_partition(
        out,
        &rows,
        "samsa_partition_lso_lag",
        "High watermark minus last stable offset of each led partition (what read_committed readers wait for)",
        |r| {
            let l = r.led.as_ref()?;
            Some(l.high_watermark - l.last_stable_offset)
        },
    )?;
    per_partition(
        out,
        &rows,
        "samsa_partition_replicas",
        "Replicas of each led partition (Kafka: Partition ReplicasCount)",
        |r| Some(r.led.as_ref()?.replication.replicas as i64),
    )?;
    per_partition(
        out,
        &rows,
        "samsa_partition_in_sync_replicas",
        "In-sync replicas of each led partition, the leader included (Kafka: Partition InSyncReplicasCount)",
        |r| Some(r.led.as_ref()?.replication.in_sync as i64),
    )?;
    per_partition(
        out,
        &rows,
        "samsa_partition_producers",
        "Producer ids with state on each led partition",
        |r| Some(r.led.as_ref()?.producers),
    )?;
    let followers = || {
        rows.iter().flat_map(|r| {
            r.led
                .iter()
                .flat_map(|l| l.replication.followers.iter())
                .map(move |f| (r, f))
        })
    };
    let labels = ["topic", "partition", "replica"];
    gauge_family(
        out,
        "samsa_follower_lag_records",
        "Leader log end offset minus each follower's, as of the follower's last fetch, on led partitions (Kafka: FetcherLagMetrics ConsumerLag, seen from the leader)",
        labels,
        followers().map(|(r, f)| {
            let [t, p] = tp(r);
            ([t, p, f.replica.to_string()], f.records)
        }),
    )?;
    gauge_family(
        out,
        "samsa_follower_lag_seconds",
        "Seconds since each follower of a led partition last had everything its leader had (compare replica_lag_time_max_ms)",
        labels,
        followers().map(|(r, f)| {
            let [t, p] = tp(r);
            ([t, p, f.replica.to_string()], f.millis as f64 / 1000.0)
        }),
    )
}
