//! A broker whose data file system fills up (a real, loop-mounted ext4 of a
//! few MiB; needs root): produce is answered KAFKA_STORAGE_ERROR (56), the
//! process stays up and serves reads, nothing acknowledged is damaged,
//! writes work again once space is freed without a restart, and after a
//! crash on the full disk recovery cuts a torn tail and keeps every
//! acknowledged record exactly once. In a cluster, a follower on a full
//! disk leaves the ISR and rejoins it. The controller's Raft store opens
//! once space is freed, even after an open on the full disk failed.

use std::path::Path;
use std::time::Duration;

use bytes::Bytes;
use kafka_protocol::messages::{ApiKey, ProduceRequest};
use samsa_tests::client::{produce_request, KafkaClient};
use samsa_tests::codes::{NONE, OUT_OF_ORDER_SEQUENCE_NUMBER};
use samsa_tests::http::{http_get, metric};
use samsa_tests::small_fs::SmallFs;
use samsa_tests::{unique_topic, wait_until, BatchBuilder, SamsaNode};

const KAFKA_STORAGE_ERROR: i16 = 56;
const BATCH_RECORDS: u32 = 8;

/// One idempotent producer's batches: `values` per batch, `value_len`
/// bytes each, sequences continuing from the last acknowledged batch.
struct Producer {
    pid: i64,
    epoch: i16,
    next_sequence: i32,
    value_len: usize,
    batches: u32,
}

struct Batch {
    records: Bytes,
    values: Vec<String>,
}

impl Producer {
    fn new(c: &mut KafkaClient, value_len: usize) -> Producer {
        let init = c.init_producer_id().unwrap();
        Producer {
            pid: init.producer_id.0,
            epoch: init.producer_epoch,
            next_sequence: 0,
            value_len,
            batches: 0,
        }
    }

    /// The next batch; it stays the next one until [`Producer::acked`].
    fn next(&self) -> Batch {
        self.ahead(0)
    }

    /// The batch `skipped` batches after the next one (what a pipelining
    /// producer has in flight behind it).
    fn ahead(&self, skipped: u32) -> Batch {
        let batch = self.batches + skipped;
        let values: Vec<String> = (0..BATCH_RECORDS)
            .map(|i| {
                let tag = format!("b{batch}-r{i}-");
                format!(
                    "{tag}{}",
                    "x".repeat(self.value_len.saturating_sub(tag.len()))
                )
            })
            .collect();
        let first_sequence = self.next_sequence + (skipped * BATCH_RECORDS) as i32;
        let records = BatchBuilder::idempotent(self.pid, self.epoch, first_sequence)
            .values(&values)
            .build();
        Batch { records, values }
    }

    fn acked(&mut self, batch: &Batch) {
        self.next_sequence += batch.values.len() as i32;
        self.batches += 1;
    }
}

/// What the broker holds, in offset order.
fn stored_values(c: &mut KafkaClient, topic: &str) -> Vec<String> {
    c.fetch_all(topic, 0, 0)
        .unwrap()
        .iter()
        .map(|r| String::from_utf8_lossy(r.value.as_deref().unwrap_or_default()).into_owned())
        .collect()
}

fn log_lines_with(node: &SamsaNode, needle: &str) -> usize {
    std::fs::read_to_string(node.log_path())
        .unwrap_or_default()
        .lines()
        .filter(|l| l.contains(needle))
        .count()
}

fn produce(c: &mut KafkaClient, topic: &str, batch: &Batch) -> (i16, i64) {
    let r = c.produce(topic, 0, batch.records.clone(), -1).unwrap();
    (r.error_code, r.base_offset)
}

/// Produces `batches` batches, each accepted at the next offset, and adds
/// them to `acked`.
fn produce_accepted(
    c: &mut KafkaClient,
    topic: &str,
    producer: &mut Producer,
    acked: &mut Vec<String>,
    batches: u32,
) {
    for _ in 0..batches {
        let batch = producer.next();
        assert_eq!(produce(c, topic, &batch), (NONE, acked.len() as i64));
        acked.extend(batch.values.iter().cloned());
        producer.acked(&batch);
    }
}

