//! [`ClusterSettings`]: the cluster part of a [`BrokerConfig`], validated
//! once at start-up.
//!
//! Invariants a `ClusterSettings` keeps (so later code never checks them
//! again): a combined node (`process_roles = "broker,controller"`) is one of
//! the static voters and its `controller_listen` uses the port of its voter
//! address; a broker-only node is not a voter and has an address other nodes
//! can reach its gRPC server at; every timing is positive; the broker
//! session outlives several heartbeats and the Raft election timeout several
//! Raft heartbeats. Every refusal names the key and what would fix it.

use std::collections::BTreeSet;
use std::time::Duration;

use samsa_controller::node::parse_voters;
use samsa_controller::tls::InterNodeTls;
use samsa_controller::NodeId;

use crate::error::BrokerError;
use crate::BrokerConfig;

/// The cluster part of a [`BrokerConfig`], validated.
#[derive(Debug, Clone)]
pub struct ClusterSettings {
    pub node_id: i32,
    /// Static voter set, by node id.
    pub voters: Vec<(NodeId, String)>,
    /// The gRPC address other nodes reach this node at: its voter address,
    /// or `inter_node_advertised_address`.
    pub own_address: String,
    pub heartbeat_interval: Duration,
    pub session_timeout: Duration,
    pub request_timeout: Duration,
    pub startup_timeout: Duration,
    /// Mutual TLS on the gRPC port and to every peer (`inter_node_tls_*`).
    pub inter_node_tls: Option<InterNodeTls>,
}

pub(super) fn config_error(message: String) -> BrokerError {
    BrokerError::Config(message)
}

fn port_of(addr: &str) -> Option<u16> {
    addr.rsplit_once(':').and_then(|(_, p)| p.parse().ok())
}

/// The broker and Raft timings of a [`ClusterSettings`].
struct Timings {
    heartbeat_interval: Duration,
    session_timeout: Duration,
    request_timeout: Duration,
    startup_timeout: Duration,
}

impl ClusterSettings {
    /// Validates the cluster settings of `config`; every error names the key
    /// and what would fix it.
    pub fn from_config(config: &BrokerConfig) -> Result<Self, BrokerError> {
        let (voters, own_address) = own_role(config)?;
        let timings = timings(config)?;
        if config.producer_id_block_size <= 0 {
            return Err(config_error(
                "producer_id_block_size must be positive".into(),
            ));
        }
        if config.metadata_snapshot_interval_entries == 0 {
            return Err(config_error(
                "metadata_snapshot_interval_entries must be positive".into(),
            ));
        }
        let inter_node_tls = match (
            &config.inter_node_tls_cert_file,
            &config.inter_node_tls_key_file,
            &config.inter_node_tls_ca_file,
        ) {
            (None, None, None) => None,
            (Some(cert), Some(key), Some(ca)) => Some(
                InterNodeTls::load(cert, key, ca)
                    .map_err(|e| config_error(format!("inter_node_tls_*: {e}")))?,
            ),
            _ => {
                return Err(config_error(
                    "inter_node_tls_cert_file, inter_node_tls_key_file and \
                     inter_node_tls_ca_file go together: set all three (mutual TLS \
                     between nodes) or none"
                        .into(),
                ))
            }
        };
        Ok(Self {
            node_id: config.node_id,
            voters,
            own_address,
            inter_node_tls,
            heartbeat_interval: timings.heartbeat_interval,
            session_timeout: timings.session_timeout,
            request_timeout: timings.request_timeout,
            startup_timeout: timings.startup_timeout,
        })
    }

    /// Controller addresses, this node's own first when it is a voter (it is
    /// always up to date with what this node committed, and local).
    pub fn endpoints(&self) -> Vec<String> {
        let own = self.own_voter_address();
        let mut endpoints: Vec<String> = own.iter().cloned().collect();
        endpoints.extend(
            self.voters
                .iter()
                .filter(|(_, addr)| Some(addr) != own.as_ref())
                .map(|(_, addr)| addr.clone()),
        );
        endpoints
    }

    /// Whether this node is one of the voters and runs a controller
    /// (`process_roles` `broker,controller`, validated against the voter
    /// list); otherwise it is a broker only.
    pub fn is_controller(&self) -> bool {
        self.own_voter_address().is_some()
    }

    /// This node's address in the voter list, if it is a voter.
    pub fn own_voter_address(&self) -> Option<String> {
        let me = NodeId::try_from(self.node_id).ok()?;
        self.voters
            .iter()
            .find(|(id, _)| *id == me)
            .map(|(_, addr)| addr.clone())
    }

    pub(super) fn voters_text(&self) -> String {
        self.voters
            .iter()
            .map(|(id, addr)| format!("{id}@{addr}"))
            .collect::<Vec<_>>()
            .join(",")
    }

