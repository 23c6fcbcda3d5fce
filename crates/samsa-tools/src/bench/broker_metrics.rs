//! The brokers' side of a benchmark scenario: their `/metrics` read before
//! and after it, summed over the brokers, so that a scenario's time can be
//! split into what the brokers spent on each request type, on transaction
//! markers and on fsyncs. Only counters and histogram sums and counts are
//! read; their differences are exact whatever else the brokers did before.

use std::collections::HashMap;
use std::time::Duration;

use anyhow::{bail, Result};

use crate::health::http_get;

/// Every sample of the brokers' expositions, by its name with labels as
/// the page spells them (`samsa_kafka_request_duration_seconds_sum{api="EndTxn"}`),
/// summed over the brokers.
#[derive(Debug)]
pub struct Scrape(HashMap<String, f64>);

impl Scrape {
    /// Reads `/metrics` of every broker in `endpoints` (`host:port` of
    /// their HTTP listeners).
    pub fn take(endpoints: &[String]) -> Result<Scrape> {
        let mut samples = HashMap::new();
        for endpoint in endpoints {
            for (key, value) in parse(&http_get_metrics(endpoint)?) {
                *samples.entry(key).or_insert(0.0) += value;
            }
        }
        Ok(Scrape(samples))
    }

    fn get(&self, key: &str) -> f64 {
        self.0.get(key).copied().unwrap_or(0.0)
    }

    /// How much sample `key` grew since `before`.
    pub fn since(&self, before: &Scrape, key: &str) -> f64 {
        self.get(key) - before.get(key)
    }

    /// Count and mean (seconds) of histogram `name`'s observations with
    /// `labels` (`api="EndTxn"`, or empty) since `before`.
    pub fn observations_since(&self, before: &Scrape, name: &str, labels: &str) -> (f64, f64) {
        let key = |suffix: &str| {
            if labels.is_empty() {
                format!("{name}_{suffix}")
            } else {
                format!("{name}_{suffix}{{{labels}}}")
            }
        };
        let count = self.since(before, &key("count"));
        let sum = self.since(before, &key("sum"));
        (count, if count > 0.0 { sum / count } else { 0.0 })
    }
}

/// `name{labels} value` lines of a Prometheus or OpenMetrics text page.
fn parse(page: &str) -> impl Iterator<Item = (String, f64)> + '_ {
    page.lines()
        .filter(|line| !line.starts_with('#'))
        .filter_map(|line| {
            let (key, value) = line.rsplit_once(' ')?;
            Some((key.to_string(), value.parse().ok()?))
        })
}

/// The longest `/metrics` page read (one line per partition and metric
/// family makes it grow with the partitions a broker hosts).
const MAX_PAGE_BYTES: u64 = 256 * 1024 * 1024;

fn http_get_metrics(endpoint: &str) -> Result<String> {
    let url = format!("http://{endpoint}/metrics");
    let answer = http_get(&url, Duration::from_secs(10), MAX_PAGE_BYTES)?;
    if answer.status != 200 {
        bail!("{url} answered {}", answer.status);
    }
    if answer.chunked {
        bail!("{url}: chunked answers are not read here");
    }
    Ok(answer.body)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_means_and_counters_are_differences_of_two_pages() {
        let page = |count: u32, sum: f64, flushes: u32| {
            format!(
                "# TYPE samsa_kafka_request_duration_seconds histogram\n\
                 samsa_kafka_request_duration_seconds_sum{{api=\"EndTxn\"}} {sum}\n\
                 samsa_kafka_request_duration_seconds_count{{api=\"EndTxn\"}} {count}\n\
                 samsa_log_flush_duration_seconds_count {flushes}\n\
                 # EOF\n"
            )
        };
        let scrape = |text: String| Scrape(parse(&text).collect());
        let before = scrape(page(10, 0.5, 7));
        let after = scrape(page(30, 1.5, 47));
        let (count, mean) = after.observations_since(
            &before,
            "samsa_kafka_request_duration_seconds",
            "api=\"EndTxn\"",
        );
        assert_eq!(count, 20.0);
        assert!((mean - 0.05).abs() < 1e-12);
        assert_eq!(
            after
                .observations_since(&before, "samsa_log_flush_duration_seconds", "")
                .0,
            40.0
        );
        assert_eq!(after.since(&before, "samsa_absent_total"), 0.0);
    }
}
