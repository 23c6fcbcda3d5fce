//! The group coordinator, as a sans-IO state machine: the classic consumer
//! group protocol (JoinGroup, SyncGroup, Heartbeat, LeaveGroup, static
//! membership), committed offsets (OffsetCommit, OffsetFetch, OffsetDelete,
//! DeleteGroups) and offsets committed in transactions (TxnOffsetCommit).
//!
//! Group `g` is coordinated by the leader of partition
//! [`crate::coordinator::placement::coordinator_partition`]`(g, N)` of `__consumer_offsets`
//! (`N` = `offsets_topic_num_partitions`, default 50), the placement
//! function transactions use. That partition's records ([`records`]) hold
//! the group's committed offsets and its metadata after each rebalance.
//!
//! Nothing here does I/O, reads a clock or spawns a task, and nothing
//! speaks the wire: requests and replies are the plain structs of [`api`],
//! converted from and to `kafka-protocol` messages by `crate::handlers`.
//! The runtime ([`service`] on the shared
//! [`crate::coordinator::runtime::Runtime`]) feeds requests and time in and
//! carries replies and writes out:
//!
//! ```text
//!   request + Token ─▶ handler(&mut coordinator, token, request, now_ms) ─▶ GroupStep { deliveries, writes }
//!   tick(now_ms)    ─▶ GroupStep                     next_deadline() ─▶ when to tick again
//!   each write: append to __consumer_offsets-w.partition (acks=all), then
//!               complete_write(w.id, result, now_ms) ─▶ GroupStep
//!   each delivery (token, reply): answer the request waiting under that token
//! ```
//!
//! A request may wait (parked): a JoinGroup until the join phase completes,
//! a SyncGroup until the leader's assignment is durable, an OffsetCommit
//! until its offsets are. The runtime gives every request a fresh [`Token`]
//! and answers it when a [`GroupStep`] delivers a [`Reply`] to that token —
//! possibly from another request's call or from `tick`.
//!
//! # Durability
//!
//! Membership is soft state (Kafka's too): it changes in memory at once,
//! and is written as group metadata when a generation completes (the
//! leader's assignment; an empty group). Committed offsets become visible
//! only once their record is durable, and a SyncGroup is answered only once
//! the assignment is. Offsets written in a transaction become visible only
//! when the producer's COMMIT marker reaches the offsets partition
//! ([`GroupCoordinator::complete_transaction`]); replay resolves them by the
//! markers in the log.
//!
//! # The runtime's side of the contract
//!
//! 1. Calls are serialized (a mutex; every call is short).
//! 2. Writes: append [`Write::records`](crate::coordinator::Write) to the partition as its leader
//!    at leader epoch `coordinator_epoch`, acks=all; a
//!    `transactional` write as a transactional batch of that
//!    producer (verified with, or added to, its transaction first). Then
//!    [`complete_write`](crate::coordinator::Coordinator::complete_write).
//! 3. Timers: call [`tick`](crate::coordinator::Coordinator::tick) at
//!    [`next_deadline`](crate::coordinator::Coordinator::next_deadline) (and after any call, which may
//!    move it).
//! 4. Leadership: on leading `__consumer_offsets`-`p` at epoch `e`,
//!    [`begin_loading`](crate::coordinator::Coordinator::begin_loading), replay the partition from its
//!    start to its log end with [`records::replay`] (data records and
//!    markers in order), then [`finish_loading`](crate::coordinator::Coordinator::finish_loading); on
//!    losing it, [`unload`](crate::coordinator::Coordinator::unload). Meanwhile the groups answer
//!    COORDINATOR_LOAD_IN_PROGRESS, and NOT_COORDINATOR when not held
//!    (unless [`set_led_by_image`](crate::coordinator::Coordinator::set_led_by_image) says the metadata
//!    image has it led here: its load is about to begin, so
//!    COORDINATOR_LOAD_IN_PROGRESS).
//! 5. Markers: when a COMMIT/ABORT marker is appended to an offsets
//!    partition this broker coordinates, call
//!    [`GroupCoordinator::complete_transaction`].

pub mod api;
mod coordinator;
pub mod records;
pub mod service;

#[cfg(test)]
mod tests;

pub use api::{
    ClientInfo, CommitPartition, CommitRequest, FetchedOffset, GroupDescription, GroupFigures,
    GroupListing, HeartbeatRequest, HeartbeatResponse, JoinGroupMember, JoinGroupRequest,
    JoinGroupResponse, LeaveGroupRequest, LeaveGroupResponse, LeavingMember, LeftMember,
    MemberDescription, PartitionResult, SyncGroupRequest, SyncGroupResponse,
};
pub use coordinator::{GroupConfig, GroupCoordinator, GroupStep, Reply, Token};
pub use records::OffsetAndMetadata;
pub use service::GroupRuntime;

/// The state of a classic group.
///
/// | From | Event | To |
/// |---|---|---|
/// | Empty | a member joins | PreparingRebalance (after `group.initial.rebalance.delay.ms`, extended while members keep joining, up to the rebalance timeout) |
/// | PreparingRebalance | every member rejoined, or the rebalance timeout passed (members that did not rejoin are removed) | CompletingRebalance (next generation; the leader gets the members) |
/// | PreparingRebalance | the join phase ends with no members | Empty (next generation, stored) |
/// | CompletingRebalance | the leader's SyncGroup is durable | Stable (members get their assignment) |
/// | CompletingRebalance | a member joins, leaves, changes protocols or expires; a member sent no SyncGroup within the rebalance timeout | PreparingRebalance (waiting SyncGroups get REBALANCE_IN_PROGRESS) |
/// | Stable | a member joins, leaves, expires, changes protocols, or the leader rejoins | PreparingRebalance |
/// | Stable | a static member rejoins with its protocols unchanged | Stable (new member id, old one fenced) |
/// | Empty | DeleteGroups (durable) | Dead (removed) |
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum GroupState {
    Empty,
    PreparingRebalance,
    CompletingRebalance,
    Stable,
    Dead,
}

impl GroupState {
    /// Kafka's name of the state (DescribeGroups, ListGroups).
    pub fn name(self) -> &'static str {
        match self {
            GroupState::Empty => "Empty",
            GroupState::PreparingRebalance => "PreparingRebalance",
            GroupState::CompletingRebalance => "CompletingRebalance",
            GroupState::Stable => "Stable",
            GroupState::Dead => "Dead",
        }
    }

    /// The transitions of the table above.
    pub fn can_transition_to(self, to: GroupState) -> bool {
        use GroupState::*;
        matches!(
            (self, to),
            (Empty, PreparingRebalance)
                | (PreparingRebalance, CompletingRebalance)
                | (PreparingRebalance, Empty)
                | (PreparingRebalance, PreparingRebalance)
                | (CompletingRebalance, Stable)
                | (CompletingRebalance, PreparingRebalance)
                | (Stable, PreparingRebalance)
                | (Stable, Stable)
                | (Empty, Dead)
                | (Empty, Empty)
        )
    }
}
