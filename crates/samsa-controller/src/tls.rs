//! Mutual TLS on the inter-node gRPC port (Raft between controllers,
//! broker ⇄ controller, replica fetches, transaction markers): one
//! certificate and key per node and the CA of the cluster. With it
//! configured, the port accepts only peers presenting a certificate of that
//! CA, and every client of the port presents the node's own certificate and
//! checks the server's against the same CA (host name or IP address of the
//! address it dials, as any TLS client).
//!
//! Invariant: a process that has [`InterNodeTls`] uses it for every gRPC
//! channel and the server it runs; one without it speaks plaintext. The two
//! never interoperate, so a cluster is either all mTLS or all plaintext.

use std::path::Path;
use std::time::Duration;

use tonic::transport::{Certificate, ClientTlsConfig, Endpoint, Identity, ServerTlsConfig};

/// A node's certificate and key and the cluster's CA, as PEM.
#[derive(Clone)]
pub struct InterNodeTls {
    identity: Identity,
    ca: Certificate,
}

impl std::fmt::Debug for InterNodeTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("InterNodeTls")
    }
}

impl InterNodeTls {
    /// From PEM bytes: the certificate chain (leaf first), its private key,
    /// and the CA certificates peers must chain to.
    pub fn from_pem(cert: Vec<u8>, key: Vec<u8>, ca: Vec<u8>) -> InterNodeTls {
        InterNodeTls {
            identity: Identity::from_pem(cert, key),
            ca: Certificate::from_pem(ca),
        }
    }

    /// Reads the three PEM files; the error names the file that cannot be
    /// read. (Whether they parse is found when the server or a channel is
    /// built: tonic parses them there.)
    pub fn load(cert: &Path, key: &Path, ca: &Path) -> Result<InterNodeTls, String> {
        let read = |path: &Path| {
            std::fs::read(path).map_err(|e| format!("cannot read {}: {e}", path.display()))
        };
        Ok(InterNodeTls::from_pem(read(cert)?, read(key)?, read(ca)?))
    }

    /// The server side: present the node's certificate, require a client
    /// certificate of the cluster's CA.
    pub fn server_config(&self) -> ServerTlsConfig {
        ServerTlsConfig::new()
            .identity(self.identity.clone())
            .client_ca_root(self.ca.clone())
    }

    fn client_config(&self) -> ClientTlsConfig {
        ClientTlsConfig::new()
            .identity(self.identity.clone())
            .ca_certificate(self.ca.clone())
    }
}

/// The endpoint of a peer's gRPC port at `addr` (`host:port`, or a URI):
/// `https` with the node's certificate when `tls` is set, `http` otherwise;
/// connecting within a second, with TCP_NODELAY.
pub fn peer_endpoint(
    addr: &str,
    tls: Option<&InterNodeTls>,
) -> Result<Endpoint, tonic::transport::Error> {
    let host_port = addr
        .strip_prefix("http://")
        .or_else(|| addr.strip_prefix("https://"))
        .unwrap_or(addr);
    let scheme = if tls.is_some() { "https" } else { "http" };
    let endpoint = Endpoint::from_shared(format!("{scheme}://{host_port}"))?
        .connect_timeout(Duration::from_secs(1))
        .tcp_nodelay(true);
    match tls {
        Some(tls) => endpoint.tls_config(tls.client_config()),
        None => Ok(endpoint),
    }
}