    pub(super) fn majority(&self) -> usize {
        self.voters.len() / 2 + 1
    }
}

/// The voter set and the gRPC address other nodes reach this node at. A combined node must be a voter and listen on
/// its voter address's port; a broker-only node must not be a voter, and
/// needs an address it can be reached at.
fn own_role(config: &BrokerConfig) -> Result<(Vec<(NodeId, String)>, String), BrokerError> {
    let text = config
        .controller_quorum_voters
        .as_deref()
        .ok_or_else(|| config_error("controller_quorum_voters is not set".into()))?;
    let voters =
        parse_voters(text).map_err(|e| config_error(format!("controller_quorum_voters: {e}")))?;
    let node = NodeId::try_from(config.node_id)
        .map_err(|_| config_error(format!("node_id {} is negative", config.node_id)))?;
    let voter_address = voters
        .iter()
        .find(|(id, _)| *id == node)
        .map(|(_, addr)| addr.clone());
    let controller = parse_roles(&config.process_roles, voter_address.is_some())?;
    let own_address = match (controller, voter_address) {
        (true, None) => {
            return Err(config_error(format!(
                "node_id {} is not in controller_quorum_voters {text:?}: a node with \
                 process_roles \"broker,controller\" runs a controller, so its node_id must be \
                 one of the voters (a node that is only a broker sets process_roles = \"broker\")",
                config.node_id
            )))
        }
        (false, Some(_)) => {
            return Err(config_error(format!(
                "node_id {} is a voter in controller_quorum_voters {text:?} but process_roles is \
                 \"broker\": a voter runs its controller (process_roles = \"broker,controller\"), \
                 and a broker-only node needs a node_id of its own",
                config.node_id
            )))
        }
        (true, Some(own)) => {
            if port_of(&own) != Some(config.controller_listen.port()) {
                return Err(config_error(format!(
                    "controller_listen {} does not use the port of this node's voter address \
                     {own}; other controllers reach node {} there, so set controller_listen \
                     to that port",
                    config.controller_listen, config.node_id
                )));
            }
            config.inter_node_advertised_address.clone().unwrap_or(own)
        }
        (false, None) => match &config.inter_node_advertised_address {
            Some(addr) => addr.clone(),
            None if config.controller_listen.ip().is_unspecified() => {
                return Err(config_error(format!(
                    "inter_node_advertised_address is not set and controller_listen {} is a \
                     wildcard address: other nodes need an address to replicate from this \
                     broker-only node; set inter_node_advertised_address = \"HOST:{}\"",
                    config.controller_listen,
                    config.controller_listen.port()
                )))
            }
            None => config.controller_listen.to_string(),
        },
    };
    if port_of(&own_address).is_none() {
        return Err(config_error(format!(
            "inter_node_advertised_address {own_address:?} is not HOST:PORT"
        )));
    }
    Ok((voters, own_address))
}

/// The `process_roles` value that takes the role from the voter list.
pub const ROLES_FROM_VOTERS: &str = "from-voters";

/// `process_roles`: whether this node runs a controller. `from-voters`
/// (for a StatefulSet whose pods share one configuration): a voter runs
/// its controller, any other node is a broker only.
fn parse_roles(text: &str, is_voter: bool) -> Result<bool, BrokerError> {
    if text.trim() == ROLES_FROM_VOTERS {
        return Ok(is_voter);
    }
    let roles: BTreeSet<&str> = text
        .split(',')
        .map(str::trim)
        .filter(|r| !r.is_empty())
        .collect();
    match roles.into_iter().collect::<Vec<_>>().as_slice() {
        ["broker", "controller"] => Ok(true),
        ["broker"] => Ok(false),
        _ => Err(config_error(format!(
            "process_roles {text:?}: samsa runs \"broker,controller\" (a voter, the default), \
             \"broker\" (a broker only) or \"{ROLES_FROM_VOTERS}\" (whichever of the two the \
             voter list makes this node); a controller-only node is not supported"
        ))),
    }
}

