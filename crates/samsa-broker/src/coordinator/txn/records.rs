//! The records of `__transaction_state` and rebuilding state from them.
//!
//! One record per transition: the key is the transactional id, the value the
//! whole [`TransactionMetadata`] after the transition, or no value (a
//! tombstone) when the id is forgotten. The latest record of a key is its
//! state, so replaying a partition from its start rebuilds every id it holds.
//!
//! The encoding is samsa's own (samsa need not read Kafka's logs), compact,
//! big-endian and versioned:
//!
//! ```text
//! key   = version: u16 (= 0) | transactional id: UTF-8, the rest of the key
//! value = version: u16 (= 0)
//!       | producer_id: i64 | producer_epoch: i16
//!       | last_producer_id: i64 | last_producer_epoch: i16
//!       | next_producer_id: i64
//!       | timeout_ms: i32
//!       | state: u8          (0 Empty, 1 Ongoing, 2 PrepareCommit, 3 PrepareAbort,
//!                             4 CompleteCommit, 5 CompleteAbort, 6 Dead, 7 PrepareEpochFence)
//!       | transaction_version: u8 (1 or 2)
//!       | txn_start_timestamp: i64 | txn_last_update_timestamp: i64
//!       | topics: u32, then per topic: name length: u32 | name: UTF-8
//!                                     | partitions: u32 | partition: i32 …
//! ```
//!
//! Decoding is total: any byte string gives a value or a [`RecordError`],
//! never a panic, and lengths are checked against the bytes present before
//! anything is allocated.

use std::collections::{BTreeMap, BTreeSet};

use crate::codec::Reader;

use super::state::{
    TransactionMetadata, TransactionVersion, TxnResult, TxnState, NO_PRODUCER_EPOCH, NO_PRODUCER_ID,
};
use crate::coordinator::{RecordError, StateRecord};
use crate::topic_partition::TopicPartition;

/// Version of the key layout written by this samsa.
pub const KEY_VERSION: u16 = 0;
/// Version of the value layout written by this samsa.
pub const VALUE_VERSION: u16 = 0;

/// A record that cannot be replayed, and where it is.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("__transaction_state record {index}: {error}")]
pub struct ReplayError {
    /// Position of the record in the replayed sequence (0-based).
    pub index: usize,
    pub error: RecordError,
}

/// The `__transaction_state` record of `transactional_id` holding
/// `metadata`, or its tombstone.
pub fn txn_record(transactional_id: &str, metadata: Option<&TransactionMetadata>) -> StateRecord {
    StateRecord {
        key: encode_key(transactional_id),
        value: metadata.map(encode_value),
    }
}

/// The transactional id and the state a record holds (`None`: forgotten).
pub fn decode_txn_record(
    record: &StateRecord,
) -> Result<(String, Option<TransactionMetadata>), RecordError> {
    let id = decode_key(&record.key)?;
    let value = record.value.as_deref().map(decode_value).transpose()?;
    Ok((id, value))
}

pub fn encode_key(transactional_id: &str) -> Vec<u8> {
    let mut out = Vec::with_capacity(2 + transactional_id.len());
    out.extend_from_slice(&KEY_VERSION.to_be_bytes());
    out.extend_from_slice(transactional_id.as_bytes());
    out
}

pub fn decode_key(bytes: &[u8]) -> Result<String, RecordError> {
    let mut r = Reader::new(bytes);
    let version = r.u16("key version")?;
    if version != KEY_VERSION {
        return Err(RecordError::UnknownKeyVersion(version));
    }
    let rest = r.take(r.remaining(), "transactional id")?;
    String::from_utf8(rest.to_vec()).map_err(|_| RecordError::InvalidUtf8("transactional id"))
}

fn state_id(state: TxnState) -> u8 {
    match state {
        TxnState::Empty => 0,
        TxnState::Ongoing => 1,
        TxnState::PrepareCommit => 2,
        TxnState::PrepareAbort => 3,
        TxnState::CompleteCommit => 4,
        TxnState::CompleteAbort => 5,
        TxnState::Dead => 6,
        TxnState::PrepareEpochFence => 7,
    }
}

