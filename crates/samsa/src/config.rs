//! Building the effective [`BrokerConfig`] of a `samsa server` / `samsa dev`
//! process: the TOML file (field names of `BrokerConfig`, `[log]` table for the
//! partition-log defaults), then command-line flags, then `--set key=value`
//! overrides with dotted keys (`log.segment_bytes=1048576`).
//!
//! Overrides go through `toml::Value` rather than a hand-written key table so
//! that every field the broker and storage crates add is settable without
//! touching this file, and the values are checked by the same serde code that
//! reads the file.
//!
//! Every key the file or a `--set` names is recorded in
//! [`BrokerConfig::explicit_keys`] (leaf paths: a table contributes the keys
//! inside it), so DescribeConfigs can tell a configured value from a default.

use std::collections::BTreeSet;
use std::path::Path;

use anyhow::{anyhow, bail, Context, Result};
use samsa_broker::BrokerConfig;
use toml::{Table, Value};

/// Reads and parses a broker configuration file. Fields left out keep their
/// defaults; unknown fields are rejected by `BrokerConfig`'s serde attributes.
pub fn load_file(path: &Path) -> Result<BrokerConfig> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read config file {}", path.display()))?;
    parse_toml(&text).map_err(|msg| anyhow!("config file {}: {msg}", path.display()))
}

/// Parses a configuration document; the error is one line with the position.
pub fn parse_toml(text: &str) -> Result<BrokerConfig, String> {
    let mut config = toml::from_str::<BrokerConfig>(text).map_err(|err| {
        let msg = one_line(err.message());
        match err.span() {
            Some(span) => {
                let (line, column) = line_column(text, span.start);
                format!("line {line}, column {column}: {msg}")
            }
            None => msg,
        }
    })?;
    // It parsed as a BrokerConfig, so it parses as a table.
    if let Ok(table) = text.parse::<Table>() {
        for (key, value) in &table {
            record_leaves(&mut config.explicit_keys, key, value);
        }
    }
    Ok(config)
}

/// Records `prefix` (a dotted key), or for a table every key below it.
fn record_leaves(out: &mut BTreeSet<String>, prefix: &str, value: &Value) {
    match value {
        Value::Table(table) if !table.is_empty() => {
            for (key, value) in table {
                record_leaves(out, &format!("{prefix}.{key}"), value);
            }
        }
        _ => {
            out.insert(prefix.to_string());
        }
    }
}

/// Applies `--set key=value` overrides in order. Each one is checked on its own
/// so that an error names the key that caused it.
pub fn apply_overrides(mut config: BrokerConfig, sets: &[String]) -> Result<BrokerConfig> {
    for set in sets {
        let (key, raw) = set
            .split_once('=')
            .ok_or_else(|| anyhow!("--set {set}: expected KEY=VALUE"))?;
        config = apply_one(&config, key.trim(), raw)?;
    }
    Ok(config)
}

fn apply_one(config: &BrokerConfig, key: &str, raw: &str) -> Result<BrokerConfig> {
    let path: Vec<&str> = key.split('.').collect();
    if path.iter().any(|segment| segment.is_empty()) {
        bail!("--set {key}: invalid key (expected dotted field names such as log.segment_bytes)");
    }
    let mut root = Value::try_from(config)
        .map_err(|err| anyhow!("cannot represent the configuration as TOML: {err}"))?;
    let value = parse_value(raw);
    let mut explicit_keys = config.explicit_keys.clone();
    record_leaves(&mut explicit_keys, key, &value);
    set_path(&mut root, &path, value);
    let mut updated: BrokerConfig = root
        .try_into()
        .map_err(|err: toml::de::Error| anyhow!("--set {key}: {}", one_line(err.message())))?;

    // A table whose struct lacks `deny_unknown_fields` silently drops unknown
    // keys; a typo like `log.segmnet_bytes` must not pass unnoticed, so the key
    // has to survive a round trip.
    let check = Value::try_from(&updated)
        .map_err(|err| anyhow!("cannot represent the configuration as TOML: {err}"))?;
    if lookup(&check, &path).is_none() {
        bail!("--set {key}: unknown configuration key");
    }
    updated.explicit_keys = explicit_keys;
    Ok(updated)
}

/// Parses the right-hand side of `--set` as a TOML value (integer, float,
/// boolean, quoted string, array, inline table); anything that is not valid
/// TOML is taken as a bare string, so `--set advertised_listener=host:9092`
/// and `--set log.flush=every-ack` need no quoting.
fn parse_value(raw: &str) -> Value {
    let doc = format!("v = {raw}");
    match doc.parse::<Table>() {
        Ok(mut table) if table.len() == 1 => table
            .remove("v")
            .unwrap_or_else(|| Value::String(raw.to_string())),
        _ => Value::String(raw.to_string()),
    }
}

/// Sets `path` inside `node`, creating tables on the way. A non-table value in
/// the middle of the path is replaced by a table: that is how an enum stored as
/// a string (`log.flush = "every-ack"`) becomes its table form
/// (`log.flush.interval.interval_ms = 1000`); if the field cannot be a table,
/// deserialization reports it.
pub(crate) fn set_path(node: &mut Value, path: &[&str], value: Value) {
    match path.split_first() {
        None => *node = value,
        Some((first, rest)) => {
            if !node.is_table() {
                *node = Value::Table(Table::new());
            }
            if let Value::Table(table) = node {
                let child = table
                    .entry((*first).to_string())
                    .or_insert_with(|| Value::Table(Table::new()));
                set_path(child, rest, value);
            }
        }
    }
}

