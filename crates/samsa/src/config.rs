//! Building the effective [`BrokerConfig`] of a `samsa server` / `samsa dev`
//! process: the TOML file (field names of `BrokerConfig`, `[log]` table for the
//! partition-log defaults), then (`samsa server` only) `SAMSA_<KEY>`
//! environment variables ([`env_overrides`]), then command-line flags, then
//! `--set key=value` overrides with dotted keys (`log.segment_bytes=1048576`).
//!
//! Two values let identical configuration serve every pod of a StatefulSet:
//! `node_id = "from-hostname"` ([`node_id_from_hostname`]: the host name's
//! trailing `-<ordinal>` plus one) and `{hostname}` inside
//! `advertised_listener` ([`expand_hostname`]).
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
use samsa_broker::config::AdvertisedAddress;
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
    parse_toml_on(text, &system_hostname)
}

fn parse_toml_on(text: &str, hostname: HostName) -> Result<BrokerConfig, String> {
    if let Ok(mut table) = text.parse::<Table>() {
        if let Some(value) = table.get_mut("node_id") {
            if resolve_node_id(value, hostname)? {
                // The document no longer is the text, so errors lose their
                // position; they still name the key.
                let mut config: BrokerConfig = Value::Table(table.clone())
                    .try_into()
                    .map_err(|err: toml::de::Error| one_line(err.message()))?;
                for (key, value) in &table {
                    record_leaves(&mut config.explicit_keys, key, value);
                }
                return Ok(config);
            }
        }
    }
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
pub fn apply_overrides(config: BrokerConfig, sets: &[String]) -> Result<BrokerConfig> {
    apply_overrides_on(config, sets, &system_hostname)
}

fn apply_overrides_on(
    mut config: BrokerConfig,
    sets: &[String],
    hostname: HostName,
) -> Result<BrokerConfig> {
    for set in sets {
        let (key, raw) = set
            .split_once('=')
            .ok_or_else(|| anyhow!("--set {set}: expected KEY=VALUE"))?;
        let key = key.trim();
        config =
            apply_one(&config, key, raw, hostname).map_err(|err| anyhow!("--set {key}: {err}"))?;
    }
    Ok(config)
}

/// The prefix of configuration environment variables: `SAMSA_NUM_PARTITIONS`
/// is `num_partitions`, `SAMSA_LOG__SEGMENT_BYTES` is `log.segment_bytes`.
pub const ENV_PREFIX: &str = "SAMSA_";

/// Applies the `SAMSA_<KEY>` variables of `vars` (a process's environment),
/// as `--set` would, in the order of their names: the key is the rest of the
/// name in lower case with `__` for each dot, the value is read like a
/// `--set` value. A name that is no configuration key is skipped with a
/// warning rather than refused: the samsa tools read `SAMSA_BOOTSTRAP_SERVER`
/// and `SAMSA_CONTROLLERS`, and Kubernetes gives every pod
/// `SAMSA_SERVICE_HOST`, `SAMSA_PORT`, … when a Service is named `samsa`.
/// A bad value of a known key is an error naming the variable.
///
/// Variables that name no key are ignored and returned (the caller logs
/// them once the log format is known).
pub fn env_overrides(
    config: BrokerConfig,
    vars: impl IntoIterator<Item = (String, String)>,
) -> Result<(BrokerConfig, Vec<IgnoredVariable>)> {
    let mut ignored = Vec::new();
    let config = env_overrides_on(config, vars, &system_hostname, &mut ignored)?;
    Ok((config, ignored))
}

/// A `SAMSA_*` variable that names no configuration key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IgnoredVariable {
    pub variable: String,
    /// The key it would name, if it can name one.
    pub key: Option<String>,
}

fn env_overrides_on(
    mut config: BrokerConfig,
    vars: impl IntoIterator<Item = (String, String)>,
    hostname: HostName,
    ignored: &mut Vec<IgnoredVariable>,
) -> Result<BrokerConfig> {
    let mut vars: Vec<(String, String)> = vars
        .into_iter()
        .filter(|(name, _)| name.starts_with(ENV_PREFIX))
        .collect();
    vars.sort();
    for (name, raw) in vars {
        let Some(key) = env_key(&name) else {
            ignored.push(IgnoredVariable {
                variable: name,
                key: None,
            });
            continue;
        };
        match apply_one(&config, &key, &raw, hostname) {
            Ok(updated) => config = updated,
            Err(SetError::UnknownKey) => ignored.push(IgnoredVariable {
                variable: name,
                key: Some(key),
            }),
            Err(err) => bail!("environment variable {name} ({key}): {err}"),
        }
    }
    Ok(config)
}

