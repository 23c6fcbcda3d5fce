//! Arrival order of a connection's produce appends, and how much a
//! connection pipelines.
//!
//! Kafka applies the requests of one connection in the order they arrived,
//! and producers rely on it: an idempotent or transactional producer with
//! several requests in flight numbers its batches per partition, and a
//! batch that reaches the log before an earlier one of the same producer is
//! OUT_OF_ORDER_SEQUENCE_NUMBER (fatal for a transactional producer). The
//! listener runs a connection's requests concurrently (`server`), so a
//! produce request must take a turn: as each Produce frame arrives, the
//! listener hands it an [`AppendTurn`] chained to the previous Produce
//! frame's ([`ConnectionAppendOrder::next_turn`], called in arrival order).
//! The handler waits for its turn before it looks at any partition
//! (leadership, KIP-890 verification, the append itself), and passes the
//! turn on as soon as its batches are in the log: the acks=all waits for the
//! group-commit fsync and the ISR stay concurrent, so a connection's
//! pipelined requests share fsyncs and replication round trips.
//!
//! Invariant: on one connection, every append of a produce request happens
//! after every append of each earlier produce request, whatever the order
//! of partitions inside the requests and however long an earlier request
//! waits for its coordinator.
//!
//! Cost: the appends of a connection's produce requests are serial (they
//! were already: the handlers of one connection run on one task, and an
//! append does not yield). What is new is that a request whose first write
//! of a transaction must be verified with the coordinator holds back the
//! connection's later produce requests for that round trip — once per
//! transaction and partition, and Kafka, which handles a connection's
//! requests one at a time, holds them back for the whole request.
//!
//! The module also counts pipelining, for `/metrics`
//! ([`PipeliningStats`]): batches that arrived while an earlier request of
//! the same connection for the same partition was unanswered, and the most
//! requests of one connection in flight for one partition at once.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::oneshot;

/// A produce request's place in its connection's append order.
///
/// Dropping it (or [`Self::release`]) lets the next produce request of the
/// connection append; a request that fails early passes its turn on too.
#[derive(Default)]
pub struct AppendTurn {
    /// Resolves (or is dropped) when the previous request's appends are done.
    after: Option<oneshot::Receiver<()>>,
    /// Held until this request's appends are done.
    done: Option<oneshot::Sender<()>>,
    /// The connection's in-flight produce requests per partition; `None`
    /// for a turn made outside a connection (it counts nothing).
    in_flight: Option<Arc<InFlight>>,
}

impl AppendTurn {
    /// Waits until every earlier produce request of the connection has
    /// appended (or failed).
    pub async fn wait(&mut self) {
        if let Some(after) = &mut self.after {
            // An error only means the earlier request is gone: its turn is
            // over either way.
            let _ = after.await;
            self.after = None;
        }
    }

    /// This request's appends are done; the next request may append (once
    /// the earlier ones have, if this turn never waited).
    pub fn release(&mut self) {
        if self.after.is_none() {
            self.done.take();
        }
    }

    /// Counts the request's partitions as in flight on the connection until
    /// the returned guard is dropped (when the request is answered).
    pub fn track<'a>(
        &self,
        stats: &PipeliningStats,
        partitions: impl Iterator<Item = (&'a str, i32)>,
    ) -> InFlightGuard {
        let Some(in_flight) = &self.in_flight else {
            return InFlightGuard::default();
        };
        let mut counts = in_flight
            .per_partition
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        let mut keys = Vec::new();
        for (topic, partition) in partitions {
            let key = (topic.to_string(), partition);
            let count = counts.entry(key.clone()).or_insert(0);
            if *count > 0 {
                stats.pipelined_batches.fetch_add(1, Ordering::Relaxed);
            }
            *count += 1;
            stats
                .partition_in_flight_max
                .fetch_max(*count, Ordering::Relaxed);
            keys.push(key);
        }
        InFlightGuard {
            in_flight: Some(Arc::clone(in_flight)),
            keys,
        }
    }
}

