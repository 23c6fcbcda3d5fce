//! The process and its tokio runtime, read when scraped: Prometheus's
//! standard `process_*` names (what every Prometheus client library
//! exports, so stock dashboards and alerts work) and samsa's view of the
//! runtime's workers (Kafka's nearest: request-handler idle ratio).
//!
//! The process figures come from `/proc/self` (Linux); where it is not
//! readable they are left out rather than reported as zero.

use std::time::Duration;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::DescriptorEncoder;

use crate::encode::{counter, gauge};

/// Collects the process and runtime figures when scraped.
#[derive(Debug)]
pub struct ProcessCollector {
    runtime: Option<tokio::runtime::Handle>,
}

impl ProcessCollector {
    /// Watches the tokio runtime this is called on, if any.
    pub fn new() -> ProcessCollector {
        ProcessCollector {
            runtime: tokio::runtime::Handle::try_current().ok(),
        }
    }
}

impl Default for ProcessCollector {
    fn default() -> Self {
        Self::new()
    }
}

/// What `/proc/self` says now.
#[derive(Debug, Default, PartialEq)]
struct ProcessFigures {
    cpu_seconds: Option<f64>,
    start_time_seconds: Option<f64>,
    resident_bytes: Option<i64>,
    virtual_bytes: Option<i64>,
    open_fds: Option<i64>,
    max_fds: Option<i64>,
}

/// Linux's USER_HZ, the unit of the CPU times in `/proc/<pid>/stat`:
/// fixed at 100 by the kernel's user ABI on every architecture samsa builds
/// for (Prometheus's own procfs reader makes the same assumption).
const USER_HZ: f64 = 100.0;

/// The fields of `/proc/self/stat` after the command name (which may hold
/// spaces and parentheses, so the split is at the last `)`).
fn stat_fields(stat: &str) -> Option<Vec<&str>> {
    let (_, rest) = stat.rsplit_once(')')?;
    Some(rest.split_whitespace().collect())
}

/// `/proc/stat`'s `btime`: boot time in seconds since the epoch.
fn boot_time(proc_stat: &str) -> Option<f64> {
    proc_stat
        .lines()
        .find_map(|l| l.strip_prefix("btime "))
        .and_then(|v| v.trim().parse().ok())
}

/// `VmRSS:  1234 kB` style lines of `/proc/self/status`, in bytes.
fn status_bytes(status: &str, key: &str) -> Option<i64> {
    let line = status.lines().find(|l| l.starts_with(key))?;
    let kb: i64 = line[key.len()..]
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()?;
    Some(kb * 1024)
}