/// `SAMSA_LOG__SEGMENT_BYTES` → `log.segment_bytes`; `None` for a name that
/// cannot be a key (empty segments, characters outside `A-Z0-9_`).
fn env_key(name: &str) -> Option<String> {
    let rest = name.strip_prefix(ENV_PREFIX)?;
    let ok = |s: &str| {
        !s.is_empty()
            && !s.starts_with('_')
            && !s.ends_with('_')
            && s.bytes()
                .all(|b| b.is_ascii_uppercase() || b.is_ascii_digit() || b == b'_')
    };
    let segments: Vec<&str> = rest.split("__").collect();
    if !segments.iter().all(|s| ok(s)) {
        return None;
    }
    Some(segments.join(".").to_ascii_lowercase())
}

/// Why one override was refused.
#[derive(Debug)]
enum SetError {
    UnknownKey,
    InvalidKey,
    Invalid(String),
}

impl std::fmt::Display for SetError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SetError::UnknownKey => f.write_str("unknown configuration key"),
            SetError::InvalidKey => {
                f.write_str("invalid key (expected dotted field names such as log.segment_bytes)")
            }
            SetError::Invalid(msg) => f.write_str(msg),
        }
    }
}

fn apply_one(
    config: &BrokerConfig,
    key: &str,
    raw: &str,
    hostname: HostName,
) -> Result<BrokerConfig, SetError> {
    let path: Vec<&str> = key.split('.').collect();
    if path.iter().any(|segment| segment.is_empty()) {
        return Err(SetError::InvalidKey);
    }
    let mut root = Value::try_from(config).map_err(|err| {
        SetError::Invalid(format!("cannot represent the configuration as TOML: {err}"))
    })?;
    let mut value = parse_value(raw);
    if path == ["node_id"] {
        resolve_node_id(&mut value, hostname).map_err(SetError::Invalid)?;
    }
    let mut explicit_keys = config.explicit_keys.clone();
    record_leaves(&mut explicit_keys, key, &value);
    set_path(&mut root, &path, value);
    let mut updated: BrokerConfig = root.try_into().map_err(|err: toml::de::Error| {
        let msg = one_line(err.message());
        // serde's wording for a field `deny_unknown_fields` refuses, at any
        // depth (the [log] table refuses unknown fields too).
        if msg.starts_with("unknown field") {
            SetError::UnknownKey
        } else {
            SetError::Invalid(msg)
        }
    })?;

    // A table whose struct lacks `deny_unknown_fields` silently drops unknown
    // keys; a typo like `log.segmnet_bytes` must not pass unnoticed, so the key
    // has to survive a round trip.
    let check = Value::try_from(&updated).map_err(|err| {
        SetError::Invalid(format!("cannot represent the configuration as TOML: {err}"))
    })?;
    if lookup(&check, &path).is_none() {
        return Err(SetError::UnknownKey);
    }
    updated.explicit_keys = explicit_keys;
    Ok(updated)
}

/// Where `from-hostname` values take the host name from (tests pass their own).
type HostName<'a> = &'a dyn Fn() -> Result<String, String>;

/// The value of `node_id` that derives it from the host name.
pub const NODE_ID_FROM_HOSTNAME: &str = "from-hostname";

/// The kernel's host name: what `docker run --hostname` and a Kubernetes
/// StatefulSet (the pod name, `samsa-2`) set.
fn system_hostname() -> Result<String, String> {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|name| name.trim().to_string())
        .map_err(|err| format!("cannot read the host name from /proc/sys/kernel/hostname: {err}"))
}

