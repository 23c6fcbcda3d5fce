//! `samsa produce`: one record per stdin line, optionally keyed, idempotent or
//! inside a single transaction, waiting for every delivery report before it
//! exits (non-zero if any record was not acknowledged).

use std::io::BufRead;
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use anyhow::{anyhow, Context, Result};
use clap::{Args, ValueEnum};
use rdkafka::client::ClientContext;
use rdkafka::config::RDKafkaLogLevel;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::producer::{BaseProducer, BaseRecord, DeliveryResult, Producer, ProducerContext};
use rdkafka::util::Timeout;

use crate::client::{self, ConnectArgs};

#[derive(Debug, Args)]
pub struct ProduceArgs {
    /// Topic to produce to (auto-created if the broker allows it).
    topic: String,
    /// Send every record to this partition (default: librdkafka's partitioner).
    #[arg(long, value_name = "P")]
    partition: Option<i32>,
    /// Split each line at the first SEP into key and value (a line without SEP is an error).
    #[arg(long, value_name = "SEP")]
    key_separator: Option<String>,
    /// Acknowledgements to wait for (default: all).
    #[arg(long, value_enum)]
    acks: Option<Acks>,
    /// Enable the idempotent producer (enable.idempotence=true).
    #[arg(long)]
    idempotent: bool,
    /// Send all of stdin in one transaction with this transactional.id, committed at EOF.
    #[arg(long, value_name = "ID")]
    transactional_id: Option<String>,
    #[command(flatten)]
    connect: ConnectArgs,
}

/// Producer `acks` setting.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Acks {
    /// The whole in-sync replica set.
    All,
    /// The leader only.
    #[value(name = "1")]
    One,
    /// No acknowledgement at all.
    #[value(name = "0")]
    Zero,
}

impl Acks {
    pub fn as_config(self) -> &'static str {
        match self {
            Acks::All => "all",
            Acks::One => "1",
            Acks::Zero => "0",
        }
    }
}

/// Delivery bookkeeping, updated from librdkafka's delivery callbacks
/// (also the context of `samsa bench txn`'s producers).
#[derive(Default)]
pub(crate) struct DeliveryTally {
    pub(crate) delivered: AtomicU64,
    pub(crate) failed: AtomicU64,
    pub(crate) first_error: Mutex<Option<String>>,
}

impl ClientContext for DeliveryTally {
    fn log(&self, level: RDKafkaLogLevel, fac: &str, message: &str) {
        client::forward_log(level, fac, message);
    }

    fn error(&self, error: KafkaError, reason: &str) {
        client::forward_error(&error, reason);
    }
}

impl ProducerContext for DeliveryTally {
    type DeliveryOpaque = ();

    fn delivery(&self, result: &DeliveryResult<'_>, _: ()) {
        match result {
            Ok(_) => {
                self.delivered.fetch_add(1, Ordering::Relaxed);
            }
            Err((err, _)) => {
                self.failed.fetch_add(1, Ordering::Relaxed);
                if let Ok(mut first) = self.first_error.lock() {
                    first.get_or_insert_with(|| err.to_string());
                }
            }
        }
    }
}

pub async fn run(args: ProduceArgs) -> Result<ExitCode> {
    client::blocking(move || produce_stdin(&args)).await
}