/// Produces batches until one is refused; returns the code of the refusal.
/// Every accepted batch is added to `acked`.
fn produce_until_refused(
    c: &mut KafkaClient,
    topic: &str,
    producer: &mut Producer,
    acked: &mut Vec<String>,
) -> i16 {
    for _ in 0..10_000 {
        let batch = producer.next();
        let (code, base_offset) = produce(c, topic, &batch);
        if code != NONE {
            return code;
        }
        assert_eq!(base_offset, acked.len() as i64);
        acked.extend(batch.values.iter().cloned());
        producer.acked(&batch);
    }
    panic!("the disk never filled up");
}

fn start_on(fs: &SmallFs) -> (SamsaNode, std::path::PathBuf) {
    let data = fs.path().join("data");
    std::fs::create_dir(&data).unwrap();
    (SamsaNode::start_with_data_dir(&data, &[]), data)
}

fn segment_file(data: &Path, topic: &str) -> std::path::PathBuf {
    data.join(format!("{topic}-0"))
        .join("00000000000000000000.log")
}

#[test]
fn full_disk_answers_storage_error_and_recovers_without_restart() {
    let fs = SmallFs::ext4(64);
    let (mut node, _data) = start_on(&fs);
    let mut c = node.client();
    let topic = unique_topic("disk-full");
    c.create_topic(&topic, 1).unwrap();
    let mut producer = Producer::new(&mut c, 1000);
    let mut acked = Vec::new();
    produce_accepted(&mut c, &topic, &mut producer, &mut acked, 20);

    fs.fill(0);
    let code = produce_until_refused(&mut c, &topic, &mut producer, &mut acked);
    assert_eq!(
        code, KAFKA_STORAGE_ERROR,
        "a full disk answers KAFKA_STORAGE_ERROR"
    );
    // The same batch again (a client's retry): still refused, and nothing stalls.
    let pending = producer.next();
    for _ in 0..20 {
        assert_eq!(produce(&mut c, &topic, &pending).0, KAFKA_STORAGE_ERROR);
    }
    assert!(node.is_running(), "the broker survives a full disk");
    assert_eq!(stored_values(&mut c, &topic), acked, "reads go on");
    assert_eq!(
        log_lines_with(&node, "log writes are failing"),
        1,
        "one log line when writes start failing, not one per write"
    );
    let (status, metrics) = http_get(node.http_addr(), "/metrics").unwrap();
    assert_eq!(status, 200);
    assert_eq!(
        metric(&metrics, "samsa_partitions_with_failing_writes"),
        Some(1)
    );
    assert!(metric(&metrics, "samsa_log_write_failures_total").unwrap() >= 21);

    fs.free();
    // The retried batch goes in at the next offset: neither a duplicate nor
    // out of sequence, as nothing of it was kept.
    let (code, base_offset) = wait_until(
        "produce works once space is freed",
        Duration::from_secs(30),
        || {
            let answer = produce(&mut c, &topic, &pending);
            (answer.0 != KAFKA_STORAGE_ERROR).then_some(answer)
        },
    );
    assert_eq!((code, base_offset), (NONE, acked.len() as i64));
    acked.extend(pending.values.iter().cloned());
    producer.acked(&pending);
    produce_accepted(&mut c, &topic, &mut producer, &mut acked, 5);
    assert_eq!(log_lines_with(&node, "log writes work again"), 1);
    let (_, metrics) = http_get(node.http_addr(), "/metrics").unwrap();
    assert_eq!(
        metric(&metrics, "samsa_partitions_with_failing_writes"),
        Some(0)
    );
    assert_eq!(stored_values(&mut c, &topic), acked);

    node.sigkill();
    node.restart();
    let mut c = node.client();
    assert_eq!(
        stored_values(&mut c, &topic),
        acked,
        "every acknowledged record, exactly once, in order, after a crash"
    );
    let batch = producer.next();
    assert_eq!(produce(&mut c, &topic, &batch), (NONE, acked.len() as i64));
}

