//! The cleaner's key → latest offset map, in a fixed amount of memory
//! (Kafka's `log.cleaner.dedupe.buffer.size`).
//!
//! Keys are not stored: each is reduced to a 128-bit digest, and a slot is
//! the digest and the offset, 24 bytes, so the map's size is known before
//! any key is seen. Two keys with one digest would make the cleaner drop
//! the older key's latest value; at 128 bits that needs about 2^64 keys in
//! one map, the same bet Kafka's MD5-keyed map makes.
//!
//! The map refuses a new key once `load_factor` of its slots are taken
//! ([`OffsetMap::put`] returns [`MapFull`]): the cleaner then cleans up to
//! where the map reached and leaves the rest for the next pass. Open
//! addressing with linear probing; the probe sequence always ends because
//! the map is never full to the last slot.

use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};

/// Bytes one slot takes: two 64-bit digest halves and an offset.
pub const SLOT_BYTES: usize = 24;

/// Kafka's `log.cleaner.io.buffer.load.factor`.
pub const DEFAULT_LOAD_FACTOR: f64 = 0.9;

#[derive(Clone, Copy, Default)]
struct Slot {
    digest: [u64; 2],
    /// `EMPTY` while the slot is free.
    offset: i64,
}

const EMPTY: i64 = -1;

/// The map has as many keys as it may hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the cleaner's offset map is full ({keys} keys)")]
pub struct MapFull {
    pub keys: usize,
}

pub struct OffsetMap {
    slots: Vec<Slot>,
    /// Keys the map may hold before [`MapFull`].
    max_keys: usize,
    keys: usize,
    /// The largest offset put since the last clear; -1 if none.
    latest_offset: i64,
    hashers: [RandomState; 2],
}

impl OffsetMap {
    /// A map in `memory_bytes` (at least two slots) that takes keys until
    /// `load_factor` (in (0, 1]) of its slots are used.
    pub fn with_memory(memory_bytes: usize, load_factor: f64) -> OffsetMap {
        let capacity = (memory_bytes / SLOT_BYTES).max(2);
        let factor = if load_factor.is_finite() {
            load_factor.clamp(f64::MIN_POSITIVE, 1.0)
        } else {
            DEFAULT_LOAD_FACTOR
        };
        // One slot always stays free, so a probe for an absent key ends.
        let max_keys = ((capacity as f64 * factor) as usize).clamp(1, capacity - 1);
        OffsetMap {
            slots: vec![
                Slot {
                    digest: [0, 0],
                    offset: EMPTY,
                };
                capacity
            ],
            max_keys,
            keys: 0,
            latest_offset: -1,
            hashers: [RandomState::new(), RandomState::new()],
        }
    }

    /// How many distinct keys the map may hold.
    pub fn max_keys(&self) -> usize {
        self.max_keys
    }

    pub fn len(&self) -> usize {
        self.keys
    }

    pub fn is_empty(&self) -> bool {
        self.keys == 0
    }

    /// The largest offset put since the map was made or cleared; -1 if none.
    pub fn latest_offset(&self) -> i64 {
        self.latest_offset
    }

    fn digest(&self, key: &[u8]) -> [u64; 2] {
        self.hashers.each_ref().map(|state| {
            let mut h = state.build_hasher();
            h.write(key);
            h.finish()
        })
    }

    /// The slot holding `digest`, or the free slot where it would go.
    fn probe(&self, digest: [u64; 2]) -> usize {
        let len = self.slots.len();
        // Capacity fits in usize, so the remainder does too.
        let mut i = (digest[0] % len as u64) as usize;
        loop {
            let slot = &self.slots[i];
            if slot.offset == EMPTY || slot.digest == digest {
                return i;
            }
            i = (i + 1) % len;
        }
    }

