//! `samsa server` and `samsa dev`: assemble a [`BrokerConfig`], run
//! [`samsa_broker::run`] until SIGTERM/SIGINT, and report how it ended.
//! `dev` is `server` with single-node defaults, Kafka's quickstart values
//! ([`dev_presets`]) and a startup banner;
//! `dev --nodes N` computes the configurations of N cluster nodes
//! (controller + broker each, on 127.0.0.1 ports 100 apart, data in
//! `<data-dir>/node-<id>`) and hands them to [`crate::dev`], which runs each
//! as its own `samsa server` process.

use std::net::{SocketAddr, TcpListener, ToSocketAddrs};
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{anyhow, Context, Result};
use clap::Args;
use samsa_broker::BrokerConfig;
use samsa_tools::signals;

use crate::config;
use crate::traces::Traces;

#[derive(Debug, Args)]
pub struct ServerArgs {
    /// TOML file with BrokerConfig fields (nested [log] table for log settings);
    /// SAMSA_<KEY> environment variables (SAMSA_LOG__SEGMENT_BYTES for
    /// log.segment_bytes) override it, the flags override both.
    #[arg(long, value_name = "FILE.toml")]
    config: Option<PathBuf>,
    /// This broker's node id (node_id), or `from-hostname`: the host name's
    /// trailing -<ordinal> plus one (samsa-0 is node 1).
    #[arg(long, value_name = "N|from-hostname")]
    node_id: Option<String>,
    /// Address the Kafka listener binds to (listen).
    #[arg(long, value_name = "HOST:PORT", value_parser = parse_listen)]
    listen: Option<SocketAddr>,
    /// host:port advertised to clients in Metadata (advertised_listener).
    #[arg(long, value_name = "HOST:PORT", value_parser = parse_host_port)]
    advertised_listener: Option<String>,
    /// Directory for partition logs and broker state (data_dir).
    #[arg(long, value_name = "DIR")]
    data_dir: Option<PathBuf>,
    /// Override any config key, applied last, e.g. --set log.segment_bytes=1048576 (repeatable).
    #[arg(long = "set", value_name = "KEY=VALUE")]
    set: Vec<String>,
    /// Print the effective configuration as TOML and exit.
    #[arg(long)]
    print_config: bool,
}

#[derive(Debug, Args)]
pub struct DevArgs {
    /// Directory for partition logs and broker state (with --nodes N > 1:
    /// one subdirectory node-<id> per node).
    #[arg(long, value_name = "DIR", default_value = "./samsa-data")]
    data_dir: PathBuf,
    /// Port of the Kafka listener on 127.0.0.1 (node N of a cluster:
    /// port + 100 × (N − 1)).
    #[arg(long, default_value_t = 9092)]
    port: u16,
    /// Number of nodes: 1 runs a single broker; more run a local cluster of
    /// combined controller + broker nodes.
    #[arg(long, value_name = "N", default_value_t = 1,
          value_parser = clap::value_parser!(u16).range(1..=9))]
    nodes: u16,
    /// Controller (gRPC) port of node 1 with --nodes N > 1 (node N:
    /// controller-port + 100 × (N − 1)).
    #[arg(long, value_name = "PORT", default_value_t = 9093)]
    controller_port: u16,
    /// Port of the HTTP endpoint (/metrics, /healthz, /readyz) on 127.0.0.1
    /// (node N of a cluster: http-port + 100 × (N − 1)).
    #[arg(long, value_name = "PORT", default_value_t = 9644)]
    http_port: u16,
    /// Override any config key, e.g. --set num_partitions=3 (repeatable).
    #[arg(long = "set", value_name = "KEY=VALUE")]
    set: Vec<String>,
    /// With --nodes N > 1: start a node killed by a signal again, with the
    /// same configuration (without it, a killed node stays down).
    #[arg(long)]
    restart_killed: bool,
}