/// Sends `batches` back to back on one connection before reading any
/// answer, as a pipelining producer does; returns each answer's code and
/// base offset.
fn produce_pipelined(c: &mut KafkaClient, topic: &str, batches: &[&Batch]) -> Vec<(i16, i64)> {
    let version = c.version_for(ApiKey::Produce).unwrap();
    let sent: Vec<i32> = batches
        .iter()
        .map(|b| {
            c.send_only(&produce_request(topic, 0, b.records.clone(), -1), version)
                .unwrap()
        })
        .collect();
    sent.into_iter()
        .map(|correlation_id| {
            let answer = c.recv::<ProduceRequest>(correlation_id, version).unwrap();
            let p = &answer.responses[0].partition_responses[0];
            (p.error_code, p.base_offset)
        })
        .collect()
}

/// librdkafka (and the Java client) pipeline an idempotent producer's
/// requests. When the disk refuses one, the next is already in flight and
/// finds its sequence skipping ahead: it must be refused as retriable
/// (KAFKA_STORAGE_ERROR), not OUT_OF_ORDER_SEQUENCE_NUMBER, which makes
/// librdkafka bump the producer's epoch and renumber retries a leader may
/// already hold. Both then go in, in order, once space is freed.
#[test]
fn a_request_in_flight_behind_one_the_full_disk_refused_is_refused_as_retriable() {
    let fs = SmallFs::ext4(64);
    let (node, _data) = start_on(&fs);
    let mut c = node.client();
    let topic = unique_topic("disk-full-pipelined");
    c.create_topic(&topic, 1).unwrap();
    let mut producer = Producer::new(&mut c, 1000);
    let mut acked = Vec::new();
    // State for the producer first: a producer the partition knows nothing
    // of may start at any sequence, and there would be no gap to find.
    produce_accepted(&mut c, &topic, &mut producer, &mut acked, 3);
    fs.fill(0);
    assert_eq!(
        produce_until_refused(&mut c, &topic, &mut producer, &mut acked),
        KAFKA_STORAGE_ERROR
    );

    let (first, second) = (producer.next(), producer.ahead(1));
    for _ in 0..3 {
        let answers = produce_pipelined(&mut c, &topic, &[&first, &second]);
        assert_eq!(
            answers.iter().map(|(code, _)| *code).collect::<Vec<_>>(),
            [KAFKA_STORAGE_ERROR, KAFKA_STORAGE_ERROR],
            "both refused as retriable; {OUT_OF_ORDER_SEQUENCE_NUMBER} would make the client bump its epoch"
        );
    }

    fs.free();
    let answers = wait_until(
        "the pair goes in once space is freed",
        Duration::from_secs(30),
        || {
            let answers = produce_pipelined(&mut c, &topic, &[&first, &second]);
            (answers[0].0 != KAFKA_STORAGE_ERROR).then_some(answers)
        },
    );
    let at = acked.len() as i64;
    assert_eq!(
        answers,
        [(NONE, at), (NONE, at + i64::from(BATCH_RECORDS))],
        "in order, at the next offsets"
    );
    acked.extend(first.values.iter().cloned());
    acked.extend(second.values.iter().cloned());
    assert_eq!(stored_values(&mut c, &topic), acked, "each batch once");
}

