//! Persistence of the controller's Raft log, vote and snapshots, and the
//! openraft storage (`RaftLogStorage`, `RaftStateMachine`) built on it.
//!
//! Two layers:
//!
//! - [`RaftStore`]: a small byte-level trait (log entries by index, a few
//!   metadata keys, `flush`). [`SledStore`] implements it over `sled` 0.34.
//!   sled has open upstream reports of corruption after abrupt stops, so it
//!   sits behind this trait: switching to another embedded store means one
//!   new implementation of six methods.
//! - [`LogStore`] and [`StateMachineStore`]: openraft's storage-v2 traits on
//!   top of any `RaftStore`, with openraft types encoded as JSON.
//!
//! Invariants kept here:
//!
//! - **durability before acknowledgement**: `append` writes the entries and
//!   then waits for [`RaftStore::flush`] (an fsync in sled) before it calls
//!   openraft's `LogFlushed` callback; votes, truncations, purges and
//!   snapshots are flushed before their call returns. openraft therefore
//!   never counts an entry or a vote that a crash could lose.
//! - **checks around the disk**: entries are written under the key of their
//!   own log index, and every read checks that the decoded entry's index is
//!   the key it was stored under; a mismatch is reported as a storage error,
//!   not returned.
//! - **an unfinished sled snapshot never blocks an open**: sled 0.34 would
//!   read a `.generating` snapshot file a full disk cut short as corrupt at
//!   every open; [`SledStore::open`] removes such files first.
//! - **purge order**: the last purged log id is persisted (and flushed)
//!   before the entries are removed, so the log state is never "no entries and
//!   no purge marker".
//! - **state machine**: the [`MetadataImage`] lives in memory. It is rebuilt
//!   at start from the last snapshot, after which openraft re-applies the
//!   committed log (the committed log id is saved for that). Snapshots are the
//!   JSON of the image plus openraft's snapshot meta.
//!
//! The state machine also feeds the metadata subscription (see
//! [`MetadataFeed`]): every applied batch is published, in order, under the
//! same lock that publishes the image, so a subscriber never misses or
//! duplicates a batch between catch-up and live updates.

use std::collections::VecDeque;
use std::fmt::Debug;
use std::io::Cursor;
use std::ops::{Bound, RangeBounds};
use std::path::Path;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use openraft::storage::{LogFlushed, LogState, RaftLogStorage, RaftStateMachine, Snapshot};
use openraft::{
    BasicNode, Entry, EntryPayload, LogId, OptionalSend, RaftLogReader, RaftSnapshotBuilder,
    SnapshotMeta, StorageError, StorageIOError, StoredMembership, Vote,
};
use serde::{Deserialize, Serialize};
use tokio::sync::{broadcast, watch};

use crate::image::MetadataImage;
use crate::records::MetadataRecord;
use crate::{NodeId, TypeConfig};

type StorageResult<T> = Result<T, StorageError<NodeId>>;

/// Errors of the byte-level store.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("sled: {0}")]
    Sled(#[from] sled::Error),
    #[error("corrupt store: {0}")]
    Corrupt(String),
    #[error("store task failed: {0}")]
    Task(String),
    #[error("{path}: {source}")]
    Io {
        path: std::path::PathBuf,
        source: std::io::Error,
    },
}

/// Keys of the metadata values a [`RaftStore`] keeps besides the log.
pub mod keys {
    pub const VOTE: &str = "vote";
    pub const COMMITTED: &str = "committed";
    pub const LAST_PURGED: &str = "last_purged";
    pub const SNAPSHOT_META: &str = "snapshot_meta";
    pub const SNAPSHOT_DATA: &str = "snapshot_data";
    pub const CLUSTER_ID: &str = "cluster_id";
    pub const NODE_ID: &str = "node_id";
    /// Written once this node may take part in the quorum: it found the
    /// cluster new when it started on an empty store (`node.rs`).
    pub const JOINED: &str = "joined";
}

