//! Which `__transaction_state` partition (and so which broker) coordinates a
//! transactional id.
//!
//! The placement is Kafka's, so that it is predictable from the outside and
//! tools agree with samsa about it: `abs(hashCode(id)) mod N`, where
//! `hashCode` is Java's `String.hashCode` (over UTF-16 code units, with `i32`
//! wrap-around) and `abs` is Kafka's `Utils.abs`: `Math.abs`, except that
//! `i32::MIN` (which has no positive counterpart) maps to 0.
//!
//! The same function places consumer groups on `__consumer_offsets`
//! partitions, which `AddOffsetsToTxn` needs.

use std::collections::BTreeSet;

use kafka_protocol::error::ResponseError;

/// The partitions of a coordinator's internal topic that the broker's
/// current metadata image says it leads. FindCoordinator answers from that
/// image, so a client can ask before the ownership loop has begun loading
/// such a partition: it must hear COORDINATOR_LOAD_IN_PROGRESS (retry
/// here), not NOT_COORDINATOR, on which some clients fail a synchronous
/// commit instead of looking the coordinator up again.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct LedByImage(BTreeSet<i32>);

impl LedByImage {
    pub fn new(led: BTreeSet<i32>) -> Self {
        LedByImage(led)
    }

    /// The answer for partition `p` when the coordinator holds no slot for it.
    pub fn unheld_error(&self, p: i32) -> ResponseError {
        if self.0.contains(&p) {
            ResponseError::CoordinatorLoadInProgress
        } else {
            ResponseError::NotCoordinator
        }
    }

    /// Whether some led partition is not `held` yet: ownership should be
    /// reconciled now.
    pub fn awaits_load(&self, held: impl Fn(i32) -> bool) -> bool {
        self.0.iter().any(|&p| !held(p))
    }
}

/// Name of the internal topic that stores transaction coordinator state.
pub const TRANSACTION_STATE_TOPIC: &str = "__transaction_state";

/// Kafka's default `transaction.state.log.num.partitions`.
pub const DEFAULT_TRANSACTION_STATE_PARTITIONS: i32 = 50;

/// Name of the internal topic that stores consumer group offsets.
pub const CONSUMER_OFFSETS_TOPIC: &str = "__consumer_offsets";

/// Kafka's default `offsets.topic.num.partitions`.
pub const DEFAULT_CONSUMER_OFFSETS_PARTITIONS: i32 = 50;

/// Java's `String.hashCode`: `s[0]*31^(n-1) + … + s[n-1]` over the UTF-16
/// code units of `s`, with wrapping `i32` arithmetic.
pub fn java_string_hash(s: &str) -> i32 {
    s.encode_utf16().fold(0i32, |h, unit| {
        h.wrapping_mul(31).wrapping_add(i32::from(unit))
    })
}

/// Kafka's `Utils.abs`: the absolute value, except that `i32::MIN` (whose
/// absolute value does not fit) becomes 0. Not the producer partitioner's
/// `toPositive` (sign bit cleared): for a negative hash the two differ, and
/// coordinators are placed with this one.
pub fn kafka_abs(n: i32) -> i32 {
    if n == i32::MIN {
        0
    } else {
        n.abs()
    }
}

/// The partition (of `partitions`) that owns `key`: Kafka's
/// `Utils.abs(key.hashCode()) % partitions`.
///
/// `partitions` must be positive; a non-positive count yields partition 0
/// rather than a division by zero.
pub fn coordinator_partition(key: &str, partitions: i32) -> i32 {
    if partitions <= 0 {
        return 0;
    }
    kafka_abs(java_string_hash(key)) % partitions
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn java_hash_of_known_strings() {
        // Values as `"…".hashCode()` gives them on a JVM.
        assert_eq!(java_string_hash(""), 0);
        assert_eq!(java_string_hash("a"), 97);
        assert_eq!(java_string_hash("hello"), 99_162_322);
        assert_eq!(java_string_hash("transactional-id-1"), 1_051_133_891);
        // Wraps around to a negative value.
        assert_eq!(java_string_hash("my-txn"), -1_061_187_895);
    }

    #[test]
    fn java_hash_is_over_utf16_code_units() {
        // One BMP code unit each, not their UTF-8 bytes.
        assert_eq!(java_string_hash("é"), 233);
        assert_eq!(java_string_hash("日本"), 835_047);
        assert_eq!(java_string_hash("Ünïcödé-tx"), -1_099_255_684);
        // Outside the BMP: a surrogate pair (0xD83D, 0xDE00), two code units.
        assert_eq!(java_string_hash("😀"), 55_357 * 31 + 56_832);
        assert_eq!(java_string_hash("😀"), 1_772_899);
        assert_eq!(java_string_hash("txn-😀-1"), 28_350_410);
    }

    #[test]
    fn abs_is_math_abs_with_min_value_as_zero() {
        assert_eq!(kafka_abs(5), 5);
        assert_eq!(kafka_abs(0), 0);
        assert_eq!(kafka_abs(-1), 1);
        assert_eq!(kafka_abs(i32::MAX), i32::MAX);
        assert_eq!(kafka_abs(-i32::MAX), i32::MAX);
        assert_eq!(kafka_abs(i32::MIN), 0);
        assert_eq!(kafka_abs(-1_061_187_895), 1_061_187_895);
    }

    #[test]
    fn partition_matches_kafka() {
        assert_eq!(coordinator_partition("", 50), 0);
        assert_eq!(coordinator_partition("a", 50), 47);
        assert_eq!(coordinator_partition("hello", 50), 22);
        assert_eq!(coordinator_partition("transactional-id-1", 50), 41);
        // Negative hash (-1061187895): Math.abs, so 45 (clearing the sign
        // bit would give 3).
        assert_eq!(coordinator_partition("my-txn", 50), 45);
        assert_eq!(coordinator_partition("Ünïcödé-tx", 50), 34);
        assert_eq!(coordinator_partition("😀", 50), 49);
        // "polygenelubricants".hashCode() == Integer.MIN_VALUE.
        assert_eq!(java_string_hash("polygenelubricants"), i32::MIN);
        assert_eq!(coordinator_partition("polygenelubricants", 50), 0);
        assert_eq!(coordinator_partition("a", 1), 0);
        assert_eq!(coordinator_partition("a", 0), 0);
    }
}
