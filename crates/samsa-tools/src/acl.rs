//! `samsa acl`: the ACLs of a running cluster (the equivalent of
//! `kafka-acls.sh`), over CreateAcls, DescribeAcls and DeleteAcls on the
//! small client in [`crate::wire`]. The broker needs `authorizer_enable`
//! (else it answers SECURITY_DISABLED) and the caller ALTER / DESCRIBE on
//! the cluster; the client speaks plaintext only, so run it against an
//! operator's listener whose principal is a super user.
//!
//! - `add`: one binding per `--operation` (ALLOW, or DENY with `--deny`);
//! - `list`: the bindings a filter selects (no flags: all of them);
//! - `remove`: the bindings a filter selects, printed as they go.
//!
//! The resource is `--topic`, `--group`, `--transactional-id` or
//! `--cluster`; `--prefixed` makes the name a prefix.

use std::process::ExitCode;

use anyhow::{anyhow, bail, Result};
use clap::{Args, Subcommand};
use kafka_protocol::messages::create_acls_request::AclCreation;
use kafka_protocol::messages::delete_acls_request::DeleteAclsFilter;
use kafka_protocol::messages::{CreateAclsRequest, DeleteAclsRequest, DescribeAclsRequest};
use kafka_protocol::protocol::StrBytes;
use samsa_broker::security::acl::{
    AclOperation, PatternType, PermissionType, ResourceType, CLUSTER_NAME,
};

use crate::client::BootstrapArgs;
use crate::wire::{error_name, print_table, Connection};

#[derive(Debug, Subcommand)]
pub enum AclCommand {
    /// Add ACLs: PRINCIPAL may (or, with --deny, may not) do each
    /// --operation on the resource.
    Add(AddArgs),
    /// List the ACLs a filter selects (no filter: every ACL).
    List(FilterArgs),
    /// Remove the ACLs a filter selects.
    Remove(FilterArgs),
}

/// The resource of an ACL: one of its kinds, and how its name matches.
#[derive(Debug, Clone, Args)]
pub struct ResourceArgs {
    #[arg(long, group = "resource")]
    topic: Option<String>,
    #[arg(long, group = "resource")]
    group: Option<String>,
    #[arg(long, group = "resource")]
    transactional_id: Option<String>,
    /// The cluster resource (`kafka-cluster`).
    #[arg(long, group = "resource")]
    cluster: bool,
    /// The name is a prefix (PREFIXED) rather than a name (LITERAL; `*` is
    /// every name).
    #[arg(long)]
    prefixed: bool,
}

#[derive(Debug, Args)]
pub struct AddArgs {
    #[command(flatten)]
    connect: BootstrapArgs,
    #[command(flatten)]
    resource: ResourceArgs,
    /// Who: `User:alice`, or `User:*` for everyone.
    #[arg(long)]
    principal: String,
    /// Kafka's operation names: READ, WRITE, CREATE, DELETE, ALTER,
    /// DESCRIBE, CLUSTER_ACTION, DESCRIBE_CONFIGS, ALTER_CONFIGS,
    /// IDEMPOTENT_WRITE, ALL (repeatable).
    #[arg(long = "operation", required = true)]
    operations: Vec<String>,
    /// The client address the ACL applies to (`*`: any).
    #[arg(long, default_value = "*")]
    host: String,
    /// A DENY ACL (DENY wins over every ALLOW).
    #[arg(long)]
    deny: bool,
}

#[derive(Debug, Args)]
pub struct FilterArgs {
    #[command(flatten)]
    connect: BootstrapArgs,
    #[command(flatten)]
    resource: ResourceArgs,
    #[arg(long)]
    principal: Option<String>,
    #[arg(long = "operation")]
    operation: Option<String>,
    #[arg(long)]
    host: Option<String>,
}

pub async fn run(command: AclCommand) -> Result<ExitCode> {
    match command {
        AclCommand::Add(args) => add(args).await,
        AclCommand::List(args) => list(args).await,
        AclCommand::Remove(args) => remove(args).await,
    }
}

impl ResourceArgs {
    /// Type and name of the named resource; `None` when none is named.
    fn resource(&self) -> Option<(ResourceType, String)> {
        if let Some(t) = &self.topic {
            Some((ResourceType::Topic, t.clone()))
        } else if let Some(g) = &self.group {
            Some((ResourceType::Group, g.clone()))
        } else if let Some(t) = &self.transactional_id {
            Some((ResourceType::TransactionalId, t.clone()))
        } else if self.cluster {
            Some((ResourceType::Cluster, CLUSTER_NAME.to_owned()))
        } else {
            None
        }
    }

    fn pattern(&self) -> PatternType {
        if self.prefixed {
            PatternType::Prefixed
        } else {
            PatternType::Literal
        }
    }
}

fn operation(name: &str) -> Result<AclOperation> {
    name.parse().map_err(|e: String| anyhow!(e))
}

async fn connect(args: &BootstrapArgs) -> Result<Connection> {
    let first = args.bootstrap_server.split(',').next().unwrap_or_default();
    Connection::connect(first.trim()).await
}

