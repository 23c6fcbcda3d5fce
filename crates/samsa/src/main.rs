//! The `samsa` binary: command-line parsing, logging setup, the broker
//! processes (`server`, `dev`: [`server`], [`config`], [`dev`]) and dispatch to the
//! other subcommands, which live in the `samsa_tools` crate (Kafka client
//! tools, benchmarks, demos, the pipeline stage, the offline segment dumper,
//! the container health check) and the `samsa_verify` crate (`verify`).
//! This file owns the shape of the command line and how errors become exit
//! codes; the process allocator is the broker's guard
//! ([`samsa_broker::alloc_guard`]).

mod config;
mod dev;
mod logging;
mod server;
mod traces;

use std::process::ExitCode;

use clap::{Parser, Subcommand};
use samsa_broker::alloc_guard;
use samsa_tools::{bench, cluster, consume, demo, dump_log, health, pipeline, produce, topic, txn};

#[global_allocator]
static ALLOCATOR: alloc_guard::LazyHugeAllocator = alloc_guard::LazyHugeAllocator;

/// samsa: a Kafka-wire-compatible commit log.
#[derive(Debug, Parser)]
#[command(name = "samsa", version, about, propagate_version = true)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run a broker (configuration from a TOML file, SAMSA_* environment
    /// variables, flags and --set overrides).
    Server(server::ServerArgs),
    /// Run a development broker on 127.0.0.1:9092 with ./samsa-data, or a
    /// local cluster with --nodes 3.
    Dev(server::DevArgs),
    /// Inspect the controller quorum and cluster metadata.
    #[command(subcommand)]
    Cluster(cluster::ClusterCommand),
    /// Create, list, describe and delete topics.
    #[command(subcommand)]
    Topic(topic::TopicCommand),
    /// Produce lines from stdin, one record per line.
    Produce(produce::ProduceArgs),
    /// Print records of a topic to stdout (assigns partitions; no consumer group).
    Consume(consume::ConsumeArgs),
    /// Measure produce or consume throughput and latency.
    #[command(subcommand)]
    Bench(bench::BenchCommand),
    /// GET a broker's /readyz (or another URL of its HTTP endpoint): exit 0
    /// on 200 OK, 1 otherwise (the container image's health check).
    Health(health::HealthArgs),
    /// Print the record batches of segment files, like kafka-dump-log.sh (no broker needed).
    DumpLog(dump_log::DumpLogArgs),
    /// Run a transaction experiment against a broker and print what it shows.
    #[command(subcommand)]
    Demo(demo::DemoCommand),
    /// Read and change topic and broker configs at run time (like
    /// kafka-configs.sh).
    #[command(subcommand)]
    Config(samsa_tools::config::ConfigCommand),
    /// SCRAM users: add, list, delete (like kafka-configs.sh --entity-type users).
    #[command(subcommand)]
    User(samsa_tools::user::UserCommand),
    /// ACLs: add, list, remove (like kafka-acls.sh).
    #[command(subcommand)]
    Acl(samsa_tools::acl::AclCommand),
    /// List, describe and abort transactions; find hanging ones
    /// (like kafka-transactions.sh).
    #[command(subcommand)]
    Txn(txn::TxnCommand),
    /// Exactly-once consume-transform-produce stage processes and their benchmark.
    #[command(subcommand)]
    Pipeline(pipeline::PipelineCommand),
    /// Run workloads against any Kafka-compatible cluster and check what
    /// they saw (lost, duplicated, aborted or torn records, group offsets);
    /// `verify check` re-checks a history. Exit 0 clean, 1 anomalies, 2 could not run.
    Verify(samsa_verify::VerifyArgs),
    /// Faults for a cluster run with Docker Compose (kill, pause, partitions,
    /// slow and lossy links, full disk), from a replayable schedule; needs root.
    #[command(subcommand)]
    Nemesis(samsa_nemesis::cli::NemesisCommand),
}

fn main() -> ExitCode {
    alloc_guard::keep_large_buffers_in_the_heap();
    let cli = Cli::parse();
    // A broker's log and traces follow its configuration (`server`).
    if !matches!(cli.command, Command::Server(_) | Command::Dev(_)) {
        logging::init(samsa_broker::config::LogFormat::Text, None);
    }

    // dump-log reads files synchronously and needs no runtime (nor its threads).
    if let Command::DumpLog(args) = cli.command {
        return report(dump_log::run(&args));
    }
    // Neither does the health check, which a container runs every few seconds.
    if let Command::Health(args) = cli.command {
        return report(health::run(&args));
    }

    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("samsa")
        .build()
    {
        Ok(rt) => rt,
        Err(err) => {
            eprintln!("error: cannot start the async runtime: {err}");
            return ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(async move {
        match cli.command {
            Command::Server(args) => server::run_server(args).await,
            Command::Dev(args) => server::run_dev(args).await,
            Command::Topic(cmd) => topic::run(cmd).await,
            Command::Cluster(cmd) => cluster::run(cmd).await,
            Command::Produce(args) => produce::run(args).await,
            Command::Consume(args) => consume::run(args).await,
            Command::Bench(cmd) => bench::run(cmd).await,
            Command::DumpLog(args) => dump_log::run(&args),
            Command::Health(args) => health::run(&args),
            Command::Demo(cmd) => demo::run(cmd).await,
            Command::Txn(cmd) => txn::run(cmd).await,
            Command::Config(cmd) => samsa_tools::config::run(cmd).await,
            Command::User(cmd) => samsa_tools::user::run(cmd).await,
            Command::Acl(cmd) => samsa_tools::acl::run(cmd).await,
            Command::Pipeline(cmd) => pipeline::run(cmd).await,
            Command::Verify(args) => samsa_verify::run(args).await,
            Command::Nemesis(cmd) => samsa_nemesis::cli::run(cmd).await,
        }
    });
    // Blocking client tasks have all been joined by now; don't let a stray one
    // (e.g. librdkafka stuck on a dead broker) hold the process open.
    runtime.shutdown_timeout(std::time::Duration::from_secs(1));
    report(result)
}

/// Turns a subcommand's outcome into the process exit code. Errors are printed
/// as a single line: the context chain joined by ": ".
fn report(result: anyhow::Result<ExitCode>) -> ExitCode {
    match result {
        Ok(code) => code,
        Err(err) => {
            let line = format!("{err:#}").replace('\n', " ");
            eprintln!("error: {line}");
            ExitCode::FAILURE
        }
    }
}