    /// Records `offset` as the latest of `key` (offsets are put in
    /// increasing order, so a later put wins). A new key is refused once
    /// the map holds [`OffsetMap::max_keys`]; a known key is always
    /// updated.
    pub fn put(&mut self, key: &[u8], offset: i64) -> Result<(), MapFull> {
        let digest = self.digest(key);
        let i = self.probe(digest);
        if self.slots[i].offset == EMPTY {
            if self.keys >= self.max_keys {
                return Err(MapFull { keys: self.keys });
            }
            self.keys += 1;
        }
        self.slots[i] = Slot { digest, offset };
        self.latest_offset = self.latest_offset.max(offset);
        Ok(())
    }

    /// The latest offset put for `key`.
    pub fn get(&self, key: &[u8]) -> Option<i64> {
        let slot = &self.slots[self.probe(self.digest(key))];
        (slot.offset != EMPTY).then_some(slot.offset)
    }

    /// Empties the map, keeping its memory.
    pub fn clear(&mut self) {
        self.slots.fill(Slot {
            digest: [0, 0],
            offset: EMPTY,
        });
        self.keys = 0;
        self.latest_offset = -1;
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    #[test]
    fn the_latest_put_of_a_key_wins() {
        let mut m = OffsetMap::with_memory(24 * 100, DEFAULT_LOAD_FACTOR);
        m.put(b"a", 1).unwrap();
        m.put(b"b", 2).unwrap();
        m.put(b"a", 7).unwrap();
        assert_eq!(m.get(b"a"), Some(7));
        assert_eq!(m.get(b"b"), Some(2));
        assert_eq!(m.get(b"c"), None);
        assert_eq!(m.len(), 2);
        assert_eq!(m.latest_offset(), 7);
    }

    #[test]
    fn memory_bounds_the_keys_and_known_keys_still_update_when_full() {
        // 10 slots at 0.9: 9 keys.
        let mut m = OffsetMap::with_memory(24 * 10, 0.9);
        assert_eq!(m.max_keys(), 9);
        for i in 0..9u32 {
            m.put(&i.to_be_bytes(), i64::from(i)).unwrap();
        }
        assert_eq!(m.put(b"one too many", 100), Err(MapFull { keys: 9 }));
        assert_eq!(m.get(b"one too many"), None);
        m.put(&3u32.to_be_bytes(), 50).unwrap();
        assert_eq!(m.get(&3u32.to_be_bytes()), Some(50));
        for i in (0..9u32).filter(|&i| i != 3) {
            assert_eq!(m.get(&i.to_be_bytes()), Some(i64::from(i)));
        }
    }

    #[test]
    fn a_full_load_factor_still_leaves_one_slot_free() {
        let mut m = OffsetMap::with_memory(24 * 4, 1.0);
        assert_eq!(m.max_keys(), 3);
        for i in 0..3u8 {
            m.put(&[i], i64::from(i)).unwrap();
        }
        // A probe for an absent key ends at the free slot.
        assert_eq!(m.get(b"absent"), None);
        assert!(m.put(b"absent", 9).is_err());
    }

    #[test]
    fn clear_forgets_every_key_and_the_latest_offset() {
        let mut m = OffsetMap::with_memory(24 * 8, DEFAULT_LOAD_FACTOR);
        m.put(b"k", 5).unwrap();
        m.clear();
        assert!(m.is_empty());
        assert_eq!(m.get(b"k"), None);
        assert_eq!(m.latest_offset(), -1);
        m.put(b"k", 6).unwrap();
        assert_eq!(m.get(b"k"), Some(6));
    }

    #[test]
    fn many_keys_are_all_found() {
        let mut m = OffsetMap::with_memory(24 * 20_000, DEFAULT_LOAD_FACTOR);
        for i in 0..15_000u64 {
            m.put(format!("key-{i}").as_bytes(), i as i64 * 2).unwrap();
        }
        for i in 0..15_000u64 {
            assert_eq!(m.get(format!("key-{i}").as_bytes()), Some(i as i64 * 2));
        }
        assert_eq!(m.get(b"key-15000"), None);
    }
}
