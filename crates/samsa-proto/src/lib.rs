//! Generated code for samsa's internal gRPC services, and nothing else.
//!
//! The sources are the `.proto` files in `proto/` at the workspace root;
//! `build.rs` compiles them with `protox` (no system `protoc`) and
//! `tonic-prost-build`.
//!
//! - [`raft`]: Raft transport between controllers (`samsa.raft.v1`).
//! - [`controller`]: the broker-facing controller API (`samsa.controller.v1`).
//! - [`replication`]: follower ⇄ leader partition replication (`samsa.replication.v1`).
//! - [`txn`]: transaction markers and KIP-890 verification between brokers (`samsa.txn.v1`).

/// `samsa.raft.v1`: Raft RPCs between controllers.
pub mod raft {
    #![allow(clippy::all, missing_docs)]
    tonic::include_proto!("samsa.raft.v1");
}

/// `samsa.controller.v1`: broker registration, heartbeats, metadata
/// subscription, producer-id blocks, topic admin and partition changes.
pub mod controller {
    #![allow(clippy::all, missing_docs)]
    tonic::include_proto!("samsa.controller.v1");
}

/// `samsa.replication.v1`: followers fetching partition data from leaders.
pub mod replication {
    #![allow(clippy::all, missing_docs)]
    tonic::include_proto!("samsa.replication.v1");
}

/// `samsa.txn.v1`: coordinator → partition leader markers, partition leader
/// → coordinator verification.
pub mod txn {
    #![allow(clippy::all, missing_docs)]
    tonic::include_proto!("samsa.txn.v1");
}
