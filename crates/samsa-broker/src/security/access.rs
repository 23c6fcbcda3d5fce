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
