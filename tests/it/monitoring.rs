//! The monitoring assets of `deploy/monitoring` checked against the tools
//! that load them and the broker they describe:
//!
//! - `promtool` accepts the alerting rules, the compose cluster's
//!   Prometheus configuration and every query of the Grafana dashboard (as
//!   recording rules, Grafana's variables replaced);
//! - every metric the dashboard and the rules name is one a samsa node
//!   exposes: a fresh node after a small workload that gives each labelled
//!   family a series (empty families are not on the page), the names only
//!   a cluster has (Raft, controller, follower lag) on a three-node cluster;
//! - a real Prometheus scrapes a three-node cluster without an error,
//!   evaluates the rules without one, and its queries see what happened:
//!   the records produced, one active controller, a stopped follower as one
//!   under-replicated partition and none once it is resumed.
//!
//! `prometheus` and `promtool` are Debian's `prometheus` package, which
//! `tests/run-all.sh` installs; without them the tests fail.

use std::collections::{BTreeMap, BTreeSet};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
use rdkafka::producer::{FutureProducer, FutureRecord};
use samsa_tests::batch::BatchBuilder;
use samsa_tests::cluster::SamsaCluster;
use samsa_tests::codes::OUT_OF_ORDER_SEQUENCE_NUMBER;
use samsa_tests::http::http_get;
use samsa_tests::node::{free_port, has_setpriv};
use samsa_tests::rdk::idempotent_producer_config;
use samsa_tests::txn::TxnProducer;
use samsa_tests::wait::{try_wait_until, wait_until};
use samsa_tests::{unique_topic, SamsaNode};
use serde_json::Value;

use crate::replication::{create_replicated_topic, leader_and_isr};

const ALERTS: &str = "deploy/monitoring/alerts.yml";
const PROMETHEUS_CONFIG: &str = "deploy/monitoring/prometheus.yml";
const DASHBOARD: &str = "deploy/monitoring/grafana/samsa-dashboard.json";

/// Metric names only a cluster node has: the metadata quorum's and the
/// active controller's, a leader's per-follower lag and a follower's fetches. The one-node test
/// leaves them to the three-node one.
fn cluster_only(name: &str) -> bool {
    [
        "samsa_raft_",
        "samsa_controller_",
        "samsa_follower_lag_",
        "samsa_replica_fetch_",
    ]
    .iter()
    .any(|prefix| name.starts_with(prefix))
        || [
            "samsa_active_brokers",
            "samsa_fenced_brokers",
            "samsa_offline_partitions",
        ]
        .contains(&name)
}

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ has a parent")
        .to_path_buf()
}

/// `name` on the PATH; fails the test if it is not installed.
fn prometheus_tool(name: &str) -> PathBuf {
    std::env::var_os("PATH")
        .iter()
        .flat_map(std::env::split_paths)
        .map(|dir| dir.join(name))
        .find(|p| p.is_file())
        .unwrap_or_else(|| {
            panic!(
                "`{name}` is not installed: it comes with Debian's `prometheus` package, \
                 which tests/run-all.sh installs (apt-get install prometheus)"
            )
        })
}

/// Runs `promtool args…`; fails the test with its output unless it succeeds.
/// Returns what it printed.
fn promtool(args: &[&str]) -> String {
    let out = Command::new(prometheus_tool("promtool"))
        .args(args)
        .current_dir(repo_root())
        .output()
        .expect("run promtool");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success(),
        "promtool {} failed:\n{text}",
        args.join(" ")
    );
    text
}

// ------------------------------------------------------------ the assets ---

/// The `expr:` values of a rules file. The file keeps to a small YAML
/// style: `expr: <one line>` or a block scalar (`|`, `>-`, …) on the lines
/// indented below it.
fn rule_expressions(yaml: &str) -> Vec<String> {
    let lines: Vec<&str> = yaml.lines().collect();
    let mut exprs = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        let line = lines[i];
        let indent = line.len() - line.trim_start().len();
        let trimmed = line.trim_start().trim_start_matches("- ");
        i += 1;
        let Some(value) = trimmed.strip_prefix("expr:") else {
            continue;
        };
        let value = value.trim();
        if value.starts_with('|') || value.starts_with('>') {
            let mut block = Vec::new();
            while i < lines.len() {
                let next = lines[i];
                let next_indent = next.len() - next.trim_start().len();
                if !next.trim().is_empty() && next_indent <= indent {
                    break;
                }
                block.push(next.trim());
                i += 1;
            }
            exprs.push(block.join("\n").trim().to_string());
        } else {
            exprs.push(value.trim_matches(|c| c == '"' || c == '\'').to_string());
        }
    }
    exprs
}

