//! The controller quorum as scraped (Kafka: KafkaController
//! ActiveControllerCount, OfflinePartitionsCount, ActiveBrokerCount,
//! FencedBrokerCount; raft-metrics current-leader, current-epoch,
//! log-end-offset, high-watermark). Like Kafka, the counts over the
//! metadata (offline partitions, brokers) are reported by the active
//! controller only, so that summing over a cluster counts each once.
//!
//! A single node (no quorum) is its own active controller: it reports 1
//! and no Raft figures.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use samsa_controller::node::{ControllerNode, RaftFiguresWatch};
use samsa_controller::MetadataImage;
use samsa_metrics::prometheus_client::encoding::DescriptorEncoder;
use tokio::sync::watch;

use super::{counter, gauge, maybe_gauge};

/// What `/metrics` reads of this node's controller.
#[derive(Debug)]
pub struct ControllerView {
    raft: RaftFiguresWatch,
    image: watch::Receiver<Arc<MetadataImage>>,
    leader_changes: AtomicU64,
}

impl ControllerView {
    /// Follows `controller`; counting its leader changes takes a task that
    /// ends with the controller.
    pub fn follow(controller: &ControllerNode) -> Arc<ControllerView> {
        let view = Arc::new(ControllerView {
            raft: controller.raft_figures(),
            image: controller.watch_image(),
            leader_changes: AtomicU64::new(0),
        });
        let mut raft = view.raft.clone();
        let counting = Arc::downgrade(&view);
        tokio::spawn(async move {
            let mut leader = raft.now().leader;
            while raft.changed().await.is_ok() {
                let Some(view) = counting.upgrade() else {
                    return;
                };
                let now = raft.now().leader;
                if now != leader && now.is_some() {
                    view.leader_changes.fetch_add(1, Ordering::Relaxed);
                }
                leader = now;
            }
        });
        view
    }
}

fn index(i: Option<u64>) -> i64 {
    i.map_or(-1, |i| i64::try_from(i).unwrap_or(i64::MAX))
}

pub(super) fn encode(
    view: Option<&ControllerView>,
    now_ms: i64,
    out: &mut DescriptorEncoder<'_>,
) -> std::fmt::Result {
    let figures = view.map(|v| v.raft.now());
    let active = figures.is_none_or(|f| f.leading);
    gauge(
        out,
        "samsa_controller_active",
        "1 on the active controller (the Raft leader, or a single node), else 0; summed over a cluster it must be 1 (Kafka: KafkaController ActiveControllerCount)",
        i64::from(active),
    )?;
    maybe_gauge(
        out,
        "samsa_raft_leader",
        "Node id of the Raft leader this controller follows, -1 if none (Kafka: raft-metrics current-leader)",
        figures.map(|f| f.leader.map_or(-1, |l| l as i64)),
    )?;
    maybe_gauge(
        out,
        "samsa_raft_term",
        "This controller's Raft term (Kafka: raft-metrics current-epoch)",
        figures.map(|f| f.term as i64),
    )?;
    maybe_gauge(
        out,
        "samsa_raft_last_log_index",
        "Index of the last entry in this controller's Raft log (Kafka: raft-metrics log-end-offset)",
        figures.map(|f| index(f.last_log_index)),
    )?;
    maybe_gauge(
        out,
        "samsa_raft_last_applied",
        "Index of the last Raft entry applied to this node's metadata image (Kafka: raft-metrics high-watermark, as applied)",
        figures.map(|f| index(f.last_applied)),
    )?;
    maybe_gauge(
        out,
        "samsa_raft_apply_lag",
        "Raft entries in this controller's log not yet applied to its metadata image",
        figures.map(|f| (index(f.last_log_index) - index(f.last_applied)).max(0)),
    )?;
    maybe_gauge(
        out,
        "samsa_raft_snapshot_index",
        "Index the last Raft snapshot covers, -1 if none",
        figures.map(|f| index(f.snapshot_index)),
    )?;
    maybe_gauge(
        out,
        "samsa_raft_snapshot_age_seconds",
        "Seconds since this controller last wrote a metadata snapshot (built or received from the leader); absent before its first",
        figures
            .and_then(|f| f.snapshot_written_at_ms)
            .map(|at| (now_ms - at).max(0) as f64 / 1000.0),
    )?;
    counter(
        out,
        "samsa_raft_leader_changes",
        "Times this controller saw a new Raft leader since it started (elections won by anyone)",
        view.map_or(0, |v| v.leader_changes.load(Ordering::Relaxed)),
    )?;
    // The metadata counts: only the active controller reports them.
    let image = view.filter(|_| active).map(|v| v.image.borrow().clone());
    let (offline, brokers, fenced) = match &image {
        Some(image) => {
            let offline = image
                .topics()
                .flat_map(|t| t.partitions.iter())
                .filter(|p| !p.has_leader())
                .count() as i64;
            let registered = image.brokers().count() as i64;
            let fenced = image.brokers().filter(|b| b.fenced).count() as i64;
            (offline, registered - fenced, fenced)
        }
        None => (0, i64::from(view.is_none()), 0),
    };
    gauge(
        out,
        "samsa_offline_partitions",
        "Partitions without a leader, reported by the active controller (Kafka: KafkaController OfflinePartitionsCount)",
        offline,
    )?;
    gauge(
        out,
        "samsa_active_brokers",
        "Registered brokers not fenced, reported by the active controller (Kafka: KafkaController ActiveBrokerCount)",
        brokers,
    )?;
    gauge(
        out,
        "samsa_fenced_brokers",
        "Registered brokers fenced (no heartbeat within the session timeout), reported by the active controller (Kafka: KafkaController FencedBrokerCount)",
        fenced,
    )
}
