//! CreateAcls, DescribeAcls and DeleteAcls: the ACL bindings of the
//! metadata log (`security::acl` judges requests by them).
//!
//! As Kafka answers: SECURITY_DISABLED while the broker has no authorizer;
//! CLUSTER_AUTHORIZATION_FAILED without ALTER (create, delete) or DESCRIBE
//! (describe) on the cluster. A creation Kafka's validation refuses gets
//! INVALID_REQUEST with the reason; a DeleteAcls filter with an unknown
//! code INVALID_REQUEST; a DescribeAcls filter with one matches nothing.
//! Creations and deletions of one request are one metadata change.

use std::collections::BTreeSet;

use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::create_acls_response::AclCreationResult;
use kafka_protocol::messages::delete_acls_response::{
    DeleteAclsFilterResult, DeleteAclsMatchingAcl,
};
use kafka_protocol::messages::describe_acls_response::{AclDescription, DescribeAclsResource};
use kafka_protocol::messages::{
    CreateAclsRequest, CreateAclsResponse, DeleteAclsRequest, DeleteAclsResponse,
    DescribeAclsRequest, DescribeAclsResponse,
};
use kafka_protocol::protocol::StrBytes;
use tracing::info;

use super::str_bytes;
use crate::error::metadata_error_code;
use crate::metadata::MetadataRecord;
use crate::security::access::Access;
use crate::security::acl::{validate_binding, AclBinding, AclBindingFilter, AclOperation};
use crate::Broker;

/// The error of a request the broker refuses as a whole, if any.
fn refused(access: &Access, operation: AclOperation) -> Option<(ResponseError, String)> {
    if access.authorizer().is_none() {
        return Some((
            ResponseError::SecurityDisabled,
            "no authorizer is configured on the broker (authorizer_enable = false)".to_owned(),
        ));
    }
    if !access.allows_cluster(operation) {
        return Some((
            ResponseError::ClusterAuthorizationFailed,
            format!("{} may not {operation} the cluster", access.principal()),
        ));
    }
    None
}

fn binding_of(creation: &kafka_protocol::messages::create_acls_request::AclCreation) -> AclBinding {
    AclBinding {
        resource_type: creation.resource_type,
        resource_name: creation.resource_name.to_string(),
        pattern_type: creation.resource_pattern_type,
        principal: creation.principal.to_string(),
        host: creation.host.to_string(),
        operation: creation.operation,
        permission_type: creation.permission_type,
    }
}

pub async fn create_acls(
    broker: &Broker,
    access: &Access,
    request: CreateAclsRequest,
) -> CreateAclsResponse {
    let whole = refused(access, AclOperation::Alter);
    let mut outcomes: Vec<Result<AclBinding, (ResponseError, String)>> = request
        .creations
        .iter()
        .map(|creation| {
            if let Some(refusal) = &whole {
                return Err(refusal.clone());
            }
            let binding = binding_of(creation);
            validate_binding(&binding).map_err(|reason| (ResponseError::InvalidRequest, reason))?;
            Ok(binding)
        })
        .collect();
    // Creating an ACL that exists is a success that changes nothing.
    let existing = broker.metadata.image().acls.clone();
    let new_bindings: BTreeSet<AclBinding> = outcomes
        .iter()
        .flatten()
        .filter(|b| !existing.contains(*b))
        .cloned()
        .collect();
    let records = new_bindings
        .into_iter()
        .map(|binding| MetadataRecord::AclCreated { binding });
    apply_acl_changes(broker, access, records, &mut outcomes).await;
    let results = outcomes
        .into_iter()
        .map(|outcome| match outcome {
            Ok(_) => AclCreationResult::default().with_error_message(None),
            Err((code, message)) => AclCreationResult::default()
                .with_error_code(code.code())
                .with_error_message(Some(str_bytes(message))),
        })
        .collect();
    CreateAclsResponse::default().with_results(results)
}

fn optional(text: &Option<StrBytes>) -> Option<String> {
    text.as_ref().map(ToString::to_string)
}

pub fn describe_acls(access: &Access, request: DescribeAclsRequest) -> DescribeAclsResponse {
    if let Some((code, message)) = refused(access, AclOperation::Describe) {
        return DescribeAclsResponse::default()
            .with_error_code(code.code())
            .with_error_message(Some(str_bytes(message)));
    }
    let filter = AclBindingFilter::from_codes(
        request.resource_type_filter,
        optional(&request.resource_name_filter),
        request.pattern_type_filter,
        optional(&request.principal_filter),
        optional(&request.host_filter),
        request.operation,
        request.permission_type,
    );
    let mut resources: Vec<DescribeAclsResource> = Vec::new();
    if let (Ok(filter), Some(authorizer)) = (filter, access.authorizer()) {
        // Sorted bindings: those of one resource pattern are adjacent.
        for binding in authorizer.acls(&filter) {
            let description = AclDescription::default()
                .with_principal(str_bytes(binding.principal.clone()))
                .with_host(str_bytes(binding.host.clone()))
                .with_operation(binding.operation)
                .with_permission_type(binding.permission_type);
            let same_resource = resources.last().is_some_and(|r| {
                r.resource_type == binding.resource_type
                    && r.pattern_type == binding.pattern_type
                    && r.resource_name.as_str() == binding.resource_name
            });
            if same_resource {
                if let Some(last) = resources.last_mut() {
                    last.acls.push(description);
                }
            } else {
                resources.push(
                    DescribeAclsResource::default()
                        .with_resource_type(binding.resource_type)
                        .with_resource_name(str_bytes(binding.resource_name.clone()))
                        .with_pattern_type(binding.pattern_type)
                        .with_acls(vec![description]),
                );
            }
        }
    }
    DescribeAclsResponse::default()
        .with_error_message(None)
        .with_resources(resources)
}