/// Every `expr` of the dashboard (panels' queries), and the queries of its
/// template variables (`label_values(…)`, Grafana's, not PromQL).
fn dashboard_queries(dashboard: &Value) -> (Vec<String>, Vec<String>) {
    fn walk(v: &Value, out: &mut Vec<String>) {
        match v {
            Value::Object(map) => {
                for (k, v) in map {
                    match (k.as_str(), v) {
                        ("expr", Value::String(s)) => out.push(s.clone()),
                        _ => walk(v, out),
                    }
                }
            }
            Value::Array(items) => items.iter().for_each(|v| walk(v, out)),
            _ => {}
        }
    }
    let mut exprs = Vec::new();
    walk(&dashboard["panels"], &mut exprs);
    let variables = dashboard["templating"]["list"]
        .as_array()
        .expect("templating.list")
        .iter()
        .filter(|v| v["type"] == "query")
        .map(|v| match &v["query"] {
            Value::String(s) => s.clone(),
            q => q["query"].as_str().expect("a variable's query").to_string(),
        })
        .collect();
    (exprs, variables)
}

fn read_dashboard() -> Value {
    let text = std::fs::read_to_string(repo_root().join(DASHBOARD)).expect("read the dashboard");
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{DASHBOARD} is not JSON: {e}"))
}

/// Grafana's variables replaced by what PromQL accepts: `$__rate_interval`
/// and the other built-in intervals by a duration, a template variable
/// (used in label matchers) by `.*`.
fn without_grafana_variables(expr: &str) -> String {
    let mut out = String::with_capacity(expr.len());
    let mut chars = expr.chars().peekable();
    while let Some(c) = chars.next() {
        if c != '$' {
            out.push(c);
            continue;
        }
        let braced = chars.next_if_eq(&'{').is_some();
        let mut name = String::new();
        while let Some(c) = chars.next_if(|c| c.is_ascii_alphanumeric() || *c == '_') {
            name.push(c);
        }
        if braced {
            assert_eq!(chars.next(), Some('}'), "unclosed ${{ in {expr}");
        }
        out.push_str(if name.starts_with("__") { "1m" } else { ".*" });
    }
    out
}

/// The metric names a PromQL expression (or Grafana's `label_values(…)`)
/// uses: identifiers starting with `samsa_` or `process_` outside string
/// literals and label matchers (`{…}`). Functions, keywords and the label
/// names of `by (…)` have other names.
fn metric_names(expr: &str) -> BTreeSet<String> {
    let chars: Vec<char> = expr.chars().collect();
    let mut names = BTreeSet::new();
    let mut braces = 0_usize;
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        if c == '{' || c == '}' {
            braces = if c == '{' {
                braces + 1
            } else {
                braces.saturating_sub(1)
            };
            i += 1;
        } else if matches!(c, '"' | '\'' | '`') {
            i += 1;
            while i < chars.len() && chars[i] != c {
                i += if chars[i] == '\\' { 2 } else { 1 };
            }
            i += 1;
        } else if c.is_ascii_digit() {
            // A number or a duration (0.99, 5m, 1e3).
            while i < chars.len() && (chars[i].is_ascii_alphanumeric() || chars[i] == '.') {
                i += 1;
            }
        } else if c.is_ascii_alphabetic() || c == '_' || c == ':' {
            let start = i;
            while i < chars.len()
                && (chars[i].is_ascii_alphanumeric() || chars[i] == '_' || chars[i] == ':')
            {
                i += 1;
            }
            let word: String = chars[start..i].iter().collect();
            let variable = start > 0 && chars[start - 1] == '$';
            if braces == 0
                && !variable
                && (word.starts_with("samsa_") || word.starts_with("process_"))
            {
                names.insert(word);
            }
        } else {
            i += 1;
        }
    }
    names
}