/// Byte-level persistence of the Raft log and a few metadata keys.
///
/// Writes become durable only when [`RaftStore::flush`] returns; callers
/// that must not lose a write flush before acknowledging it.
pub trait RaftStore: Send + Sync + 'static {
    /// Writes `(index, bytes)` log entries atomically (all or none).
    fn append(&self, entries: &[(u64, Vec<u8>)]) -> Result<(), StoreError>;
    /// Entries with `start <= index < end` (`end = None`: to the last), ascending.
    fn read(&self, start: u64, end: Option<u64>) -> Result<Vec<(u64, Vec<u8>)>, StoreError>;
    /// The entry with the highest index.
    fn last(&self) -> Result<Option<(u64, Vec<u8>)>, StoreError>;
    /// Removes entries with `index >= from` (`to_inclusive = None`) or
    /// `index <= to_inclusive` (`from = 0`).
    fn remove(&self, from: u64, to_inclusive: Option<u64>) -> Result<(), StoreError>;
    fn get_meta(&self, key: &str) -> Result<Option<Vec<u8>>, StoreError>;
    /// Writes several metadata keys atomically.
    fn put_meta(&self, values: &[(&str, &[u8])]) -> Result<(), StoreError>;
    /// Blocks until every write so far is durable.
    fn flush(&self) -> Result<(), StoreError>;
}

/// [`RaftStore`] over sled 0.34: one tree for the log (big-endian index
/// keys, so key order is index order), one for metadata.
#[derive(Clone)]
pub struct SledStore {
    db: sled::Db,
    log: sled::Tree,
    meta: sled::Tree,
}

impl SledStore {
    pub fn open(path: &Path) -> Result<Self, StoreError> {
        remove_unfinished_snapshots(path)?;
        // sled's background flusher keeps a just-dropped database (and its
        // file lock) alive for a moment, so a store reopened right after a
        // shutdown in the same process would see the lock as taken. Wait a
        // bounded time for the lock instead of failing.
        const LOCK_WAIT: std::time::Duration = std::time::Duration::from_secs(5);
        let deadline = std::time::Instant::now() + LOCK_WAIT;
        let db = loop {
            match sled::Config::new()
                .path(path)
                .cache_capacity(64 * 1024 * 1024)
                .flush_every_ms(Some(1_000))
                .open()
            {
                Err(sled::Error::Io(e))
                    if e.to_string().contains("could not acquire lock")
                        && std::time::Instant::now() < deadline =>
                {
                    std::thread::sleep(std::time::Duration::from_millis(20));
                }
                other => break other?,
            }
        };
        let log = db.open_tree("raft_log")?;
        let meta = db.open_tree("raft_meta")?;
        Ok(Self { db, log, meta })
    }
}

/// Removes the snapshot files sled 0.34 left unfinished in `path`.
///
/// sled writes its own snapshot (of its page table, not Raft's) to
/// `snap.<lsn>.generating`, syncs it and renames it to `snap.<lsn>`; it
/// writes one while it opens, whenever its log moved past the last one. But
/// at open it reads the highest-named `snap.` file, `.generating` ones
/// included. A write cut short, as on a full disk, leaves an empty or partial
/// `.generating` file that makes every later open fail as corrupt, so the
/// node would never start again once space is freed. Such a file is never
/// the only copy of anything: sled removes the previous snapshot only after
/// the rename, and its log holds everything since that one. Without the
/// file, sled recovers from the previous snapshot, as after a crash just
/// before the write.
fn remove_unfinished_snapshots(path: &Path) -> Result<(), StoreError> {
    let io_error = |source| StoreError::Io {
        path: path.to_path_buf(),
        source,
    };
    let entries = match std::fs::read_dir(path) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(io_error(e)),
    };
    for entry in entries {
        let entry = entry.map_err(io_error)?;
        let name = entry.file_name();
        let name = name.to_string_lossy();
        if !(name.starts_with("snap.") && name.ends_with(".generating")) {
            continue;
        }
        let file = entry.path();
        let len = entry.metadata().map(|m| m.len()).unwrap_or(0);
        std::fs::remove_file(&file).map_err(|source| StoreError::Io {
            path: file.clone(),
            source,
        })?;
        tracing::warn!(
            file = %file.display(),
            bytes = len,
            "removed an unfinished snapshot file of the Raft store (a write cut short, \
             as by a full disk); the store recovers from its previous snapshot and log"
        );
    }
    Ok(())
}

