//! Who a connection is and what it may do: the principal a connection
//! authenticated as (TLS client certificate, SASL), the SASL mechanisms
//! (`scram`), Kafka's authorizer over ACLs (`acl`), and the users and ACLs
//! a configuration declares (`declared`).
//!
//! A principal is Kafka's `KafkaPrincipal`: a type and a name, written
//! `User:alice`; a connection that did not authenticate is
//! `User:ANONYMOUS`, as in Kafka.

pub mod access;
pub mod acl;
pub mod declared;
pub mod sasl;
pub mod scram;
pub mod tls;

use std::fmt;

/// Kafka's `KafkaPrincipal` (`User:alice`).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Principal {
    pub principal_type: String,
    pub name: String,
}

impl Principal {
    /// `User:<name>`.
    pub fn user(name: impl Into<String>) -> Principal {
        Principal {
            principal_type: "User".to_owned(),
            name: name.into(),
        }
    }

    /// Kafka's principal of a connection that did not authenticate.
    pub fn anonymous() -> Principal {
        Principal::user("ANONYMOUS")
    }

    /// Parses `Type:name` (the name may contain ':'); `None` without a type.
    pub fn parse(text: &str) -> Option<Principal> {
        let (principal_type, name) = text.split_once(':')?;
        (!principal_type.is_empty()).then(|| Principal {
            principal_type: principal_type.to_owned(),
            name: name.to_owned(),
        })
    }
}

impl fmt::Display for Principal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.principal_type, self.name)
    }
}
