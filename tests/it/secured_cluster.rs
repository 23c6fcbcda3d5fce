//! The whole of samsa's security at once, end to end with a real client: a
//! three-node cluster with SASL_SSL listeners (SCRAM-SHA-512, TLS from one
//! CA), mutual TLS between nodes, and the authorizer on. The application's
//! user and its topic and transactional-id ACLs are declared in every
//! node's configuration (`scram_users_dir`, `acls`: what the Helm chart
//! renders), so three brokers write them at once and must converge; the
//! other user and the group ACL are made with `samsa user` / `samsa acl`
//! through the plaintext admin listener (`User:ANONYMOUS` is the super user
//! there). Either way they travel through the controller quorum to every
//! node. Then confluent-kafka
//! (`tests/compat/secured_client.py`), connected to every node's SASL_SSL
//! listener, runs transactions over partitions led by different nodes, a
//! read_committed group consumer reads exactly what was committed and
//! commits, and a user without ACLs is refused.

use std::time::Duration;

use samsa_tests::cluster::SamsaCluster;
use samsa_tests::compat::{compat_script, PyScript};
use samsa_tests::node::free_port;
use samsa_tests::pki::Ca;
use samsa_tests::txn::create_topic_default_rf;
use samsa_tests::unique_topic;
use samsa_tests::wait::wait_until;

const PARTITIONS: i32 = 3;

#[test]
fn cluster_with_sasl_ssl_mutual_tls_and_acls_serves_a_real_client() {
    let pki = tempfile::tempdir().unwrap();
    let node = Ca::new("samsa CA").issue("node", pki.path());
    let path = |p: &std::path::Path| p.display().to_string();
    let users = tempfile::tempdir().unwrap();
    std::fs::write(users.path().join("app"), "app-secret\n").unwrap();
    let topic = unique_topic("secured");
    let declared_acls = format!(
        r#"acls=[{{principal = "User:app", resource_type = "TOPIC", resource_name = "{topic}", operation = "WRITE"}}, {{principal = "User:app", resource_type = "TOPIC", resource_name = "{topic}", operation = "READ"}}, {{principal = "User:app", resource_type = "TRANSACTIONAL_ID", resource_name = "secured-app", pattern_type = "PREFIXED", operation = "WRITE"}}]"#
    );
    let settings = [
        format!("ssl_cert_file={}", path(&node.cert)),
        format!("ssl_key_file={}", path(&node.key)),
        format!("ssl_ca_file={}", path(&node.ca)),
        format!("inter_node_tls_cert_file={}", path(&node.cert)),
        format!("inter_node_tls_key_file={}", path(&node.key)),
        format!("inter_node_tls_ca_file={}", path(&node.ca)),
        "authorizer_enable=true".to_owned(),
        r#"super_users=["User:ANONYMOUS"]"#.to_owned(),
        format!("scram_users_dir={}", path(users.path())),
        declared_acls,
    ];
    let settings: Vec<&str> = settings.iter().map(String::as_str).collect();
    let mut cluster = SamsaCluster::new(3, &settings);
    let mut secure = Vec::new();
    for id in cluster.ids() {
        let port = free_port();
        cluster.set_for_node(id, &format!("listeners.secure.listen=127.0.0.1:{port}"));
        cluster.set_for_node(id, "listeners.secure.security_protocol=SASL_SSL");
        secure.push(format!("127.0.0.1:{port}"));
    }
    for id in cluster.ids() {
        cluster.spawn(id);
    }
    for id in cluster.ids() {
        cluster.wait_ready(id);
    }

    create_topic_default_rf(&mut cluster.client(1), &topic, PARTITIONS).unwrap();
    let transactional_id = unique_topic("secured-app");
    let group = unique_topic("secured-group");

    // Users and ACLs through the CLI on node 2's admin listener: they reach
    // the other nodes through the quorum.
    let admin = cluster.node(2).addr().to_string();
    let samsa = |args: &[&str]| {
        let mut all: Vec<String> = args.iter().map(|a| (*a).to_owned()).collect();
        all.extend(["-b".to_owned(), admin.clone()]);
        let (status, output) = cluster.run_to_exit(&all, Duration::from_secs(60));
        assert!(status.success(), "samsa {args:?}: {output}");
    };
    samsa(&["user", "add", "stranger", "--password", "stranger-secret"]);
    samsa(&[
        "acl",
        "add",
        "--group",
        &group,
        "--principal",
        "User:app",
        "--operation",
        "READ",
    ]);

    // The declared user and ACLs are written by the brokers once they
    // serve: the client starts when every node has them.
    for id in cluster.ids() {
        let bootstrap = cluster.node(id).addr().to_string();
        let list = |args: &[&str]| {
            let mut all: Vec<String> = args.iter().map(|a| (*a).to_owned()).collect();
            all.extend(["-b".to_owned(), bootstrap.clone()]);
            let (status, output) = cluster.run_to_exit(&all, Duration::from_secs(60));
            assert!(status.success(), "samsa {args:?}: {output}");
            output
        };
        wait_until(
            &format!("node {id} lists the declared user app and its ACLs"),
            Duration::from_secs(60),
            || {
                let users = list(&["user", "list"]);
                let credentials = users.lines().filter(|l| l.starts_with("app ")).count();
                let acls = list(&["acl", "list", "--principal", "User:app"]);
                let bindings = acls.lines().filter(|l| l.contains("User:app")).count();
                // Both SCRAM mechanisms; three declared ACLs and the group's.
                (credentials == 2 && bindings == 4).then_some(())
            },
        );
    }

    let dir = tempfile::tempdir().unwrap();
    let args: Vec<String> = [
        "--bootstrap",
        &secure.join(","),
        "--ca",
        &path(&node.ca),
        "--topic",
        &topic,
        "--partitions",
        &PARTITIONS.to_string(),
        "--transactional-id",
        &transactional_id,
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
    ]
    .iter()
    .map(|a| (*a).to_owned())
    .collect();
    let mut script = PyScript::spawn(&compat_script("secured_client.py"), &args, dir.path());
    let status = script.wait(Duration::from_secs(240));
    assert!(
        status.success(),
        "the secured client saw a difference\n{}\n{}",
        script.output(40),
        cluster.all_logs(30)
    );
    eprintln!("{}", script.output(3));
}
