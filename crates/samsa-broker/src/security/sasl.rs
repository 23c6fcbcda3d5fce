//! One connection's SASL state (Kafka's `SaslServerAuthenticator`):
//! SaslHandshake picks a mechanism, SaslAuthenticate carries its tokens,
//! and the connection is authenticated as a principal until its session
//! expires (KIP-368). Sans-IO: decoded requests in, responses and the
//! connection's fate out; the listener (`server`) applies them.
//!
//! Invariants:
//! - a SASL listener serves nothing but ApiVersions, SaslHandshake and
//!   SaslAuthenticate before the connection authenticates
//!   ([`SaslSession::admits`]); anything else closes it, as Kafka does;
//! - a failed authentication answers SASL_AUTHENTICATION_FAILED with a
//!   message that holds no secret, and the connection is closed after the
//!   answer; an unknown mechanism answers UNSUPPORTED_SASL_MECHANISM with
//!   the enabled ones, then closes;
//! - re-authentication (KIP-368) runs the same exchange on an
//!   authenticated connection and must name the same principal; a session
//!   past its lifetime serves only a re-authentication.

use std::sync::Arc;

use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::{
    SaslAuthenticateRequest, SaslAuthenticateResponse, SaslHandshakeRequest, SaslHandshakeResponse,
};
use kafka_protocol::protocol::StrBytes;
use samsa_controller::records::ScramCredential;

use super::scram::{plain_authenticate, ScramMechanism, ScramServer, Step};
use super::Principal;

/// The credentials SASL checks passwords against: a user's stored SCRAM
/// credential of a mechanism.
pub type CredentialLookup =
    Arc<dyn Fn(&str, ScramMechanism) -> Option<ScramCredential> + Send + Sync>;

/// What the listener does after answering a SASL request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Keep serving.
    Continue,
    /// Answer, then close the connection.
    Close(String),
}

enum State {
    /// Waiting for SaslHandshake.
    Handshake,
    /// A mechanism was chosen; SaslAuthenticate carries its tokens.
    Authenticating(Exchange),
}

enum Exchange {
    Plain,
    Scram(Box<ScramServer>),
}

/// The SASL side of one connection.
pub struct SaslSession {
    enabled: Arc<Vec<String>>,
    lookup: CredentialLookup,
    /// `connections.max.reauth.ms`; 0: sessions do not expire.
    max_reauth_ms: u64,
    state: State,
    /// The principal of the last successful authentication, and when its
    /// session ends (ms since the epoch; `None`: never).
    authenticated: Option<(Principal, Option<i64>)>,
}

impl SaslSession {
    pub fn new(enabled: Arc<Vec<String>>, lookup: CredentialLookup, max_reauth_ms: u64) -> Self {
        SaslSession {
            enabled,
            lookup,
            max_reauth_ms,
            state: State::Handshake,
            authenticated: None,
        }
    }

    /// The principal, once authenticated.
    pub fn principal(&self) -> Option<&Principal> {
        self.authenticated.as_ref().map(|(p, _)| p)
    }

    /// Whether a request of `api_key` may be served now (see the module
    /// docs); `now_ms` tells an expired session.
    pub fn admits(&self, api_key: kafka_protocol::messages::ApiKey, now_ms: i64) -> bool {
        use kafka_protocol::messages::ApiKey;
        if matches!(
            api_key,
            ApiKey::ApiVersions | ApiKey::SaslHandshake | ApiKey::SaslAuthenticate
        ) {
            return true;
        }
        match &self.authenticated {
            Some((_, expires)) => expires.is_none_or(|at| now_ms < at),
            None => false,
        }
    }

    /// SaslHandshake: the mechanism the client wants, if enabled.
    pub fn handshake(
        &mut self,
        request: &SaslHandshakeRequest,
    ) -> (SaslHandshakeResponse, Outcome) {
        let mechanisms = self
            .enabled
            .iter()
            .map(|m| StrBytes::from_string(m.clone()))
            .collect();
        let response = SaslHandshakeResponse::default().with_mechanisms(mechanisms);
        let wanted = request.mechanism.as_str();
        let exchange = if !self.enabled.iter().any(|m| m == wanted) {
            None
        } else if wanted == "PLAIN" {
            Some(Exchange::Plain)
        } else {
            ScramMechanism::from_name(wanted).map(|mechanism| {
                let lookup = Arc::clone(&self.lookup);
                Exchange::Scram(Box::new(ScramServer::new(mechanism, move |user| {
                    lookup(user, mechanism)
                })))
            })
        };
        match exchange {
            Some(exchange) => {
                self.state = State::Authenticating(exchange);
                (response, Outcome::Continue)
            }
            None => (
                response.with_error_code(ResponseError::UnsupportedSaslMechanism.code()),
                Outcome::Close(format!(
                    "client asked for SASL mechanism {wanted:?}; enabled: {}",
                    self.enabled.join(", ")
                )),
            ),
        }
    }