/// The broker and Raft timings: all positive, a session longer than a
/// heartbeat, an election timeout longer than a Raft heartbeat.
fn timings(config: &BrokerConfig) -> Result<Timings, BrokerError> {
    let positive = |key: &str, value: u64| {
        if value == 0 {
            Err(config_error(format!("{key} must be positive")))
        } else {
            Ok(Duration::from_millis(value))
        }
    };
    let timings = Timings {
        heartbeat_interval: positive(
            "broker_heartbeat_interval_ms",
            config.broker_heartbeat_interval_ms,
        )?,
        session_timeout: positive(
            "broker_session_timeout_ms",
            config.broker_session_timeout_ms,
        )?,
        request_timeout: positive(
            "controller_request_timeout_ms",
            config.controller_request_timeout_ms,
        )?,
        startup_timeout: positive(
            "controller_startup_timeout_ms",
            config.controller_startup_timeout_ms,
        )?,
    };
    positive(
        "controller_quorum_election_timeout_ms",
        config.controller_quorum_election_timeout_ms,
    )?;
    positive(
        "controller_quorum_heartbeat_interval_ms",
        config.controller_quorum_heartbeat_interval_ms,
    )?;
    if timings.session_timeout <= timings.heartbeat_interval {
        return Err(config_error(format!(
            "broker_session_timeout_ms ({}) must be larger than broker_heartbeat_interval_ms ({})",
            config.broker_session_timeout_ms, config.broker_heartbeat_interval_ms
        )));
    }
    if config.controller_quorum_heartbeat_interval_ms
        >= config.controller_quorum_election_timeout_ms
    {
        return Err(config_error(format!(
            "controller_quorum_heartbeat_interval_ms ({}) must be smaller than \
             controller_quorum_election_timeout_ms ({})",
            config.controller_quorum_heartbeat_interval_ms,
            config.controller_quorum_election_timeout_ms
        )));
    }
    Ok(timings)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    fn config(voters: &str, node_id: i32, port: u16) -> BrokerConfig {
        BrokerConfig {
            node_id,
            controller_quorum_voters: Some(voters.into()),
            controller_listen: std::net::SocketAddr::from(([127, 0, 0, 1], port)),
            ..BrokerConfig::default()
        }
    }

    #[test]
    fn settings_reject_bad_voter_lists() {
        let ok = ClusterSettings::from_config(&config(
            "1@127.0.0.1:9093,2@127.0.0.1:9193,3@127.0.0.1:9293",
            2,
            9193,
        ))
        .unwrap();
        assert_eq!(ok.own_address, "127.0.0.1:9193");
        assert_eq!(ok.endpoints()[0], "127.0.0.1:9193");
        assert_eq!(ok.majority(), 2);

        let not_a_voter =
            ClusterSettings::from_config(&config("1@h:9093,2@h:9193", 3, 9093)).unwrap_err();
        assert!(
            not_a_voter
                .to_string()
                .contains("not in controller_quorum_voters"),
            "{not_a_voter}"
        );
        let duplicate =
            ClusterSettings::from_config(&config("1@h:9093,1@h:9193", 1, 9093)).unwrap_err();
        assert!(
            duplicate.to_string().contains("appears twice"),
            "{duplicate}"
        );
        let wrong_port =
            ClusterSettings::from_config(&config("1@h:9093,2@h:9193", 2, 9093)).unwrap_err();
        assert!(
            wrong_port.to_string().contains("controller_listen"),
            "{wrong_port}"
        );
        let roles = |voters: &str, node_id: i32, roles: &str, advertised: Option<&str>| {
            let mut c = config(voters, node_id, 9393);
            c.process_roles = roles.into();
            c.inter_node_advertised_address = advertised.map(str::to_owned);
            ClusterSettings::from_config(&c)
        };
        let broker_only = roles("1@h:9093,2@h:9193", 4, "broker", None).unwrap();
        assert!(!broker_only.is_controller());
        assert_eq!(broker_only.own_address, "127.0.0.1:9393");
        assert_eq!(broker_only.endpoints(), ["h:9093", "h:9193"]);
        let advertised = roles("1@h:9093", 4, " broker ", Some("b4:9393")).unwrap();
        assert_eq!(advertised.own_address, "b4:9393");
        let voter_as_broker = roles("1@h:9093,2@h:9193", 2, "broker", None).unwrap_err();
        assert!(
            voter_as_broker.to_string().contains("is a voter"),
            "{voter_as_broker}"
        );
        assert!(roles("1@h:9093", 4, "controller", None).is_err());
        assert!(!roles("1@h:9093", 4, "from-voters", None)
            .unwrap()
            .is_controller());
        assert!(roles("1@h:9093,4@h:9393", 4, "from-voters", None)
            .unwrap()
            .is_controller());
        assert!(roles("1@h:9093", 4, "broker", Some("no-port")).is_err());
        let mut wildcard = config("1@h:9093", 4, 9393);
        wildcard.process_roles = "broker".into();
        wildcard.controller_listen = std::net::SocketAddr::from(([0, 0, 0, 0], 9393));
        let wildcard = ClusterSettings::from_config(&wildcard).unwrap_err();
        assert!(
            wildcard
                .to_string()
                .contains("inter_node_advertised_address"),
            "{wildcard}"
        );

        let mut bad_timing = config("1@h:9093", 1, 9093);
        bad_timing.broker_session_timeout_ms = 1_000;
        bad_timing.broker_heartbeat_interval_ms = 2_000;
        assert!(ClusterSettings::from_config(&bad_timing).is_err());
    }
}