fn state_from_id(id: u8) -> Result<TxnState, RecordError> {
    Ok(match id {
        0 => TxnState::Empty,
        1 => TxnState::Ongoing,
        2 => TxnState::PrepareCommit,
        3 => TxnState::PrepareAbort,
        4 => TxnState::CompleteCommit,
        5 => TxnState::CompleteAbort,
        6 => TxnState::Dead,
        7 => TxnState::PrepareEpochFence,
        other => return Err(RecordError::UnknownState(other)),
    })
}

fn transaction_version_id(version: TransactionVersion) -> u8 {
    match version {
        TransactionVersion::V1 => 1,
        TransactionVersion::V2 => 2,
    }
}

/// Length of a collection as written on disk. Anything that reaches the
/// coordinator came in a Kafka request, whose lengths are `i32`, so this
/// never saturates in practice; if it did, decoding would report a
/// truncated record rather than read garbage.
fn len_u32(len: usize) -> u32 {
    u32::try_from(len).unwrap_or(u32::MAX)
}

pub fn encode_value(m: &TransactionMetadata) -> Vec<u8> {
    let mut out = Vec::with_capacity(64 + m.partitions.len() * 8);
    out.extend_from_slice(&VALUE_VERSION.to_be_bytes());
    out.extend_from_slice(&m.producer_id.to_be_bytes());
    out.extend_from_slice(&m.producer_epoch.to_be_bytes());
    out.extend_from_slice(&m.last_producer_id.to_be_bytes());
    out.extend_from_slice(&m.last_producer_epoch.to_be_bytes());
    out.extend_from_slice(&m.next_producer_id.to_be_bytes());
    out.extend_from_slice(&m.timeout_ms.to_be_bytes());
    out.push(state_id(m.state));
    out.push(transaction_version_id(m.transaction_version));
    out.extend_from_slice(&m.txn_start_timestamp.to_be_bytes());
    out.extend_from_slice(&m.txn_last_update_timestamp.to_be_bytes());
    let mut by_topic: BTreeMap<&str, Vec<i32>> = BTreeMap::new();
    for tp in &m.partitions {
        by_topic.entry(&tp.topic).or_default().push(tp.partition);
    }
    out.extend_from_slice(&len_u32(by_topic.len()).to_be_bytes());
    for (topic, partitions) in by_topic {
        out.extend_from_slice(&len_u32(topic.len()).to_be_bytes());
        out.extend_from_slice(topic.as_bytes());
        out.extend_from_slice(&len_u32(partitions.len()).to_be_bytes());
        for p in partitions {
            out.extend_from_slice(&p.to_be_bytes());
        }
    }
    out
}

pub fn decode_value(bytes: &[u8]) -> Result<TransactionMetadata, RecordError> {
    let mut r = Reader::new(bytes);
    let version = r.u16("value version")?;
    if version != VALUE_VERSION {
        return Err(RecordError::UnknownValueVersion(version));
    }
    let producer_id = r.i64("producer id")?;
    let producer_epoch = r.i16("producer epoch")?;
    let last_producer_id = r.i64("last producer id")?;
    let last_producer_epoch = r.i16("last producer epoch")?;
    let next_producer_id = r.i64("next producer id")?;
    let timeout_ms = r.i32("timeout")?;
    let state = state_from_id(r.u8("state")?)?;
    let transaction_version = match r.u8("transaction version")? {
        1 => TransactionVersion::V1,
        2 => TransactionVersion::V2,
        other => return Err(RecordError::UnknownTransactionVersion(other)),
    };
    let txn_start_timestamp = r.i64("start timestamp")?;
    let txn_last_update_timestamp = r.i64("last update timestamp")?;
    // Each topic takes at least its two lengths and a one-byte name.
    let topics = r.len_u32("topic count", 9)?;
    let mut partitions = BTreeSet::new();
    for _ in 0..topics {
        let name_len = r.len_u32("topic name length", 1)?;
        let name = r.take(name_len, "topic name")?;
        let topic =
            std::str::from_utf8(name).map_err(|_| RecordError::InvalidUtf8("topic name"))?;
        if topic.is_empty() {
            return Err(RecordError::Invalid {
                field: "topic name length",
                value: 0,
            });
        }
        let count = r.len_u32("partition count", 4)?;
        for _ in 0..count {
            let partition = r.i32("partition")?;
            if partition < 0 {
                return Err(RecordError::Invalid {
                    field: "partition",
                    value: partition.into(),
                });
            }
            partitions.insert(TopicPartition::new(topic, partition));
        }
    }
    if r.remaining() > 0 {
        return Err(RecordError::TrailingBytes(r.remaining()));
    }
    let check = |field: &'static str, value: i64, ok: bool| {
        if ok {
            Ok(())
        } else {
            Err(RecordError::Invalid { field, value })
        }
    };
    check("producer id", producer_id, producer_id >= 0)?;
    check("producer epoch", producer_epoch.into(), producer_epoch >= 0)?;
    check(
        "last producer id",
        last_producer_id,
        last_producer_id >= NO_PRODUCER_ID,
    )?;
    check(
        "last producer epoch",
        last_producer_epoch.into(),
        last_producer_epoch >= NO_PRODUCER_EPOCH,
    )?;
    check(
        "next producer id",
        next_producer_id,
        next_producer_id >= NO_PRODUCER_ID,
    )?;
    check("timeout", timeout_ms.into(), timeout_ms > 0)?;
    Ok(TransactionMetadata {
        producer_id,
        producer_epoch,
        last_producer_id,
        last_producer_epoch,
        next_producer_id,
        timeout_ms,
        state,
        partitions,
        txn_start_timestamp,
        txn_last_update_timestamp,
        transaction_version,
    })
}