    /// SaslAuthenticate: one token of the chosen mechanism's exchange.
    pub fn authenticate(
        &mut self,
        request: &SaslAuthenticateRequest,
        version: i16,
        now_ms: i64,
    ) -> (SaslAuthenticateResponse, Outcome) {
        let failed = |message: String, log: String| {
            (
                SaslAuthenticateResponse::default()
                    .with_error_code(ResponseError::SaslAuthenticationFailed.code())
                    .with_error_message(Some(StrBytes::from_string(message))),
                Outcome::Close(log),
            )
        };
        let State::Authenticating(exchange) = &mut self.state else {
            return failed(
                "Unexpected SaslAuthenticate request before SaslHandshake".into(),
                "SaslAuthenticate before SaslHandshake".into(),
            );
        };
        let token = &request.auth_bytes;
        let (reply, user) = match exchange {
            Exchange::Plain => {
                let lookup = Arc::clone(&self.lookup);
                match plain_authenticate(token, |mechanism, user| lookup(user, mechanism)) {
                    Ok(user) => (Vec::new(), Some(user)),
                    Err(e) => {
                        let log = format!("SASL/PLAIN authentication failed: {e}");
                        return failed(e.client_message(), log);
                    }
                }
            }
            Exchange::Scram(server) => match server.step(token) {
                Ok(Step::Continue(server_first)) => (server_first, None),
                Ok(Step::Done {
                    server_final,
                    username,
                }) => (server_final, Some(username)),
                Err(e) => {
                    let log = format!(
                        "SASL/{} authentication failed: {e}",
                        server.mechanism().name()
                    );
                    return failed(e.client_message(), log);
                }
            },
        };
        let mut response = SaslAuthenticateResponse::default()
            .with_auth_bytes(bytes::Bytes::from(reply))
            .with_error_message(None);
        let Some(user) = user else {
            return (response, Outcome::Continue);
        };
        let principal = Principal::user(user);
        if let Some((before, _)) = &self.authenticated {
            if *before != principal {
                return failed(
                    format!("Cannot change principals during re-authentication from {before}: {principal}"),
                    format!("re-authentication as {principal} on a connection of {before}"),
                );
            }
        }
        let expires = (self.max_reauth_ms > 0)
            .then(|| now_ms.saturating_add(i64::try_from(self.max_reauth_ms).unwrap_or(i64::MAX)));
        if version >= 1 {
            response.session_lifetime_ms = i64::try_from(self.max_reauth_ms).unwrap_or(i64::MAX);
        }
        self.authenticated = Some((principal, expires));
        self.state = State::Handshake;
        (response, Outcome::Continue)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use kafka_protocol::messages::ApiKey;

    fn session(max_reauth_ms: u64) -> SaslSession {
        let credential =
            super::super::scram::new_credential(ScramMechanism::Sha256, b"secret", 4096).unwrap();
        SaslSession::new(
            Arc::new(vec!["SCRAM-SHA-256".into(), "PLAIN".into()]),
            Arc::new(move |user, mechanism| {
                (user == "alice" && mechanism == ScramMechanism::Sha256).then(|| credential.clone())
            }),
            max_reauth_ms,
        )
    }

    fn handshake(s: &mut SaslSession, mechanism: &str) -> (i16, Outcome) {
        let (r, o) = s.handshake(&SaslHandshakeRequest::default().with_mechanism(
            StrBytes::from_static_str(match mechanism {
                "PLAIN" => "PLAIN",
                "SCRAM-SHA-256" => "SCRAM-SHA-256",
                _ => "GSSAPI",
            }),
        ));
        (r.error_code, o)
    }

    fn plain(s: &mut SaslSession, token: &[u8], now: i64) -> (i16, Outcome) {
        let (r, o) = s.authenticate(
            &SaslAuthenticateRequest::default()
                .with_auth_bytes(bytes::Bytes::copy_from_slice(token)),
            2,
            now,
        );
        (r.error_code, o)
    }

    #[test]
    fn only_the_handshake_before_authentication() {
        let mut s = session(0);
        assert!(s.admits(ApiKey::ApiVersions, 0));
        assert!(!s.admits(ApiKey::Metadata, 0));
        assert_eq!(handshake(&mut s, "PLAIN"), (0, Outcome::Continue));
        assert_eq!(plain(&mut s, b"\0alice\0secret", 0), (0, Outcome::Continue));
        assert!(s.admits(ApiKey::Metadata, 0));
        assert_eq!(s.principal(), Some(&Principal::user("alice")));
    }

    #[test]
    fn wrong_password_unknown_user_and_unknown_mechanism_close() {
        for token in [&b"\0alice\0wrong"[..], b"\0bob\0secret", b"garbage"] {
            let mut s = session(0);
            handshake(&mut s, "PLAIN");
            let (code, outcome) = plain(&mut s, token, 0);
            assert_eq!(code, ResponseError::SaslAuthenticationFailed.code());
            assert!(matches!(outcome, Outcome::Close(_)));
            assert!(!s.admits(ApiKey::Metadata, 0));
        }
        let mut s = session(0);
        let (code, outcome) = handshake(&mut s, "GSSAPI");
        assert_eq!(code, ResponseError::UnsupportedSaslMechanism.code());
        assert!(matches!(outcome, Outcome::Close(_)));
        let mut s = session(0);
        let (code, _) = plain(&mut s, b"\0alice\0secret", 0);
        assert_eq!(
            code,
            ResponseError::SaslAuthenticationFailed.code(),
            "no handshake"
        );
    }

    #[test]
    fn sessions_expire_and_reauthentication_keeps_the_principal() {
        let mut s = session(1000);
        handshake(&mut s, "PLAIN");
        plain(&mut s, b"\0alice\0secret", 0);
        assert!(s.admits(ApiKey::Produce, 999));
        assert!(!s.admits(ApiKey::Produce, 1000), "expired");
        assert!(s.admits(ApiKey::SaslHandshake, 1000));
        handshake(&mut s, "PLAIN");
        assert_eq!(plain(&mut s, b"\0alice\0secret", 1500).0, 0);
        assert!(s.admits(ApiKey::Produce, 2499));
    }
}
