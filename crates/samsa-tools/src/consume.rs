//! `samsa consume`: print a topic's records to stdout. Partitions are taken
//! with `assign()` at the beginning or the end, never through a consumer
//! group: a look at a topic should not join, rebalance or commit anything
//! (the group demos in `crate::demo` do that).

use std::io::{IsTerminal, Write};
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::{Args, ValueEnum};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::message::Message;
use rdkafka::{Offset, TopicPartitionList};

use crate::client::{self, CliContext, ConnectArgs};
use crate::signals;

#[derive(Debug, Args)]
pub struct ConsumeArgs {
    /// Topic to read.
    topic: String,
    /// Start at the log start instead of the end.
    #[arg(long)]
    from_beginning: bool,
    /// read_committed hides aborted and still-open transactional records.
    #[arg(long, value_enum, default_value_t = IsolationLevel::ReadUncommitted)]
    isolation_level: IsolationLevel,
    /// Read only this partition (default: all partitions of the topic).
    #[arg(long, value_name = "P")]
    partition: Option<i32>,
    /// Stop after N records.
    #[arg(long, value_name = "N")]
    max_messages: Option<u64>,
    /// Stop after T milliseconds without a record.
    #[arg(long, value_name = "T")]
    timeout_ms: Option<u64>,
    /// Print `partition offset key value` instead of just the value.
    #[arg(long)]
    print_offsets: bool,
    #[command(flatten)]
    connect: ConnectArgs,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
#[value(rename_all = "snake_case")]
pub enum IsolationLevel {
    ReadCommitted,
    ReadUncommitted,
}

impl IsolationLevel {
    pub fn as_config(self) -> &'static str {
        match self {
            IsolationLevel::ReadCommitted => "read_committed",
            IsolationLevel::ReadUncommitted => "read_uncommitted",
        }
    }
}

pub async fn run(args: ConsumeArgs) -> Result<ExitCode> {
    let stop = Arc::new(AtomicBool::new(false));
    let shutdown = signals::shutdown_signal()?;
    let mut task = tokio::task::spawn_blocking({
        let stop = Arc::clone(&stop);
        move || consume(&args, &stop)
    });
    // Ctrl-C / SIGTERM end the loop; the blocking task notices within one
    // poll interval and still prints its summary.
    let joined = tokio::select! {
        joined = &mut task => joined,
        () = shutdown => {
            stop.store(true, Ordering::Relaxed);
            task.await
        }
    };
    joined.context("consumer task failed")?
}

/// librdkafka's assign() is only allowed on a consumer with a group.id, even
/// though no group protocol runs: offsets are explicit and never committed.
const GROUP_ID: &str = "samsa-cli-consume";

/// How long one poll may block, which bounds the reaction time to Ctrl-C.
const POLL_INTERVAL: Duration = Duration::from_millis(100);

pub fn assigning_consumer(
    connect: &ConnectArgs,
    isolation: IsolationLevel,
    extra: &[(&str, &str)],
) -> Result<BaseConsumer<CliContext>> {
    let mut settings = vec![
        ("group.id", GROUP_ID),
        ("enable.auto.commit", "false"),
        ("enable.auto.offset.store", "false"),
        ("isolation.level", isolation.as_config()),
    ];
    settings.extend_from_slice(extra);
    connect
        .client_config(&settings)?
        .create_with_context(CliContext)
        .context("cannot create the Kafka consumer")
}

fn consume(args: &ConsumeArgs, stop: &AtomicBool) -> Result<ExitCode> {
    let consumer = assigning_consumer(&args.connect, args.isolation_level, &[])?;
    let partitions = client::topic_partitions(consumer.client(), &args.topic)?;
    let partitions = match args.partition {
        Some(p) if partitions.contains(&p) => vec![p],
        Some(p) => bail!(
            "topic {} has no partition {p} (it has {})",
            args.topic,
            partitions.len()
        ),
        None => partitions,
    };
    let start = if args.from_beginning {
        Offset::Beginning
    } else {
        Offset::End
    };
    let mut assignment = TopicPartitionList::new();
    for p in &partitions {
        assignment
            .add_partition_offset(&args.topic, *p, start)
            .context("cannot build the partition assignment")?;
    }
    consumer
        .assign(&assignment)
        .context("cannot assign partitions")?;

    let stdout = std::io::stdout();
    let interactive = stdout.is_terminal();
    let mut out = std::io::BufWriter::new(stdout.lock());
    let idle_limit = args.timeout_ms.map(Duration::from_millis);
    let mut last_record = Instant::now();
    let mut count: u64 = 0;
    let mut broken_pipe = false;

    while !stop.load(Ordering::Relaxed) {
        if args.max_messages.is_some_and(|max| count >= max) {
            break;
        }
        if idle_limit.is_some_and(|limit| last_record.elapsed() >= limit) {
            break;
        }
        match consumer.poll(POLL_INTERVAL) {
            None => {
                // Idle: make what was printed so far visible to a pipe reader.
                if let Err(err) = out.flush() {
                    broken_pipe = is_broken_pipe(&err);
                    if broken_pipe {
                        break;
                    }
                    return Err(err).context("cannot write to stdout");
                }
            }
            Some(Err(KafkaError::PartitionEOF(_))) => {}
            Some(Err(err)) => tracing::warn!("consume error: {err}"),
            Some(Ok(message)) => {
                last_record = Instant::now();
                count += 1;
                let line = format_record(
                    args.print_offsets,
                    message.partition(),
                    message.offset(),
                    message.key(),
                    message.payload(),
                );
                let written = out.write_all(line.as_bytes()).and_then(|()| {
                    if interactive {
                        out.flush()
                    } else {
                        Ok(())
                    }
                });
                if let Err(err) = written {
                    broken_pipe = is_broken_pipe(&err);
                    if broken_pipe {
                        break;
                    }
                    return Err(err).context("cannot write to stdout");
                }
            }
        }
    }
    if !broken_pipe {
        if let Err(err) = out.flush() {
            if !is_broken_pipe(&err) {
                return Err(err).context("cannot write to stdout");
            }
        }
    }
    eprintln!("Processed a total of {count} messages");
    Ok(ExitCode::SUCCESS)
}

/// A reader that went away (`samsa consume t | head`) is a normal end.
fn is_broken_pipe(err: &std::io::Error) -> bool {
    err.kind() == std::io::ErrorKind::BrokenPipe
}

/// One output line: the value, or `partition offset key value`. Bytes that
/// are not UTF-8 are shown lossily; an absent key or value prints as `null`
/// (as kafka-console-consumer does).
fn format_record(
    print_offsets: bool,
    partition: i32,
    offset: i64,
    key: Option<&[u8]>,
    value: Option<&[u8]>,
) -> String {
    let show = |bytes: Option<&[u8]>| match bytes {
        Some(b) => String::from_utf8_lossy(b).into_owned(),
        None => "null".to_string(),
    };
    if print_offsets {
        format!("{partition} {offset} {} {}\n", show(key), show(value))
    } else {
        format!("{}\n", show(value))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn record_lines() {
        assert_eq!(format_record(false, 0, 5, None, Some(b"v")), "v\n");
        assert_eq!(
            format_record(true, 2, 5, Some(b"k"), Some(b"v")),
            "2 5 k v\n"
        );
        assert_eq!(format_record(true, 0, 0, None, None), "0 0 null null\n");
    }
}
