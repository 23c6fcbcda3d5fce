//! The records of `__consumer_offsets` and rebuilding groups from them.
//!
//! Two kinds of record, told apart by the key's version field:
//!
//! ```text
//! offset key  = version: u16 (= 0) | group | topic | partition: i32
//! offset value = version: u16 (= 0) | offset: i64 | leader_epoch: i32
//!              | metadata: nullable | commit_timestamp: i64
//! group key   = version: u16 (= 1) | group
//! group value = version: u16 (= 0) | protocol_type: nullable | generation: i32
//!              | protocol: nullable | leader: nullable | state_timestamp: i64
//!              | members: u32, then per member:
//!                  member_id | instance_id: nullable | client_id | client_host
//!                  | rebalance_timeout_ms: i32 | session_timeout_ms: i32
//!                  | subscription (bytes) | assignment (bytes)
//! ```
//!
//! Strings and byte strings are `u32` length + bytes; *nullable* ones are
//! `i32` length (-1: null) + bytes. A record without a value is a
//! tombstone: the offset, or the whole group, is deleted.
//!
//! Offsets committed in a transaction are written by the producer in
//! transactional batches. Replay ([`replay`]) keeps them pending per
//! producer until that producer's COMMIT marker (they become the committed
//! offsets, unless a partition's committed offset has a later record:
//! [`commit_offsets`]) or ABORT marker (they are dropped) appears later in
//! the log.
//!
//! Decoding is total: any byte string gives a value or a [`RecordError`],
//! never a panic.

use std::collections::{BTreeMap, BTreeSet};

use crate::codec::{put_bytes_u32, put_nullable_bytes, Reader};
use crate::coordinator::{LogEntry, RecordError, StateRecord};

const OFFSET_KEY_VERSION: u16 = 0;
const GROUP_KEY_VERSION: u16 = 1;
const VALUE_VERSION: u16 = 0;

/// A committed offset of one partition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OffsetAndMetadata {
    pub offset: i64,
    pub leader_epoch: i32,
    pub metadata: Option<String>,
    pub commit_timestamp: i64,
}

/// An offset as the coordinator holds it: the committed value and the
/// position of its record in `__consumer_offsets`. The position orders
/// commits whose effects arrive out of log order: a transactional offset
/// takes effect at its COMMIT marker, which can come after a newer plain
/// commit of the same partition (Kafka's rule: the later record wins).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoggedOffset {
    pub value: OffsetAndMetadata,
    /// Offset of the record in its `__consumer_offsets` partition.
    pub log_offset: i64,
}

/// Makes `incoming` the committed offsets of their partitions, except where
/// the committed one's record is later in the log.
pub fn commit_offsets(
    committed: &mut BTreeMap<(String, i32), LoggedOffset>,
    incoming: impl IntoIterator<Item = ((String, i32), LoggedOffset)>,
) {
    for (tp, o) in incoming {
        match committed.get(&tp) {
            Some(current) if current.log_offset > o.log_offset => {}
            _ => {
                committed.insert(tp, o);
            }
        }
    }
}

/// A member as persisted with its group.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredMember {
    pub member_id: String,
    pub instance_id: Option<String>,
    pub client_id: String,
    pub client_host: String,
    pub rebalance_timeout_ms: i32,
    pub session_timeout_ms: i32,
    /// The member's metadata for the group's selected protocol.
    pub subscription: Vec<u8>,
    pub assignment: Vec<u8>,
}

/// A group's metadata after a completed rebalance.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredGroup {
    pub protocol_type: Option<String>,
    pub generation: i32,
    pub protocol: Option<String>,
    pub leader: Option<String>,
    pub state_timestamp: i64,
    pub members: Vec<StoredMember>,
}

/// The key of a `__consumer_offsets` record.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum RecordKey {
    Offset {
        group: String,
        topic: String,
        partition: i32,
    },
    Group(String),
}

impl RecordKey {
    pub fn group(&self) -> &str {
        match self {
            RecordKey::Offset { group, .. } | RecordKey::Group(group) => group,
        }
    }
}

/// One decoded record (`None` value: a tombstone).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GroupRecordValue {
    Offset(Option<OffsetAndMetadata>),
    Group(Option<StoredGroup>),
}

/// The `__consumer_offsets` record of a committed offset (or its tombstone).
pub fn offset_record(
    group: &str,
    topic: &str,
    partition: i32,
    value: Option<&OffsetAndMetadata>,
) -> StateRecord {
    let mut key = Vec::with_capacity(16 + group.len() + topic.len());
    key.extend_from_slice(&OFFSET_KEY_VERSION.to_be_bytes());
    put_bytes_u32(&mut key, group.as_bytes());
    put_bytes_u32(&mut key, topic.as_bytes());
    key.extend_from_slice(&partition.to_be_bytes());
    StateRecord {
        key,
        value: value.map(encode_offset),
    }
}

