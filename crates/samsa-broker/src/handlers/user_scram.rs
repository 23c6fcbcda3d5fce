//! DescribeUserScramCredentials (50) and AlterUserScramCredentials (51):
//! the users SASL/SCRAM (and PLAIN) check passwords against. A credential
//! is stored salted (`samsa_controller::records::ScramCredential`), never
//! the password: the client sends the salt and the salted password, as
//! Kafka's admin clients do (`security::scram` derives the keys).
//!
//! Kafka's answers, kept here: an unknown mechanism is
//! UNSUPPORTED_SASL_MECHANISM; too few or too many iterations, an empty
//! user name, salt or salted password UNACCEPTABLE_CREDENTIAL; a user named
//! twice in one request DUPLICATE_RESOURCE (every change of that user is
//! refused); removing or describing a credential that does not exist
//! RESOURCE_NOT_FOUND. The changes of users that pass are applied in one
//! metadata batch.

use std::collections::BTreeMap;

use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::alter_user_scram_credentials_response::AlterUserScramCredentialsResult;
use kafka_protocol::messages::describe_user_scram_credentials_response::{
    CredentialInfo, DescribeUserScramCredentialsResult,
};
use kafka_protocol::messages::{
    AlterUserScramCredentialsRequest, AlterUserScramCredentialsResponse,
    DescribeUserScramCredentialsRequest, DescribeUserScramCredentialsResponse,
};
use kafka_protocol::protocol::StrBytes;

use super::str_bytes;
use crate::error::metadata_error_code;
use crate::metadata::MetadataRecord;
use crate::security::scram::{credential_from_salted_password, ScramMechanism};
use crate::Broker;

type Refusal = (ResponseError, String);

/// One upsertion as requested: mechanism code, iterations, salt, salted
/// password.
type Upsertion<'a> = (i8, i32, &'a [u8], &'a [u8]);

pub fn describe(
    broker: &Broker,
    request: DescribeUserScramCredentialsRequest,
) -> DescribeUserScramCredentialsResponse {
    let view = broker.metadata.image();
    let credentials = &view.scram_credentials;
    let users: Vec<String> = match &request.users {
        None => credentials.keys().cloned().collect(),
        Some(users) => users.iter().map(|u| u.name.to_string()).collect(),
    };
    let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
    for user in &users {
        *counts.entry(user.as_str()).or_default() += 1;
    }
    let results = users
        .iter()
        .map(|user| {
            let result = DescribeUserScramCredentialsResult::default()
                .with_user(StrBytes::from_string(user.clone()));
            if counts.get(user.as_str()).copied().unwrap_or(0) > 1 {
                return result
                    .with_error_code(ResponseError::DuplicateResource.code())
                    .with_error_message(Some(str_bytes(format!(
                        "Cannot describe SCRAM credentials for the same user twice in a single request: {user}"
                    ))));
            }
            match credentials.get(user) {
                Some(by_mechanism) => result.with_credential_infos(
                    by_mechanism
                        .iter()
                        .filter_map(|(name, credential)| {
                            Some(
                                CredentialInfo::default()
                                    .with_mechanism(ScramMechanism::from_name(name)?.type_code())
                                    .with_iterations(
                                        i32::try_from(credential.iterations).unwrap_or(i32::MAX),
                                    ),
                            )
                        })
                        .collect(),
                ),
                None => result
                    .with_error_code(ResponseError::ResourceNotFound.code())
                    .with_error_message(Some(str_bytes(format!(
                        "Attempt to describe a user credential that does not exist: {user}"
                    )))),
            }
        })
        .collect();
    DescribeUserScramCredentialsResponse::default().with_results(results)
}

