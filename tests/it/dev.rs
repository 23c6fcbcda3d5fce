//! `samsa dev --nodes 3` as a supervisor of one `samsa server` process per
//! node: the banner names each node's pid, `ready` comes only once every
//! node lists all brokers, a killed node is reported (and started again with
//! `--restart-killed`) while the others keep serving, SIGTERM stops them all.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use kafka_protocol::messages::create_topics_request::{CreatableTopic, CreateTopicsRequest};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use rdkafka::producer::Producer;
use samsa_tests::checker::SharedChecker;
use samsa_tests::client::topic_name;
use samsa_tests::node::{free_dev_ports, samsa_bin};
use samsa_tests::rdk::{
    acked_count, checking_producer, consume_to_end, idempotent_producer_config, send_checked,
};
use samsa_tests::wait::try_wait_until;
use samsa_tests::{unique_topic, wait_until, EosChecker, KafkaClient};

const NODES: u16 = 3;
const START_TIMEOUT: Duration = Duration::from_secs(60);

/// A running `samsa dev --nodes 3`: its stdout and stderr go to files in a
/// temporary directory, which also holds the data. Dropping it SIGKILLs the
/// supervisor and every node pid it has seen (printing the output first if
/// the test failed).
struct Dev {
    child: Option<Child>,
    dir: tempfile::TempDir,
    kafka: u16,
    started: Instant,
    /// Every node pid seen in the banner or in a "restarted" line.
    seen_pids: BTreeSet<u32>,
}

impl Dev {
    fn start(extra: &[&str]) -> Dev {
        let dir = tempfile::Builder::new()
            .prefix("samsa-dev-test-")
            .tempdir()
            .unwrap();
        let (kafka, controller, http) = free_dev_ports(NODES);
        let out = std::fs::File::create(dir.path().join("stdout")).unwrap();
        let err = std::fs::File::create(dir.path().join("stderr")).unwrap();
        let started = Instant::now();
        let child = Command::new(samsa_bin())
            .args(["dev", "--nodes", &NODES.to_string()])
            .args(["--port", &kafka.to_string()])
            .args(["--controller-port", &controller.to_string()])
            .args(["--http-port", &http.to_string()])
            .arg("--data-dir")
            .arg(dir.path().join("data"))
            .args(["--set", "broker_session_timeout_ms=3000"])
            .args(extra)
            .env("RUST_LOG", "info,openraft=warn")
            .stdin(Stdio::null())
            .stdout(Stdio::from(out))
            .stderr(Stdio::from(err))
            .spawn()
            .unwrap();
        Dev {
            child: Some(child),
            dir,
            kafka,
            started,
            seen_pids: BTreeSet::new(),
        }
    }

    fn stdout(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("stdout")).unwrap_or_default()
    }

    fn stderr(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("stderr")).unwrap_or_default()
    }

    fn is_ready(&self) -> bool {
        self.stdout().lines().any(|l| l == "ready")
    }

    /// Node id → pid, from the banner's node table.
    fn banner_pids(&mut self) -> BTreeMap<i32, u32> {
        let out = self.stdout();
        let pids: BTreeMap<i32, u32> = out
            .lines()
            .skip_while(|l| !l.trim_start().starts_with("Node  PID"))
            .skip(1)
            .take_while(|l| !l.trim().is_empty())
            .map(|l| {
                let mut fields = l.split_whitespace();
                let id = fields.next().unwrap().parse().unwrap();
                let pid = fields.next().unwrap().parse().unwrap();
                (id, pid)
            })
            .collect();
        self.seen_pids.extend(pids.values());
        pids
    }

    fn addr(&self, node: i32) -> SocketAddr {
        let offset = u16::try_from(node - 1).unwrap() * 100;
        SocketAddr::from(([127, 0, 0, 1], self.kafka + offset))
    }

    fn bootstrap(&self, nodes: &[i32]) -> String {
        nodes
            .iter()
            .map(|n| self.addr(*n).to_string())
            .collect::<Vec<_>>()
            .join(",")
    }

    fn log_path(&self, node: i32) -> PathBuf {
        self.dir
            .path()
            .join("data")
            .join(format!("node-{node}"))
            .join("samsa.log")
    }

    fn supervisor_pid(&self) -> u32 {
        self.child.as_ref().unwrap().id()
    }

    /// Waits for the supervisor to exit.
    fn wait_exit(&mut self, timeout: Duration) -> ExitStatus {
        let child = self.child.as_mut().unwrap();
        let status = try_wait_until(timeout, || child.try_wait().ok().flatten())
            .unwrap_or_else(|| panic!("samsa dev did not exit within {timeout:?}"));
        self.child = None;
        status
    }

    /// Waits until stderr has a line containing `needle`; returns that line.
    fn wait_stderr(&self, needle: &str, timeout: Duration) -> String {
        wait_until(&format!("stderr line `{needle}`"), timeout, || {
            self.stderr()
                .lines()
                .find(|l| l.contains(needle))
                .map(str::to_string)
        })
    }
}