fn decode_index(key: &[u8]) -> Result<u64, StoreError> {
    let bytes: [u8; 8] = key
        .try_into()
        .map_err(|_| StoreError::Corrupt(format!("log key of {} bytes", key.len())))?;
    Ok(u64::from_be_bytes(bytes))
}

impl RaftStore for SledStore {
    fn append(&self, entries: &[(u64, Vec<u8>)]) -> Result<(), StoreError> {
        let mut batch = sled::Batch::default();
        for (index, bytes) in entries {
            batch.insert(&index.to_be_bytes(), bytes.as_slice());
        }
        self.log.apply_batch(batch)?;
        Ok(())
    }

    fn read(&self, start: u64, end: Option<u64>) -> Result<Vec<(u64, Vec<u8>)>, StoreError> {
        let start = start.to_be_bytes();
        let iter = match end {
            Some(end) => self.log.range(start..end.to_be_bytes()),
            None => self.log.range(start..),
        };
        iter.map(|kv| {
            let (k, v) = kv?;
            Ok((decode_index(&k)?, v.to_vec()))
        })
        .collect()
    }

    fn last(&self) -> Result<Option<(u64, Vec<u8>)>, StoreError> {
        match self.log.last()? {
            Some((k, v)) => Ok(Some((decode_index(&k)?, v.to_vec()))),
            None => Ok(None),
        }
    }

    fn remove(&self, from: u64, to_inclusive: Option<u64>) -> Result<(), StoreError> {
        let from = from.to_be_bytes();
        let keys: Vec<sled::IVec> = match to_inclusive {
            Some(to) => self
                .log
                .range(from..=to.to_be_bytes())
                .keys()
                .collect::<Result<_, _>>()?,
            None => self.log.range(from..).keys().collect::<Result<_, _>>()?,
        };
        let mut batch = sled::Batch::default();
        for key in keys {
            batch.remove(key);
        }
        self.log.apply_batch(batch)?;
        Ok(())
    }

    fn get_meta(&self, key: &str) -> Result<Option<Vec<u8>>, StoreError> {
        Ok(self.meta.get(key)?.map(|v| v.to_vec()))
    }

    fn put_meta(&self, values: &[(&str, &[u8])]) -> Result<(), StoreError> {
        let mut batch = sled::Batch::default();
        for (key, value) in values {
            batch.insert(key.as_bytes(), *value);
        }
        self.meta.apply_batch(batch)?;
        Ok(())
    }

    fn flush(&self) -> Result<(), StoreError> {
        self.db.flush()?;
        Ok(())
    }
}

/// Runs a blocking flush off the async runtime.
async fn flush_blocking(store: &Arc<dyn RaftStore>) -> Result<(), StoreError> {
    let store = Arc::clone(store);
    tokio::task::spawn_blocking(move || store.flush())
        .await
        .map_err(|e| StoreError::Task(e.to_string()))?
}

fn get_json<T: for<'de> Deserialize<'de>>(
    store: &dyn RaftStore,
    key: &str,
) -> Result<Option<T>, StoreError> {
    match store.get_meta(key)? {
        None => Ok(None),
        Some(bytes) => serde_json::from_slice(&bytes)
            .map(Some)
            .map_err(|e| StoreError::Corrupt(format!("{key}: {e}"))),
    }
}

fn to_json<T: Serialize>(value: &T) -> Result<Vec<u8>, StoreError> {
    serde_json::to_vec(value).map_err(|e| StoreError::Corrupt(e.to_string()))
}

// ---------------------------------------------------------------------------
// Log storage
// ---------------------------------------------------------------------------

/// openraft log storage over a [`RaftStore`].
#[derive(Clone)]
pub struct LogStore {
    store: Arc<dyn RaftStore>,
}

impl LogStore {
    pub fn new(store: Arc<dyn RaftStore>) -> Self {
        Self { store }
    }

