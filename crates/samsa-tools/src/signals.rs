//! Process signals: the future that asks a broker (or a long-running client
//! tool) to stop on SIGTERM or SIGINT.

use std::future::Future;

use anyhow::{Context, Result};
use tokio::signal::unix::{signal, SignalKind};

/// Installs SIGTERM and SIGINT handlers now (so a signal that arrives while the
/// broker is still starting is not lost) and returns a future that resolves on
/// the first of them.
///
/// Once the first signal has been seen, a second one exits the process at once
/// with status 130: an operator who presses Ctrl-C twice wants out even if a
/// clean shutdown is stuck (e.g. on a hung disk).
pub fn shutdown_signal() -> Result<impl Future<Output = ()> + Send + 'static> {
    let mut term = signal(SignalKind::terminate()).context("cannot install a SIGTERM handler")?;
    let mut int = signal(SignalKind::interrupt()).context("cannot install a SIGINT handler")?;
    Ok(async move {
        let name = tokio::select! {
            _ = term.recv() => "SIGTERM",
            _ = int.recv() => "SIGINT",
        };
        tracing::info!("received {name}: shutting down cleanly (send it again to exit at once)");
        tokio::spawn(async move {
            tokio::select! {
                _ = term.recv() => {},
                _ = int.recv() => {},
            }
            eprintln!("error: second signal received, exiting without a clean shutdown");
            std::process::exit(130);
        });
    })
}
