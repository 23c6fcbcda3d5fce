//! This broker's Kafka request metrics (`samsa_metrics::requests`): the
//! handles of every served API, resolved when the broker opens, and the
//! error codes an answer carries, counted as Kafka's `ErrorsPerSec` counts
//! them (each error code in the answer, top-level and per partition, NONE
//! left out), for every API.

use std::collections::HashMap;
use std::sync::OnceLock;

use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::*;
use samsa_metrics::requests::{ApiMetrics, RequestMetrics};

/// Each served API's handles, by API key.
#[derive(Debug)]
pub struct RequestMeters {
    by_key: Vec<Option<ApiMetrics>>,
}

impl RequestMeters {
    pub fn new(metrics: &RequestMetrics) -> RequestMeters {
        let mut by_key: Vec<Option<ApiMetrics>> = Vec::new();
        for api in crate::apis::SUPPORTED_APIS {
            let Ok(index) = usize::try_from(api.key as i16) else {
                continue;
            };
            if by_key.len() <= index {
                by_key.resize(index + 1, None);
            }
            by_key[index] = Some(metrics.api(api_name(api.key)));
        }
        RequestMeters { by_key }
    }

    /// The handles of API key `key`, if this broker serves it.
    pub fn get(&self, key: ApiKey) -> Option<&ApiMetrics> {
        usize::try_from(key as i16)
            .ok()
            .and_then(|i| self.by_key.get(i))
            .and_then(Option::as_ref)
    }
}

/// Kafka's name of an API (`Produce`), made once per process.
fn api_name(key: ApiKey) -> &'static str {
    static NAMES: OnceLock<HashMap<i16, &'static str>> = OnceLock::new();
    NAMES
        .get_or_init(|| {
            crate::apis::SUPPORTED_APIS
                .iter()
                .map(|api| {
                    let name: &'static str = Box::leak(format!("{:?}", api.key).into_boxed_str());
                    (api.key as i16, name)
                })
                .collect()
        })
        .get(&(key as i16))
        .copied()
        .unwrap_or("Unknown")
}

/// Kafka's name of an error code (`NOT_LEADER_OR_FOLLOWER`), made once per
/// process for every code the protocol crate knows.
fn error_name(code: i16) -> &'static str {
    static NAMES: OnceLock<HashMap<i16, &'static str>> = OnceLock::new();
    NAMES
        .get_or_init(|| {
            (-1..=256)
                .filter_map(|code| ResponseError::try_from_code(code).map(|e| (code, e)))
                .map(|(code, e)| {
                    let name: &'static str =
                        Box::leak(upper_snake(&format!("{e:?}")).into_boxed_str());
                    (code, name)
                })
                .collect()
        })
        .get(&code)
        .copied()
        .unwrap_or("UNKNOWN_ERROR_CODE")
}

/// `NotLeaderOrFollower` → `NOT_LEADER_OR_FOLLOWER`.
fn upper_snake(camel: &str) -> String {
    let mut out = String::with_capacity(camel.len() + 8);
    for (i, c) in camel.chars().enumerate() {
        if c.is_ascii_uppercase() && i > 0 {
            out.push('_');
        }
        out.push(c.to_ascii_uppercase());
    }
    out
}

/// Counts the error codes of `answer`, an answer of `api`.
pub fn count_errors<T: AnswerErrors>(metrics: &RequestMetrics, api: &ApiMetrics, answer: &T) {
    answer.each_error(&mut |code| {
        if code != 0 {
            metrics.error(api.name(), error_name(code));
        }
    });
}

/// The error codes an answer carries.
pub trait AnswerErrors {
    fn each_error(&self, f: &mut dyn FnMut(i16));
}

/// Answers with one top-level error code.
macro_rules! top_level {
    ($($t:ty),* $(,)?) => {$(
        impl AnswerErrors for $t {
            fn each_error(&self, f: &mut dyn FnMut(i16)) {
                f(self.error_code);
            }
        }
    )*};
}

/// Answers with a list of results, each with its error code (`$list`
/// names the list, `$($nested)` a list inside each result whose items have
/// error codes too).
macro_rules! per_result {
    ($t:ty, $list:ident) => {
        impl AnswerErrors for $t {
            fn each_error(&self, f: &mut dyn FnMut(i16)) {
                for r in &self.$list {
                    f(r.error_code);
                }
            }
        }
    };
}

/// Answers whose per-partition results sit in per-topic lists.
macro_rules! per_partition {
    ($t:ty, $topics:ident, $partitions:ident) => {
        impl AnswerErrors for $t {
            fn each_error(&self, f: &mut dyn FnMut(i16)) {
                for t in &self.$topics {
                    for p in &t.$partitions {
                        f(p.error_code);
                    }
                }
            }
        }
    };
}

top_level!(
    ApiVersionsResponse,
    InitProducerIdResponse,
    AddOffsetsToTxnResponse,
    EndTxnResponse,
    JoinGroupResponse,
    SyncGroupResponse,
    HeartbeatResponse,
    SaslHandshakeResponse,
    SaslAuthenticateResponse,
    DescribeClusterResponse,
    ListTransactionsResponse,
    ListGroupsResponse,
    DescribeAclsResponse,
    ListPartitionReassignmentsResponse,
    UnregisterBrokerResponse,
);

