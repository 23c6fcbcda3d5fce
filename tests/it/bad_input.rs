//! Bad input: each case must leave the broker up, serving the next client, and
//! the log as it was (what was written before is read back intact).

use std::time::{Duration, Instant};

use bytes::{BufMut, BytesMut};
use kafka_protocol::messages::api_versions_request::ApiVersionsRequest;
use kafka_protocol::messages::ApiKey;
use samsa_tests::batch::{with_bad_crc, with_corrupted_payload};
use samsa_tests::client::{KafkaClient, ReadOutcome};
use samsa_tests::codes::{CORRUPT_MESSAGE, NONE, UNKNOWN_TOPIC_OR_PARTITION, UNSUPPORTED_VERSION};
use samsa_tests::{unique_topic, BatchBuilder, SamsaNode};

/// How long the broker may take to close a connection it should close.
const CLOSE_TIMEOUT: Duration = Duration::from_secs(10);

/// A node with one single-partition topic holding three known records.
struct Fixture {
    node: SamsaNode,
    topic: String,
    expected: Vec<String>,
}

impl Fixture {
    fn new(settings: &[&str]) -> Fixture {
        let node = SamsaNode::start_with(settings);
        let topic = unique_topic("bad");
        let mut c = node.client();
        c.create_topic(&topic, 1).unwrap();
        let expected: Vec<String> = (0..3).map(|i| format!("before-{i}")).collect();
        let r = c
            .produce(&topic, 0, BatchBuilder::new().values(&expected).build(), -1)
            .unwrap();
        assert_eq!((r.error_code, r.base_offset), (NONE, 0), "{r:?}");
        let mut f = Fixture {
            node,
            topic,
            expected,
        };
        f.assert_healthy("before the bad input");
        f
    }

    fn raw(&self) -> KafkaClient {
        KafkaClient::connect_with_timeout(self.node.addr(), Duration::from_secs(5)).unwrap()
    }

    /// The node runs, a new client is served, the log holds exactly what was
    /// written, and a new write lands right after it.
    fn assert_healthy(&mut self, when: &str) {
        let mut c = match KafkaClient::connect(self.node.addr()) {
            Ok(c) => c,
            Err(e) => {
                // Tell a crash from a refusal: give a dying process a moment.
                let exited = samsa_tests::wait::try_wait_until(Duration::from_secs(2), || {
                    (!self.node.is_running()).then_some(())
                })
                .is_some();
                panic!(
                    "new client not served {when}: {e:#}; samsa process {}",
                    if exited {
                        "has EXITED (crashed)"
                    } else {
                        "is still running"
                    }
                );
            }
        };
        assert!(self.node.is_running(), "samsa exited {when}");
        let got: Vec<String> = c
            .fetch_all(&self.topic, 0, 0)
            .unwrap()
            .into_iter()
            .map(|r| String::from_utf8_lossy(&r.value.unwrap_or_default()).into_owned())
            .collect();
        assert_eq!(got, self.expected, "log content {when}");
        let v = format!("after-{}", self.expected.len());
        let r = c
            .produce(&self.topic, 0, BatchBuilder::new().record(&v).build(), -1)
            .unwrap();
        assert_eq!(
            (r.error_code, r.base_offset),
            (NONE, self.expected.len() as i64),
            "produce {when}: {r:?}"
        );
        self.expected.push(v);
    }
}

fn assert_closed(c: &mut KafkaClient, what: &str) {
    let started = Instant::now();
    match c.wait_for_frame_or_close(CLOSE_TIMEOUT) {
        ReadOutcome::Closed => {}
        ReadOutcome::Frame(f) => panic!(
            "{what}: expected the broker to close the connection, got a {}-byte frame: {:?}",
            f.len(),
            &f[..f.len().min(64)]
        ),
        ReadOutcome::Timeout => panic!(
            "{what}: connection still open after {:?} (expected the broker to close it)",
            started.elapsed()
        ),
    }
}

/// A request header written by hand (v1: key, version, correlation id,
/// nullable client id; v2 adds an empty tagged-field section).
fn header(key: i16, version: i16, correlation_id: i32, flexible: bool) -> BytesMut {
    let mut b = BytesMut::new();
    b.put_i16(key);
    b.put_i16(version);
    b.put_i32(correlation_id);
    b.put_i16(4);
    b.put_slice(b"evil");
    if flexible {
        b.put_u8(0);
    }
    b
}

fn frame(body: &[u8]) -> Vec<u8> {
    let mut f = Vec::with_capacity(body.len() + 4);
    f.extend_from_slice(&i32::try_from(body.len()).unwrap().to_be_bytes());
    f.extend_from_slice(body);
    f
}