fn produce_stdin(args: &ProduceArgs) -> Result<ExitCode> {
    let mut settings: Vec<(&str, &str)> = vec![
        // Like kafka-console-producer: producing to a new topic creates it
        // when the broker allows auto-creation.
        ("allow.auto.create.topics", "true"),
    ];
    if let Some(acks) = args.acks {
        settings.push(("acks", acks.as_config()));
    }
    if args.idempotent {
        settings.push(("enable.idempotence", "true"));
    }
    if let Some(id) = &args.transactional_id {
        settings.push(("transactional.id", id));
    }
    let producer: BaseProducer<DeliveryTally> = args
        .connect
        .client_config(&settings)?
        .create_with_context(DeliveryTally::default())
        .context("cannot create the Kafka producer")?;

    let transactional = args.transactional_id.is_some();
    if transactional {
        producer
            .init_transactions(client::REQUEST_TIMEOUT)
            .context("init_transactions failed")?;
        producer
            .begin_transaction()
            .context("begin_transaction failed")?;
    }

    let started = Instant::now();
    let mut sent: u64 = 0;
    let mut rejected: u64 = 0;
    let stdin = std::io::stdin();
    for (index, line) in stdin.lock().split(b'\n').enumerate() {
        let mut line = line.context("cannot read stdin")?;
        if line.last() == Some(&b'\r') {
            line.pop();
        }
        let (key, value) = match split_key(&line, args.key_separator.as_deref()) {
            Ok(parts) => parts,
            Err(msg) => {
                tracing::error!("line {}: {msg}; not sent", index + 1);
                rejected += 1;
                continue;
            }
        };
        match send(&producer, &args.topic, args.partition, key, value) {
            Ok(()) => sent += 1,
            Err(err) => {
                tracing::error!("line {}: cannot enqueue: {err}", index + 1);
                rejected += 1;
            }
        }
    }

    // Delivery reports are bounded by message.timeout.ms, so waiting without
    // our own limit cannot hang forever.
    let flushed = producer.flush(Timeout::Never);
    let tally = producer.context();
    let delivered = tally.delivered.load(Ordering::Relaxed);
    let failed = tally.failed.load(Ordering::Relaxed) + rejected;
    let first_error = tally
        .first_error
        .lock()
        .ok()
        .and_then(|first| first.clone());

    let mut outcome = String::new();
    if transactional {
        if failed == 0 && flushed.is_ok() {
            match producer.commit_transaction(client::REQUEST_TIMEOUT) {
                Ok(()) => outcome = ", transaction committed".into(),
                Err(err) => {
                    eprintln!(
                        "{delivered} records delivered to {} but the commit failed: {err}",
                        args.topic
                    );
                    return Ok(ExitCode::FAILURE);
                }
            }
        } else {
            outcome = match producer.abort_transaction(client::REQUEST_TIMEOUT) {
                Ok(()) => ", transaction aborted".into(),
                Err(err) => format!(", transaction abort failed: {err}"),
            };
        }
    }
    let secs = started.elapsed().as_secs_f64();
    eprintln!(
        "{delivered} records delivered to {}, {failed} failed, in {secs:.2}s{outcome}",
        args.topic
    );
    if let Some(err) = first_error {
        eprintln!("first delivery error: {err}");
    }
    if let Err(err) = flushed {
        eprintln!("flush did not complete: {err}");
        return Ok(ExitCode::FAILURE);
    }
    if failed > 0 || delivered != sent {
        return Ok(ExitCode::FAILURE);
    }
    Ok(ExitCode::SUCCESS)
}

/// Enqueues one record, serving delivery reports and retrying while
/// librdkafka's local queue is full.
fn send(
    producer: &BaseProducer<DeliveryTally>,
    topic: &str,
    partition: Option<i32>,
    key: Option<&[u8]>,
    value: &[u8],
) -> Result<()> {
    let mut record = BaseRecord::to(topic).payload(value);
    if let Some(key) = key {
        record = record.key(key);
    }
    if let Some(partition) = partition {
        record = record.partition(partition);
    }
    loop {
        match producer.send(record) {
            Ok(()) => {
                producer.poll(Duration::ZERO);
                return Ok(());
            }
            Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), back)) => {
                record = back;
                producer.poll(Duration::from_millis(100));
            }
            Err((err, _)) => return Err(anyhow!(err)),
        }
    }
}

type KeyValue<'a> = (Option<&'a [u8]>, &'a [u8]);

/// Splits a line into key and value at the first separator.
fn split_key<'a>(line: &'a [u8], separator: Option<&str>) -> Result<KeyValue<'a>, String> {
    let Some(sep) = separator else {
        return Ok((None, line));
    };
    let sep = sep.as_bytes();
    if sep.is_empty() {
        return Err("the key separator is empty".to_string());
    }
    match line.windows(sep.len()).position(|w| w == sep) {
        Some(at) => Ok((Some(&line[..at]), &line[at + sep.len()..])),
        None => Err(format!(
            "no key separator {:?} found",
            String::from_utf8_lossy(sep)
        )),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn key_split() {
        assert_eq!(
            split_key(b"a:b:c", Some(":")).unwrap(),
            (Some(&b"a"[..]), &b"b:c"[..])
        );
        assert_eq!(
            split_key(b"k=>v", Some("=>")).unwrap(),
            (Some(&b"k"[..]), &b"v"[..])
        );
        assert_eq!(
            split_key(b":v", Some(":")).unwrap(),
            (Some(&b""[..]), &b"v"[..])
        );
        assert_eq!(split_key(b"abc", None).unwrap(), (None, &b"abc"[..]));
        assert!(split_key(b"abc", Some(":")).is_err());
        assert!(split_key(b"abc", Some("")).is_err());
    }
}
