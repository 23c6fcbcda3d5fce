//! The log cleaner of a broker: one task that compacts, one pass at a time,
//! the dirtiest compacted partition this broker holds a replica of (every
//! replica cleans its own log; followers too).
//!
//! A pass holds a partition's log lock only to plan it and to swap its
//! result in (`samsa_storage::log_cleaning`); reading and rewriting
//! segments runs on a blocking thread beside the produce path, paced by
//! `log_cleaner_io_max_bytes_per_second`. The offset map
//! (`log_cleaner_dedupe_buffer_size`) is allocated at the first pass and
//! reused. The cleaner's settings are dynamic: read from the broker's
//! effective configuration for every pass. A partition whose pass fails is skipped for a backoff period
//! and logged once per failure; the others go on.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use samsa_storage::cleaner::offset_map::{OffsetMap, DEFAULT_LOAD_FACTOR};
use samsa_storage::cleaner::pass::{self, CleanStats, Throttle};
use tokio::sync::watch;
use tracing::{debug, info, warn};

use crate::replica::Partition;
use crate::{now_ms, Broker};

/// What one pass did, for the log line and the metrics.
#[derive(Debug)]
struct PassOutcome {
    partition: String,
    stats: CleanStats,
    dirty_ratio: f64,
    installed: bool,
    took: Duration,
}

/// State the cleaner keeps between passes.
struct Cleaner {
    /// The offset map and the memory it was made with.
    map: Option<(usize, OffsetMap)>,
    /// Partitions whose last pass failed, and when they may be tried again.
    failed_until: HashMap<String, Instant>,
}

/// Runs until `stop`: a pass whenever a log is dirty enough, else a sleep of
/// `log_cleaner_backoff_ms`.
pub(crate) async fn run(broker: Arc<Broker>, mut stop: watch::Receiver<bool>) {
    if !broker.config.log_cleaner_enable {
        return;
    }
    let mut cleaner = Some(Cleaner {
        map: None,
        failed_until: HashMap::new(),
    });
    loop {
        // Dynamic (`log.cleaner.backoff.ms`): read for every pass.
        let backoff =
            Duration::from_millis(broker.effective_config().log_cleaner_backoff_ms.max(1));
        let Some(mut state) = cleaner.take() else {
            return;
        };
        let b = Arc::clone(&broker);
        let joined = tokio::task::spawn_blocking(move || {
            let outcome = clean_dirtiest(&b, &mut state, backoff);
            (state, outcome)
        })
        .await;
        let cleaned_one = match joined {
            Ok((state, outcome)) => {
                cleaner = Some(state);
                outcome.is_some()
            }
            Err(e) => {
                warn!(error = %e, "log cleaner pass panicked; the cleaner stops");
                return;
            }
        };
        if cleaned_one {
            // Another log may be waiting: look again at once.
            if *stop.borrow() {
                return;
            }
            continue;
        }
        tokio::select! {
            _ = tokio::time::sleep(backoff) => {}
            _ = stop.changed() => return,
        }
    }
}

/// One pass over the dirtiest log, if any log needs one.
fn clean_dirtiest(broker: &Broker, state: &mut Cleaner, backoff: Duration) -> Option<PassOutcome> {
    let now = now_ms();
    let started = Instant::now();
    state.failed_until.retain(|_, until| *until > started);
    let (partition, _) = broker
        .replicas
        .all()
        .into_iter()
        .filter(|p| !state.failed_until.contains_key(&p.name()))
        .filter_map(|p| {
            let priority = p
                .with_log(|log| Ok(log.cleaning_priority(now)))
                .ok()
                .flatten()?;
            Some((p, priority))
        })
        .max_by(|a, b| a.1.total_cmp(&b.1))?;
    match clean_partition(broker, &partition, state, now, started) {
        Ok(outcome) => {
            if outcome.installed {
                info!(partition = %outcome.partition,
                    dirty_ratio = format!("{:.2}", outcome.dirty_ratio),
                    bytes_read = outcome.stats.bytes_read,
                    bytes_written = outcome.stats.bytes_written,
                    records_removed = outcome.stats.records_removed,
                    batches_removed = outcome.stats.batches_removed,
                    keys = outcome.stats.keys_in_map,
                    took_ms = outcome.took.as_millis() as u64,
                    "log cleaner compacted partition");
            } else {
                debug!(partition = %outcome.partition, "log changed during the cleaner's pass; discarded, retried later");
            }
            Some(outcome)
        }
        Err(PassError::Partition(crate::error::PartitionError::Closed(name))) => {
            debug!(partition = %name, "partition closed during the cleaner's pass; its files are deleted when it opens");
            None
        }
        Err(e) => {
            warn!(partition = %partition.name(), error = %e, retry_in_ms = backoff.as_millis() as u64,
                "log cleaner pass failed; the partition is skipped until then");
            state
                .failed_until
                .insert(partition.name(), started + backoff);
            None
        }
    }
}

#[derive(Debug, thiserror::Error)]
enum PassError {
    #[error(transparent)]
    Partition(#[from] crate::error::PartitionError),
    #[error(transparent)]
    Clean(#[from] pass::CleanError),
}

fn clean_partition(
    broker: &Broker,
    partition: &Partition,
    state: &mut Cleaner,
    now: i64,
    started: Instant,
) -> Result<PassOutcome, PassError> {
    let Some(plan) = partition.with_log(|log| Ok(log.cleaning_plan(now)))? else {
        return Ok(PassOutcome {
            partition: partition.name(),
            stats: CleanStats::default(),
            dirty_ratio: 0.0,
            installed: false,
            took: started.elapsed(),
        });
    };
    let config = broker.effective_config();
    let memory = usize::try_from(config.log_cleaner_dedupe_buffer_size).unwrap_or(usize::MAX);
    // A changed `log.cleaner.dedupe.buffer.size` takes effect at the next pass.
    if state
        .map
        .as_ref()
        .is_some_and(|(made_with, _)| *made_with != memory)
    {
        state.map = None;
    }
    let (_, map) = state
        .map
        .get_or_insert_with(|| (memory, OffsetMap::with_memory(memory, DEFAULT_LOAD_FACTOR)));
    let mut throttle = Throttle::new(config.log_cleaner_io_max_bytes_per_second);
    let cleaned = pass::clean(&plan, map, &mut throttle)?;
    let stats = cleaned.stats;
    let dirty_ratio = plan.dirty_ratio;
    // The plan holds the old segment files open; the swap needs none of them.
    drop(plan);
    let installed = partition.with_log(|log| log.install_cleaned(cleaned, now_ms()))?;
    Ok(PassOutcome {
        partition: partition.name(),
        stats,
        dirty_ratio,
        installed,
        took: started.elapsed(),
    })
}