/// Every metric name the dashboard and the rules use, with where.
fn referenced_names() -> BTreeMap<String, String> {
    let mut names = BTreeMap::new();
    let alerts = std::fs::read_to_string(repo_root().join(ALERTS)).expect("read the rules");
    for expr in rule_expressions(&alerts) {
        for name in metric_names(&expr) {
            names
                .entry(name)
                .or_insert_with(|| format!("{ALERTS}: {expr}"));
        }
    }
    let (exprs, variables) = dashboard_queries(&read_dashboard());
    for expr in exprs.iter().chain(&variables) {
        for name in metric_names(expr) {
            names
                .entry(name)
                .or_insert_with(|| format!("{DASHBOARD}: {expr}"));
        }
    }
    names
}

/// The sample names an OpenMetrics page exposes: each family's, by its
/// type (`_total` of a counter, `_bucket`/`_sum`/`_count` of a histogram,
/// …), and every sample's own name.
fn exposed_names(page: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for line in page.lines() {
        if let Some(decl) = line.strip_prefix("# TYPE ") {
            let mut parts = decl.split_whitespace();
            let (Some(family), Some(kind)) = (parts.next(), parts.next()) else {
                continue;
            };
            let suffixes: &[&str] = match kind {
                "counter" => &["_total", "_created"],
                "histogram" => &["_bucket", "_sum", "_count", "_created"],
                "gaugehistogram" => &["_bucket", "_gsum", "_gcount"],
                "summary" => &["", "_sum", "_count", "_created"],
                "info" => &["_info"],
                _ => &[""],
            };
            names.extend(suffixes.iter().map(|s| format!("{family}{s}")));
        } else if !line.starts_with('#') {
            if let Some(name) = line.split(['{', ' ']).next().filter(|n| !n.is_empty()) {
                names.insert(name.to_string());
            }
        }
    }
    names
}

fn scrape(addr: SocketAddr) -> String {
    let (status, body) = http_get(addr, "/metrics").expect("GET /metrics");
    assert_eq!(status, 200, "{body}");
    body
}

/// The referenced names (with where they are used) missing from `exposed`.
fn missing<'a>(
    referenced: &'a BTreeMap<String, String>,
    exposed: &BTreeSet<String>,
    check: impl Fn(&str) -> bool,
) -> Vec<(&'a String, &'a String)> {
    referenced
        .iter()
        .filter(|(name, _)| check(name) && !exposed.contains(*name))
        .collect()
}