/// One user's requested changes, checked: the records to write.
fn check_user(
    broker: &Broker,
    user: &str,
    deletions: &[i8],
    upsertions: &[Upsertion<'_>],
) -> Result<Vec<MetadataRecord>, Refusal> {
    if user.is_empty() {
        return Err((
            ResponseError::UnacceptableCredential,
            "Username must not be empty".into(),
        ));
    }
    let view = broker.metadata.image();
    let mechanism_of = |code: i8| {
        ScramMechanism::from_type_code(code).ok_or_else(|| {
            (
                ResponseError::UnsupportedSaslMechanism,
                format!("Unknown SCRAM mechanism {code}"),
            )
        })
    };
    let mut records = Vec::new();
    for &code in deletions {
        let mechanism = mechanism_of(code)?;
        let exists = view
            .scram_credentials
            .get(user)
            .is_some_and(|m| m.contains_key(mechanism.name()));
        if !exists {
            return Err((
                ResponseError::ResourceNotFound,
                format!(
                    "Attempt to delete a user credential that does not exist: {user} {}",
                    mechanism.name()
                ),
            ));
        }
        records.push(MetadataRecord::ScramCredentialChanged {
            user: user.to_owned(),
            mechanism: mechanism.name().to_owned(),
            credential: None,
        });
    }
    for &(code, iterations, salt, salted_password) in upsertions {
        let mechanism = mechanism_of(code)?;
        let iterations = u32::try_from(iterations).map_err(|_| {
            (
                ResponseError::UnacceptableCredential,
                format!("Too few iterations: {iterations}"),
            )
        })?;
        let credential =
            credential_from_salted_password(mechanism, salt, salted_password, iterations)
                .map_err(|e| (ResponseError::UnacceptableCredential, e.to_string()))?;
        records.push(MetadataRecord::ScramCredentialChanged {
            user: user.to_owned(),
            mechanism: mechanism.name().to_owned(),
            credential: Some(credential),
        });
    }
    Ok(records)
}

/// Every user of `request` refused with `error` (the caller may not alter
/// the cluster).
pub fn refuse_all(
    request: &AlterUserScramCredentialsRequest,
    error: ResponseError,
) -> AlterUserScramCredentialsResponse {
    let mut users: Vec<String> = Vec::new();
    let named = request
        .deletions
        .iter()
        .map(|d| d.name.to_string())
        .chain(request.upsertions.iter().map(|u| u.name.to_string()));
    for user in named {
        if !users.contains(&user) {
            users.push(user);
        }
    }
    let results = users
        .into_iter()
        .map(|user| {
            AlterUserScramCredentialsResult::default()
                .with_user(StrBytes::from_string(user))
                .with_error_code(error.code())
                .with_error_message(Some(str_bytes(error.to_string())))
        })
        .collect();
    AlterUserScramCredentialsResponse::default().with_results(results)
}

pub async fn alter(
    broker: &Broker,
    request: AlterUserScramCredentialsRequest,
) -> AlterUserScramCredentialsResponse {
    // Every user's changes, in request order of first appearance.
    let mut users: Vec<String> = Vec::new();
    let mut deletions: BTreeMap<String, Vec<i8>> = BTreeMap::new();
    let mut upsertions: BTreeMap<String, Vec<Upsertion<'_>>> = BTreeMap::new();
    let mut seen: BTreeMap<(String, i8), usize> = BTreeMap::new();
    for d in &request.deletions {
        let user = d.name.to_string();
        *seen.entry((user.clone(), d.mechanism)).or_default() += 1;
        deletions.entry(user.clone()).or_default().push(d.mechanism);
        if !users.contains(&user) {
            users.push(user);
        }
    }
    for u in &request.upsertions {
        let user = u.name.to_string();
        *seen.entry((user.clone(), u.mechanism)).or_default() += 1;
        upsertions.entry(user.clone()).or_default().push((
            u.mechanism,
            u.iterations,
            &u.salt,
            &u.salted_password,
        ));
        if !users.contains(&user) {
            users.push(user);
        }
    }
    let mut outcomes: Vec<(String, Result<Vec<MetadataRecord>, Refusal>)> = users
        .iter()
        .map(|user| {
            let duplicated = seen.iter().any(|((u, _), count)| u == user && *count > 1);
            let outcome = if duplicated {
                Err((
                    ResponseError::DuplicateResource,
                    format!(
                        "A user credential cannot be altered twice in the same request: {user}"
                    ),
                ))
            } else {
                check_user(
                    broker,
                    user,
                    deletions.get(user).map_or(&[][..], Vec::as_slice),
                    upsertions.get(user).map_or(&[][..], Vec::as_slice),
                )
            };
            (user.clone(), outcome)
        })
        .collect();
    let records: Vec<MetadataRecord> = outcomes
        .iter()
        .filter_map(|(_, o)| o.as_ref().ok())
        .flatten()
        .cloned()
        .collect();
    if !records.is_empty() {
        if let Err(e) = broker.alter_security(records).await {
            let refusal = (metadata_error_code(&e), e.to_string());
            for (_, outcome) in &mut outcomes {
                if outcome.is_ok() {
                    *outcome = Err(refusal.clone());
                }
            }
        }
    }
    let results = outcomes
        .into_iter()
        .map(|(user, outcome)| {
            let result =
                AlterUserScramCredentialsResult::default().with_user(StrBytes::from_string(user));
            match outcome {
                Ok(_) => result.with_error_message(None),
                Err((code, message)) => result
                    .with_error_code(code.code())
                    .with_error_message(Some(str_bytes(message))),
            }
        })
        .collect();
    AlterUserScramCredentialsResponse::default().with_results(results)
}