/// The soft limit of `Max open files` in `/proc/self/limits`.
fn max_open_files(limits: &str) -> Option<i64> {
    let line = limits.lines().find(|l| l.starts_with("Max open files"))?;
    line["Max open files".len()..]
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

fn parse_figures(
    stat: Option<&str>,
    proc_stat: Option<&str>,
    status: Option<&str>,
    limits: Option<&str>,
    open_fds: Option<i64>,
) -> ProcessFigures {
    let ticks = USER_HZ;
    let fields = stat.and_then(stat_fields);
    // After the name: state is field 3 (index 0 here), utime 14, stime 15,
    // starttime 22 (man 5 proc).
    let field = |n: usize| -> Option<f64> { fields.as_ref()?.get(n - 3)?.parse().ok() };
    let cpu_seconds = match (field(14), field(15)) {
        (Some(user), Some(system)) => Some((user + system) / ticks),
        _ => None,
    };
    let start_time_seconds = match (field(22), proc_stat.and_then(boot_time)) {
        (Some(start), Some(boot)) => Some(boot + start / ticks),
        _ => None,
    };
    ProcessFigures {
        cpu_seconds,
        start_time_seconds,
        resident_bytes: status.and_then(|s| status_bytes(s, "VmRSS:")),
        virtual_bytes: status.and_then(|s| status_bytes(s, "VmSize:")),
        open_fds,
        max_fds: limits.and_then(max_open_files),
    }
}

fn read_figures() -> ProcessFigures {
    let read = |path: &str| std::fs::read_to_string(path).ok();
    let open_fds = std::fs::read_dir("/proc/self/fd")
        .ok()
        .map(|d| d.count() as i64);
    parse_figures(
        read("/proc/self/stat").as_deref(),
        read("/proc/stat").as_deref(),
        read("/proc/self/status").as_deref(),
        read("/proc/self/limits").as_deref(),
        open_fds,
    )
}

impl Collector for ProcessCollector {
    fn encode(&self, mut out: DescriptorEncoder<'_>) -> std::fmt::Result {
        let p = read_figures();
        if let Some(v) = p.cpu_seconds {
            counter(
                &mut out,
                "process_cpu_seconds",
                "User and system CPU time spent, in seconds",
                v,
            )?;
        }
        if let Some(v) = p.start_time_seconds {
            gauge(
                &mut out,
                "process_start_time_seconds",
                "Start time of the process since the Unix epoch, in seconds",
                v,
            )?;
        }
        if let Some(v) = p.resident_bytes {
            gauge(
                &mut out,
                "process_resident_memory_bytes",
                "Resident memory size, in bytes",
                v,
            )?;
        }
        if let Some(v) = p.virtual_bytes {
            gauge(
                &mut out,
                "process_virtual_memory_bytes",
                "Virtual memory size, in bytes",
                v,
            )?;
        }
        if let Some(v) = p.open_fds {
            gauge(&mut out, "process_open_fds", "Open file descriptors", v)?;
        }
        if let Some(v) = p.max_fds {
            gauge(
                &mut out,
                "process_max_fds",
                "The soft limit of open file descriptors",
                v,
            )?;
        }
        let Some(runtime) = &self.runtime else {
            return Ok(());
        };
        let m = runtime.metrics();
        let workers = m.num_workers();
        gauge(
            &mut out,
            "samsa_tokio_workers",
            "Worker threads of the async runtime",
            workers as i64,
        )?;
        let busy: Duration = (0..workers).map(|w| m.worker_total_busy_duration(w)).sum();
        counter(
            &mut out,
            "samsa_tokio_worker_busy_seconds",
            "Time the async runtime's workers spent running tasks, summed over workers (divide its rate by samsa_tokio_workers for the busy ratio)",
            busy.as_secs_f64(),
        )?;
        gauge(
            &mut out,
            "samsa_tokio_alive_tasks",
            "Tasks alive in the async runtime",
            m.num_alive_tasks() as i64,
        )?;
        gauge(
            &mut out,
            "samsa_tokio_global_queue_depth",
            "Tasks waiting in the async runtime's global queue: a backlog means the workers cannot keep up",
            m.global_queue_depth() as i64,
        )
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn proc_files_parse() {
        let stat = "4242 (samsa (x) y) S 1 2 3 4 5 6 7 8 9 10 250 50 0 0 20 0 9 0 1000 123 456";
        let figures = parse_figures(
            Some(stat),
            Some("cpu 1 2 3\nbtime 1700000000\n"),
            Some("Name:\tsamsa\nVmSize:\t  2048 kB\nVmRSS:\t  1024 kB\n"),
            Some("Limit Soft Hard Units\nMax open files            20000                20000                files\n"),
            Some(12),
        );
        let ticks = USER_HZ;
        assert_eq!(figures.cpu_seconds, Some(300.0 / ticks));
        assert_eq!(
            figures.start_time_seconds,
            Some(1_700_000_000.0 + 1000.0 / ticks)
        );
        assert_eq!(figures.resident_bytes, Some(1024 * 1024));
        assert_eq!(figures.virtual_bytes, Some(2048 * 1024));
        assert_eq!(figures.max_fds, Some(20000));
        assert_eq!(figures.open_fds, Some(12));
    }

    #[test]
    fn this_process_is_readable() {
        let figures = read_figures();
        assert!(figures.cpu_seconds.is_some());
        assert!(figures.resident_bytes.unwrap() > 0);
        assert!(figures.open_fds.unwrap() > 0);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn runtime_figures_are_exposed() {
        let mut registry = prometheus_client::registry::Registry::default();
        registry.register_collector(Box::new(ProcessCollector::new()));
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        for name in [
            "process_cpu_seconds_total ",
            "process_resident_memory_bytes ",
            "process_open_fds ",
            "samsa_tokio_workers 2\n",
            "samsa_tokio_worker_busy_seconds_total ",
        ] {
            assert!(text.contains(name), "{name} missing in\n{text}");
        }
    }
}