fn report(missing: &[(&String, &String)]) -> String {
    missing
        .iter()
        .map(|(name, used)| format!("  {name}    (in {used})"))
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn promtool_accepts_the_rules_the_config_and_every_dashboard_query() {
    let checked = promtool(&["check", "rules", ALERTS]);
    let alerts = std::fs::read_to_string(repo_root().join(ALERTS)).unwrap();
    let exprs = rule_expressions(&alerts);
    assert!(
        checked.contains(&format!("SUCCESS: {} rules found", exprs.len())),
        "promtool counts other rules than the {} expressions read here:\n{checked}",
        exprs.len()
    );
    // The compose cluster's configuration, with the rules it loads.
    promtool(&["check", "config", PROMETHEUS_CONFIG]);

    let dashboard = read_dashboard();
    assert!(
        dashboard["schemaVersion"].as_i64().unwrap_or(0) >= 36,
        "schemaVersion"
    );
    let variables = dashboard["templating"]["list"].as_array().unwrap();
    assert!(
        variables.iter().any(|v| v["name"] == "datasource"
            && v["type"] == "datasource"
            && v["query"] == "prometheus"),
        "no `datasource` variable of Prometheus data sources"
    );
    let mut ids = BTreeSet::new();
    for panel in dashboard["panels"].as_array().expect("panels") {
        let title = panel["title"].as_str().unwrap_or("?");
        assert!(
            ids.insert(panel["id"].as_i64()),
            "panel id of {title} twice"
        );
        let pos = &panel["gridPos"];
        assert!(
            pos["x"].as_i64().unwrap() + pos["w"].as_i64().unwrap() <= 24,
            "{title} is wider than the dashboard"
        );
        if panel["type"] == "row" {
            continue;
        }
        assert_eq!(panel["datasource"]["uid"], "${datasource}", "{title}");
        let targets = panel["targets"].as_array().expect("targets");
        assert!(!targets.is_empty(), "{title} has no query");
        for t in targets {
            assert_eq!(t["datasource"]["uid"], "${datasource}", "{title}");
            assert!(!t["expr"].as_str().unwrap_or("").is_empty(), "{title}");
        }
    }

    // Every query parsed by Prometheus's own parser: as recording rules.
    let (queries, _) = dashboard_queries(&dashboard);
    let mut rules = String::from("groups:\n  - name: dashboard\n    rules:\n");
    for (i, expr) in queries.iter().enumerate() {
        // A JSON string is a YAML double-quoted scalar.
        let quoted = serde_json::to_string(&without_grafana_variables(expr)).unwrap();
        rules.push_str(&format!(
            "      - record: dashboard_query_{i}\n        expr: {quoted}\n"
        ));
    }
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("dashboard-queries.yml");
    std::fs::write(&file, rules).unwrap();
    let checked = promtool(&["check", "rules", file.to_str().unwrap()]);
    assert!(
        checked.contains(&format!("SUCCESS: {} rules found", queries.len())),
        "{checked}"
    );
    println!(
        "promtool: {} alerting rules, the configuration, {} dashboard queries",
        exprs.len(),
        queries.len()
    );
}

/// Gives every labelled family the dashboard uses a series on a single
/// node: topic traffic, a refused request, an out-of-order sequence, a
/// committed and an aborted transaction, a consumer group that committed
/// (returned: it stays a member while the page is read).
fn light_workload(node: &SamsaNode) -> BaseConsumer {
    let topic = unique_topic("monitoring");
    let mut client = node.client();
    client.create_topic(&topic, 1).unwrap();
    let batch = BatchBuilder::new().values(["a", "b", "c"]).build();
    assert_eq!(
        client
            .produce(&topic, 0, batch.clone(), -1)
            .unwrap()
            .error_code,
        0
    );
    // A partition that does not exist: UNKNOWN_TOPIC_OR_PARTITION.
    assert_ne!(client.produce(&topic, 7, batch, -1).unwrap().error_code, 0);
    assert_eq!(client.fetch(&topic, 0, 0, 0, 1).unwrap().error_code, 0);

    let producer = client.init_producer_id().unwrap();
    let (pid, epoch) = (producer.producer_id.0, producer.producer_epoch);
    let first = BatchBuilder::idempotent(pid, epoch, 0)
        .values(["d"])
        .build();
    assert_eq!(client.produce(&topic, 0, first, -1).unwrap().error_code, 0);
    let gap = BatchBuilder::idempotent(pid, epoch, 5)
        .values(["e"])
        .build();
    assert_eq!(
        client.produce(&topic, 0, gap, -1).unwrap().error_code,
        OUT_OF_ORDER_SEQUENCE_NUMBER
    );

    let txn = TxnProducer::transactional(&node.bootstrap(), &unique_topic("monitoring-txn"));
    txn.begin().unwrap();
    txn.send_ok(&topic, Some(0), "committed");
    txn.commit().unwrap();
    txn.begin().unwrap();
    txn.send_ok(&topic, Some(0), "aborted");
    txn.abort().unwrap();

    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", node.bootstrap())
        .set("group.id", unique_topic("monitoring-group"))
        .set("enable.auto.commit", "false")
        .set("auto.offset.reset", "earliest")
        .set("broker.address.family", "v4")
        .create()
        .expect("create a consumer");
    consumer.subscribe(&[&topic]).unwrap();
    wait_until(
        "the group member's first record",
        Duration::from_secs(30),
        || {
            consumer
                .poll(Duration::from_millis(100))
                .and_then(Result::ok)
                .map(|_| ())
        },
    );
    consumer.commit_consumer_state(CommitMode::Sync).unwrap();
    consumer
}

#[test]
fn dashboard_and_rules_name_only_metrics_a_node_exposes() {
    let referenced = referenced_names();
    let node = SamsaNode::start();
    let _member = light_workload(&node);
    // The coordinators' gauges are read at each scrape; give a missing name
    // a few seconds before reporting it.
    let mut exposed = BTreeSet::new();
    let complete = try_wait_until(Duration::from_secs(10), || {
        exposed = exposed_names(&scrape(node.http_addr()));
        missing(&referenced, &exposed, |n| !cluster_only(n))
            .is_empty()
            .then_some(())
    });
    if complete.is_none() {
        let absent = missing(&referenced, &exposed, |n| !cluster_only(n));
        panic!(
            "{} metric names of the dashboard or the rules are not on a node's /metrics:\n{}",
            absent.len(),
            report(&absent)
        );
    }
    println!(
        "{} metric names used, {} of them checked on one node (the others need a cluster)",
        referenced.len(),
        referenced.keys().filter(|n| !cluster_only(n)).count()
    );
}

// ------------------------------------------------------- a real Prometheus ---

/// A `prometheus` process on a free port with its configuration and
/// database in a temporary directory; killed on drop (its log printed if
/// the test is failing).
struct Prometheus {
    child: Child,
    addr: SocketAddr,
    dir: tempfile::TempDir,
}

impl Prometheus {
    fn start(config: &str) -> Prometheus {
        let bin = prometheus_tool("prometheus");
        let dir = tempfile::Builder::new()
            .prefix("samsa-prometheus-")
            .tempdir()
            .unwrap();
        let config_file = dir.path().join("prometheus.yml");
        std::fs::write(&config_file, config).unwrap();
        let addr = SocketAddr::from(([127, 0, 0, 1], free_port()));
        let log = std::fs::File::create(dir.path().join("prometheus.log")).unwrap();
        let mut cmd = if has_setpriv() {
            let mut c = Command::new("setpriv");
            c.arg("--pdeathsig").arg("KILL").arg(&bin);
            c
        } else {
            Command::new(&bin)
        };
        cmd.arg(format!("--config.file={}", config_file.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.path().join("data").display()
            ))
            .arg(format!("--web.listen-address={addr}"))
            .stdin(Stdio::null())
            .stdout(Stdio::from(log.try_clone().unwrap()))
            .stderr(Stdio::from(log));
        let child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("spawn {}: {e}", bin.display()));
        let mut prometheus = Prometheus { child, addr, dir };
        wait_until("Prometheus to be ready", Duration::from_secs(30), || {
            if let Ok(Some(status)) = prometheus.child.try_wait() {
                panic!("prometheus exited with {status}:\n{}", prometheus.log());
            }
            matches!(prometheus.get("/-/ready"), Ok((200, _))).then_some(())
        });
        prometheus
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("prometheus.log")).unwrap_or_default()
    }

    /// `GET path` as HTTP/1.0, so that the answer is neither chunked nor
    /// kept alive: the status and the body.
    fn get(&self, path: &str) -> anyhow::Result<(u16, String)> {
        let mut stream = TcpStream::connect_timeout(&self.addr, Duration::from_secs(2))?;
        stream.set_read_timeout(Some(Duration::from_secs(10)))?;
        write!(stream, "GET {path} HTTP/1.0\r\nHost: {}\r\n\r\n", self.addr)?;
        let mut text = String::new();
        stream.read_to_string(&mut text)?;
        let (head, body) = text
            .split_once("\r\n\r\n")
            .ok_or_else(|| anyhow::anyhow!("no end of headers: {text:?}"))?;
        let status = head
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| anyhow::anyhow!("no status: {head:?}"))?;
        Ok((status, body.to_string()))
    }

    /// The `data` of an API answer.
    fn api(&self, path: &str) -> Value {
        let (status, body) = self
            .get(path)
            .unwrap_or_else(|e| panic!("GET {path}: {e:#}"));
        assert_eq!(status, 200, "GET {path}: {body}");
        let answer: Value = serde_json::from_str(&body).expect("an API answer is JSON");
        assert_eq!(answer["status"], "success", "{body}");
        answer["data"].clone()
    }

    /// The value of an instant query whose result is one series; `None`
    /// when it has none (a metric no target exposes).
    fn query(&self, promql: &str) -> Option<f64> {
        let data = self.api(&format!("/api/v1/query?query={}", url_encode(promql)));
        let result = data["result"].as_array().expect("a vector");
        assert!(result.len() <= 1, "{promql}: more than one series: {data}");
        let value = result.first()?["value"][1].as_str()?;
        Some(value.parse().expect("a sample value"))
    }

    /// Waits until `promql` is `expected`; fails with its last value.
    fn wait_for(&self, promql: &str, expected: f64, timeout: Duration) {
        let mut last = None;
        let reached = try_wait_until(timeout, || {
            last = self.query(promql);
            (last == Some(expected)).then_some(())
        });
        assert!(
            reached.is_some(),
            "`{promql}` was not {expected} within {timeout:?}; last value {last:?}"
        );
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("----- prometheus log -----\n{}\n-----", self.log());
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn url_encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// A SIGSTOPped process, continued on drop (a failing test leaves no
/// stopped node behind).
struct Stopped(Pid);

impl Stopped {
    fn stop(pid: u32) -> Stopped {
        let pid = Pid::from_raw(i32::try_from(pid).unwrap());
        kill(pid, Signal::SIGSTOP).unwrap();
        Stopped(pid)
    }
}

impl Drop for Stopped {
    fn drop(&mut self) {
        let _ = kill(self.0, Signal::SIGCONT);
    }
}

/// Produces `n` records to `topic` with librdkafka (idempotent, acks=all)
/// and waits for every acknowledgement.
fn produce_acknowledged(bootstrap: &str, topic: &str, n: usize) {
    let producer: FutureProducer = idempotent_producer_config(bootstrap)
        .create()
        .expect("create a producer");
    let deliveries: Vec<_> = (0..n)
        .map(|i| {
            let value = format!("record-{i}");
            producer
                .send_result(FutureRecord::<(), _>::to(topic).payload(&value))
                .unwrap_or_else(|(e, _)| panic!("enqueue record {i}: {e}"))
        })
        .collect();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    for (i, delivery) in deliveries.into_iter().enumerate() {
        match rt.block_on(delivery) {
            Ok(Ok(_)) => {}
            Ok(Err((e, _))) => panic!("record {i} not acknowledged: {e}"),
            Err(_) => panic!("record {i}: the producer dropped its delivery report"),
        }
    }
}

#[test]
fn cluster_scraped_by_prometheus_shows_traffic_controller_and_under_replication() {
    const RECORDS: usize = 200;
    // A follower leaves the ISR 2 s after it stops fetching.
    let mut cluster = SamsaCluster::start(3, &["replica_lag_time_max_ms=2000"]);
    let targets = cluster
        .ids()
        .iter()
        .map(|id| format!("'127.0.0.1:{}'", cluster.node(*id).http_port))
        .collect::<Vec<_>>()
        .join(", ");
    let prometheus = Prometheus::start(&format!(
        "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n  evaluation_interval: 1s\n\
         rule_files:\n  - '{}'\n\
         scrape_configs:\n  - job_name: samsa\n    static_configs:\n      - targets: [{targets}]\n",
        repo_root().join(ALERTS).display()
    ));

    // Prometheus's own parser takes every node's page: each target is up
    // with no scrape error.
    let mut last = Value::Null;
    let scraped = try_wait_until(Duration::from_secs(30), || {
        last = prometheus.api("/api/v1/targets");
        let active = last["activeTargets"].as_array()?;
        (active.len() == 3
            && active
                .iter()
                .all(|t| t["health"] == "up" && t["lastError"] == ""))
        .then_some(())
    });
    assert!(
        scraped.is_some(),
        "targets not all up without error: {last:#}"
    );

    // The rules load and evaluate without an error.
    let alerts = std::fs::read_to_string(repo_root().join(ALERTS)).unwrap();
    let rule_count = rule_expressions(&alerts).len();
    let evaluated = try_wait_until(Duration::from_secs(30), || {
        last = prometheus.api("/api/v1/rules");
        let rules: Vec<&Value> = last["groups"]
            .as_array()?
            .iter()
            .filter(|g| g["name"] == "samsa")
            .flat_map(|g| g["rules"].as_array().into_iter().flatten())
            .collect();
        (rules.len() == rule_count
            && rules
                .iter()
                .all(|r| r["health"] == "ok" && r["lastError"].as_str().unwrap_or("").is_empty()))
        .then_some(())
    });
    assert!(
        evaluated.is_some(),
        "the {rule_count} rules of {ALERTS} did not all evaluate without error: {last:#}"
    );

    // Traffic is counted where it is appended, on the partition's leader:
    // the sum over the cluster is what was produced.
    let topic = unique_topic("monitored");
    let mut client = cluster.client(1);
    create_replicated_topic(&mut client, &topic, 1, 3);
    let (leader, _) = wait_until("a full ISR", Duration::from_secs(20), || {
        leader_and_isr(&mut client, &topic)?
            .into_iter()
            .next()
            .filter(|(leader, isr)| *leader > 0 && isr == &[1, 2, 3])
    });
    produce_acknowledged(&cluster.bootstrap(), &topic, RECORDS);
    prometheus.wait_for(
        &format!("sum(samsa_topic_records_in_total{{topic=\"{topic}\"}})"),
        RECORDS as f64,
        Duration::from_secs(30),
    );

    prometheus.wait_for("sum(samsa_controller_active)", 1.0, Duration::from_secs(30));

    // The names only a cluster has, on the nodes' pages (the leader has a
    // lag series per follower once they fetched).
    let referenced = referenced_names();
    let mut exposed = BTreeSet::new();
    let complete = try_wait_until(Duration::from_secs(10), || {
        exposed = cluster
            .ids()
            .iter()
            .flat_map(|id| exposed_names(&scrape(cluster.node(*id).http_addr())))
            .collect();
        missing(&referenced, &exposed, cluster_only)
            .is_empty()
            .then_some(())
    });
    if complete.is_none() {
        let absent = missing(&referenced, &exposed, cluster_only);
        panic!(
            "{} metric names of the dashboard or the rules are not on the cluster's pages:\n{}",
            absent.len(),
            report(&absent)
        );
    }

    // A stopped follower: one under-replicated partition (reported by its
    // leader) once it has left the ISR, none once it is back. The follower
    // is not the active controller, which keeps the quorum's leader.
    prometheus.wait_for(
        "sum(samsa_under_replicated_partitions)",
        0.0,
        Duration::from_secs(30),
    );
    let controller = cluster.wait_leader(Duration::from_secs(20));
    let follower = cluster
        .ids()
        .into_iter()
        .find(|id| *id != leader && *id != controller)
        .expect("a follower that is not the active controller");
    let stopped = Stopped::stop(cluster.pid(follower).expect("the follower runs"));
    prometheus.wait_for(
        "sum(samsa_under_replicated_partitions)",
        1.0,
        Duration::from_secs(60),
    );
    drop(stopped);
    prometheus.wait_for(
        "sum(samsa_under_replicated_partitions)",
        0.0,
        Duration::from_secs(60),
    );
    let mut client = cluster.client(leader);
    wait_until(
        "the follower back in the ISR",
        Duration::from_secs(30),
        || {
            leader_and_isr(&mut client, &topic)?
                .into_iter()
                .next()
                .filter(|(_, isr)| isr == &[1, 2, 3])
        },
    );
    println!(
        "node {follower} stopped and resumed: Prometheus saw the under-replicated partition come and go"
    );
}

#[test]
fn metric_names_are_read_from_promql_and_rule_files() {
    let names = metric_names(
        "histogram_quantile(0.99, sum by (api, le) (rate(samsa_kafka_request_duration_seconds_bucket\
         {instance=~\"$instance\", samsa_label=\"samsa_in_a_string\"}[$__rate_interval]))) > 0.5e1 \
         and on (job) samsa_broker_ready == 0 or absent(samsa_controller_active) / process_open_fds",
    );
    let expected = [
        "process_open_fds",
        "samsa_broker_ready",
        "samsa_controller_active",
        "samsa_kafka_request_duration_seconds_bucket",
    ];
    assert_eq!(names, expected.iter().map(|s| s.to_string()).collect());
    assert_eq!(
        without_grafana_variables("rate(x{i=~\"$instance\",g=~\"${group}\"}[$__rate_interval])"),
        "rate(x{i=~\".*\",g=~\".*\"}[1m])"
    );
    let rules = "groups:\n  - name: g\n    rules:\n      - alert: A\n        expr: a > 0\n\
                 \x20       for: 1m\n      - record: b\n        expr: |\n          sum(\n            b)\n\
                 \x20       labels: {}\n";
    assert_eq!(rule_expressions(rules), ["a > 0", "sum(\nb)"]);
}
