//! The server side of Kafka's password SASL mechanisms, sans IO:
//! SASL/SCRAM-SHA-256 and SASL/SCRAM-SHA-512 (RFC 5802, RFC 7677, with
//! Kafka's `ScramSaslServer` semantics) and SASL/PLAIN checked against the
//! same stored SCRAM credentials.
//!
//! What this module owns:
//!
//! - [`ScramMechanism`]: the two SCRAM mechanisms, their Kafka names, their
//!   type codes in DescribeUserScramCredentials / AlterUserScramCredentials
//!   and Kafka's iteration limits;
//! - the credential derivation that the metadata stores
//!   ([`ScramCredential`]: salt, StoredKey, ServerKey, iterations; never the
//!   password): [`new_credential`] from a password,
//!   [`credential_from_salted_password`] from what AlterUserScramCredentials
//!   carries (salt + SaltedPassword), [`verify_password`];
//! - [`ScramServer`]: the two-round SCRAM exchange as a state machine fed
//!   with the client's SaslAuthenticate bytes, answering the bytes to send
//!   back ([`Step`]);
//! - [`plain_authenticate`]: SASL/PLAIN's single message.
//!
//! The connection code owns the framing (SaslHandshake / SaslAuthenticate),
//! maps every [`ScramError`] to `SASL_AUTHENTICATION_FAILED` (with
//! [`ScramError::client_message`] as the error message) and logs.
//!
//! Invariants (this module parses attacker-controlled bytes before the peer
//! is authenticated):
//!
//! - **No secret in errors.** Every [`ScramError`] carries only `&'static
//!   str` reasons, a mechanism name and iteration counts: never the
//!   password, the proof, a key, nor any byte of the client's message
//!   (not even the user name, which the caller knows anyway).
//! - **Bounded input.** A client message longer than
//!   [`MAX_CLIENT_MESSAGE_LEN`] is refused before it is parsed; parsing
//!   never panics (malformed input is [`ScramError::Malformed`]); PLAIN
//!   never runs PBKDF2 with more than [`ScramMechanism::MAX_ITERATIONS`].
//! - **Constant-time proof check.** `H(ClientProof XOR ClientSignature)` is
//!   compared with the StoredKey with [`subtle::ConstantTimeEq`], as is
//!   PLAIN's derived StoredKey.
//! - **An unknown user looks like a wrong password.** A user without a
//!   (usable) credential of the mechanism gets a fake one: a salt derived
//!   from the user name with a per-process random key (the same user gets
//!   the same salt on every attempt, as a real user would), the default
//!   4096 iterations, random keys. The exchange then goes on exactly as for
//!   a real user and fails at the proof with the same
//!   [`ScramError::InvalidCredentials`] as a wrong password (RFC 5802 §9;
//!   Kafka itself fails at the client-first message, with the same message
//!   to the client). PLAIN runs one PBKDF2 for an unknown user too.

use std::fmt;
use std::sync::OnceLock;

use base64::alphabet;
use base64::engine::general_purpose::{GeneralPurpose, GeneralPurposeConfig, STANDARD};
use base64::engine::DecodePaddingMode;
use base64::Engine as _;
use hmac::digest::KeyInit;
use hmac::{Hmac, Mac};
use rand::distributions::Alphanumeric;
use rand::{Rng, RngCore};
use samsa_controller::records::ScramCredential;
use sha2::{Digest, Sha256, Sha512};
use subtle::ConstantTimeEq;

/// The longest client message (SCRAM client-first / client-final, PLAIN)
/// accepted; longer ones are refused before parsing. Real ones are a few
/// hundred bytes at most.
pub const MAX_CLIENT_MESSAGE_LEN: usize = 4096;

/// Length of the salts [`new_credential`] generates (and of the fake salts
/// of unknown users).
pub const SALT_LEN: usize = 32;

/// Number of random characters the server appends to the client's nonce.
const SERVER_NONCE_LEN: usize = 32;

/// Iterations of an unknown user's fake credential: Kafka's default (and
/// minimum), what `kafka-configs` stores unless told otherwise.
const FAKE_ITERATIONS: u32 = 4096;

/// Kafka's name of SASL/PLAIN, for errors.
const PLAIN: &str = "PLAIN";

/// Kafka's SCRAM extension naming a delegation token as the user.
const TOKEN_AUTH_EXTENSION: &str = "tokenauth";

/// Base64 decoding that, like Java's `Base64.getDecoder()`, accepts a
/// missing padding.
const BASE64_LENIENT: GeneralPurpose = GeneralPurpose::new(
    &alphabet::STANDARD,
    GeneralPurposeConfig::new().with_decode_padding_mode(DecodePaddingMode::Indifferent),
);

/// A SCRAM mechanism Kafka supports.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ScramMechanism {
    Sha256,
    Sha512,
}

impl ScramMechanism {
    /// Every mechanism, in Kafka's type-code order.
    pub const ALL: [ScramMechanism; 2] = [ScramMechanism::Sha256, ScramMechanism::Sha512];

    /// Kafka's minimum iteration count (both mechanisms).
    pub const MIN_ITERATIONS: u32 = 4096;

    /// Kafka's maximum iteration count (AlterUserScramCredentials).
    pub const MAX_ITERATIONS: u32 = 16384;

    /// Kafka's mechanism name: `SCRAM-SHA-256` / `SCRAM-SHA-512`.
    pub fn name(self) -> &'static str {
        match self {
            ScramMechanism::Sha256 => "SCRAM-SHA-256",
            ScramMechanism::Sha512 => "SCRAM-SHA-512",
        }
    }

    /// The mechanism of a Kafka mechanism name (exact, case-sensitive, as
    /// Kafka's `ScramMechanism.forMechanismName`).
    pub fn from_name(name: &str) -> Option<ScramMechanism> {
        ScramMechanism::ALL.into_iter().find(|m| m.name() == name)
    }

    /// Kafka's mechanism type in DescribeUserScramCredentials /
    /// AlterUserScramCredentials: 1 SCRAM-SHA-256, 2 SCRAM-SHA-512 (0 is
    /// Kafka's UNKNOWN).
    pub fn type_code(self) -> i8 {
        match self {
            ScramMechanism::Sha256 => 1,
            ScramMechanism::Sha512 => 2,
        }
    }

    /// The mechanism of a Kafka mechanism type; `None` for UNKNOWN (0) and
    /// anything else.
    pub fn from_type_code(code: i8) -> Option<ScramMechanism> {
        ScramMechanism::ALL
            .into_iter()
            .find(|m| m.type_code() == code)
    }

    /// Kafka's minimum iteration count for this mechanism.
    pub fn min_iterations(self) -> u32 {
        ScramMechanism::MIN_ITERATIONS
    }

    /// Kafka's maximum iteration count for this mechanism.
    pub fn max_iterations(self) -> u32 {
        ScramMechanism::MAX_ITERATIONS
    }

    /// Output length of the hash (and so of every key and of the proof).
    pub fn hash_len(self) -> usize {
        match self {
            ScramMechanism::Sha256 => 32,
            ScramMechanism::Sha512 => 64,
        }
    }

    /// `Ok` when `iterations` is within Kafka's limits.
    pub fn check_iterations(self, iterations: u32) -> Result<(), ScramError> {
        if iterations < self.min_iterations() {
            Err(ScramError::TooFewIterations {
                mechanism: self.name(),
                iterations,
                min: self.min_iterations(),
            })
        } else if iterations > self.max_iterations() {
            Err(ScramError::TooManyIterations {
                mechanism: self.name(),
                iterations,
                max: self.max_iterations(),
            })
        } else {
            Ok(())
        }
    }
}