impl Drop for AppendTurn {
    fn drop(&mut self) {
        // A turn dropped before its predecessor finished (its request was
        // cancelled or failed to decode) still holds the next request back
        // until the predecessor is done: the chain must not skip a link.
        if let (Some(after), Some(done)) = (self.after.take(), self.done.take()) {
            if let Ok(runtime) = tokio::runtime::Handle::try_current() {
                runtime.spawn(async move {
                    let _ = after.await;
                    drop(done);
                });
            }
        }
    }
}

/// One connection's produce order; lives in the connection's loop.
#[derive(Default)]
pub struct ConnectionAppendOrder {
    /// Resolves when the last produce request handed out has appended.
    last: Option<oneshot::Receiver<()>>,
    in_flight: Arc<InFlight>,
}

impl ConnectionAppendOrder {
    /// The turn of the produce request that arrived now. Call it for each
    /// Produce frame in arrival order.
    pub fn next_turn(&mut self) -> AppendTurn {
        let (done, next) = oneshot::channel();
        AppendTurn {
            after: self.last.replace(next),
            done: Some(done),
            in_flight: Some(Arc::clone(&self.in_flight)),
        }
    }
}

#[derive(Default)]
struct InFlight {
    per_partition: Mutex<HashMap<(String, i32), u64>>,
}

/// The partitions of one request counted as in flight on its connection.
#[derive(Default)]
pub struct InFlightGuard {
    in_flight: Option<Arc<InFlight>>,
    keys: Vec<(String, i32)>,
}

impl Drop for InFlightGuard {
    fn drop(&mut self) {
        let Some(in_flight) = &self.in_flight else {
            return;
        };
        let mut counts = in_flight
            .per_partition
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        for key in self.keys.drain(..) {
            if let Some(count) = counts.get_mut(&key) {
                *count -= 1;
                if *count == 0 {
                    counts.remove(&key);
                }
            }
        }
    }
}

/// Broker-wide pipelining counters (`/metrics`).
#[derive(Default)]
pub struct PipeliningStats {
    /// Produce batches that arrived while an earlier produce request of the
    /// same connection for the same partition was still unanswered.
    pub pipelined_batches: AtomicU64,
    /// The most produce requests of one connection in flight for one
    /// partition at once, since the broker started.
    pub partition_in_flight_max: AtomicU64,
}

#[cfg(test)]
mod tests {
    #![allow(clippy::expect_used)]
    use super::*;
    use futures::FutureExt;

    #[tokio::test]
    async fn a_turn_waits_for_every_earlier_turn_of_its_connection() {
        let mut order = ConnectionAppendOrder::default();
        let mut first = order.next_turn();
        let mut second = order.next_turn();
        let mut third = order.next_turn();
        assert!(
            first.wait().now_or_never().is_some(),
            "the first turn has no predecessor"
        );
        assert!(
            second.wait().now_or_never().is_none(),
            "the second turn came before the first ended"
        );
        // The second is dropped without finishing (its request failed): the
        // third still waits for the first.
        drop(second);
        assert!(
            third.wait().now_or_never().is_none(),
            "the third turn came before the first ended"
        );
        first.release();
        tokio::time::timeout(std::time::Duration::from_secs(10), third.wait())
            .await
            .expect("the third turn comes once the first and second are over");
    }

    #[test]
    fn pipelined_batches_count_overlap_per_partition() {
        let stats = PipeliningStats::default();
        let mut order = ConnectionAppendOrder::default();
        let first = order.next_turn();
        let second = order.next_turn();
        let a = first.track(&stats, [("t", 0), ("t", 1)].into_iter());
        let b = second.track(&stats, [("t", 1), ("t", 2)].into_iter());
        assert_eq!(stats.pipelined_batches.load(Ordering::Relaxed), 1);
        assert_eq!(stats.partition_in_flight_max.load(Ordering::Relaxed), 2);
        drop(a);
        drop(b);
        let third = order.next_turn();
        let _c = third.track(&stats, [("t", 1)].into_iter());
        assert_eq!(stats.pipelined_batches.load(Ordering::Relaxed), 1);
        // A turn made outside a connection counts nothing.
        let _d = AppendTurn::default().track(&stats, [("t", 1)].into_iter());
        assert_eq!(stats.pipelined_batches.load(Ordering::Relaxed), 1);
    }
}