/// The `__consumer_offsets` record of a group's metadata (or its tombstone).
pub fn group_metadata_record(group: &str, value: Option<&StoredGroup>) -> StateRecord {
    let mut key = Vec::with_capacity(6 + group.len());
    key.extend_from_slice(&GROUP_KEY_VERSION.to_be_bytes());
    put_bytes_u32(&mut key, group.as_bytes());
    StateRecord {
        key,
        value: value.map(encode_group),
    }
}

/// What a `__consumer_offsets` record holds.
pub fn decode_group_record(
    key: &[u8],
    value: Option<&[u8]>,
) -> Result<(RecordKey, GroupRecordValue), RecordError> {
    let key = decode_key(key)?;
    let value = match key {
        RecordKey::Offset { .. } => GroupRecordValue::Offset(value.map(decode_offset).transpose()?),
        RecordKey::Group(_) => GroupRecordValue::Group(value.map(decode_group).transpose()?),
    };
    Ok((key, value))
}

fn string(r: &mut Reader<'_>, what: &'static str) -> Result<String, RecordError> {
    String::from_utf8(r.bytes_u32(what)?.to_vec()).map_err(|_| RecordError::InvalidUtf8(what))
}

fn nullable_string(r: &mut Reader<'_>, what: &'static str) -> Result<Option<String>, RecordError> {
    r.nullable_bytes(what)?
        .map(|b| String::from_utf8(b.to_vec()).map_err(|_| RecordError::InvalidUtf8(what)))
        .transpose()
}

fn put_nullable_str(out: &mut Vec<u8>, s: Option<&str>) {
    put_nullable_bytes(out, s.map(str::as_bytes));
}

fn finish(r: &Reader<'_>) -> Result<(), RecordError> {
    match r.remaining() {
        0 => Ok(()),
        n => Err(RecordError::TrailingBytes(n)),
    }
}

fn decode_key(bytes: &[u8]) -> Result<RecordKey, RecordError> {
    let mut r = Reader::new(bytes);
    let key = match r.u16("key version")? {
        OFFSET_KEY_VERSION => RecordKey::Offset {
            group: string(&mut r, "group id")?,
            topic: string(&mut r, "topic")?,
            partition: r.i32("partition")?,
        },
        GROUP_KEY_VERSION => RecordKey::Group(string(&mut r, "group id")?),
        other => return Err(RecordError::UnknownKeyVersion(other)),
    };
    finish(&r)?;
    Ok(key)
}

fn value_version(r: &mut Reader<'_>) -> Result<(), RecordError> {
    match r.u16("value version")? {
        VALUE_VERSION => Ok(()),
        other => Err(RecordError::UnknownValueVersion(other)),
    }
}

fn encode_offset(o: &OffsetAndMetadata) -> Vec<u8> {
    let mut out = Vec::with_capacity(32);
    out.extend_from_slice(&VALUE_VERSION.to_be_bytes());
    out.extend_from_slice(&o.offset.to_be_bytes());
    out.extend_from_slice(&o.leader_epoch.to_be_bytes());
    put_nullable_str(&mut out, o.metadata.as_deref());
    out.extend_from_slice(&o.commit_timestamp.to_be_bytes());
    out
}

fn decode_offset(bytes: &[u8]) -> Result<OffsetAndMetadata, RecordError> {
    let mut r = Reader::new(bytes);
    value_version(&mut r)?;
    let o = OffsetAndMetadata {
        offset: r.i64("offset")?,
        leader_epoch: r.i32("leader epoch")?,
        metadata: nullable_string(&mut r, "metadata")?,
        commit_timestamp: r.i64("commit timestamp")?,
    };
    finish(&r)?;
    Ok(o)
}

fn encode_group(g: &StoredGroup) -> Vec<u8> {
    let mut out = Vec::with_capacity(64);
    out.extend_from_slice(&VALUE_VERSION.to_be_bytes());
    put_nullable_str(&mut out, g.protocol_type.as_deref());
    out.extend_from_slice(&g.generation.to_be_bytes());
    put_nullable_str(&mut out, g.protocol.as_deref());
    put_nullable_str(&mut out, g.leader.as_deref());
    out.extend_from_slice(&g.state_timestamp.to_be_bytes());
    out.extend_from_slice(&(g.members.len() as u32).to_be_bytes());
    for m in &g.members {
        put_bytes_u32(&mut out, m.member_id.as_bytes());
        put_nullable_str(&mut out, m.instance_id.as_deref());
        put_bytes_u32(&mut out, m.client_id.as_bytes());
        put_bytes_u32(&mut out, m.client_host.as_bytes());
        out.extend_from_slice(&m.rebalance_timeout_ms.to_be_bytes());
        out.extend_from_slice(&m.session_timeout_ms.to_be_bytes());
        put_bytes_u32(&mut out, &m.subscription);
        put_bytes_u32(&mut out, &m.assignment);
    }
    out
}