pub async fn run_server(args: ServerArgs) -> Result<ExitCode> {
    let cfg = match &args.config {
        Some(path) => config::load_file(path)?,
        None => BrokerConfig::default(),
    };
    let (mut cfg, ignored_variables) = config::env_overrides(
        cfg,
        std::env::vars_os().filter_map(|(name, value)| {
            Some((name.into_string().ok()?, value.into_string().ok()?))
        }),
    )?;
    if let Some(node_id) = &args.node_id {
        cfg.node_id = config::node_id_flag(node_id).map_err(|err| anyhow!("--node-id: {err}"))?;
        cfg.explicit_keys.insert("node_id".into());
    }
    if let Some(listen) = args.listen {
        cfg.listen = listen;
        cfg.explicit_keys.insert("listen".into());
    }
    if let Some(advertised) = args.advertised_listener {
        cfg.advertised_listener = Some(advertised);
        cfg.explicit_keys.insert("advertised_listener".into());
    }
    if let Some(dir) = args.data_dir {
        cfg.data_dir = dir;
        cfg.explicit_keys.insert("data_dir".into());
    }
    let cfg = config::apply_overrides(cfg, &args.set)?;
    let cfg = config::expand_hostname(cfg)?;
    // The printed configuration is all `--print-config` does: no exporter.
    let traces = if args.print_config {
        crate::logging::init(cfg.log_format, None);
        None
    } else {
        start_logging(&cfg)?
    };
    for ignored in ignored_variables {
        tracing::warn!(
            variable = %ignored.variable,
            key = ignored.key.as_deref().unwrap_or(""),
            "ignoring an environment variable that names no configuration key"
        );
    }
    if args.print_config {
        print!(
            "{}",
            toml::to_string_pretty(&cfg).context("cannot print the configuration")?
        );
        return Ok(ExitCode::SUCCESS);
    }
    run_broker(cfg, traces).await
}

/// Installs the log and, when `otlp_endpoint` is set, the trace exporter.
fn start_logging(cfg: &BrokerConfig) -> Result<Option<Traces>> {
    let (traces, output) = match Traces::start(cfg) {
        Ok(Some((traces, output))) => (Some(traces), Some(output)),
        Ok(None) => (None, None),
        Err(err) => {
            crate::logging::init(cfg.log_format, None);
            return Err(err);
        }
    };
    crate::logging::init(cfg.log_format, output);
    Ok(traces)
}

pub async fn run_dev(args: DevArgs) -> Result<ExitCode> {
    if args.nodes > 1 {
        // The supervisor's own lines; each node logs as its configuration says.
        crate::logging::init(samsa_broker::config::LogFormat::Text, None);
        let configs = dev_cluster_configs(&args)?;
        return crate::dev::run_cluster(configs, args.restart_killed).await;
    }
    if args.restart_killed {
        anyhow::bail!("--restart-killed needs --nodes N with N > 1 (one process per node)");
    }
    let listen = SocketAddr::from(([127, 0, 0, 1], args.port));
    let cfg = BrokerConfig {
        listen,
        // 127.0.0.1 rather than localhost: librdkafka may resolve localhost to ::1.
        advertised_listener: Some(listen.to_string()),
        data_dir: args.data_dir,
        http_listen: SocketAddr::from(([127, 0, 0, 1], args.http_port)),
        ..BrokerConfig::default()
    };
    let cfg = dev_presets(
        cfg,
        1,
        &["listen", "advertised_listener", "data_dir", "http_listen"],
    );
    let cfg = config::apply_overrides(cfg, &args.set)?;
    let traces = start_logging(&cfg)?;

    // Fail before the banner if the port is taken, with a hint; the broker
    // would report the same, but after the banner has told the user it runs.
    // Dropping the probe listener frees the port for the broker at once.
    for (addr, flag) in [(cfg.listen, "--port"), (cfg.http_listen, "--http-port")] {
        drop(TcpListener::bind(addr).map_err(|err| {
            anyhow!(
                "cannot listen on {addr}: {err} (is another samsa or Kafka running? try {flag})"
            )
        })?);
    }
    println!("{}", banner(&cfg));
    let (host, port) = cfg.advertised_host_port();
    let ready = tokio::spawn(crate::dev::announce_ready(vec![(
        cfg.node_id,
        format!("{host}:{port}"),
    )]));
    let outcome = run_broker(cfg, traces).await;
    ready.abort();
    outcome
}

/// `samsa dev`'s configuration file, in effect: Kafka's quickstart
/// `server.properties` (`config/server.properties`,
/// `config/kraft/server.properties`) where samsa has the setting and the
/// quickstart differs from Kafka's built-in default, which `samsa server`
/// keeps. `set_by_dev` are the keys `dev` itself fills in (addresses, data
/// directory). All of them count as configured (STATIC_BROKER_CONFIG in
/// DescribeConfigs), as they would in Kafka's file; `--set` still overrides
/// them. `docs/OPERATIONS.md` lists the differences.
fn dev_presets(mut cfg: BrokerConfig, nodes: u16, set_by_dev: &[&str]) -> BrokerConfig {
    // The first rebalance of a new group does not wait 3 s for more members.
    cfg.group_initial_rebalance_delay_ms = 0;
    let mut presets = vec!["group_initial_rebalance_delay_ms"];
    if nodes == 1 {
        // A single node can only hold one replica of the internal topics;
        // a `dev --nodes N` cluster keeps the default, min(3, N), so that
        // killing a node does not lose the group and transaction state.
        cfg.offsets_topic_replication_factor = Some(1);
        cfg.transaction_state_log_replication_factor = Some(1);
        presets.extend([
            "offsets_topic_replication_factor",
            "transaction_state_log_replication_factor",
        ]);
    }
    cfg.explicit_keys
        .extend(set_by_dev.iter().chain(&presets).map(|k| (*k).to_string()));
    cfg
}