#[test]
fn crash_on_a_full_disk_keeps_acked_records_and_recovery_cuts_a_torn_tail() {
    let fs = SmallFs::ext4(64);
    let (mut node, data) = start_on(&fs);
    let mut c = node.client();
    let topic = unique_topic("disk-full-crash");
    c.create_topic(&topic, 1).unwrap();
    let mut producer = Producer::new(&mut c, 8 * 1024);
    let mut acked = Vec::new();
    let mut acked_bytes = 0;
    for _ in 0..10 {
        let batch = producer.next();
        assert_eq!(produce(&mut c, &topic, &batch), (NONE, acked.len() as i64));
        acked.extend(batch.values.iter().cloned());
        acked_bytes += batch.records.len() as u64;
        producer.acked(&batch);
    }

    // Room for part of the next batch (64 KiB): the write is torn by the
    // disk, the broker cuts it.
    fs.fill(24 * 1024);
    let failed = producer.next();
    assert_eq!(produce(&mut c, &topic, &failed).0, KAFKA_STORAGE_ERROR);
    assert_eq!(produce(&mut c, &topic, &failed).0, KAFKA_STORAGE_ERROR);
    node.sigkill();
    let segment = segment_file(&data, &topic);
    assert_eq!(
        std::fs::metadata(&segment).unwrap().len(),
        acked_bytes,
        "the torn write was cut: the segment holds the acknowledged batches only"
    );

    // The worst moment: the process dies between the torn write and its
    // cut. Put such a tail back, then restart with space.
    fs.free();
    {
        use std::io::Write;
        let mut file = std::fs::OpenOptions::new()
            .append(true)
            .open(&segment)
            .unwrap();
        file.write_all(&failed.records[..20 * 1024]).unwrap();
        file.sync_all().unwrap();
    }
    node.restart();
    assert_eq!(
        log_lines_with(&node, "truncating invalid tail of log segment"),
        1
    );
    let mut c = node.client();
    assert_eq!(stored_values(&mut c, &topic), acked);
    // The failed batch was never stored: its retry is the next write.
    assert_eq!(produce(&mut c, &topic, &failed), (NONE, acked.len() as i64));
    acked.extend(failed.values.iter().cloned());
    assert_eq!(stored_values(&mut c, &topic), acked);
}

