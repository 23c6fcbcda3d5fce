//! Fetch: reads up to the high watermark (`read_uncommitted`) or the last
//! stable offset (`read_committed`, with the aborted transactions that
//! overlap the returned batches, from the transaction index), and long-polls
//! until `min_bytes` are available or `max_wait_ms` passes. Every answer
//! carries the partition's real last stable offset. Control batches
//! (COMMIT/ABORT markers) are returned in the batch stream; clients skip them.
//!
//! The wait subscribes to every requested partition's high-watermark watch
//! *before* reading, so an append that lands between the read and the wait
//! still wakes the fetch. Size limits follow KIP-74: the first partition with
//! data always gets at least one whole batch, later ones only what fits.
//!
//! Versions: v13+ name topics by id (KIP-516), resolved once per request
//! against the metadata image; an unknown id answers UNKNOWN_TOPIC_ID on
//! each of its partitions. v16+ (KIP-951) add, to a partition answered
//! NOT_LEADER_OR_FOLLOWER or FENCED_LEADER_EPOCH, the leader and epoch the
//! metadata names, and the endpoint of that leader when it is live, so the
//! client can move without a Metadata round trip. What v15, v17 and v18
//! add is for follower replicas (replica state, directory id, high
//! watermark), which samsa's replication does not carry over the Kafka
//! protocol: those fields are ignored.
//!
//! From v7, a client may open a fetch session (KIP-227, kept in
//! [`crate::fetch_sessions`]): its later fetches name only what changed,
//! and their answers name only the partitions with records, an error, or
//! a high watermark, last stable offset or log start the client was not
//! told; the long poll waits for the session's partitions as a full fetch
//! waits for its own. A request that cannot continue its session is
//! answered FETCH_SESSION_ID_NOT_FOUND, INVALID_FETCH_SESSION_EPOCH or
//! FETCH_SESSION_TOPIC_ID_ERROR with no partitions, and the client starts
//! over with a full fetch.
//!
//! A topic the caller may not READ answers TOPIC_AUTHORIZATION_FAILED on
//! each of its partitions; that answer alone does not end the long poll
//! (as in Kafka, the other partitions still wait for data).

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures::future::select_all;
use kafka_protocol::error::ResponseError;
use std::collections::BTreeMap;

use kafka_protocol::messages::fetch_request::FetchPartition;
use kafka_protocol::messages::fetch_response::{
    AbortedTransaction, FetchableTopicResponse, LeaderIdAndEpoch, NodeEndpoint, PartitionData,
};
use kafka_protocol::messages::{BrokerId, FetchRequest, FetchResponse, ProducerId, TopicName};
use tokio::sync::Notify;
use tokio::time::Instant;
use tracing::{debug, warn};
use uuid::Uuid;

use super::str_bytes;
use crate::error::storage_error_code;
use crate::error::PartitionError;
use crate::fetch_sessions::{Answered, FetchSessionError, Settled, Told, Wanted};
use crate::replica::Partition;
use crate::security::access::Access;
use crate::security::acl::AclOperation;
use crate::Broker;

/// The first version that names topics by id.
const TOPIC_IDS: i16 = 13;
/// The first version that carries leader hints on leadership errors.
const LEADER_HINTS: i16 = 16;

