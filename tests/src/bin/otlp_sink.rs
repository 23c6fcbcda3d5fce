//! `otlp-sink`: an OTLP/gRPC trace receiver for the trace benchmark
//! (`tests/bench/run.sh traces`). Prints its endpoint on the first line,
//! then the number of spans received so far once a second, until killed.

use std::io::Write;
use std::time::Duration;

use samsa_tests::otlp::OtlpReceiver;

fn main() -> anyhow::Result<()> {
    let receiver = OtlpReceiver::start_counting()?;
    let mut out = std::io::stdout();
    writeln!(out, "{}", receiver.endpoint())?;
    out.flush()?;
    loop {
        std::thread::sleep(Duration::from_secs(1));
        writeln!(out, "spans {}", receiver.span_count())?;
        out.flush()?;
    }
}
