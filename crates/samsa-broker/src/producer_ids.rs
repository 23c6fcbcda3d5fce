//! Producer id allocation.
//!
//! IDs come in blocks of [`PRODUCER_ID_BLOCK_SIZE`] from a
//! [`ProducerIdBlockSource`]; the broker hands them out one by one from the
//! current block. Invariant: an id is never handed out twice, across restarts
//! and crashes — the source makes a block durable *before* returning it, so a
//! crash can only skip ids, never repeat them. In cluster mode the block
//! source is the controller quorum (`cluster::ControllerProducerIdBlockSource`),
//! whose blocks are committed to the metadata log before they are handed out.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use futures::future::BoxFuture;
use serde::{Deserialize, Serialize};

use crate::fsutil::write_atomic;

pub use samsa_controller::logic::ProducerIdBlock;

/// Size of a single node's blocks (a cluster's come from the controller,
/// sized by `producer_id_block_size`).
pub const PRODUCER_ID_BLOCK_SIZE: i32 = 1000;

#[derive(Debug, thiserror::Error)]
pub enum ProducerIdError {
    #[error("producer id store {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("producer id store {path} is corrupt: {reason}")]
    Corrupt { path: PathBuf, reason: String },
    #[error("producer id space exhausted")]
    Exhausted,
    /// The controller quorum could not hand out a block now; retriable.
    #[error("no producer id block available: {0}")]
    Unavailable(String),
}

/// Hands out blocks of producer ids that no one else will ever get.
pub trait ProducerIdBlockSource: Send + Sync {
    fn allocate_block(&self) -> BoxFuture<'_, Result<ProducerIdBlock, ProducerIdError>>;
}

#[derive(Serialize, Deserialize)]
struct NextBlock {
    next_block_start: i64,
}

/// Single-node source: persists the start of the next block in a file.
pub struct LocalProducerIdBlockSource {
    path: PathBuf,
    next_block_start: Mutex<i64>,
}

impl LocalProducerIdBlockSource {
    pub fn open(path: PathBuf) -> Result<Self, ProducerIdError> {
        let next = match std::fs::read(&path) {
            Ok(bytes) => {
                let state: NextBlock =
                    serde_json::from_slice(&bytes).map_err(|e| ProducerIdError::Corrupt {
                        path: path.clone(),
                        reason: e.to_string(),
                    })?;
                if state.next_block_start < 0 {
                    return Err(ProducerIdError::Corrupt {
                        path,
                        reason: format!("negative next block start {}", state.next_block_start),
                    });
                }
                state.next_block_start
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => 0,
            Err(source) => return Err(ProducerIdError::Io { path, source }),
        };
        Ok(LocalProducerIdBlockSource {
            path,
            next_block_start: Mutex::new(next),
        })
    }

    fn allocate(&self) -> Result<ProducerIdBlock, ProducerIdError> {
        let mut next = self
            .next_block_start
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        let first = *next;
        let after = first
            .checked_add(i64::from(PRODUCER_ID_BLOCK_SIZE))
            .ok_or(ProducerIdError::Exhausted)?;
        // Durable before handed out: a crash after this write skips the block.
        let bytes = serde_json::to_vec(&NextBlock {
            next_block_start: after,
        })
        .map_err(|e| ProducerIdError::Corrupt {
            path: self.path.clone(),
            reason: e.to_string(),
        })?;
        write_atomic(&self.path, &bytes).map_err(|source| ProducerIdError::Io {
            path: self.path.clone(),
            source,
        })?;
        *next = after;
        Ok(ProducerIdBlock {
            first,
            size: PRODUCER_ID_BLOCK_SIZE,
        })
    }
}

impl ProducerIdBlockSource for LocalProducerIdBlockSource {
    fn allocate_block(&self) -> BoxFuture<'_, Result<ProducerIdBlock, ProducerIdError>> {
        let result = self.allocate();
        Box::pin(async move { result })
    }
}

/// Hands out single producer ids from the current block, fetching the next
/// block from the source when it runs out.
pub struct ProducerIdManager {
    source: Box<dyn ProducerIdBlockSource>,
    current: tokio::sync::Mutex<Option<(i64, i64)>>, // (next id, end exclusive)
    /// Blocks obtained and ids handed out since start (`/metrics`).
    blocks: AtomicU64,
    ids: AtomicU64,
}

/// What [`ProducerIdManager::figures`] reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProducerIdFigures {
    /// Blocks obtained from the source since start.
    pub blocks: u64,
    /// Producer ids handed out since start.
    pub ids: u64,
}

impl ProducerIdManager {
    pub fn new(source: Box<dyn ProducerIdBlockSource>) -> Self {
        ProducerIdManager {
            source,
            current: tokio::sync::Mutex::new(None),
            blocks: AtomicU64::new(0),
            ids: AtomicU64::new(0),
        }
    }

    pub fn figures(&self) -> ProducerIdFigures {
        ProducerIdFigures {
            blocks: self.blocks.load(Ordering::Relaxed),
            ids: self.ids.load(Ordering::Relaxed),
        }
    }

    async fn allocate_block(&self) -> Result<ProducerIdBlock, ProducerIdError> {
        let block = self.source.allocate_block().await?;
        self.blocks.fetch_add(1, Ordering::Relaxed);
        Ok(block)
    }

    /// An id from the block already held, without waiting: `None` when the
    /// block is used up or another caller is fetching one. For callers that
    /// cannot await (the transaction coordinator runs under a lock); they
    /// call [`Self::ensure_block`] first.
    pub fn try_next_producer_id(&self) -> Option<i64> {
        let mut current = self.current.try_lock().ok()?;
        match *current {
            Some((next, end)) if next < end => {
                *current = Some((next + 1, end));
                self.ids.fetch_add(1, Ordering::Relaxed);
                Some(next)
            }
            _ => None,
        }
    }

    /// Makes sure a block with ids left is held, fetching one if not.
    pub async fn ensure_block(&self) -> Result<(), ProducerIdError> {
        let mut current = self.current.lock().await;
        if matches!(*current, Some((next, end)) if next < end) {
            return Ok(());
        }
        let block = self.allocate_block().await?;
        *current = Some((block.first, block.end()));
        Ok(())
    }

    pub async fn next_producer_id(&self) -> Result<i64, ProducerIdError> {
        let mut current = self.current.lock().await;
        match *current {
            Some((next, end)) if next < end => {
                *current = Some((next + 1, end));
                self.ids.fetch_add(1, Ordering::Relaxed);
                Ok(next)
            }
            _ => {
                let block = self.allocate_block().await?;
                *current = Some((block.first + 1, block.end()));
                self.ids.fetch_add(1, Ordering::Relaxed);
                Ok(block.first)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use std::collections::HashSet;

    #[tokio::test]
    async fn ids_are_unique_across_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("producer_ids.json");
        let mut seen = HashSet::new();
        for _ in 0..3 {
            let manager = ProducerIdManager::new(Box::new(
                LocalProducerIdBlockSource::open(path.clone()).unwrap(),
            ));
            for _ in 0..1500 {
                assert!(seen.insert(manager.next_producer_id().await.unwrap()));
            }
        }
        assert_eq!(seen.len(), 4500);
    }

    #[test]
    fn corrupt_store_is_reported() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("producer_ids.json");
        std::fs::write(&path, b"garbage").unwrap();
        assert!(matches!(
            LocalProducerIdBlockSource::open(path),
            Err(ProducerIdError::Corrupt { .. })
        ));
    }
}