pub async fn delete_acls(
    broker: &Broker,
    access: &Access,
    request: DeleteAclsRequest,
) -> DeleteAclsResponse {
    let whole = refused(access, AclOperation::Alter);
    let existing = broker.metadata.image().acls.clone();
    let mut outcomes: Vec<Result<Vec<AclBinding>, (ResponseError, String)>> = request
        .filters
        .iter()
        .map(|f| {
            if let Some(refusal) = &whole {
                return Err(refusal.clone());
            }
            let filter = AclBindingFilter::from_codes(
                f.resource_type_filter,
                optional(&f.resource_name_filter),
                f.pattern_type_filter,
                optional(&f.principal_filter),
                optional(&f.host_filter),
                f.operation,
                f.permission_type,
            )
            .map_err(|reason| (ResponseError::InvalidRequest, reason))?;
            Ok(existing
                .iter()
                .filter(|b| filter.matches(b))
                .cloned()
                .collect())
        })
        .collect();
    let doomed: BTreeSet<AclBinding> = outcomes
        .iter()
        .filter_map(|o| o.as_ref().ok())
        .flatten()
        .cloned()
        .collect();
    let records = doomed
        .into_iter()
        .map(|binding| MetadataRecord::AclDeleted { binding });
    apply_acl_changes(broker, access, records, &mut outcomes).await;
    let results = outcomes
        .into_iter()
        .map(|outcome| match outcome {
            Ok(matching) => DeleteAclsFilterResult::default()
                .with_error_message(None)
                .with_matching_acls(
                    matching
                        .into_iter()
                        .map(|b| {
                            DeleteAclsMatchingAcl::default()
                                .with_error_message(None)
                                .with_resource_type(b.resource_type)
                                .with_resource_name(str_bytes(b.resource_name))
                                .with_pattern_type(b.pattern_type)
                                .with_principal(str_bytes(b.principal))
                                .with_host(str_bytes(b.host))
                                .with_operation(b.operation)
                                .with_permission_type(b.permission_type)
                        })
                        .collect(),
                ),
            Err((code, message)) => DeleteAclsFilterResult::default()
                .with_error_code(code.code())
                .with_error_message(Some(str_bytes(message))),
        })
        .collect();
    DeleteAclsResponse::default().with_filter_results(results)
}

/// Writes `records` (ACLs created or deleted) as one metadata change, if
/// there are any; when that fails, every outcome not already refused gets
/// the metadata error instead.
async fn apply_acl_changes<T>(
    broker: &Broker,
    access: &Access,
    records: impl Iterator<Item = MetadataRecord>,
    outcomes: &mut [Result<T, (ResponseError, String)>],
) {
    let records: Vec<MetadataRecord> = records.collect();
    if records.is_empty() {
        return;
    }
    let summary: Vec<String> = records
        .iter()
        .map(|record| match record {
            MetadataRecord::AclCreated { binding } => format!("+ {}", describe_binding(binding)),
            MetadataRecord::AclDeleted { binding } => format!("- {}", describe_binding(binding)),
            other => other.to_string(),
        })
        .collect();
    match broker.alter_security(records).await {
        Ok(()) => info!(principal = %access.principal(), acls = ?summary, "ACLs changed"),
        Err(e) => {
            let refusal = (metadata_error_code(&e), e.to_string());
            for outcome in outcomes.iter_mut().filter(|o| o.is_ok()) {
                *outcome = Err(refusal.clone());
            }
        }
    }
}

/// A binding as the log shows it: `ALLOW User:alice READ TOPIC:LITERAL:t from *`.
fn describe_binding(b: &AclBinding) -> String {
    use crate::security::acl::{PatternType, PermissionType, ResourceType};
    let name = |code: i8, value: Option<&'static str>| {
        value.map_or_else(|| format!("UNKNOWN({code})"), str::to_owned)
    };
    format!(
        "{} {} {} {}:{}:{} from {}",
        name(
            b.permission_type,
            PermissionType::from_code(b.permission_type).map(|v| v.name())
        ),
        b.principal,
        name(
            b.operation,
            AclOperation::from_code(b.operation).map(|v| v.name())
        ),
        name(
            b.resource_type,
            ResourceType::from_code(b.resource_type).map(|v| v.name())
        ),
        name(
            b.pattern_type,
            PatternType::from_code(b.pattern_type).map(|v| v.name())
        ),
        b.resource_name,
        b.host
    )
}
