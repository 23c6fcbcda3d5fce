//! `ComposeCluster`: the three-node cluster of `deploy/compose.yaml` run
//! for real with Docker Compose, for the container tests
//! (`tests/containers/`).
//!
//! - The image is `$SAMSA_IMAGE`, else one built once per test run with
//!   `deploy/build-image.sh` from `target/release/samsa` ([`test_image`]:
//!   a lock file and a stamp under `target/` so that concurrent tests build
//!   it once). A missing Docker, compose tool or binary fails the test; it
//!   is never skipped.
//! - Each cluster is a compose project of its own, `samsa-ct-<pid>-<n>`,
//!   with free host ports for the three host listeners and HTTP endpoints
//!   (`SAMSA_PORT_N`, `SAMSA_HTTP_PORT_N`) and an override file next to the
//!   compose file for the test's settings (`SAMSA_*` variables).
//! - [`ComposeCluster::up`] returns once every container is healthy (the
//!   compose health check: `samsa health`, i.e. `/readyz`) and Metadata
//!   through every host listener lists three brokers.
//! - Faults: `docker kill` (SIGKILL), `pause`/`unpause`, `stop`, `start`,
//!   `restart`; the project's `down` (volumes kept) and `up` again; a
//!   node's volume removed.
//! - Dropping the cluster runs `down -v` (containers, network, volumes) and
//!   removes the helper containers it ran; if the thread is panicking, the
//!   logs of every container are printed first.
//!
//! The compose tool is `docker compose` if `docker compose version` works,
//! else `docker-compose` (1.28 or later: the compose file has a profile).

use std::collections::BTreeMap;
use std::fs::File;
use std::io::Write;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use kafka_protocol::messages::create_topics_request::{
    CreatableReplicaAssignment, CreatableTopic, CreatableTopicConfig,
};
use kafka_protocol::messages::{BrokerId, CreateTopicsRequest};
use kafka_protocol::protocol::StrBytes;
use tempfile::TempDir;

use crate::client::{topic_name, KafkaClient};
use crate::node::free_port;
use crate::wait::wait_until;

/// Services of `deploy/compose.yaml`, in node order: `samsa-N` is node N + 1.
pub const SERVICES: [&str; 3] = ["samsa-0", "samsa-1", "samsa-2"];

/// How long a node may take to become healthy after `up` or `start`.
pub const READY_TIMEOUT: Duration = Duration::from_secs(90);

/// Settings every container test starts from (as `SAMSA_*` variables):
/// failures detected in seconds, as in `cluster::FAST_SETTINGS`, with
/// sessions of 5 s (a loaded 2-core machine delays heartbeats of live
/// brokers; see `it/failover.rs`) and followers out of the ISR after 3 s
/// without catching up.
pub const TEST_SETTINGS: &[(&str, &str)] = &[
    ("SAMSA_BROKER_SESSION_TIMEOUT_MS", "5000"),
    ("SAMSA_BROKER_HEARTBEAT_INTERVAL_MS", "500"),
    ("SAMSA_CONTROLLER_REQUEST_TIMEOUT_MS", "5000"),
    ("SAMSA_REPLICA_LAG_TIME_MAX_MS", "3000"),
    ("SAMSA_REPLICA_FETCH_WAIT_MAX_MS", "200"),
    ("SAMSA_GROUP_INITIAL_REBALANCE_DELAY_MS", "0"),
];

/// The repository root (the parent of `tests/`).
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ has a parent")
        .to_path_buf()
}

fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo_root().join("target"))
}