impl fmt::Display for ScramMechanism {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Why an authentication or a credential derivation failed. No variant
/// holds a secret or a byte of the client's message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ScramError {
    /// Wrong password, unknown user, or a user without a usable credential:
    /// indistinguishable on purpose.
    #[error(
        "Authentication failed during authentication due to invalid credentials with SASL mechanism {mechanism}"
    )]
    InvalidCredentials { mechanism: &'static str },
    /// The client asked for an authorization id other than its user name
    /// (Kafka refuses this, with this message, for SCRAM and PLAIN).
    #[error(
        "Authentication failed: Client requested an authorization id that is different from username"
    )]
    AuthorizationIdMismatch { mechanism: &'static str },
    /// The client asked for delegation-token authentication (SCRAM
    /// extension `tokenauth=true`); samsa has no delegation tokens.
    #[error(
        "Authentication failed: delegation token authentication is not supported with SASL mechanism {mechanism}"
    )]
    TokenAuthNotSupported { mechanism: &'static str },
    /// The client's message does not parse or does not match the exchange
    /// (oversized, not UTF-8, missing attribute, bad base64, wrong nonce,
    /// channel binding, ...).
    #[error("Authentication failed: malformed SASL {mechanism} message: {reason}")]
    Malformed {
        mechanism: &'static str,
        reason: &'static str,
    },
    /// A message arrived when the exchange expects none (after it succeeded
    /// or failed).
    #[error("Authentication failed: SASL {mechanism} exchange in an illegal state: {reason}")]
    IllegalState {
        mechanism: &'static str,
        reason: &'static str,
    },
    /// A credential with fewer iterations than Kafka's minimum (Kafka's
    /// UNACCEPTABLE_CREDENTIAL "Too few iterations").
    #[error("Too few iterations: {iterations} is below the minimum {min} of {mechanism}")]
    TooFewIterations {
        mechanism: &'static str,
        iterations: u32,
        min: u32,
    },
    /// A credential with more iterations than Kafka's maximum (Kafka's
    /// UNACCEPTABLE_CREDENTIAL "Too many iterations").
    #[error("Too many iterations: {iterations} is above the maximum {max} of {mechanism}")]
    TooManyIterations {
        mechanism: &'static str,
        iterations: u32,
        max: u32,
    },
    /// A credential that cannot be stored (empty salt or password, salted
    /// password of the wrong length): Kafka's UNACCEPTABLE_CREDENTIAL.
    #[error("Unacceptable {mechanism} credential: {reason}")]
    UnacceptableCredential {
        mechanism: &'static str,
        reason: &'static str,
    },
    /// A cryptographic primitive refused its input (does not happen with
    /// HMAC; kept rather than a panic).
    #[error("SASL {mechanism} internal error: {reason}")]
    Internal {
        mechanism: &'static str,
        reason: &'static str,
    },
}

impl ScramError {
    /// The error message to send to the client in SaslAuthenticate, as
    /// Kafka words it: the generic "invalid credentials" sentence for
    /// everything but the authorization-id refusal and the credential
    /// errors (which Kafka reports verbatim).
    pub fn client_message(&self) -> String {
        match self {
            ScramError::InvalidCredentials { mechanism }
            | ScramError::TokenAuthNotSupported { mechanism }
            | ScramError::Malformed { mechanism, .. }
            | ScramError::IllegalState { mechanism, .. }
            | ScramError::Internal { mechanism, .. } => {
                ScramError::InvalidCredentials { mechanism }.to_string()
            }
            ScramError::AuthorizationIdMismatch { .. }
            | ScramError::TooFewIterations { .. }
            | ScramError::TooManyIterations { .. }
            | ScramError::UnacceptableCredential { .. } => self.to_string(),
        }
    }

    /// Whether the client sent something that is not a valid message for
    /// the exchange (as opposed to valid messages with wrong credentials):
    /// both are SASL_AUTHENTICATION_FAILED, but worth logging differently.
    pub fn is_protocol_violation(&self) -> bool {
        matches!(
            self,
            ScramError::Malformed { .. } | ScramError::IllegalState { .. }
        )
    }
}

// ---------------------------------------------------------------------------
// Primitives.

/// H(data).
fn hash(mechanism: ScramMechanism, data: &[u8]) -> Vec<u8> {
    match mechanism {
        ScramMechanism::Sha256 => Sha256::digest(data).to_vec(),
        ScramMechanism::Sha512 => Sha512::digest(data).to_vec(),
    }
}

/// HMAC(key, data).
fn hmac(mechanism: ScramMechanism, key: &[u8], data: &[u8]) -> Result<Vec<u8>, ScramError> {
    fn run<M: Mac + KeyInit>(key: &[u8], data: &[u8]) -> Option<Vec<u8>> {
        let mut mac = <M as Mac>::new_from_slice(key).ok()?;
        mac.update(data);
        Some(mac.finalize().into_bytes().to_vec())
    }
    match mechanism {
        ScramMechanism::Sha256 => run::<Hmac<Sha256>>(key, data),
        ScramMechanism::Sha512 => run::<Hmac<Sha512>>(key, data),
    }
    .ok_or(ScramError::Internal {
        mechanism: mechanism.name(),
        reason: "HMAC refused its key",
    })
}

/// Hi(password, salt, iterations): PBKDF2 with HMAC-H, one hash length out.
/// The caller bounds `iterations`.
fn hi(mechanism: ScramMechanism, password: &[u8], salt: &[u8], iterations: u32) -> Vec<u8> {
    let mut out = vec![0u8; mechanism.hash_len()];
    match mechanism {
        ScramMechanism::Sha256 => {
            pbkdf2::pbkdf2_hmac::<Sha256>(password, salt, iterations, &mut out)
        }
        ScramMechanism::Sha512 => {
            pbkdf2::pbkdf2_hmac::<Sha512>(password, salt, iterations, &mut out)
        }
    }
    out
}

/// The keys RFC 5802 derives from a SaltedPassword.
struct Keys {
    /// H(ClientKey), ClientKey = HMAC(SaltedPassword, "Client Key").
    stored_key: Vec<u8>,
    /// HMAC(SaltedPassword, "Server Key").
    server_key: Vec<u8>,
}

fn keys(mechanism: ScramMechanism, salted_password: &[u8]) -> Result<Keys, ScramError> {
    let client_key = hmac(mechanism, salted_password, b"Client Key")?;
    let stored_key = hash(mechanism, &client_key);
    let server_key = hmac(mechanism, salted_password, b"Server Key")?;
    Ok(Keys {
        stored_key,
        server_key,
    })
}

/// A fresh random salt of [`SALT_LEN`] bytes (what a client sends in an
/// AlterUserScramCredentials upsertion).
pub fn random_salt() -> Vec<u8> {
    random_bytes(SALT_LEN)
}

fn random_bytes(len: usize) -> Vec<u8> {
    let mut bytes = vec![0u8; len];
    rand::thread_rng().fill_bytes(&mut bytes);
    bytes
}

/// The per-process key fake salts are derived with.
fn fake_salt_key() -> &'static [u8; 32] {
    static KEY: OnceLock<[u8; 32]> = OnceLock::new();
    KEY.get_or_init(|| {
        let mut key = [0u8; 32];
        rand::thread_rng().fill_bytes(&mut key);
        key
    })
}

/// The salt an unknown user gets: stable for a user and mechanism within
/// the process, unpredictable without the process key.
fn fake_salt(mechanism: ScramMechanism, username: &str) -> Vec<u8> {
    let mut input = Vec::with_capacity(mechanism.name().len() + 1 + username.len());
    input.extend_from_slice(mechanism.name().as_bytes());
    input.push(0);
    input.extend_from_slice(username.as_bytes());
    let mut salt = hmac(ScramMechanism::Sha256, fake_salt_key(), &input)
        .unwrap_or_else(|_| random_bytes(SALT_LEN));
    salt.resize(SALT_LEN, 0);
    salt
}

/// A credential no password matches, shaped like one [`new_credential`]
/// makes.
fn fake_credential(mechanism: ScramMechanism, username: &str) -> ScramCredential {
    ScramCredential {
        salt: fake_salt(mechanism, username),
        stored_key: random_bytes(mechanism.hash_len()),
        server_key: random_bytes(mechanism.hash_len()),
        iterations: FAKE_ITERATIONS,
    }
}

