//! Kafka's ACL authorizer, sans IO: the typed ACL vocabulary (resource
//! types, pattern types, operations, permissions, with Kafka's codes and
//! names), the validation CreateAcls applies to a new binding, the filters
//! of DescribeAcls/DeleteAcls, and [`Authorizer`], which answers "may this
//! principal, from this host, do this operation on this resource?" with
//! the semantics of Kafka's KRaft `StandardAuthorizer`.
//!
//! It owns no state beyond an immutable index built from the ACL bindings
//! of the metadata image ([`AclBinding`], in Kafka's codes): when the
//! bindings change, the caller builds a new [`Authorizer`] and swaps it in.
//!
//! # Decision rules (Kafka's, in this order)
//!
//! 1. A **super user** (compared by principal type and name) is allowed
//!    everything, whatever the ACLs say, DENY included.
//! 2. The ACLs that apply to a resource are those whose pattern matches it:
//!    a `LITERAL` pattern of the same name, the `LITERAL` wildcard `*` (any
//!    name of that resource type), and every `PREFIXED` pattern whose name
//!    is a prefix of the resource name. A `PREFIXED` `*` is not a wildcard:
//!    it matches names starting with `*`. Resource types never mix.
//! 3. Of those, an ACL takes part when its principal is the caller's
//!    (`Type:name`, case-sensitive) or `User:*`; its host is `*` or the
//!    caller's address; and its operation is the requested one or `ALL`.
//!    An **ALLOW** ACL also implies, as in Kafka: `READ`, `WRITE`, `DELETE`
//!    and `ALTER` imply `DESCRIBE`; `ALTER_CONFIGS` implies
//!    `DESCRIBE_CONFIGS`. A **DENY** ACL implies nothing but through `ALL`:
//!    DENY `READ` does not deny `DESCRIBE`, DENY `ALL` denies everything.
//! 4. **DENY wins**: one taking-part DENY denies, whatever ALLOWs exist.
//!    Otherwise one taking-part ALLOW allows.
//! 5. Otherwise, if **no ACL at all matches the resource** (step 2, whatever
//!    their principal, host, operation or permission), the configured
//!    default decides (`allow.everyone.if.no.acl.found`, false by default);
//!    if some ACL matches the resource but none took part, the answer is
//!    DENY. So an ACL for Alice on topic `t` makes `t` closed to Bob even
//!    with the default open.
//!
//! Hosts are compared as addresses: an IPv4-mapped IPv6 client address
//! counts as its IPv4 address (Java sees such a client as IPv4), and an
//! ACL host is parsed as an address, so `::1` and `0:0:0:0:0:0:0:1` are the
//! same host (Kafka compares strings against Java's uncompressed IPv6 form,
//! so an ACL written `::1` never matches there). An ACL host that is neither
//! `*` nor an address (`localhost`) matches no client, as in Kafka.
//!
//! # Invariants
//!
//! - The authorizer fails closed on what it cannot read: a binding whose
//!   principal is not `Type:name`, or whose operation code is unknown,
//!   still counts as an ACL on its resource (so the open default does not
//!   apply) but never allows; an unknown permission code acts as DENY (as
//!   in Kafka). Bindings with an unknown resource or pattern type are not
//!   indexed. [`validate_binding`] keeps all of these out of the metadata.
//! - [`Authorizer::authorize`] with resource type `ANY` or operation `ANY`
//!   (programming errors; Kafka throws) answers false, super users included.
//! - Lookups cost one hash probe for the literal name, the wildcard list,
//!   and one hash probe per distinct `PREFIXED` name length of that
//!   resource type: independent of the number of ACLs on other resources.

use std::borrow::Borrow;
use std::collections::{HashMap, HashSet};
use std::fmt;
use std::net::IpAddr;
use std::str::FromStr;

pub use samsa_controller::records::AclBinding;

use super::Principal;

/// The resource name of an ACL on any resource of its type (a `LITERAL`
/// pattern), and the host of an ACL for any host.
pub const WILDCARD: &str = "*";

/// The principal of an ACL for any principal.
pub const WILDCARD_PRINCIPAL: &str = "User:*";

/// The only name of the `CLUSTER` resource.
pub const CLUSTER_NAME: &str = "kafka-cluster";

/// One of Kafka's ACL enums: codes, upper-case names (`TRANSACTIONAL_ID`)
/// and the Pascal-case names of Kafka's tools and audit log
/// (`TransactionalId`).
macro_rules! kafka_enum {
    (
        $(#[$meta:meta])*
        $name:ident {
            $($(#[$vmeta:meta])* $variant:ident = $code:literal, $kname:literal, $pascal:literal;)+
        }
    ) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub enum $name {
            $($(#[$vmeta])* $variant,)+
        }

        impl $name {
            /// Every value, in code order.
            pub const VALUES: &'static [$name] = &[$($name::$variant,)+];

            /// The value of a Kafka code; `None` for a code Kafka reads as
            /// `UNKNOWN` (0, or one it does not know).
            pub fn from_code(code: i8) -> Option<$name> {
                match code {
                    $($code => Some($name::$variant),)+
                    _ => None,
                }
            }

            /// Kafka's code.
            pub fn code(self) -> i8 {
                match self {
                    $($name::$variant => $code,)+
                }
            }

            /// Kafka's name (`TRANSACTIONAL_ID`).
            pub fn name(self) -> &'static str {
                match self {
                    $($name::$variant => $kname,)+
                }
            }

            /// Kafka's Pascal-case name (`TransactionalId`), as its tools
            /// print it.
            pub fn pascal_name(self) -> &'static str {
                match self {
                    $($name::$variant => $pascal,)+
                }
            }

            /// Parses a name, ignoring ASCII case: Kafka's name
            /// (`TRANSACTIONAL_ID`, `transactional_id`) or its Pascal-case
            /// name (`TransactionalId`), as Kafka's tools accept them.
            pub fn from_name(text: &str) -> Option<$name> {
                let text = text.trim();
                $name::VALUES.iter().copied().find(|value| {
                    value.name().eq_ignore_ascii_case(text)
                        || value.pascal_name().eq_ignore_ascii_case(text)
                })
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.name())
            }
        }

        impl FromStr for $name {
            type Err = String;

            fn from_str(text: &str) -> Result<$name, String> {
                $name::from_name(text).ok_or_else(|| {
                    let names: Vec<&str> = $name::VALUES.iter().map(|v| v.name()).collect();
                    format!(
                        "unknown {} `{text}` (one of {})",
                        stringify!($name),
                        names.join(", ")
                    )
                })
            }
        }
    };
}

kafka_enum! {
    /// Kafka's `ResourceType`: what an ACL is about.
    ResourceType {
        /// Filters only: any resource type.
        Any = 1, "ANY", "Any";
        Topic = 2, "TOPIC", "Topic";
        /// A consumer group.
        Group = 3, "GROUP", "Group";
        /// The cluster, named [`CLUSTER_NAME`].
        Cluster = 4, "CLUSTER", "Cluster";
        TransactionalId = 5, "TRANSACTIONAL_ID", "TransactionalId";
        DelegationToken = 6, "DELEGATION_TOKEN", "DelegationToken";
        User = 7, "USER", "User";
    }
}

kafka_enum! {
    /// Kafka's `PatternType` (KIP-290): how an ACL's resource name matches
    /// resource names.
    PatternType {
        /// Filters only: a pattern of any type whose name equals the
        /// filter's.
        Any = 1, "ANY", "Any";
        /// Filters only: the patterns that match the filter's name as a
        /// resource name (the literal name, the literal wildcard `*`, every
        /// prefix of it).
        Match = 2, "MATCH", "Match";
        /// The name itself; the name `*` matches every name.
        Literal = 3, "LITERAL", "Literal";
        /// Every name that starts with the pattern's name.
        Prefixed = 4, "PREFIXED", "Prefixed";
    }
}

kafka_enum! {
    /// Kafka's `AclOperation`.
    AclOperation {
        /// Filters only: any operation.
        Any = 1, "ANY", "Any";
        /// Every operation.
        All = 2, "ALL", "All";
        Read = 3, "READ", "Read";
        Write = 4, "WRITE", "Write";
        Create = 5, "CREATE", "Create";
        Delete = 6, "DELETE", "Delete";
        Alter = 7, "ALTER", "Alter";
        Describe = 8, "DESCRIBE", "Describe";
        ClusterAction = 9, "CLUSTER_ACTION", "ClusterAction";
        DescribeConfigs = 10, "DESCRIBE_CONFIGS", "DescribeConfigs";
        AlterConfigs = 11, "ALTER_CONFIGS", "AlterConfigs";
        IdempotentWrite = 12, "IDEMPOTENT_WRITE", "IdempotentWrite";
        CreateTokens = 13, "CREATE_TOKENS", "CreateTokens";
        DescribeTokens = 14, "DESCRIBE_TOKENS", "DescribeTokens";
    }
}

kafka_enum! {
    /// Kafka's `AclPermissionType`.
    PermissionType {
        /// Filters only: either permission.
        Any = 1, "ANY", "Any";
        Deny = 2, "DENY", "Deny";
        Allow = 3, "ALLOW", "Allow";
    }
}

/// Names a code for a message: `TOPIC` or `UNKNOWN(99)`.
fn code_name<T: fmt::Display>(code: i8, value: Option<T>) -> String {
    match value {
        Some(value) => value.to_string(),
        None => format!("UNKNOWN({code})"),
    }
}

/// Checks a binding of a CreateAcls request as Kafka does (the broker's
/// checks, then the controller's), plus one of our own: the principal must
/// be `Type:name` with a non-empty type (Kafka's KRaft controller accepts
/// any principal string, and its authorizer then throws while authorizing
/// requests on that resource). The host is not checked (Kafka does not): a host that is not
/// `*` or an address matches no client.
///
/// `Err` holds the reason for the creation's error message; answer that
/// creation `INVALID_REQUEST` (42). That is Kafka's per-creation code for an
/// unknown code, a CLUSTER name other than [`CLUSTER_NAME`] and an empty
/// name. Kafka fails the whole request instead in two cases: a field whose
/// code is exactly 0 (`UNKNOWN`) makes the request unparsable (the
/// connection is closed), and a resource type `ANY`, pattern type `ANY` or
/// `MATCH`, operation `ANY` or permission `ANY` cannot be built into a
/// binding, so every creation of the request gets `UNKNOWN_SERVER_ERROR`
/// (-1). Answering `INVALID_REQUEST` per creation is the stricter, clearer
/// choice; a caller wanting Kafka's exact bytes checks those codes first.
pub fn validate_binding(binding: &AclBinding) -> Result<(), String> {
    let resource_type = ResourceType::from_code(binding.resource_type);
    match resource_type {
        Some(ResourceType::Any) | None => {
            return Err(format!(
                "invalid resource type {} for an ACL: it needs a concrete resource type",
                code_name(binding.resource_type, resource_type)
            ));
        }
        Some(_) => {}
    }
    let pattern_type = PatternType::from_code(binding.pattern_type);
    match pattern_type {
        Some(PatternType::Literal | PatternType::Prefixed) => {}
        _ => {
            return Err(format!(
                "invalid pattern type {} for an ACL: it must be LITERAL or PREFIXED",
                code_name(binding.pattern_type, pattern_type)
            ));
        }
    }
    let operation = AclOperation::from_code(binding.operation);
    match operation {
        Some(AclOperation::Any) | None => {
            return Err(format!(
                "invalid operation {} for an ACL: it needs a concrete operation or ALL",
                code_name(binding.operation, operation)
            ));
        }
        Some(_) => {}
    }
    let permission = PermissionType::from_code(binding.permission_type);
    match permission {
        Some(PermissionType::Allow | PermissionType::Deny) => {}
        _ => {
            return Err(format!(
                "invalid permission type {} for an ACL: it must be ALLOW or DENY",
                code_name(binding.permission_type, permission)
            ));
        }
    }
    if resource_type == Some(ResourceType::Cluster) && binding.resource_name != CLUSTER_NAME {
        return Err(format!(
            "the CLUSTER resource is named `{CLUSTER_NAME}`, not `{}`",
            binding.resource_name
        ));
    }
    if binding.resource_name.is_empty() {
        return Err("the resource name of an ACL must not be empty".to_owned());
    }
    if Principal::parse(&binding.principal).is_none() {
        return Err(format!(
            "the principal of an ACL is `Type:name` (e.g. `User:alice`, `{WILDCARD_PRINCIPAL}`), not `{}`",
            binding.principal
        ));
    }
    Ok(())
}

/// Kafka's `AclBindingFilter` (a `ResourcePatternFilter` and an
/// `AccessControlEntryFilter`), as DescribeAcls and DeleteAcls carry it:
/// `None` and the `ANY` values match anything.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct AclBindingFilter {
    /// `ANY` or the resource type.
    pub resource_type: ResourceType,
    /// `None`: any name. Otherwise compared as [`Self::pattern_type`] says.
    pub resource_name: Option<String>,
    /// `ANY`: a binding of any pattern type whose name equals the filter's.
    /// `MATCH`: the bindings that apply to a resource of the filter's name
    /// (a `LITERAL` of that name or `*`, a `PREFIXED` whose name is a prefix
    /// of it). `LITERAL` / `PREFIXED`: a binding of that type and name.
    pub pattern_type: PatternType,
    /// `None`: any principal. Otherwise the binding's principal string
    /// exactly (`User:*` only matches bindings for `User:*`).
    pub principal: Option<String>,
    /// `None`: any host. Otherwise the binding's host string exactly.
    pub host: Option<String>,
    /// `ANY` or the binding's operation exactly (`ALL` only matches `ALL`).
    pub operation: AclOperation,
    /// `ANY` or the binding's permission.
    pub permission_type: PermissionType,
}