impl Drop for Dev {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!(
                "----- samsa dev stdout -----\n{}\n----- stderr -----\n{}",
                self.stdout(),
                self.stderr()
            );
            for n in 1..=i32::from(NODES) {
                let log = std::fs::read_to_string(self.log_path(n)).unwrap_or_default();
                let lines: Vec<&str> = log.lines().collect();
                let tail = &lines[lines.len().saturating_sub(60)..];
                eprintln!("----- node {n} log (tail) -----\n{}", tail.join("\n"));
            }
        }
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        // The nodes die with the supervisor (PR_SET_PDEATHSIG); a node whose
        // pid is still alive is killed here as well, in case that failed.
        for pid in &self.seen_pids {
            if alive(*pid) {
                let _ = kill(as_pid(*pid), Signal::SIGKILL);
            }
        }
    }
}

fn as_pid(pid: u32) -> Pid {
    Pid::from_raw(i32::try_from(pid).unwrap())
}

/// Whether a process with this pid exists (and is not a zombie).
fn alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // The state follows the parenthesised command name.
        Ok(stat) => stat
            .rsplit_once(") ")
            .is_some_and(|(_, rest)| !rest.starts_with('Z')),
        Err(_) => false,
    }
}

fn cmdline(pid: u32) -> String {
    std::fs::read(format!("/proc/{pid}/cmdline"))
        .map(|b| String::from_utf8_lossy(&b).replace('\0', " "))
        .unwrap_or_default()
}

/// Broker ids in node `addr`'s Metadata answer, or `None` if it does not
/// answer within `timeout` (refused, or not accepting yet).
fn broker_ids(addr: SocketAddr, timeout: Duration) -> Option<BTreeSet<i32>> {
    let mut c = KafkaClient::connect_with_timeout(addr, timeout).ok()?;
    c.set_read_timeout(Some(timeout)).ok()?;
    c.api_versions().ok()?;
    let md = c.metadata(Some(&[])).ok()?;
    Some(md.brokers.iter().map(|b| b.node_id.0).collect())
}

/// Waits for `ready` on stdout, meanwhile asking every node for Metadata as
/// often as it can: a node answers only once it is registered, caught up
/// and unfenced, so any answer lists at least the node itself. Returns the
/// time from spawn to `ready` and how many answers listed fewer than all
/// brokers.
fn wait_ready_watching_metadata(dev: &Dev) -> (Duration, usize) {
    let all: BTreeSet<i32> = (1..=i32::from(NODES)).collect();
    let mut incomplete = 0;
    let mut answers = 0;
    let elapsed = wait_until("`ready` on stdout", START_TIMEOUT, || {
        if dev.is_ready() {
            return Some(dev.started.elapsed());
        }
        for n in &all {
            if let Some(ids) = broker_ids(dev.addr(*n), Duration::from_millis(200)) {
                answers += 1;
                assert!(
                    ids.contains(n),
                    "node {n} answered Metadata before it lists itself: {ids:?}"
                );
                if ids != all {
                    incomplete += 1;
                }
            }
        }
        None
    });
    println!(
        "samsa dev --nodes {NODES}: ready after {elapsed:?}; {answers} Metadata answers \
         before ready, {incomplete} of them listing fewer than {NODES} brokers"
    );
    // Once `ready` is printed, every node lists every broker, at once.
    for n in &all {
        assert_eq!(
            broker_ids(dev.addr(*n), Duration::from_secs(5)).as_ref(),
            Some(&all),
            "node {n} right after ready"
        );
    }
    (elapsed, incomplete)
}

/// Creates `topic` with 3 partitions of 3 replicas through node 1.
fn create_rf3_topic(dev: &Dev, topic: &str) {
    let mut c = KafkaClient::connect(dev.addr(1)).unwrap();
    let req = CreateTopicsRequest::default()
        .with_topics(vec![CreatableTopic::default()
            .with_name(topic_name(topic))
            .with_num_partitions(3)
            .with_replication_factor(3)])
        .with_timeout_ms(30_000);
    let resp = c.call(&req).unwrap();
    assert_eq!(
        resp.topics[0].error_code, 0,
        "CreateTopics {topic}: {resp:?}"
    );
}

