//! The `rdkafka` crate over TLS and SASL: librdkafka built with OpenSSL
//! (the workspace's `ssl` feature, which also gives it SASL PLAIN and
//! SCRAM; the crate's `sasl` feature is GSSAPI) against a node whose
//! SASL_SSL listener offers SCRAM-SHA-512, with the authorizer on. Users
//! and ACLs are made with `samsa user` / `samsa acl` through the plaintext
//! listener (its `User:ANONYMOUS` is a super user).
//!
//! - A wrong password and an unknown user are refused with librdkafka's
//!   authentication error carrying the broker's message; a user with no
//!   ACL on a topic cannot write to it (TOPIC_AUTHORIZATION_FAILED); and
//!   the broker keeps serving everyone else.
//! - `samsa verify` — rdkafka's idempotent, transactional, pipelined and
//!   read_committed group workloads, checked for exactly-once — runs clean
//!   over SASL_SSL with `-X` properties, as an operator runs it against a
//!   secured cluster.

use std::time::Duration;

use rdkafka::config::ClientConfig;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use samsa_tests::cluster::run_cli;
use samsa_tests::node::{free_port, samsa_bin};
use samsa_tests::pki::Ca;
use samsa_tests::rdk::{authentication_refusal, ClientErrors};
use samsa_tests::{unique_topic, SamsaNode};
use serde_json::Value;

struct SecuredNode {
    node: SamsaNode,
    sasl_ssl: String,
    ca: String,
    _pki: tempfile::TempDir,
}

impl SecuredNode {
    fn start() -> SecuredNode {
        let pki = tempfile::tempdir().unwrap();
        let issued = Ca::new("samsa test CA").issue("node", pki.path());
        let port = free_port();
        let path = |p: &std::path::Path| p.display().to_string();
        let settings = [
            format!("listeners.secure.listen=127.0.0.1:{port}"),
            "listeners.secure.security_protocol=SASL_SSL".to_owned(),
            format!("ssl_cert_file={}", path(&issued.cert)),
            format!("ssl_key_file={}", path(&issued.key)),
            r#"sasl_enabled_mechanisms=["SCRAM-SHA-512"]"#.to_owned(),
            "authorizer_enable=true".to_owned(),
            r#"super_users=["User:ANONYMOUS","User:verifier"]"#.to_owned(),
        ];
        let settings: Vec<&str> = settings.iter().map(String::as_str).collect();
        let node = SamsaNode::start_with(&settings);
        SecuredNode {
            node,
            sasl_ssl: format!("127.0.0.1:{port}"),
            ca: path(&issued.ca),
            _pki: pki,
        }
    }

    /// `samsa <args> -b <plaintext listener>`, which must succeed.
    fn admin(&self, args: &[&str]) {
        let mut all: Vec<String> = args.iter().map(|a| (*a).to_owned()).collect();
        all.extend(["-b".to_owned(), self.node.bootstrap()]);
        let out = run_cli(&samsa_bin(), &all, Duration::from_secs(60));
        assert!(
            out.status.success(),
            "samsa {args:?}: {}{}",
            out.stdout,
            out.stderr
        );
    }

    /// librdkafka properties of a SCRAM-SHA-512 client over TLS.
    fn properties(&self, user: &str, password: &str) -> Vec<(String, String)> {
        [
            ("bootstrap.servers", self.sasl_ssl.as_str()),
            ("security.protocol", "SASL_SSL"),
            ("sasl.mechanism", "SCRAM-SHA-512"),
            ("sasl.username", user),
            ("sasl.password", password),
            ("ssl.ca.location", self.ca.as_str()),
            ("broker.address.family", "v4"),
        ]
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
    }

    fn config(&self, user: &str, password: &str) -> ClientConfig {
        let mut config = ClientConfig::new();
        for (k, v) in self.properties(user, password) {
            config.set(k, v);
        }
        config
    }
}

#[test]
fn rdkafka_over_sasl_ssl_scram_is_refused_with_bad_credentials_and_verifies_clean() {
    let node = SecuredNode::start();
    node.admin(&["user", "add", "verifier", "--password", "verifier-secret"]);
    node.admin(&["user", "add", "stranger", "--password", "stranger-secret"]);
    let topic = unique_topic("sasl-ssl-rdkafka");
    node.admin(&["topic", "create", &topic, "--partitions", "1"]);

    for (user, password) in [("verifier", "not-the-password"), ("nobody", "whatever")] {
        let reason = authentication_refusal(&node.config(user, password));
        assert!(
            reason.contains("invalid credentials") && reason.contains("SCRAM-SHA-512"),
            "{user}: librdkafka's reason: {reason}"
        );
        assert!(
            !reason.contains(password),
            "{user}: the reason shows the password: {reason}"
        );
    }

    // Authenticated, but without an ACL on the topic: its record fails
    // with TOPIC_AUTHORIZATION_FAILED, and so does describing it.
    let errors = ClientErrors::default();
    let producer: BaseProducer<ClientErrors> = node
        .config("stranger", "stranger-secret")
        .set("message.timeout.ms", "20000")
        .create_with_context(errors.clone())
        .expect("a producer");
    producer
        .send(BaseRecord::<(), str>::to(&topic).payload("not allowed"))
        .map_err(|(e, _)| e)
        .expect("enqueued");
    // flush() polls, so the delivery report has arrived when it returns.
    let _ = producer.flush(Duration::from_secs(30));
    assert_eq!(
        errors.delivery_failures(),
        vec![KafkaError::MessageProduction(
            RDKafkaErrorCode::TopicAuthorizationFailed
        )],
        "stranger's record to {topic}"
    );
    let md = producer
        .client()
        .fetch_metadata(Some(&topic), Duration::from_secs(20))
        .expect("metadata over SASL_SSL");
    assert_eq!(
        md.topics()
            .first()
            .and_then(|t| t.error())
            .map(RDKafkaErrorCode::from),
        Some(RDKafkaErrorCode::TopicAuthorizationFailed),
        "stranger may not describe {topic}"
    );
    drop(producer);

    // The whole exactly-once surface over SASL_SSL: samsa verify's rdkafka
    // workloads and checker.
    let history = tempfile::tempdir().unwrap();
    let mut args: Vec<String> = [
        "verify",
        "--bootstrap-server",
        &node.sasl_ssl,
        "--duration",
        "15s",
        "--rate",
        "200",
        "--seed",
        "17",
        "--topic-prefix",
        &unique_topic("sasl-ssl-verify"),
        "--history",
        &history.path().join("history.jsonl").display().to_string(),
        "--json",
    ]
    .iter()
    .map(|a| (*a).to_owned())
    .collect();
    for (k, v) in node.properties("verifier", "verifier-secret") {
        if k != "bootstrap.servers" {
            args.extend(["-X".to_owned(), format!("{k}={v}")]);
        }
    }
    let out = run_cli(&samsa_bin(), &args, Duration::from_secs(180));
    let report: Value = serde_json::from_str(out.stdout.trim()).unwrap_or_else(|e| {
        panic!(
            "no JSON report ({e}): {:?}\n{}\n{}",
            out.status,
            out.stderr,
            node.node.log_tail(40)
        )
    });
    assert_eq!(
        out.status.code(),
        Some(0),
        "samsa verify over SASL_SSL: {report}\n{}",
        out.stderr
    );
    assert_eq!(report["anomaly_count"], 0, "{report:#}");
    assert_eq!(report["valid"], true, "{report:#}");
    assert!(
        report["transactions"]["committed"].as_u64().unwrap_or(0) > 0,
        "no transaction committed over SASL_SSL: {report:#}"
    );
}