pub(crate) fn lookup<'a>(node: &'a Value, path: &[&str]) -> Option<&'a Value> {
    match path.split_first() {
        None => Some(node),
        Some((first, rest)) => lookup(node.as_table()?.get(*first)?, rest),
    }
}

fn one_line(msg: &str) -> String {
    msg.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// 1-based line and column of a byte offset.
fn line_column(text: &str, offset: usize) -> (usize, usize) {
    let before = text.get(..offset).unwrap_or(text);
    let line = before.matches('\n').count() + 1;
    let column = before
        .rsplit_once('\n')
        .map_or(before, |(_, tail)| tail)
        .chars()
        .count()
        + 1;
    (line, column)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    fn set(config: BrokerConfig, sets: &[&str]) -> Result<BrokerConfig> {
        let sets: Vec<String> = sets.iter().map(|s| (*s).to_string()).collect();
        apply_overrides(config, &sets)
    }

    #[test]
    fn file_with_log_table() {
        let config = parse_toml(
            r#"
            node_id = 7
            listen = "127.0.0.1:19092"
            data_dir = "/tmp/x"
            [log]
            segment_bytes = 1048576
            "#,
        )
        .unwrap();
        assert_eq!(config.node_id, 7);
        assert_eq!(config.listen.port(), 19092);
        assert_eq!(config.log.segment_bytes, 1_048_576);
    }

    #[test]
    fn file_error_is_one_line_with_position() {
        let err = parse_toml("node_id = 1\nbogus = 2\n").unwrap_err();
        assert!(err.starts_with("line 2, column 1:"), "{err}");
        assert!(err.contains("bogus"), "{err}");
        assert!(!err.contains('\n'), "{err}");
    }

    #[test]
    fn overrides_top_level_and_nested() {
        let config = set(
            BrokerConfig::default(),
            &[
                "num_partitions=4",
                "log.segment_bytes=1048576",
                "auto_create_topics_enable=false",
                "advertised_listener=broker-1.example:9092",
                "listen=127.0.0.1:19092",
            ],
        )
        .unwrap();
        assert_eq!(config.num_partitions, 4);
        assert_eq!(config.log.segment_bytes, 1_048_576);
        assert!(!config.auto_create_topics_enable);
        assert_eq!(
            config.advertised_listener.as_deref(),
            Some("broker-1.example:9092")
        );
        assert_eq!(config.listen.port(), 19092);
    }

    #[test]
    fn later_override_wins() {
        let config = set(
            BrokerConfig::default(),
            &["num_partitions=4", "num_partitions=8"],
        )
        .unwrap();
        assert_eq!(config.num_partitions, 8);
    }

    #[test]
    fn flush_policy_enum_forms() {
        let config = set(
            BrokerConfig::default(),
            &["log.flush.interval.interval_ms=1000"],
        )
        .unwrap();
        let back = Value::try_from(&config).unwrap();
        assert_eq!(
            lookup(&back, &["log", "flush", "interval", "interval_ms"]).and_then(Value::as_integer),
            Some(1000)
        );
        let config = set(config, &["log.flush=every-ack"]).unwrap();
        let back = Value::try_from(&config).unwrap();
        assert_eq!(
            lookup(&back, &["log", "flush"]).and_then(Value::as_str),
            Some("every-ack")
        );
    }

    #[test]
    fn errors_name_the_key() {
        for (sets, key) in [
            (&["num_partitions=lots"][..], "num_partitions"),
            (&["no_such_key=1"][..], "no_such_key"),
            (&["log.segmnet_bytes=5"][..], "log.segmnet_bytes"),
            (&["log..segment_bytes=5"][..], "log..segment_bytes"),
            (&["num_partitions"][..], "num_partitions"),
        ] {
            let err = format!("{:#}", set(BrokerConfig::default(), sets).unwrap_err());
            assert!(err.contains(key), "{err}");
            assert!(!err.contains('\n'), "{err}");
        }
    }

    #[test]
    fn explicit_keys_are_the_ones_named() {
        let config = parse_toml(
            r#"
            node_id = 7
            [log]
            segment_bytes = 1048576
            flush = { interval = { interval_ms = 5 } }
            "#,
        )
        .unwrap();
        let config = set(config, &["num_partitions=4", "log.retention_ms=60000"]).unwrap();
        let keys: Vec<&str> = config.explicit_keys.iter().map(String::as_str).collect();
        assert_eq!(
            keys,
            [
                "log.flush.interval.interval_ms",
                "log.retention_ms",
                "log.segment_bytes",
                "node_id",
                "num_partitions"
            ]
        );
        assert!(config.is_explicit("log.flush"));
        assert!(config.is_explicit("log.retention_ms"));
        assert!(!config.is_explicit("log.retention_bytes"));
        assert!(!config.is_explicit("node"));
        assert!(BrokerConfig::default().explicit_keys.is_empty());
    }

    #[test]
    fn value_parsing() {
        assert_eq!(parse_value("42"), Value::Integer(42));
        assert_eq!(parse_value("true"), Value::Boolean(true));
        assert_eq!(parse_value("\"42\""), Value::String("42".into()));
        assert_eq!(parse_value("host:9092"), Value::String("host:9092".into()));
        assert_eq!(parse_value("every-ack"), Value::String("every-ack".into()));
        assert_eq!(parse_value("1\nx = 2"), Value::String("1\nx = 2".into()));
    }
}
