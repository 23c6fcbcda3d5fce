//! A minimal HTTP/1.1 GET over a std `TcpStream`, for the broker's
//! `/metrics`, `/healthz` and `/readyz` (no HTTP client crate needed).

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use anyhow::{anyhow, Context, Result};

/// `GET path` on `addr`: the status code and the body.
pub fn http_get(addr: SocketAddr, path: &str) -> Result<(u16, String)> {
    let mut stream = TcpStream::connect_timeout(&addr, Duration::from_secs(2))
        .with_context(|| format!("connect to {addr}"))?;
    stream.set_read_timeout(Some(Duration::from_secs(10)))?;
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )?;
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw)?;
    let text = String::from_utf8(raw).context("response is not UTF-8")?;
    let (head, body) = text
        .split_once("\r\n\r\n")
        .ok_or_else(|| anyhow!("no end of headers in {text:?}"))?;
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| anyhow!("no status in {head:?}"))?;
    Ok((status, body.to_string()))
}

/// The value of sample `name` (with its labels, as the page spells them)
/// in a Prometheus text exposition, as an integer.
pub fn metric(exposition: &str, name: &str) -> Option<i64> {
    sample(exposition, name)?.parse().ok()
}

/// The same as a float (ages, durations).
pub fn float_metric(exposition: &str, name: &str) -> Option<f64> {
    sample(exposition, name)?.parse().ok()
}

fn sample<'a>(exposition: &'a str, name: &str) -> Option<&'a str> {
    exposition.lines().find_map(|line| {
        let (key, value) = line.split_once(' ')?;
        (key == name).then(|| value.trim())
    })
}