/// A follower whose data disk fills up leaves the ISR while acks=all writes
/// go on on the other two. Its broker keeps running; its controller, whose
/// Raft store (sled) is on the same disk, cannot survive a failed write in
/// the process, so the node stops with the reason once metadata changes
/// reach it. Restarted after space is freed, it catches up and rejoins the
/// ISR holding the leader's bytes, and its controller the quorum.
#[test]
fn a_follower_on_a_full_disk_leaves_the_isr_and_rejoins_once_space_is_freed() {
    use crate::replication::{create_assigned_topic, isr_of, stored_batches, ACKS_ALL};
    use samsa_tests::cluster::SamsaCluster;

    // Declared before the cluster so it is unmounted after the processes die.
    let fs = SmallFs::ext4(128);
    let mut cluster = SamsaCluster::new(3, &["replica_lag_time_max_ms=2000"]);
    let full = 3;
    // The node's data directory (partitions and its controller's Raft
    // store) is the small file system.
    let data = cluster.node(full).data_dir();
    std::fs::remove_dir(&data).unwrap();
    std::os::unix::fs::symlink(fs.path(), &data).unwrap();
    for id in cluster.ids() {
        cluster.spawn(id);
    }
    for id in cluster.ids() {
        cluster.wait_ready(id);
    }
    let leader = cluster.wait_leader(Duration::from_secs(20));
    let leader = if leader == full { 1 } else { leader };
    let other = cluster
        .ids()
        .into_iter()
        .find(|id| *id != leader && *id != full)
        .unwrap();
    let topic = unique_topic("disk-full-follower");
    let mut lc = cluster.client(leader);
    create_assigned_topic(&mut lc, &topic, &[leader, full, other], None);
    wait_until("a full ISR", Duration::from_secs(30), || {
        isr_of(&mut lc, &topic).filter(|(l, isr)| *l == leader && isr == &[1, 2, 3])
    });
    let mut acked = Vec::new();
    let mut write = |lc: &mut KafkaClient, tag: &str, n: usize| {
        for i in 0..n {
            let values: Vec<String> = (0..4)
                .map(|r| format!("{tag}-{i}-{r}-{}", "v".repeat(4000)))
                .collect();
            let r = lc
                .produce(
                    &topic,
                    0,
                    BatchBuilder::new().values(&values).build(),
                    ACKS_ALL,
                )
                .unwrap();
            assert_eq!(r.error_code, NONE, "{tag} {i}: {:?}", r.error_message);
            assert_eq!(r.base_offset, acked.len() as i64);
            acked.extend(values);
        }
    };
    write(&mut lc, "before", 20);

    fs.fill(0);
    // acks=all goes on: the full follower cannot append, falls behind and
    // leaves the ISR (the first of these writes waits for that).
    write(&mut lc, "full", 50);
    let (_, isr) = wait_until(
        "the full follower to leave the ISR",
        Duration::from_secs(30),
        || isr_of(&mut lc, &topic).filter(|(_, isr)| !isr.contains(&full)),
    );
    assert_eq!(isr.len(), 2);
    let log = std::fs::read_to_string(cluster.node(full).log_path()).unwrap();
    assert!(
        log.contains("log writes are failing"),
        "{}",
        cluster.log_tail(full, 50)
    );

    // Metadata changes while the disk is full: the node's controller must
    // append them to its Raft store on that disk, and cannot. sled keeps
    // the first I/O error for good and openraft stops; the node stops with
    // the reason rather than run on with metadata that no longer moves.
    let mut created = 0;
    wait_until(
        "the node whose controller store is full to stop",
        Duration::from_secs(60),
        || {
            if !cluster.running().contains(&full) {
                return Some(());
            }
            if created < 200 {
                let t = unique_topic(&format!("disk-full-meta-{created}"));
                create_assigned_topic(&mut lc, &t, &[leader, other], None);
                created += 1;
            }
            None
        },
    );
    let log = std::fs::read_to_string(cluster.node(full).log_path()).unwrap();
    assert!(
        log.contains("this node's controller stopped"),
        "{}",
        cluster.log_tail(full, 50)
    );
    cluster.sigkill(full);
    // Nothing stalled on the two others.
    write(&mut lc, "two", 5);

    fs.free();
    cluster.restart(full);
    wait_until(
        "the follower to rejoin the ISR",
        Duration::from_secs(60),
        || isr_of(&mut lc, &topic).filter(|(_, isr)| isr == &[1, 2, 3]),
    );
    write(&mut lc, "after", 5);
    let values: Vec<String> = lc
        .fetch_all(&topic, 0, 0)
        .unwrap()
        .iter()
        .map(|r| String::from_utf8_lossy(r.value.as_deref().unwrap_or_default()).into_owned())
        .collect();
    assert_eq!(values, acked);
    let dir = |id: i32| cluster.node(id).data_dir().join(format!("{topic}-0"));
    let reference = stored_batches(&dir(leader));
    for id in [full, other] {
        wait_until(
            &format!("node {id} to hold the leader's bytes"),
            Duration::from_secs(30),
            || (stored_batches(&dir(id)) == reference).then_some(()),
        );
    }
    // The node's controller (its Raft store is on the same disk) took the
    // metadata changes made meanwhile (the ISR shrink and expand).
    wait_until(
        "every controller at the same metadata offset",
        Duration::from_secs(30),
        || {
            let offsets = cluster.metadata_offsets();
            (offsets.len() == 3 && offsets.values().min() == offsets.values().max()).then_some(())
        },
    );
    let log = std::fs::read_to_string(cluster.node(full).log_path()).unwrap();
    for line in log.lines().filter(|l| {
        ["sled", "raft", "failing", "work again", "checkpoint"]
            .iter()
            .any(|k| l.contains(k))
    }) {
        println!("node {full}: {line}");
    }
}