impl AclBindingFilter {
    /// The filter that matches every binding.
    pub fn any() -> AclBindingFilter {
        AclBindingFilter {
            resource_type: ResourceType::Any,
            resource_name: None,
            pattern_type: PatternType::Any,
            principal: None,
            host: None,
            operation: AclOperation::Any,
            permission_type: PermissionType::Any,
        }
    }

    /// A filter from a DescribeAcls / DeleteAcls request's fields. `Err`
    /// (the reason) when a code is one Kafka reads as `UNKNOWN`: for
    /// DeleteAcls Kafka answers that filter `INVALID_REQUEST` (42); for
    /// DescribeAcls it answers success with no ACLs (such a filter matches
    /// nothing). (A code of exactly 0 makes Kafka reject the whole request
    /// while parsing it.)
    pub fn from_codes(
        resource_type: i8,
        resource_name: Option<String>,
        pattern_type: i8,
        principal: Option<String>,
        host: Option<String>,
        operation: i8,
        permission_type: i8,
    ) -> Result<AclBindingFilter, String> {
        let resource_type_value = ResourceType::from_code(resource_type);
        let pattern_type_value = PatternType::from_code(pattern_type);
        let (Some(resource_type_value), Some(pattern_type_value)) =
            (resource_type_value, pattern_type_value)
        else {
            return Err(format!(
                "unknown resource pattern filter: resource type {}, pattern type {}",
                code_name(resource_type, resource_type_value),
                code_name(pattern_type, pattern_type_value)
            ));
        };
        let operation_value = AclOperation::from_code(operation);
        let permission_value = PermissionType::from_code(permission_type);
        let (Some(operation_value), Some(permission_value)) = (operation_value, permission_value)
        else {
            return Err(format!(
                "unknown access control entry filter: operation {}, permission type {}",
                code_name(operation, operation_value),
                code_name(permission_type, permission_value)
            ));
        };
        Ok(AclBindingFilter {
            resource_type: resource_type_value,
            resource_name,
            pattern_type: pattern_type_value,
            principal,
            host,
            operation: operation_value,
            permission_type: permission_value,
        })
    }

    /// The filter that matches exactly `binding` (Kafka's
    /// `AclBinding.toFilter`); `None` if a code of it is unknown.
    pub fn exact(binding: &AclBinding) -> Option<AclBindingFilter> {
        AclBindingFilter::from_codes(
            binding.resource_type,
            Some(binding.resource_name.clone()),
            binding.pattern_type,
            Some(binding.principal.clone()),
            Some(binding.host.clone()),
            binding.operation,
            binding.permission_type,
        )
        .ok()
    }

    /// Whether the filter selects `binding`, as Kafka's
    /// `AclBindingFilter.matches`.
    pub fn matches(&self, binding: &AclBinding) -> bool {
        self.matches_pattern(binding) && self.matches_entry(binding)
    }

    fn matches_pattern(&self, binding: &AclBinding) -> bool {
        if self.resource_type != ResourceType::Any
            && self.resource_type.code() != binding.resource_type
        {
            return false;
        }
        let exact_pattern = self.pattern_type.code() == binding.pattern_type;
        if !matches!(self.pattern_type, PatternType::Any | PatternType::Match) && !exact_pattern {
            return false;
        }
        let Some(name) = &self.resource_name else {
            return true;
        };
        if self.pattern_type == PatternType::Any || exact_pattern {
            return *name == binding.resource_name;
        }
        // MATCH: the binding applies to a resource named `name`.
        match PatternType::from_code(binding.pattern_type) {
            Some(PatternType::Literal) => {
                *name == binding.resource_name || binding.resource_name == WILDCARD
            }
            Some(PatternType::Prefixed) => name.starts_with(binding.resource_name.as_str()),
            // Kafka throws on a binding of another pattern type.
            _ => false,
        }
    }

    fn matches_entry(&self, binding: &AclBinding) -> bool {
        if self
            .principal
            .as_ref()
            .is_some_and(|principal| *principal != binding.principal)
        {
            return false;
        }
        if self.host.as_ref().is_some_and(|host| *host != binding.host) {
            return false;
        }
        if self.operation != AclOperation::Any && self.operation.code() != binding.operation {
            return false;
        }
        self.permission_type == PermissionType::Any
            || self.permission_type.code() == binding.permission_type
    }
}

impl Default for AclBindingFilter {
    fn default() -> AclBindingFilter {
        AclBindingFilter::any()
    }
}

/// An indexed ACL's principal.
#[derive(Debug, Clone, PartialEq, Eq)]
enum AclPrincipal {
    /// `User:*`: every principal.
    Wildcard,
    Exact {
        principal_type: String,
        name: String,
    },
    /// Not `Type:name`: matches no principal.
    Invalid,
}

impl AclPrincipal {
    fn parse(text: &str) -> AclPrincipal {
        if text == WILDCARD_PRINCIPAL {
            return AclPrincipal::Wildcard;
        }
        match Principal::parse(text) {
            Some(principal) => AclPrincipal::Exact {
                principal_type: principal.principal_type,
                name: principal.name,
            },
            None => AclPrincipal::Invalid,
        }
    }

    fn matches(&self, principal: &Principal) -> bool {
        match self {
            AclPrincipal::Wildcard => true,
            AclPrincipal::Exact {
                principal_type,
                name,
            } => *principal_type == principal.principal_type && *name == principal.name,
            AclPrincipal::Invalid => false,
        }
    }
}

/// An indexed ACL's host.
#[derive(Debug, Clone, PartialEq, Eq)]
enum AclHost {
    /// `*`: every host.
    Wildcard,
    Address(IpAddr),
    /// Neither `*` nor an address: matches no client.
    Unmatchable,
}

impl AclHost {
    fn parse(text: &str) -> AclHost {
        if text == WILDCARD {
            return AclHost::Wildcard;
        }
        match text.parse::<IpAddr>() {
            Ok(address) => AclHost::Address(address.to_canonical()),
            Err(_) => AclHost::Unmatchable,
        }
    }

    /// `host` is canonical (IPv4-mapped addresses as IPv4).
    fn matches(&self, host: IpAddr) -> bool {
        match self {
            AclHost::Wildcard => true,
            AclHost::Address(address) => *address == host,
            AclHost::Unmatchable => false,
        }
    }
}

/// The principal/host/operation/permission part of an indexed ACL; the
/// resource part is where it is stored in the [`TypeIndex`].
#[derive(Debug, Clone, PartialEq, Eq)]
struct AclEntry {
    principal: AclPrincipal,
    host: AclHost,
    /// `None`: an unknown code, matching no operation.
    operation: Option<AclOperation>,
    /// Anything but ALLOW acts as DENY, as in Kafka.
    allow: bool,
}

impl AclEntry {
    fn new(binding: &AclBinding) -> AclEntry {
        AclEntry {
            principal: AclPrincipal::parse(&binding.principal),
            host: AclHost::parse(&binding.host),
            operation: AclOperation::from_code(binding.operation),
            allow: binding.permission_type == PermissionType::Allow.code(),
        }
    }

    /// Kafka's `StandardAuthorizerData.findResult` (the resource already
    /// matches): `Some(true)` allows, `Some(false)` denies, `None` means the
    /// ACL does not apply to the request.
    fn decide(&self, principal: &Principal, host: IpAddr, operation: AclOperation) -> Option<bool> {
        if !self.principal.matches(principal) || !self.host.matches(host) {
            return None;
        }
        let acl_operation = self.operation?;
        let applies = acl_operation == AclOperation::All
            || acl_operation == operation
            || (self.allow && allow_implies(acl_operation, operation));
        applies.then_some(self.allow)
    }
}

/// The operations an ALLOW of `granted` implies besides itself (DENY ACLs
/// imply nothing, but through `ALL`).
fn allow_implies(granted: AclOperation, requested: AclOperation) -> bool {
    match requested {
        AclOperation::Describe => matches!(
            granted,
            AclOperation::Read | AclOperation::Write | AclOperation::Delete | AclOperation::Alter
        ),
        AclOperation::DescribeConfigs => granted == AclOperation::AlterConfigs,
        _ => false,
    }
}

/// The ACLs of one resource type.
#[derive(Debug, Clone, Default)]
struct TypeIndex {
    /// `LITERAL` ACLs by name, but `*`.
    literal: HashMap<String, Vec<AclEntry>>,
    /// `LITERAL` ACLs named `*`.
    wildcard: Vec<AclEntry>,
    /// `PREFIXED` ACLs by name.
    prefixed: HashMap<String, Vec<AclEntry>>,
    /// The distinct byte lengths of the `PREFIXED` names, ascending.
    prefix_lengths: Vec<usize>,
}

impl TypeIndex {
    fn insert(&mut self, pattern_type: PatternType, name: &str, entry: AclEntry) {
        match pattern_type {
            PatternType::Literal if name == WILDCARD => self.wildcard.push(entry),
            PatternType::Literal => self.literal.entry(name.to_owned()).or_default().push(entry),
            PatternType::Prefixed => {
                self.prefixed
                    .entry(name.to_owned())
                    .or_default()
                    .push(entry);
                if let Err(at) = self.prefix_lengths.binary_search(&name.len()) {
                    self.prefix_lengths.insert(at, name.len());
                }
            }
            PatternType::Any | PatternType::Match => {}
        }
    }

    /// Calls `visit` with each non-empty group of ACLs whose pattern
    /// matches the resource `name`; stops early when `visit` says
    /// `false`.
    fn for_each_matching(&self, name: &str, mut visit: impl FnMut(&[AclEntry]) -> bool) {
        if let Some(entries) = self.literal.get(name) {
            if !visit(entries) {
                return;
            }
        }
        if !self.wildcard.is_empty() && !visit(&self.wildcard) {
            return;
        }
        for &length in &self.prefix_lengths {
            if length > name.len() {
                break;
            }
            let Some(prefix) = name.get(..length) else {
                continue;
            };
            if let Some(entries) = self.prefixed.get(prefix) {
                if !visit(entries) {
                    return;
                }
            }
        }
    }

