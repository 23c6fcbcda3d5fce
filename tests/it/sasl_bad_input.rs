//! Bad input on the SASL path of a SASL_PLAINTEXT listener, over a real
//! socket: each case gets Kafka's error (or the close Kafka does) and no
//! panic, and the broker keeps serving the next client. Authenticating for
//! real, with real clients, is `tests/compat/test_security.py`.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use bytes::Bytes;
use kafka_protocol::messages::{
    MetadataRequest, SaslAuthenticateRequest, SaslAuthenticateResponse, SaslHandshakeRequest,
};
use kafka_protocol::protocol::StrBytes;
use samsa_tests::client::{KafkaClient, ReadOutcome};
use samsa_tests::node::free_port;
use samsa_tests::SamsaNode;

const UNSUPPORTED_SASL_MECHANISM: i16 = 33;
const SASL_AUTHENTICATION_FAILED: i16 = 58;
/// How long the broker may take to close a connection it should close.
const CLOSE_TIMEOUT: Duration = Duration::from_secs(10);
/// The node's `authentication_timeout_ms`.
const AUTH_TIMEOUT: Duration = Duration::from_millis(1500);

struct SaslNode {
    node: SamsaNode,
    sasl: SocketAddr,
}

impl SaslNode {
    fn start() -> SaslNode {
        SaslNode::with_auth_timeout(AUTH_TIMEOUT)
    }

    fn with_auth_timeout(timeout: Duration) -> SaslNode {
        let port = free_port();
        let node = SamsaNode::start_with(&[
            &format!("listeners.sasl.listen=127.0.0.1:{port}"),
            "listeners.sasl.security_protocol=SASL_PLAINTEXT",
            &format!("authentication_timeout_ms={}", timeout.as_millis()),
        ]);
        SaslNode {
            node,
            sasl: SocketAddr::from(([127, 0, 0, 1], port)),
        }
    }

    /// A connection to the SASL listener after ApiVersions (which needs no
    /// authentication).
    fn connect(&self) -> KafkaClient {
        KafkaClient::connect(self.sasl).unwrap()
    }

    /// A connection that has picked `mechanism`.
    fn handshaken(&self, mechanism: &'static str) -> KafkaClient {
        let mut c = self.connect();
        let r = c
            .send(
                &SaslHandshakeRequest::default()
                    .with_mechanism(StrBytes::from_static_str(mechanism)),
                1,
            )
            .unwrap();
        assert_eq!(r.error_code, 0, "{r:?}");
        c
    }

    /// Both listeners still serve: Metadata on the plaintext one, a new
    /// connection's ApiVersions on the SASL one.
    fn assert_serving(&self, after: &str) {
        let mut plain = self.node.client();
        plain
            .metadata(Some(&[]))
            .unwrap_or_else(|e| panic!("plaintext listener after {after}: {e:#}"));
        KafkaClient::connect(self.sasl)
            .unwrap_or_else(|e| panic!("SASL listener after {after}: {e:#}"));
    }
}

fn authenticate(c: &mut KafkaClient, token: &[u8]) -> SaslAuthenticateResponse {
    c.send(
        &SaslAuthenticateRequest::default().with_auth_bytes(Bytes::copy_from_slice(token)),
        2,
    )
    .unwrap()
}

fn assert_closed(c: &mut KafkaClient, case: &str) {
    match c.wait_for_frame_or_close(CLOSE_TIMEOUT) {
        ReadOutcome::Closed => {}
        other => panic!("{case}: the connection should be closed, got {other:?}"),
    }
}

fn assert_failed(r: &SaslAuthenticateResponse, case: &str) {
    assert_eq!(r.error_code, SASL_AUTHENTICATION_FAILED, "{case}: {r:?}");
    let message = r
        .error_message
        .as_ref()
        .map(|m| m.to_string())
        .unwrap_or_default();
    assert!(!message.is_empty(), "{case}: no message");
}

#[test]
fn an_unknown_mechanism_is_refused_with_the_enabled_ones_and_closed() {
    let n = SaslNode::start();
    let mut c = n.connect();
    let r = c
        .send(
            &SaslHandshakeRequest::default().with_mechanism(StrBytes::from_static_str("GSSAPI")),
            1,
        )
        .unwrap();
    assert_eq!(r.error_code, UNSUPPORTED_SASL_MECHANISM, "{r:?}");
    let offered: Vec<String> = r.mechanisms.iter().map(|m| m.to_string()).collect();
    assert_eq!(offered, ["SCRAM-SHA-512", "SCRAM-SHA-256", "PLAIN"]);
    assert_closed(&mut c, "unknown mechanism");
    n.assert_serving("an unknown mechanism");
}

