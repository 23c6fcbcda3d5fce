//! Users and ACLs declared in the configuration (`scram_users_dir`,
//! `[[acls]]`): what a deployment wants to exist from the first start,
//! before any admin has connected — the Helm chart's users from a
//! Kubernetes Secret and ACLs from its values. Kafka's nearest equivalent
//! is `kafka-storage format --add-scram`.
//!
//! Once the broker serves (a cluster node: once it is unfenced, so its
//! image holds every earlier security record), it compares the declaration
//! with the metadata and writes what is missing or different, through the
//! same path as AlterUserScramCredentials and CreateAcls
//! ([`Broker::alter_security`]), retrying while the controller cannot take
//! it. It never deletes: users and ACLs made with the admin APIs or
//! `samsa user` / `samsa acl` stay, and so does one taken out of the
//! declaration, until it is removed with those.
//!
//! Brokers doing this at once converge: a user's credential is written
//! only when the declared password does not verify against the stored one
//! (so once one broker's write lands the others find nothing to do, and a
//! restart rewrites nothing), and an ACL only when it is absent.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tracing::{info, warn};

use crate::config::{BrokerConfig, DeclaredAcl};
use crate::metadata::{MetadataRecord, MetadataView};
use crate::security::acl::{
    self, AclBinding, AclOperation, PatternType, PermissionType, ResourceType,
};
use crate::security::scram::{new_credential, verify_password, ScramMechanism};
use crate::{Broker, BrokerError};

/// PBKDF2 iterations of the credentials written for declared users (what
/// `samsa user add` uses by default; Kafka accepts 4,096–16,384).
pub const DECLARED_USER_ITERATIONS: u32 = 8192;
/// Longest pause between attempts while the controller cannot take the
/// declared users and ACLs.
const MAX_RETRY_PAUSE: Duration = Duration::from_secs(5);

/// One declared user: a name and its password.
struct DeclaredUser {
    name: String,
    password: Vec<u8>,
}

/// The users and ACLs a configuration declares, read and checked.
#[derive(Default)]
pub struct Declared {
    users: Vec<DeclaredUser>,
    acls: Vec<AclBinding>,
}

impl std::fmt::Debug for Declared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the passwords.
        let users: Vec<&str> = self.users.iter().map(|u| u.name.as_str()).collect();
        f.debug_struct("Declared")
            .field("users", &users)
            .field("acls", &self.acls.len())
            .finish()
    }
}