    /// Decodes the entry stored under `index` and checks it is that entry.
    fn decode(index: u64, bytes: &[u8]) -> Result<Entry<TypeConfig>, StoreError> {
        let entry: Entry<TypeConfig> = serde_json::from_slice(bytes)
            .map_err(|e| StoreError::Corrupt(format!("entry at index {index}: {e}")))?;
        if entry.log_id.index != index {
            return Err(StoreError::Corrupt(format!(
                "entry stored at index {index} has log id {}",
                entry.log_id
            )));
        }
        Ok(entry)
    }
}

impl RaftLogReader<TypeConfig> for LogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> StorageResult<Vec<Entry<TypeConfig>>> {
        let start = match range.start_bound() {
            Bound::Included(x) => *x,
            Bound::Excluded(x) => x.saturating_add(1),
            Bound::Unbounded => 0,
        };
        let end = match range.end_bound() {
            Bound::Included(x) => x.checked_add(1),
            Bound::Excluded(x) => Some(*x),
            Bound::Unbounded => None,
        };
        if end.is_some_and(|end| end <= start) {
            return Ok(Vec::new());
        }
        let raw = self
            .store
            .read(start, end)
            .map_err(|e| StorageIOError::read_logs(&e))?;
        let entries: Result<Vec<_>, StoreError> =
            raw.iter().map(|(i, b)| Self::decode(*i, b)).collect();
        Ok(entries.map_err(|e| StorageIOError::read_logs(&e))?)
    }
}

impl RaftLogStorage<TypeConfig> for LogStore {
    type LogReader = Self;

    async fn get_log_state(&mut self) -> StorageResult<LogState<TypeConfig>> {
        let last = self
            .store
            .last()
            .map_err(|e| StorageIOError::read_logs(&e))?;
        let last_log_id = match last {
            Some((index, bytes)) => Some(
                Self::decode(index, &bytes)
                    .map_err(|e| StorageIOError::read_logs(&e))?
                    .log_id,
            ),
            None => None,
        };
        let last_purged_log_id: Option<LogId<NodeId>> =
            get_json(&*self.store, keys::LAST_PURGED).map_err(|e| StorageIOError::read_logs(&e))?;
        Ok(LogState {
            last_purged_log_id,
            last_log_id: last_log_id.or(last_purged_log_id),
        })
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote<NodeId>) -> StorageResult<()> {
        let bytes = to_json(vote).map_err(|e| StorageIOError::write_vote(&e))?;
        self.store
            .put_meta(&[(keys::VOTE, &bytes)])
            .map_err(|e| StorageIOError::write_vote(&e))?;
        flush_blocking(&self.store)
            .await
            .map_err(|e| StorageIOError::write_vote(&e))?;
        Ok(())
    }

    async fn read_vote(&mut self) -> StorageResult<Option<Vote<NodeId>>> {
        Ok(get_json(&*self.store, keys::VOTE).map_err(|e| StorageIOError::read_vote(&e))?)
    }

    async fn save_committed(&mut self, committed: Option<LogId<NodeId>>) -> StorageResult<()> {
        // Not flushed: a stale committed id only means re-applying less at start.
        let bytes = to_json(&committed).map_err(|e| StorageIOError::write(&e))?;
        self.store
            .put_meta(&[(keys::COMMITTED, &bytes)])
            .map_err(|e| StorageIOError::write(&e))?;
        Ok(())
    }

    async fn read_committed(&mut self) -> StorageResult<Option<LogId<NodeId>>> {
        let committed: Option<Option<LogId<NodeId>>> =
            get_json(&*self.store, keys::COMMITTED).map_err(|e| StorageIOError::read(&e))?;
        Ok(committed.flatten())
    }

