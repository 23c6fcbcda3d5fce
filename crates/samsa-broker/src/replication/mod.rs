//! Partition replication between brokers (cluster mode), KIP-101/KIP-279 style.
//!
//! - followers pull from each partition's leader over gRPC
//!   (`proto/replication.proto`, served on the node's controller port next
//!   to the controller services): one fetch loop per leader broker, batched
//!   over every partition this broker follows there ([`fetcher`]), in a
//!   fetch session: after a full fetch, a round names only the partitions
//!   whose state changed and the leader answers only those with news
//!   ([`session`]);
//! - a follower sends its log end offset and the epoch of its last batch;
//!   the leader answers records and its high watermark, or — when the
//!   follower's log diverged — the epoch and end offset to truncate to,
//!   from its leader-epoch cache ([`epoch_cache`], checkpointed in every
//!   partition directory) ([`service`]);
//! - the leader tracks each follower's log end offset and last caught-up
//!   time, advances the high watermark to the minimum LEO over the ISR, and
//!   changes the ISR through the controller's `AlterPartitions` (compare-and-
//!   set on the partition epoch): a follower that has not caught up for
//!   `replica_lag_time_max_ms` leaves, one that reaches the HW rejoins ([`isr`]);
//! - a reassignment's adding replicas catch up under the
//!   `*.replication.throttled.rate` limits ([`throttle`]);
//! - `acks=all` produces wait until the HW covers their batch
//!   ([`Partition::wait_replicated`](crate::replica::Partition::wait_replicated)).
//!
//! Single-node mode uses the same code path without any of the tasks: a
//! partition whose ISR is just its leader advances the HW to the LEO on
//! every append.
//!
//! Invariants:
//! - the HW never decreases and never passes the LEO of any member of the
//!   maximal ISR (committed ISR ∪ a pending expansion); a shrink counts only
//!   once the controller committed it, so an acknowledged record is on every
//!   replica that can be elected leader;
//! - a leader never truncates its own log; only followers truncate, and
//!   only the suffix the leader reports as divergent (or beyond its log end);
//! - one leader per epoch: the leader refuses fetches naming another leader
//!   epoch (FENCED_LEADER_EPOCH / UNKNOWN_LEADER_EPOCH), and batches carry the
//!   epoch of the leader that appended them;
//! - the leader-epoch checkpoint is written before a batch starting a new
//!   epoch is appended, so it is never behind the log after a crash.
//! - producer (idempotence) state on followers is rebuilt from replicated
//!   batches by the log (`append_as_follower`), so a new leader deduplicates
//!   a batch retried after failover.

pub mod epoch_cache;
pub mod fetcher;
pub mod isr;
pub mod service;
pub mod session;
pub mod state;
pub mod throttle;

pub use epoch_cache::LeaderEpochCache;
pub use fetcher::{REPLICATION_MAX_FRAME_BYTES, REPLICATION_WINDOW_BYTES};
pub use state::{InSyncReplicas, LeaderAppend, ReplicaState};