async fn run_broker(cfg: BrokerConfig, traces: Option<Traces>) -> Result<ExitCode> {
    let shutdown = signals::shutdown_signal()?;
    let (host, port) = cfg.advertised_host_port();
    // One descriptor per hosted partition: take all the limit allows.
    let open_file_limit = samsa_broker::descriptors::raise_limit();
    tracing::info!(
        version = env!("CARGO_PKG_VERSION"),
        node_id = cfg.node_id,
        open_file_limit,
        listen = %cfg.listen,
        advertised = %format!("{host}:{port}"),
        data_dir = %cfg.data_dir.display(),
        "starting samsa broker"
    );
    // BrokerError's Display already carries its cause (e.g. the bind error),
    // so it is taken as the whole message rather than walking its chain.
    let outcome = samsa_broker::run(cfg, shutdown).await;
    if let Some(traces) = traces {
        traces.stop().await;
    }
    outcome.map_err(|err| anyhow!("broker failed: {err}"))?;
    tracing::info!("samsa broker stopped cleanly");
    Ok(ExitCode::SUCCESS)
}

/// The configurations of a `dev --nodes N` cluster.
pub(crate) fn dev_cluster_configs(args: &DevArgs) -> Result<Vec<BrokerConfig>> {
    let port_of = |base: u16, node: u16| -> Result<u16> {
        base.checked_add(100 * (node - 1))
            .ok_or_else(|| anyhow!("port {base} + {} is not a TCP port", 100 * (node - 1)))
    };
    let nodes = 1..=args.nodes;
    let voters = nodes
        .clone()
        .map(|n| {
            Ok(format!(
                "{n}@127.0.0.1:{}",
                port_of(args.controller_port, n)?
            ))
        })
        .collect::<Result<Vec<_>>>()?
        .join(",");
    nodes
        .map(|n| {
            let listen = SocketAddr::from(([127, 0, 0, 1], port_of(args.port, n)?));
            let cfg = BrokerConfig {
                node_id: i32::from(n),
                listen,
                advertised_listener: Some(listen.to_string()),
                data_dir: args.data_dir.join(format!("node-{n}")),
                controller_quorum_voters: Some(voters.clone()),
                controller_listen: SocketAddr::from((
                    [127, 0, 0, 1],
                    port_of(args.controller_port, n)?,
                )),
                http_listen: SocketAddr::from(([127, 0, 0, 1], port_of(args.http_port, n)?)),
                ..BrokerConfig::default()
            };
            let cfg = dev_presets(
                cfg,
                args.nodes,
                &[
                    "node_id",
                    "listen",
                    "advertised_listener",
                    "data_dir",
                    "controller_quorum_voters",
                    "controller_listen",
                    "http_listen",
                ],
            );
            config::apply_overrides(cfg, &args.set)
        })
        .collect()
}

fn banner(cfg: &BrokerConfig) -> String {
    let (host, port) = cfg.advertised_host_port();
    let addr = format!("{host}:{port}");
    let data_dir = std::path::absolute(&cfg.data_dir).unwrap_or_else(|_| cfg.data_dir.clone());
    let bs = if addr == "127.0.0.1:9092" {
        String::new()
    } else {
        format!(" --bootstrap-server {addr}")
    };
    format!(
        "\
samsa {version} - development broker (single node)

  Kafka address   {addr}
  Metrics         http://{http}/metrics  (/healthz, /readyz)
  Data directory  {data_dir}

  Create a topic  samsa topic create demo --partitions 3{bs}
  Produce         seq 10 | samsa produce demo{bs}
                  seq 10 | kcat -P -b {addr} -t demo
  Consume         samsa consume demo --from-beginning --print-offsets{bs}
                  kcat -C -b {addr} -t demo -o beginning -e
  Benchmark       samsa bench produce --topic bench --records 1000000{bs}

  Press Ctrl-C to stop (data is kept in the data directory).
",
        version = env!("CARGO_PKG_VERSION"),
        data_dir = data_dir.display(),
        http = cfg.http_listen,
    )
}