/// Whether the server can run a SCRAM exchange with a stored credential
/// (Kafka refuses fewer iterations than the minimum).
fn usable_for_scram(mechanism: ScramMechanism, credential: &ScramCredential) -> bool {
    credential.iterations >= mechanism.min_iterations()
        && !credential.salt.is_empty()
        && credential.stored_key.len() == mechanism.hash_len()
        && credential.server_key.len() == mechanism.hash_len()
}

// ---------------------------------------------------------------------------
// Credentials.

/// SaltedPassword = Hi(password, salt, iterations), within Kafka's
/// iteration limits. What a client sends in AlterUserScramCredentials.
pub fn salted_password(
    mechanism: ScramMechanism,
    password: &[u8],
    salt: &[u8],
    iterations: u32,
) -> Result<Vec<u8>, ScramError> {
    mechanism.check_iterations(iterations)?;
    if salt.is_empty() {
        return Err(ScramError::UnacceptableCredential {
            mechanism: mechanism.name(),
            reason: "the salt must not be empty",
        });
    }
    Ok(hi(mechanism, password, salt, iterations))
}

/// A new credential for `password` with a random [`SALT_LEN`]-byte salt.
/// The password is used as its bytes (UTF-8 for a text password), without
/// SASLprep, as Kafka does.
pub fn new_credential(
    mechanism: ScramMechanism,
    password: &[u8],
    iterations: u32,
) -> Result<ScramCredential, ScramError> {
    mechanism.check_iterations(iterations)?;
    if password.is_empty() {
        return Err(ScramError::UnacceptableCredential {
            mechanism: mechanism.name(),
            reason: "the password must not be empty",
        });
    }
    let salt = random_bytes(SALT_LEN);
    let salted = salted_password(mechanism, password, &salt, iterations)?;
    credential_from_salted_password(mechanism, &salt, &salted, iterations)
}

/// The credential AlterUserScramCredentials' upsertion describes: the
/// client sends the salt and SaltedPassword, never the password.
pub fn credential_from_salted_password(
    mechanism: ScramMechanism,
    salt: &[u8],
    salted_password: &[u8],
    iterations: u32,
) -> Result<ScramCredential, ScramError> {
    mechanism.check_iterations(iterations)?;
    if salt.is_empty() {
        return Err(ScramError::UnacceptableCredential {
            mechanism: mechanism.name(),
            reason: "the salt must not be empty",
        });
    }
    if salted_password.len() != mechanism.hash_len() {
        return Err(ScramError::UnacceptableCredential {
            mechanism: mechanism.name(),
            reason: "the salted password is not one hash long",
        });
    }
    let Keys {
        stored_key,
        server_key,
        ..
    } = keys(mechanism, salted_password)?;
    Ok(ScramCredential {
        salt: salt.to_vec(),
        stored_key,
        server_key,
        iterations,
    })
}

/// Whether `password` matches `credential` (StoredKey compared in constant
/// time). A credential outside Kafka's iteration limits never matches (no
/// unbounded PBKDF2 on a login path).
pub fn verify_password(
    mechanism: ScramMechanism,
    credential: &ScramCredential,
    password: &[u8],
) -> bool {
    let Ok(salted) = salted_password(mechanism, password, &credential.salt, credential.iterations)
    else {
        return false;
    };
    let Ok(Keys { stored_key, .. }) = keys(mechanism, &salted) else {
        return false;
    };
    bool::from(
        stored_key
            .as_slice()
            .ct_eq(credential.stored_key.as_slice()),
    )
}

// ---------------------------------------------------------------------------
// Parsing helpers.

fn malformed(mechanism: &'static str, reason: &'static str) -> ScramError {
    ScramError::Malformed { mechanism, reason }
}

/// The bounded, UTF-8, NUL-free text of a SCRAM client message.
fn scram_text(mechanism: ScramMechanism, message: &[u8]) -> Result<&str, ScramError> {
    let name = mechanism.name();
    if message.len() > MAX_CLIENT_MESSAGE_LEN {
        return Err(malformed(name, "message too long"));
    }
    if message.is_empty() {
        return Err(malformed(name, "empty message"));
    }
    let text = std::str::from_utf8(message).map_err(|_| malformed(name, "not UTF-8"))?;
    if text.contains('\0') {
        return Err(malformed(name, "NUL character"));
    }
    Ok(text)
}

/// Decodes a `saslname` (RFC 5802: `=2C` is ',', `=3D` is '='; any other
/// '=' is an error).
fn decode_saslname(mechanism: &'static str, encoded: &str) -> Result<String, ScramError> {
    let mut out = String::with_capacity(encoded.len());
    let mut rest = encoded;
    while let Some(pos) = rest.find('=') {
        out.push_str(&rest[..pos]);
        let escape = rest.get(pos..pos + 3);
        match escape {
            Some("=2C") => out.push(','),
            Some("=3D") => out.push('='),
            _ => return Err(malformed(mechanism, "invalid escape in a SASL name")),
        }
        rest = &rest[pos + 3..];
    }
    out.push_str(rest);
    Ok(out)
}

/// `key=value` of an extension (Kafka's: alphabetic key, non-empty value).
fn parse_extension<'a>(
    mechanism: &'static str,
    attribute: &'a str,
) -> Result<(&'a str, &'a str), ScramError> {
    let (key, value) = attribute
        .split_once('=')
        .ok_or_else(|| malformed(mechanism, "extension without a value"))?;
    if key.is_empty() || !key.bytes().all(|b| b.is_ascii_alphabetic()) {
        return Err(malformed(mechanism, "invalid extension name"));
    }
    if value.is_empty() {
        return Err(malformed(mechanism, "empty extension value"));
    }
    Ok((key, value))
}

/// RFC 5802 `printable`: ASCII 0x21..=0x7E but ','.
fn is_printable(text: &str) -> bool {
    !text.is_empty() && text.bytes().all(|b| b.is_ascii_graphic() && b != b',')
}

// ---------------------------------------------------------------------------
// SCRAM server.

/// What [`ScramServer::step`] answers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// Send this server-first message; the client-final message follows.
    Continue(Vec<u8>),
    /// The client proved it knows the password: send this server-final
    /// message (`v=...`); the connection is authenticated as `username`.
    Done {
        server_final: Vec<u8>,
        username: String,
    },
}

/// The client-first message, parsed.
struct ClientFirst<'a> {
    /// `n,,` / `n,a=user,` / `y,,`, as sent (the client-final's `c=` is its
    /// base64).
    gs2_header: &'a str,
    /// `n=...,r=...[,ext...]`, as sent (part of the AuthMessage).
    bare: &'a str,
    username: String,
    nonce: &'a str,
}

