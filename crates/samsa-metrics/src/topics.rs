//! Bytes and records in and out per topic, as Kafka's `BrokerTopicMetrics`
//! count them: **in** is what produce requests appended on this broker
//! (its leader's appends; replication is not counted), **out** what fetch
//! answers carried to consumers (followers' fetches are not counted).
//! Record counts come from the batch headers, so compressed batches count
//! their records, not their bytes.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TopicLabels {
    topic: String,
}

/// The per-topic families, registered once.
#[derive(Debug, Clone, Default)]
pub struct TopicMetrics {
    bytes_in: Family<TopicLabels, Counter>,
    records_in: Family<TopicLabels, Counter>,
    bytes_out: Family<TopicLabels, Counter>,
    records_out: Family<TopicLabels, Counter>,
}

/// One topic's counters, resolved once (each hosted partition holds its
/// topic's), so that counting is an atomic add.
#[derive(Debug, Clone, Default)]
pub struct TopicTraffic {
    bytes_in: Counter,
    records_in: Counter,
    bytes_out: Counter,
    records_out: Counter,
}

impl TopicMetrics {
    pub fn register(registry: &mut Registry) -> TopicMetrics {
        let metrics = TopicMetrics::default();
        registry.register(
            "samsa_topic_bytes_in",
            "Bytes of record batches produce requests appended, by topic (Kafka: BrokerTopicMetrics BytesInPerSec)",
            metrics.bytes_in.clone(),
        );
        registry.register(
            "samsa_topic_records_in",
            "Records produce requests appended, by topic (Kafka: BrokerTopicMetrics MessagesInPerSec)",
            metrics.records_in.clone(),
        );
        registry.register(
            "samsa_topic_bytes_out",
            "Bytes of record batches fetch answers carried to consumers, by topic (Kafka: BrokerTopicMetrics BytesOutPerSec)",
            metrics.bytes_out.clone(),
        );
        registry.register(
            "samsa_topic_records_out",
            "Records fetch answers carried to consumers, by topic (Kafka has no such meter)",
            metrics.records_out.clone(),
        );
        metrics
    }

    /// The counters of `topic`.
    pub fn topic(&self, topic: &str) -> TopicTraffic {
        let labels = TopicLabels {
            topic: topic.to_owned(),
        };
        TopicTraffic {
            bytes_in: self.bytes_in.get_or_create_owned(&labels),
            records_in: self.records_in.get_or_create_owned(&labels),
            bytes_out: self.bytes_out.get_or_create_owned(&labels),
            records_out: self.records_out.get_or_create_owned(&labels),
        }
    }
}

impl TopicTraffic {
    /// A produce request appended `records` records in `bytes` bytes.
    pub fn produced(&self, bytes: u64, records: u64) {
        self.bytes_in.inc_by(bytes);
        self.records_in.inc_by(records);
    }

    /// A fetch answer carried `records` records in `bytes` bytes to a
    /// consumer.
    pub fn fetched(&self, bytes: u64, records: u64) {
        self.bytes_out.inc_by(bytes);
        self.records_out.inc_by(records);
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn partitions_of_one_topic_share_its_counters() {
        let mut registry = Registry::default();
        let metrics = TopicMetrics::register(&mut registry);
        metrics.topic("orders").produced(1000, 10);
        metrics.topic("orders").produced(500, 5);
        metrics.topic("orders").fetched(1500, 15);
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &registry).unwrap();
        assert!(
            out.contains("samsa_topic_bytes_in_total{topic=\"orders\"} 1500"),
            "{out}"
        );
        assert!(
            out.contains("samsa_topic_records_in_total{topic=\"orders\"} 15"),
            "{out}"
        );
        assert!(
            out.contains("samsa_topic_bytes_out_total{topic=\"orders\"} 1500"),
            "{out}"
        );
        assert!(
            out.contains("samsa_topic_records_out_total{topic=\"orders\"} 15"),
            "{out}"
        );
    }
}
