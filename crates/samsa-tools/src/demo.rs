//! `samsa demo <name>`: the transaction experiments samsa reproduces (the
//! seed experiments of the design notes), run with librdkafka against a
//! live broker such as `samsa dev`. The consumer-group ones (offsets in
//! the transaction, zombie members, lag) are in [`groups`]. Each demo creates its own topics and
//! transactional ids (a unique suffix per run), prints every step and what a
//! reader sees, and exits with failure when the broker does not behave as
//! Kafka does.
//!
//! Sends are synchronous (each waits for its acknowledgement) so that an
//! abort cannot drop records on the client side before they reached the
//! log: the demos show what the broker does with records it has.

use std::process::ExitCode;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{anyhow, bail, Context, Result};
use clap::{Args, Subcommand};
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::message::Message;
use rdkafka::producer::{FutureProducer, FutureRecord, Producer};
use rdkafka::{Offset, TopicPartitionList};

use crate::client::{self, CliContext, ConnectArgs, REQUEST_TIMEOUT};
use crate::consume::{assigning_consumer, IsolationLevel};

mod groups;

#[derive(Debug, Subcommand)]
pub enum DemoCommand {
    /// Three batches of 5: A commits, B fails after 3 sends and aborts, B is
    /// resent and commits; read_committed counts 10, read_uncommitted 13.
    AbortResend(DemoArgs),
    /// One transaction writes to two topics: commit shows both to
    /// read_committed, abort shows neither.
    TwoTopics(DemoArgs),
    /// An open transaction holds back read_committed readers at the last
    /// stable offset, even for a later plain record of another producer.
    Lso(DemoArgs),
    /// A second producer with the same transactional.id fences the first.
    Fencing(DemoArgs),
    /// Seed experiment 2: a consume-transform-produce process is SIGKILLed
    /// between produce and commit; the retry with the same transactional.id
    /// and group writes every output exactly once and moves the offset to 10.
    Sigkill(DemoArgs),
    /// A group member stopped past its session timeout loses its partition;
    /// when it continues, its offsets and outputs are refused.
    Zombie(DemoArgs),
    /// A read_committed group consumer at the end of a transactional topic
    /// has lag 0: transaction markers leave no phantom lag.
    ConsumerLag(DemoArgs),
    /// One consume-transform-produce transaction (what `sigkill` and
    /// `zombie` run as child processes): consume through the group, write
    /// the outputs synchronously, send the offsets to the transaction, commit.
    EosAttempt(groups::EosAttemptArgs),
    /// Exactly-once consume-transform-produce: two transactional stages of
    /// stage processes, one process of each SIGKILLed half-way; every input
    /// key reaches the output exactly once.
    Pipeline(crate::pipeline::driver::DemoArgs),
}

#[derive(Debug, Args)]
pub struct DemoArgs {
    /// Prefix of the topics and transactional ids the demo creates (a
    /// unique suffix is added to each).
    #[arg(long, default_value = "demo")]
    prefix: String,
    #[command(flatten)]
    connect: ConnectArgs,
}

pub async fn run(command: DemoCommand) -> Result<ExitCode> {
    if let DemoCommand::EosAttempt(args) = command {
        return groups::run_attempt(args).await;
    }
    let handle = tokio::runtime::Handle::current();
    client::blocking(move || {
        let (args, demo): (&DemoArgs, fn(&Demo) -> Result<()>) = match &command {
            DemoCommand::AbortResend(a) => (a, abort_resend),
            DemoCommand::TwoTopics(a) => (a, two_topics),
            DemoCommand::Lso(a) => (a, lso),
            DemoCommand::Fencing(a) => (a, fencing),
            DemoCommand::Sigkill(a) => (a, groups::sigkill),
            DemoCommand::Zombie(a) => (a, groups::zombie),
            DemoCommand::ConsumerLag(a) => (a, groups::consumer_lag),
            DemoCommand::EosAttempt(_) => bail!("eos-attempt is run above"),
            DemoCommand::Pipeline(a) => {
                crate::pipeline::driver::demo(a, &handle)?;
                println!("OK: every key exactly once, offsets committed to the end.");
                return Ok(ExitCode::SUCCESS);
            }
        };
        let d = Demo {
            connect: args.connect.clone(),
            prefix: args.prefix.clone(),
            suffix: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map(|d| d.as_millis())
                .unwrap_or_default(),
            handle,
        };
        demo(&d)?;
        println!("OK: the broker behaved as Kafka does.");
        Ok(ExitCode::SUCCESS)
    })
    .await
}

