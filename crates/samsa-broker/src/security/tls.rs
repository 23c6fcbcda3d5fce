//! TLS on the Kafka listeners (rustls): the server configuration built from
//! PEM files, reloaded when they change, and the principal a client
//! certificate names.
//!
//! Invariants:
//! - a connection always gets a complete configuration: a reload replaces
//!   the one in use only once the new certificate, key and CAs all load, so
//!   a half-written file keeps the old ones (and is logged);
//! - `ssl_client_auth = required` refuses a client without a certificate
//!   that chains to `ssl_ca_file` in the handshake; `requested` takes
//!   clients without one as `User:ANONYMOUS`; `none` asks for none;
//! - the principal of a client certificate is its subject's distinguished
//!   name in RFC 2253 form (`CN=client,OU=eng,O=samsa`), as Kafka's
//!   default `ssl.principal.mapping.rules` gives it.

use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::{Duration, SystemTime};

use rustls::server::WebPkiClientVerifier;
use rustls::{RootCertStore, ServerConfig};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use tracing::{info, warn};

use super::Principal;
use crate::config::{BrokerConfig, SslClientAuth};

/// How often the PEM files are looked at for changes.
const RELOAD_CHECK_INTERVAL: Duration = Duration::from_secs(10);

#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("{0} is required for TLS listeners (SSL, SASL_SSL)")]
    Missing(&'static str),
    #[error("cannot read {path}: {reason}")]
    Read { path: PathBuf, reason: String },
    #[error("{path} holds no {what}")]
    Empty { path: PathBuf, what: &'static str },
    #[error("invalid TLS configuration: {0}")]
    Config(String),
}

/// Where a server configuration comes from.
#[derive(Debug, Clone)]
struct Sources {
    cert: PathBuf,
    key: PathBuf,
    ca: Option<PathBuf>,
    client_auth: SslClientAuth,
}

impl Sources {
    fn of(config: &BrokerConfig) -> Result<Sources, TlsError> {
        let client_auth = config.ssl_client_auth;
        let ca = config.ssl_ca_file.clone();
        if client_auth != SslClientAuth::None && ca.is_none() {
            return Err(TlsError::Missing(
                "ssl_ca_file (the CAs client certificates chain to, for ssl_client_auth)",
            ));
        }
        Ok(Sources {
            cert: config
                .ssl_cert_file
                .clone()
                .ok_or(TlsError::Missing("ssl_cert_file"))?,
            key: config
                .ssl_key_file
                .clone()
                .ok_or(TlsError::Missing("ssl_key_file"))?,
            ca,
            client_auth,
        })
    }

    fn files(&self) -> Vec<&Path> {
        let mut files = vec![self.cert.as_path(), self.key.as_path()];
        files.extend(self.ca.as_deref());
        files
    }

    /// The modification times of the files (a missing file: `None`).
    fn stamps(&self) -> Vec<Option<SystemTime>> {
        self.files()
            .iter()
            .map(|f| std::fs::metadata(f).and_then(|m| m.modified()).ok())
            .collect()
    }
}

fn read_err(path: &Path, e: impl std::fmt::Display) -> TlsError {
    TlsError::Read {
        path: path.to_path_buf(),
        reason: e.to_string(),
    }
}

/// The certificates of a PEM file, in order.
pub fn load_certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let certs = CertificateDer::pem_file_iter(path)
        .map_err(|e| read_err(path, e))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| read_err(path, e))?;
    if certs.is_empty() {
        return Err(TlsError::Empty {
            path: path.to_path_buf(),
            what: "certificate",
        });
    }
    Ok(certs)
}

/// The private key of a PEM file.
pub fn load_key(path: &Path) -> Result<PrivateKeyDer<'static>, TlsError> {
    PrivateKeyDer::from_pem_file(path).map_err(|e| read_err(path, e))
}