/// The controller's Raft store (sled) on a disk that fills up: its writes
/// fail, and so does opening it while the disk is full, because sled writes
/// a snapshot of its own while it opens. That write, cut short, leaves an
/// unfinished snapshot file that sled would read as corrupt at every later
/// open, so a node restarted by its supervisor before space was freed would
/// never start again. Once space is freed the store must open and hold
/// every entry it flushed.
#[test]
fn the_raft_store_opens_once_space_is_freed_after_an_open_on_the_full_disk_failed() {
    use samsa_controller::store::open_sled;

    let fs = SmallFs::ext4(64);
    let dir = fs.path().join("raft");
    let mut next = 1;
    let mut flushed = 0;
    {
        let (store, _, _) = open_sled(&dir).unwrap();
        // A Raft log that moves on and is purged behind: sled reuses its
        // segments, as a long-lived controller's store does.
        for _ in 0..400 {
            let batch: Vec<_> = (next..next + 10).map(raft_entry).collect();
            store.append(&batch).unwrap();
            store.flush().unwrap();
            next += 10;
            flushed = next - 1;
            store.remove(0, Some(next.saturating_sub(200))).unwrap();
        }
        fs.fill(0);
        write_until_refused(store.as_ref(), &mut next, &mut flushed);
    }

    // A restart while the disk is still full. Whether sled's open must
    // write its snapshot, and so where the full disk refuses it, depends on
    // where sled's writes stood when the store closed: the open may
    // succeed, fail before the snapshot file, or fail midway through it.
    fs.fill(0);
    match open_sled(&dir) {
        Err(refused) => assert!(refused.to_string().contains("No space left"), "{refused}"),
        Ok(opened) => drop(opened),
    }
    fs.free();
    // The case the store must survive: a snapshot write cut short. When
    // this run's open did not leave one, leave one as it would have: the
    // next snapshot's name, half of the last snapshot's bytes.
    if unfinished_snapshots(&dir).is_empty() {
        leave_an_unfinished_snapshot(&dir);
    }
    let (store, _, _) = open_sled(&dir).unwrap();
    let last = store.last().unwrap().map(|(index, _)| index);
    assert!(
        last >= Some(flushed),
        "flushed up to {flushed}, the reopened store ends at {last:?}"
    );
    for (index, bytes) in store.read(flushed - 50, Some(flushed + 1)).unwrap() {
        assert_eq!(bytes, raft_entry(index).1, "entry {index}");
    }
}

/// The snapshot files sled left unfinished in `dir`.
fn unfinished_snapshots(dir: &std::path::Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .unwrap()
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|name| name.starts_with("snap.") && name.ends_with(".generating"))
        .collect()
}

/// Writes what a snapshot write of sled 0.34 cut short leaves: a
/// `snap.<lsn>.generating` file, named after the last finished snapshot's
/// next LSN (so sled would read it first), holding half of that snapshot.
fn leave_an_unfinished_snapshot(dir: &std::path::Path) {
    let last = std::fs::read_dir(dir)
        .unwrap()
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            let lsn = u64::from_str_radix(name.strip_prefix("snap.")?, 16).ok()?;
            Some((lsn, e.path()))
        })
        .max()
        .expect("sled wrote no snapshot");
    let bytes = std::fs::read(&last.1).unwrap();
    let unfinished = dir.join(format!("snap.{:016X}.generating", last.0 + 1));
    std::fs::write(unfinished, &bytes[..bytes.len() / 2]).unwrap();
}

/// Raft log entry `index` of the store tests: 2,000 bytes.
fn raft_entry(index: u64) -> (u64, Vec<u8>) {
    (index, vec![(index % 251) as u8; 2000])
}

/// Appends batches of ten entries, each flushed, until the disk refuses a
/// flush; `flushed` follows the last flushed entry.
fn write_until_refused(
    store: &dyn samsa_controller::store::RaftStore,
    next: &mut u64,
    flushed: &mut u64,
) {
    let refused = (0..10_000).find_map(|_| {
        let batch: Vec<_> = (*next..*next + 10).map(raft_entry).collect();
        match store.append(&batch).and_then(|()| store.flush()) {
            Ok(()) => {
                *next += 10;
                *flushed = *next - 1;
                None
            }
            Err(e) => Some(e),
        }
    });
    let refused = refused.expect("the full disk never refused a flush");
    assert!(refused.to_string().contains("No space left"), "{refused}");
}