#[test]
fn garbage_bytes_close_the_connection() {
    let mut f = Fixture::new(&[]);

    // An HTTP request on the Kafka port: "GET " read as a length is ~1.1 GiB.
    let mut c = f.raw();
    c.send_raw_bytes(b"GET / HTTP/1.1\r\nHost: localhost\r\n\r\n")
        .unwrap();
    assert_closed(&mut c, "HTTP request");
    f.assert_healthy("after an HTTP request");

    // A well-formed frame whose header is a known API (Metadata v12) but whose
    // body is garbage.
    let mut c = f.raw();
    let mut body = header(ApiKey::Metadata as i16, 12, 1, true);
    body.put_slice(&[0xff; 24]);
    c.send_raw_bytes(&frame(&body)).unwrap();
    assert_closed(&mut c, "Metadata v12 with a garbage body");
    // The log line names the client and shows the bytes that did not decode.
    samsa_tests::wait_until(
        "the malformed request's log line",
        Duration::from_secs(10),
        || {
            let log = f.node.log_tail(200);
            log.lines()
                .any(|l| {
                    l.contains("malformed Metadata v12 request")
                        && l.contains("starting ffffffff")
                        && l.contains("client id")
                })
                .then_some(())
        },
    );
    f.assert_healthy("after a garbage Metadata body");

    // A frame too short to hold a request header.
    let mut c = f.raw();
    c.send_raw_bytes(&frame(&[0x00, 0x03])).unwrap();
    assert_closed(&mut c, "2-byte frame");
    f.assert_healthy("after a 2-byte frame");

    // A negative length.
    let mut c = f.raw();
    c.send_raw_bytes(&(-5i32).to_be_bytes()).unwrap();
    assert_closed(&mut c, "negative frame length");
    f.assert_healthy("after a negative frame length");
}

#[test]
fn truncated_frame_then_disconnect() {
    let mut f = Fixture::new(&[]);

    // Announce 100 bytes, send 10, hang up.
    let mut c = f.raw();
    let mut partial = 100i32.to_be_bytes().to_vec();
    partial.extend_from_slice(&header(ApiKey::Metadata as i16, 12, 1, true)[..6]);
    partial.extend_from_slice(&[0; 4]);
    c.send_raw_bytes(&partial).unwrap();
    drop(c);
    f.assert_healthy("after a truncated frame and disconnect");

    // A truncated frame on a connection that stays open must not block others.
    let mut stuck = f.raw();
    stuck.send_raw_bytes(&partial).unwrap();
    f.assert_healthy("while another connection holds a truncated frame");
    // Half-close: the broker sees EOF in the middle of the frame.
    stuck.shutdown_write().unwrap();
    assert_closed(&mut stuck, "EOF inside a frame");
    f.assert_healthy("after EOF inside a frame");
}

#[test]
fn oversized_frame_closes_the_connection() {
    let mut f = Fixture::new(&["max_request_bytes=1048576"]);
    let mut c = f.raw();
    let mut start = (2 * 1024 * 1024i32).to_be_bytes().to_vec();
    start.extend_from_slice(&header(ApiKey::Produce as i16, 9, 1, true));
    start.extend_from_slice(&[0; 1024]);
    // The broker may close as soon as it reads the length; a write error here
    // is fine.
    let _ = c.send_raw_bytes(&start);
    assert_closed(&mut c, "frame of 2 MiB with max_request_bytes=1 MiB");
    f.assert_healthy("after an oversized frame");
}

#[test]
fn unknown_api_key_closes_the_connection() {
    let mut f = Fixture::new(&[]);
    for key in [9999i16, -1] {
        let mut c = f.raw();
        c.send_raw_bytes(&frame(&header(key, 0, 7, false))).unwrap();
        assert_closed(&mut c, &format!("api key {key}"));
        f.assert_healthy(&format!("after api key {key}"));
    }
}

#[test]
fn unsupported_api_versions_version_answers_with_v0_ranges() {
    let mut f = Fixture::new(&[]);
    let mut c = f.raw();
    let (err, resp) = c
        .api_versions_at(&ApiVersionsRequest::default(), 99)
        .unwrap();
    assert_eq!(err, UNSUPPORTED_VERSION, "ApiVersions v99: {resp:?}");
    let av = resp
        .api_keys
        .iter()
        .find(|k| k.api_key == ApiKey::ApiVersions as i16)
        .unwrap_or_else(|| panic!("ApiVersions range missing from the v0 error answer: {resp:?}"));
    assert_eq!(av.min_version, 0);
    assert!(av.max_version >= 3, "{av:?}");
    assert!(
        resp.api_keys
            .iter()
            .any(|k| k.api_key == ApiKey::Produce as i16),
        "the error answer should list every API: {resp:?}"
    );
    // The connection stays usable: a client retries at a supported version.
    let resp = c.api_versions().unwrap();
    assert_eq!(resp.error_code, 0);
    f.assert_healthy("after ApiVersions v99");
}