/// Smallest encoded member: four empty strings, a null, two i32, two empty byte strings.
const MIN_MEMBER_BYTES: usize = 4 * 4 + 4 + 8 + 2 * 4;

fn decode_group(bytes: &[u8]) -> Result<StoredGroup, RecordError> {
    let mut r = Reader::new(bytes);
    value_version(&mut r)?;
    let protocol_type = nullable_string(&mut r, "protocol type")?;
    let generation = r.i32("generation")?;
    let protocol = nullable_string(&mut r, "protocol")?;
    let leader = nullable_string(&mut r, "leader")?;
    let state_timestamp = r.i64("state timestamp")?;
    let count = r.len_u32("member count", MIN_MEMBER_BYTES)?;
    let mut members = Vec::with_capacity(count);
    for _ in 0..count {
        members.push(StoredMember {
            member_id: string(&mut r, "member id")?,
            instance_id: nullable_string(&mut r, "group instance id")?,
            client_id: string(&mut r, "client id")?,
            client_host: string(&mut r, "client host")?,
            rebalance_timeout_ms: r.i32("rebalance timeout")?,
            session_timeout_ms: r.i32("session timeout")?,
            subscription: r.bytes_u32("subscription")?.to_vec(),
            assignment: r.bytes_u32("assignment")?.to_vec(),
        });
    }
    finish(&r)?;
    Ok(StoredGroup {
        protocol_type,
        generation,
        protocol,
        leader,
        state_timestamp,
        members,
    })
}

/// What a `__consumer_offsets` partition holds, as the log says.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LoadedGroup {
    /// Latest group metadata (`None`: only offsets, or deleted).
    pub metadata: Option<StoredGroup>,
    pub offsets: BTreeMap<(String, i32), LoggedOffset>,
    /// Transactional offsets whose marker is not in the log yet, per producer id.
    pub pending_txn: BTreeMap<i64, BTreeMap<(String, i32), LoggedOffset>>,
}

/// A record that cannot be replayed, and where it is.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("__consumer_offsets entry {index}: {error}")]
pub struct ReplayError {
    pub index: usize,
    pub error: RecordError,
}

/// Rebuilds every group of a partition from its entries in log order.
pub fn replay(
    entries: impl IntoIterator<Item = LogEntry>,
) -> Result<BTreeMap<String, LoadedGroup>, ReplayError> {
    let mut groups: BTreeMap<String, LoadedGroup> = BTreeMap::new();
    // The groups each producer has pending offsets in, for its marker.
    let mut pending_groups: BTreeMap<i64, BTreeSet<String>> = BTreeMap::new();
    for (index, entry) in entries.into_iter().enumerate() {
        match entry {
            LogEntry::Record {
                offset,
                producer_id,
                key,
                value,
            } => {
                let (key, value) = decode_group_record(&key, value.as_deref())
                    .map_err(|error| ReplayError { index, error })?;
                let name = key.group().to_string();
                let group = groups.entry(name.clone()).or_default();
                match (key, value) {
                    (
                        RecordKey::Offset {
                            topic, partition, ..
                        },
                        GroupRecordValue::Offset(v),
                    ) => match (producer_id, v) {
                        (Some(pid), Some(value)) => {
                            group.pending_txn.entry(pid).or_default().insert(
                                (topic, partition),
                                LoggedOffset {
                                    value,
                                    log_offset: offset,
                                },
                            );
                            pending_groups.entry(pid).or_default().insert(name);
                        }
                        (_, Some(value)) => {
                            group.offsets.insert(
                                (topic, partition),
                                LoggedOffset {
                                    value,
                                    log_offset: offset,
                                },
                            );
                        }
                        (_, None) => {
                            group.offsets.remove(&(topic, partition));
                        }
                    },
                    (RecordKey::Group(_), GroupRecordValue::Group(Some(g))) => {
                        group.metadata = Some(g)
                    }
                    (RecordKey::Group(_), GroupRecordValue::Group(None)) => {
                        // A deleted group: its offsets went with it (their
                        // tombstones precede this one); pending transactional
                        // offsets still wait for their marker.
                        group.metadata = None;
                        group.offsets.clear();
                    }
                    // decode() pairs key and value kinds.
                    _ => {}
                }
            }
            LogEntry::Marker {
                producer_id,
                commit,
            } => {
                for name in pending_groups.remove(&producer_id).unwrap_or_default() {
                    if let Some(group) = groups.get_mut(&name) {
                        if let Some(pending) = group.pending_txn.remove(&producer_id) {
                            if commit {
                                commit_offsets(&mut group.offsets, pending);
                            }
                        }
                    }
                }
            }
        }
    }
    groups
        .retain(|_, g| g.metadata.is_some() || !g.offsets.is_empty() || !g.pending_txn.is_empty());
    Ok(groups)
}
