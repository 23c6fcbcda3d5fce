//! DescribeLogDirs: the partition logs this broker holds, per log directory.
//!
//! samsa has one log directory, its data directory (partition directories
//! sit directly in it; `meta/` and the controller's `raft/` are not
//! partitions and never listed). Kafka's rules kept here:
//! - `topics` null asks for every log held here (leaders and followers,
//!   internal topics included); otherwise only the named partitions, and a
//!   partition not held here is simply absent, as is a topic left without
//!   partitions;
//! - a partition's size is the bytes of its segment files;
//! - its offset lag is Kafka's `max(HW − LEO, 0)` of this replica's log:
//!   0 on a leader, and 0 on a follower too, whose high watermark is capped
//!   at its own log end (Kafka's and samsa's alike); only a future log
//!   (AlterReplicaLogDirs, which samsa does not have) can lag;
//! - `total_bytes` / `usable_bytes` (v4) are those of the file system;
//! - a directory that cannot be read answers KAFKA_STORAGE_ERROR for that
//!   directory, with a log line.

use std::collections::{BTreeMap, HashSet};
use std::path::Path;

use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::describe_log_dirs_response::{
    DescribeLogDirsPartition, DescribeLogDirsResult, DescribeLogDirsTopic,
};
use kafka_protocol::messages::{DescribeLogDirsRequest, DescribeLogDirsResponse};

use super::{str_bytes, topic_name};
use crate::fsutil::disk_space;
use crate::Broker;

pub fn handle(broker: &Broker, request: DescribeLogDirsRequest) -> DescribeLogDirsResponse {
    let wanted: Option<HashSet<(String, i32)>> = request.topics.map(|topics| {
        topics
            .iter()
            .flat_map(|t| {
                let name = t.topic.0.as_str();
                t.partitions.iter().map(move |p| (name.to_owned(), *p))
            })
            .collect()
    });
    let dir = std::path::absolute(&broker.config.data_dir)
        .unwrap_or_else(|_| broker.config.data_dir.clone());
    let result = describe_dir(broker, &dir, wanted.as_ref());
    DescribeLogDirsResponse::default().with_results(vec![result])
}

fn describe_dir(
    broker: &Broker,
    dir: &Path,
    wanted: Option<&HashSet<(String, i32)>>,
) -> DescribeLogDirsResult {
    let result =
        DescribeLogDirsResult::default().with_log_dir(str_bytes(dir.display().to_string()));
    let space = match std::fs::metadata(dir) {
        Ok(m) if m.is_dir() => disk_space(dir),
        Ok(_) => Err(std::io::Error::other("not a directory")),
        Err(e) => Err(e),
    };
    let (total, usable) = match space {
        Ok(space) => space,
        Err(e) => {
            tracing::warn!(log_dir = %dir.display(), error = %e, "cannot describe the log directory");
            return result.with_error_code(ResponseError::KafkaStorageError.code());
        }
    };
    let mut topics: BTreeMap<String, Vec<DescribeLogDirsPartition>> = BTreeMap::new();
    for partition in broker.replicas.all() {
        if wanted.is_some_and(|w| !w.contains(&(partition.topic.clone(), partition.index))) {
            continue;
        }
        let Ok((size, high_watermark, log_end_offset)) = partition
            .with_log(|log| Ok((log.size_bytes(), log.high_watermark(), log.log_end_offset())))
        else {
            // Closed meanwhile (topic deleted): no longer held here.
            continue;
        };
        topics.entry(partition.topic.clone()).or_default().push(
            DescribeLogDirsPartition::default()
                .with_partition_index(partition.index)
                .with_partition_size(i64::try_from(size).unwrap_or(i64::MAX))
                .with_offset_lag((high_watermark - log_end_offset).max(0))
                .with_is_future_key(false),
        );
    }
    let topics = topics
        .into_iter()
        .map(|(name, mut partitions)| {
            partitions.sort_by_key(|p| p.partition_index);
            DescribeLogDirsTopic::default()
                .with_name(topic_name(name))
                .with_partitions(partitions)
        })
        .collect();
    result
        .with_topics(topics)
        .with_total_bytes(i64::try_from(total).unwrap_or(i64::MAX))
        .with_usable_bytes(i64::try_from(usable).unwrap_or(i64::MAX))
}