fn parse_client_first(
    mechanism: ScramMechanism,
    message: &[u8],
) -> Result<ClientFirst<'_>, ScramError> {
    let name = mechanism.name();
    let text = scram_text(mechanism, message)?;

    // gs2-header = gs2-cbind-flag "," [ authzid ] ","
    let (cbind_flag, rest) = text
        .split_once(',')
        .ok_or_else(|| malformed(name, "missing GS2 header"))?;
    match cbind_flag {
        // "y": the client supports channel binding but thinks the server
        // does not, which is right: samsa offers no -PLUS mechanism.
        "n" | "y" => {}
        flag if flag.starts_with("p=") => {
            return Err(malformed(name, "channel binding is not supported"))
        }
        _ => return Err(malformed(name, "invalid GS2 channel binding flag")),
    }
    let (authzid, bare) = rest
        .split_once(',')
        .ok_or_else(|| malformed(name, "missing GS2 header"))?;
    let authzid = if authzid.is_empty() {
        None
    } else {
        let encoded = authzid
            .strip_prefix("a=")
            .ok_or_else(|| malformed(name, "invalid GS2 authorization id"))?;
        if encoded.is_empty() {
            return Err(malformed(name, "empty authorization id"));
        }
        Some(decode_saslname(name, encoded)?)
    };
    let gs2_header = &text[..text.len() - bare.len()];

    // client-first-message-bare = username "," nonce ["," extensions]
    let mut attributes = bare.split(',');
    let user_attribute = attributes
        .next()
        .ok_or_else(|| malformed(name, "missing user name"))?;
    if user_attribute.starts_with("m=") {
        return Err(malformed(name, "mandatory extensions are not supported"));
    }
    let encoded_user = user_attribute
        .strip_prefix("n=")
        .ok_or_else(|| malformed(name, "missing user name"))?;
    if encoded_user.is_empty() {
        return Err(malformed(name, "empty user name"));
    }
    let username = decode_saslname(name, encoded_user)?;
    let nonce = attributes
        .next()
        .and_then(|a| a.strip_prefix("r="))
        .ok_or_else(|| malformed(name, "missing client nonce"))?;
    if !is_printable(nonce) {
        return Err(malformed(name, "invalid client nonce"));
    }
    let mut token_auth = false;
    for attribute in attributes {
        let (key, value) = parse_extension(name, attribute)?;
        // Kafka: Boolean.parseBoolean(extensions.get("tokenauth")).
        if key == TOKEN_AUTH_EXTENSION && value.eq_ignore_ascii_case("true") {
            token_auth = true;
        }
        // Other extensions are ignored, as Kafka does.
    }

    if let Some(authzid) = authzid {
        if authzid != username {
            return Err(ScramError::AuthorizationIdMismatch { mechanism: name });
        }
    }
    if token_auth {
        return Err(ScramError::TokenAuthNotSupported { mechanism: name });
    }
    Ok(ClientFirst {
        gs2_header,
        bare,
        username,
        nonce,
    })
}

/// The exchange between the two client messages.
struct Exchange {
    username: String,
    gs2_header: String,
    client_first_bare: String,
    server_first: String,
    /// Client nonce + server nonce.
    nonce: String,
    credential: ScramCredential,
    /// The credential is a stand-in for a missing one: never succeed.
    fake: bool,
}

enum State {
    ClientFirst,
    ClientFinal(Box<Exchange>),
    Complete,
    Failed,
}

type Lookup = Box<dyn Fn(&str) -> Option<ScramCredential> + Send + Sync>;

/// The server side of one SCRAM exchange (one SaslHandshake's worth).
///
/// Feed it the client's messages with [`step`](ScramServer::step): the
/// client-first answers [`Step::Continue`] with the server-first, the
/// client-final answers [`Step::Done`] with the server-final. Any error
/// ends the exchange: every later step is [`ScramError::IllegalState`].
pub struct ScramServer {
    mechanism: ScramMechanism,
    lookup: Lookup,
    state: State,
    /// Tests fix the server's nonce suffix (RFC 7677's vector).
    #[cfg(test)]
    server_nonce: Option<String>,
}

impl ScramServer {
    /// An exchange of `mechanism`; `lookup` answers the user's stored
    /// credential of that mechanism, asked once, when the client-first
    /// message names the user.
    pub fn new(
        mechanism: ScramMechanism,
        lookup: impl Fn(&str) -> Option<ScramCredential> + Send + Sync + 'static,
    ) -> ScramServer {
        ScramServer {
            mechanism,
            lookup: Box::new(lookup),
            state: State::ClientFirst,
            #[cfg(test)]
            server_nonce: None,
        }
    }

    #[cfg(test)]
    fn with_server_nonce(mut self, nonce: &str) -> ScramServer {
        self.server_nonce = Some(nonce.to_owned());
        self
    }

    pub fn mechanism(&self) -> ScramMechanism {
        self.mechanism
    }

    /// Whether the exchange succeeded.
    pub fn is_complete(&self) -> bool {
        matches!(self.state, State::Complete)
    }

    /// Whether the exchange is over (succeeded or failed).
    pub fn is_finished(&self) -> bool {
        matches!(self.state, State::Complete | State::Failed)
    }

    /// Consumes the client's next message.
    pub fn step(&mut self, client_message: &[u8]) -> Result<Step, ScramError> {
        match std::mem::replace(&mut self.state, State::Failed) {
            State::ClientFirst => {
                let (exchange, server_first) = self.client_first(client_message)?;
                self.state = State::ClientFinal(Box::new(exchange));
                Ok(Step::Continue(server_first))
            }
            State::ClientFinal(exchange) => {
                let step = self.client_final(&exchange, client_message)?;
                self.state = State::Complete;
                Ok(step)
            }
            State::Complete => Err(ScramError::IllegalState {
                mechanism: self.mechanism.name(),
                reason: "the exchange is already complete",
            }),
            State::Failed => Err(ScramError::IllegalState {
                mechanism: self.mechanism.name(),
                reason: "the exchange already failed",
            }),
        }
    }

    fn new_server_nonce(&self) -> String {
        #[cfg(test)]
        if let Some(nonce) = &self.server_nonce {
            return nonce.clone();
        }
        rand::thread_rng()
            .sample_iter(&Alphanumeric)
            .take(SERVER_NONCE_LEN)
            .map(char::from)
            .collect()
    }

    fn client_first(&self, message: &[u8]) -> Result<(Exchange, Vec<u8>), ScramError> {
        let mechanism = self.mechanism;
        let first = parse_client_first(mechanism, message)?;
        let (credential, fake) = match (self.lookup)(&first.username) {
            Some(credential) if usable_for_scram(mechanism, &credential) => (credential, false),
            _ => (fake_credential(mechanism, &first.username), true),
        };
        let nonce = format!("{}{}", first.nonce, self.new_server_nonce());
        let server_first = format!(
            "r={nonce},s={},i={}",
            STANDARD.encode(&credential.salt),
            credential.iterations
        );
        let answer = server_first.clone().into_bytes();
        Ok((
            Exchange {
                username: first.username,
                gs2_header: first.gs2_header.to_owned(),
                client_first_bare: first.bare.to_owned(),
                server_first,
                nonce,
                credential,
                fake,
            },
            answer,
        ))
    }

    fn client_final(&self, exchange: &Exchange, message: &[u8]) -> Result<Step, ScramError> {
        let mechanism = self.mechanism;
        let name = mechanism.name();
        let text = scram_text(mechanism, message)?;

        // client-final-message = c=... "," r=... ["," extensions] "," p=...
        let (without_proof, proof_attribute) = text
            .rsplit_once(',')
            .ok_or_else(|| malformed(name, "missing proof"))?;
        let proof = proof_attribute
            .strip_prefix("p=")
            .ok_or_else(|| malformed(name, "missing proof"))?;
        let mut attributes = without_proof.split(',');
        let channel_binding = attributes
            .next()
            .and_then(|a| a.strip_prefix("c="))
            .ok_or_else(|| malformed(name, "missing channel binding"))?;
        let nonce = attributes
            .next()
            .and_then(|a| a.strip_prefix("r="))
            .ok_or_else(|| malformed(name, "missing nonce"))?;
        for attribute in attributes {
            parse_extension(name, attribute)?;
        }

        let channel_binding = BASE64_LENIENT
            .decode(channel_binding)
            .map_err(|_| malformed(name, "invalid base64 in the channel binding"))?;
        if channel_binding != exchange.gs2_header.as_bytes() {
            return Err(malformed(
                name,
                "channel binding does not match the GS2 header",
            ));
        }
        if nonce != exchange.nonce {
            return Err(malformed(name, "nonce does not match the server's"));
        }
        let proof = BASE64_LENIENT
            .decode(proof)
            .map_err(|_| malformed(name, "invalid base64 in the proof"))?;
        if proof.len() != mechanism.hash_len() {
            return Err(malformed(name, "proof of the wrong length"));
        }

        // AuthMessage = client-first-message-bare "," server-first-message
        //               "," client-final-message-without-proof
        let auth_message = [
            exchange.client_first_bare.as_bytes(),
            b",",
            exchange.server_first.as_bytes(),
            b",",
            without_proof.as_bytes(),
        ]
        .concat();
        let credential = &exchange.credential;
        let client_signature = hmac(mechanism, &credential.stored_key, &auth_message)?;
        let client_key: Vec<u8> = proof
            .iter()
            .zip(&client_signature)
            .map(|(p, s)| p ^ s)
            .collect();
        let matches = hash(mechanism, &client_key)
            .as_slice()
            .ct_eq(credential.stored_key.as_slice());
        // Computed for a fake credential too: same work either way.
        let server_signature = hmac(mechanism, &credential.server_key, &auth_message)?;
        if !bool::from(matches) || exchange.fake {
            return Err(ScramError::InvalidCredentials { mechanism: name });
        }
        Ok(Step::Done {
            server_final: format!("v={}", STANDARD.encode(server_signature)).into_bytes(),
            username: exchange.username.clone(),
        })
    }
}

