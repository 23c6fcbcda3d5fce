//! What one request may do: the caller (principal and address) bound to the
//! authorizer in force when the request arrived. Handlers ask it, with
//! Kafka's operation and resource for their API (the table in
//! `docs/SECURITY.md`), and answer a refusal with Kafka's authorization
//! error code themselves.
//!
//! With the authorizer off (`authorizer_enable = false`, the default) every
//! question is answered yes, as a Kafka broker without `authorizer.class.name`
//! does.

use std::net::IpAddr;
use std::sync::Arc;

use super::acl::{AclOperation, Authorizer, ResourceType, CLUSTER_NAME};
use super::Principal;

/// Kafka's operations of a topic (`AclEntry.supportedOperations`), for the
/// authorized-operations bit fields of Metadata and DescribeTopicPartitions.
pub const TOPIC_OPERATIONS: &[AclOperation] = &[
    AclOperation::Read,
    AclOperation::Write,
    AclOperation::Create,
    AclOperation::Delete,
    AclOperation::Alter,
    AclOperation::Describe,
    AclOperation::DescribeConfigs,
    AclOperation::AlterConfigs,
];

/// Kafka's operations of the cluster (Metadata v8–10, DescribeCluster).
pub const CLUSTER_OPERATIONS: &[AclOperation] = &[
    AclOperation::Create,
    AclOperation::Alter,
    AclOperation::Describe,
    AclOperation::ClusterAction,
    AclOperation::DescribeConfigs,
    AclOperation::AlterConfigs,
    AclOperation::IdempotentWrite,
];

/// Kafka's operations of a consumer group (DescribeGroups v3+).
pub const GROUP_OPERATIONS: &[AclOperation] = &[
    AclOperation::Read,
    AclOperation::Delete,
    AclOperation::Describe,
];

/// A request's caller and the ACLs it is judged by.
#[derive(Debug, Clone)]
pub struct Access {
    authorizer: Option<Arc<Authorizer>>,
    principal: Arc<Principal>,
    host: IpAddr,
}

impl Access {
    /// `principal` from `host`, judged by `authorizer` (`None`: no
    /// authorization, everything allowed).
    pub fn new(
        authorizer: Option<Arc<Authorizer>>,
        principal: Arc<Principal>,
        host: IpAddr,
    ) -> Access {
        Access {
            authorizer,
            principal,
            host,
        }
    }

    /// A caller allowed everything (the broker's own requests, tests).
    pub fn unrestricted() -> Access {
        Access::new(
            None,
            Arc::new(Principal::anonymous()),
            IpAddr::from([127, 0, 0, 1]),
        )
    }

    /// Whether an authorizer judges this caller (DescribeAcls answers
    /// SECURITY_DISABLED without one).
    pub fn authorizer(&self) -> Option<&Authorizer> {
        self.authorizer.as_deref()
    }

    pub fn principal(&self) -> &Principal {
        &self.principal
    }

    /// Whether the caller may do `operation` on the resource `name` of
    /// type `resource_type`. A denial is logged at debug (Kafka's
    /// authorizer log).
    pub fn allows(&self, operation: AclOperation, resource_type: ResourceType, name: &str) -> bool {
        let Some(authorizer) = &self.authorizer else {
            return true;
        };
        let allowed =
            authorizer.authorize(&self.principal, &self.host, operation, resource_type, name);
        if !allowed {
            tracing::debug!(
                principal = %self.principal,
                host = %self.host,
                %operation,
                %resource_type,
                resource = name,
                "denied"
            );
        }
        allowed
    }

    /// Kafka's authorized-operations bit field of a resource: bit `code`
    /// set for each of `operations` the caller may do on it (all of them
    /// without an authorizer, as Kafka answers). Not logged as denials: the
    /// caller asked what it may do, it did not try.
    pub fn authorized_operations(
        &self,
        operations: &[AclOperation],
        resource_type: ResourceType,
        name: &str,
    ) -> i32 {
        operations
            .iter()
            .filter(|op| {
                self.authorizer.as_ref().is_none_or(|authorizer| {
                    authorizer.authorize(&self.principal, &self.host, **op, resource_type, name)
                })
            })
            .fold(0, |bits, op| bits | (1 << op.code()))
    }

    /// [`Access::allows`] on the cluster resource.
    pub fn allows_cluster(&self, operation: AclOperation) -> bool {
        self.allows(operation, ResourceType::Cluster, CLUSTER_NAME)
    }

    /// [`Access::allows`] on a topic.
    pub fn allows_topic(&self, operation: AclOperation, topic: &str) -> bool {
        self.allows(operation, ResourceType::Topic, topic)
    }

    /// [`Access::allows`] on a consumer group.
    pub fn allows_group(&self, operation: AclOperation, group: &str) -> bool {
        self.allows(operation, ResourceType::Group, group)
    }

    /// [`Access::allows`] on a transactional id.
    pub fn allows_transactional_id(&self, operation: AclOperation, id: &str) -> bool {
        self.allows(operation, ResourceType::TransactionalId, id)
    }

    /// Whether the caller may do `operation` on some resource of the type
    /// (Kafka's `authorizeByResourceType`).
    pub fn allows_any(&self, operation: AclOperation, resource_type: ResourceType) -> bool {
        match &self.authorizer {
            None => true,
            Some(authorizer) => authorizer.authorize_by_resource_type(
                &self.principal,
                &self.host,
                operation,
                resource_type,
            ),
        }
    }
}
