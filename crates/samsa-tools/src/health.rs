//! `samsa health`: one HTTP GET of a broker's `/readyz` (or any URL of its
//! HTTP endpoint), exit status 0 on `200 OK` and 1 otherwise, for container
//! health checks in images that carry no HTTP client. Plain `http://` only,
//! blocking std sockets with a deadline: no runtime, no TLS. The GET itself
//! ([`http_get`]) also reads `/metrics` for `samsa bench txn --metrics`.

use std::io::{Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use clap::Args;

#[derive(Debug, Args)]
pub struct HealthArgs {
    /// The URL to GET (http:// only).
    #[arg(long, default_value = "http://127.0.0.1:9644/readyz")]
    pub url: String,
    /// Connect, send and receive deadline, each.
    #[arg(long, value_name = "MS", default_value_t = 2000)]
    pub timeout_ms: u64,
}

/// GETs the URL; prints the status line and body on success, an error otherwise.
pub fn run(args: &HealthArgs) -> Result<ExitCode> {
    let timeout = Duration::from_millis(args.timeout_ms.max(1));
    let answer = http_get(&args.url, timeout, 64 * 1024)?;
    if answer.status != 200 {
        bail!(
            "{} answered {}: {}",
            args.url,
            answer.status,
            answer.body.trim()
        );
    }
    print!("{}", answer.body);
    Ok(ExitCode::SUCCESS)
}

/// An HTTP answer as [`http_get`] read it.
#[derive(Debug)]
pub(crate) struct HttpAnswer {
    pub status: u16,
    /// The body as sent: a chunked one is not decoded.
    pub body: String,
    pub chunked: bool,
}

/// One `GET` of `url` (`http://` only) over a fresh connection, reading at
/// most `max_bytes` of the answer; `timeout` bounds the connect, the send
/// and each read.
pub(crate) fn http_get(url: &str, timeout: Duration, max_bytes: u64) -> Result<HttpAnswer> {
    let (host_port, path) = split_url(url)?;
    let addr = host_port
        .to_socket_addrs()
        .with_context(|| format!("cannot resolve {host_port}"))?
        .next()
        .ok_or_else(|| anyhow!("{host_port} resolves to no address"))?;
    let mut stream = TcpStream::connect_timeout(&addr, timeout)
        .with_context(|| format!("cannot connect to {addr}"))?;
    stream.set_read_timeout(Some(timeout))?;
    stream.set_write_timeout(Some(timeout))?;
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: {host_port}\r\nConnection: close\r\n\r\n"
    )
    .with_context(|| format!("cannot send the request to {addr}"))?;
    let mut response = Vec::new();
    stream
        .take(max_bytes)
        .read_to_end(&mut response)
        .with_context(|| format!("no complete answer from {addr}"))?;
    let text = String::from_utf8_lossy(&response);
    let status = status_code(&text)?;
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    Ok(HttpAnswer {
        status,
        body: body.to_string(),
        chunked: head
            .to_ascii_lowercase()
            .contains("transfer-encoding: chunked"),
    })
}

/// `http://host:port/path` → (`host:port`, `/path`); the port defaults to 80.
fn split_url(url: &str) -> Result<(String, String)> {
    let rest = url
        .strip_prefix("http://")
        .ok_or_else(|| anyhow!("{url}: only http:// URLs are supported"))?;
    let (authority, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, "/"),
    };
    if authority.is_empty() {
        bail!("{url}: no host");
    }
    let host_port = if authority
        .rsplit_once(':')
        .is_some_and(|(_, p)| p.parse::<u16>().is_ok())
    {
        authority.to_string()
    } else {
        format!("{authority}:80")
    };
    Ok((host_port, path.to_string()))
}

fn status_code(response: &str) -> Result<u16> {
    let line = response.lines().next().unwrap_or("");
    let mut parts = line.split_whitespace();
    match (parts.next(), parts.next().map(str::parse::<u16>)) {
        (Some(version), Some(Ok(code))) if version.starts_with("HTTP/") => Ok(code),
        _ => bail!("not an HTTP answer: {line:?}"),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn urls() {
        assert_eq!(
            split_url("http://127.0.0.1:9644/readyz").unwrap(),
            ("127.0.0.1:9644".into(), "/readyz".into())
        );
        assert_eq!(
            split_url("http://samsa-0").unwrap(),
            ("samsa-0:80".into(), "/".into())
        );
        assert!(split_url("https://x/readyz").is_err());
        assert!(split_url("http:///readyz").is_err());
    }

    #[test]
    fn status_lines() {
        assert_eq!(status_code("HTTP/1.1 200 OK\r\n\r\nready\n").unwrap(), 200);
        assert_eq!(
            status_code("HTTP/1.1 503 Service Unavailable\r\n").unwrap(),
            503
        );
        assert!(status_code("SSH-2.0-x\r\n").is_err());
        assert!(status_code("").is_err());
    }
}