impl fmt::Debug for ScramServer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = match self.state {
            State::ClientFirst => "awaiting client-first",
            State::ClientFinal(_) => "awaiting client-final",
            State::Complete => "complete",
            State::Failed => "failed",
        };
        f.debug_struct("ScramServer")
            .field("mechanism", &self.mechanism)
            .field("state", &state)
            .finish_non_exhaustive()
    }
}

// ---------------------------------------------------------------------------
// PLAIN.

/// SASL/PLAIN (RFC 4616 as Kafka's `PlainSaslServer` reads it):
/// `authzid NUL authcid NUL password`, the authzid empty or equal to the
/// authcid. The password is checked against the user's stored SCRAM
/// credentials, SCRAM-SHA-512 first then SCRAM-SHA-256 (`lookup` answers
/// the user's credential of a mechanism); a user without any fails like a
/// wrong password. Answers the authenticated user name.
pub fn plain_authenticate<F>(message: &[u8], lookup: F) -> Result<String, ScramError>
where
    F: Fn(ScramMechanism, &str) -> Option<ScramCredential>,
{
    if message.len() > MAX_CLIENT_MESSAGE_LEN {
        return Err(malformed(PLAIN, "message too long"));
    }
    let text = std::str::from_utf8(message).map_err(|_| malformed(PLAIN, "not UTF-8"))?;
    let mut tokens = text.split('\0');
    let (Some(authzid), Some(username), Some(password), None) =
        (tokens.next(), tokens.next(), tokens.next(), tokens.next())
    else {
        return Err(malformed(PLAIN, "expected 3 NUL-separated tokens"));
    };
    if username.is_empty() {
        return Err(malformed(PLAIN, "username not specified"));
    }
    if password.is_empty() {
        return Err(malformed(PLAIN, "password not specified"));
    }
    if !authzid.is_empty() && authzid != username {
        return Err(ScramError::AuthorizationIdMismatch { mechanism: PLAIN });
    }

    let mut found = false;
    for mechanism in [ScramMechanism::Sha512, ScramMechanism::Sha256] {
        if let Some(credential) = lookup(mechanism, username) {
            found = true;
            if verify_password(mechanism, &credential, password.as_bytes()) {
                return Ok(username.to_owned());
            }
        }
    }
    if !found {
        // The work a user with one credential costs, so that an unknown
        // user does not answer faster.
        let _ = hi(
            ScramMechanism::Sha512,
            password.as_bytes(),
            &fake_salt(ScramMechanism::Sha512, username),
            FAKE_ITERATIONS,
        );
    }
    Err(ScramError::InvalidCredentials { mechanism: PLAIN })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;
    use std::collections::HashMap;

    const RFC_SALT: &str = "W22ZaJ0SNY7soEsUEjb6gQ==";
    const RFC_CLIENT_NONCE: &str = "rOprNGfwEbeRWgbNEkqO";
    const RFC_SERVER_NONCE: &str = "%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0";

    fn rfc_credential(mechanism: ScramMechanism) -> ScramCredential {
        let salt = STANDARD.decode(RFC_SALT).unwrap();
        let salted = salted_password(mechanism, b"pencil", &salt, 4096).unwrap();
        credential_from_salted_password(mechanism, &salt, &salted, 4096).unwrap()
    }

    fn server_with(mechanism: ScramMechanism, users: &[(&str, ScramCredential)]) -> ScramServer {
        let users: HashMap<String, ScramCredential> = users
            .iter()
            .map(|(u, c)| ((*u).to_owned(), c.clone()))
            .collect();
        ScramServer::new(mechanism, move |user| users.get(user).cloned())
    }

    /// An RFC 5802 client, for round trips.
    struct Client {
        mechanism: ScramMechanism,
        gs2_header: String,
        bare: String,
        nonce: String,
    }

    impl Client {
        fn new(mechanism: ScramMechanism, user: &str) -> Client {
            let nonce: String = rand::thread_rng()
                .sample_iter(&Alphanumeric)
                .take(24)
                .map(char::from)
                .collect();
            let encoded = user.replace('=', "=3D").replace(',', "=2C");
            Client {
                mechanism,
                gs2_header: "n,,".to_owned(),
                bare: format!("n={encoded},r={nonce}"),
                nonce,
            }
        }

        fn first(&self) -> Vec<u8> {
            format!("{}{}", self.gs2_header, self.bare).into_bytes()
        }

        /// (client-final, expected server-final).
        fn finish(&self, server_first: &[u8], password: &[u8]) -> (Vec<u8>, Vec<u8>) {
            let server_first = std::str::from_utf8(server_first).unwrap();
            let mut parts = server_first.split(',');
            let nonce = parts.next().unwrap().strip_prefix("r=").unwrap();
            assert!(nonce.starts_with(&self.nonce));
            let salt = STANDARD
                .decode(parts.next().unwrap().strip_prefix("s=").unwrap())
                .unwrap();
            let iterations: u32 = parts
                .next()
                .unwrap()
                .strip_prefix("i=")
                .unwrap()
                .parse()
                .unwrap();
            let m = self.mechanism;
            let salted = hi(m, password, &salt, iterations);
            let client_key = hmac(m, &salted, b"Client Key").unwrap();
            let Keys {
                stored_key,
                server_key,
            } = keys(m, &salted).unwrap();
            assert_eq!(stored_key, hash(m, &client_key));
            let without_proof = format!(
                "c={},r={nonce}",
                STANDARD.encode(self.gs2_header.as_bytes())
            );
            let auth_message = format!("{},{server_first},{without_proof}", self.bare);
            let signature = hmac(m, &stored_key, auth_message.as_bytes()).unwrap();
            let proof: Vec<u8> = client_key
                .iter()
                .zip(&signature)
                .map(|(a, b)| a ^ b)
                .collect();
            let server_signature = hmac(m, &server_key, auth_message.as_bytes()).unwrap();
            (
                format!("{without_proof},p={}", STANDARD.encode(proof)).into_bytes(),
                format!("v={}", STANDARD.encode(server_signature)).into_bytes(),
            )
        }
    }

    fn invalid(mechanism: ScramMechanism) -> ScramError {
        ScramError::InvalidCredentials {
            mechanism: mechanism.name(),
        }
    }

    fn is_malformed(result: Result<Step, ScramError>) -> bool {
        matches!(result, Err(ScramError::Malformed { .. }))
    }

    fn rfc_vector(mechanism: ScramMechanism, proof: &str, verifier: &str) {
        let mut server = server_with(mechanism, &[("user", rfc_credential(mechanism))])
            .with_server_nonce(RFC_SERVER_NONCE);
        let first = server
            .step(format!("n,,n=user,r={RFC_CLIENT_NONCE}").as_bytes())
            .unwrap();
        let expected_first = format!("r={RFC_CLIENT_NONCE}{RFC_SERVER_NONCE},s={RFC_SALT},i=4096");
        assert_eq!(first, Step::Continue(expected_first.into_bytes()));
        let last = server
            .step(format!("c=biws,r={RFC_CLIENT_NONCE}{RFC_SERVER_NONCE},p={proof}").as_bytes())
            .unwrap();
        assert_eq!(
            last,
            Step::Done {
                server_final: format!("v={verifier}").into_bytes(),
                username: "user".to_owned(),
            }
        );
        assert!(server.is_complete());
        assert!(matches!(
            server.step(b"c=biws"),
            Err(ScramError::IllegalState { .. })
        ));
    }

    #[test]
    fn rfc7677_sha256_vector() {
        rfc_vector(
            ScramMechanism::Sha256,
            "dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ=",
            "6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4=",
        );
    }

    /// The same exchange with SHA-512, computed independently (Python's
    /// hashlib/hmac).
    #[test]
    fn sha512_vector() {
        let credential = rfc_credential(ScramMechanism::Sha512);
        assert_eq!(
            STANDARD.encode(&credential.stored_key),
            "6AAub3065EYRmyFpM2RNwqK+eGnrkYuEWbXn19LsEmBqzu8QaCXNc1FwpnX9NhH2hK/60dzj9DoO5DvVkOHbvg=="
        );
        assert_eq!(
            STANDARD.encode(&credential.server_key),
            "jZHbYjC1aHh0/hKbxyBuGFjDrgjgKTT1esA7awWiKcRZ0o/0b1yWEebBeSVkkCFewf91nLDfKF24mvD5nmE6rA=="
        );
        rfc_vector(
            ScramMechanism::Sha512,
            "gMGXRcevScNtxZ6/8lQYpGtnsNAc3mGcmNomv+xnoOMw+3R2xNJdMNnzMlTN8PPC6wdp6dybEmDYXYTxwnYPJQ==",
            "ZQnYEgWQMFmmsM8aQMF0nDDCy/AgCzkwk8CmMZYcMg0vSVlKDanekLtifDSeVGT4+5ZxXnJq199RVG2rR7N7Zw==",
        );
    }

    #[test]
    fn round_trips() {
        for mechanism in ScramMechanism::ALL {
            for user in ["alice", "we,ird=name", "ünïcödé"] {
                let credential = new_credential(mechanism, b"s3cret", 8192).unwrap();
                assert_eq!(credential.salt.len(), SALT_LEN);
                assert_eq!(credential.iterations, 8192);
                let mut server = server_with(mechanism, &[(user, credential)]);
                let client = Client::new(mechanism, user);
                let Step::Continue(server_first) = server.step(&client.first()).unwrap() else {
                    panic!("expected server-first");
                };
                let (client_final, expected) = client.finish(&server_first, b"s3cret");
                assert!(!server.is_finished());
                assert_eq!(
                    server.step(&client_final).unwrap(),
                    Step::Done {
                        server_final: expected,
                        username: user.to_owned(),
                    }
                );
                assert!(server.is_complete());
            }
        }
    }

    #[test]
    fn server_nonce_extends_client_nonce() {
        let mut server = server_with(
            ScramMechanism::Sha256,
            &[("user", rfc_credential(ScramMechanism::Sha256))],
        );
        let Step::Continue(first) = server.step(b"n,,n=user,r=abc").unwrap() else {
            panic!("expected server-first");
        };
        let first = String::from_utf8(first).unwrap();
        let nonce = first
            .split(',')
            .next()
            .unwrap()
            .strip_prefix("r=abc")
            .unwrap();
        assert_eq!(nonce.len(), SERVER_NONCE_LEN);
        assert!(is_printable(nonce));
    }

    #[test]
    fn authzid_and_cbind_flag_y() {
        let m = ScramMechanism::Sha256;
        let mut server = server_with(m, &[("user", rfc_credential(m))]);
        assert!(server.step(b"n,a=user,n=user,r=abc").is_ok());
        let mut server = server_with(m, &[("user", rfc_credential(m))]);
        assert!(server.step(b"y,,n=user,r=abc").is_ok());
        let mut server = server_with(m, &[("user", rfc_credential(m))]);
        assert_eq!(
            server.step(b"n,a=admin,n=user,r=abc"),
            Err(ScramError::AuthorizationIdMismatch {
                mechanism: "SCRAM-SHA-256"
            })
        );
        assert!(server.is_finished());
    }

    #[test]
    fn authzid_header_is_bound_by_channel_binding() {
        let m = ScramMechanism::Sha256;
        let mut server = server_with(m, &[("user", rfc_credential(m))]);
        let mut client = Client::new(m, "user");
        client.gs2_header = "n,a=user,".to_owned();
        let Step::Continue(first) = server.step(&client.first()).unwrap() else {
            panic!("expected server-first");
        };
        let (last, expected) = client.finish(&first, b"pencil");
        assert!(std::str::from_utf8(&last)
            .unwrap()
            .starts_with("c=bixhPXVzZXIs,"));
        assert_eq!(
            server.step(&last).unwrap(),
            Step::Done {
                server_final: expected,
                username: "user".to_owned()
            }
        );
    }

    #[test]
    fn extensions_ignored_but_tokenauth_refused() {
        let m = ScramMechanism::Sha512;
        let credential = rfc_credential(m);
        let mut server = server_with(m, &[("user", credential.clone())]);
        assert!(server.step(b"n,,n=user,r=abc,foo=bar").is_ok());
        for message in [
            &b"n,,n=user,r=abc,tokenauth=true"[..],
            b"n,,n=user,r=abc,foo=1,tokenauth=TRUE",
        ] {
            let mut server = server_with(m, &[("user", credential.clone())]);
            assert_eq!(
                server.step(message),
                Err(ScramError::TokenAuthNotSupported {
                    mechanism: "SCRAM-SHA-512"
                })
            );
        }
        let mut server = server_with(m, &[("user", credential)]);
        assert!(server.step(b"n,,n=user,r=abc,tokenauth=false").is_ok());
    }

    #[test]
    fn wrong_password() {
        for m in ScramMechanism::ALL {
            let mut server = server_with(m, &[("user", rfc_credential(m))]);
            let client = Client::new(m, "user");
            let Step::Continue(first) = server.step(&client.first()).unwrap() else {
                panic!("expected server-first");
            };
            let (last, _) = client.finish(&first, b"pencil2");
            let err = server.step(&last).unwrap_err();
            assert_eq!(err, invalid(m));
            assert_eq!(
                err.client_message(),
                format!(
                    "Authentication failed during authentication due to invalid credentials with SASL mechanism {}",
                    m.name()
                )
            );
            assert!(!err.is_protocol_violation());
            assert!(matches!(
                server.step(&last),
                Err(ScramError::IllegalState { .. })
            ));
        }
    }

    #[test]
    fn unknown_user_is_indistinguishable() {
        for m in ScramMechanism::ALL {
            let known = new_credential(m, b"pencil", 4096).unwrap();
            let users = [("user", known)];

            let mut first_answers = Vec::new();
            for _ in 0..2 {
                let mut server = server_with(m, &users);
                let client = Client::new(m, "ghost");
                let Step::Continue(first) = server.step(&client.first()).unwrap() else {
                    panic!("an unknown user must get a server-first");
                };
                let text = String::from_utf8(first.clone()).unwrap();
                let salt_and_iterations = text.split_once(',').unwrap().1.to_owned();
                first_answers.push(salt_and_iterations);
                let (last, _) = client.finish(&first, b"pencil");
                assert_eq!(server.step(&last).unwrap_err(), invalid(m));
            }
            // Same salt on every attempt, like a real user; Kafka's
            // default iterations; a salt as long as a real one.
            assert_eq!(first_answers[0], first_answers[1]);
            assert!(first_answers[0].ends_with(",i=4096"));
            let salt = first_answers[0]
                .strip_prefix("s=")
                .unwrap()
                .split(',')
                .next()
                .unwrap();
            assert_eq!(STANDARD.decode(salt).unwrap().len(), SALT_LEN);

            // Another user gets another salt.
            let mut server = server_with(m, &users);
            let Step::Continue(other) = server.step(b"n,,n=ghost2,r=abc").unwrap() else {
                panic!("expected server-first");
            };
            let other = String::from_utf8(other).unwrap();
            assert_ne!(other.split_once(',').unwrap().1, first_answers[0]);

            // Wrong password of a known user: the same error.
            let mut server = server_with(m, &users);
            let client = Client::new(m, "user");
            let Step::Continue(first) = server.step(&client.first()).unwrap() else {
                panic!("expected server-first");
            };
            let (last, _) = client.finish(&first, b"wrong");
            assert_eq!(server.step(&last).unwrap_err(), invalid(m));
        }
    }

    #[test]
    fn unusable_credential_is_like_unknown_user() {
        let m = ScramMechanism::Sha256;
        let salt = b"salt".to_vec();
        let salted = hi(m, b"pencil", &salt, 1000);
        let Keys {
            stored_key,
            server_key,
            ..
        } = keys(m, &salted).unwrap();
        let weak = ScramCredential {
            salt,
            stored_key,
            server_key,
            iterations: 1000,
        };
        let mut server = server_with(m, &[("user", weak)]);
        let client = Client::new(m, "user");
        let Step::Continue(first) = server.step(&client.first()).unwrap() else {
            panic!("expected server-first");
        };
        assert!(std::str::from_utf8(&first).unwrap().ends_with(",i=4096"));
        let (last, _) = client.finish(&first, b"pencil");
        assert_eq!(server.step(&last).unwrap_err(), invalid(m));
    }

    #[test]
    fn malformed_client_first() {
        let m = ScramMechanism::Sha256;
        let oversized = format!("n,,n=user,r={}", "a".repeat(MAX_CLIENT_MESSAGE_LEN));
        let cases: Vec<&[u8]> = vec![
            b"",
            b"garbage",
            b"\xff\xfe\x00",
            b"n,,n=us\xc3er,r=abc",
            b"n,,n=user\0,r=abc",
            b"n,,",
            b"n,,n=user",
            b"n,,n=user,",
            b"n,,n=,r=abc",
            b"n,,r=abc,n=user",
            b"n,,n=user,r=",
            b"n,,n=user,r=a b",
            b"n,,n=user,r=abc,",
            b"n,,n=user,r=abc,=x",
            b"n,,n=user,r=abc,k=",
            b"n,,n=user,r=abc,k1=x",
            b"n,,n=user,r=abc,novalue",
            b"n,,m=ext,n=user,r=abc",
            b"n,,n=us=er,r=abc",
            b"n,,n=us=2c,r=abc",
            b"n,,n=user=,r=abc",
            b"n,,n=user=3,r=abc",
            b"p=tls-unique,,n=user,r=abc",
            b"x,,n=user,r=abc",
            b",,n=user,r=abc",
            b"n,a=,n=user,r=abc",
            b"n,b=user,n=user,r=abc",
            b"n,n=user,r=abc",
            oversized.as_bytes(),
        ];
        for case in cases {
            let mut server = server_with(m, &[("user", rfc_credential(m))]);
            let result = server.step(case);
            assert!(
                is_malformed(result.clone()),
                "{:?}: {result:?}",
                String::from_utf8_lossy(case)
            );
            assert!(result.unwrap_err().is_protocol_violation());
            assert!(server.is_finished());
        }
    }

    #[test]
    fn malformed_client_final() {
        let m = ScramMechanism::Sha256;
        let nonce = format!("{RFC_CLIENT_NONCE}{RFC_SERVER_NONCE}");
        let proof = "dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ=";
        let good = format!("c=biws,r={nonce},p={proof}");
        let oversized = format!("c=biws,r={nonce},x={},p={proof}", "a".repeat(5000));
        let cases: Vec<Vec<u8>> = vec![
            b"".to_vec(),
            b"garbage".to_vec(),
            b"\xff\xfe".to_vec(),
            format!("c=biws,r={nonce}").into_bytes(),
            format!("c=biws,p={proof}").into_bytes(),
            format!("r={nonce},p={proof}").into_bytes(),
            format!("r={nonce},c=biws,p={proof}").into_bytes(),
            format!("c=biws,r={nonce},p={proof},x=y").into_bytes(),
            format!("c=biws,r={nonce}x,p={proof}").into_bytes(),
            format!("c=biws,r={RFC_CLIENT_NONCE},p={proof}").into_bytes(),
            format!("c=eSws,r={nonce},p={proof}").into_bytes(),
            format!("c=cD10bHMtdW5pcXVlLCw=,r={nonce},p={proof}").into_bytes(),
            format!("c=b!ws,r={nonce},p={proof}").into_bytes(),
            format!("c=biws,r={nonce},p=not*base64").into_bytes(),
            format!("c=biws,r={nonce},p=").into_bytes(),
            format!("c=biws,r={nonce},p=AAAA").into_bytes(),
            format!("c=biws,r={nonce},1=x,p={proof}").into_bytes(),
            format!("c=biws,r={nonce},p={proof}\0").into_bytes(),
            oversized.into_bytes(),
        ];
        for case in cases {
            let mut server =
                server_with(m, &[("user", rfc_credential(m))]).with_server_nonce(RFC_SERVER_NONCE);
            server
                .step(format!("n,,n=user,r={RFC_CLIENT_NONCE}").as_bytes())
                .unwrap();
            let result = server.step(&case);
            assert!(
                is_malformed(result.clone()),
                "{:?}: {result:?}",
                String::from_utf8_lossy(&case)
            );
            assert!(server.is_finished());
        }
        // Extensions before the proof are allowed, but they are part of
        // the AuthMessage: the RFC proof no longer verifies.
        let mut server =
            server_with(m, &[("user", rfc_credential(m))]).with_server_nonce(RFC_SERVER_NONCE);
        server
            .step(format!("n,,n=user,r={RFC_CLIENT_NONCE}").as_bytes())
            .unwrap();
        assert_eq!(
            server.step(format!("c=biws,r={nonce},ext=1,p={proof}").as_bytes()),
            Err(invalid(m))
        );
        // The unpadded proof is accepted (as Java's decoder does).
        let mut server =
            server_with(m, &[("user", rfc_credential(m))]).with_server_nonce(RFC_SERVER_NONCE);
        server
            .step(format!("n,,n=user,r={RFC_CLIENT_NONCE}").as_bytes())
            .unwrap();
        assert!(server.step(good.trim_end_matches('=').as_bytes()).is_ok());
    }

    /// Truncations and byte flips of valid messages: errors, never panics.
    #[test]
    fn mutations_never_panic() {
        let m = ScramMechanism::Sha256;
        let first = format!("n,a=user,n=user,r={RFC_CLIENT_NONCE},tokenauth=false");
        let last = format!(
            "c=biws,r={RFC_CLIENT_NONCE}{RFC_SERVER_NONCE},p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ="
        );
        let mutate = |message: &str| -> Vec<Vec<u8>> {
            let bytes = message.as_bytes();
            let mut out = Vec::new();
            for i in 0..=bytes.len() {
                out.push(bytes[..i].to_vec());
                if i < bytes.len() {
                    for b in [b',', b'=', b'\0', 0xff, 0xc3, b'a'] {
                        let mut flipped = bytes.to_vec();
                        flipped[i] = b;
                        out.push(flipped);
                    }
                }
            }
            out
        };
        for case in mutate(&first) {
            let mut server = server_with(m, &[("user", rfc_credential(m))]);
            let _ = server.step(&case);
            let _ = server.step(last.as_bytes());
        }
        for case in mutate(&last) {
            let mut server =
                server_with(m, &[("user", rfc_credential(m))]).with_server_nonce(RFC_SERVER_NONCE);
            server.step(first.as_bytes()).unwrap();
            let _ = server.step(&case);
        }
        for case in mutate("user\0user\0pencil") {
            let _ = plain_authenticate(&case, |_, _| Some(rfc_credential(m)));
        }
    }

    fn plain_lookup(
        users: Vec<(&'static str, ScramMechanism, ScramCredential)>,
    ) -> impl Fn(ScramMechanism, &str) -> Option<ScramCredential> {
        move |mechanism, user| {
            users
                .iter()
                .find(|(u, m, _)| *u == user && *m == mechanism)
                .map(|(_, _, c)| c.clone())
        }
    }

    #[test]
    fn plain() {
        let lookup = plain_lookup(vec![
            (
                "both",
                ScramMechanism::Sha512,
                rfc_credential(ScramMechanism::Sha512),
            ),
            (
                "both",
                ScramMechanism::Sha256,
                new_credential(ScramMechanism::Sha256, b"other", 4096).unwrap(),
            ),
            (
                "only256",
                ScramMechanism::Sha256,
                rfc_credential(ScramMechanism::Sha256),
            ),
            (
                "only512",
                ScramMechanism::Sha512,
                rfc_credential(ScramMechanism::Sha512),
            ),
        ]);
        for user in ["both", "only256", "only512"] {
            assert_eq!(
                plain_authenticate(format!("\0{user}\0pencil").as_bytes(), &lookup).unwrap(),
                user
            );
            assert_eq!(
                plain_authenticate(format!("{user}\0{user}\0pencil").as_bytes(), &lookup).unwrap(),
                user
            );
        }
        // Either stored credential's password works.
        assert_eq!(
            plain_authenticate(b"\0both\0other", &lookup).unwrap(),
            "both"
        );
        let invalid = ScramError::InvalidCredentials { mechanism: "PLAIN" };
        assert_eq!(
            plain_authenticate(b"\0only256\0pencil2", &lookup),
            Err(invalid.clone())
        );
        assert_eq!(
            plain_authenticate(b"\0ghost\0pencil", &lookup),
            Err(invalid.clone())
        );
        assert_eq!(
            invalid.to_string(),
            "Authentication failed during authentication due to invalid credentials with SASL mechanism PLAIN"
        );
        assert_eq!(
            plain_authenticate(b"admin\0only256\0pencil", &lookup),
            Err(ScramError::AuthorizationIdMismatch { mechanism: "PLAIN" })
        );
        let oversized = format!("\0only256\0{}", "p".repeat(MAX_CLIENT_MESSAGE_LEN));
        let malformed_cases: Vec<&[u8]> = vec![
            b"",
            b"only256\0pencil",
            b"\0only256\0pencil\0",
            b"\0\0pencil",
            b"\0only256\0",
            b"\0only\xff256\0pencil",
            oversized.as_bytes(),
        ];
        for case in malformed_cases {
            let result = plain_authenticate(case, &lookup);
            assert!(
                matches!(result, Err(ScramError::Malformed { .. })),
                "{:?}: {result:?}",
                String::from_utf8_lossy(case)
            );
        }
    }

    #[test]
    fn plain_refuses_unbounded_iterations() {
        let m = ScramMechanism::Sha256;
        let mut credential = rfc_credential(m);
        credential.iterations = u32::MAX;
        let lookup = plain_lookup(vec![("user", m, credential)]);
        assert_eq!(
            plain_authenticate(b"\0user\0pencil", lookup),
            Err(ScramError::InvalidCredentials { mechanism: "PLAIN" })
        );
    }

    #[test]
    fn credential_from_salted_password_matches_new_credential() {
        for m in ScramMechanism::ALL {
            let credential = new_credential(m, b"hunter2", 4096).unwrap();
            let salted = salted_password(m, b"hunter2", &credential.salt, 4096).unwrap();
            assert_eq!(salted.len(), m.hash_len());
            assert_eq!(
                credential_from_salted_password(m, &credential.salt, &salted, 4096).unwrap(),
                credential
            );
            assert!(verify_password(m, &credential, b"hunter2"));
            assert!(!verify_password(m, &credential, b"hunter3"));
            // Two credentials of one password: different salts.
            assert_ne!(
                new_credential(m, b"hunter2", 4096).unwrap().salt,
                credential.salt
            );
        }
        let m = ScramMechanism::Sha512;
        assert!(matches!(
            credential_from_salted_password(m, b"salt", &[0; 32], 4096),
            Err(ScramError::UnacceptableCredential { .. })
        ));
        assert!(matches!(
            credential_from_salted_password(m, b"", &[0; 64], 4096),
            Err(ScramError::UnacceptableCredential { .. })
        ));
        assert!(matches!(
            new_credential(m, b"", 4096),
            Err(ScramError::UnacceptableCredential { .. })
        ));
    }

    #[test]
    fn iteration_limits() {
        for m in ScramMechanism::ALL {
            assert_eq!(
                new_credential(m, b"pw", 4095),
                Err(ScramError::TooFewIterations {
                    mechanism: m.name(),
                    iterations: 4095,
                    min: 4096
                })
            );
            assert_eq!(
                new_credential(m, b"pw", 16385),
                Err(ScramError::TooManyIterations {
                    mechanism: m.name(),
                    iterations: 16385,
                    max: 16384
                })
            );
            assert!(new_credential(m, b"pw", 4096).is_ok());
            assert!(new_credential(m, b"pw", 16384).is_ok());
            let salted = vec![7; m.hash_len()];
            assert!(credential_from_salted_password(m, b"s", &salted, 4095).is_err());
            assert!(credential_from_salted_password(m, b"s", &salted, 16385).is_err());
            assert!(credential_from_salted_password(m, b"s", &salted, 0).is_err());
            assert!(credential_from_salted_password(m, b"s", &salted, 16384).is_ok());
            assert!(salted_password(m, b"pw", b"s", 4095).is_err());
            assert!(new_credential(m, b"pw", 1)
                .unwrap_err()
                .to_string()
                .starts_with("Too few iterations"));
        }
    }

    #[test]
    fn mechanism_names_and_codes() {
        assert_eq!(
            ScramMechanism::from_name("SCRAM-SHA-256"),
            Some(ScramMechanism::Sha256)
        );
        assert_eq!(
            ScramMechanism::from_name("SCRAM-SHA-512"),
            Some(ScramMechanism::Sha512)
        );
        assert_eq!(ScramMechanism::from_name("scram-sha-256"), None);
        assert_eq!(ScramMechanism::from_name("PLAIN"), None);
        for m in ScramMechanism::ALL {
            assert_eq!(ScramMechanism::from_name(m.name()), Some(m));
            assert_eq!(ScramMechanism::from_type_code(m.type_code()), Some(m));
            assert_eq!(m.to_string(), m.name());
        }
        assert_eq!(ScramMechanism::Sha256.type_code(), 1);
        assert_eq!(ScramMechanism::Sha512.type_code(), 2);
        assert_eq!(ScramMechanism::from_type_code(0), None);
        assert_eq!(ScramMechanism::from_type_code(3), None);
        assert_eq!(ScramMechanism::Sha256.min_iterations(), 4096);
        assert_eq!(ScramMechanism::Sha512.max_iterations(), 16384);
    }

    #[test]
    fn errors_hold_no_secret() {
        let m = ScramMechanism::Sha256;
        let mut errors = Vec::new();
        let mut server =
            server_with(m, &[("user", rfc_credential(m))]).with_server_nonce(RFC_SERVER_NONCE);
        server
            .step(format!("n,,n=user,r={RFC_CLIENT_NONCE}").as_bytes())
            .unwrap();
        let proof = "dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ=";
        errors.push(
            server
                .step(format!("c=biws,r=wrong,p={proof}").as_bytes())
                .unwrap_err(),
        );
        errors.push(
            plain_authenticate(b"\0zelda\0pencil-secret", |_, _| Some(rfc_credential(m)))
                .unwrap_err(),
        );
        errors.push(plain_authenticate(b"x\0zelda\0pencil-secret", |_, _| None).unwrap_err());
        for error in errors {
            for text in [
                error.to_string(),
                error.client_message(),
                format!("{error:?}"),
            ] {
                assert!(!text.contains("pencil"), "{text}");
                assert!(!text.contains(proof), "{text}");
                assert!(!text.contains("zelda"), "{text}");
            }
        }
        assert_eq!(
            format!("{server:?}"),
            "ScramServer { mechanism: Sha256, state: \"failed\", .. }"
        );
    }
}