    async fn append<I>(&mut self, entries: I, callback: LogFlushed<TypeConfig>) -> StorageResult<()>
    where
        I: IntoIterator<Item = Entry<TypeConfig>> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let mut raw = Vec::new();
        for entry in entries {
            let bytes = serde_json::to_vec(&entry)
                .map_err(|e| StorageIOError::write_log_entry(entry.log_id, &e))?;
            raw.push((entry.log_id.index, bytes));
        }
        if raw.windows(2).any(|w| w[1].0 != w[0].0 + 1) {
            let e = StoreError::Corrupt("appended entries are not consecutive".into());
            return Err(StorageIOError::write_logs(&e).into());
        }
        self.store
            .append(&raw)
            .map_err(|e| StorageIOError::write_logs(&e))?;
        // Durable first, then tell openraft.
        match flush_blocking(&self.store).await {
            Ok(()) => callback.log_io_completed(Ok(())),
            Err(e) => {
                tracing::error!(error = %e, "flushing the raft log failed");
                callback.log_io_completed(Err(std::io::Error::other(e.to_string())));
                return Err(StorageIOError::write_logs(&e).into());
            }
        }
        Ok(())
    }

    async fn truncate(&mut self, log_id: LogId<NodeId>) -> StorageResult<()> {
        tracing::debug!(%log_id, "truncating raft log");
        self.store
            .remove(log_id.index, None)
            .map_err(|e| StorageIOError::write_logs(&e))?;
        flush_blocking(&self.store)
            .await
            .map_err(|e| StorageIOError::write_logs(&e))?;
        Ok(())
    }

    async fn purge(&mut self, log_id: LogId<NodeId>) -> StorageResult<()> {
        tracing::debug!(%log_id, "purging raft log");
        let bytes = to_json(&log_id).map_err(|e| StorageIOError::write_logs(&e))?;
        self.store
            .put_meta(&[(keys::LAST_PURGED, &bytes)])
            .map_err(|e| StorageIOError::write_logs(&e))?;
        flush_blocking(&self.store)
            .await
            .map_err(|e| StorageIOError::write_logs(&e))?;
        self.store
            .remove(0, Some(log_id.index))
            .map_err(|e| StorageIOError::write_logs(&e))?;
        Ok(())
    }
}

// ---------------------------------------------------------------------------
// State machine
// ---------------------------------------------------------------------------

/// What applying one Raft entry did (openraft's `C::R`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum ApplyOutcome {
    /// The batch was applied; the image is now at `offset`.
    Applied { offset: u64 },
    /// A guard failed; nothing changed except the offset.
    Rejected { offset: u64, reason: String },
    /// A Raft blank or membership entry.
    NoOp { offset: u64 },
}

/// One committed, applied batch as the metadata feed publishes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommittedBatch {
    pub offset: u64,
    pub records: Vec<MetadataRecord>,
}

/// An update of the metadata feed.
#[derive(Debug, Clone)]
pub enum FeedEvent {
    /// The next applied batch.
    Batch(Arc<CommittedBatch>),
    /// The image was replaced (snapshot installed): start over from it.
    Reset(Arc<MetadataImage>),
}

/// Where a new subscriber starts.
#[derive(Debug)]
pub enum CatchUp {
    /// Batches after the subscriber's offset, in order (possibly none).
    Batches(Vec<Arc<CommittedBatch>>),
    /// The history no longer reaches back to the subscriber's offset.
    Snapshot(Arc<MetadataImage>),
}

/// A subscription to applied metadata: a consistent catch-up, then live events.
pub struct MetadataFeed {
    pub catch_up: CatchUp,
    pub events: broadcast::Receiver<FeedEvent>,
}

/// How many recent batches the state machine keeps for subscribers.
pub const FEED_HISTORY: usize = 4096;

struct SmInner {
    last_applied: Option<LogId<NodeId>>,
    last_membership: StoredMembership<NodeId, BasicNode>,
    image: Arc<MetadataImage>,
    history: VecDeque<Arc<CommittedBatch>>,
    /// Every applied batch with an offset above this is in `history`.
    history_floor: u64,
}

struct SmShared {
    inner: Mutex<SmInner>,
    /// When the last snapshot was written here (ms since the epoch), -1
    /// if none or a snapshot written before samsa recorded the time.
    snapshot_written_at_ms: AtomicI64,
    image_tx: watch::Sender<Arc<MetadataImage>>,
    events: broadcast::Sender<FeedEvent>,
    cluster_id: watch::Sender<Option<String>>,
}