pub async fn handle(
    broker: &Broker,
    access: &Access,
    request: FetchRequest,
    version: i16,
    listener: &str,
) -> FetchResponse {
    let now_ms = session_clock_ms();
    let begun = match broker
        .fetch_sessions
        .begin(&request, version, access.principal(), now_ms)
    {
        Ok(begun) => begun,
        Err(error) => {
            debug!(%error, "fetch session refused");
            return FetchResponse::default().with_error_code(session_error_code(error).code());
        }
    };
    let topics = by_topic(&begun.partitions);
    let names = super::topic_names(
        broker,
        version >= TOPIC_IDS,
        topics.iter().map(|t| (t.topic, t.topic_id)),
    );
    let denied: Vec<bool> = names
        .iter()
        .map(|name| {
            name.as_deref()
                .is_some_and(|name| !access.allows_topic(AclOperation::Read, name))
        })
        .collect();
    let read = Read {
        topics: &topics,
        incremental: begun.incremental,
        bell: begun.bell.as_ref(),
        names: &names,
        denied: &denied,
        version,
        read_committed: request.isolation_level == 1,
        max_bytes: match usize::try_from(request.max_bytes) {
            Ok(0) | Err(_) => usize::MAX,
            Ok(n) => n,
        },
        listener,
    };
    let mut answer = answer(broker, &request, &read).await;
    answer.response.session_id = begun.session_id;
    broker.fetch_sessions.answered(&begun, answer.reports);
    count_fetched(&answer.carried);
    answer.response
}

/// The Kafka error of a request that cannot continue its fetch session.
fn session_error_code(error: FetchSessionError) -> ResponseError {
    match error {
        FetchSessionError::NotFound(_) => ResponseError::FetchSessionIdNotFound,
        FetchSessionError::InvalidEpoch { .. } => ResponseError::InvalidFetchSessionEpoch,
        FetchSessionError::TopicNaming(_) => ResponseError::FetchSessionTopicIdError,
    }
}

/// The fetch sessions' clock: milliseconds since this process first
/// served a fetch (only differences count: idle time).
fn session_clock_ms() -> u64 {
    static START: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    let start = START.get_or_init(std::time::Instant::now);
    u64::try_from(start.elapsed().as_millis()).unwrap_or(u64::MAX)
}

fn told_of(data: &PartitionData) -> Told {
    Told {
        high_watermark: data.high_watermark,
        last_stable_offset: data.last_stable_offset,
        log_start_offset: data.log_start_offset,
    }
}

/// Whether an incremental answer names the partition: it has records or
/// an error, or the client was not told what it says.
fn has_news(wanted: &Wanted, data: &PartitionData) -> bool {
    data.records.as_ref().is_some_and(|r| !r.is_empty())
        || data.error_code != 0
        || wanted.told != Some(told_of(data))
}

/// One topic's partitions of a request, in fetch order.
struct WantedTopic<'a> {
    topic: &'a TopicName,
    topic_id: &'a Uuid,
    partitions: Vec<&'a Wanted>,
}

/// Groups the partitions to read by topic, keeping their order (a topic
/// whose partitions are apart appears once per run, as Kafka answers a
/// session's partitions).
fn by_topic(partitions: &[Wanted]) -> Vec<WantedTopic<'_>> {
    let mut topics: Vec<WantedTopic<'_>> = Vec::new();
    for wanted in partitions {
        match topics.last_mut() {
            Some(last) if *last.topic == wanted.topic && *last.topic_id == wanted.topic_id => {
                last.partitions.push(wanted)
            }
            _ => topics.push(WantedTopic {
                topic: &wanted.topic,
                topic_id: &wanted.topic_id,
                partitions: vec![wanted],
            }),
        }
    }
    topics
}

/// The records an answer carries, with the partition they were read from.
type Carried = Vec<(Arc<Partition>, Bytes)>;

/// Counts what an answer carries to the consumer in each topic's traffic
/// (`samsa_topic_bytes_out`, `samsa_topic_records_out`).
fn count_fetched(carried: &Carried) {
    for (partition, records) in carried {
        let count: u64 = samsa_storage::batch::batches(records)
            .filter_map(Result::ok)
            .map(|(header, _)| u64::try_from(header.records_count).unwrap_or(0))
            .sum();
        partition.traffic.fetched(records.len() as u64, count);
    }
}

/// One reading of a request's partitions.
struct Answer {
    response: FetchResponse,
    /// Bytes of records in the answer.
    bytes: usize,
    /// Whether a partition answered an error (not counting denied topics).
    any_error: bool,
    /// Partitions whose high watermark rings the session's bell (read or
    /// skipped as settled): without any, there is nothing to wait for.
    belled: usize,
    carried: Carried,
    /// Per partition read (not skipped as settled): what its session keeps.
    reports: Vec<Answered>,
}

