//! Work on many partitions spread over a few threads: opening the
//! partitions an image adds (recovery at start-up) and closing them all at
//! shutdown, each `log_open_threads` (`num.recovery.threads.per.data.dir`)
//! at a time. Both are mostly waiting for fsyncs, so a few threads overlap
//! them even on few cores.
//!
//! Invariant: every item is taken exactly once, in order, by whichever
//! thread is free; the call returns only when all are done.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use crate::error::BrokerError;

/// Runs `work` on every item, on up to `threads` threads (the caller's
/// span carried into each), and returns the first error met. Items are
/// taken in order, so with one thread this is a plain loop.
pub(crate) fn for_each_in_parallel<T: Sync>(
    items: &[T],
    threads: usize,
    work: impl Fn(&T) -> Result<(), BrokerError> + Sync,
) -> Option<BrokerError> {
    let next = AtomicUsize::new(0);
    let first_error = Mutex::new(None);
    // One worker's loop: take the next item until none is left.
    let drain = || {
        while let Some(item) = items.get(next.fetch_add(1, Ordering::Relaxed)) {
            if let Err(e) = work(item) {
                first_error
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .get_or_insert(e);
            }
        }
    };
    let threads = threads.min(items.len());
    if threads <= 1 {
        drain();
    } else {
        let span = tracing::Span::current();
        std::thread::scope(|scope| {
            for _ in 0..threads {
                scope.spawn(|| {
                    let _entered = span.enter();
                    drain();
                });
            }
        });
    }
    first_error.into_inner().unwrap_or_else(|p| p.into_inner())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    #[test]
    fn work_in_parallel_takes_every_item_once() {
        let seen = Mutex::new(Vec::new());
        let items: Vec<i32> = (0..100).collect();
        let error = for_each_in_parallel(&items, 7, |&i| {
            seen.lock().unwrap().push(i);
            if i == 42 {
                return Err(BrokerError::Config(format!("item {i}")));
            }
            Ok(())
        });
        assert!(matches!(error, Some(BrokerError::Config(why)) if why == "item 42"));
        let mut seen = seen.into_inner().unwrap();
        seen.sort_unstable();
        assert_eq!(seen, items);
        assert!(for_each_in_parallel(&[] as &[i32], 4, |_| Ok(())).is_none());
    }
}