/// Waits until node `from` reports a leader among `live` for every
/// partition of `topic`, and only `live` as brokers.
fn wait_leaders_among(dev: &Dev, from: i32, topic: &str, live: &[i32], timeout: Duration) {
    let live_set: BTreeSet<i32> = live.iter().copied().collect();
    wait_until(
        &format!("node {from} to list brokers {live:?} leading every partition of {topic}"),
        timeout,
        || {
            let mut c = KafkaClient::connect(dev.addr(from)).ok()?;
            let md = c.metadata(Some(&[topic])).ok()?;
            let brokers: BTreeSet<i32> = md.brokers.iter().map(|b| b.node_id.0).collect();
            let t = md.topics.first()?;
            let ok = brokers == live_set
                && t.error_code == 0
                && t.partitions.len() == 3
                && t.partitions
                    .iter()
                    .all(|p| p.error_code == 0 && live_set.contains(&p.leader_id.0));
            ok.then_some(())
        },
    );
}

/// Produces `values` with an idempotent acks=all producer, waits for every
/// delivery, and returns how many were acknowledged.
fn produce_all(bootstrap: &str, topic: &str, values: &[String], checker: &SharedChecker) -> u64 {
    let producer = checking_producer(&idempotent_producer_config(bootstrap), checker.clone());
    for v in values {
        send_checked(&producer, "p", topic, None, v.as_bytes()).unwrap();
    }
    producer.flush(Duration::from_secs(120)).unwrap();
    producer.context().acked.load(Ordering::Relaxed)
}

fn read_back(bootstrap: &str, topic: &str, checker: &SharedChecker) {
    consume_to_end(bootstrap, topic, 3, Duration::from_secs(60), |p, o, v| {
        checker.lock().unwrap().read(p, o, v);
    })
    .unwrap();
    checker.lock().unwrap().check().assert_ok();
}

/// Without `--restart-killed`: each node is its own process; a SIGKILLed
/// node is reported and stays down while the other two keep serving an RF=3
/// topic (its partitions fail over); once every node is gone the supervisor
/// exits with a failure.
#[test]
fn dev_nodes_are_processes_and_a_killed_node_stays_down() {
    let mut dev = Dev::start(&[]);
    wait_ready_watching_metadata(&dev);
    let pids = dev.banner_pids();
    assert_eq!(pids.keys().copied().collect::<Vec<_>>(), [1, 2, 3]);
    let supervisor = dev.supervisor_pid();
    for (id, pid) in &pids {
        assert_ne!(*pid, supervisor);
        assert!(alive(*pid), "node {id} (pid {pid}) is not running");
        let cmd = cmdline(*pid);
        assert!(
            cmd.contains(" server --config ") && cmd.contains(&format!("node-{id}")),
            "node {id}: {cmd}"
        );
        let log = std::fs::read_to_string(dev.log_path(*id)).unwrap();
        assert!(
            log.contains("starting samsa broker"),
            "node {id} log:\n{log}"
        );
    }

    let topic = unique_topic("dev-procs");
    create_rf3_topic(&dev, &topic);
    wait_leaders_among(&dev, 1, &topic, &[1, 2, 3], Duration::from_secs(30));
    let checker = EosChecker::shared();
    let first: Vec<String> = (0..200).map(|i| format!("before-{i}")).collect();
    assert_eq!(
        produce_all(&dev.bootstrap(&[1, 2, 3]), &topic, &first, &checker),
        200
    );

    let killed = pids[&2];
    kill(as_pid(killed), Signal::SIGKILL).unwrap();
    dev.wait_stderr(
        &format!("node 2 (pid {killed}) was killed by signal 9"),
        Duration::from_secs(30),
    );
    assert!(!alive(killed));
    assert!(alive(pids[&1]) && alive(pids[&3]));
    assert!(!dev.stderr().contains("restarted node"), "{}", dev.stderr());
    // The other two fence node 2 after its session timeout and lead every
    // partition; acks=all records are acknowledged by the two replicas left.
    wait_leaders_among(&dev, 1, &topic, &[1, 3], Duration::from_secs(60));
    let bootstrap = dev.bootstrap(&[1, 3]);
    let second: Vec<String> = (0..200).map(|i| format!("after-{i}")).collect();
    assert_eq!(produce_all(&bootstrap, &topic, &second, &checker), 200);
    read_back(&bootstrap, &topic, &checker);

    for id in [1, 3] {
        kill(as_pid(pids[&id]), Signal::SIGKILL).unwrap();
    }
    let status = dev.wait_exit(Duration::from_secs(30));
    assert!(!status.success(), "samsa dev exited with {status}");
    let err = dev.stderr();
    assert!(err.contains("every node has stopped"), "{err}");
    for id in [1, 3] {
        assert!(
            err.contains(&format!(
                "node {id} (pid {}) was killed by signal 9",
                pids[&id]
            )),
            "{err}"
        );
    }
}

