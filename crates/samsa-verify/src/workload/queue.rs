//! The queue workload (as in Jepsen's Kafka test): idempotent producers
//! write to one topic; a group of consumers (read_committed, auto-commit
//! off) polls it and commits its positions after processing. Every poll,
//! commit (issued, acknowledged, failed) and assignment or revocation is
//! recorded (the rebalance callbacks of [`GroupContext`]).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use rdkafka::client::ClientContext;
use rdkafka::config::RDKafkaLogLevel;
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer, ConsumerContext, Rebalance};
use rdkafka::error::KafkaError;
use rdkafka::message::Message;
use samsa_tools::client::{forward_error, forward_log};

use super::{
    group_consumer_settings, offsets_list, partitions_of, positions, produce_round_robin, Env,
    MAX_POLL,
};
use crate::history::{EventKind, PartitionOffset, Recorder, Workload};

pub const PRODUCERS: usize = 1;
pub const CONSUMERS: usize = 3;
/// How often a consumer commits what it has polled.
const COMMIT_EVERY: Duration = Duration::from_millis(200);

const W: Workload = Workload::Queue;

/// Numbers offset commits within the run (the history pairs issue and outcome by it).
static NEXT_COMMIT: AtomicU64 = AtomicU64::new(1);

pub fn run_producer(env: &Env, topic: &str, index: usize) -> Result<()> {
    let name = format!("queue-p{index}");
    produce_round_robin(env, W, &name, topic, env.rate / PRODUCERS as f64)
}

/// Consumer context of a group member: assignments and revocations
/// recorded (from inside `poll`, on the member's thread).
pub struct GroupContext {
    pub recorder: Arc<Recorder>,
    pub workload: Workload,
    pub consumer: String,
    pub group: String,
}

impl ClientContext for GroupContext {
    fn log(&self, level: RDKafkaLogLevel, fac: &str, message: &str) {
        forward_log(level, fac, message);
    }

    fn error(&self, error: KafkaError, reason: &str) {
        forward_error(&error, reason);
    }
}

impl ConsumerContext for GroupContext {
    fn pre_rebalance(&self, consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        if let Rebalance::Revoke(tpl) = rebalance {
            self.recorder.record(EventKind::Revoked {
                workload: self.workload,
                consumer: self.consumer.clone(),
                group: self.group.clone(),
                partitions: partitions_of(tpl),
                lost: consumer.assignment_lost(),
            });
        }
    }

    fn post_rebalance(&self, _: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        if let Rebalance::Assign(tpl) = rebalance {
            self.recorder.record(EventKind::Assigned {
                workload: self.workload,
                consumer: self.consumer.clone(),
                group: self.group.clone(),
                partitions: partitions_of(tpl),
            });
        }
    }
}

pub fn run_consumer(env: &Env, topic: &str, group: &str, index: usize) -> Result<()> {
    let name = format!("queue-c{index}");
    let consumer: BaseConsumer<GroupContext> = env
        .config(&group_consumer_settings(&name, group))?
        .create_with_context(GroupContext {
            recorder: Arc::clone(&env.recorder),
            workload: W,
            consumer: name.clone(),
            group: group.to_string(),
        })
        .context("cannot create a queue consumer")?;
    consumer
        .subscribe(&[topic])
        .with_context(|| format!("cannot subscribe to {topic}"))?;
    let mut committed: Vec<PartitionOffset> = Vec::new();
    let mut last_commit = Instant::now();
    while env.running() {
        match consumer.poll(MAX_POLL) {
            Some(Ok(msg)) => env.recorder.record(EventKind::Poll {
                workload: W,
                consumer: name.clone(),
                topic: msg.topic().to_string(),
                partition: msg.partition(),
                offset: msg.offset(),
                value: String::from_utf8_lossy(msg.payload().unwrap_or_default()).into_owned(),
            }),
            Some(Err(e)) => tracing::debug!(consumer = %name, "consumer: {e}"),
            None => {}
        }
        if last_commit.elapsed() >= COMMIT_EVERY {
            commit(env, &consumer, &name, group, &mut committed);
            last_commit = Instant::now();
        }
    }
    commit(env, &consumer, &name, group, &mut committed);
    consumer.unsubscribe();
    Ok(())
}

/// Commits the positions that moved since the last commit, synchronously.
fn commit(
    env: &Env,
    consumer: &BaseConsumer<GroupContext>,
    name: &str,
    group: &str,
    committed: &mut Vec<PartitionOffset>,
) {
    let Ok(now) = positions(consumer) else {
        return;
    };
    let moved: Vec<PartitionOffset> = now.into_iter().filter(|p| !committed.contains(p)).collect();
    if moved.is_empty() {
        return;
    }
    let Ok(tpl) = offsets_list(&moved) else {
        return;
    };
    let id = NEXT_COMMIT.fetch_add(1, Ordering::Relaxed);
    env.recorder.record(EventKind::OffsetCommitIssued {
        workload: W,
        consumer: name.to_string(),
        group: group.to_string(),
        commit: id,
        offsets: moved.clone(),
    });
    match consumer.commit(&tpl, CommitMode::Sync) {
        Ok(()) => {
            env.recorder.record(EventKind::OffsetCommitted {
                workload: W,
                consumer: name.to_string(),
                group: group.to_string(),
                commit: id,
            });
            committed.retain(|c| {
                !moved
                    .iter()
                    .any(|m| m.topic == c.topic && m.partition == c.partition)
            });
            committed.extend(moved);
        }
        Err(e) => {
            env.recorder.record(EventKind::OffsetCommitFailed {
                workload: W,
                consumer: name.to_string(),
                group: group.to_string(),
                commit: id,
                error: e.to_string(),
            });
            tracing::debug!(consumer = %name, "commit failed: {e}");
        }
    }
}