/// The CAs of a PEM file, as a root store.
pub fn load_roots(path: &Path) -> Result<RootCertStore, TlsError> {
    let mut roots = RootCertStore::empty();
    for cert in load_certs(path)? {
        roots
            .add(cert)
            .map_err(|e| read_err(path, format!("not a usable CA certificate: {e}")))?;
    }
    Ok(roots)
}

/// The crypto provider: ring. rustls 0.23.48 deprecates it for lacking
/// post-quantum key exchange (aws-lc-rs has it, at the cost of building
/// AWS-LC's C sources in every build); docs/SECURITY.md says what that
/// leaves out.
#[allow(deprecated)]
pub fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn build(sources: &Sources) -> Result<ServerConfig, TlsError> {
    let certs = load_certs(&sources.cert)?;
    let key = load_key(&sources.key)?;
    let provider = provider();
    let builder = ServerConfig::builder_with_provider(Arc::clone(&provider))
        .with_safe_default_protocol_versions()
        .map_err(|e| TlsError::Config(e.to_string()))?;
    let builder = match (&sources.ca, sources.client_auth) {
        (Some(ca), auth) if auth != SslClientAuth::None => {
            let verifier =
                WebPkiClientVerifier::builder_with_provider(Arc::new(load_roots(ca)?), provider);
            let verifier = if auth == SslClientAuth::Requested {
                verifier.allow_unauthenticated()
            } else {
                verifier
            };
            builder.with_client_cert_verifier(
                verifier
                    .build()
                    .map_err(|e| TlsError::Config(e.to_string()))?,
            )
        }
        _ => builder.with_no_client_auth(),
    };
    builder
        .with_single_cert(certs, key)
        .map_err(|e| TlsError::Config(format!("certificate and key do not go together: {e}")))
}

/// The TLS side of the Kafka listeners: the acceptor in force, replaced
/// when the PEM files change.
pub struct TlsListenerConfig {
    sources: Sources,
    current: RwLock<(tokio_rustls::TlsAcceptor, Vec<Option<SystemTime>>)>,
}

impl TlsListenerConfig {
    /// Loads the configuration `config` names; an error says which file or
    /// setting is wrong.
    pub fn load(config: &BrokerConfig) -> Result<Arc<TlsListenerConfig>, TlsError> {
        let sources = Sources::of(config)?;
        let stamps = sources.stamps();
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(build(&sources)?));
        Ok(Arc::new(TlsListenerConfig {
            sources,
            current: RwLock::new((acceptor, stamps)),
        }))
    }

    /// The acceptor for a new connection.
    pub fn acceptor(&self) -> tokio_rustls::TlsAcceptor {
        self.current
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .0
            .clone()
    }

    /// Loads the files again if any changed since the last load; a set
    /// that does not load keeps the one in force (and is logged).
    pub fn reload_if_changed(&self) {
        let stamps = self.sources.stamps();
        if self.current.read().unwrap_or_else(|p| p.into_inner()).1 == stamps {
            return;
        }
        match build(&self.sources) {
            Ok(config) => {
                *self.current.write().unwrap_or_else(|p| p.into_inner()) =
                    (tokio_rustls::TlsAcceptor::from(Arc::new(config)), stamps);
                info!(cert = %self.sources.cert.display(), "TLS certificate, key and CAs reloaded");
            }
            Err(e) => {
                // Remember the stamps: one warning per change, not one per check.
                self.current.write().unwrap_or_else(|p| p.into_inner()).1 = stamps;
                warn!(error = %e, "changed TLS files do not load; the ones in force stay");
            }
        }
    }

    /// Checks the files for changes until `stop`.
    pub async fn watch(self: Arc<Self>, mut stop: tokio::sync::watch::Receiver<bool>) {
        let mut every = tokio::time::interval(RELOAD_CHECK_INTERVAL);
        loop {
            tokio::select! {
                _ = every.tick() => {
                    let this = Arc::clone(&self);
                    let _ = tokio::task::spawn_blocking(move || this.reload_if_changed()).await;
                }
                _ = stop.changed() => return,
            }
        }
    }
}