    /// Every ACL with its pattern type and name.
    fn all(&self) -> impl Iterator<Item = (PatternType, &str, &AclEntry)> {
        let literal = self.literal.iter().flat_map(|(name, entries)| {
            entries
                .iter()
                .map(move |entry| (PatternType::Literal, name.as_str(), entry))
        });
        let wildcard = self
            .wildcard
            .iter()
            .map(|entry| (PatternType::Literal, WILDCARD, entry));
        let prefixed = self.prefixed.iter().flat_map(|(name, entries)| {
            entries
                .iter()
                .map(move |entry| (PatternType::Prefixed, name.as_str(), entry))
        });
        literal.chain(wildcard).chain(prefixed)
    }
}

/// The index slot of a concrete resource type.
fn type_slot(resource_type: ResourceType) -> Option<usize> {
    match resource_type {
        ResourceType::Any => None,
        ResourceType::Topic => Some(0),
        ResourceType::Group => Some(1),
        ResourceType::Cluster => Some(2),
        ResourceType::TransactionalId => Some(3),
        ResourceType::DelegationToken => Some(4),
        ResourceType::User => Some(5),
    }
}

/// Kafka's `StandardAuthorizer` over a fixed set of ACL bindings; see the
/// module documentation for the rules. Immutable: rebuild it when the ACLs
/// or the configuration change.
#[derive(Debug, Clone)]
pub struct Authorizer {
    /// The distinct bindings, sorted.
    bindings: Vec<AclBinding>,
    /// By [`type_slot`].
    index: [TypeIndex; 6],
    super_users: Vec<Principal>,
    allow_everyone_if_no_acl_found: bool,
}

impl Authorizer {
    /// An authorizer over `bindings` (owned or borrowed; duplicates count
    /// once). `super_users` is Kafka's `super.users`;
    /// `allow_everyone_if_no_acl_found` Kafka's
    /// `allow.everyone.if.no.acl.found` (false in Kafka by default).
    pub fn new<I, B>(
        bindings: I,
        super_users: Vec<Principal>,
        allow_everyone_if_no_acl_found: bool,
    ) -> Authorizer
    where
        I: IntoIterator<Item = B>,
        B: Borrow<AclBinding>,
    {
        let mut bindings: Vec<AclBinding> = bindings
            .into_iter()
            .map(|binding| binding.borrow().clone())
            .collect();
        bindings.sort_unstable();
        bindings.dedup();
        let mut index: [TypeIndex; 6] = Default::default();
        for binding in &bindings {
            let slot = ResourceType::from_code(binding.resource_type).and_then(type_slot);
            let pattern_type = PatternType::from_code(binding.pattern_type);
            if let (Some(slot), Some(pattern_type)) = (slot, pattern_type) {
                if let Some(type_index) = index.get_mut(slot) {
                    type_index.insert(pattern_type, &binding.resource_name, AclEntry::new(binding));
                }
            }
        }
        Authorizer {
            bindings,
            index,
            super_users,
            allow_everyone_if_no_acl_found,
        }
    }

    /// Whether this authorizer's bindings are exactly `bindings`.
    pub fn holds_exactly(&self, bindings: &std::collections::BTreeSet<AclBinding>) -> bool {
        self.bindings.iter().eq(bindings.iter())
    }

    /// An authorizer with this one's configuration over other bindings.
    pub fn with_bindings<I, B>(&self, bindings: I) -> Authorizer
    where
        I: IntoIterator<Item = B>,
        B: Borrow<AclBinding>,
    {
        Authorizer::new(
            bindings,
            self.super_users.clone(),
            self.allow_everyone_if_no_acl_found,
        )
    }

    /// Whether there is no ACL binding at all.
    pub fn is_empty(&self) -> bool {
        self.bindings.is_empty()
    }

    /// The number of distinct ACL bindings.
    pub fn len(&self) -> usize {
        self.bindings.len()
    }

    /// Whether `principal` is one of the configured super users.
    pub fn is_super_user(&self, principal: &Principal) -> bool {
        self.super_users.contains(principal)
    }

    /// The configured `allow.everyone.if.no.acl.found`.
    pub fn allow_everyone_if_no_acl_found(&self) -> bool {
        self.allow_everyone_if_no_acl_found
    }