/// How long a demo waits for markers to make a transaction's outcome visible.
const VISIBLE: Duration = Duration::from_secs(30);

struct Demo {
    connect: ConnectArgs,
    prefix: String,
    suffix: u128,
    handle: tokio::runtime::Handle,
}

type Seen = Vec<(i32, i64, String)>;

impl Demo {
    fn name(&self, what: &str) -> String {
        format!("{}-{what}-{}", self.prefix, self.suffix)
    }

    fn create_topic(&self, name: &str, partitions: i32) -> Result<()> {
        let admin: AdminClient<CliContext> = self
            .connect
            .client_config(&[])?
            .create_with_context(CliContext)
            .context("cannot create the admin client")?;
        let topic = NewTopic::new(name, partitions, TopicReplication::Fixed(-1));
        let options = AdminOptions::new().operation_timeout(Some(REQUEST_TIMEOUT));
        for r in self
            .handle
            .block_on(admin.create_topics([&topic], &options))
            .with_context(|| format!("cannot create topic {name}"))?
        {
            r.map_err(|(t, code)| anyhow!("cannot create topic {t}: {code}"))?;
        }
        println!("created topic {name} ({partitions} partition(s))");
        Ok(())
    }

    /// A transactional producer with `init_transactions` done.
    fn transactional(&self, id: &str) -> Result<FutureProducer<CliContext>> {
        let p: FutureProducer<CliContext> = self
            .connect
            .client_config(&[("transactional.id", id), ("linger.ms", "5")])?
            .create_with_context(CliContext)
            .context("cannot create the producer")?;
        p.init_transactions(REQUEST_TIMEOUT)
            .with_context(|| format!("init_transactions for transactional.id {id}"))?;
        println!("producer with transactional.id {id}: init_transactions done");
        Ok(p)
    }

    fn plain(&self) -> Result<FutureProducer<CliContext>> {
        self.connect
            .client_config(&[("enable.idempotence", "false"), ("acks", "all")])?
            .create_with_context(CliContext)
            .context("cannot create the producer")
    }

    /// Sends one record and waits for its acknowledgement: (partition, offset).
    fn send(
        &self,
        p: &FutureProducer<CliContext>,
        topic: &str,
        value: &str,
    ) -> Result<(i32, i64), KafkaError> {
        let record: FutureRecord<'_, (), str> = FutureRecord::to(topic).partition(0).payload(value);
        match self.handle.block_on(p.send(record, REQUEST_TIMEOUT)) {
            Ok(d) => Ok((d.partition, d.offset)),
            Err((e, _)) => Err(e),
        }
    }

    fn send_ok(&self, p: &FutureProducer<CliContext>, topic: &str, value: &str) -> Result<i64> {
        let (_, offset) = self
            .send(p, topic, value)
            .with_context(|| format!("send of {value:?} to {topic}"))?;
        println!("  sent {value:?} -> {topic}[0] offset {offset}");
        Ok(offset)
    }

    /// Every record of partition 0 a reader at `isolation` gets until it
    /// reaches the end (the LSO for read_committed, the high watermark otherwise).
    fn read(&self, topic: &str, isolation: IsolationLevel) -> Result<Seen> {
        let consumer: BaseConsumer<CliContext> = assigning_consumer(
            &self.connect,
            isolation,
            &[
                ("enable.partition.eof", "true"),
                ("fetch.wait.max.ms", "100"),
            ],
        )?;
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition_offset(topic, 0, Offset::Beginning)?;
        consumer.assign(&tpl)?;
        let deadline = Instant::now() + VISIBLE;
        let mut seen = Vec::new();
        loop {
            if Instant::now() > deadline {
                bail!("reading {topic} did not reach its end within {VISIBLE:?}");
            }
            match consumer.poll(Duration::from_millis(100)) {
                None => {}
                Some(Err(KafkaError::PartitionEOF(_))) => return Ok(seen),
                Some(Err(e)) => bail!("consumer error: {e}"),
                Some(Ok(m)) => seen.push((
                    m.partition(),
                    m.offset(),
                    String::from_utf8_lossy(m.payload().unwrap_or_default()).into_owned(),
                )),
            }
        }
    }

    fn values(&self, topic: &str, isolation: IsolationLevel) -> Result<Vec<String>> {
        Ok(self
            .read(topic, isolation)?
            .into_iter()
            .map(|(_, _, v)| v)
            .collect())
    }

