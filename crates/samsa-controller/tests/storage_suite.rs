//! openraft's storage conformance suite against the sled-backed store, plus
//! checks the suite does not make: durability ordering and restart.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::{Arc, Mutex};

use openraft::storage::{RaftLogStorage, RaftLogStorageExt, RaftStateMachine};
use openraft::testing::{StoreBuilder, Suite};
use openraft::{CommittedLeaderId, Entry, EntryPayload, LogId, RaftLogReader, StorageError, Vote};
use samsa_controller::records::{MetadataBatch, MetadataRecord};
use samsa_controller::store::{open_sled, LogStore, RaftStore, StateMachineStore, StoreError};
use samsa_controller::{NodeId, TypeConfig};
use tempfile::TempDir;

struct SledBuilder;

impl StoreBuilder<TypeConfig, LogStore, StateMachineStore, TempDir> for SledBuilder {
    async fn build(&self) -> Result<(TempDir, LogStore, StateMachineStore), StorageError<NodeId>> {
        let dir = TempDir::new().expect("temp dir");
        let (_, log, sm) = open_sled(dir.path()).expect("open sled store");
        Ok((dir, log, sm))
    }
}

#[test]
fn sled_store_passes_the_openraft_storage_suite() {
    if let Err(e) = Suite::test_all(SledBuilder) {
        panic!("openraft storage suite failed: {e}");
    }
}

fn entry(term: u64, index: u64, records: Vec<MetadataRecord>) -> Entry<TypeConfig> {
    Entry {
        log_id: LogId::new(CommittedLeaderId::new(term, 1), index),
        payload: EntryPayload::Normal(MetadataBatch { records }),
    }
}

/// A store that logs the order of writes and flushes.
struct Recording {
    inner: Arc<dyn RaftStore>,
    events: Mutex<Vec<&'static str>>,
}

impl RaftStore for Recording {
    fn append(&self, entries: &[(u64, Vec<u8>)]) -> Result<(), StoreError> {
        self.events.lock().unwrap().push("append");
        self.inner.append(entries)
    }
    fn read(&self, start: u64, end: Option<u64>) -> Result<Vec<(u64, Vec<u8>)>, StoreError> {
        self.inner.read(start, end)
    }
    fn last(&self) -> Result<Option<(u64, Vec<u8>)>, StoreError> {
        self.inner.last()
    }
    fn remove(&self, from: u64, to: Option<u64>) -> Result<(), StoreError> {
        self.events.lock().unwrap().push("remove");
        self.inner.remove(from, to)
    }
    fn get_meta(&self, key: &str) -> Result<Option<Vec<u8>>, StoreError> {
        self.inner.get_meta(key)
    }
    fn put_meta(&self, values: &[(&str, &[u8])]) -> Result<(), StoreError> {
        self.events.lock().unwrap().push("put_meta");
        self.inner.put_meta(values)
    }
    fn flush(&self) -> Result<(), StoreError> {
        self.inner.flush()?;
        self.events.lock().unwrap().push("flush");
        Ok(())
    }
}

#[tokio::test]
async fn append_and_vote_are_flushed_before_they_are_acknowledged() {
    let dir = TempDir::new().unwrap();
    let (inner, _, _) = open_sled(dir.path()).unwrap();
    let recording = Arc::new(Recording {
        inner,
        events: Mutex::new(Vec::new()),
    });
    let mut log = LogStore::new(recording.clone());

    // `blocking_append` returns when openraft's `LogFlushed` callback fires.
    log.blocking_append([entry(1, 1, vec![])]).await.unwrap();
    assert_eq!(*recording.events.lock().unwrap(), ["append", "flush"]);

    recording.events.lock().unwrap().clear();
    log.save_vote(&Vote::new(2, 1)).await.unwrap();
    assert_eq!(*recording.events.lock().unwrap(), ["put_meta", "flush"]);

    recording.events.lock().unwrap().clear();
    log.purge(LogId::new(CommittedLeaderId::new(1, 1), 1))
        .await
        .unwrap();
    assert_eq!(
        *recording.events.lock().unwrap(),
        ["put_meta", "flush", "remove"],
        "purge marker is durable before entries go"
    );
}

#[tokio::test]
async fn log_vote_and_state_survive_a_reopen() {
    let dir = TempDir::new().unwrap();
    let record = MetadataRecord::ClusterIdAssigned {
        cluster_id: "c1".into(),
    };
    {
        let (_, mut log, mut sm) = open_sled(dir.path()).unwrap();
        log.blocking_append([entry(1, 1, vec![record.clone()]), entry(1, 2, vec![])])
            .await
            .unwrap();
        log.save_vote(&Vote::new_committed(1, 1)).await.unwrap();
        sm.apply([entry(1, 1, vec![record.clone()])]).await.unwrap();
        assert_eq!(sm.image().cluster_id(), Some("c1"));
        // Snapshot, so the image survives without replay.
        use openraft::RaftSnapshotBuilder;
        let mut builder = sm.get_snapshot_builder().await;
        builder.build_snapshot().await.unwrap();
    }
    let (store, mut log, mut sm) = open_sled(dir.path()).unwrap();
    let entries = log.try_get_log_entries(1..3).await.unwrap();
    assert_eq!(entries.len(), 2);
    assert_eq!(
        log.read_vote().await.unwrap(),
        Some(Vote::new_committed(1, 1))
    );
    let (applied, _) = sm.applied_state().await.unwrap();
    assert_eq!(applied.map(|l| l.index), Some(1));
    assert_eq!(sm.image().cluster_id(), Some("c1"));
    assert_eq!(
        store
            .get_meta(samsa_controller::store::keys::CLUSTER_ID)
            .unwrap()
            .as_deref(),
        Some(&b"c1"[..])
    );
}

#[tokio::test]
async fn a_corrupt_entry_is_reported_not_returned() {
    let dir = TempDir::new().unwrap();
    let (store, mut log, _) = open_sled(dir.path()).unwrap();
    // An entry for index 5 written under key 6.
    let bytes = serde_json::to_vec(&entry(1, 5, vec![])).unwrap();
    store.append(&[(6, bytes)]).unwrap();
    assert!(log.try_get_log_entries(6..7).await.is_err());
    assert!(log.try_get_log_entries(0..).await.is_err());
    store.append(&[(7, b"not json".to_vec())]).unwrap();
    assert!(log.try_get_log_entries(7..8).await.is_err());
}

/// sled 0.34 reads an unfinished snapshot file of its own (`.generating`,
/// left by a write a full disk cut short) at open and fails as corrupt; the
/// store removes such files first, and keeps its log.
#[tokio::test]
async fn an_unfinished_sled_snapshot_does_not_stop_a_reopen() {
    let dir = TempDir::new().unwrap();
    {
        let (_, mut log, _) = open_sled(dir.path()).unwrap();
        log.blocking_append([entry(1, 1, vec![]), entry(1, 2, vec![])])
            .await
            .unwrap();
    }
    let empty = dir.path().join("snap.7FFFFFFFFFFFFFFF.generating");
    let partial = dir.path().join("snap.7FFFFFFFFFFFFFFE.generating");
    std::fs::write(&empty, b"").unwrap();
    std::fs::write(&partial, [0x5a_u8; 100]).unwrap();
    let (_, mut log, _) = open_sled(dir.path()).unwrap();
    assert_eq!(log.try_get_log_entries(1..3).await.unwrap().len(), 2);
    assert!(!empty.exists() && !partial.exists());
}