/// What a transaction found in the log needs before its id can be used again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unfinished {
    /// `Prepare*` is durable: (re)send the markers of this outcome to every
    /// partition, then write `Complete*`.
    SendMarkers(TxnResult),
    /// A fence was recorded but not its abort: fence and abort it.
    FenceAndAbort,
}

/// Every transactional id of one `__transaction_state` partition, as its
/// records leave them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CoordinatorState {
    txns: BTreeMap<String, TransactionMetadata>,
}

impl CoordinatorState {
    pub fn new() -> Self {
        Self::default()
    }

    /// Rebuilds the state from a partition's records, oldest first. The
    /// first record that does not decode stops the replay.
    pub fn replay<K, V>(
        records: impl IntoIterator<Item = (K, Option<V>)>,
    ) -> Result<CoordinatorState, ReplayError>
    where
        K: AsRef<[u8]>,
        V: AsRef<[u8]>,
    {
        let mut state = CoordinatorState::new();
        for (index, (key, value)) in records.into_iter().enumerate() {
            state
                .apply(key.as_ref(), value.as_ref().map(|v| v.as_ref()))
                .map_err(|error| ReplayError { index, error })?;
        }
        Ok(state)
    }

    /// Applies one record: the newest value of a key replaces the older one;
    /// a tombstone (or a value in state `Dead`) forgets the id.
    pub fn apply(&mut self, key: &[u8], value: Option<&[u8]>) -> Result<(), RecordError> {
        let id = decode_key(key)?;
        match value.map(decode_value).transpose()? {
            Some(m) if m.state != TxnState::Dead => {
                self.txns.insert(id, m);
            }
            _ => {
                self.txns.remove(&id);
            }
        }
        Ok(())
    }

    pub fn get(&self, transactional_id: &str) -> Option<&TransactionMetadata> {
        self.txns.get(transactional_id)
    }

    pub fn iter(&self) -> impl Iterator<Item = (&String, &TransactionMetadata)> {
        self.txns.iter()
    }

    pub fn len(&self) -> usize {
        self.txns.len()
    }

    pub fn is_empty(&self) -> bool {
        self.txns.is_empty()
    }

    /// Transactions a new coordinator must finish before their ids are
    /// usable: `Prepare*` ones need their markers (again) and then
    /// `Complete*`; a stored `PrepareEpochFence` needs its abort.
    pub fn unfinished(&self) -> Vec<(String, Unfinished)> {
        self.txns
            .iter()
            .filter_map(|(id, m)| {
                let action = match m.state {
                    TxnState::PrepareCommit => Unfinished::SendMarkers(TxnResult::Commit),
                    TxnState::PrepareAbort => Unfinished::SendMarkers(TxnResult::Abort),
                    TxnState::PrepareEpochFence => Unfinished::FenceAndAbort,
                    _ => return None,
                };
                Some((id.clone(), action))
            })
            .collect()
    }

    pub(crate) fn insert(&mut self, transactional_id: String, metadata: TransactionMetadata) {
        self.txns.insert(transactional_id, metadata);
    }

