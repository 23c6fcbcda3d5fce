//! Topics and data survive a clean restart (SIGTERM) and a crash (SIGKILL);
//! a second broker on a data directory in use is refused.

use std::collections::BTreeMap;
use std::time::Duration;

use samsa_tests::client::KafkaClient;
use samsa_tests::cluster::run_to_exit;
use samsa_tests::codes::NONE;
use samsa_tests::node::{free_port, samsa_bin};
use samsa_tests::{unique_topic, BatchBuilder, SamsaNode};

/// What the test wrote: topic -> partition count, and (topic, partition) ->
/// values in offset order.
#[derive(Default)]
struct Expected {
    topics: BTreeMap<String, i32>,
    data: BTreeMap<(String, i32), Vec<String>>,
}

impl Expected {
    fn create(&mut self, c: &mut KafkaClient, topic: &str, partitions: i32) {
        c.create_topic(topic, partitions).unwrap();
        self.topics.insert(topic.to_string(), partitions);
        for p in 0..partitions {
            self.data.insert((topic.to_string(), p), Vec::new());
        }
    }

    /// Writes `batches` batches of 3 records to every partition of every topic.
    fn write(&mut self, c: &mut KafkaClient, round: &str, batches: usize) {
        for ((topic, p), vals) in self.data.iter_mut() {
            for b in 0..batches {
                let new: Vec<String> = (0..3)
                    .map(|i| format!("{topic}/{p}/{round}/{b}/{i}"))
                    .collect();
                let r = c
                    .produce(topic, *p, BatchBuilder::new().values(&new).build(), -1)
                    .unwrap();
                assert_eq!(
                    (r.error_code, r.base_offset),
                    (NONE, vals.len() as i64),
                    "produce to {topic}/{p}: {r:?}"
                );
                vals.extend(new);
            }
        }
    }

    fn verify(&self, c: &mut KafkaClient, when: &str) {
        for (topic, n) in &self.topics {
            assert_eq!(
                c.partition_count(topic).unwrap(),
                Some(*n as usize),
                "partition count of {topic} {when}"
            );
        }
        for ((topic, p), vals) in &self.data {
            let n = vals.len() as i64;
            // Log end offset, then the high watermark a consumer sees, then content.
            assert_eq!(
                c.log_end_offset(topic, *p).unwrap(),
                n,
                "log end offset (ListOffsets latest) of {topic}/{p} {when}"
            );
            let first = c.fetch(topic, *p, 0, 0, 1).unwrap();
            assert_eq!(
                first.error_code, NONE,
                "fetch {topic}/{p} {when}: {first:?}"
            );
            assert_eq!(
                first.high_watermark, n,
                "high watermark of {topic}/{p} {when} (every record was acknowledged with acks=-1)"
            );
            assert_eq!(
                c.list_offsets(topic, *p, -2).unwrap().offset,
                0,
                "earliest {when}"
            );
            let got: Vec<(i64, String)> = c
                .fetch_all(topic, *p, 0)
                .unwrap()
                .into_iter()
                .map(|r| {
                    (
                        r.offset,
                        String::from_utf8_lossy(&r.value.unwrap_or_default()).into_owned(),
                    )
                })
                .collect();
            let want: Vec<(i64, String)> = vals
                .iter()
                .enumerate()
                .map(|(i, v)| (i as i64, v.clone()))
                .collect();
            if got != want {
                let first_diff = got.iter().zip(&want).position(|(a, b)| a != b);
                panic!(
                    "content of {topic}/{p} {when}: read {} records, expected {}; first difference at index {:?}; \
                     last read {:?}, last expected {:?}",
                    got.len(),
                    want.len(),
                    first_diff,
                    got.last(),
                    want.last()
                );
            }
        }
    }
}

#[test]
fn topics_and_data_survive_sigterm_and_sigkill_restarts() {
    // Small segments so that restarts recover logs of several segments.
    let mut node = SamsaNode::start_with(&["log.segment_bytes=4096"]);
    let mut exp = Expected::default();
    let deleted = unique_topic("deleted");
    {
        let mut c = node.client();
        exp.create(&mut c, &unique_topic("persist-a"), 3);
        exp.create(&mut c, &unique_topic("persist-b"), 1);
        c.create_topic(&deleted, 2).unwrap();
        exp.write(&mut c, "r1", 40);
        assert_eq!(c.delete_topic(&deleted).unwrap(), NONE);
        exp.verify(&mut c, "before any restart");
    }

    let status = node.sigterm_and_wait();
    assert!(status.success(), "SIGTERM shutdown exited with {status}");
    node.restart();
    {
        let mut c = node.client();
        exp.verify(&mut c, "after SIGTERM restart");
        assert_eq!(
            c.partition_count(&deleted).unwrap(),
            None,
            "deleted topic came back after SIGTERM restart"
        );
        exp.write(&mut c, "r2", 20);
        // A topic created just before the crash.
        exp.create(&mut c, &unique_topic("persist-late"), 2);
        exp.write(&mut c, "r3", 1);
    }

    node.sigkill();
    node.restart();
    {
        let mut c = node.client();
        exp.verify(&mut c, "after SIGKILL restart");
        assert_eq!(
            c.partition_count(&deleted).unwrap(),
            None,
            "deleted topic came back after SIGKILL restart"
        );
        exp.write(&mut c, "r4", 2);
        exp.verify(&mut c, "after writing again post-crash");
    }

    // Two crashes in a row, the second right after startup.
    node.sigkill();
    node.restart();
    node.sigkill();
    node.restart();
    let mut c = node.client();
    exp.verify(&mut c, "after two more SIGKILL restarts");
}

/// A second broker started on a data directory a running one uses exits
/// with the reason before it opens anything there (two writers would
/// interleave appends in the same segments); the first keeps serving. A
/// SIGKILL releases the lock with the process.
#[test]
fn a_second_broker_on_a_data_directory_in_use_is_refused() {
    let mut node = SamsaNode::start_with(&[]);
    let topic = unique_topic("locked");
    let mut exp = Expected::default();
    {
        let mut c = node.client();
        exp.create(&mut c, &topic, 1);
        exp.write(&mut c, "before", 5);
    }
    let data = node.data_dir();
    let args: Vec<String> = vec![
        "server".into(),
        "--listen".into(),
        format!("127.0.0.1:{}", free_port()),
        "--data-dir".into(),
        data.display().to_string(),
        "--set".into(),
        format!("http_listen=127.0.0.1:{}", free_port()),
    ];
    let (status, text) = run_to_exit(&samsa_bin(), &args, Duration::from_secs(30));
    assert!(!status.success(), "{text}");
    assert!(
        text.contains("another process is using this data directory")
            && text.contains(&data.join(".lock").display().to_string()),
        "{text}"
    );
    {
        let mut c = node.client();
        exp.write(&mut c, "after", 5);
        exp.verify(&mut c, "after the refused second broker");
    }
    node.sigkill();
    node.restart();
    exp.verify(&mut node.client(), "after a SIGKILL and restart");
}
