//! The broker's log as an operator reads it: JSON lines carrying their
//! spans' fields with `log_format = "json"`, and openraft's warnings held
//! to one line per call site per window while a voter is down (before,
//! the leader logged one per metadata write and two every 500 ms).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use samsa_tests::cluster::SamsaCluster;
use samsa_tests::rdk::create_topic_admin;
use samsa_tests::wait::try_wait_until;
use samsa_tests::{unique_topic, SamsaNode};

/// The window of `crates/samsa/src/logging.rs`.
const OPENRAFT_WINDOW: Duration = Duration::from_secs(10);

#[test]
fn json_lines_carry_the_fields_of_their_spans() {
    let node = SamsaNode::start_with(&["log_format=json"]);
    let topic = unique_topic("json-log");
    create_topic_admin(&node.bootstrap(), &topic, 1).unwrap();
    let text = std::fs::read_to_string(node.log_path()).unwrap();
    let lines: Vec<serde_json::Value> = text
        .lines()
        .filter(|l| !l.is_empty() && !l.starts_with("====="))
        .map(|l| {
            serde_json::from_str(l).unwrap_or_else(|e| panic!("not a JSON line ({e}): {l}\n{text}"))
        })
        .collect();
    assert!(lines.len() > 3, "{text}");
    for line in &lines {
        assert!(
            line["timestamp"].is_string()
                && line["level"].is_string()
                && line["fields"].is_object(),
            "{line}"
        );
    }
    // The creation is logged inside the request's connection span, whose
    // fields name the node and the listener.
    let created = lines
        .iter()
        .find(|l| {
            l["fields"]["message"] == "topic created" && l["fields"]["topic"] == topic.as_str()
        })
        .unwrap_or_else(|| panic!("no 'topic created' line for {topic}\n{text}"));
    let spans = created["spans"].as_array().expect("a span list");
    assert!(
        spans
            .iter()
            .any(|s| s["name"] == "conn" && s["node"] == 1 && s["listener"] == "PLAINTEXT"),
        "{created}"
    );
}

/// The module path of an openraft WARN or ERROR line of a text log.
fn openraft_site(line: &str) -> Option<&str> {
    let mut words = line.split_whitespace();
    let _time = words.next()?;
    let level = words.next()?;
    if level != "WARN" && level != "ERROR" {
        return None;
    }
    // Spans (`node{node_id=1}:`) come before the target; the target is the
    // word that starts with openraft and ends with ':'.
    words
        .find(|w| w.starts_with("openraft") && w.ends_with(':'))
        .map(|w| w.trim_end_matches(':'))
}

#[test]
fn cluster_openraft_warnings_are_held_to_one_line_per_site_per_window() {
    let mut cluster = SamsaCluster::start(3, &[]);
    let leader = cluster.wait_leader(Duration::from_secs(30));
    let down = cluster.ids().into_iter().find(|&id| id != leader).unwrap();
    let bootstrap: String = cluster
        .ids()
        .into_iter()
        .filter(|&id| id != down)
        .map(|id| cluster.node(id).bootstrap())
        .collect::<Vec<_>>()
        .join(",");
    let log = cluster.node(leader).log_path();
    let before = std::fs::read_to_string(&log).unwrap().len();
    cluster.sigkill(down);
    let started = Instant::now();
    // Metadata writes while the voter is down, until a call site has been
    // held back for a whole window and says so.
    let mut n = 0;
    let held_back = try_wait_until(3 * OPENRAFT_WINDOW, || {
        n += 1;
        let _ = create_topic_admin(&bootstrap, &unique_topic(&format!("flood-{n}")), 1);
        let text = std::fs::read_to_string(&log).ok()?;
        text[before..]
            .lines()
            .any(|l| l.contains("samsa::logging:") && l.contains("held back"))
            .then_some(())
    });
    let elapsed = started.elapsed();
    let text = std::fs::read_to_string(&log).unwrap();
    let fresh = &text[before..];
    assert!(
        held_back.is_some(),
        "no openraft lines held back within {elapsed:?} of a voter's death:\n{fresh}"
    );
    let mut per_site: BTreeMap<&str, usize> = BTreeMap::new();
    for site in fresh.lines().filter_map(openraft_site) {
        *per_site.entry(site).or_default() += 1;
    }
    // A site speaks once when it starts and once more per window passed
    // (sites sharing a module path count together, hence the slack).
    let windows = (elapsed.as_secs_f64() / OPENRAFT_WINDOW.as_secs_f64()).ceil() as usize;
    let bound = 3 * (windows + 1);
    assert!(
        per_site.values().all(|&n| n <= bound),
        "openraft lines per module in {elapsed:?} ({n} metadata writes): {per_site:?}, bound {bound}\n{fresh}"
    );
}
