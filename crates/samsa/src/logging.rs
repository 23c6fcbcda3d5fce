//! The process's log and trace layers: human-readable lines by default,
//! JSON lines with `log_format = "json"` (each line carries its event's
//! fields and every enclosing span's, so a line names its node, partition,
//! producer and transactional id); openraft's warnings and errors held to
//! one line per call site per [`OPENRAFT_WINDOW`]; and, when traces are on
//! (`crate::traces`), the spans of `samsa_broker::trace::TARGET` handed to
//! OpenTelemetry.
//!
//! `samsa server` and `samsa dev` install the layers once their
//! configuration is known (nothing logs before that: what the
//! configuration itself has to say is logged after [`init`]); every other
//! command installs text lines at once.
//!
//! Why limit openraft: while one voter is down, openraft's leader logs an
//! ERROR or WARN for every replication attempt to it and every heartbeat —
//! one line per metadata write and two every 500 ms — so a failure's own
//! lines scroll away. Each call site now speaks at most once a window and
//! reports how many lines it held back when it speaks again.
//!
//! Why a filter of its own for traces: the log's filter (`RUST_LOG`) keeps
//! INFO, and a trace wants the DEBUG spans of appends, fsyncs and
//! replication waits without their lines in the log; the long-lived
//! connection and node spans stay out of traces, so each request's span is
//! the root of its own trace.

use std::collections::HashMap;
use std::io::IsTerminal;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use opentelemetry_sdk::trace::SdkTracer;
use samsa_broker::config::LogFormat;
use tracing::callsite::Identifier;
use tracing::level_filters::LevelFilter;
use tracing::subscriber::Interest;
use tracing::{Level, Metadata};
use tracing_subscriber::layer::{Context, Filter, SubscriberExt};
use tracing_subscriber::registry::{LookupSpan, Registry};
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer};

/// The filter when `RUST_LOG` is unset (or invalid): `info` for samsa,
/// with openraft's per-RPC chatter at `warn`.
pub const DEFAULT_LOG_FILTER: &str = "info,openraft=warn";

/// How often one openraft call site may log a warning or an error.
pub const OPENRAFT_WINDOW: Duration = Duration::from_secs(10);

type FormatLayer = Box<dyn Layer<Registry> + Send + Sync>;

/// Whether lines are JSON.
static JSON: AtomicBool = AtomicBool::new(false);

fn format_layer(format: LogFormat) -> FormatLayer {
    let layer = tracing_subscriber::fmt::layer().with_writer(std::io::stderr);
    match format {
        LogFormat::Text => layer.with_ansi(std::io::stderr().is_terminal()).boxed(),
        LogFormat::Json => layer
            .json()
            .with_current_span(true)
            .with_span_list(true)
            .boxed(),
    }
}

/// Where trace spans go when traces are on.
pub struct TraceOutput {
    pub tracer: SdkTracer,
    /// `trace_sample_ratio`: the share of traces started.
    pub sample_ratio: f64,
}

/// Installs the process's subscriber: lines in `format` on stderr, and the
/// trace spans to `traces` if traces are on. Once per process.
pub fn init(format: LogFormat, traces: Option<TraceOutput>) {
    let filter = match EnvFilter::try_from_default_env() {
        Ok(filter) => filter,
        Err(err) => {
            if std::env::var_os("RUST_LOG").is_some() {
                eprintln!(
                    "warning: ignoring invalid RUST_LOG ({err}); using `{DEFAULT_LOG_FILTER}`"
                );
            }
            EnvFilter::new(DEFAULT_LOG_FILTER)
        }
    };
    JSON.store(format == LogFormat::Json, Ordering::Relaxed);
    let lines = format_layer(format)
        .with_filter(OpenraftLimit::default())
        .with_filter(filter);
    let traces = traces.map(|output| {
        tracing_opentelemetry::layer()
            .with_tracer(output.tracer)
            // What a span carries is its own fields; the source location,
            // thread and busy/idle times would cost every span for little.
            .with_location(false)
            .with_threads(false)
            .with_target(false)
            .with_tracked_inactivity(false)
            // Context crosses nodes from the span itself
            // (`samsa_broker::trace::inject`); nothing reads the ambient
            // OpenTelemetry context.
            .with_context_activation(false)
            .with_filter(TraceSpans {
                sample_ratio: output.sample_ratio,
            })
    });
    tracing_subscriber::registry()
        .with(lines)
        .with(traces)
        .init();
}

/// Admits the spans of `samsa_broker::trace::TARGET` and nothing else,
/// and samples there (`samsa_broker::trace`): a span below a kept one is
/// kept, one serving another node's traced call is kept, a root span
/// starts a trace with probability `sample_ratio`, and the rest are
/// dropped (the children of a request not kept). Deciding before the span
/// exists is what makes an unsampled request cost no span at all.
struct TraceSpans {
    sample_ratio: f64,
}

impl TraceSpans {
    fn is_trace_span(meta: &Metadata<'_>) -> bool {
        meta.is_span() && meta.target() == samsa_broker::trace::TARGET
    }
}