impl Declared {
    /// Reads `scram_users_dir` and checks `acls`; an unreadable directory,
    /// an empty password or an invalid binding stops the start.
    pub fn load(config: &BrokerConfig) -> Result<Declared, BrokerError> {
        let users = match &config.scram_users_dir {
            Some(dir) => read_users(dir)?,
            None => Vec::new(),
        };
        if !config.acls.is_empty() && !config.authorizer_enable {
            return Err(BrokerError::Config(
                "acls are declared but authorizer_enable is false: nothing would judge by them (CreateAcls answers SECURITY_DISABLED the same way)".into(),
            ));
        }
        let acls = config
            .acls
            .iter()
            .enumerate()
            .map(|(i, declared)| {
                binding_of(declared).map_err(|reason| {
                    BrokerError::Config(format!("acls entry {}: {reason}", i + 1))
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Declared { users, acls })
    }

    pub fn is_empty(&self) -> bool {
        self.users.is_empty() && self.acls.is_empty()
    }

    /// The records that make `view` hold every declared user (both SCRAM
    /// mechanisms, the declared password) and ACL.
    pub fn missing(&self, view: &MetadataView) -> Result<Vec<MetadataRecord>, BrokerError> {
        let mut records = Vec::new();
        for user in &self.users {
            for mechanism in ScramMechanism::ALL {
                let current = view
                    .scram_credentials
                    .get(&user.name)
                    .and_then(|m| m.get(mechanism.name()));
                if current.is_some_and(|c| verify_password(mechanism, c, &user.password)) {
                    continue;
                }
                let credential =
                    new_credential(mechanism, &user.password, DECLARED_USER_ITERATIONS).map_err(
                        |e| BrokerError::Config(format!("declared user {}: {e}", user.name)),
                    )?;
                records.push(MetadataRecord::ScramCredentialChanged {
                    user: user.name.clone(),
                    mechanism: mechanism.name().to_owned(),
                    credential: Some(credential),
                });
            }
        }
        records.extend(
            self.acls
                .iter()
                .filter(|b| !view.acls.contains(*b))
                .map(|binding| MetadataRecord::AclCreated {
                    binding: binding.clone(),
                }),
        );
        Ok(records)
    }

    /// Writes what the metadata lacks until nothing is missing or `stop`
    /// is set (see the module docs).
    pub async fn ensure(self: Arc<Self>, broker: Arc<Broker>, mut stop: watch::Receiver<bool>) {
        if self.is_empty() {
            return;
        }
        let mut pause = Duration::from_millis(200);
        loop {
            let declared = Arc::clone(&self);
            let view = broker.metadata.image();
            // PBKDF2 for every user and mechanism: off the async workers.
            let missing = tokio::task::spawn_blocking(move || declared.missing(&view)).await;
            let records = match missing {
                Ok(Ok(records)) => records,
                Ok(Err(e)) => {
                    warn!(error = %e, "declared users and ACLs not written");
                    return;
                }
                Err(e) => {
                    warn!(error = %e, "declared users and ACLs: the check did not finish");
                    return;
                }
            };
            if records.is_empty() {
                info!(
                    users = self.users.len(),
                    acls = self.acls.len(),
                    "declared users and ACLs are in the metadata"
                );
                return;
            }
            let writing = records.len();
            match broker.alter_security(records).await {
                Ok(()) => info!(records = writing, "declared users and ACLs written"),
                Err(e) => {
                    warn!(error = %e, retry_in_ms = pause.as_millis() as u64, "cannot write the declared users and ACLs yet");
                    tokio::select! {
                        _ = tokio::time::sleep(pause) => {}
                        _ = stop.changed() => return,
                    }
                    pause = (pause * 2).min(MAX_RETRY_PAUSE);
                }
            }
            if *stop.borrow() {
                return;
            }
        }
    }
}

/// Every regular file of `dir` (following symbolic links, as a Kubernetes
/// Secret volume has them) whose name does not start with a dot: the name
/// is the user, the content without a trailing newline the password.
fn read_users(dir: &Path) -> Result<Vec<DeclaredUser>, BrokerError> {
    let io = |source| BrokerError::Io {
        path: dir.to_path_buf(),
        source,
    };
    let mut users = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(io)? {
        let entry = entry.map_err(io)?;
        let name = entry.file_name().to_string_lossy().into_owned();
        let path = entry.path();
        if name.starts_with('.') || !path.is_file() {
            continue;
        }
        let mut password = std::fs::read(&path).map_err(|source| BrokerError::Io {
            path: path.clone(),
            source,
        })?;
        while password.last().is_some_and(|b| *b == b'\n' || *b == b'\r') {
            password.pop();
        }
        if password.is_empty() {
            return Err(BrokerError::Config(format!(
                "scram_users_dir: {} holds no password for user {name}",
                path.display()
            )));
        }
        users.push(DeclaredUser { name, password });
    }
    users.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(users)
}

/// A declared ACL as a binding, checked as CreateAcls checks one.
fn binding_of(declared: &DeclaredAcl) -> Result<AclBinding, String> {
    let resource_type: ResourceType = declared.resource_type.parse()?;
    let resource_name = match (&declared.resource_name, resource_type) {
        (Some(name), _) => name.clone(),
        (None, ResourceType::Cluster) => acl::CLUSTER_NAME.to_owned(),
        (None, _) => return Err(format!("a {resource_type} ACL needs a resource_name")),
    };
    let pattern_type: PatternType = declared.pattern_type.parse()?;
    let operation: AclOperation = declared.operation.parse()?;
    let permission: PermissionType = declared.permission.parse()?;
    let binding = AclBinding {
        resource_type: resource_type.code(),
        resource_name,
        pattern_type: pattern_type.code(),
        principal: declared.principal.clone(),
        host: declared.host.clone(),
        operation: operation.code(),
        permission_type: permission.code(),
    };
    acl::validate_binding(&binding)?;
    Ok(binding)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    fn acl(resource_type: &str, name: Option<&str>, operation: &str) -> DeclaredAcl {
        DeclaredAcl {
            principal: "User:app".into(),
            resource_type: resource_type.into(),
            resource_name: name.map(str::to_owned),
            operation: operation.into(),
            ..DeclaredAcl::default()
        }
    }

    #[test]
    fn declared_acls_are_checked_like_create_acls() {
        let binding = binding_of(&acl("topic", Some("orders-"), "write")).unwrap();
        assert_eq!(binding.resource_type, ResourceType::Topic.code());
        assert_eq!(binding.pattern_type, PatternType::Literal.code());
        assert_eq!(binding.permission_type, PermissionType::Allow.code());
        assert_eq!(binding.host, "*");
        let cluster = binding_of(&acl("CLUSTER", None, "IDEMPOTENT_WRITE")).unwrap();
        assert_eq!(cluster.resource_name, acl::CLUSTER_NAME);
        assert!(binding_of(&acl("TOPIC", None, "READ"))
            .unwrap_err()
            .contains("resource_name"));
        assert!(binding_of(&acl("TOPIC", Some("t"), "FLY"))
            .unwrap_err()
            .contains("FLY"));
        assert!(binding_of(&acl("ANY", Some("t"), "READ")).is_err());
        let mut bad_principal = acl("TOPIC", Some("t"), "READ");
        bad_principal.principal = "app".into();
        assert!(binding_of(&bad_principal).is_err());
    }

    #[test]
    fn users_come_from_a_secret_shaped_directory_and_are_written_only_when_they_differ() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("alice"), "alice-secret\n").unwrap();
        std::fs::write(dir.path().join("bob"), "bob-secret").unwrap();
        // What a Kubernetes Secret volume holds beside its keys.
        std::fs::create_dir(dir.path().join("..2026_12_05")).unwrap();
        std::fs::write(dir.path().join(".hidden"), "x").unwrap();
        let config = BrokerConfig {
            scram_users_dir: Some(dir.path().to_path_buf()),
            ..BrokerConfig::default()
        };
        let declared = Declared::load(&config).unwrap();
        assert_eq!(
            format!("{declared:?}"),
            r#"Declared { users: ["alice", "bob"], acls: 0 }"#
        );
        let mut view = MetadataView::default();
        let records = declared.missing(&view).unwrap();
        assert_eq!(records.len(), 4, "two users, two mechanisms each");
        // Once written, nothing is missing; a changed password is rewritten.
        let mut credentials = std::collections::BTreeMap::new();
        for record in records {
            if let MetadataRecord::ScramCredentialChanged {
                user,
                mechanism,
                credential: Some(c),
            } = record
            {
                credentials
                    .entry(user)
                    .or_insert_with(std::collections::BTreeMap::new)
                    .insert(mechanism, c);
            }
        }
        view.scram_credentials = Arc::new(credentials);
        assert!(declared.missing(&view).unwrap().is_empty());
        std::fs::write(dir.path().join("bob"), "new-secret").unwrap();
        let changed = Declared::load(&config).unwrap().missing(&view).unwrap();
        assert_eq!(changed.len(), 2);
        assert!(changed.iter().all(|r| matches!(
            r,
            MetadataRecord::ScramCredentialChanged { user, .. } if user == "bob"
        )));

        std::fs::write(dir.path().join("carol"), "\n").unwrap();
        assert!(Declared::load(&config)
            .unwrap_err()
            .to_string()
            .contains("carol"));
    }

    #[test]
    fn acls_without_the_authorizer_are_a_configuration_error() {
        let config = BrokerConfig {
            acls: vec![acl("TOPIC", Some("t"), "READ")],
            ..BrokerConfig::default()
        };
        assert!(Declared::load(&config)
            .unwrap_err()
            .to_string()
            .contains("authorizer_enable"));
    }
}