/// Replaces a `node_id` value of `"from-hostname"` by the id the host name
/// gives; other values stay. Returns whether it replaced.
fn resolve_node_id(value: &mut Value, hostname: HostName) -> Result<bool, String> {
    if value.as_str() != Some(NODE_ID_FROM_HOSTNAME) {
        return Ok(false);
    }
    let name = hostname()?;
    let id = node_id_from_hostname(&name)?;
    *value = Value::Integer(i64::from(id));
    Ok(true)
}

/// The node id of a StatefulSet-style host name: `<name>-<ordinal>` (the
/// first label of a dotted name) is node `ordinal + 1`, so `samsa-0` is
/// node 1. samsa numbers nodes from 1 (the default `node_id`, the 1…N of
/// `samsa dev --nodes N`, the voter lists of docs/OPERATIONS.md), while
/// StatefulSet ordinals start at 0.
pub fn node_id_from_hostname(hostname: &str) -> Result<i32, String> {
    let label = hostname.split('.').next().unwrap_or(hostname);
    let ordinal = label
        .rsplit_once('-')
        .map(|(_, tail)| tail)
        .filter(|tail| !tail.is_empty() && tail.bytes().all(|b| b.is_ascii_digit()))
        .ok_or_else(|| {
            format!(
                "node_id = \"{NODE_ID_FROM_HOSTNAME}\": host name {hostname:?} does not end in \
                 -<ordinal> (as StatefulSet pods samsa-0, samsa-1, … do); set node_id to a number \
                 or run with such a host name"
            )
        })?;
    ordinal
        .parse::<i32>()
        .ok()
        .and_then(|n| n.checked_add(1))
        .ok_or_else(|| {
            format!("host name {hostname:?}: ordinal {ordinal} is too large for a node id")
        })
}

/// The value of `--node-id`: a number or `from-hostname`.
pub fn node_id_flag(arg: &str) -> Result<i32, String> {
    node_id_flag_on(arg, &system_hostname)
}

fn node_id_flag_on(arg: &str, hostname: HostName) -> Result<i32, String> {
    if arg == NODE_ID_FROM_HOSTNAME {
        return node_id_from_hostname(&hostname()?);
    }
    arg.parse()
        .map_err(|_| format!("{arg:?} is neither a node id nor {NODE_ID_FROM_HOSTNAME}"))
}

/// The placeholder `advertised_listener` may contain.
pub const HOSTNAME_PLACEHOLDER: &str = "{hostname}";

/// Replaces `{hostname}` in `advertised_listener` (and in those of
/// `[listeners.*]`, and in `inter_node_advertised_address`) by the host name, so that
/// `advertised_listener = "{hostname}.samsa-headless:9092"` is the same for
/// every pod.
pub fn expand_hostname(config: BrokerConfig) -> Result<BrokerConfig> {
    expand_hostname_on(config, &system_hostname)
}