/// `--listen` accepts a host name as well as an IP; the first address the name
/// resolves to is bound.
fn parse_listen(s: &str) -> Result<SocketAddr, String> {
    if let Ok(addr) = s.parse::<SocketAddr>() {
        return Ok(addr);
    }
    s.to_socket_addrs()
        .map_err(|err| format!("cannot resolve {s}: {err}"))?
        .next()
        .ok_or_else(|| format!("{s} resolves to no address"))
}

fn parse_host_port(s: &str) -> Result<String, String> {
    match s.rsplit_once(':') {
        Some((host, port)) if !host.is_empty() && port.parse::<u16>().is_ok() => Ok(s.to_string()),
        _ => Err(format!("expected HOST:PORT, got {s}")),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn listen_parsing() {
        assert_eq!(
            parse_listen("0.0.0.0:9092").unwrap(),
            SocketAddr::from(([0, 0, 0, 0], 9092))
        );
        assert_eq!(parse_listen("localhost:9092").unwrap().port(), 9092);
        assert!(parse_listen("nonsense").is_err());
        assert!(parse_host_port("host:9092").is_ok());
        assert!(parse_host_port("[::1]:9092").is_ok());
        assert!(parse_host_port("host").is_err());
        assert!(parse_host_port(":9092").is_err());
    }

    #[test]
    fn dev_cluster_ports_and_voters() {
        let args = DevArgs {
            data_dir: PathBuf::from("/tmp/d"),
            port: 9092,
            nodes: 3,
            controller_port: 9093,
            http_port: 9644,
            set: vec!["broker_session_timeout_ms=3000".into()],
            restart_killed: false,
        };
        let configs = dev_cluster_configs(&args).unwrap();
        let ports: Vec<(u16, u16, u16)> = configs
            .iter()
            .map(|c| {
                (
                    c.listen.port(),
                    c.controller_listen.port(),
                    c.http_listen.port(),
                )
            })
            .collect();
        assert_eq!(
            ports,
            vec![(9092, 9093, 9644), (9192, 9193, 9744), (9292, 9293, 9844)]
        );
        assert_eq!(
            configs[2].controller_quorum_voters.as_deref(),
            Some("1@127.0.0.1:9093,2@127.0.0.1:9193,3@127.0.0.1:9293")
        );
        assert_eq!(configs[1].data_dir, PathBuf::from("/tmp/d/node-2"));
        assert!(configs.iter().all(|c| c.broker_session_timeout_ms == 3000));
    }

    #[test]
    fn dev_presets_are_kafkas_quickstart_values() {
        let single = dev_presets(BrokerConfig::default(), 1, &["listen"]);
        assert_eq!(single.group_initial_rebalance_delay_ms, 0);
        assert_eq!(single.offsets_topic_replication_factor, Some(1));
        assert_eq!(single.transaction_state_log_replication_factor, Some(1));
        assert!(single.is_explicit("group_initial_rebalance_delay_ms"));
        assert!(single.is_explicit("listen"));
        assert!(!single.is_explicit("num_partitions"));

        let args = DevArgs {
            data_dir: PathBuf::from("/tmp/d"),
            port: 9092,
            nodes: 3,
            controller_port: 9093,
            http_port: 9644,
            set: vec!["group_initial_rebalance_delay_ms=3000".into()],
            restart_killed: false,
        };
        let configs = dev_cluster_configs(&args).unwrap();
        for c in &configs {
            // --set wins over the preset; the cluster keeps min(3, N) replicas.
            assert_eq!(c.group_initial_rebalance_delay_ms, 3000);
            assert_eq!(c.offsets_topic_replication_factor, None);
            assert!(c.is_explicit("controller_quorum_voters"));
        }
        // `samsa server` keeps Kafka's built-in default.
        assert_eq!(
            BrokerConfig::default().group_initial_rebalance_delay_ms,
            3000
        );
    }

    #[test]
    fn banner_names_address_and_dir() {
        let cfg = BrokerConfig {
            listen: SocketAddr::from(([127, 0, 0, 1], 9093)),
            advertised_listener: Some("127.0.0.1:9093".into()),
            ..BrokerConfig::default()
        };
        let text = banner(&cfg);
        assert!(text.contains("127.0.0.1:9093"));
        assert!(text.contains("--bootstrap-server 127.0.0.1:9093"));
        assert!(text.contains("samsa-data"));
        assert!(text.contains("Ctrl-C"));
    }
}