#[test]
fn unsupported_version_of_another_api() {
    let mut f = Fixture::new(&[]);
    let mut c = f.raw();
    // Metadata v99 (flexible header): Kafka closes the connection; answering
    // UNSUPPORTED_VERSION is acceptable too.
    c.send_raw_bytes(&frame(&header(ApiKey::Metadata as i16, 99, 42, true)))
        .unwrap();
    match c.wait_for_frame_or_close(CLOSE_TIMEOUT) {
        ReadOutcome::Closed => {}
        ReadOutcome::Frame(fr) => {
            assert!(fr.len() >= 4, "short frame {fr:?}");
            let corr = i32::from_be_bytes([fr[0], fr[1], fr[2], fr[3]]);
            assert_eq!(
                corr, 42,
                "answer to Metadata v99 has the wrong correlation id"
            );
            // Header v0 or v1 (then a tagged-field byte); the body of every
            // Metadata version starts with throttle_time_ms... so look for the
            // error code anywhere it could be: accept only if 35 appears.
            let has_35 = fr
                .windows(2)
                .any(|w| w == UNSUPPORTED_VERSION.to_be_bytes());
            assert!(
                has_35,
                "Metadata v99 answered without UNSUPPORTED_VERSION: {fr:?}"
            );
        }
        ReadOutcome::Timeout => panic!("Metadata v99: no answer and connection still open"),
    }
    // Produce v2 is below what Kafka 4 serves (v3+).
    let mut c = f.raw();
    c.send_raw_bytes(&frame(&header(ApiKey::Produce as i16, 2, 43, false)))
        .unwrap();
    match c.wait_for_frame_or_close(CLOSE_TIMEOUT) {
        ReadOutcome::Closed | ReadOutcome::Frame(_) => {}
        ReadOutcome::Timeout => panic!("Produce v2: no answer and connection still open"),
    }
    f.assert_healthy("after unsupported versions");
}

#[test]
fn wrong_crc_is_corrupt_message_and_appends_nothing() {
    let mut f = Fixture::new(&[]);
    let mut c = f.node.client();
    let good = BatchBuilder::new().values(["crc-0", "crc-1"]).build();
    for (what, bad) in [
        ("CRC field flipped", with_bad_crc(&good)),
        ("payload byte flipped", with_corrupted_payload(&good)),
    ] {
        let r = c.produce(&f.topic, 0, bad, -1).unwrap();
        assert_eq!(r.error_code, CORRUPT_MESSAGE, "{what}: {r:?}");
        assert_eq!(
            c.log_end_offset(&f.topic, 0).unwrap(),
            f.expected.len() as i64,
            "{what}: something was appended"
        );
    }
    // A record set of a good batch followed by a corrupt one is rejected whole.
    let mixed = samsa_tests::batch::concat(&[good.clone(), with_bad_crc(&good)]);
    let r = c.produce(&f.topic, 0, mixed, -1).unwrap();
    assert_eq!(r.error_code, CORRUPT_MESSAGE, "good+bad batches: {r:?}");
    f.assert_healthy("after corrupt batches");
}

#[test]
fn produce_to_missing_partition_is_unknown_topic_or_partition() {
    let mut f = Fixture::new(&[]);
    let mut c = f.node.client();
    let r = c
        .produce(&f.topic, 7, BatchBuilder::new().record("nope").build(), -1)
        .unwrap();
    assert_eq!(r.error_code, UNKNOWN_TOPIC_OR_PARTITION, "{r:?}");
    f.assert_healthy("after producing to partition 7 of a 1-partition topic");
}

#[test]
fn produce_to_missing_topic_without_auto_create() {
    let mut f = Fixture::new(&["auto_create_topics_enable=false"]);
    let mut c = f.node.client();
    let missing = unique_topic("missing");
    let r = c
        .produce(&missing, 0, BatchBuilder::new().record("nope").build(), -1)
        .unwrap();
    assert_eq!(r.error_code, UNKNOWN_TOPIC_OR_PARTITION, "{r:?}");
    // Metadata asking for auto-creation must not create it either.
    let md = c.metadata_with(Some(&[&missing]), true).unwrap();
    let t = md
        .topics
        .iter()
        .find(|t| t.name.as_ref().is_some_and(|n| n.0.as_str() == missing))
        .unwrap_or_else(|| panic!("Metadata lacks {missing}: {md:?}"));
    assert_eq!(t.error_code, UNKNOWN_TOPIC_OR_PARTITION, "{t:?}");
    assert_eq!(c.partition_count(&missing).unwrap(), None);
    f.assert_healthy("after producing to a missing topic");
}