fn expand_hostname_on(mut config: BrokerConfig, hostname: HostName) -> Result<BrokerConfig> {
    let expand = |key: &str, address: &mut String| -> Result<()> {
        if address.contains(HOSTNAME_PLACEHOLDER) {
            let name = hostname().map_err(|err| anyhow!("{key} {address}: {err}"))?;
            *address = address.replace(HOSTNAME_PLACEHOLDER, &name);
        }
        Ok(())
    };
    if let Some(adv) = &mut config.advertised_listener {
        expand("advertised_listener", adv)?;
    }
    if let Some(adv) = &mut config.inter_node_advertised_address {
        expand("inter_node_advertised_address", adv)?;
    }
    for (name, listener) in &mut config.listeners {
        let key = format!("listeners.{name}.advertised_listener");
        match &mut listener.advertised_listener {
            None => {}
            Some(AdvertisedAddress::One(address)) => expand(&key, address)?,
            Some(AdvertisedAddress::PerNode(addresses)) => {
                for address in addresses {
                    expand(&key, address)?;
                }
            }
        }
    }
    Ok(config)
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

    fn host(name: &'static str) -> impl Fn() -> Result<String, String> {
        move || Ok(name.to_string())
    }

    fn env(
        config: BrokerConfig,
        vars: &[(&str, &str)],
        name: &'static str,
    ) -> Result<BrokerConfig> {
        let vars = vars
            .iter()
            .map(|(k, v)| ((*k).to_string(), (*v).to_string()));
        env_overrides_on(config, vars, &host(name), &mut Vec::new())
    }

    #[test]
    fn env_names_become_dotted_keys() {
        assert_eq!(
            env_key("SAMSA_NUM_PARTITIONS").as_deref(),
            Some("num_partitions")
        );
        assert_eq!(
            env_key("SAMSA_LOG__SEGMENT_BYTES").as_deref(),
            Some("log.segment_bytes")
        );
        assert_eq!(
            env_key("SAMSA_LOG__FLUSH__INTERVAL__INTERVAL_MS").as_deref(),
            Some("log.flush.interval.interval_ms")
        );
        for bad in [
            "SAMSA_",
            "SAMSA__X",
            "SAMSA_LOG___X",
            "SAMSA_log",
            "SAMSA_A-B",
            "OTHER_X",
        ] {
            assert_eq!(env_key(bad), None, "{bad}");
        }
    }

    #[test]
    fn env_overrides_file_and_is_explicit() {
        let file = parse_toml("num_partitions = 2\n[log]\nsegment_bytes = 1048576\n").unwrap();
        let config = env(
            file,
            &[
                ("SAMSA_NUM_PARTITIONS", "6"),
                ("SAMSA_LOG__RETENTION_MS", "60000"),
                ("SAMSA_ADVERTISED_LISTENER", "broker.example:9092"),
                (
                    "SAMSA_CONTROLLER_QUORUM_VOTERS",
                    "1@a:9093,2@b:9093,3@c:9093",
                ),
                ("PATH", "/bin"),
            ],
            "x",
        )
        .unwrap();
        assert_eq!(config.num_partitions, 6);
        assert_eq!(config.log.segment_bytes, 1_048_576);
        assert_eq!(config.log.retention_ms, 60_000);
        assert_eq!(
            config.advertised_listener.as_deref(),
            Some("broker.example:9092")
        );
        assert_eq!(
            config.controller_quorum_voters.as_deref(),
            Some("1@a:9093,2@b:9093,3@c:9093")
        );
        assert!(config.is_explicit("log.retention_ms"));
        assert!(config.is_explicit("controller_quorum_voters"));
        assert!(!config.is_explicit("path"));
        // --set, applied after the environment, wins.
        let config = set(config, &["num_partitions=8"]).unwrap();
        assert_eq!(config.num_partitions, 8);
    }

    #[test]
    fn env_skips_names_that_are_no_key_and_refuses_bad_values() {
        let config = env(
            BrokerConfig::default(),
            &[
                ("SAMSA_BOOTSTRAP_SERVER", "127.0.0.1:9092"),
                ("SAMSA_SERVICE_HOST", "10.0.0.1"),
                ("SAMSA_PORT_9092_TCP", "tcp://10.0.0.1:9092"),
                ("SAMSA_LOG__SEGMNET_BYTES", "5"),
            ],
            "x",
        )
        .unwrap();
        assert!(config.explicit_keys.is_empty());
        let err = format!(
            "{:#}",
            env(
                BrokerConfig::default(),
                &[("SAMSA_NUM_PARTITIONS", "lots")],
                "x"
            )
            .unwrap_err()
        );
        assert!(err.contains("SAMSA_NUM_PARTITIONS"), "{err}");
        assert!(err.contains("num_partitions"), "{err}");
    }

    #[test]
    fn node_id_from_statefulset_host_names() {
        assert_eq!(node_id_from_hostname("samsa-0"), Ok(1));
        assert_eq!(node_id_from_hostname("samsa-2"), Ok(3));
        assert_eq!(node_id_from_hostname("my-kafka-samsa-11"), Ok(12));
        assert_eq!(
            node_id_from_hostname("samsa-2.samsa-headless.default.svc"),
            Ok(3)
        );
        for bad in [
            "samsa",
            "samsa-",
            "samsa-x",
            "3f2a9c1b",
            "samsa-2a",
            "samsa-99999999999",
        ] {
            let err = node_id_from_hostname(bad).unwrap_err();
            assert!(err.contains(bad), "{err}");
        }
        assert!(node_id_from_hostname("samsa")
            .unwrap_err()
            .contains("-<ordinal>"));
    }

    #[test]
    fn node_id_from_hostname_in_every_source() {
        let file = parse_toml_on(
            "node_id = \"from-hostname\"\nnum_partitions = 3\n",
            &host("samsa-2"),
        )
        .unwrap();
        assert_eq!(file.node_id, 3);
        assert_eq!(file.num_partitions, 3);
        assert!(file.is_explicit("node_id"));
        let err = parse_toml_on("node_id = \"from-hostname\"\nbogus = 1\n", &host("samsa-2"))
            .unwrap_err();
        assert!(err.contains("bogus"), "{err}");

        let from_env = env(
            BrokerConfig::default(),
            &[("SAMSA_NODE_ID", "from-hostname")],
            "samsa-1",
        )
        .unwrap();
        assert_eq!(from_env.node_id, 2);
        assert!(from_env.is_explicit("node_id"));

        let sets = vec!["node_id=from-hostname".to_string()];
        let from_set =
            apply_overrides_on(BrokerConfig::default(), &sets, &host("samsa-0")).unwrap();
        assert_eq!(from_set.node_id, 1);

        assert_eq!(node_id_flag_on("from-hostname", &host("samsa-4")), Ok(5));
        assert_eq!(node_id_flag_on("7", &host("samsa-4")), Ok(7));
        assert!(node_id_flag_on("seven", &host("samsa-4")).is_err());

        let err = format!(
            "{:#}",
            env(
                BrokerConfig::default(),
                &[("SAMSA_NODE_ID", "from-hostname")],
                "c0ffee"
            )
            .unwrap_err()
        );
        assert!(
            err.contains("SAMSA_NODE_ID") && err.contains("c0ffee"),
            "{err}"
        );
    }

    #[test]
    fn advertised_listener_hostname_placeholder() {
        let config = BrokerConfig {
            advertised_listener: Some("{hostname}.samsa-headless:9092".into()),
            inter_node_advertised_address: Some("{hostname}.samsa-headless:9093".into()),
            ..BrokerConfig::default()
        };
        let config = expand_hostname_on(config, &host("samsa-1")).unwrap();
        assert_eq!(
            config.advertised_listener.as_deref(),
            Some("samsa-1.samsa-headless:9092")
        );
        assert_eq!(
            config.inter_node_advertised_address.as_deref(),
            Some("samsa-1.samsa-headless:9093")
        );
        let plain = expand_hostname_on(BrokerConfig::default(), &|| Err("no host".into())).unwrap();
        assert_eq!(plain.advertised_listener, None);
    }

    #[test]
    fn further_listeners_from_env_with_hostname_and_per_node_addresses() {
        let config = env(
            BrokerConfig::default(),
            &[
                ("SAMSA_LISTENERS__HOST__LISTEN", "0.0.0.0:19092"),
                (
                    "SAMSA_LISTENERS__HOST__ADVERTISED_LISTENER",
                    "{hostname}.example:9192",
                ),
                ("SAMSA_LISTENERS__EXTERNAL__LISTEN", "0.0.0.0:9094"),
                (
                    "SAMSA_LISTENERS__EXTERNAL__ADVERTISED_LISTENER",
                    r#"["203.0.113.5:31090", "203.0.113.5:31091"]"#,
                ),
                ("SAMSA_NODE_ID", "2"),
            ],
            "samsa-1",
        )
        .unwrap();
        assert!(config.is_explicit("listeners"));
        let config = expand_hostname_on(config, &host("samsa-1")).unwrap();
        let listeners = config.kafka_listeners().unwrap();
        let summary: Vec<String> = listeners
            .iter()
            .map(|l| format!("{}={}:{}", l.name, l.advertised_host, l.advertised_port))
            .collect();
        assert_eq!(
            summary,
            [
                "PLAINTEXT=127.0.0.1:9092",
                "EXTERNAL=203.0.113.5:31091",
                "HOST=samsa-1.example:9192"
            ]
        );
        let half = env(
            BrokerConfig::default(),
            &[("SAMSA_LISTENERS__HOST__ADVERTISED_LISTENER", "h:1")],
            "x",
        )
        .unwrap();
        let err = half.kafka_listeners().unwrap_err();
        assert!(err.contains("listeners.host.listen is not set"), "{err}");
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