/// openraft state machine: applies metadata batches to the [`MetadataImage`].
#[derive(Clone)]
pub struct StateMachineStore {
    shared: Arc<SmShared>,
    store: Arc<dyn RaftStore>,
}

#[derive(Serialize, Deserialize)]
struct StoredSnapshotMeta {
    meta: SnapshotMeta<NodeId, BasicNode>,
    /// Wall-clock time of the write (ms since the epoch): the snapshot's
    /// age on `/metrics`. Absent in snapshots of older samsa versions.
    #[serde(default)]
    written_at_ms: Option<i64>,
}

impl StateMachineStore {
    /// When the last snapshot was written (ms since the epoch), if known.
    pub fn snapshot_written_at_ms(&self) -> Option<i64> {
        let at = self.shared.snapshot_written_at_ms.load(Ordering::Relaxed);
        (at >= 0).then_some(at)
    }

    /// Opens the state machine, starting from the last snapshot if any.
    pub fn open(store: Arc<dyn RaftStore>) -> Result<Self, StoreError> {
        let mut inner = SmInner {
            last_applied: None,
            last_membership: StoredMembership::default(),
            image: Arc::new(MetadataImage::new()),
            history: VecDeque::new(),
            history_floor: 0,
        };
        let mut snapshot_written_at_ms = -1;
        if let Some((meta, data, written_at_ms)) = read_snapshot(&*store)? {
            snapshot_written_at_ms = written_at_ms.unwrap_or(-1);
            let image: MetadataImage = serde_json::from_slice(&data)
                .map_err(|e| StoreError::Corrupt(format!("snapshot image: {e}")))?;
            inner.last_applied = meta.last_log_id;
            inner.last_membership = meta.last_membership;
            inner.history_floor = image.offset();
            inner.image = Arc::new(image);
        }
        let stored_cluster_id = store
            .get_meta(keys::CLUSTER_ID)?
            .map(|b| String::from_utf8_lossy(&b).into_owned());
        let cluster_id = inner
            .image
            .cluster_id()
            .map(str::to_owned)
            .or(stored_cluster_id);
        let (image_tx, _) = watch::channel(Arc::clone(&inner.image));
        let (events, _) = broadcast::channel(1024);
        let (cluster_id, _) = watch::channel(cluster_id);
        Ok(Self {
            shared: Arc::new(SmShared {
                inner: Mutex::new(inner),
                snapshot_written_at_ms: AtomicI64::new(snapshot_written_at_ms),
                image_tx,
                events,
                cluster_id,
            }),
            store,
        })
    }

    fn lock(&self) -> MutexGuard<'_, SmInner> {
        // A panic while holding the lock cannot leave a half-applied image
        // (the image is replaced whole), so a poisoned lock is still usable.
        self.shared
            .inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The current image.
    pub fn image(&self) -> Arc<MetadataImage> {
        Arc::clone(&self.lock().image)
    }

    /// Follows the current image.
    pub fn watch_image(&self) -> watch::Receiver<Arc<MetadataImage>> {
        self.shared.image_tx.subscribe()
    }

    /// Follows the cluster id (known once the first record is applied).
    pub fn watch_cluster_id(&self) -> watch::Receiver<Option<String>> {
        self.shared.cluster_id.subscribe()
    }

    /// Subscribes to applied batches after `after_offset`.
    pub fn subscribe(&self, after_offset: u64) -> MetadataFeed {
        let inner = self.lock();
        let events = self.shared.events.subscribe();
        let catch_up = if after_offset >= inner.history_floor {
            CatchUp::Batches(
                inner
                    .history
                    .iter()
                    .filter(|b| b.offset > after_offset)
                    .cloned()
                    .collect(),
            )
        } else {
            CatchUp::Snapshot(Arc::clone(&inner.image))
        };
        MetadataFeed { catch_up, events }
    }