/// Runs `program args` to its exit; panics if it cannot be started.
fn run(program: &str, args: &[&str], envs: &[(String, String)]) -> Output {
    Command::new(program)
        .args(args)
        .envs(envs.iter().map(|(k, v)| (k.as_str(), v.as_str())))
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("cannot run {program}: {e} (is Docker installed?)"))
}

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// `docker ARGS`, which must succeed; returns its stdout.
pub fn docker(args: &[&str]) -> String {
    let out = run("docker", args, &[]);
    assert!(
        out.status.success(),
        "docker {} failed: {}",
        args.join(" "),
        text(&out)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The compose command: `docker compose` if that works, else `docker-compose`.
pub fn compose_command() -> &'static [String] {
    static CMD: OnceLock<Vec<String>> = OnceLock::new();
    CMD.get_or_init(|| {
        let v2 = Command::new("docker")
            .args(["compose", "version"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if v2 {
            vec!["docker".into(), "compose".into()]
        } else {
            let v1 = Command::new("docker-compose")
                .arg("version")
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success());
            assert!(
                v1,
                "neither `docker compose` nor `docker-compose` works: the container tests need one"
            );
            vec!["docker-compose".into()]
        }
    })
}

/// The image under test: `$SAMSA_IMAGE` (which must exist), else
/// `samsa-ct:latest` built by `deploy/build-image.sh` from
/// `target/release/samsa` — once per binary: a stamp file under `target/`
/// records the binary (size and modification time) the image was built
/// from, and a lock file serialises concurrent tests.
pub fn test_image() -> String {
    static IMAGE: OnceLock<String> = OnceLock::new();
    IMAGE
        .get_or_init(|| {
            if let Ok(image) = std::env::var("SAMSA_IMAGE") {
                let out = run("docker", &["image", "inspect", &image], &[]);
                assert!(
                    out.status.success(),
                    "SAMSA_IMAGE={image} is not an image of this Docker engine: {}",
                    text(&out)
                );
                return image;
            }
            build_test_image()
        })
        .clone()
}

fn build_test_image() -> String {
    const TAG: &str = "samsa-ct:latest";
    let binary = target_dir().join("release").join("samsa");
    let meta = std::fs::metadata(&binary).unwrap_or_else(|e| {
        panic!(
            "{}: {e}; the container tests build their image from the release binary: run \
             `cargo build --release -p samsa` first, or set SAMSA_IMAGE to an image",
            binary.display()
        )
    });
    let modified = meta
        .modified()
        .ok()
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .unwrap_or_default();
    let want = format!(
        "{TAG} {} {} {}",
        binary.display(),
        meta.len(),
        modified.as_nanos()
    );
    let dir = target_dir().join("containers");
    std::fs::create_dir_all(&dir).expect("create target/containers");
    let lock = File::create(dir.join("image.lock")).expect("create the image lock file");
    // An advisory lock (flock), released when `lock` is closed.
    lock.lock().expect("lock the image lock file");
    let stamp = dir.join("image.stamp");
    let exists = run("docker", &["image", "inspect", TAG], &[])
        .status
        .success();
    if exists && std::fs::read_to_string(&stamp).is_ok_and(|s| s == want) {
        return TAG.to_string();
    }
    let started = Instant::now();
    let script = repo_root().join("deploy").join("build-image.sh");
    let out = Command::new(&script)
        .arg(TAG)
        .env("CARGO_TARGET_DIR", target_dir())
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("run {}: {e}", script.display()));
    assert!(
        out.status.success(),
        "{} {TAG} failed:\n{}",
        script.display(),
        text(&out)
    );
    std::fs::write(&stamp, &want).expect("write the image stamp");
    eprintln!(
        "containers: built image {TAG} in {:.1} s: {}",
        started.elapsed().as_secs_f64(),
        String::from_utf8_lossy(&out.stdout).trim()
    );
    drop(lock);
    TAG.to_string()
}

/// The image's size in bytes.
pub fn image_size(image: &str) -> u64 {
    docker(&["image", "inspect", "--format", "{{.Size}}", image])
        .trim()
        .parse()
        .expect("image size")
}

/// One partition of a topic as a broker's Metadata shows it.
#[derive(Debug, Clone, PartialEq)]
pub struct PartitionState {
    pub partition: i32,
    pub leader: i32,
    pub replicas: Vec<i32>,
    /// Sorted.
    pub isr: Vec<i32>,
}

/// The compose project of one test; see the module docs.
pub struct ComposeCluster {
    project: String,
    image: String,
    /// The override file (test settings) lives here.
    dir: TempDir,
    /// Host ports of the host listeners, by node index (0..3).
    pub ports: [u16; 3],
    /// Host ports of the HTTP endpoints.
    pub http_ports: [u16; 3],
    helpers: Mutex<Vec<String>>,
    /// Mount points of the nodes' small filesystems ([`ComposeCluster::with_small_disks`]).
    disks: Vec<PathBuf>,
    /// `deploy/compose.sasl-ssl.yaml` with this certificate directory
    /// ([`ComposeCluster::start_sasl_ssl`]): the host listeners speak
    /// SASL_SSL, so readiness is the containers' health check alone.
    sasl_ssl_certs: Option<PathBuf>,
}

/// The uid:gid the image runs samsa as (deploy/Dockerfile).
const IMAGE_USER: &str = "10001:10001";

/// Runs a command on the host that must succeed.
fn host(program: &str, args: &[&str]) {
    let out = run(program, args, &[]);
    assert!(
        out.status.success(),
        "{program} {} failed: {}",
        args.join(" "),
        text(&out)
    );
}

impl ComposeCluster {
    /// A new project with [`TEST_SETTINGS`] plus `settings` (`SAMSA_*`
    /// variables for every node); nothing started yet.
    pub fn new(settings: &[(&str, &str)]) -> ComposeCluster {
        Self::new_with_disks(settings, None)
    }

    /// The cluster of `deploy/compose.sasl-ssl.yaml` over the compose file:
    /// SASL_SSL listeners, mutual TLS between the nodes, the authorizer on,
    /// with the certificates of `certs` (`node.pem`, `node.key`, `ca.pem`,
    /// as `deploy/make-certs.sh` writes them); started, every node healthy.
    pub fn start_sasl_ssl(settings: &[(&str, &str)], certs: &Path) -> ComposeCluster {
        let mut c = Self::new_with_disks(settings, None);
        c.sasl_ssl_certs = Some(certs.to_path_buf());
        let took = c.up();
        eprintln!(
            "containers: {}: SASL_SSL cluster up to all healthy in {:.1} s",
            c.project,
            took.as_secs_f64()
        );
        c
    }

    /// [`ComposeCluster::new`] with each node's data directory on a
    /// filesystem of its own of `mib` MiB (an ext4 image loop-mounted on the
    /// host, bind-mounted at /var/lib/samsa: data survives restarts, and a
    /// nemesis `disk-full` can fill it). Needs root; unmounted by Drop.
    pub fn with_small_disks(settings: &[(&str, &str)], mib: u64) -> ComposeCluster {
        let mut c = Self::new_with_disks(settings, Some(mib));
        let took = c.up();
        eprintln!(
            "containers: {}: up (data on {mib} MiB filesystems) to all ready in {:.1} s",
            c.project,
            took.as_secs_f64()
        );
        c
    }

    fn new_with_disks(settings: &[(&str, &str)], disk_mib: Option<u64>) -> ComposeCluster {
        static N: AtomicU32 = AtomicU32::new(0);
        let image = test_image();
        compose_command();
        let project = format!(
            "samsa-ct-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        );
        let dir = tempfile::Builder::new()
            .prefix("samsa-ct-")
            .tempdir()
            .expect("create temp dir");
        let ports = [free_port(), free_port(), free_port()];
        let mut disks = Vec::new();
        if let Some(mib) = disk_mib {
            for service in SERVICES {
                let image = dir.path().join(format!("{service}.ext4"));
                File::create(&image)
                    .and_then(|f| f.set_len(mib << 20))
                    .expect("create a filesystem image");
                let image = image.display().to_string();
                host("mkfs.ext4", &["-q", "-F", "-m", "0", &image]);
                let mount = dir.path().join(format!("{service}-data"));
                std::fs::create_dir(&mount).expect("create a mount point");
                let mount_s = mount.display().to_string();
                host("mount", &["-o", "loop", &image, &mount_s]);
                disks.push(mount);
                host("chown", &[IMAGE_USER, &mount_s]);
            }
        }
        let mut yaml = String::from("services:\n");
        for (i, service) in SERVICES.iter().enumerate() {
            yaml.push_str(&format!("  {service}:\n    environment:\n"));
            for (k, v) in TEST_SETTINGS.iter().chain(settings) {
                yaml.push_str(&format!("      {k}: \"{v}\"\n"));
            }
            if let Some(mount) = disks.get(i) {
                yaml.push_str(&format!(
                    "    volumes:\n      - {}:/var/lib/samsa\n",
                    mount.display()
                ));
            } else {
                // A node that exits stays down, so a test sees the exit
                // (a refused start) instead of a restart loop. On small
                // disks the compose file's `on-failure` stays: a node whose
                // controller hit the full disk stops and is restarted once
                // space is freed, as a supervisor does.
                yaml.push_str("    restart: \"no\"\n");
            }
        }
        std::fs::write(dir.path().join("override.yaml"), yaml).expect("write the override file");
        ComposeCluster {
            project,
            image,
            dir,
            ports,
            http_ports: [free_port(), free_port(), free_port()],
            helpers: Mutex::new(Vec::new()),
            disks,
            sasl_ssl_certs: None,
        }
    }

    /// [`ComposeCluster::new`] and [`ComposeCluster::up`]; prints the time
    /// from `up` to every node ready.
    pub fn start(settings: &[(&str, &str)]) -> ComposeCluster {
        let mut c = Self::new(settings);
        let took = c.up();
        eprintln!(
            "containers: {}: up to all ready in {:.1} s",
            c.project,
            took.as_secs_f64()
        );
        c
    }

    pub fn project(&self) -> &str {
        &self.project
    }

    pub fn image(&self) -> &str {
        &self.image
    }

    /// The user-defined network of the project.
    pub fn network(&self) -> String {
        format!("{}_samsa", self.project)
    }

    /// The named volume of node `index` (0..3).
    pub fn volume(&self, index: usize) -> String {
        format!("{}_{}-data", self.project, SERVICES[index])
    }

    fn env(&self) -> Vec<(String, String)> {
        let mut env = vec![("SAMSA_IMAGE".to_string(), self.image.clone())];
        if let Some(certs) = &self.sasl_ssl_certs {
            env.push(("SAMSA_CERTS_DIR".to_string(), certs.display().to_string()));
        }
        for i in 0..3 {
            env.push((format!("SAMSA_PORT_{i}"), self.ports[i].to_string()));
            env.push((
                format!("SAMSA_HTTP_PORT_{i}"),
                self.http_ports[i].to_string(),
            ));
        }
        env
    }

    /// Runs the compose tool with this project's files and `args`.
    pub fn compose_output(&self, args: &[&str]) -> Output {
        let cmd = compose_command();
        let file = repo_root().join("deploy").join("compose.yaml");
        let file = file.display().to_string();
        let over = self.dir.path().join("override.yaml").display().to_string();
        let secure = repo_root().join("deploy").join("compose.sasl-ssl.yaml");
        let secure = secure.display().to_string();
        let mut all: Vec<&str> = cmd[1..].iter().map(String::as_str).collect();
        all.extend(["-p", &self.project, "-f", &file]);
        if self.sasl_ssl_certs.is_some() {
            all.extend(["-f", &secure]);
        }
        all.extend(["-f", &over]);
        all.extend(args);
        run(&cmd[0], &all, &self.env())
    }

    /// [`ComposeCluster::compose_output`], which must succeed.
    pub fn compose(&self, args: &[&str]) -> String {
        let out = self.compose_output(args);
        assert!(
            out.status.success(),
            "compose {} failed: {}",
            args.join(" "),
            text(&out)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// `up -d`, then waits until every node is ready ([`Self::wait_ready`]);
    /// returns the time that took.
    pub fn up(&mut self) -> Duration {
        let started = Instant::now();
        self.compose(&["up", "-d"]);
        self.wait_ready();
        started.elapsed()
    }

    /// `down` without `-v`: containers and network gone, volumes kept.
    pub fn down_keep_volumes(&mut self) {
        self.compose(&["down", "-t", "10"]);
    }

    /// The container id of node `index`, running or not (empty if it has
    /// none). `-a`: Compose v2 lists only running containers without it.
    pub fn container(&self, index: usize) -> String {
        self.compose(&["ps", "-a", "-q", SERVICES[index]])
            .trim()
            .to_string()
    }

    fn container_required(&self, index: usize) -> String {
        let id = self.container(index);
        assert!(!id.is_empty(), "{} has no container", SERVICES[index]);
        id
    }

    /// `docker kill` (SIGKILL) of node `index`.
    pub fn kill(&self, index: usize) {
        docker(&["kill", &self.container_required(index)]);
    }

    pub fn pause(&self, index: usize) {
        docker(&["pause", &self.container_required(index)]);
    }

    pub fn unpause(&self, index: usize) {
        docker(&["unpause", &self.container_required(index)]);
    }

    /// `docker stop` (SIGTERM, then SIGKILL after 10 s).
    pub fn stop(&self, index: usize) {
        docker(&["stop", "-t", "10", &self.container_required(index)]);
    }

    /// `docker start` of node `index`'s (stopped or killed) container.
    pub fn start_node(&self, index: usize) {
        docker(&["start", &self.container_required(index)]);
    }

    /// `docker restart` (stop with SIGTERM, then start).
    pub fn restart(&self, index: usize) {
        docker(&["restart", "-t", "10", &self.container_required(index)]);
    }

    /// Removes node `index`'s container (stopping it first if it runs)
    /// and its volume.
    pub fn remove_with_volume(&self, index: usize) {
        self.compose(&["rm", "-f", "-s", SERVICES[index]]);
        docker(&["volume", "rm", &self.volume(index)]);
    }

    /// Creates node `index`'s container again (`up -d --no-deps`); a new,
    /// empty volume if its volume was removed. Does not wait for it.
    pub fn recreate(&self, index: usize) {
        self.compose(&["up", "-d", "--no-deps", SERVICES[index]]);
    }

    /// [`Self::remove_with_volume`], then [`Self::recreate`].
    pub fn wipe_and_recreate(&self, index: usize) {
        self.remove_with_volume(index);
        self.recreate(index);
    }

    /// The container's state: `(running, health)`.
    pub fn state(&self, index: usize) -> (String, String) {
        let id = self.container(index);
        if id.is_empty() {
            return ("gone".into(), "none".into());
        }
        let out = run(
            "docker",
            &[
                "inspect",
                "--format",
                "{{.State.Status}} {{if .State.Health}}{{.State.Health.Status}}{{else}}none{{end}}",
                &id,
            ],
            &[],
        );
        let s = String::from_utf8_lossy(&out.stdout).trim().to_string();
        let (a, b) = s.split_once(' ').unwrap_or((s.as_str(), ""));
        (a.to_string(), b.to_string())
    }

    /// Waits until node `index`'s container is healthy and Metadata through
    /// its host listener lists three brokers; panics (logs printed by Drop)
    /// if the container exits or the deadline passes.
    pub fn wait_node_ready(&self, index: usize, timeout: Duration) {
        self.wait_node_ready_with(index, 3, timeout);
    }

    /// [`Self::wait_node_ready`] with `brokers` brokers in Metadata (fewer
    /// than three while a node is down for good).
    pub fn wait_node_ready_with(&self, index: usize, brokers: usize, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        loop {
            let (status, health) = self.state(index);
            assert!(
                status == "running" || status == "created" || status == "restarting",
                "{} is {status} (health {health}) while waiting for it to be ready",
                SERVICES[index]
            );
            if health == "healthy"
                && self
                    .metadata_brokers(index)
                    .is_some_and(|b| b.len() == brokers)
            {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "{} not ready within {timeout:?} (status {status}, health {health})",
                SERVICES[index]
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// Waits until every node is ready; fails as soon as one container
    /// has stopped (it does not come back by itself: `restart: "no"`,
    /// except on small disks, where it is "restarting").
    pub fn wait_ready(&self) {
        let deadline = Instant::now() + READY_TIMEOUT;
        let mut ready = [false; 3];
        loop {
            for (i, done) in ready.iter_mut().enumerate() {
                if *done {
                    continue;
                }
                let (status, health) = self.state(i);
                assert!(
                    status == "running" || status == "created" || status == "restarting",
                    "{} is {status} (health {health}) while waiting for every node to be ready",
                    SERVICES[i]
                );
                // A SASL_SSL host listener cannot be asked in plaintext:
                // the health check (`/readyz`) is the readiness there.
                *done = health == "healthy"
                    && (self.sasl_ssl_certs.is_some()
                        || self.metadata_brokers(i).is_some_and(|b| b.len() == 3));
            }
            if ready.iter().all(|r| *r) {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "not every node ready within {READY_TIMEOUT:?}: ready {ready:?}"
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// `127.0.0.1:PORT` of node `index`'s host listener.
    pub fn addr(&self, index: usize) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.ports[index]))
    }

    /// Every host listener, comma-separated (a client's bootstrap list).
    pub fn bootstrap(&self) -> String {
        (0..3)
            .map(|i| self.addr(i).to_string())
            .collect::<Vec<_>>()
            .join(",")
    }

    /// The host listeners of the nodes `indexes` (a bootstrap list without
    /// a node that is down for good: librdkafka reports every failed
    /// connection to a reader).
    pub fn bootstrap_of(&self, indexes: &[usize]) -> String {
        indexes
            .iter()
            .map(|i| self.addr(*i).to_string())
            .collect::<Vec<_>>()
            .join(",")
    }

    /// A raw client to node `index`'s host listener, or `None` if it does
    /// not answer within a second or two.
    pub fn quick_client(&self, index: usize) -> Option<KafkaClient> {
        let mut c =
            KafkaClient::connect_with_timeout(self.addr(index), Duration::from_secs(1)).ok()?;
        c.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
        c.api_versions().ok()?;
        Some(c)
    }

    /// A raw client to any node that answers.
    pub fn any_client(&self) -> Option<KafkaClient> {
        (0..3).find_map(|i| self.quick_client(i))
    }

    /// The brokers (id → host:port) node `index`'s Metadata lists.
    pub fn metadata_brokers(&self, index: usize) -> Option<BTreeMap<i32, String>> {
        let md = self.quick_client(index)?.metadata(Some(&[])).ok()?;
        Some(
            md.brokers
                .iter()
                .map(|b| (b.node_id.0, format!("{}:{}", b.host.as_str(), b.port)))
                .collect(),
        )
    }

    /// Creates `topic` with `partitions` partitions, replication factor 3
    /// and `min.insync.replicas=2`, with the replica lists `assignments` (node
    /// ids, preferred leader first) if given.
    pub fn create_topic(&self, topic: &str, partitions: i32, assignments: Option<&[[i32; 3]]>) {
        let client = self.any_client().expect("a node to create a topic on");
        self.create_topic_through(client, topic, partitions, assignments);
    }

    /// [`Self::create_topic`] through `client`.
    pub fn create_topic_through(
        &self,
        mut client: KafkaClient,
        topic: &str,
        partitions: i32,
        assignments: Option<&[[i32; 3]]>,
    ) {
        let mut t = CreatableTopic::default()
            .with_name(topic_name(topic))
            .with_configs(vec![CreatableTopicConfig::default()
                .with_name(StrBytes::from_static_str("min.insync.replicas"))
                .with_value(Some(StrBytes::from_static_str("2")))]);
        t = match assignments {
            None => t.with_num_partitions(partitions).with_replication_factor(3),
            Some(a) => {
                assert_eq!(a.len(), partitions as usize);
                t.with_num_partitions(-1)
                    .with_replication_factor(-1)
                    .with_assignments(
                        a.iter()
                            .enumerate()
                            .map(|(p, ids)| {
                                CreatableReplicaAssignment::default()
                                    .with_partition_index(i32::try_from(p).unwrap())
                                    .with_broker_ids(ids.iter().map(|id| BrokerId(*id)).collect())
                            })
                            .collect(),
                    )
            }
        };
        let req = CreateTopicsRequest::default()
            .with_topics(vec![t])
            .with_timeout_ms(30_000);
        // CreateTopics waits for the controller (up to the request's 30 s).
        client
            .set_read_timeout(Some(Duration::from_secs(35)))
            .unwrap();
        let resp = client.call(&req).unwrap();
        assert_eq!(
            resp.topics[0].error_code, 0,
            "CreateTopics {topic}: {:?}",
            resp.topics[0].error_message
        );
    }

    /// Every partition of `topic` as node `index` reports it.
    pub fn partitions(&self, index: usize, topic: &str) -> Option<Vec<PartitionState>> {
        let t = self.quick_client(index)?.topic_metadata(topic)?;
        let mut out: Vec<PartitionState> = t
            .partitions
            .into_iter()
            .map(|p| {
                let mut isr: Vec<i32> = p.isr_nodes.iter().map(|b| b.0).collect();
                isr.sort_unstable();
                PartitionState {
                    partition: p.partition_index,
                    leader: p.leader_id.0,
                    replicas: p.replica_nodes.iter().map(|b| b.0).collect(),
                    isr,
                }
            })
            .collect();
        out.sort_by_key(|p| p.partition);
        Some(out)
    }

    /// Waits until every node's Metadata shows every partition of each of
    /// `topics` with a leader and all three replicas in the ISR.
    pub fn wait_full_isr(&self, topics: &[&str], timeout: Duration) {
        wait_until(
            &format!("a leader and a full ISR on every partition of {topics:?}"),
            timeout,
            || {
                for i in 0..3 {
                    for topic in topics {
                        let parts = self.partitions(i, topic)?;
                        if parts.is_empty()
                            || !parts.iter().all(|p| p.leader > 0 && p.isr == [1, 2, 3])
                        {
                            return None;
                        }
                    }
                }
                Some(())
            },
        );
    }

    /// The controller leader's node id (DescribeQuorum through any node).
    pub fn controller_leader(&self) -> Option<i32> {
        (0..3).find_map(|i| {
            let d = self.quick_client(i)?.describe_quorum(1).ok()?;
            let leader = d.topics.first()?.partitions.first()?.leader_id.0;
            (leader > 0).then_some(leader)
        })
    }

    /// Waits for a controller leader.
    pub fn wait_controller_leader(&self, timeout: Duration) -> i32 {
        wait_until("a controller leader", timeout, || self.controller_leader())
    }

    /// Runs `samsa ARGS` in a new container on the project's network
    /// (`docker run --rm`), with `stdin` as its input; returns (success,
    /// stdout, stderr). The container is removed by Drop if it is left.
    pub fn run_in_network(&self, args: &[&str], stdin: &str) -> (bool, String, String) {
        static N: AtomicU32 = AtomicU32::new(0);
        let name = format!("{}-cli-{}", self.project, N.fetch_add(1, Ordering::Relaxed));
        self.helpers.lock().unwrap().push(name.clone());
        let network = self.network();
        let mut all = vec![
            "run",
            "--rm",
            "-i",
            "--name",
            &name,
            "--network",
            &network,
            "--entrypoint",
            "samsa",
            &self.image,
        ];
        all.extend(args);
        let mut child = Command::new("docker")
            .args(&all)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("docker run");
        let mut input = child.stdin.take().expect("stdin");
        let stdin = stdin.to_string();
        let writer = std::thread::spawn(move || {
            let _ = input.write_all(stdin.as_bytes());
        });
        let out = child.wait_with_output().expect("docker run output");
        let _ = writer.join();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }

    /// The logs of every container of the project (the last `lines` each).
    pub fn logs(&self, lines: usize) -> String {
        let tail = lines.to_string();
        text(&self.compose_output(&["logs", "--no-color", "--tail", &tail]))
    }

    /// Waits until node `index`'s container has exited; returns its exit code.
    pub fn wait_exited(&self, index: usize, timeout: Duration) -> i64 {
        wait_until(&format!("{} to exit", SERVICES[index]), timeout, || {
            let id = self.container(index);
            let out = run(
                "docker",
                &[
                    "inspect",
                    "--format",
                    "{{.State.Status}} {{.State.ExitCode}}",
                    &id,
                ],
                &[],
            );
            let s = String::from_utf8_lossy(&out.stdout).trim().to_string();
            let (status, code) = s.split_once(' ')?;
            (status == "exited").then(|| code.parse().ok()).flatten()
        })
    }

    /// Everything node `index`'s current container logged.
    pub fn service_logs(&self, index: usize) -> String {
        text(&self.compose_output(&["logs", "--no-color", SERVICES[index]]))
    }

    /// The volumes of the project that exist.
    pub fn existing_volumes(&self) -> Vec<String> {
        let label = format!("label=com.docker.compose.project={}", self.project);
        let out = run("docker", &["volume", "ls", "-q", "--filter", &label], &[]);
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(str::to_string)
            .collect()
    }
}

impl Drop for ComposeCluster {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!(
                "----- logs of {} -----\n{}\n----- end of logs -----",
                self.project,
                self.logs(300)
            );
        }
        if crate::keep::keep_dir().is_some() {
            for (i, service) in SERVICES.iter().enumerate() {
                crate::keep::keep_text(&self.service_logs(i), &format!("{service}.log"));
            }
        }
        for name in self
            .helpers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
        {
            let _ = run("docker", &["rm", "-f", name], &[]);
        }
        // Unpause first: a paused container delays `down`.
        for i in 0..3 {
            let id = self.container(i);
            if !id.is_empty() {
                let _ = run("docker", &["unpause", &id], &[]);
            }
        }
        let out = self.compose_output(&["down", "-v", "--remove-orphans", "-t", "2"]);
        if !out.status.success() {
            eprintln!("compose down -v of {} failed: {}", self.project, text(&out));
        }
        // Volumes left by a removed and recreated container.
        for v in self.existing_volumes() {
            let _ = run("docker", &["volume", "rm", "-f", &v], &[]);
        }
        for mount in &self.disks {
            let m = mount.display().to_string();
            if !run("umount", &[&m], &[]).status.success() {
                // Still busy (a container being torn down): detach lazily.
                let out = run("umount", &["-l", &m], &[]);
                if !out.status.success() {
                    eprintln!("umount {m} failed: {}", text(&out));
                }
            }
        }
    }
}