async fn answer(broker: &Broker, request: &FetchRequest, read: &Read<'_>) -> Answer {
    let max_wait = Duration::from_millis(u64::try_from(request.max_wait_ms).unwrap_or(0));
    let deadline = Instant::now() + max_wait;
    let min_bytes = usize::try_from(request.min_bytes).unwrap_or(0);
    if let Some(bell) = read.bell {
        return answer_ringing(broker, read, bell, min_bytes, deadline).await;
    }
    loop {
        // Subscribe first: changes after this point wake the wait below.
        let mut watches: Vec<_> = read
            .topics
            .iter()
            .zip(read.names)
            .zip(read.denied)
            .filter(|(_, denied)| !**denied)
            .filter_map(|((t, name), _)| name.as_deref().map(|name| (t, name)))
            .flat_map(|(t, name)| {
                t.partitions
                    .iter()
                    .filter_map(move |w| broker.replicas.get(name, w.fetch.partition))
            })
            .map(|p| p.watch_high_watermark())
            .collect();

        let answer = read.once(broker);
        if answer.bytes >= min_bytes
            || answer.any_error
            || Instant::now() >= deadline
            || watches.is_empty()
        {
            return answer;
        }

        let changed = select_all(watches.iter_mut().map(|w| Box::pin(w.changed())));
        // Waiting for data: Kafka counts a fetch's purgatory time as remote.
        let _parked = broker.metrics.partitions.fetch_waiting();
        let timed_out = samsa_metrics::requests::waiting_remotely(async {
            tokio::select! {
                _ = changed => false,
                _ = tokio::time::sleep_until(deadline) => true,
            }
        })
        .await;
        if timed_out {
            // Read once more so the answer reflects the latest state.
            return read.once(broker);
        }
    }
}

/// The long poll of a session's fetch: every partition read registers the
/// session's bell, so one wait on the bell covers them all; a ring between
/// a read and the wait is kept for the wait.
async fn answer_ringing(
    broker: &Broker,
    read: &Read<'_>,
    bell: &Notify,
    min_bytes: usize,
    deadline: Instant,
) -> Answer {
    loop {
        let answer = read.once(broker);
        if answer.bytes >= min_bytes
            || answer.any_error
            || Instant::now() >= deadline
            || answer.belled == 0
        {
            return answer;
        }
        let _parked = broker.metrics.partitions.fetch_waiting();
        let timed_out = samsa_metrics::requests::waiting_remotely(async {
            tokio::select! {
                _ = bell.notified() => false,
                _ = tokio::time::sleep_until(deadline) => true,
            }
        })
        .await;
        if timed_out {
            return read.once(broker);
        }
    }
}

/// What reading one partition gave: its answer, whether it is settled,
/// and the partition the session's bell was registered with.
struct PartitionRead {
    data: PartitionData,
    settled: Option<Settled>,
    belled_with: Option<std::sync::Weak<Partition>>,
}

/// One fetch request, ready to be read (again) while it waits.
struct Read<'a> {
    topics: &'a [WantedTopic<'a>],
    /// Answer only the partitions with news (a session's later fetch).
    incremental: bool,
    /// The session's bell, registered with every partition read.
    bell: Option<&'a Arc<Notify>>,
    names: &'a [Option<String>],
    /// Per topic: the caller may not READ it.
    denied: &'a [bool],
    version: i16,
    read_committed: bool,
    max_bytes: usize,
    /// The client's listener: leader hints give addresses on it.
    listener: &'a str,
}

