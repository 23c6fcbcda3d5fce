//! `deploy/compose.sasl-ssl.yaml`: the compose cluster with SASL_SSL on
//! every Kafka listener, mutual TLS between the containers and the
//! authorizer on, with certificates from `deploy/make-certs.sh`. Users and
//! ACLs are made with `samsa user` / `samsa acl` through `compose exec` on
//! a node's pod-local admin listener; then confluent-kafka on the host
//! (`tests/compat/secured_client.py`) creates a replicated topic as the
//! admin user, runs transactions and a read_committed group consumer as an
//! allowed user, and a user without ACLs is refused.

use std::time::Duration;

use samsa_tests::compat::{compat_script, PyScript};
use samsa_tests::compose::{repo_root, ComposeCluster};
use samsa_tests::unique_topic;

/// `samsa ARGS` inside node 0, on its admin listener.
fn samsa_in_node(c: &ComposeCluster, args: &[&str]) {
    let mut all = vec!["exec", "-T", "samsa-0", "samsa"];
    all.extend_from_slice(args);
    all.extend(["-b", "127.0.0.1:9095"]);
    c.compose(&all);
}

#[test]
fn sasl_ssl_compose_cluster_serves_an_authorized_client_and_refuses_others() {
    let certs = tempfile::tempdir().unwrap();
    let certs_dir = certs.path().join("certs");
    let made = std::process::Command::new("bash")
        .arg(repo_root().join("deploy").join("make-certs.sh"))
        .arg(&certs_dir)
        .output()
        .expect("run deploy/make-certs.sh");
    assert!(
        made.status.success(),
        "deploy/make-certs.sh: {}",
        String::from_utf8_lossy(&made.stderr)
    );
    let c = ComposeCluster::start_sasl_ssl(&[], &certs_dir);

    samsa_in_node(&c, &["user", "add", "admin", "--password", "admin-secret"]);
    samsa_in_node(&c, &["user", "add", "app", "--password", "app-secret"]);
    samsa_in_node(
        &c,
        &["user", "add", "stranger", "--password", "stranger-secret"],
    );
    let topic = unique_topic("compose-secured");
    let group = unique_topic("compose-secured-group");
    for op in ["WRITE", "READ"] {
        samsa_in_node(
            &c,
            &[
                "acl",
                "add",
                "--topic",
                &topic,
                "--principal",
                "User:app",
                "--operation",
                op,
            ],
        );
    }
    samsa_in_node(
        &c,
        &[
            "acl",
            "add",
            "--transactional-id",
            "compose-secured-app",
            "--prefixed",
            "--principal",
            "User:app",
            "--operation",
            "WRITE",
        ],
    );
    samsa_in_node(
        &c,
        &[
            "acl",
            "add",
            "--group",
            &group,
            "--principal",
            "User:app",
            "--operation",
            "READ",
        ],
    );

    let dir = tempfile::tempdir().unwrap();
    let ca = certs_dir.join("ca.pem").display().to_string();
    let args: Vec<String> = [
        "--bootstrap",
        &c.bootstrap(),
        "--ca",
        &ca,
        "--topic",
        &topic,
        "--partitions",
        "3",
        "--transactional-id",
        &unique_topic("compose-secured-app"),
        "--group",
        &group,
        "--user",
        "app",
        "--password",
        "app-secret",
        "--stranger",
        "stranger",
        "--stranger-password",
        "stranger-secret",
        "--admin-user",
        "admin",
        "--admin-password",
        "admin-secret",
    ]
    .iter()
    .map(|a| (*a).to_owned())
    .collect();
    let mut script = PyScript::spawn(&compat_script("secured_client.py"), &args, dir.path());
    let status = script.wait(Duration::from_secs(240));
    assert!(
        status.success(),
        "the SASL_SSL client saw a difference\n{}",
        script.output(40)
    );
    eprintln!("containers: {}", script.output(2));
}
