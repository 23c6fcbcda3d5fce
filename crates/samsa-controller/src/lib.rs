//! samsa's metadata controller: a KRaft-style quorum whose Raft log is the
//! cluster's metadata log.
//!
//! # Layers
//!
//! | module | owns |
//! |---|---|
//! | [`records`] | the metadata records (Raft commands) and their apply-time guards |
//! | [`image`] | [`MetadataImage`]: cluster metadata at one offset; pure, deterministic `apply` (brokers build their `MetadataView` from it) |
//! | [`logic`] | sans-IO controller handlers: `(image, request, now) -> (records, response)` |
//! | [`error`] | [`ControllerError`] and its Kafka errors (kafka-protocol's `ResponseError`, the broker's table) |
//! | [`store`] | sled-backed Raft log/vote/snapshot storage behind the [`store::RaftStore`] trait; openraft storage and state machine |
//! | [`network`] | Raft RPCs over gRPC (server and openraft client) |
//! | [`service`] | broker-facing gRPC service and the leader's write path |
//! | [`node`] | [`node::ControllerNode`]: wiring, start-up checks, periodic duties |
//! | [`quorum`] | the Raft leader's view of replication (term, high watermark, voters' log ends and answer times) for DescribeQuorum |
//! | [`client`] | [`client::ControllerClient`] and [`client::MetadataFollower`] for brokers and tools |
//! | [`convert`] | protobuf ⇄ domain conversions shared by service and client |
//!
//! # For the broker
//!
//! ```no_run
//! # async fn demo() -> Result<(), samsa_controller::ControllerError> {
//! use std::time::Duration;
//! use samsa_controller::client::{ControllerClient, MetadataFollower};
//! use samsa_controller::logic::{Heartbeat, RegisterBroker};
//!
//! let client = ControllerClient::new(["127.0.0.1:9093"], Duration::from_secs(30));
//! // (b) follow committed metadata from any controller
//! let metadata = MetadataFollower::spawn(client.clone(), 1);
//! // (a) register this process, then heartbeat every ~2 s with the applied offset
//! let epoch = client
//!     .register_broker(&RegisterBroker {
//!         broker_id: 1,
//!         incarnation_id: uuid::Uuid::new_v4(),
//!         cluster_id: None,
//!         endpoints: vec![],
//!         rack: None,
//!     })
//!     .await?
//!     .broker_epoch;
//! let reply = client
//!     .heartbeat(&Heartbeat {
//!         broker_id: 1,
//!         broker_epoch: epoch,
//!         metadata_offset: metadata.image().offset(),
//!         want_fence: false,
//!     })
//!     .await?;
//! # let _ = reply;
//! // (d) producer ids, 1000 at a time
//! let block = client.allocate_producer_ids(1, epoch).await?;
//! # let _ = block;
//! // on SIGTERM: hand over leaderships, then exit
//! client.controlled_shutdown(1, epoch).await?;
//! # Ok(()) }
//! ```
pub mod client;
pub mod convert;
pub mod error;
pub mod image;
pub mod logic;
pub mod network;
pub mod node;
pub mod quorum;
pub mod records;
pub mod service;
pub mod store;
pub mod tls;

pub use error::{ControllerError, LeaderHint};
pub use image::{BrokerRegistration, MetadataImage, PartitionState, TopicImage};
pub use records::{BrokerId, MetadataBatch, MetadataRecord, NO_LEADER};

/// Raft node id of a controller.
pub type NodeId = u64;

openraft::declare_raft_types!(
    /// openraft type configuration of the controller quorum: entries carry
    /// [`MetadataBatch`]es, applying one yields a [`store::ApplyOutcome`].
    pub TypeConfig:
        D = MetadataBatch,
        R = store::ApplyOutcome,
        NodeId = NodeId,
        Node = openraft::BasicNode,
        SnapshotData = std::io::Cursor<Vec<u8>>,
);