async fn add(args: AddArgs) -> Result<ExitCode> {
    let Some((resource_type, name)) = args.resource.resource() else {
        bail!("name a resource: --topic, --group, --transactional-id or --cluster");
    };
    let permission = if args.deny {
        PermissionType::Deny
    } else {
        PermissionType::Allow
    };
    let creations = args
        .operations
        .iter()
        .map(|op| {
            Ok(AclCreation::default()
                .with_resource_type(resource_type.code())
                .with_resource_name(StrBytes::from_string(name.clone()))
                .with_resource_pattern_type(args.resource.pattern().code())
                .with_principal(StrBytes::from_string(args.principal.clone()))
                .with_host(StrBytes::from_string(args.host.clone()))
                .with_operation(operation(op)?.code())
                .with_permission_type(permission.code()))
        })
        .collect::<Result<Vec<_>>>()?;
    let mut conn = connect(&args.connect).await?;
    let (response, _) = conn
        .send(&CreateAclsRequest::default().with_creations(creations), 3)
        .await?;
    let mut failed = false;
    for (op, result) in args.operations.iter().zip(&response.results) {
        if result.error_code == 0 {
            println!(
                "{permission} {} {} on {resource_type}:{}:{name} from {}",
                args.principal,
                op.to_uppercase(),
                args.resource.pattern(),
                args.host
            );
        } else {
            failed = true;
            eprintln!(
                "{}: {}: {}",
                op.to_uppercase(),
                error_name(result.error_code),
                result.error_message.as_deref().unwrap_or("")
            );
        }
    }
    Ok(if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}

/// The filter fields of `args`: `(type, name, pattern, principal, host,
/// operation)` in Kafka's codes, ANY where a flag is absent.
type Filter = (i8, Option<String>, i8, Option<String>, Option<String>, i8);

fn filter(args: &FilterArgs) -> Result<Filter> {
    let (resource_type, name) = match args.resource.resource() {
        Some((t, n)) => (t.code(), Some(n)),
        None => (ResourceType::Any.code(), None),
    };
    let pattern = if args.resource.prefixed {
        PatternType::Prefixed
    } else if name.is_some() {
        PatternType::Literal
    } else {
        PatternType::Any
    };
    let op = match &args.operation {
        Some(op) => operation(op)?,
        None => AclOperation::Any,
    };
    Ok((
        resource_type,
        name,
        pattern.code(),
        args.principal.clone(),
        args.host.clone(),
        op.code(),
    ))
}

fn name_of<T: std::fmt::Display>(code: i8, value: Option<T>) -> String {
    value.map_or_else(|| format!("UNKNOWN({code})"), |v| v.to_string())
}

fn row(
    resource_type: i8,
    pattern: i8,
    name: &str,
    principal: &str,
    host: &str,
    operation: i8,
    permission: i8,
) -> Vec<String> {
    vec![
        name_of(resource_type, ResourceType::from_code(resource_type)),
        name_of(pattern, PatternType::from_code(pattern)),
        name.to_owned(),
        principal.to_owned(),
        host.to_owned(),
        name_of(operation, AclOperation::from_code(operation)),
        name_of(permission, PermissionType::from_code(permission)),
    ]
}

const HEADERS: [&str; 7] = [
    "RESOURCE",
    "PATTERN",
    "NAME",
    "PRINCIPAL",
    "HOST",
    "OPERATION",
    "PERMISSION",
];

async fn list(args: FilterArgs) -> Result<ExitCode> {
    let (resource_type, name, pattern, principal, host, operation) = filter(&args)?;
    let request = DescribeAclsRequest::default()
        .with_resource_type_filter(resource_type)
        .with_resource_name_filter(name.map(StrBytes::from_string))
        .with_pattern_type_filter(pattern)
        .with_principal_filter(principal.map(StrBytes::from_string))
        .with_host_filter(host.map(StrBytes::from_string))
        .with_operation(operation)
        .with_permission_type(PermissionType::Any.code());
    let mut conn = connect(&args.connect).await?;
    let (response, _) = conn.send(&request, 3).await?;
    if response.error_code != 0 {
        bail!(
            "{}: {}",
            error_name(response.error_code),
            response.error_message.as_deref().unwrap_or("")
        );
    }
    let rows: Vec<Vec<String>> = response
        .resources
        .iter()
        .flat_map(|r| {
            r.acls.iter().map(move |a| {
                row(
                    r.resource_type,
                    r.pattern_type,
                    r.resource_name.as_str(),
                    a.principal.as_str(),
                    a.host.as_str(),
                    a.operation,
                    a.permission_type,
                )
            })
        })
        .collect();
    print_table(&HEADERS, &rows);
    Ok(ExitCode::SUCCESS)
}

async fn remove(args: FilterArgs) -> Result<ExitCode> {
    let (resource_type, name, pattern, principal, host, operation) = filter(&args)?;
    let request = DeleteAclsRequest::default().with_filters(vec![DeleteAclsFilter::default()
        .with_resource_type_filter(resource_type)
        .with_resource_name_filter(name.map(StrBytes::from_string))
        .with_pattern_type_filter(pattern)
        .with_principal_filter(principal.map(StrBytes::from_string))
        .with_host_filter(host.map(StrBytes::from_string))
        .with_operation(operation)
        .with_permission_type(PermissionType::Any.code())]);
    let mut conn = connect(&args.connect).await?;
    let (response, _) = conn.send(&request, 3).await?;
    let result = response
        .filter_results
        .first()
        .ok_or_else(|| anyhow!("DeleteAcls answered without a result"))?;
    if result.error_code != 0 {
        bail!(
            "{}: {}",
            error_name(result.error_code),
            result.error_message.as_deref().unwrap_or("")
        );
    }
    let rows: Vec<Vec<String>> = result
        .matching_acls
        .iter()
        .map(|a| {
            row(
                a.resource_type,
                a.pattern_type,
                a.resource_name.as_str(),
                a.principal.as_str(),
                a.host.as_str(),
                a.operation,
                a.permission_type,
            )
        })
        .collect();
    println!("removed {} ACL(s)", rows.len());
    print_table(&HEADERS, &rows);
    Ok(ExitCode::SUCCESS)
}