    pub(crate) fn remove(&mut self, transactional_id: &str) {
        self.txns.remove(transactional_id);
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    fn sample() -> TransactionMetadata {
        TransactionMetadata {
            producer_id: 4_000,
            producer_epoch: 7,
            last_producer_id: 4_000,
            last_producer_epoch: 6,
            next_producer_id: NO_PRODUCER_ID,
            timeout_ms: 60_000,
            state: TxnState::Ongoing,
            partitions: [
                TopicPartition::new("orders", 0),
                TopicPartition::new("orders", 3),
                TopicPartition::new("__consumer_offsets", 17),
                TopicPartition::new("日本", 1),
            ]
            .into_iter()
            .collect(),
            txn_start_timestamp: 1_700_000_000_000,
            txn_last_update_timestamp: 1_700_000_000_500,
            transaction_version: TransactionVersion::V2,
        }
    }

    #[test]
    fn round_trip() {
        let mut m = sample();
        for state in TxnState::ALL {
            m.state = state;
            assert_eq!(decode_value(&encode_value(&m)).unwrap(), m);
        }
        m.partitions.clear();
        m.transaction_version = TransactionVersion::V1;
        m.set_last(None);
        m.next_producer_id = 9;
        m.txn_start_timestamp = -1;
        assert_eq!(decode_value(&encode_value(&m)).unwrap(), m);

        for id in ["", "tx", "Ünïcödé 😀"] {
            assert_eq!(decode_key(&encode_key(id)).unwrap(), id);
            let rec = txn_record(id, Some(&m));
            assert_eq!(
                decode_txn_record(&rec).unwrap(),
                (id.to_string(), Some(m.clone()))
            );
            let tomb = txn_record(id, None);
            assert_eq!(tomb.value, None);
            assert_eq!(decode_txn_record(&tomb).unwrap(), (id.to_string(), None));
        }
    }

    #[test]
    fn layout_is_stable() {
        let m = TransactionMetadata {
            producer_id: 1,
            producer_epoch: 2,
            last_producer_id: -1,
            last_producer_epoch: -1,
            next_producer_id: -1,
            timeout_ms: 3,
            state: TxnState::PrepareCommit,
            partitions: [TopicPartition::new("t", 5)].into_iter().collect(),
            txn_start_timestamp: 4,
            txn_last_update_timestamp: 5,
            transaction_version: TransactionVersion::V2,
        };
        let mut expected = vec![0, 0];
        expected.extend(1i64.to_be_bytes());
        expected.extend(2i16.to_be_bytes());
        expected.extend((-1i64).to_be_bytes());
        expected.extend((-1i16).to_be_bytes());
        expected.extend((-1i64).to_be_bytes());
        expected.extend(3i32.to_be_bytes());
        expected.extend([2, 2]);
        expected.extend(4i64.to_be_bytes());
        expected.extend(5i64.to_be_bytes());
        expected.extend(1u32.to_be_bytes());
        expected.extend(1u32.to_be_bytes());
        expected.extend(b"t");
        expected.extend(1u32.to_be_bytes());
        expected.extend(5i32.to_be_bytes());
        assert_eq!(encode_value(&m), expected);
        assert_eq!(encode_key("ab"), vec![0, 0, b'a', b'b']);
    }

    #[test]
    fn every_truncation_is_an_error() {
        let bytes = encode_value(&sample());
        for n in 0..bytes.len() {
            assert!(decode_value(&bytes[..n]).is_err(), "prefix of {n} bytes");
        }
        assert!(decode_key(&[]).is_err());
        assert!(decode_key(&[0]).is_err());
    }

    #[test]
    fn bad_fields_are_errors() {
        let good = encode_value(&sample());
        let with = |offset: usize, patch: &[u8]| {
            let mut b = good.clone();
            b[offset..offset + patch.len()].copy_from_slice(patch);
            decode_value(&b)
        };
        assert_eq!(with(0, &[0, 1]), Err(RecordError::UnknownValueVersion(1)));
        // Offsets: version 2, pid 8, epoch 2, last pid 8, last epoch 2, next 8, timeout 4.
        assert_eq!(
            with(2, &(-5i64).to_be_bytes()),
            Err(RecordError::Invalid {
                field: "producer id",
                value: -5
            })
        );
        assert_eq!(
            with(10, &(-1i16).to_be_bytes()),
            Err(RecordError::Invalid {
                field: "producer epoch",
                value: -1
            })
        );
        assert_eq!(
            with(20, &(-2i16).to_be_bytes()),
            Err(RecordError::Invalid {
                field: "last producer epoch",
                value: -2
            })
        );
        assert_eq!(
            with(30, &0i32.to_be_bytes()),
            Err(RecordError::Invalid {
                field: "timeout",
                value: 0
            })
        );
        assert_eq!(with(34, &[8]), Err(RecordError::UnknownState(8)));
        assert_eq!(
            with(35, &[3]),
            Err(RecordError::UnknownTransactionVersion(3))
        );
        // A topic count far beyond the bytes present: refused without allocating.
        assert_eq!(
            with(52, &u32::MAX.to_be_bytes()),
            Err(RecordError::Truncated("topic count"))
        );
        // The first topic's name length, then its partition count, likewise.
        assert_eq!(
            with(56, &u32::MAX.to_be_bytes()),
            Err(RecordError::Truncated("topic name length"))
        );
        let mut trailing = good.clone();
        trailing.push(0);
        assert_eq!(decode_value(&trailing), Err(RecordError::TrailingBytes(1)));
        assert_eq!(
            decode_key(&[0, 9, b'x']),
            Err(RecordError::UnknownKeyVersion(9))
        );
        assert_eq!(
            decode_key(&[0, 0, 0xff]),
            Err(RecordError::InvalidUtf8("transactional id"))
        );
    }

    #[test]
    fn mutated_bytes_never_panic() {
        // Deterministic pseudo-random corruption (xorshift), many rounds.
        let good = encode_value(&sample());
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut next = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        for _ in 0..20_000 {
            let mut b = good.clone();
            for _ in 0..(next() % 4 + 1) {
                let i = (next() as usize) % b.len();
                b[i] = next() as u8;
            }
            let cut = (next() as usize) % (b.len() + 1);
            let _ = decode_value(&b[..cut]);
            let _ = decode_value(&b);
            let _ = decode_key(&b);
        }
        let random: Vec<u8> = (0..4096).map(|_| next() as u8).collect();
        for start in 0..64 {
            let _ = decode_value(&random[start..]);
        }
    }

    #[test]
    fn replay_keeps_the_latest_value_and_forgets_tombstones() {
        let mut a = sample();
        let mut records: Vec<(Vec<u8>, Option<Vec<u8>>)> = Vec::new();
        a.state = TxnState::Empty;
        records.push((encode_key("a"), Some(encode_value(&a))));
        a.state = TxnState::Ongoing;
        records.push((encode_key("a"), Some(encode_value(&a))));
        let mut b = sample();
        b.producer_id = 5;
        b.state = TxnState::PrepareCommit;
        records.push((encode_key("b"), Some(encode_value(&b))));
        let mut c = sample();
        c.state = TxnState::CompleteAbort;
        records.push((encode_key("c"), Some(encode_value(&c))));
        records.push((encode_key("c"), None));
        let mut d = sample();
        d.state = TxnState::PrepareEpochFence;
        records.push((encode_key("d"), Some(encode_value(&d))));
        let mut e = sample();
        e.state = TxnState::PrepareAbort;
        records.push((encode_key("e"), Some(encode_value(&e))));
        let mut f = sample();
        f.state = TxnState::Dead;
        records.push((encode_key("f"), Some(encode_value(&sample()))));
        records.push((encode_key("f"), Some(encode_value(&f))));

        let state = CoordinatorState::replay(records.clone()).unwrap();
        assert_eq!(state.len(), 4);
        assert_eq!(state.get("a"), Some(&a));
        assert_eq!(state.get("b"), Some(&b));
        assert_eq!(state.get("c"), None);
        assert_eq!(state.get("f"), None);
        assert_eq!(
            state.unfinished(),
            vec![
                ("b".to_string(), Unfinished::SendMarkers(TxnResult::Commit)),
                ("d".to_string(), Unfinished::FenceAndAbort),
                ("e".to_string(), Unfinished::SendMarkers(TxnResult::Abort)),
            ]
        );

        records.insert(3, (vec![0, 0, b'x'], Some(vec![0, 0, 1])));
        let err = CoordinatorState::replay(records).unwrap_err();
        assert_eq!(err.index, 3);
        assert!(matches!(err.error, RecordError::Truncated(_)));
    }
}