/// The principal a verified client certificate names: `User:` and its
/// subject in RFC 2253 form (Kafka's default principal mapping); `None`
/// when the certificate does not parse.
pub fn certificate_principal(cert: &CertificateDer<'_>) -> Option<Principal> {
    let (_, parsed) = x509_parser::parse_x509_certificate(cert.as_ref()).ok()?;
    Some(Principal::user(rfc2253(parsed.subject())))
}

/// A distinguished name as Java's `X500Principal.getName()` writes it: the
/// RDNs last first, `TYPE=value` joined by ',' (multi-valued RDNs by '+'),
/// special characters escaped.
fn rfc2253(name: &x509_parser::x509::X509Name<'_>) -> String {
    let mut rdns: Vec<String> = name
        .iter_rdn()
        .map(|rdn| {
            rdn.iter()
                .map(|attr| {
                    let oid = attr.attr_type().to_id_string();
                    let key = match oid.as_str() {
                        "2.5.4.3" => "CN".to_owned(),
                        "2.5.4.6" => "C".to_owned(),
                        "2.5.4.7" => "L".to_owned(),
                        "2.5.4.8" => "ST".to_owned(),
                        "2.5.4.9" => "STREET".to_owned(),
                        "2.5.4.10" => "O".to_owned(),
                        "2.5.4.11" => "OU".to_owned(),
                        "0.9.2342.19200300.100.1.25" => "DC".to_owned(),
                        "0.9.2342.19200300.100.1.1" => "UID".to_owned(),
                        other => other.to_owned(),
                    };
                    let value = match attr.as_str() {
                        Ok(text) => escape_rfc2253(text),
                        // Not a string type: RFC 2253's '#' and the hex of
                        // the value's encoding.
                        Err(_) => format!(
                            "#{}",
                            attr.attr_value()
                                .as_bytes()
                                .iter()
                                .map(|b| format!("{b:02x}"))
                                .collect::<String>()
                        ),
                    };
                    format!("{key}={value}")
                })
                .collect::<Vec<_>>()
                .join("+")
        })
        .collect();
    rdns.reverse();
    rdns.join(",")
}

fn escape_rfc2253(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    let last = value.chars().count().saturating_sub(1);
    for (i, c) in value.chars().enumerate() {
        let special = matches!(c, ',' | '+' | '"' | '\\' | '<' | '>' | ';')
            || (i == 0 && (c == ' ' || c == '#'))
            || (i == last && c == ' ');
        if special {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    #[test]
    fn rfc2253_escapes_as_java_does() {
        assert_eq!(escape_rfc2253("a,b"), "a\\,b");
        assert_eq!(escape_rfc2253(" lead"), "\\ lead");
        assert_eq!(escape_rfc2253("trail "), "trail\\ ");
        assert_eq!(escape_rfc2253("#x"), "\\#x");
        assert_eq!(escape_rfc2253("plain"), "plain");
    }

    #[test]
    fn missing_settings_are_named() {
        let config = BrokerConfig::default();
        assert!(matches!(
            TlsListenerConfig::load(&config),
            Err(TlsError::Missing("ssl_cert_file"))
        ));
        let needs_ca = BrokerConfig {
            ssl_cert_file: Some("c.pem".into()),
            ssl_key_file: Some("k.pem".into()),
            ssl_client_auth: SslClientAuth::Required,
            ..BrokerConfig::default()
        };
        assert!(matches!(
            TlsListenerConfig::load(&needs_ca),
            Err(TlsError::Missing(_))
        ));
        let unreadable = BrokerConfig {
            ssl_cert_file: Some("/nonexistent/c.pem".into()),
            ssl_key_file: Some("/nonexistent/k.pem".into()),
            ..BrokerConfig::default()
        };
        assert!(matches!(
            TlsListenerConfig::load(&unreadable),
            Err(TlsError::Read { .. })
        ));
    }
}