#[test]
fn garbage_and_oversized_sasl_tokens_fail_authentication_without_harm() {
    let n = SaslNode::start();
    let cases: [(&'static str, Vec<u8>, &str); 6] = [
        (
            "SCRAM-SHA-256",
            vec![0xff, 0xfe, 0x00, 0x41],
            "SCRAM first message not UTF-8",
        ),
        (
            "SCRAM-SHA-512",
            b"y,,n=alice".to_vec(),
            "SCRAM first message without a nonce",
        ),
        (
            "SCRAM-SHA-512",
            b"n,a=bob,n=alice,r=abc".to_vec(),
            "SCRAM impersonation (authzid)",
        ),
        (
            "SCRAM-SHA-512",
            [b"n,,n=alice,r=".as_slice(), &[b'a'; 8192]].concat(),
            "SCRAM first message of 8 KiB",
        ),
        (
            "PLAIN",
            b"no separators at all".to_vec(),
            "PLAIN without NUL separators",
        ),
        (
            "PLAIN",
            b"\0alice\0".to_vec(),
            "PLAIN with an empty password",
        ),
    ];
    for (mechanism, token, case) in cases {
        let mut c = n.handshaken(mechanism);
        let r = authenticate(&mut c, &token);
        assert_failed(&r, case);
        assert_closed(&mut c, case);
    }
    n.assert_serving("garbage tokens");
}

#[test]
fn an_unknown_user_gets_a_challenge_then_fails_like_a_wrong_password() {
    let n = SaslNode::start();
    let mut c = n.handshaken("SCRAM-SHA-512");
    let r = authenticate(&mut c, b"n,,n=nobody,r=clientnonce");
    assert_eq!(r.error_code, 0, "{r:?}");
    let server_first = String::from_utf8(r.auth_bytes.to_vec()).unwrap();
    assert!(
        server_first.starts_with("r=clientnonce")
            && server_first.contains(",s=")
            && server_first.contains(",i="),
        "{server_first}"
    );
    let nonce = server_first
        .split(',')
        .find_map(|a| a.strip_prefix("r="))
        .unwrap();
    let client_final = format!("c=biws,r={nonce},p=AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA==");
    let r = authenticate(&mut c, client_final.as_bytes());
    assert_failed(&r, "unknown user's proof");
    assert_closed(&mut c, "unknown user");
    n.assert_serving("an unknown user");
}

#[test]
fn requests_before_authentication_and_oversized_frames_close_the_connection() {
    // The authentication timeout far beyond CLOSE_TIMEOUT: only the cases
    // themselves close these connections in time.
    let n = SaslNode::with_auth_timeout(Duration::from_secs(120));
    // Anything but ApiVersions and SASL before authenticating.
    let mut c = n.connect();
    c.send_only(&MetadataRequest::default(), 12).unwrap();
    assert_closed(&mut c, "Metadata before authentication");

    // A frame over Kafka's sasl.server.max.receive.size (512 KiB) before
    // authenticating is not read at all.
    let mut c = n.handshaken("SCRAM-SHA-512");
    let mut frame = Vec::with_capacity(4 + 1024 * 1024);
    frame.extend_from_slice(&(1024 * 1024i32).to_be_bytes());
    frame.extend_from_slice(&[0u8; 1024]);
    c.send_raw_bytes(&frame).unwrap();
    assert_closed(&mut c, "1 MiB frame before authentication");
    n.assert_serving("oversized and early requests");
}

#[test]
fn a_silent_or_half_done_handshake_is_closed_after_the_authentication_timeout() {
    let n = SaslNode::start();
    let started = Instant::now();
    let mut silent = KafkaClient::connect_with_timeout(n.sasl, CLOSE_TIMEOUT).unwrap();
    let mut half_done = n.handshaken("SCRAM-SHA-256");
    let r = authenticate(&mut half_done, b"n,,n=alice,r=nonce");
    assert_eq!(r.error_code, 0, "{r:?}");
    assert_closed(&mut silent, "a connection that sends nothing");
    assert_closed(&mut half_done, "a SCRAM exchange left half done");
    assert!(
        started.elapsed() >= AUTH_TIMEOUT,
        "closed after {:?}, before the authentication timeout",
        started.elapsed()
    );
    n.assert_serving("abandoned handshakes");
}