impl<S> Filter<S> for TraceSpans
where
    S: tracing::Subscriber + for<'a> LookupSpan<'a>,
{
    fn enabled(&self, meta: &Metadata<'_>, cx: &Context<'_, S>) -> bool {
        if !Self::is_trace_span(meta) {
            return false;
        }
        // The context only sees spans this filter kept: a kept ancestor
        // entered on this thread means the trace is being recorded. The
        // field test first: it is cheaper than walking the entered spans.
        if meta
            .fields()
            .field(samsa_broker::trace::TRACEPARENT)
            .is_some()
            || cx.lookup_current().is_some()
        {
            return true;
        }
        samsa_broker::trace::ROOT_SPANS.contains(&meta.name())
            && (self.sample_ratio >= 1.0 || rand::random::<f64>() < self.sample_ratio)
    }

    fn callsite_enabled(&self, meta: &'static Metadata<'static>) -> Interest {
        if Self::is_trace_span(meta) {
            // Decided per span: it depends on what is entered, and on chance.
            Interest::sometimes()
        } else {
            Interest::never()
        }
    }

    fn max_level_hint(&self) -> Option<LevelFilter> {
        Some(LevelFilter::DEBUG)
    }
}

/// One call site's window.
#[derive(Debug)]
struct Window {
    opened: Instant,
    held_back: u64,
}

/// Windows by call site.
#[derive(Debug)]
struct Windows<K>(HashMap<K, Window>);

impl<K: std::hash::Hash + Eq> Windows<K> {
    /// Whether a line of `site` logged at `now` is let through, and how
    /// many lines of the site were held back before it.
    fn admit(&mut self, site: K, now: Instant) -> (bool, u64) {
        match self.0.get_mut(&site) {
            Some(w) if now.duration_since(w.opened) < OPENRAFT_WINDOW => {
                w.held_back += 1;
                (false, 0)
            }
            Some(w) => {
                let held_back = std::mem::take(&mut w.held_back);
                w.opened = now;
                (true, held_back)
            }
            None => {
                self.0.insert(
                    site,
                    Window {
                        opened: now,
                        held_back: 0,
                    },
                );
                (true, 0)
            }
        }
    }
}

/// Lets through one warning or error per openraft call site per
/// [`OPENRAFT_WINDOW`]; everything else passes untouched.
#[derive(Debug)]
struct OpenraftLimit {
    windows: Mutex<Windows<Identifier>>,
}

impl Default for OpenraftLimit {
    fn default() -> Self {
        OpenraftLimit {
            windows: Mutex::new(Windows(HashMap::new())),
        }
    }
}

fn limited(meta: &Metadata<'_>) -> bool {
    meta.is_event() && *meta.level() <= Level::WARN && meta.target().starts_with("openraft")
}

/// Says how many lines a call site held back, on stderr directly: a line
/// through the subscriber from inside its filter would re-enter it.
fn report_held_back(meta: &Metadata<'_>, held_back: u64) {
    let message = format!(
        "{held_back} more {} lines from {} held back in the last {} s",
        meta.level(),
        meta.module_path().unwrap_or(meta.target()),
        OPENRAFT_WINDOW.as_secs()
    );
    if JSON.load(Ordering::Relaxed) {
        let line = serde_json::json!({
            "level": "INFO",
            "fields": { "message": message },
            "target": "samsa::logging",
        });
        eprintln!("{line}");
    } else {
        eprintln!("samsa::logging: {message}");
    }
}

impl<S> Filter<S> for OpenraftLimit {
    fn enabled(&self, meta: &Metadata<'_>, _cx: &Context<'_, S>) -> bool {
        if !limited(meta) {
            return true;
        }
        let (admitted, held_back) = self
            .windows
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .admit(meta.callsite(), Instant::now());
        if admitted && held_back > 0 {
            report_held_back(meta, held_back);
        }
        admitted
    }

    fn callsite_enabled(&self, meta: &'static Metadata<'static>) -> Interest {
        if limited(meta) {
            // Asked per event: the answer changes with time.
            Interest::sometimes()
        } else {
            Interest::always()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_line_per_site_per_window_and_the_count_held_back() {
        let mut windows = Windows(HashMap::new());
        let t0 = Instant::now();
        assert_eq!(windows.admit("a", t0), (true, 0));
        assert_eq!(windows.admit("b", t0), (true, 0));
        for ms in [1, 500, 9_999] {
            assert_eq!(
                windows.admit("a", t0 + Duration::from_millis(ms)),
                (false, 0)
            );
        }
        assert_eq!(windows.admit("a", t0 + OPENRAFT_WINDOW), (true, 3));
        assert_eq!(
            windows.admit("a", t0 + OPENRAFT_WINDOW + Duration::from_millis(1)),
            (false, 0)
        );
        assert_eq!(windows.admit("b", t0 + OPENRAFT_WINDOW), (true, 0));
    }
}