    fn remember_cluster_id(&self, image: &MetadataImage) -> Result<(), StoreError> {
        let Some(id) = image.cluster_id() else {
            return Ok(());
        };
        if self.shared.cluster_id.borrow().as_deref() == Some(id) {
            return Ok(());
        }
        self.store.put_meta(&[(keys::CLUSTER_ID, id.as_bytes())])?;
        self.store.flush()?;
        self.shared.cluster_id.send_replace(Some(id.to_owned()));
        Ok(())
    }

    fn replace_image(&self, inner: &mut SmInner, image: MetadataImage) {
        let image = Arc::new(image);
        inner.history.clear();
        inner.history_floor = image.offset();
        inner.image = Arc::clone(&image);
        self.shared.image_tx.send_replace(Arc::clone(&image));
        // No receivers is fine.
        let _ = self.shared.events.send(FeedEvent::Reset(image));
    }
}

/// A snapshot as stored: openraft's meta, the image's JSON, and when it
/// was written (if recorded).
type StoredSnapshot = (SnapshotMeta<NodeId, BasicNode>, Vec<u8>, Option<i64>);

fn read_snapshot(store: &dyn RaftStore) -> Result<Option<StoredSnapshot>, StoreError> {
    let Some(meta) = get_json::<StoredSnapshotMeta>(store, keys::SNAPSHOT_META)? else {
        return Ok(None);
    };
    let data = store
        .get_meta(keys::SNAPSHOT_DATA)?
        .ok_or_else(|| StoreError::Corrupt("snapshot meta without data".into()))?;
    Ok(Some((meta.meta, data, meta.written_at_ms)))
}

async fn write_snapshot(
    shared: &SmShared,
    store: &Arc<dyn RaftStore>,
    meta: &SnapshotMeta<NodeId, BasicNode>,
    data: &[u8],
) -> StorageResult<()> {
    let sig = || Some(meta.signature());
    let written_at_ms = crate::quorum::wall_clock_ms();
    let meta_bytes = to_json(&StoredSnapshotMeta {
        meta: meta.clone(),
        written_at_ms: Some(written_at_ms),
    })
    .map_err(|e| StorageIOError::write_snapshot(sig(), &e))?;
    store
        .put_meta(&[
            (keys::SNAPSHOT_META, &meta_bytes),
            (keys::SNAPSHOT_DATA, data),
        ])
        .map_err(|e| StorageIOError::write_snapshot(sig(), &e))?;
    flush_blocking(store)
        .await
        .map_err(|e| StorageIOError::write_snapshot(sig(), &e))?;
    shared
        .snapshot_written_at_ms
        .store(written_at_ms, Ordering::Relaxed);
    Ok(())
}

impl RaftSnapshotBuilder<TypeConfig> for StateMachineStore {
    async fn build_snapshot(&mut self) -> StorageResult<Snapshot<TypeConfig>> {
        let (image, last_applied, membership) = {
            let inner = self.lock();
            (
                Arc::clone(&inner.image),
                inner.last_applied,
                inner.last_membership.clone(),
            )
        };
        let data =
            serde_json::to_vec(&*image).map_err(|e| StorageIOError::read_state_machine(&e))?;
        let snapshot_id = match last_applied {
            Some(id) => format!("{}-{}-{}", id.leader_id, id.index, uuid::Uuid::new_v4()),
            None => format!("empty-{}", uuid::Uuid::new_v4()),
        };
        let meta = SnapshotMeta {
            last_log_id: last_applied,
            last_membership: membership,
            snapshot_id,
        };
        write_snapshot(&self.shared, &self.store, &meta, &data).await?;
        tracing::info!(
            offset = image.offset(),
            bytes = data.len(),
            "built metadata snapshot"
        );
        Ok(Snapshot {
            meta,
            snapshot: Box::new(Cursor::new(data)),
        })
    }
}

impl RaftStateMachine<TypeConfig> for StateMachineStore {
    type SnapshotBuilder = Self;

    async fn applied_state(
        &mut self,
    ) -> StorageResult<(Option<LogId<NodeId>>, StoredMembership<NodeId, BasicNode>)> {
        let inner = self.lock();
        Ok((inner.last_applied, inner.last_membership.clone()))
    }