per_result!(CreateTopicsResponse, topics);
per_result!(DeleteTopicsResponse, responses);
per_result!(CreatePartitionsResponse, results);
per_result!(DescribeConfigsResponse, results);
per_result!(AlterConfigsResponse, responses);
per_result!(IncrementalAlterConfigsResponse, responses);
per_result!(DescribeTransactionsResponse, transaction_states);
per_result!(DescribeGroupsResponse, groups);
per_result!(DeleteGroupsResponse, results);
per_result!(AlterUserScramCredentialsResponse, results);
per_result!(CreateAclsResponse, results);
per_result!(DeleteAclsResponse, filter_results);
per_result!(DescribeTopicPartitionsResponse, topics);
per_result!(ConsumerGroupDescribeResponse, groups);
per_partition!(DeleteRecordsResponse, topics, partitions);
per_partition!(DescribeProducersResponse, topics, partitions);
per_partition!(OffsetForLeaderEpochResponse, topics, partitions);

/// Answers with a top-level error, then per-partition ones in per-topic lists.
macro_rules! top_level_and_per_partition {
    ($t:ty, $topics:ident, $partitions:ident) => {
        impl AnswerErrors for $t {
            fn each_error(&self, f: &mut dyn FnMut(i16)) {
                f(self.error_code);
                for t in &self.$topics {
                    for p in &t.$partitions {
                        f(p.error_code);
                    }
                }
            }
        }
    };
}

top_level_and_per_partition!(OffsetDeleteResponse, topics, partitions);
top_level_and_per_partition!(DescribeQuorumResponse, topics, partitions);
top_level_and_per_partition!(
    ElectLeadersResponse,
    replica_election_results,
    partition_result
);
top_level_and_per_partition!(AlterPartitionReassignmentsResponse, responses, partitions);

impl AnswerErrors for DescribeLogDirsResponse {
    fn each_error(&self, f: &mut dyn FnMut(i16)) {
        f(self.error_code);
        for r in &self.results {
            f(r.error_code);
        }
    }
}

impl AnswerErrors for DescribeUserScramCredentialsResponse {
    fn each_error(&self, f: &mut dyn FnMut(i16)) {
        f(self.error_code);
        for r in &self.results {
            f(r.error_code);
        }
    }
}

impl AnswerErrors for ProduceResponse {
    fn each_error(&self, f: &mut dyn FnMut(i16)) {
        for t in &self.responses {
            for p in &t.partition_responses {
                f(p.error_code);
            }
        }
    }
}

impl AnswerErrors for FetchResponse {
    fn each_error(&self, f: &mut dyn FnMut(i16)) {
        f(self.error_code);
        for t in &self.responses {
            for p in &t.partitions {
                f(p.error_code);
            }
        }
    }
}

impl AnswerErrors for MetadataResponse {
    fn each_error(&self, f: &mut dyn FnMut(i16)) {
        f(self.error_code);
        for t in &self.topics {
            f(t.error_code);
            for p in &t.partitions {
                f(p.error_code);
            }
        }
    }
}

impl AnswerErrors for ListOffsetsResponse {
    fn each_error(&self, f: &mut dyn FnMut(i16)) {
        for t in &self.topics {
            for p in &t.partitions {
                f(p.error_code);
            }
        }
    }
}

impl AnswerErrors for FindCoordinatorResponse {
    fn each_error(&self, f: &mut dyn FnMut(i16)) {
        f(self.error_code);
        for c in &self.coordinators {
            f(c.error_code);
        }
    }
}

impl AnswerErrors for AddPartitionsToTxnResponse {
    fn each_error(&self, f: &mut dyn FnMut(i16)) {
        f(self.error_code);
        let topics = self
            .results_by_transaction
            .iter()
            .flat_map(|t| &t.topic_results)
            .chain(&self.results_by_topic_v3_and_below);
        for t in topics {
            for p in &t.results_by_partition {
                f(p.partition_error_code);
            }
        }
    }
}

impl AnswerErrors for WriteTxnMarkersResponse {
    fn each_error(&self, f: &mut dyn FnMut(i16)) {
        for m in &self.markers {
            for t in &m.topics {
                for p in &t.partitions {
                    f(p.error_code);
                }
            }
        }
    }
}

impl AnswerErrors for OffsetCommitResponse {
    fn each_error(&self, f: &mut dyn FnMut(i16)) {
        for t in &self.topics {
            for p in &t.partitions {
                f(p.error_code);
            }
        }
    }
}

impl AnswerErrors for TxnOffsetCommitResponse {
    fn each_error(&self, f: &mut dyn FnMut(i16)) {
        for t in &self.topics {
            for p in &t.partitions {
                f(p.error_code);
            }
        }
    }
}

impl AnswerErrors for OffsetFetchResponse {
    fn each_error(&self, f: &mut dyn FnMut(i16)) {
        f(self.error_code);
        for t in &self.topics {
            for p in &t.partitions {
                f(p.error_code);
            }
        }
        for g in &self.groups {
            f(g.error_code);
            for t in &g.topics {
                for p in &t.partitions {
                    f(p.error_code);
                }
            }
        }
    }
}

impl AnswerErrors for LeaveGroupResponse {
    fn each_error(&self, f: &mut dyn FnMut(i16)) {
        f(self.error_code);
        for m in &self.members {
            f(m.error_code);
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    #[test]
    fn names_are_kafkas() {
        assert_eq!(api_name(ApiKey::Produce), "Produce");
        assert_eq!(api_name(ApiKey::InitProducerId), "InitProducerId");
        assert_eq!(error_name(6), "NOT_LEADER_OR_FOLLOWER");
        assert_eq!(error_name(-1), "UNKNOWN_SERVER_ERROR");
        assert_eq!(error_name(47), "INVALID_PRODUCER_EPOCH");
        assert_eq!(error_name(48), "INVALID_TXN_STATE");
    }

    #[test]
    fn every_served_api_has_its_handles() {
        let metrics = samsa_metrics::Metrics::new();
        let meters = RequestMeters::new(&metrics.requests);
        for api in crate::apis::SUPPORTED_APIS {
            assert!(meters.get(api.key).is_some(), "{:?}", api.key);
        }
    }
}