/// With `--restart-killed`: a node SIGKILLed while a producer writes is
/// started again (a new pid), rejoins (every node lists 3 brokers again),
/// and every acknowledged record is read back exactly once; SIGTERM to the
/// supervisor stops every node and it exits 0.
#[test]
fn dev_restarts_a_killed_node_and_sigterm_stops_all() {
    let mut dev = Dev::start(&["--restart-killed"]);
    wait_ready_watching_metadata(&dev);
    let pids = dev.banner_pids();
    let topic = unique_topic("dev-restart");
    create_rf3_topic(&dev, &topic);
    wait_leaders_among(&dev, 1, &topic, &[1, 2, 3], Duration::from_secs(30));

    let checker = EosChecker::shared();
    let bootstrap = dev.bootstrap(&[1, 2, 3]);
    let producer = Arc::new(checking_producer(
        &idempotent_producer_config(&bootstrap),
        checker.clone(),
    ));
    // The writer sends in rounds of 50 and waits for each round's
    // deliveries, until told to stop: the kill below lands while records
    // are in flight, and writes go on through the restart.
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let (producer, topic, stop) = (Arc::clone(&producer), topic.clone(), Arc::clone(&stop));
        std::thread::spawn(move || {
            let mut sent = 0u64;
            while !stop.load(Ordering::Relaxed) {
                for _ in 0..50 {
                    send_checked(&producer, "p", &topic, None, format!("r-{sent}").as_bytes())
                        .unwrap();
                    sent += 1;
                }
                producer.flush(Duration::from_secs(120)).unwrap();
            }
            sent
        })
    };
    wait_until("500 acknowledged records", Duration::from_secs(60), || {
        (acked_count(&producer) >= 500).then_some(())
    });
    let killed = pids[&2];
    kill(as_pid(killed), Signal::SIGKILL).unwrap();
    dev.wait_stderr(
        &format!("node 2 (pid {killed}) was killed by signal 9"),
        Duration::from_secs(30),
    );
    let line = dev.wait_stderr("restarted node 2 (pid ", Duration::from_secs(30));
    let new_pid: u32 = line
        .trim_start_matches("restarted node 2 (pid ")
        .trim_end_matches(')')
        .parse()
        .unwrap();
    dev.seen_pids.insert(new_pid);
    assert_ne!(new_pid, killed);
    assert!(alive(new_pid));
    assert!(cmdline(new_pid).contains("node-2"), "{}", cmdline(new_pid));
    let all: BTreeSet<i32> = [1, 2, 3].into();
    for n in 1..=3 {
        wait_until(
            &format!("node {n} to list 3 brokers after the restart"),
            Duration::from_secs(60),
            || (broker_ids(dev.addr(n), Duration::from_secs(2))? == all).then_some(()),
        );
    }
    // Some rounds after the node came back, so that node 2 leads again or
    // follows with the records written while it was down.
    let acked_at_rejoin = acked_count(&producer);
    wait_until(
        "500 more acknowledged records",
        Duration::from_secs(60),
        || (acked_count(&producer) >= acked_at_rejoin + 500).then_some(()),
    );
    stop.store(true, Ordering::Relaxed);
    let sent = writer.join().unwrap();
    assert_eq!(acked_count(&producer), sent, "every record is acknowledged");
    read_back(&bootstrap, &topic, &checker);

    let stderr_before = dev.stderr();
    kill(as_pid(dev.supervisor_pid()), Signal::SIGTERM).unwrap();
    let status = dev.wait_exit(Duration::from_secs(90));
    let err = dev.stderr();
    assert!(status.success(), "samsa dev exited with {status}\n{err}");
    assert!(err.contains("samsa dev cluster stopped cleanly"), "{err}");
    assert!(!err[stderr_before.len()..].contains("was killed"), "{err}");
    for pid in [pids[&1], new_pid, pids[&3]] {
        assert!(!alive(pid), "pid {pid} still runs after samsa dev exited");
    }
}

/// A supervisor killed with SIGKILL (no chance to stop its nodes) takes its
/// nodes with it: the kernel kills them (`PR_SET_PDEATHSIG`).
#[test]
fn dev_nodes_die_with_a_sigkilled_supervisor() {
    let mut dev = Dev::start(&[]);
    wait_until("`ready` on stdout", START_TIMEOUT, || {
        dev.is_ready().then_some(())
    });
    let pids = dev.banner_pids();
    assert!(pids.values().all(|pid| alive(*pid)));
    let mut supervisor = dev.child.take().unwrap();
    supervisor.kill().unwrap();
    supervisor.wait().unwrap();
    wait_until(
        "every node to die with the supervisor",
        Duration::from_secs(10),
        || pids.values().all(|pid| !alive(*pid)).then_some(()),
    );
}