    /// Waits until a read_committed reader sees `expected`; prints it.
    fn wait_committed(&self, topic: &str, expected: &[String]) -> Result<()> {
        let deadline = Instant::now() + VISIBLE;
        loop {
            let got = self.values(topic, IsolationLevel::ReadCommitted)?;
            if got == expected {
                println!("  read_committed {topic}: {got:?}");
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!("read_committed {topic}: expected {expected:?}, got {got:?}");
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// (low, high) watermarks as a reader at `isolation` sees them: for
    /// read_committed the high one is the last stable offset.
    fn watermarks(&self, topic: &str, isolation: IsolationLevel) -> Result<(i64, i64)> {
        let consumer = assigning_consumer(&self.connect, isolation, &[])?;
        Ok(consumer.fetch_watermarks(topic, 0, REQUEST_TIMEOUT)?)
    }
}

fn check<T: PartialEq + std::fmt::Debug>(what: &str, got: T, expected: T) -> Result<()> {
    if got == expected {
        Ok(())
    } else {
        bail!("{what}: expected {expected:?}, got {got:?}")
    }
}

fn strings(prefix: &str, n: usize) -> Vec<String> {
    (0..n).map(|i| format!("{prefix}-{i}")).collect()
}

fn abort_resend(d: &Demo) -> Result<()> {
    let topic = d.name("abort-resend");
    d.create_topic(&topic, 1)?;
    let p = d.transactional(&d.name("abort-resend-txn"))?;
    let (a, b1, b2) = (strings("A", 5), strings("B-try1", 3), strings("B-try2", 5));

    println!("batch A: 5 records in one transaction");
    p.begin_transaction()?;
    for v in &a {
        d.send_ok(&p, &topic, v)?;
    }
    p.commit_transaction(REQUEST_TIMEOUT)?;
    println!("  committed");

    println!("batch B, first try: processing fails after 3 records");
    p.begin_transaction()?;
    for v in &b1 {
        d.send_ok(&p, &topic, v)?;
    }
    p.abort_transaction(REQUEST_TIMEOUT)?;
    println!("  aborted (the 3 records are in the log, marked by an ABORT control record)");

    println!("batch B, second try: 5 records");
    p.begin_transaction()?;
    for v in &b2 {
        d.send_ok(&p, &topic, v)?;
    }
    p.commit_transaction(REQUEST_TIMEOUT)?;
    println!("  committed");

    let committed: Vec<String> = a.iter().chain(&b2).cloned().collect();
    d.wait_committed(&topic, &committed)?;
    let uncommitted = d.values(&topic, IsolationLevel::ReadUncommitted)?;
    println!(
        "read_committed={} read_uncommitted={} (physically 5 + 3 + 5, logically 5 + 5)",
        committed.len(),
        uncommitted.len()
    );
    check("read_uncommitted count", uncommitted.len(), 13)?;
    println!(
        "inspect the log with: samsa dump-log --print-data-log <data-dir>/{topic}-0/{:020}.log",
        0
    );
    Ok(())
}

fn two_topics(d: &Demo) -> Result<()> {
    let (ta, tb) = (d.name("txn-a"), d.name("txn-b"));
    d.create_topic(&ta, 1)?;
    d.create_topic(&tb, 1)?;

    let committer = d.transactional(&d.name("committer"))?;
    println!("transaction 1 writes one record to each topic");
    committer.begin_transaction()?;
    d.send_ok(&committer, &ta, "committed-msg-in-A")?;
    d.send_ok(&committer, &tb, "committed-msg-in-B")?;
    check(
        "read_committed txn-a before the commit",
        d.values(&ta, IsolationLevel::ReadCommitted)?,
        vec![],
    )?;
    check(
        "read_committed txn-b before the commit",
        d.values(&tb, IsolationLevel::ReadCommitted)?,
        vec![],
    )?;
    println!("  before the commit read_committed sees nothing in either topic");
    committer.commit_transaction(REQUEST_TIMEOUT)?;
    println!("  committed");
    d.wait_committed(&ta, &["committed-msg-in-A".to_string()])?;
    d.wait_committed(&tb, &["committed-msg-in-B".to_string()])?;

    let aborter = d.transactional(&d.name("aborter"))?;
    println!("transaction 2 writes one record to each topic, flushed, then aborts");
    aborter.begin_transaction()?;
    d.send_ok(&aborter, &ta, "ABORTED-msg-in-A")?;
    d.send_ok(&aborter, &tb, "ABORTED-msg-in-B")?;
    aborter.abort_transaction(REQUEST_TIMEOUT)?;
    println!("  aborted");

    println!("transaction 3 writes one more record to each topic and commits");
    committer.begin_transaction()?;
    d.send_ok(&committer, &ta, "committed-msg-2-in-A")?;
    d.send_ok(&committer, &tb, "committed-msg-2-in-B")?;
    committer.commit_transaction(REQUEST_TIMEOUT)?;
    for (t, s) in [(&ta, "A"), (&tb, "B")] {
        d.wait_committed(
            t,
            &[
                format!("committed-msg-in-{s}"),
                format!("committed-msg-2-in-{s}"),
            ],
        )?;
        let all = d.values(t, IsolationLevel::ReadUncommitted)?;
        println!("  read_uncommitted {t}: {all:?}");
        check(
            &format!("read_uncommitted {t}"),
            all,
            vec![
                format!("committed-msg-in-{s}"),
                format!("ABORTED-msg-in-{s}"),
                format!("committed-msg-2-in-{s}"),
            ],
        )?;
    }
    Ok(())
}

fn lso(d: &Demo) -> Result<()> {
    let topic = d.name("lso");
    d.create_topic(&topic, 1)?;
    let plain = d.plain()?;
    let a = d.transactional(&d.name("lso-a"))?;

    println!("producer A opens a transaction and writes one record");
    a.begin_transaction()?;
    let first = d.send_ok(&a, &topic, "from-A-still-open")?;
    println!("producer B (plain, no transaction) writes one record after it");
    d.send_ok(&plain, &topic, "from-B-plain-after")?;

    let (_, hw) = d.watermarks(&topic, IsolationLevel::ReadUncommitted)?;
    let (_, lso) = d.watermarks(&topic, IsolationLevel::ReadCommitted)?;
    println!("  high watermark {hw}, last stable offset {lso} (ListOffsets read_committed)");
    check("last stable offset while A is open", lso, first)?;
    let held = d.read(&topic, IsolationLevel::ReadCommitted)?;
    println!("  read_committed while A is open: {held:?} (B's record is held back too)");
    check("read_committed while A is open", held, vec![])?;

    a.commit_transaction(REQUEST_TIMEOUT)?;
    println!("producer A commits");
    d.wait_committed(
        &topic,
        &[
            "from-A-still-open".to_string(),
            "from-B-plain-after".to_string(),
        ],
    )?;
    let seen = d.read(&topic, IsolationLevel::ReadCommitted)?;
    println!("  released in log order: {seen:?}");
    let offsets: Vec<i64> = seen.iter().map(|(_, o, _)| *o).collect();
    check("offsets after the commit", offsets, vec![first, first + 1])?;
    Ok(())
}

fn fencing(d: &Demo) -> Result<()> {
    let topic = d.name("fencing");
    d.create_topic(&topic, 1)?;
    let id = d.name("fencing-txn");

    let p1 = d.transactional(&id)?;
    println!("producer 1 begins a transaction");
    p1.begin_transaction()?;
    d.send_ok(&p1, &topic, "p1-before-fence")?;

    println!("producer 2 starts with the same transactional.id");
    let p2 = d.transactional(&id)?;
    println!("  its InitProducerId bumped the epoch and aborted producer 1's transaction");

    match d.send(&p1, &topic, "p1-after-fence") {
        Ok((_, offset)) => bail!("the fenced producer's send was acknowledged at offset {offset}"),
        Err(e) => println!("  producer 1's next send fails: {e}"),
    }
    match p1.commit_transaction(REQUEST_TIMEOUT) {
        Ok(()) => bail!("the fenced producer's commit succeeded"),
        Err(e) => println!("  producer 1's commit fails: {e}"),
    }

    p2.begin_transaction()?;
    d.send_ok(&p2, &topic, "p2-0")?;
    p2.commit_transaction(REQUEST_TIMEOUT)?;
    println!("producer 2 committed its own transaction");
    d.wait_committed(&topic, &["p2-0".to_string()])?;
    let all = d.values(&topic, IsolationLevel::ReadUncommitted)?;
    println!("  read_uncommitted: {all:?} (the send after the fence never reached the log)");
    check(
        "read_uncommitted",
        all,
        vec!["p1-before-fence".to_string(), "p2-0".to_string()],
    )?;
    Ok(())
}
