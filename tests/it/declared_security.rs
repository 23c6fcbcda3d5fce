//! Users and ACLs declared in the configuration (`scram_users_dir`,
//! `acls`), on one node with a SASL_PLAINTEXT listener and the authorizer
//! on, with the `rdkafka` crate as the client:
//!
//! - once the node serves, the declared user authenticates (SCRAM-SHA-512
//!   and SCRAM-SHA-256) and writes where its declared ACL allows, and
//!   nowhere else;
//! - a restart writes nothing again (the stored credential verifies);
//! - a changed password file takes effect at the next start: the old
//!   password is refused, the new one accepted;
//! - a user and an ACL made with `samsa user` / `samsa acl` stay through
//!   it all (the declaration never deletes).

use std::path::Path;
use std::time::Duration;

use rdkafka::config::ClientConfig;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use samsa_tests::cluster::run_cli;
use samsa_tests::node::{free_port, samsa_bin};
use samsa_tests::rdk::{authentication_refusal, ClientErrors};
use samsa_tests::wait::wait_until;
use samsa_tests::{unique_topic, SamsaNode};

const WRITTEN: &str = "declared users and ACLs written";
const IN_PLACE: &str = "declared users and ACLs are in the metadata";

fn config(sasl: &str, mechanism: &str, user: &str, password: &str) -> ClientConfig {
    let mut c = ClientConfig::new();
    c.set("bootstrap.servers", sasl)
        .set("security.protocol", "SASL_PLAINTEXT")
        .set("sasl.mechanism", mechanism)
        .set("sasl.username", user)
        .set("sasl.password", password)
        .set("broker.address.family", "v4")
        .set("message.timeout.ms", "20000");
    c
}

/// Produces one record to `topic`; the delivery error, if any.
fn produce(config: &ClientConfig, topic: &str) -> Option<KafkaError> {
    let errors = ClientErrors::default();
    let producer: BaseProducer<ClientErrors> = config
        .create_with_context(errors.clone())
        .expect("a producer");
    producer
        .send(BaseRecord::<(), str>::to(topic).payload("declared"))
        .map_err(|(e, _)| e)
        .expect("enqueued");
    // flush() polls, so the delivery report has arrived when it returns.
    let flushed = producer.flush(Duration::from_secs(30));
    errors
        .delivery_failures()
        .into_iter()
        .next()
        .or(flushed.err())
}

/// The node's log since its `start`-th start.
fn log_of_start(node: &SamsaNode, start: u32) -> String {
    let log = std::fs::read_to_string(node.log_path()).unwrap_or_default();
    let marker = format!("===== samsa start #{start} =====");
    log.split_once(&marker)
        .map(|(_, after)| after.to_owned())
        .unwrap_or_default()
}

fn admin(node: &SamsaNode, args: &[&str]) -> String {
    let mut all: Vec<String> = args.iter().map(|a| (*a).to_owned()).collect();
    all.extend(["-b".to_owned(), node.bootstrap()]);
    let out = run_cli(&samsa_bin(), &all, Duration::from_secs(60));
    assert!(
        out.status.success(),
        "samsa {args:?}: {}{}",
        out.stdout,
        out.stderr
    );
    out.stdout
}

fn write_password(users: &Path, user: &str, password: &str) {
    std::fs::write(users.join(user), format!("{password}\n")).unwrap();
}

#[test]
fn declared_users_and_acls_are_written_once_and_follow_a_changed_password() {
    let users = tempfile::tempdir().unwrap();
    write_password(users.path(), "app", "app-secret");
    let port = free_port();
    let sasl = format!("127.0.0.1:{port}");
    let prefix = unique_topic("declared");
    let allowed = format!("{prefix}-orders");
    let other = unique_topic("undeclared");
    let settings = [
        format!("listeners.sasl.listen={sasl}"),
        "listeners.sasl.security_protocol=SASL_PLAINTEXT".to_owned(),
        "authorizer_enable=true".to_owned(),
        r#"super_users=["User:ANONYMOUS"]"#.to_owned(),
        format!("scram_users_dir={}", users.path().display()),
        format!(
            r#"acls=[{{principal = "User:app", resource_type = "TOPIC", resource_name = "{prefix}-", pattern_type = "PREFIXED", operation = "WRITE"}}]"#
        ),
    ];
    let settings: Vec<&str> = settings.iter().map(String::as_str).collect();
    let mut node = SamsaNode::start_with(&settings);
    admin(&node, &["topic", "create", &allowed, "--partitions", "1"]);
    admin(&node, &["topic", "create", &other, "--partitions", "1"]);
    admin(&node, &["user", "add", "ops", "--password", "ops-secret"]);
    admin(
        &node,
        &[
            "acl",
            "add",
            "--topic",
            &other,
            "--principal",
            "User:ops",
            "--operation",
            "WRITE",
        ],
    );

    wait_until(
        "the declared user and ACL are written",
        Duration::from_secs(30),
        || log_of_start(&node, 1).contains(IN_PLACE).then_some(()),
    );
    assert!(
        log_of_start(&node, 1).contains(WRITTEN),
        "{}",
        node.log_tail(40)
    );
    for mechanism in ["SCRAM-SHA-512", "SCRAM-SHA-256"] {
        let app = config(&sasl, mechanism, "app", "app-secret");
        assert_eq!(
            produce(&app, &allowed),
            None,
            "app ({mechanism}) writes {allowed}"
        );
        assert_eq!(
            produce(&app, &other),
            Some(KafkaError::MessageProduction(
                RDKafkaErrorCode::TopicAuthorizationFailed
            )),
            "app ({mechanism}) may not write {other}"
        );
    }

    // A restart finds everything in place and writes nothing.
    node.sigterm_and_wait();
    node.restart();
    wait_until(
        "the restarted node checks the declaration",
        Duration::from_secs(30),
        || log_of_start(&node, 2).contains(IN_PLACE).then_some(()),
    );
    assert!(
        !log_of_start(&node, 2).contains(WRITTEN),
        "a restart rewrote the declared users or ACLs:\n{}",
        node.log_tail(40)
    );

    // A changed password takes effect at the next start.
    write_password(users.path(), "app", "app-rotated");
    node.sigterm_and_wait();
    node.restart();
    wait_until(
        "the rotated password is written",
        Duration::from_secs(30),
        || log_of_start(&node, 3).contains(IN_PLACE).then_some(()),
    );
    assert!(
        log_of_start(&node, 3).contains(WRITTEN),
        "{}",
        node.log_tail(40)
    );
    let reason = authentication_refusal(&config(&sasl, "SCRAM-SHA-512", "app", "app-secret"));
    assert!(reason.contains("invalid credentials"), "{reason}");
    let rotated = config(&sasl, "SCRAM-SHA-512", "app", "app-rotated");
    assert_eq!(
        produce(&rotated, &allowed),
        None,
        "app writes with the rotated password"
    );

    // What the tools made is untouched.
    let ops = config(&sasl, "SCRAM-SHA-512", "ops", "ops-secret");
    assert_eq!(produce(&ops, &other), None, "ops still writes {other}");
    let acls = admin(&node, &["acl", "list"]);
    assert!(
        acls.contains("User:ops") && acls.contains("User:app"),
        "{acls}"
    );
}