    async fn apply<I>(&mut self, entries: I) -> StorageResult<Vec<ApplyOutcome>>
    where
        I: IntoIterator<Item = Entry<TypeConfig>> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let mut inner = self.lock();
        let mut image = (*inner.image).clone();
        let mut outcomes = Vec::new();
        let mut cluster_id_changed = false;
        for entry in entries {
            let offset = entry.log_id.index;
            inner.last_applied = Some(entry.log_id);
            let outcome = match entry.payload {
                EntryPayload::Blank => {
                    image.advance_offset(offset);
                    ApplyOutcome::NoOp { offset }
                }
                EntryPayload::Membership(membership) => {
                    inner.last_membership = StoredMembership::new(Some(entry.log_id), membership);
                    image.advance_offset(offset);
                    ApplyOutcome::NoOp { offset }
                }
                EntryPayload::Normal(batch) => match image.apply_batch(offset, &batch.records) {
                    Ok(()) => {
                        cluster_id_changed |= batch
                            .records
                            .iter()
                            .any(|r| matches!(r, MetadataRecord::ClusterIdAssigned { .. }));
                        let committed = Arc::new(CommittedBatch {
                            offset,
                            records: batch.records,
                        });
                        inner.history.push_back(Arc::clone(&committed));
                        while inner.history.len() > FEED_HISTORY {
                            if let Some(old) = inner.history.pop_front() {
                                inner.history_floor = old.offset;
                            }
                        }
                        let _ = self.shared.events.send(FeedEvent::Batch(committed));
                        ApplyOutcome::Applied { offset }
                    }
                    Err(e) => {
                        tracing::warn!(offset, error = %e, "metadata batch rejected");
                        ApplyOutcome::Rejected {
                            offset,
                            reason: e.to_string(),
                        }
                    }
                },
            };
            outcomes.push(outcome);
        }
        let image = Arc::new(image);
        inner.image = Arc::clone(&image);
        self.shared.image_tx.send_replace(Arc::clone(&image));
        drop(inner);
        if cluster_id_changed {
            self.remember_cluster_id(&image)
                .map_err(|e| StorageIOError::write_state_machine(&e))?;
        }
        Ok(outcomes)
    }

    async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
        self.clone()
    }

    async fn begin_receiving_snapshot(&mut self) -> StorageResult<Box<Cursor<Vec<u8>>>> {
        Ok(Box::new(Cursor::new(Vec::new())))
    }

    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMeta<NodeId, BasicNode>,
        snapshot: Box<Cursor<Vec<u8>>>,
    ) -> StorageResult<()> {
        let data = snapshot.into_inner();
        let image: MetadataImage = serde_json::from_slice(&data)
            .map_err(|e| StorageIOError::read_snapshot(Some(meta.signature()), &e))?;
        write_snapshot(&self.shared, &self.store, meta, &data).await?;
        {
            let mut inner = self.lock();
            inner.last_applied = meta.last_log_id;
            inner.last_membership = meta.last_membership.clone();
            self.replace_image(&mut inner, image);
        }
        let image = self.image();
        self.remember_cluster_id(&image)
            .map_err(|e| StorageIOError::write_state_machine(&e))?;
        tracing::info!(offset = image.offset(), "installed metadata snapshot");
        Ok(())
    }

    async fn get_current_snapshot(&mut self) -> StorageResult<Option<Snapshot<TypeConfig>>> {
        let snapshot =
            read_snapshot(&*self.store).map_err(|e| StorageIOError::read_snapshot(None, &e))?;
        Ok(snapshot.map(|(meta, data, _)| Snapshot {
            meta,
            snapshot: Box::new(Cursor::new(data)),
        }))
    }
}

/// Opens (or creates) the sled store at `path` and builds the openraft log
/// storage and state machine on it.
pub fn open_sled(
    path: &Path,
) -> Result<(Arc<dyn RaftStore>, LogStore, StateMachineStore), StoreError> {
    let store: Arc<dyn RaftStore> = Arc::new(SledStore::open(path)?);
    let log = LogStore::new(Arc::clone(&store));
    let sm = StateMachineStore::open(Arc::clone(&store))?;
    Ok((store, log, sm))
}
