//! Polling with a deadline: the only way tests wait for a condition.

use std::time::{Duration, Instant};

/// Polls `cond` until it returns `Some(value)` or `timeout` passes; panics with
/// `what` on timeout. The pause between polls grows from 5 ms to 100 ms; it is
/// back-off between checks, never a substitute for one.
pub fn wait_until<T>(what: &str, timeout: Duration, mut cond: impl FnMut() -> Option<T>) -> T {
    match try_wait_until(timeout, &mut cond) {
        Some(v) => v,
        None => panic!("timed out after {timeout:?} waiting for {what}"),
    }
}

/// Like [`wait_until`] but returns `None` on timeout.
pub fn try_wait_until<T>(timeout: Duration, mut cond: impl FnMut() -> Option<T>) -> Option<T> {
    let deadline = Instant::now() + timeout;
    let mut pause = Duration::from_millis(5);
    loop {
        if let Some(v) = cond() {
            return Some(v);
        }
        let now = Instant::now();
        if now >= deadline {
            return None;
        }
        std::thread::sleep(pause.min(deadline - now));
        pause = (pause * 2).min(Duration::from_millis(100));
    }
}
