//! Cluster mode: one process runs a controller of the metadata quorum and a
//! broker (combined mode), or a broker only (`process_roles = "broker"`, a
//! node that is not a voter and joins by registering), and the broker
//! follows the quorum's metadata.
//!
//! # What this module owns, file by file
//!
//! | file | holds |
//! |---|---|
//! | `settings.rs` | [`ClusterSettings`]: the validated cluster part of [`BrokerConfig`](crate::BrokerConfig) (static voters, this node among them or a broker only, timings) |
//! | `identity.rs` | the data directory's identity (`meta/cluster.json`, [`CLUSTER_FILE`]: cluster id and node id), which makes a node with another cluster's or node's data refuse to start |
//! | `view.rs` | [`metadata_view`]: the broker's view built from the controller's image |
//! | `store.rs` | [`QuorumMetadataStore`]: the [`MetadataStore`](crate::metadata::MetadataStore) whose image follows the committed metadata log and whose changes go through the active controller |
//! | `producer_ids.rs` | [`ControllerProducerIdBlockSource`]: producer-id blocks from the quorum |
//! | `lifecycle.rs` | registration, heartbeats (fencing), controlled shutdown |
//! | `controller.rs` | refusing a duplicate controller, starting the embedded one |
//! | `grpc.rs` | the node's gRPC port: controller, replication and transaction services |
//! | `node.rs` | [`run`]: the node from checks to shutdown (controller, gRPC, HTTP around the broker) |
//! | `broker.rs` | the broker's life as named steps: open, start up, replicate, get unfenced, serve, stop |
//! | `peers.rs` | the other brokers' gRPC addresses (the static voters, then each registration's `INTER_NODE` endpoint) and one replica fetcher per other broker, as brokers join |
//!
//! # Metadata flow
//!
//! ```text
//! controller quorum ──SubscribeMetadata──▶ MetadataFollower (controller image)
//!   (Raft log = metadata log)                     │ + Raft leader changes
//!                                                 ▼
//!                                   metadata_view() ─▶ MetadataView (watch)
//!                                                 │
//!                    ┌────────────────────────────┴──────────────┐
//!                    ▼                                           ▼
//!         Kafka handlers (Metadata, DescribeCluster,    applier: Broker::apply_image
//!         produce/fetch leadership checks)              (open logs, become leader /
//!                                                        stop serving, delete topics)
//! ```
//!
//! The follower prefers this node's own controller, so the broker's view is
//! exactly what this node's controller has committed. Two names, two things:
//! the controller's `MetadataImage` (its state, what the Raft log builds) and
//! the broker's `MetadataView` of it (what Kafka clients are told).
//!
//! # Start-up, in order
//!
//! 1. validate the settings (a combined node must be a voter, a broker-only
//!    node must not) and the data directory (no single-node data, no other
//!    node's or cluster's data);
//! 2. refuse to start if something already answers at this node's own
//!    controller address (the same `node_id` configured twice; a
//!    broker-only node's duplicate is refused at registration);
//! 3. bind the Kafka port (so a conflict fails fast), start the controller
//!    (a voter's);
//! 4. register with the active controller, retrying until
//!    `controller_startup_timeout_ms` (logging why it waits);
//! 5. wait until the local image contains the registration and the cluster
//!    id; record the cluster id in the data directory;
//! 6. apply the image (open hosted partitions), start heartbeating, wait to
//!    be unfenced, then accept Kafka connections.
//!
//! Every failure on the way is one clear [`BrokerError`](crate::BrokerError); nothing here panics
//! on peer input and no wait is unbounded. Each file's docs name the
//! invariants it keeps; the ones that span files are these:
//!
//! # Invariants
//!
//! - the broker serves produce/fetch/list-offsets only for partitions its
//!   applied image says it leads (see `apply`); when it cannot reach the
//!   quorum it keeps the leaderships it has (the controller fences it after
//!   `broker_session_timeout_ms` and moves them, which it learns on return),
//!   except those whose in-sync followers stopped fetching as long ago: it
//!   refuses to act on those (see [`crate::controller_contact`]);
//! - a metadata change answered as successful is committed by the quorum and
//!   (unless the wait for it timed out) visible in this broker's image;
//! - producer-id blocks come only from the quorum, which commits each block
//!   before handing it out, so no id is handed out twice cluster-wide.

mod broker;
mod controller;
mod grpc;
mod identity;
mod lifecycle;
mod node;
pub mod peers;
mod producer_ids;
mod settings;
mod store;
mod view;

pub use identity::{CLUSTER_FILE, SINGLE_NODE_FILE};
pub use node::run;
pub use producer_ids::ControllerProducerIdBlockSource;
pub use settings::ClusterSettings;
pub use store::QuorumMetadataStore;
pub use view::metadata_view;

/// The security protocol of every listener brokers register (TLS and
/// SASL are not served yet).
const PLAINTEXT: &str = "PLAINTEXT";