    /// The bindings `filter` selects (DescribeAcls), sorted.
    pub fn acls<'a>(
        &'a self,
        filter: &'a AclBindingFilter,
    ) -> impl Iterator<Item = &'a AclBinding> + 'a {
        self.bindings
            .iter()
            .filter(move |binding| filter.matches(binding))
    }

    fn type_index(&self, resource_type: ResourceType) -> Option<&TypeIndex> {
        type_slot(resource_type).and_then(|slot| self.index.get(slot))
    }

    /// Whether `principal`, connected from `host`, may do `operation` on the
    /// resource `resource_name` of type `resource_type` (Kafka's
    /// `authorize` of a `LITERAL` resource pattern).
    pub fn authorize(
        &self,
        principal: &Principal,
        host: &IpAddr,
        operation: AclOperation,
        resource_type: ResourceType,
        resource_name: &str,
    ) -> bool {
        if operation == AclOperation::Any || resource_type == ResourceType::Any {
            return false;
        }
        if self.is_super_user(principal) {
            return true;
        }
        let Some(index) = self.type_index(resource_type) else {
            return false;
        };
        let host = host.to_canonical();
        let mut resource_has_acls = false;
        let mut allowed = false;
        let mut denied = false;
        index.for_each_matching(resource_name, |entries| {
            resource_has_acls = true;
            for entry in entries {
                match entry.decide(principal, host, operation) {
                    Some(true) => allowed = true,
                    Some(false) => {
                        denied = true;
                        return false;
                    }
                    None => {}
                }
            }
            true
        });
        if denied {
            false
        } else if allowed {
            true
        } else if resource_has_acls {
            false
        } else {
            self.allow_everyone_if_no_acl_found
        }
    }

    /// Whether `principal`, connected from `host`, may do `operation` on at
    /// least one resource of type `resource_type` (Kafka's
    /// `Authorizer.authorizeByResourceType`, KIP-679; e.g. InitProducerId
    /// without a transactional id asks for WRITE on any topic). As in
    /// Kafka: super users, and the open default when no ACL matches, allow;
    /// otherwise some ALLOW of `operation` or `ALL` (no implied operations)
    /// on a pattern not covered by a matching DENY (a DENY of the wildcard,
    /// of the same literal name, or of a `PREFIXED` prefix of the name).
    /// `ANY` operation or resource type answers false.
    pub fn authorize_by_resource_type(
        &self,
        principal: &Principal,
        host: &IpAddr,
        operation: AclOperation,
        resource_type: ResourceType,
    ) -> bool {
        if operation == AclOperation::Any || resource_type == ResourceType::Any {
            return false;
        }
        // Kafka's probe of an arbitrary name: super users, and the default
        // when no ACL applies to it.
        if self.authorize(principal, host, operation, resource_type, "hardcode") {
            return true;
        }
        let Some(index) = self.type_index(resource_type) else {
            return false;
        };
        let host = host.to_canonical();
        let mut deny_literal: HashSet<&str> = HashSet::new();
        let mut deny_prefixed: HashSet<&str> = HashSet::new();
        let mut allow_literal: Vec<&str> = Vec::new();
        let mut allow_prefixed: Vec<&str> = Vec::new();
        let mut allow_wildcard = false;
        for (pattern_type, name, entry) in index.all() {
            if !entry.host.matches(host) || !entry.principal.matches(principal) {
                continue;
            }
            if !matches!(entry.operation, Some(op) if op == operation || op == AclOperation::All) {
                continue;
            }
            match (entry.allow, pattern_type) {
                (false, PatternType::Literal) if name == WILDCARD => return false,
                (false, PatternType::Literal) => {
                    deny_literal.insert(name);
                }
                (false, _) => {
                    deny_prefixed.insert(name);
                }
                (true, PatternType::Literal) if name == WILDCARD => allow_wildcard = true,
                (true, PatternType::Literal) => allow_literal.push(name),
                (true, _) => allow_prefixed.push(name),
            }
        }
        if allow_wildcard {
            return true;
        }
        let dominated = |name: &str| {
            name.char_indices()
                .map(|(at, c)| at + c.len_utf8())
                .filter_map(|end| name.get(..end))
                .any(|prefix| deny_prefixed.contains(prefix))
        };
        allow_literal
            .iter()
            .any(|name| !deny_literal.contains(name) && !dominated(name))
            || allow_prefixed.iter().any(|name| !dominated(name))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;
    use std::net::{Ipv4Addr, Ipv6Addr};

    use AclOperation as Op;
    use PatternType::{Literal, Prefixed};
    use PermissionType::{Allow, Deny};
    use ResourceType::{Cluster, Group, Topic, TransactionalId};

    fn binding(
        resource_type: ResourceType,
        name: &str,
        pattern_type: PatternType,
        principal: &str,
        host: &str,
        operation: AclOperation,
        permission: PermissionType,
    ) -> AclBinding {
        AclBinding {
            resource_type: resource_type.code(),
            resource_name: name.to_owned(),
            pattern_type: pattern_type.code(),
            principal: principal.to_owned(),
            host: host.to_owned(),
            operation: operation.code(),
            permission_type: permission.code(),
        }
    }

    fn authorizer(bindings: &[AclBinding]) -> Authorizer {
        Authorizer::new(bindings, vec![Principal::user("superman")], false)
    }

    fn ip(text: &str) -> IpAddr {
        text.parse().unwrap()
    }

    fn localhost() -> IpAddr {
        IpAddr::V4(Ipv4Addr::LOCALHOST)
    }

    /// Kafka's `newFooAcl`: PREFIXED `foo_` for bob.
    fn foo_acl(op: AclOperation, permission: PermissionType) -> AclBinding {
        binding(Topic, "foo_", Prefixed, "User:bob", "*", op, permission)
    }

    /// Kafka's `newBarAcl`: group `bar` for everyone.
    fn bar_acl(op: AclOperation, permission: PermissionType) -> AclBinding {
        binding(Group, "bar", Literal, "User:*", "*", op, permission)
    }

    fn check(
        authorizer: &Authorizer,
        user: &str,
        host: IpAddr,
        cases: &[(AclOperation, ResourceType, &str)],
    ) -> Vec<bool> {
        let principal = Principal::user(user);
        cases
            .iter()
            .map(|&(op, resource_type, name)| {
                authorizer.authorize(&principal, &host, op, resource_type, name)
            })
            .collect()
    }

    fn valid_ops() -> impl Iterator<Item = AclOperation> {
        Op::VALUES.iter().copied().filter(|op| *op != Op::Any)
    }

    // ---- enums ----

    #[test]
    fn codes_and_names_are_kafkas() {
        let resource_types: Vec<(i8, &str)> = ResourceType::VALUES
            .iter()
            .map(|v| (v.code(), v.name()))
            .collect();
        assert_eq!(
            resource_types,
            [
                (1, "ANY"),
                (2, "TOPIC"),
                (3, "GROUP"),
                (4, "CLUSTER"),
                (5, "TRANSACTIONAL_ID"),
                (6, "DELEGATION_TOKEN"),
                (7, "USER")
            ]
        );
        let patterns: Vec<(i8, &str)> = PatternType::VALUES
            .iter()
            .map(|v| (v.code(), v.name()))
            .collect();
        assert_eq!(
            patterns,
            [(1, "ANY"), (2, "MATCH"), (3, "LITERAL"), (4, "PREFIXED")]
        );
        let ops: Vec<(i8, &str)> = Op::VALUES.iter().map(|v| (v.code(), v.name())).collect();
        assert_eq!(
            ops,
            [
                (1, "ANY"),
                (2, "ALL"),
                (3, "READ"),
                (4, "WRITE"),
                (5, "CREATE"),
                (6, "DELETE"),
                (7, "ALTER"),
                (8, "DESCRIBE"),
                (9, "CLUSTER_ACTION"),
                (10, "DESCRIBE_CONFIGS"),
                (11, "ALTER_CONFIGS"),
                (12, "IDEMPOTENT_WRITE"),
                (13, "CREATE_TOKENS"),
                (14, "DESCRIBE_TOKENS")
            ]
        );
        let permissions: Vec<(i8, &str)> = PermissionType::VALUES
            .iter()
            .map(|v| (v.code(), v.name()))
            .collect();
        assert_eq!(permissions, [(1, "ANY"), (2, "DENY"), (3, "ALLOW")]);
    }

    #[test]
    fn codes_round_trip_and_unknown_codes_are_none() {
        for value in ResourceType::VALUES {
            assert_eq!(ResourceType::from_code(value.code()), Some(*value));
        }
        for value in PatternType::VALUES {
            assert_eq!(PatternType::from_code(value.code()), Some(*value));
        }
        for value in Op::VALUES {
            assert_eq!(Op::from_code(value.code()), Some(*value));
        }
        for value in PermissionType::VALUES {
            assert_eq!(PermissionType::from_code(value.code()), Some(*value));
        }
        for code in [0, -1, 8, 99, i8::MIN, i8::MAX] {
            assert_eq!(ResourceType::from_code(code), None);
        }
        assert_eq!(PatternType::from_code(0), None);
        assert_eq!(PatternType::from_code(5), None);
        assert_eq!(Op::from_code(0), None);
        assert_eq!(Op::from_code(15), None);
        assert_eq!(PermissionType::from_code(0), None);
        assert_eq!(PermissionType::from_code(4), None);
    }

    #[test]
    fn names_parse_case_insensitively() {
        for text in ["topic", "Topic", "TOPIC", " tOpIc "] {
            assert_eq!(ResourceType::from_name(text), Some(Topic));
        }
        for text in [
            "TRANSACTIONAL_ID",
            "transactional_id",
            "TransactionalId",
            "transactionalid",
        ] {
            assert_eq!(ResourceType::from_name(text), Some(TransactionalId));
        }
        assert_eq!(ResourceType::from_name("unknown"), None);
        assert_eq!(ResourceType::from_name(""), None);
        assert_eq!(ResourceType::from_name("transactional-id"), None);
        assert_eq!("IdempotentWrite".parse::<Op>(), Ok(Op::IdempotentWrite));
        assert_eq!("describe_configs".parse::<Op>(), Ok(Op::DescribeConfigs));
        assert_eq!("prefixed".parse::<PatternType>(), Ok(Prefixed));
        assert_eq!("Match".parse::<PatternType>(), Ok(PatternType::Match));
        assert_eq!("allow".parse::<PermissionType>(), Ok(Allow));
        let error = "reed".parse::<Op>().unwrap_err();
        assert!(error.contains("reed") && error.contains("READ"), "{error}");
        assert_eq!(Op::ClusterAction.to_string(), "CLUSTER_ACTION");
        assert_eq!(Op::ClusterAction.pascal_name(), "ClusterAction");
        assert_eq!(
            ResourceType::DelegationToken.pascal_name(),
            "DelegationToken"
        );
    }

    // ---- validation ----

    fn valid() -> AclBinding {
        binding(Topic, "t", Literal, "User:alice", "*", Op::Read, Allow)
    }

    #[test]
    fn valid_bindings_pass() {
        assert_eq!(validate_binding(&valid()), Ok(()));
        for resource_type in ResourceType::VALUES
            .iter()
            .filter(|t| **t != ResourceType::Any)
        {
            for pattern in [Literal, Prefixed] {
                for op in valid_ops() {
                    for permission in [Allow, Deny] {
                        let name = if *resource_type == Cluster {
                            CLUSTER_NAME
                        } else {
                            "x"
                        };
                        let b = binding(
                            *resource_type,
                            name,
                            pattern,
                            "User:*",
                            "10.0.0.1",
                            op,
                            permission,
                        );
                        assert_eq!(validate_binding(&b), Ok(()), "{b:?}");
                    }
                }
            }
        }
        // The wildcard name, a principal name with ':', any host string.
        let b = binding(
            Group,
            "*",
            Literal,
            "User:CN=a:b",
            "not-an-ip",
            Op::All,
            Deny,
        );
        assert_eq!(validate_binding(&b), Ok(()));
        let b = binding(Topic, "*", Prefixed, "Group:ops", "::1", Op::Write, Allow);
        assert_eq!(validate_binding(&b), Ok(()));
    }

    #[test]
    fn invalid_bindings_fail_with_a_reason() {
        let cases: Vec<(AclBinding, &str)> = vec![
            (
                AclBinding {
                    resource_type: 1,
                    ..valid()
                },
                "resource type ANY",
            ),
            (
                AclBinding {
                    resource_type: 0,
                    ..valid()
                },
                "resource type UNKNOWN(0)",
            ),
            (
                AclBinding {
                    resource_type: 42,
                    ..valid()
                },
                "resource type UNKNOWN(42)",
            ),
            (
                AclBinding {
                    pattern_type: 1,
                    ..valid()
                },
                "pattern type ANY",
            ),
            (
                AclBinding {
                    pattern_type: 2,
                    ..valid()
                },
                "pattern type MATCH",
            ),
            (
                AclBinding {
                    pattern_type: 0,
                    ..valid()
                },
                "pattern type UNKNOWN(0)",
            ),
            (
                AclBinding {
                    pattern_type: 9,
                    ..valid()
                },
                "pattern type UNKNOWN(9)",
            ),
            (
                AclBinding {
                    operation: 1,
                    ..valid()
                },
                "operation ANY",
            ),
            (
                AclBinding {
                    operation: 0,
                    ..valid()
                },
                "operation UNKNOWN(0)",
            ),
            (
                AclBinding {
                    operation: 15,
                    ..valid()
                },
                "operation UNKNOWN(15)",
            ),
            (
                AclBinding {
                    permission_type: 1,
                    ..valid()
                },
                "permission type ANY",
            ),
            (
                AclBinding {
                    permission_type: 0,
                    ..valid()
                },
                "permission type UNKNOWN(0)",
            ),
            (
                AclBinding {
                    permission_type: 4,
                    ..valid()
                },
                "permission type UNKNOWN(4)",
            ),
            (
                AclBinding {
                    resource_type: Cluster.code(),
                    resource_name: "my-cluster".to_owned(),
                    ..valid()
                },
                "kafka-cluster",
            ),
            (
                AclBinding {
                    resource_type: Cluster.code(),
                    resource_name: "*".to_owned(),
                    ..valid()
                },
                "kafka-cluster",
            ),
            (
                AclBinding {
                    resource_type: Cluster.code(),
                    resource_name: String::new(),
                    ..valid()
                },
                "kafka-cluster",
            ),
            (
                AclBinding {
                    resource_name: String::new(),
                    ..valid()
                },
                "must not be empty",
            ),
            (
                AclBinding {
                    resource_name: String::new(),
                    pattern_type: Prefixed.code(),
                    ..valid()
                },
                "must not be empty",
            ),
            (
                AclBinding {
                    principal: "alice".to_owned(),
                    ..valid()
                },
                "Type:name",
            ),
            (
                AclBinding {
                    principal: ":alice".to_owned(),
                    ..valid()
                },
                "Type:name",
            ),
            (
                AclBinding {
                    principal: String::new(),
                    ..valid()
                },
                "Type:name",
            ),
        ];
        for (binding, expected) in cases {
            let reason = validate_binding(&binding).unwrap_err();
            assert!(reason.contains(expected), "{binding:?}: {reason}");
        }
        let b = AclBinding {
            resource_type: Cluster.code(),
            resource_name: CLUSTER_NAME.to_owned(),
            pattern_type: Prefixed.code(),
            ..valid()
        };
        assert_eq!(validate_binding(&b), Ok(()));
    }

    // ---- authorization: Kafka's StandardAuthorizerTest ----

    #[test]
    fn find_result_implication() {
        let bob = Principal::user("bob");
        let host = localhost();
        let decide = |acl: AclBinding, op: AclOperation| AclEntry::new(&acl).decide(&bob, host, op);
        // These permissions all imply DESCRIBE.
        for op in [Op::Describe, Op::Read, Op::Write, Op::Delete, Op::Alter] {
            assert_eq!(decide(foo_acl(op, Allow), Op::Describe), Some(true), "{op}");
        }
        // CREATE does not imply DESCRIBE.
        assert_eq!(decide(foo_acl(Op::Create, Allow), Op::Describe), None);
        // Deny ACLs don't do "implication".
        for op in [Op::Read, Op::Write, Op::Delete, Op::Alter] {
            assert_eq!(decide(foo_acl(op, Deny), Op::Describe), None, "{op}");
        }
        // Exact match.
        assert_eq!(
            decide(foo_acl(Op::Describe, Deny), Op::Describe),
            Some(false)
        );
        // These permissions all imply DESCRIBE_CONFIGS.
        for op in [Op::DescribeConfigs, Op::AlterConfigs] {
            assert_eq!(
                decide(foo_acl(op, Allow), Op::DescribeConfigs),
                Some(true),
                "{op}"
            );
        }
        assert_eq!(
            decide(foo_acl(Op::AlterConfigs, Deny), Op::DescribeConfigs),
            None
        );
        assert_eq!(
            decide(foo_acl(Op::AlterConfigs, Deny), Op::AlterConfigs),
            Some(false)
        );
        // ALL, allow or deny, covers every operation.
        for op in valid_ops() {
            assert_eq!(decide(foo_acl(Op::All, Allow), op), Some(true), "{op}");
            assert_eq!(decide(foo_acl(Op::All, Deny), op), Some(false), "{op}");
        }
    }

    #[test]
    fn find_result_principal_matching() {
        let host = localhost();
        let decide = |acl: AclBinding, user: &str, op: AclOperation| {
            AclEntry::new(&acl).decide(&Principal::user(user), host, op)
        };
        assert_eq!(
            decide(foo_acl(Op::Read, Allow), "bob", Op::Read),
            Some(true)
        );
        // Principal does not match.
        assert_eq!(decide(foo_acl(Op::Read, Allow), "alice", Op::Read), None);
        // Principal matching is case-sensitive, type included.
        assert_eq!(decide(foo_acl(Op::Read, Allow), "Bob", Op::Read), None);
        let group_bob = Principal {
            principal_type: "Group".to_owned(),
            name: "bob".to_owned(),
        };
        assert_eq!(
            AclEntry::new(&foo_acl(Op::Read, Allow)).decide(&group_bob, host, Op::Read),
            None
        );
        // The wildcard principal matches anything, of any principal type.
        assert_eq!(
            decide(bar_acl(Op::Read, Deny), "alice", Op::Read),
            Some(false)
        );
        assert_eq!(
            AclEntry::new(&bar_acl(Op::Read, Deny)).decide(&group_bob, host, Op::Read),
            Some(false)
        );
        // `Group:*` is not a wildcard.
        let group_star = binding(Group, "bar", Literal, "Group:*", "*", Op::Read, Allow);
        assert_eq!(decide(group_star.clone(), "alice", Op::Read), None);
        let star = Principal {
            principal_type: "Group".to_owned(),
            name: "*".to_owned(),
        };
        assert_eq!(
            AclEntry::new(&group_star).decide(&star, host, Op::Read),
            Some(true)
        );
    }

    #[test]
    fn simple_authorizations() {
        let a = authorizer(&[
            foo_acl(Op::Read, Allow),
            foo_acl(Op::Write, Allow),
            bar_acl(Op::DescribeConfigs, Allow),
            bar_acl(Op::AlterConfigs, Allow),
        ]);
        assert_eq!(
            check(&a, "bob", localhost(), &[(Op::Read, Topic, "foo_")]),
            [true]
        );
        assert_eq!(
            check(&a, "fred", localhost(), &[(Op::AlterConfigs, Group, "bar")]),
            [true]
        );
        assert_eq!(
            check(&a, "fred", localhost(), &[(Op::Read, Topic, "foo_")]),
            [false]
        );
    }

    #[test]
    fn deny_precedence_with_operation_all() {
        let a = authorizer(&[
            binding(Topic, "foo", Literal, "User:alice", "*", Op::All, Deny),
            binding(Topic, "foo", Prefixed, "User:alice", "*", Op::Read, Allow),
            binding(Topic, "foo", Literal, "User:*", "*", Op::All, Deny),
            binding(Topic, "foo", Prefixed, "User:*", "*", Op::Describe, Allow),
        ]);
        assert_eq!(
            check(
                &a,
                "alice",
                localhost(),
                &[
                    (Op::Write, Topic, "foo"),
                    (Op::Read, Topic, "foo"),
                    (Op::Describe, Topic, "foo"),
                    (Op::Read, Topic, "foobar"),
                ]
            ),
            [false, false, false, true]
        );
        assert_eq!(
            check(
                &a,
                "bob",
                localhost(),
                &[
                    (Op::Describe, Topic, "foo"),
                    (Op::Read, Topic, "foo"),
                    (Op::Write, Topic, "foo"),
                    (Op::Describe, Topic, "foobaz"),
                    (Op::Read, Topic, "foobaz"),
                ]
            ),
            [false, false, false, true, false]
        );
    }

    #[test]
    fn topic_acl_with_operation_all() {
        let a = authorizer(&[
            binding(Topic, "foo", Literal, "User:*", "*", Op::All, Allow),
            binding(Topic, "bar", Prefixed, "User:alice", "*", Op::All, Allow),
            binding(Topic, "baz", Literal, "User:bob", "*", Op::All, Allow),
        ]);
        assert_eq!(
            check(
                &a,
                "alice",
                localhost(),
                &[
                    (Op::Write, Topic, "foo"),
                    (Op::DescribeConfigs, Topic, "bar"),
                    (Op::Describe, Topic, "baz"),
                ]
            ),
            [true, true, false]
        );
        assert_eq!(
            check(
                &a,
                "bob",
                localhost(),
                &[
                    (Op::Write, Topic, "foo"),
                    (Op::Read, Topic, "bar"),
                    (Op::Describe, Topic, "baz"),
                ]
            ),
            [true, false, true]
        );
        assert_eq!(
            check(
                &a,
                "malory",
                localhost(),
                &[
                    (Op::Describe, Topic, "foo"),
                    (Op::Write, Topic, "bar"),
                    (Op::Read, Topic, "baz"),
                ]
            ),
            [true, false, false]
        );
    }

    #[test]
    fn host_address_acl_validation() {
        let host1 = ip("192.168.1.1");
        let host2 = ip("192.168.1.2");
        let local = localhost();
        let a = authorizer(&[
            binding(
                Topic,
                "foo",
                Literal,
                "User:alice",
                "192.168.1.1",
                Op::Read,
                Deny,
            ),
            binding(Topic, "foo", Literal, "User:alice", "*", Op::Read, Allow),
            binding(
                Topic,
                "bar",
                Literal,
                "User:bob",
                "192.168.1.2",
                Op::Read,
                Allow,
            ),
            binding(
                Topic,
                "bar",
                Literal,
                "User:*",
                "127.0.0.1",
                Op::Describe,
                Allow,
            ),
        ]);
        let actions = [
            (Op::Read, Topic, "foo"),
            (Op::Read, Topic, "bar"),
            (Op::Describe, Topic, "bar"),
        ];
        assert_eq!(check(&a, "alice", local, &actions), [true, false, true]);
        assert_eq!(check(&a, "alice", host1, &actions), [false, false, false]);
        assert_eq!(check(&a, "alice", host2, &actions), [true, false, false]);
        assert_eq!(check(&a, "bob", local, &actions), [false, false, true]);
        assert_eq!(check(&a, "bob", host1, &actions), [false, false, false]);
        assert_eq!(check(&a, "bob", host2, &actions), [false, true, true]);
    }

    #[test]
    fn hosts_compare_as_addresses() {
        let a = authorizer(&[
            binding(Topic, "v6", Literal, "User:*", "::1", Op::Read, Allow),
            binding(
                Topic,
                "v6-long",
                Literal,
                "User:*",
                "0:0:0:0:0:0:0:1",
                Op::Read,
                Allow,
            ),
            binding(Topic, "v4", Literal, "User:*", "10.1.2.3", Op::Read, Allow),
            binding(
                Topic,
                "mapped",
                Literal,
                "User:*",
                "::ffff:10.1.2.3",
                Op::Read,
                Allow,
            ),
            binding(
                Topic,
                "name",
                Literal,
                "User:*",
                "localhost",
                Op::Read,
                Allow,
            ),
            binding(Topic, "empty", Literal, "User:*", "", Op::Read, Allow),
        ]);
        let v6 = IpAddr::V6(Ipv6Addr::LOCALHOST);
        let v4 = ip("10.1.2.3");
        let mapped = IpAddr::V6(Ipv4Addr::new(10, 1, 2, 3).to_ipv6_mapped());
        let cases = [
            (Op::Read, Topic, "v6"),
            (Op::Read, Topic, "v6-long"),
            (Op::Read, Topic, "v4"),
            (Op::Read, Topic, "mapped"),
            (Op::Read, Topic, "name"),
            (Op::Read, Topic, "empty"),
        ];
        assert_eq!(
            check(&a, "u", v6, &cases),
            [true, true, false, false, false, false]
        );
        // A client on an IPv4-mapped IPv6 address is its IPv4 address.
        assert_eq!(
            check(&a, "u", v4, &cases),
            [false, false, true, true, false, false]
        );
        assert_eq!(
            check(&a, "u", mapped, &cases),
            [false, false, true, true, false, false]
        );
        assert_eq!(
            check(&a, "u", localhost(), &cases),
            [false, false, false, false, false, false]
        );
    }

    fn many_acls() -> Vec<AclBinding> {
        vec![
            binding(Topic, "green2", Literal, "User:*", "*", Op::Read, Allow),
            binding(Topic, "green", Prefixed, "User:bob", "*", Op::Read, Allow),
            binding(Topic, "betamax4", Literal, "User:bob", "*", Op::Read, Allow),
            binding(Topic, "betamax", Literal, "User:bob", "*", Op::Read, Allow),
            binding(Topic, "beta", Prefixed, "User:*", "*", Op::Read, Allow),
            binding(Topic, "alpha", Prefixed, "User:*", "*", Op::Read, Allow),
            binding(Topic, "alp", Prefixed, "User:bob", "*", Op::Read, Deny),
            binding(Group, "*", Literal, "User:bob", "*", Op::Write, Allow),
            binding(Group, "wheel", Literal, "User:*", "*", Op::Write, Deny),
        ]
    }

    #[test]
    fn authorization_with_many_acls() {
        let a = authorizer(&many_acls());
        assert_eq!(
            check(
                &a,
                "bob",
                localhost(),
                &[(Op::Read, Topic, "green1"), (Op::Write, Group, "wheel")]
            ),
            [true, false]
        );
        assert_eq!(
            check(
                &a,
                "bob",
                localhost(),
                &[
                    (Op::Read, Topic, "alpha"),
                    (Op::Write, Group, "arbitrary"),
                    (Op::Read, Topic, "ala"),
                ]
            ),
            [false, true, false]
        );
        // Alice is not denied by bob's `alp` prefix.
        assert_eq!(
            check(
                &a,
                "alice",
                localhost(),
                &[
                    (Op::Read, Topic, "alpha"),
                    (Op::Read, Topic, "alphabet"),
                    (Op::Read, Topic, "betamax"),
                    (Op::Read, Topic, "green1"),
                    (Op::Write, Group, "arbitrary"),
                ]
            ),
            [true, true, true, false, false]
        );
    }

    #[test]
    fn prefix_acls() {
        let a = authorizer(&[
            binding(Topic, "fooa", Prefixed, "User:alice", "*", Op::All, Allow),
            binding(Topic, "foobar", Literal, "User:bob", "*", Op::All, Allow),
            binding(Topic, "f", Prefixed, "User:bob", "*", Op::All, Allow),
        ]);
        assert_eq!(
            check(
                &a,
                "bob",
                localhost(),
                &[
                    (Op::Write, Topic, "foobarr"),
                    (Op::Read, Topic, "goobar"),
                    (Op::Read, Topic, "fooa"),
                ]
            ),
            [true, false, true]
        );
        assert_eq!(
            check(
                &a,
                "alice",
                localhost(),
                &[
                    (Op::Describe, Topic, "fooa"),
                    (Op::Write, Topic, "bar"),
                    (Op::Read, Topic, "baz"),
                ]
            ),
            [true, false, false]
        );
    }

    #[test]
    fn allow_everyone_if_no_acl_found() {
        let acls = [binding(
            Topic,
            "topic1",
            Literal,
            "User:Alice",
            "*",
            Op::Read,
            Allow,
        )];
        let supers = vec![Principal::user("alice"), Principal::user("chris")];
        let open = Authorizer::new(&acls, supers.clone(), true);
        let closed = Authorizer::new(&acls, supers, false);
        let cases = [(Op::Read, Topic, "topic1"), (Op::Read, Topic, "topic2")];
        // topic1 has an ACL (for someone else): the default does not apply.
        assert_eq!(check(&open, "Bob", localhost(), &cases), [false, true]);
        assert_eq!(check(&closed, "Bob", localhost(), &cases), [false, false]);
        assert!(open.allow_everyone_if_no_acl_found());
        assert!(!closed.allow_everyone_if_no_acl_found());
        // No ACL at all.
        let empty = Authorizer::new(Vec::<AclBinding>::new(), Vec::new(), false);
        assert!(empty.is_empty());
        assert_eq!(check(&empty, "bob", localhost(), &cases), [false, false]);
        let empty_open = Authorizer::new(Vec::<AclBinding>::new(), Vec::new(), true);
        assert_eq!(check(&empty_open, "bob", localhost(), &cases), [true, true]);
    }

    #[test]
    fn no_acl_found_means_no_acl_on_the_resource_whatever_principal_host_or_operation() {
        let acls = [
            // Another principal, from another host, another operation.
            binding(
                Topic,
                "t1",
                Literal,
                "User:alice",
                "10.0.0.9",
                Op::Create,
                Allow,
            ),
            // A prefix covering t2*.
            binding(Topic, "t2", Prefixed, "User:alice", "*", Op::Write, Allow),
            // The wildcard of groups.
            binding(Group, "*", Literal, "User:alice", "*", Op::Read, Allow),
            // A DENY for someone else also counts.
            binding(
                TransactionalId,
                "tx",
                Literal,
                "User:alice",
                "*",
                Op::Write,
                Deny,
            ),
        ];
        let a = Authorizer::new(&acls, Vec::new(), true);
        assert_eq!(
            check(
                &a,
                "bob",
                localhost(),
                &[
                    (Op::Read, Topic, "t1"),
                    (Op::Read, Topic, "t2-x"),
                    (Op::Read, Topic, "t3"),
                    (Op::Read, Topic, "t"),
                    (Op::Read, Group, "any-group"),
                    (Op::Write, TransactionalId, "tx"),
                    (Op::Write, TransactionalId, "tx2"),
                    // Same name, other resource type: no ACL.
                    (Op::Read, Cluster, "kafka-cluster"),
                ]
            ),
            [false, false, true, true, false, false, true, true]
        );
    }

    #[test]
    fn super_users_are_allowed_whatever_the_acls() {
        let deny_all = [
            binding(Topic, "*", Literal, "User:*", "*", Op::All, Deny),
            binding(Cluster, CLUSTER_NAME, Literal, "User:*", "*", Op::All, Deny),
        ];
        let a = Authorizer::new(
            &deny_all,
            vec![Principal::user("superuser1"), Principal::user("superuser2")],
            false,
        );
        for user in ["superuser1", "superuser2"] {
            assert_eq!(
                check(
                    &a,
                    user,
                    ip("192.0.4.4"),
                    &[
                        (Op::Read, Topic, "t"),
                        (Op::ClusterAction, Cluster, CLUSTER_NAME),
                        (Op::Read, Group, "no-acl"),
                    ]
                ),
                [true, true, true]
            );
        }
        assert!(a.is_super_user(&Principal::user("superuser1")));
        assert!(!a.is_super_user(&Principal::user("SuperUser1")));
        assert_eq!(
            check(&a, "SuperUser1", localhost(), &[(Op::Read, Topic, "t")]),
            [false]
        );
        let other_type = Principal {
            principal_type: "Group".to_owned(),
            name: "superuser1".to_owned(),
        };
        assert!(!a.authorize(&other_type, &localhost(), Op::Read, Topic, "t"));
    }

    // ---- authorization: Kafka's AuthorizerTest ----

    const RESOURCE: &str = "topic-1";

    #[test]
    fn topic_acl() {
        let host1 = "192.168.1.1";
        let host2 = "192.168.1.2";
        let acl = |principal: &str, host: &str, op, permission| {
            binding(Topic, RESOURCE, Literal, principal, host, op, permission)
        };
        let a = authorizer(&[
            acl("User:alice", host1, Op::Read, Allow),
            acl("User:alice", host2, Op::Read, Allow),
            acl("User:alice", host1, Op::Read, Deny),
            acl("User:alice", host1, Op::Write, Allow),
            acl("User:alice", "*", Op::Describe, Allow),
            acl("User:rob", "*", Op::Read, Allow),
            acl("User:batman", "*", Op::Write, Allow),
        ]);
        let ops = [
            (Op::Read, Topic, RESOURCE),
            (Op::Write, Topic, RESOURCE),
            (Op::Describe, Topic, RESOURCE),
            (Op::Alter, Topic, RESOURCE),
        ];
        assert_eq!(
            check(&a, "alice", ip(host1), &ops),
            [false, true, true, false]
        );
        assert_eq!(
            check(&a, "alice", ip(host2), &ops),
            [true, false, true, false]
        );
        // READ or WRITE imply DESCRIBE.
        assert_eq!(
            check(&a, "rob", ip(host1), &ops),
            [true, false, true, false]
        );
        assert_eq!(
            check(&a, "batman", ip(host1), &ops),
            [false, true, true, false]
        );
    }

    #[test]
    fn deny_takes_precedence() {
        let host = "192.168.2.1";
        let a = authorizer(&[
            binding(Topic, RESOURCE, Literal, "User:*", "*", Op::All, Allow),
            binding(Topic, RESOURCE, Literal, "User:alice", host, Op::All, Deny),
        ]);
        assert_eq!(
            check(&a, "alice", ip(host), &[(Op::Read, Topic, RESOURCE)]),
            [false]
        );
        assert_eq!(
            check(&a, "alice", localhost(), &[(Op::Read, Topic, RESOURCE)]),
            [true]
        );
        assert_eq!(
            check(&a, "bob", ip(host), &[(Op::Read, Topic, RESOURCE)]),
            [true]
        );
    }

    #[test]
    fn deny_wins_across_literal_wildcard_and_prefixed() {
        let allow =
            |name: &str, pattern| binding(Topic, name, pattern, "User:alice", "*", Op::Read, Allow);
        let deny =
            |name: &str, pattern| binding(Topic, name, pattern, "User:alice", "*", Op::Read, Deny);
        for (allow_acl, deny_acl) in [
            (allow("orders", Literal), deny("*", Literal)),
            (allow("*", Literal), deny("orders", Literal)),
            (allow("ord", Prefixed), deny("orders", Literal)),
            (allow("orders", Literal), deny("ord", Prefixed)),
            (allow("o", Prefixed), deny("ord", Prefixed)),
            (allow("ord", Prefixed), deny("o", Prefixed)),
            (allow("*", Literal), deny("orders", Prefixed)),
        ] {
            let a = authorizer(&[allow_acl.clone(), deny_acl.clone()]);
            assert_eq!(
                check(&a, "alice", localhost(), &[(Op::Read, Topic, "orders")]),
                [false],
                "{allow_acl:?} {deny_acl:?}"
            );
            let a = authorizer(std::slice::from_ref(&allow_acl));
            assert_eq!(
                check(&a, "alice", localhost(), &[(Op::Read, Topic, "orders")]),
                [true],
                "{allow_acl:?}"
            );
        }
    }

    #[test]
    fn allow_all_access() {
        let a = authorizer(&[binding(
            Topic,
            RESOURCE,
            Literal,
            "User:*",
            "*",
            Op::All,
            Allow,
        )]);
        for op in valid_ops() {
            assert_eq!(
                check(&a, "random", ip("192.0.4.4"), &[(op, Topic, RESOURCE)]),
                [true]
            );
        }
    }

    #[test]
    fn wildcard_acls() {
        let host1 = "192.168.3.1";
        let read_wildcard = binding(Topic, "*", Literal, "User:alice", host1, Op::Read, Allow);
        let a = authorizer(&[]);
        assert_eq!(
            check(&a, "alice", ip(host1), &[(Op::Read, Topic, RESOURCE)]),
            [false]
        );
        let a = authorizer(std::slice::from_ref(&read_wildcard));
        assert_eq!(
            check(&a, "alice", ip(host1), &[(Op::Read, Topic, RESOURCE)]),
            [true]
        );
        // Allow WRITE to the topic, deny WRITE on the wildcard: denied.
        let a = authorizer(&[
            read_wildcard,
            binding(
                Topic,
                RESOURCE,
                Literal,
                "User:alice",
                host1,
                Op::Write,
                Allow,
            ),
            binding(Topic, "*", Literal, "User:alice", host1, Op::Write, Deny),
        ]);
        assert_eq!(
            check(
                &a,
                "alice",
                ip(host1),
                &[(Op::Write, Topic, RESOURCE), (Op::Read, Topic, RESOURCE)]
            ),
            [false, true]
        );
        // The wildcard of one resource type says nothing about another.
        assert_eq!(
            check(&a, "alice", ip(host1), &[(Op::Read, Group, RESOURCE)]),
            [false]
        );
    }

    #[test]
    fn prefixed_star_is_not_a_wildcard() {
        let a = authorizer(&[binding(
            Group,
            "*",
            Prefixed,
            "User:*",
            "*",
            Op::Read,
            Allow,
        )]);
        assert_eq!(
            check(
                &a,
                "u",
                localhost(),
                &[
                    (Op::Read, Group, "g"),
                    (Op::Read, Group, "*g"),
                    (Op::Read, Group, "*")
                ]
            ),
            [false, true, true]
        );
    }

    #[test]
    fn acl_inheritance() {
        let user = "alice";
        let host = ip("192.168.3.1");
        let implications_of_allow = |parent: AclOperation, implied: &[AclOperation]| {
            let a = authorizer(&[binding(
                Cluster,
                CLUSTER_NAME,
                Literal,
                "User:alice",
                "*",
                parent,
                Allow,
            )]);
            for op in valid_ops() {
                let expected = implied.contains(&op) || op == parent;
                assert_eq!(
                    check(&a, user, host, &[(op, Cluster, CLUSTER_NAME)]),
                    [expected],
                    "ALLOW {parent} -> {op}"
                );
            }
        };
        let implications_of_deny = |parent: AclOperation, implied: &[AclOperation]| {
            let a = authorizer(&[
                binding(
                    Cluster,
                    CLUSTER_NAME,
                    Literal,
                    "User:alice",
                    "*",
                    parent,
                    Deny,
                ),
                binding(
                    Cluster,
                    CLUSTER_NAME,
                    Literal,
                    "User:alice",
                    "*",
                    Op::All,
                    Allow,
                ),
            ]);
            for op in valid_ops() {
                let denied = implied.contains(&op) || op == parent;
                assert_eq!(
                    check(&a, user, host, &[(op, Cluster, CLUSTER_NAME)]),
                    [!denied],
                    "DENY {parent} -> {op}"
                );
            }
        };
        let all: Vec<AclOperation> = valid_ops().collect();
        implications_of_allow(Op::All, &all);
        implications_of_deny(Op::All, &all);
        implications_of_allow(Op::Read, &[Op::Describe]);
        implications_of_allow(Op::Write, &[Op::Describe]);
        implications_of_allow(Op::Delete, &[Op::Describe]);
        implications_of_allow(Op::Alter, &[Op::Describe]);
        implications_of_allow(Op::AlterConfigs, &[Op::DescribeConfigs]);
        implications_of_allow(Op::Create, &[]);
        implications_of_allow(Op::Describe, &[]);
        implications_of_allow(Op::IdempotentWrite, &[]);
        implications_of_allow(Op::ClusterAction, &[]);
        implications_of_deny(Op::Describe, &[]);
        implications_of_deny(Op::DescribeConfigs, &[]);
        implications_of_deny(Op::Read, &[]);
        implications_of_deny(Op::AlterConfigs, &[]);
    }

    #[test]
    fn access_through_wildcard_and_prefixed_resources() {
        let allow_read =
            |name: &str, pattern| binding(Topic, name, pattern, "User:alice", "*", Op::Read, Allow);
        let cases = [(Op::Read, Topic, "foo-1234")];
        let a = authorizer(&[allow_read("*", Literal)]);
        assert_eq!(check(&a, "alice", localhost(), &cases), [true]);
        let a = authorizer(&[allow_read("foo-", Prefixed)]);
        assert_eq!(check(&a, "alice", localhost(), &cases), [true]);
        let a = authorizer(&[allow_read("foo-", Literal)]);
        assert_eq!(check(&a, "alice", localhost(), &cases), [false]);
        let a = authorizer(&[allow_read("foo-12345", Prefixed)]);
        assert_eq!(check(&a, "alice", localhost(), &cases), [false]);
    }

    #[test]
    fn authorize_with_prefixed_resource() {
        let deny_read =
            |name: &str, pattern| binding(Topic, name, pattern, "User:alice", "*", Op::Read, Deny);
        let a = authorizer(&[
            deny_read("a_other", Literal),
            deny_read("a_other", Prefixed),
            deny_read("foo-6b9e0e0d", Prefixed),
            deny_read("foo-1c2f5b4c", Prefixed),
            deny_read("foo-4e5f8a5e-zzz", Prefixed),
            deny_read("fooo-0b1c2d3e", Prefixed),
            deny_read("fo-11aa22bb", Prefixed),
            deny_read("fop-33cc44dd", Prefixed),
            deny_read("fon-55ee66ff", Prefixed),
            deny_read("fon-", Prefixed),
            deny_read("z_other", Prefixed),
            deny_read("z_other", Literal),
            binding(Topic, "foo-", Prefixed, "User:alice", "*", Op::Read, Allow),
        ]);
        assert_eq!(
            check(&a, "alice", localhost(), &[(Op::Read, Topic, "foo-1234")]),
            [true]
        );
        assert_eq!(
            check(&a, "alice", localhost(), &[(Op::Read, Topic, "fon-1")]),
            [false]
        );
        assert_eq!(
            check(
                &a,
                "alice",
                localhost(),
                &[(Op::Read, Topic, "foo-6b9e0e0d-x")]
            ),
            [false]
        );
    }

    #[test]
    fn single_character_resource_acls() {
        let a = authorizer(&[binding(
            Topic,
            "f",
            Literal,
            "User:alice",
            "*",
            Op::Read,
            Allow,
        )]);
        assert_eq!(
            check(
                &a,
                "alice",
                localhost(),
                &[(Op::Read, Topic, "f"), (Op::Read, Topic, "foo")]
            ),
            [true, false]
        );
        let a = authorizer(&[
            binding(Topic, "f", Literal, "User:alice", "*", Op::Read, Allow),
            binding(Topic, "_", Prefixed, "User:alice", "*", Op::Read, Allow),
        ]);
        assert_eq!(
            check(
                &a,
                "alice",
                localhost(),
                &[
                    (Op::Read, Topic, "_foo"),
                    (Op::Read, Topic, "_"),
                    (Op::Read, Topic, "foo_")
                ]
            ),
            [true, true, false]
        );
    }

    #[test]
    fn authorize_with_empty_resource_name() {
        let a = authorizer(&[]);
        assert_eq!(
            check(&a, "alice", localhost(), &[(Op::Read, Group, "")]),
            [false]
        );
        let a = authorizer(&[binding(
            Group,
            "*",
            Literal,
            "User:alice",
            "*",
            Op::Read,
            Allow,
        )]);
        assert_eq!(
            check(&a, "alice", localhost(), &[(Op::Read, Group, "")]),
            [true]
        );
    }

    #[test]
    fn prefixes_respect_char_boundaries() {
        let a = authorizer(&[
            binding(Topic, "é", Prefixed, "User:*", "*", Op::Read, Allow),
            binding(Topic, "ab", Prefixed, "User:*", "*", Op::Read, Allow),
        ]);
        assert_eq!(
            check(
                &a,
                "u",
                localhost(),
                &[
                    (Op::Read, Topic, "étude"),
                    (Op::Read, Topic, "e"),
                    (Op::Read, Topic, "aé"),
                    (Op::Read, Topic, "abc"),
                ]
            ),
            [true, false, false, true]
        );
    }

    #[test]
    fn any_operation_or_resource_type_is_refused() {
        let a = Authorizer::new(
            [binding(Topic, "*", Literal, "User:*", "*", Op::All, Allow)],
            vec![Principal::user("superman")],
            true,
        );
        let principal = Principal::user("u");
        let superman = Principal::user("superman");
        for p in [&principal, &superman] {
            assert!(!a.authorize(p, &localhost(), Op::Any, Topic, "t"));
            assert!(!a.authorize(p, &localhost(), Op::Read, ResourceType::Any, "t"));
            assert!(a.authorize(p, &localhost(), Op::Read, Topic, "t"));
        }
    }

    #[test]
    fn unreadable_bindings_fail_closed() {
        let bad_principal = binding(Topic, "t", Literal, "alice", "*", Op::All, Allow);
        let unknown_op = AclBinding {
            operation: 99,
            ..binding(Topic, "u", Literal, "User:*", "*", Op::All, Allow)
        };
        let unknown_permission = AclBinding {
            permission_type: 0,
            ..binding(Topic, "v", Literal, "User:*", "*", Op::Read, Allow)
        };
        let unknown_type = AclBinding {
            resource_type: 99,
            ..binding(Topic, "w", Literal, "User:*", "*", Op::All, Deny)
        };
        let a = Authorizer::new(
            [bad_principal, unknown_op, unknown_permission, unknown_type],
            Vec::new(),
            true,
        );
        assert_eq!(a.len(), 4);
        assert_eq!(
            check(
                &a,
                "alice",
                localhost(),
                &[
                    (Op::Read, Topic, "t"),
                    (Op::Read, Topic, "u"),
                    (Op::Read, Topic, "v"),
                    (Op::Read, Topic, "w"),
                ]
            ),
            [false, false, false, true]
        );
    }

    #[test]
    fn duplicates_count_once_and_borrowed_bindings_work() {
        let acl = foo_acl(Op::Read, Allow);
        let owned = Authorizer::new(vec![acl.clone(), acl.clone()], Vec::new(), false);
        assert_eq!(owned.len(), 1);
        assert!(!owned.is_empty());
        let set: std::collections::BTreeSet<AclBinding> = [acl].into_iter().collect();
        let borrowed = Authorizer::new(set.iter(), Vec::new(), false);
        assert_eq!(borrowed.len(), 1);
        assert_eq!(
            check(&borrowed, "bob", localhost(), &[(Op::Read, Topic, "foo_x")]),
            [true]
        );
    }

    // ---- authorize_by_resource_type: Kafka's BaseAuthorizerTest ----

    fn by_type(a: &Authorizer, user: &str, host: &str, op: AclOperation, rt: ResourceType) -> bool {
        a.authorize_by_resource_type(&Principal::user(user), &ip(host), op, rt)
    }

    const H1: &str = "192.168.1.1";
    const H2: &str = "192.168.1.2";

    #[test]
    fn by_resource_type_allow_then_deny() {
        let allow_read = binding(Topic, "sb1", Literal, "User:user1", H1, Op::Read, Allow);
        let deny_read = binding(Topic, "sb1", Literal, "User:user1", H1, Op::Read, Deny);
        assert!(!by_type(&authorizer(&[]), "user1", H1, Op::Read, Topic));
        let a = authorizer(std::slice::from_ref(&allow_read));
        assert!(by_type(&a, "user1", H1, Op::Read, Topic));
        let a = authorizer(&[allow_read, deny_read]);
        assert!(!by_type(&a, "user1", H1, Op::Read, Topic));
    }

    #[test]
    fn by_resource_type_unrelated_deny_does_not_dominate_allow() {
        let a = authorizer(&[
            binding(Topic, "sb1", Literal, "User:user1", H1, Op::Read, Deny),
            binding(Topic, "sb1", Literal, "User:user2", H1, Op::Read, Deny),
            binding(Topic, "sb1", Literal, "User:user1", H2, Op::Write, Deny),
            binding(Topic, "sb1", Literal, "User:user2", H2, Op::Read, Deny),
            binding(Topic, "sb1", Literal, "User:user1", H2, Op::Read, Allow),
            binding(Topic, "sb2", Literal, "User:user1", H2, Op::Read, Deny),
            binding(Group, "s", Prefixed, "User:user1", H2, Op::Read, Deny),
        ]);
        assert!(!by_type(&a, "user1", H1, Op::Read, Topic));
        assert!(!by_type(&a, "user1", H1, Op::Read, Group));
        assert!(!by_type(&a, "user1", H1, Op::Read, TransactionalId));
        assert!(!by_type(&a, "user1", H1, Op::Read, Cluster));
        assert!(by_type(&a, "user1", H2, Op::Read, Topic));
    }

    #[test]
    fn by_resource_type_prefixed_deny_dominates() {
        let allow = |name: &str| binding(Group, name, Prefixed, "User:user1", H1, Op::Read, Allow);
        let deny = |name: &str| binding(Group, name, Prefixed, "User:user1", H1, Op::Read, Deny);
        let mut acls = vec![allow("abcde")];
        assert!(by_type(&authorizer(&acls), "user1", H1, Op::Read, Group));
        acls.push(deny("abcd"));
        assert!(!by_type(&authorizer(&acls), "user1", H1, Op::Read, Group));
        acls.push(allow("abc"));
        assert!(by_type(&authorizer(&acls), "user1", H1, Op::Read, Group));
        acls.push(deny("a"));
        assert!(!by_type(&authorizer(&acls), "user1", H1, Op::Read, Group));
        acls.push(allow("ab"));
        assert!(!by_type(&authorizer(&acls), "user1", H1, Op::Read, Group));
    }

    #[test]
    fn by_resource_type_wildcard_deny_dominates() {
        let ace = |name: &str, pattern, permission| {
            binding(
                Group,
                name,
                pattern,
                "User:user1",
                H1,
                Op::Write,
                permission,
            )
        };
        let mut acls = vec![ace("hello", Prefixed, Allow)];
        assert!(by_type(&authorizer(&acls), "user1", H1, Op::Write, Group));
        acls.push(ace("*", Literal, Deny));
        assert!(!by_type(&authorizer(&acls), "user1", H1, Op::Write, Group));
        acls.push(ace("*", Literal, Allow));
        assert!(!by_type(&authorizer(&acls), "user1", H1, Op::Write, Group));
        acls.push(ace("aloha", Literal, Allow));
        assert!(!by_type(&authorizer(&acls), "user1", H1, Op::Write, Group));
        // Without the deny, the wildcard allow allows.
        let acls = [ace("*", Literal, Allow)];
        assert!(by_type(&authorizer(&acls), "user1", H1, Op::Write, Group));
    }

    #[test]
    fn by_resource_type_with_all_operation_host_and_principal() {
        let ace = |principal: &str, host: &str, op, permission| {
            binding(Topic, "sb1", Literal, principal, host, op, permission)
        };
        // ALL operation.
        let mut acls = vec![
            ace("User:user1", H1, Op::Write, Deny),
            ace("User:user1", H1, Op::All, Allow),
        ];
        assert!(by_type(&authorizer(&acls), "user1", H1, Op::Read, Topic));
        acls.push(ace("User:user1", H1, Op::All, Deny));
        assert!(!by_type(&authorizer(&acls), "user1", H1, Op::Read, Topic));
        // No implication: READ does not grant DESCRIBE here.
        let acls = [ace("User:user1", H1, Op::Read, Allow)];
        assert!(!by_type(
            &authorizer(&acls),
            "user1",
            H1,
            Op::Describe,
            Topic
        ));
        // Any host.
        let acls = [
            ace("User:user1", H1, Op::Read, Allow),
            ace("User:user1", "*", Op::Read, Deny),
        ];
        assert!(!by_type(&authorizer(&acls), "user1", H1, Op::Read, Topic));
        let acls = [ace("User:user1", "*", Op::Read, Allow)];
        assert!(by_type(&authorizer(&acls), "user1", H2, Op::Read, Topic));
        // Any principal.
        let acls = [
            ace("User:user1", H1, Op::Read, Allow),
            ace("User:*", H1, Op::Read, Deny),
        ];
        assert!(!by_type(&authorizer(&acls), "user1", H1, Op::Read, Topic));
        let acls = [ace("User:*", H1, Op::Read, Allow)];
        assert!(by_type(&authorizer(&acls), "user2", H1, Op::Read, Topic));
    }

    #[test]
    fn by_resource_type_super_users_and_default() {
        let deny_all: Vec<AclBinding> = [Topic, Cluster, Group, TransactionalId]
            .into_iter()
            .map(|rt| binding(rt, "*", Literal, "User:*", "*", Op::All, Deny))
            .collect();
        let a = authorizer(&deny_all);
        for rt in [Topic, Cluster, Group, TransactionalId] {
            assert!(by_type(&a, "superman", "192.0.4.4", Op::Read, rt));
            assert!(!by_type(&a, "user1", "192.0.4.4", Op::Read, rt));
        }
        let open = Authorizer::new(Vec::<AclBinding>::new(), Vec::new(), true);
        assert!(by_type(&open, "user1", H1, Op::Read, Topic));
        assert!(by_type(&open, "user1", H1, Op::Write, Topic));
        assert!(!by_type(&open, "user1", H1, Op::Any, Topic));
        assert!(!by_type(&open, "user1", H1, Op::Read, ResourceType::Any));
    }

    // ---- filters: Kafka's ResourcePatternFilterTest / AuthorizerTest ----

    fn pattern_filter(rt: ResourceType, name: Option<&str>, pt: PatternType) -> AclBindingFilter {
        AclBindingFilter {
            resource_type: rt,
            resource_name: name.map(str::to_owned),
            pattern_type: pt,
            ..AclBindingFilter::any()
        }
    }

    fn pattern(rt: ResourceType, name: &str, pt: PatternType) -> AclBinding {
        binding(rt, name, pt, "User:alice", "*", Op::Read, Allow)
    }

    #[test]
    fn resource_pattern_filter_matching() {
        use PatternType::{Any as AnyPattern, Match};
        let f = pattern_filter;
        let cases: Vec<(AclBindingFilter, AclBinding, bool)> = vec![
            // Different resource type, name, name case, pattern type.
            (
                f(Topic, Some("Name"), Literal),
                pattern(Group, "Name", Literal),
                false,
            ),
            (
                f(Topic, Some("Different"), Prefixed),
                pattern(Topic, "Name", Prefixed),
                false,
            ),
            (
                f(Topic, Some("NAME"), Literal),
                pattern(Topic, "Name", Literal),
                false,
            ),
            (
                f(Topic, Some("Name"), Prefixed),
                pattern(Topic, "Name", Literal),
                false,
            ),
            // ANY resource type / name / pattern type.
            (
                f(ResourceType::Any, Some("Name"), Prefixed),
                pattern(Topic, "Name", Prefixed),
                true,
            ),
            (
                f(Topic, None, Prefixed),
                pattern(Topic, "Name", Prefixed),
                true,
            ),
            (
                f(Topic, None, AnyPattern),
                pattern(Topic, "Name", Prefixed),
                true,
            ),
            (
                f(Topic, None, Match),
                pattern(Topic, "Name", Prefixed),
                true,
            ),
            // Literal.
            (
                f(Topic, Some("Name"), Literal),
                pattern(Topic, "Name", Literal),
                true,
            ),
            (
                f(Topic, Some("Name"), AnyPattern),
                pattern(Topic, "Name", Literal),
                true,
            ),
            (
                f(Topic, Some("Name"), Match),
                pattern(Topic, "Name", Literal),
                true,
            ),
            (
                f(Topic, Some("Name-something"), Match),
                pattern(Topic, "Name", Literal),
                false,
            ),
            // The literal wildcard.
            (
                f(Topic, Some("*"), Literal),
                pattern(Topic, "*", Literal),
                true,
            ),
            (
                f(Topic, Some("Name"), Literal),
                pattern(Topic, "*", Literal),
                false,
            ),
            (
                f(Topic, Some("*"), Literal),
                pattern(Topic, "Name", Literal),
                false,
            ),
            (
                f(Topic, Some("Name"), AnyPattern),
                pattern(Topic, "*", Literal),
                false,
            ),
            (
                f(Topic, Some("Name"), Match),
                pattern(Topic, "*", Literal),
                true,
            ),
            // Prefixed.
            (
                f(Topic, Some("Name"), Prefixed),
                pattern(Topic, "Name", Prefixed),
                true,
            ),
            (
                f(Topic, Some("Name"), Prefixed),
                pattern(Topic, "Name-something", Prefixed),
                false,
            ),
            (
                f(Topic, Some("Name-something"), Prefixed),
                pattern(Topic, "Name", Prefixed),
                false,
            ),
            (
                f(Topic, Some("Name-something"), AnyPattern),
                pattern(Topic, "Name", Prefixed),
                false,
            ),
            (
                f(Topic, Some("Name-something"), Match),
                pattern(Topic, "Name", Prefixed),
                true,
            ),
            (
                f(Topic, Some("Name"), Match),
                pattern(Topic, "Name-something", Prefixed),
                false,
            ),
            // A PREFIXED `*` is no wildcard for MATCH either.
            (
                f(Topic, Some("Name"), Match),
                pattern(Topic, "*", Prefixed),
                false,
            ),
            (
                f(Topic, Some("*Name"), Match),
                pattern(Topic, "*", Prefixed),
                true,
            ),
        ];
        for (filter, binding, expected) in cases {
            assert_eq!(filter.matches(&binding), expected, "{filter:?} {binding:?}");
        }
    }

    #[test]
    fn entry_filter_matching() {
        let acl = binding(Topic, "t", Literal, "User:alice", "10.0.0.1", Op::All, Deny);
        let f = |principal: Option<&str>, host: Option<&str>, op, permission| AclBindingFilter {
            principal: principal.map(str::to_owned),
            host: host.map(str::to_owned),
            operation: op,
            permission_type: permission,
            ..AclBindingFilter::any()
        };
        let any = PermissionType::Any;
        assert!(f(None, None, Op::Any, any).matches(&acl));
        assert!(f(Some("User:alice"), Some("10.0.0.1"), Op::All, Deny).matches(&acl));
        assert!(!f(Some("User:*"), None, Op::Any, any).matches(&acl));
        assert!(!f(Some("User:Alice"), None, Op::Any, any).matches(&acl));
        assert!(!f(None, Some("*"), Op::Any, any).matches(&acl));
        // ALL in a filter is the operation ALL, not any operation.
        assert!(!f(None, None, Op::Read, any).matches(&acl));
        assert!(f(None, None, Op::All, any).matches(&acl));
        assert!(!f(None, None, Op::Any, Allow).matches(&acl));
        assert!(AclBindingFilter::default().matches(&acl));
        assert!(AclBindingFilter::exact(&acl).unwrap().matches(&acl));
        let other = AclBinding {
            host: "*".to_owned(),
            ..acl.clone()
        };
        assert!(!AclBindingFilter::exact(&acl).unwrap().matches(&other));
    }

    #[test]
    fn acls_filter() {
        let principal = "User:alice";
        let acl1 = binding(Topic, "foo-1", Literal, principal, "*", Op::Read, Allow);
        let acl2 = binding(
            Topic,
            "foo-1",
            Literal,
            principal,
            "192.168.0.1",
            Op::Write,
            Allow,
        );
        let acl3 = binding(Topic, "bar-1", Literal, principal, "*", Op::Describe, Allow);
        let acl4 = binding(Topic, "bar-", Prefixed, "User:*", "*", Op::Read, Allow);
        let a = Authorizer::new(
            [acl1.clone(), acl2.clone(), acl3.clone(), acl4.clone()],
            Vec::new(),
            false,
        );
        let select = |filter: &AclBindingFilter| -> Vec<AclBinding> {
            let mut selected: Vec<AclBinding> = a.acls(filter).cloned().collect();
            selected.sort();
            selected
        };
        let sorted = |mut v: Vec<AclBinding>| {
            v.sort();
            v
        };
        assert_eq!(
            select(&AclBindingFilter::any()),
            sorted(vec![acl1.clone(), acl2.clone(), acl3.clone(), acl4.clone()])
        );
        assert_eq!(
            select(&pattern_filter(Topic, Some("foo-1"), Literal)),
            sorted(vec![acl1.clone(), acl2.clone()])
        );
        assert_eq!(
            select(&pattern_filter(Topic, Some("bar-"), Prefixed)),
            vec![acl4.clone()]
        );
        assert_eq!(
            select(&pattern_filter(
                ResourceType::Any,
                Some("bar-1"),
                PatternType::Match
            )),
            sorted(vec![acl3.clone(), acl4.clone()])
        );
        assert_eq!(select(&AclBindingFilter::exact(&acl1).unwrap()), vec![acl1]);
        assert!(select(&pattern_filter(Topic, Some("baz"), PatternType::Any)).is_empty());
        // Principal filters compare strings: the wildcard is not "everyone".
        let by_principal = |p: &str| AclBindingFilter {
            principal: Some(p.to_owned()),
            ..AclBindingFilter::any()
        };
        assert_eq!(select(&by_principal("User:*")), vec![acl4]);
        assert_eq!(select(&by_principal(principal)).len(), 3);
    }

    #[test]
    fn filters_from_codes() {
        let filter = AclBindingFilter::from_codes(1, None, 1, None, None, 1, 1).unwrap();
        assert_eq!(filter, AclBindingFilter::any());
        let filter = AclBindingFilter::from_codes(
            2,
            Some("t".to_owned()),
            2,
            Some("User:bob".to_owned()),
            Some("*".to_owned()),
            3,
            3,
        )
        .unwrap();
        assert_eq!(filter.resource_type, Topic);
        assert_eq!(filter.pattern_type, PatternType::Match);
        assert_eq!(filter.operation, Op::Read);
        assert_eq!(filter.permission_type, Allow);
        for (codes, expected) in [
            ((0, 1, 1, 1), "resource pattern filter"),
            ((99, 1, 1, 1), "resource type UNKNOWN(99)"),
            ((1, 0, 1, 1), "pattern type UNKNOWN(0)"),
            ((1, 5, 1, 1), "resource pattern filter"),
            ((1, 1, 0, 1), "access control entry filter"),
            ((1, 1, 15, 1), "operation UNKNOWN(15)"),
            ((1, 1, 1, 0), "permission type UNKNOWN(0)"),
            ((1, 1, 1, 4), "access control entry filter"),
        ] {
            let (rt, pt, op, perm) = codes;
            let reason =
                AclBindingFilter::from_codes(rt, None, pt, None, None, op, perm).unwrap_err();
            assert!(reason.contains(expected), "{codes:?}: {reason}");
        }
        assert!(AclBindingFilter::exact(&AclBinding {
            operation: 0,
            ..valid()
        })
        .is_none());
    }

    // ---- scale ----

    #[test]
    fn thousands_of_acls() {
        let mut acls = Vec::new();
        for i in 0..2_000 {
            acls.push(binding(
                Topic,
                &format!("topic-{i}"),
                Literal,
                &format!("User:u{}", i % 50),
                "*",
                Op::Read,
                Allow,
            ));
            acls.push(binding(
                Topic,
                &format!("team-{i}-"),
                Prefixed,
                &format!("User:u{}", i % 50),
                "*",
                Op::Write,
                Allow,
            ));
        }
        for i in 0..500 {
            acls.push(binding(
                Group,
                &format!("g{i}"),
                Prefixed,
                "User:*",
                &format!("10.0.{}.{}", i / 250, i % 250),
                Op::Read,
                Allow,
            ));
        }
        acls.push(binding(
            Topic,
            "topic-13",
            Literal,
            "User:u13",
            "*",
            Op::Read,
            Deny,
        ));
        let a = Authorizer::new(&acls, vec![Principal::user("admin")], false);
        assert_eq!(a.len(), 4_501);
        let host = ip("10.0.0.7");
        let mut allowed = 0_usize;
        for i in 0..20_000_usize {
            let user = Principal::user(format!("u{}", i % 50));
            let topic = format!("topic-{}", i % 2_100);
            if a.authorize(&user, &host, Op::Read, Topic, &topic) {
                allowed += 1;
            }
            let team = format!("team-{}-x", i % 2_000);
            let _ = a.authorize(&user, &host, Op::Write, Topic, &team);
            let _ = a.authorize(&user, &host, Op::Read, Group, "g7-consumers");
        }
        assert!(allowed > 0);
        assert!(!a.authorize(&Principal::user("u13"), &host, Op::Read, Topic, "topic-13"));
        assert!(a.authorize(&Principal::user("u14"), &host, Op::Read, Topic, "topic-14"));
        assert!(a.authorize(
            &Principal::user("u14"),
            &host,
            Op::Describe,
            Topic,
            "topic-14"
        ));
        assert!(!a.authorize(&Principal::user("u15"), &host, Op::Read, Topic, "topic-14"));
        assert!(a.authorize(
            &Principal::user("u7"),
            &host,
            Op::Write,
            Topic,
            "team-7-orders"
        ));
        assert!(a.authorize(
            &Principal::user("x"),
            &host,
            Op::Read,
            Group,
            "g7-consumers"
        ));
        assert!(!a.authorize(
            &Principal::user("x"),
            &ip("10.0.0.8"),
            Op::Read,
            Group,
            "g7-c"
        ));
        assert!(a.authorize(&Principal::user("admin"), &host, Op::All, Topic, "topic-13"));
        assert!(a.authorize_by_resource_type(&Principal::user("u3"), &host, Op::Write, Topic));
        assert!(!a.authorize_by_resource_type(&Principal::user("nobody"), &host, Op::Write, Topic));
    }
}
