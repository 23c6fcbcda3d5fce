//! Writing values computed at scrape time: the one place that turns a
//! name, a help text and a value (or rows of label values) into an
//! OpenMetrics family, for every collector (this crate's process figures,
//! the broker's partitions, controller and coordinators).

use prometheus_client::encoding::{
    DescriptorEncoder, EncodeCounterValue, EncodeGaugeValue, EncodeMetric,
};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;

/// Writes one unlabelled gauge.
pub fn gauge<V: EncodeGaugeValue>(
    out: &mut DescriptorEncoder<'_>,
    name: &str,
    help: &str,
    value: V,
) -> std::fmt::Result {
    let sample = out.encode_descriptor(name, help, None, MetricType::Gauge)?;
    ConstGauge::new(value).encode(sample)
}

/// Writes one unlabelled counter (`name` without its `_total`).
pub fn counter<V: EncodeCounterValue>(
    out: &mut DescriptorEncoder<'_>,
    name: &str,
    help: &str,
    value: V,
) -> std::fmt::Result {
    let sample = out.encode_descriptor(name, help, None, MetricType::Counter)?;
    ConstCounter::new(value).encode(sample)
}

/// Writes a gauge's descriptor, and its unlabelled sample if `value` is
/// known (a family declared without samples still names the metric).
pub fn maybe_gauge<V: EncodeGaugeValue>(
    out: &mut DescriptorEncoder<'_>,
    name: &str,
    help: &str,
    value: Option<V>,
) -> std::fmt::Result {
    let sample = out.encode_descriptor(name, help, None, MetricType::Gauge)?;
    match value {
        Some(v) => ConstGauge::new(v).encode(sample),
        None => Ok(()),
    }
}

/// Writes a gauge family, one sample per row of label values (`N` labels
/// named `labels`).
pub fn gauge_family<const N: usize, V: EncodeGaugeValue>(
    out: &mut DescriptorEncoder<'_>,
    name: &str,
    help: &str,
    labels: [&str; N],
    rows: impl Iterator<Item = ([String; N], V)>,
) -> std::fmt::Result {
    let mut family = out.encode_descriptor(name, help, None, MetricType::Gauge)?;
    for (values, value) in rows {
        let set: Vec<(&str, &str)> = labels
            .iter()
            .zip(values.iter())
            .map(|(l, v)| (*l, v.as_str()))
            .collect();
        ConstGauge::new(value).encode(family.encode_family(&set)?)?;
    }
    Ok(())
}
