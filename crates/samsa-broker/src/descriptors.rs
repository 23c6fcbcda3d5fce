//! The process's file descriptors: the limit raised as far as it may go,
//! the budget of inactive segment files (`samsa_storage::open_files`), and
//! the headroom check that keeps a new topic from being created when this
//! broker could not open its partitions.
//!
//! What a broker holds: one descriptor per hosted partition (its active
//! segment's log file), at most the inactive-segment budget of cached ones,
//! and what connections, the metadata store and short-lived opens (index
//! writes, snapshots) take, for which an eighth of the limit (at most
//! 1,024) is kept free.

use std::path::Path;

use nix::sys::resource::{getrlimit, setrlimit, Resource};
use tracing::{info, warn};

/// Descriptors kept free for connections and short-lived opens: an
/// eighth of the limit, at most this many.
const RESERVED_MAX: u64 = 1024;

/// Inactive segment files kept open when `log_inactive_segment_files_max`
/// is unset: a quarter of the open-file limit, between these bounds.
const DEFAULT_INACTIVE_MIN: u64 = 64;
const DEFAULT_INACTIVE_MAX: u64 = 8192;

/// Raises the soft open-file limit to the hard one (what a server needs,
/// as Go's runtime and systemd services do); returns the soft limit in
/// force afterwards.
pub fn raise_limit() -> Option<u64> {
    let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE)
        .map_err(|e| warn!(error = %e, "cannot read the open-file limit"))
        .ok()?;
    if soft < hard {
        match setrlimit(Resource::RLIMIT_NOFILE, hard, hard) {
            Ok(()) => {
                info!(from = soft, to = hard, "raised the open-file limit");
                return Some(hard);
            }
            Err(e) => warn!(error = %e, soft, hard, "cannot raise the open-file limit"),
        }
    }
    Some(soft)
}

/// The soft open-file limit in force.
pub fn limit() -> Option<u64> {
    getrlimit(Resource::RLIMIT_NOFILE)
        .ok()
        .map(|(soft, _)| soft)
}

/// Descriptors this process has open now.
pub fn open_now() -> Option<u64> {
    let entries = std::fs::read_dir(Path::new("/proc/self/fd")).ok()?;
    Some(entries.count() as u64)
}

/// How many inactive segment files stay open: `configured`, or a quarter
/// of `limit`.
pub fn inactive_budget(configured: Option<usize>, limit: Option<u64>) -> usize {
    configured.unwrap_or_else(|| {
        let quarter = limit.map_or(DEFAULT_INACTIVE_MAX, |l| l / 4);
        quarter.clamp(DEFAULT_INACTIVE_MIN, DEFAULT_INACTIVE_MAX) as usize
    })
}

/// Why `new_partitions` more partitions would not open here, if they
/// would not: the descriptors open now, the inactive budget still unused,
/// the new partitions and the reserve must fit in the limit.
pub fn refuse_new_partitions(new_partitions: u64) -> Option<String> {
    let (limit, open) = (limit()?, open_now()?);
    let inactive = samsa_storage::open_files::inactive_files();
    let cache_growth = inactive.capacity.saturating_sub(inactive.open) as u64;
    headroom_refusal(new_partitions, open, cache_growth, limit)
}

fn headroom_refusal(
    new_partitions: u64,
    open: u64,
    cache_growth: u64,
    limit: u64,
) -> Option<String> {
    let reserved = (limit / 8).min(RESERVED_MAX);
    let needed = open + cache_growth + new_partitions + reserved;
    (needed > limit).then(|| {
        format!(
            "this broker would host {new_partitions} more partitions, one file descriptor each, \
             but has {open} of {limit} open, {cache_growth} more set aside for inactive segments \
             (log_inactive_segment_files_max) and {reserved} for connections: raise the \
             open-file limit (ulimit -n, LimitNOFILE, the container's nofile) or spread the \
             partitions over more brokers"
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_budget_is_a_quarter_of_the_limit_within_bounds() {
        assert_eq!(inactive_budget(None, Some(20_000)), 5_000);
        assert_eq!(inactive_budget(None, Some(1_024)), 256);
        assert_eq!(inactive_budget(None, Some(100)), 64);
        assert_eq!(inactive_budget(None, Some(1 << 20)), 8_192);
        assert_eq!(inactive_budget(Some(10), Some(20_000)), 10);
    }

    #[test]
    fn new_partitions_must_fit_beside_the_open_descriptors_the_cache_and_the_reserve() {
        assert_eq!(headroom_refusal(10_000, 200, 5_000, 20_000), None);
        // A small limit keeps a smaller reserve (an eighth).
        assert_eq!(headroom_refusal(300, 50, 256, 1_024), None);
        assert!(headroom_refusal(700, 50, 256, 1_024).is_some());
        let refusal = headroom_refusal(15_000, 200, 5_000, 20_000).unwrap_or_default();
        assert!(refusal.contains("15000 more partitions"), "{refusal}");
        assert!(refusal.contains("200 of 20000 open"), "{refusal}");
    }

    #[test]
    fn this_process_reports_its_limit_and_open_descriptors() {
        let open = open_now().unwrap_or(0);
        assert!(open >= 3, "stdin, stdout, stderr at least: {open}");
        assert!(limit().unwrap_or(0) >= open);
    }
}
