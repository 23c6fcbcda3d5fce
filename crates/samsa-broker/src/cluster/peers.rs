//! Where the other brokers' gRPC servers are (replication, transaction
//! markers), and one replica fetcher per other broker, kept in line with the
//! metadata as brokers join.
//!
//! A broker registers its gRPC address as an endpoint of the
//! [`INTER_NODE_LISTENER`] pseudo-listener, beside its Kafka listeners, as a
//! Kafka broker registers its inter-broker listener. Kafka clients never
//! see it: they are told the endpoints of the listener they connected to,
//! and no Kafka listener may take this name.
//!
//! Invariants: every voter has an address from the start (the static voter
//! list), so a cluster of voters replicates before any registration is
//! applied; a registered address replaces the voter list's; a node has
//! exactly one fetcher per other known broker, restarted only when that
//! broker's address changes and stopped when it is unregistered.

use std::collections::HashMap;
use std::sync::Arc;

use samsa_controller::records::BrokerEndpoint;
use samsa_controller::tls::InterNodeTls;
use samsa_controller::NodeId;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::PLAINTEXT;
use crate::metadata::MetadataView;
use crate::replication::fetcher::spawn_fetcher;
use crate::Broker;

/// The registered endpoint that carries a broker's gRPC address.
pub const INTER_NODE_LISTENER: &str = "INTER_NODE";

/// The [`INTER_NODE_LISTENER`] endpoint of `address` (`host:port`), speaking
/// TLS when the nodes do.
pub(super) fn inter_node_endpoint(address: &str, tls: bool) -> Option<BrokerEndpoint> {
    let (host, port) = address.rsplit_once(':')?;
    Some(BrokerEndpoint {
        name: INTER_NODE_LISTENER.to_owned(),
        host: host.to_owned(),
        port: port.parse().ok()?,
        security_protocol: if tls { "SSL" } else { PLAINTEXT }.to_owned(),
    })
}

/// Node id → gRPC address: the voters' from the static list, replaced or
/// added to by what each registered broker advertises.
pub fn peer_addresses(view: &MetadataView, voters: &[(NodeId, String)]) -> HashMap<i32, String> {
    let mut addresses: HashMap<i32, String> = voters
        .iter()
        .filter_map(|(id, addr)| Some((i32::try_from(*id).ok()?, addr.clone())))
        .collect();
    for broker in &view.brokers {
        if let Some(e) = broker.endpoint(INTER_NODE_LISTENER) {
            addresses.insert(broker.node_id, format!("{}:{}", e.host, e.port));
        }
    }
    addresses
}

/// Follows `views` until `stop`: one replica fetcher per other broker at its
/// current address, and the transaction service's addresses.
pub(super) async fn follow_peers(
    broker: Arc<Broker>,
    mut views: watch::Receiver<Arc<MetadataView>>,
    voters: Vec<(NodeId, String)>,
    tls: Option<InterNodeTls>,
    stop: watch::Receiver<bool>,
) {
    let me = broker.config.node_id;
    let mut fetchers = Fetchers::default();
    loop {
        let addresses = peer_addresses(&views.borrow_and_update(), &voters);
        fetchers.0.retain(|id, (_, task)| {
            let known = addresses.contains_key(id);
            if !known {
                tracing::info!(peer = *id, "broker unregistered: no longer following it");
                task.abort();
            }
            known
        });
        for (id, addr) in &addresses {
            if *id == me || fetchers.0.get(id).is_some_and(|(a, _)| a == addr) {
                continue;
            }
            tracing::info!(peer = *id, %addr, "following the partitions this broker leads");
            let task = spawn_fetcher(&broker, *id, addr.clone(), tls.as_ref(), &stop);
            if let Some((_, old)) = fetchers.0.insert(*id, (addr.clone(), task)) {
                old.abort();
            }
        }
        broker.txn.service.set_addresses(addresses);
        if views.changed().await.is_err() {
            return;
        }
    }
}

/// The running fetchers by leader id, with the address each follows;
/// stopped with their owner.
#[derive(Default)]
struct Fetchers(HashMap<i32, (String, JoinHandle<()>)>);

impl Drop for Fetchers {
    fn drop(&mut self) {
        for (_, task) in self.0.values() {
            task.abort();
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use crate::metadata::{BrokerInfo, KafkaEndpoint};

    fn broker(id: i32, inter_node: Option<&str>) -> BrokerInfo {
        let mut endpoints = vec![KafkaEndpoint {
            listener: "PLAINTEXT".into(),
            host: "k".into(),
            port: 9092,
        }];
        if let Some(addr) = inter_node {
            let e = inter_node_endpoint(addr, false).unwrap();
            endpoints.push(KafkaEndpoint {
                listener: e.name,
                host: e.host,
                port: i32::from(e.port),
            });
        }
        BrokerInfo {
            node_id: id,
            endpoints,
            rack: None,
            fenced: false,
        }
    }

    #[test]
    fn registered_addresses_add_to_and_replace_the_voter_list() {
        let voters = vec![(1, "v1:9093".to_owned()), (2, "v2:9093".to_owned())];
        let view = MetadataView::from_parts(
            1,
            "c".into(),
            1,
            vec![
                broker(1, None),
                broker(2, Some("v2-new:9193")),
                broker(4, Some("b4:9393")),
            ],
            std::iter::empty(),
        );
        let addresses = peer_addresses(&view, &voters);
        assert_eq!(addresses.len(), 3);
        assert_eq!(addresses[&1], "v1:9093");
        assert_eq!(addresses[&2], "v2-new:9193");
        assert_eq!(addresses[&4], "b4:9393");
        assert!(inter_node_endpoint("no-port", false).is_none());
        assert_eq!(
            inter_node_endpoint("[::1]:9093", true).unwrap().host,
            "[::1]"
        );
    }
}