impl Read<'_> {
    /// Reads every requested partition once (skipping a session's settled
    /// ones).
    fn once(&self, broker: &Broker) -> Answer {
        let mut endpoints = BTreeMap::new();
        let mut carried = Vec::new();
        let mut reports = Vec::new();
        let mut belled = 0;
        let (topics, bytes, any_error) = self.topics(
            broker,
            &mut endpoints,
            &mut carried,
            &mut reports,
            &mut belled,
        );
        let mut response = FetchResponse::default().with_responses(topics);
        if self.version >= LEADER_HINTS {
            response.node_endpoints = endpoints.into_values().collect();
        }
        Answer {
            response,
            bytes,
            any_error,
            belled,
            carried,
            reports,
        }
    }

    /// KIP-951: the leader and epoch the metadata names for a partition
    /// that this broker does not lead (any more), and its endpoint if live.
    fn leader_hint(
        &self,
        broker: &Broker,
        name: &str,
        index: i32,
        data: &mut PartitionData,
        endpoints: &mut BTreeMap<i32, NodeEndpoint>,
    ) {
        let hint = super::leader_hint(broker, name, index, self.listener);
        data.current_leader = LeaderIdAndEpoch::default()
            .with_leader_id(BrokerId(hint.leader_id))
            .with_leader_epoch(hint.leader_epoch);
        if let Some(b) = hint.endpoint {
            endpoints.entry(hint.leader_id).or_insert_with(|| {
                NodeEndpoint::default()
                    .with_node_id(BrokerId(hint.leader_id))
                    .with_host(str_bytes(b.host))
                    .with_port(b.port)
                    .with_rack(b.rack.map(str_bytes))
            });
        }
    }

    fn topics(
        &self,
        broker: &Broker,
        endpoints: &mut BTreeMap<i32, NodeEndpoint>,
        carried: &mut Carried,
        reports: &mut Vec<Answered>,
        belled: &mut usize,
    ) -> (Vec<FetchableTopicResponse>, usize, bool) {
        let mut total = 0usize;
        let mut any_error = false;
        let mut topics = Vec::with_capacity(self.topics.len());
        for ((topic, name), denied) in self.topics.iter().zip(self.names).zip(self.denied) {
            let mut partitions = Vec::with_capacity(topic.partitions.len());
            for wanted in &topic.partitions {
                let skip = self.incremental
                    && !*denied
                    && wanted
                        .settled
                        .as_ref()
                        .is_some_and(|s| s.still(&broker.replicas).is_some());
                if skip {
                    // Its bell was registered when it was read.
                    *belled += 1;
                    continue;
                }
                let read = if *denied {
                    let data = PartitionData::default()
                        .with_partition_index(wanted.fetch.partition)
                        .with_high_watermark(-1)
                        .with_last_stable_offset(-1)
                        .with_log_start_offset(-1)
                        .with_error_code(ResponseError::TopicAuthorizationFailed.code());
                    PartitionRead {
                        data,
                        settled: None,
                        belled_with: None,
                    }
                } else {
                    let read = self.partition(
                        broker,
                        name.as_deref(),
                        &wanted.fetch,
                        &mut total,
                        endpoints,
                        carried,
                    );
                    any_error |= read.data.error_code != 0;
                    read
                };
                let PartitionRead {
                    data,
                    settled,
                    belled_with,
                } = read;
                *belled += usize::from(belled_with.is_some());
                let named = !self.incremental || has_news(wanted, &data);
                reports.push(Answered {
                    key: wanted.key(),
                    told: named.then(|| told_of(&data)),
                    carried_records: data.records.as_ref().is_some_and(|r| !r.is_empty()),
                    settled,
                    belled_with,
                });
                if named {
                    partitions.push(data);
                }
            }
            if partitions.is_empty() && self.incremental {
                continue;
            }
            // v13+ answer by id (the name is not on the wire), earlier by name.
            topics.push(
                FetchableTopicResponse::default()
                    .with_topic(topic.topic.clone())
                    .with_topic_id(*topic.topic_id)
                    .with_partitions(partitions),
            );
        }
        (topics, total, any_error)
    }

    /// One partition's answer: an error, or what reading it gave within
    /// the request's remaining byte budget (`total` so far); and, when it
    /// had nothing past the fetch offset, what shows it settled.
    fn partition(
        &self,
        broker: &Broker,
        name: Option<&str>,
        wanted: &FetchPartition,
        total: &mut usize,
        endpoints: &mut BTreeMap<i32, NodeEndpoint>,
        carried: &mut Carried,
    ) -> PartitionRead {
        let read_committed = self.read_committed;
        let max_bytes = self.max_bytes;
        let hints = self.version >= LEADER_HINTS;
        let mut data = PartitionData::default()
            .with_partition_index(wanted.partition)
            .with_high_watermark(-1)
            .with_last_stable_offset(-1)
            .with_log_start_offset(-1)
            .with_records(Some(Bytes::new()));
        if read_committed {
            data.aborted_transactions = Some(Vec::new());
        }
        let unread = |data| PartitionRead {
            data,
            settled: None,
            belled_with: None,
        };
        let Some(name) = name else {
            data.error_code = ResponseError::UnknownTopicId.code();
            return unread(data);
        };
        let partition = match broker.leader_partition(name, wanted.partition) {
            Ok(partition) => partition,
            Err(code) => {
                data.error_code = code.code();
                if hints && code == ResponseError::NotLeaderOrFollower {
                    self.leader_hint(broker, name, wanted.partition, &mut data, endpoints);
                }
                return unread(data);
            }
        };
        // Before reading: a change after this point moves the count and
        // rings the bell.
        let before_reading = Settled::before_reading(&partition, &broker.replicas);
        let belled_with = self.bell.map(|bell| {
            partition.ring_on_high_watermark(bell);
            Arc::downgrade(&partition)
        });
        if let Err(error) = partition.check_current_leader_epoch(wanted.current_leader_epoch) {
            data.error_code = error.code();
            if hints && error == ResponseError::FencedLeaderEpoch {
                self.leader_hint(broker, name, wanted.partition, &mut data, endpoints);
            }
            return PartitionRead {
                data,
                settled: None,
                belled_with,
            };
        }
        let partition_max = usize::try_from(wanted.partition_max_bytes).unwrap_or(0);
        let remaining = max_bytes.saturating_sub(*total);
        let limit = partition_max.min(remaining);
        let offset = wanted.fetch_offset;
        let mut settled = None;
        match partition.read(offset, limit, read_committed) {
            Ok(read) => {
                let visible_end = if read_committed {
                    read.last_stable_offset
                } else {
                    read.high_watermark
                };
                if offset >= visible_end {
                    settled = Some(before_reading);
                }
                data.high_watermark = read.high_watermark;
                data.last_stable_offset = read.last_stable_offset;
                data.log_start_offset = read.log_start_offset;
                if read_committed {
                    data.aborted_transactions = Some(
                        read.aborted
                            .iter()
                            .map(|a| {
                                AbortedTransaction::default()
                                    .with_producer_id(ProducerId(a.producer_id))
                                    .with_first_offset(a.first_offset)
                            })
                            .collect(),
                    );
                }
                let records = read.result.records;
                // Only the first partition with data may exceed the limits (KIP-74).
                if *total == 0 || records.len() <= limit {
                    *total += records.len();
                    if !records.is_empty() {
                        carried.push((Arc::clone(&partition), records.clone()));
                    }
                    data.records = Some(records);
                }
            }
            Err(PartitionError::Storage(e)) => {
                let code = storage_error_code(&e);
                if code == ResponseError::KafkaStorageError {
                    warn!(partition = %partition.name(), error = %e, "read failed");
                }
                data.error_code = code.code();
                if let Ok(offsets) = partition.offsets() {
                    data.high_watermark = offsets.high_watermark;
                    data.last_stable_offset = offsets.last_stable_offset;
                    data.log_start_offset = offsets.log_start_offset;
                }
            }
            Err(_) => {
                // Leadership moved while reading.
                data.error_code = ResponseError::NotLeaderOrFollower.code();
                if hints {
                    self.leader_hint(broker, name, wanted.partition, &mut data, endpoints);
                }
            }
        }
        PartitionRead {
            data,
            settled,
            belled_with,
        }
    }
}
