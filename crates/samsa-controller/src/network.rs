//! Raft transport over gRPC: the server side of `samsa.raft.v1.RaftService`
//! and openraft's `RaftNetworkFactory` client.
//!
//! openraft's request and response types travel as serde_json inside
//! `RaftRequest` / `RaftReply` (see `proto/raft.proto`). The reply carries the
//! receiving node's `Result`, so a Raft-level refusal (e.g. a higher vote)
//! reaches openraft as a `RemoteError`, while transport failures become
//! `Unreachable` (openraft backs off) or `Network` errors.
//!
//! The client side tells the [`ReplicationClock`] about every successful
//! AppendEntries answer (the times DescribeQuorum reports).
//!
//! [`peer_connections`] is how every inter-node gRPC server of a node (this
//! one, and the broker's port that carries it with replication) accepts
//! connections.
//!
//! Cluster identity: every request carries the sender's cluster id when it
//! knows it. A receiver that knows a *different* one refuses the call with
//! `FAILED_PRECONDITION`, so a node started on another cluster's data cannot
//! vote or replicate here.

use std::sync::Arc;
use std::time::Duration;

use crate::tls::{peer_endpoint, InterNodeTls};
use openraft::error::{
    InstallSnapshotError, NetworkError, RPCError, RaftError, RemoteError, Unreachable,
};
use openraft::network::{RPCOption, RaftNetwork, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    VoteRequest, VoteResponse,
};
use openraft::{BasicNode, Raft};
use samsa_proto::raft::raft_service_client::RaftServiceClient;
use samsa_proto::raft::raft_service_server::RaftService;
use samsa_proto::raft::{RaftReply, RaftRequest};
use serde::de::DeserializeOwned;
use serde::Serialize;
use tokio::sync::watch;
use tonic::transport::Channel;
use tonic::{Request, Response, Status};

use crate::quorum::ReplicationClock;
use crate::{NodeId, TypeConfig};

/// Largest gRPC message the controller accepts (snapshot chunks are JSON).
pub const MAX_MESSAGE_BYTES: usize = 32 * 1024 * 1024;

/// Checks the caller's cluster id against ours; `Err` if both are known and differ.
fn check_cluster(ours: Option<&str>, theirs: &str, from: NodeId) -> Result<(), Status> {
    match ours {
        Some(ours) if !theirs.is_empty() && ours != theirs => {
            tracing::warn!(from, theirs, ours, "refusing raft rpc from another cluster");
            Err(Status::failed_precondition(format!(
                "cluster id mismatch: this node belongs to cluster {ours}, node {from} to {theirs}"
            )))
        }
        _ => Ok(()),
    }
}

fn decode<T: DeserializeOwned>(payload: &[u8]) -> Result<T, Status> {
    serde_json::from_slice(payload)
        .map_err(|e| Status::invalid_argument(format!("bad raft payload: {e}")))
}

fn encode_reply<T: Serialize>(value: &T) -> Result<Response<RaftReply>, Status> {
    let payload = serde_json::to_vec(value).map_err(|e| Status::internal(e.to_string()))?;
    Ok(Response::new(RaftReply { payload }))
}

/// Serves Raft RPCs from peers into the local [`Raft`].
pub struct RaftRpcServer {
    raft: Raft<TypeConfig>,
    cluster_id: watch::Receiver<Option<String>>,
    /// False while this node may not take part in the quorum (an empty
    /// store whose fate is not decided yet, see `node.rs`): every Raft RPC
    /// is refused, so it neither votes nor acknowledges entries.
    participating: watch::Receiver<bool>,
}

impl RaftRpcServer {
    pub fn new(
        raft: Raft<TypeConfig>,
        cluster_id: watch::Receiver<Option<String>>,
        participating: watch::Receiver<bool>,
    ) -> Self {
        Self {
            raft,
            cluster_id,
            participating,
        }
    }

    fn accept(&self, request: Request<RaftRequest>) -> Result<RaftRequest, Status> {
        if !*self.participating.borrow() {
            return Err(Status::unavailable(
                "this controller started on an empty store and has not yet learned whether                  the quorum is new; it takes no part in it until then",
            ));
        }
        let req = request.into_inner();
        check_cluster(
            self.cluster_id.borrow().as_deref(),
            &req.cluster_id,
            req.from_node,
        )?;
        Ok(req)
    }
}

#[tonic::async_trait]
impl RaftService for RaftRpcServer {
    async fn append_entries(
        &self,
        request: Request<RaftRequest>,
    ) -> Result<Response<RaftReply>, Status> {
        let req = self.accept(request)?;
        let rpc: AppendEntriesRequest<TypeConfig> = decode(&req.payload)?;
        let result = self.raft.append_entries(rpc).await;
        encode_reply(&result)
    }

    async fn vote(&self, request: Request<RaftRequest>) -> Result<Response<RaftReply>, Status> {
        let req = self.accept(request)?;
        let rpc: VoteRequest<NodeId> = decode(&req.payload)?;
        let result = self.raft.vote(rpc).await;
        encode_reply(&result)
    }

    async fn install_snapshot(
        &self,
        request: Request<RaftRequest>,
    ) -> Result<Response<RaftReply>, Status> {
        let req = self.accept(request)?;
        let rpc: InstallSnapshotRequest<TypeConfig> = decode(&req.payload)?;
        let result = self.raft.install_snapshot(rpc).await;
        encode_reply(&result)
    }
}

/// Creates [`GrpcNetwork`] clients for openraft.
#[derive(Clone)]
pub struct GrpcNetworkFactory {
    node_id: NodeId,
    cluster_id: watch::Receiver<Option<String>>,
    clock: Arc<ReplicationClock>,
    tls: Option<InterNodeTls>,
}

impl GrpcNetworkFactory {
    pub fn new(
        node_id: NodeId,
        cluster_id: watch::Receiver<Option<String>>,
        clock: Arc<ReplicationClock>,
        tls: Option<InterNodeTls>,
    ) -> Self {
        Self {
            node_id,
            cluster_id,
            clock,
            tls,
        }
    }
}

impl RaftNetworkFactory<TypeConfig> for GrpcNetworkFactory {
    type Network = GrpcNetwork;

    async fn new_client(&mut self, target: NodeId, node: &BasicNode) -> GrpcNetwork {
        GrpcNetwork {
            from: self.node_id,
            target,
            addr: node.addr.clone(),
            cluster_id: self.cluster_id.clone(),
            client: None,
            clock: Arc::clone(&self.clock),
            tls: self.tls.clone(),
        }
    }
}

/// A connection to one peer (lazily connected, reconnects on its own).
pub struct GrpcNetwork {
    from: NodeId,
    target: NodeId,
    addr: String,
    cluster_id: watch::Receiver<Option<String>>,
    client: Option<RaftServiceClient<Channel>>,
    clock: Arc<ReplicationClock>,
    tls: Option<InterNodeTls>,
}

#[derive(Clone, Copy)]
enum Method {
    AppendEntries,
    Vote,
    InstallSnapshot,
}

/// The connections an inter-node gRPC server accepts: without Nagle delay
/// (the builder's `tcp_nodelay` does not reach a caller-supplied listener),
/// and with TCP keepalive. A peer's connection whose FIN or RST was lost in a
/// partition (often one its client gave up on before sending the HTTP/2
/// preface) would otherwise stay open on this side until the process ends,
/// and the server's graceful stop waits for every open connection.
pub fn peer_connections(
    listener: tokio::net::TcpListener,
) -> tonic::transport::server::TcpIncoming {
    tonic::transport::server::TcpIncoming::from(listener)
        .with_nodelay(Some(true))
        // A live peer answers the first probe; one that forgot the
        // connection answers with a reset, one cut off not at all: closed
        // within 5 + 3 × 2 s.
        .with_keepalive(Some(Duration::from_secs(5)))
        .with_keepalive_interval(Some(Duration::from_secs(2)))
        .with_keepalive_retries(Some(3))
}

/// Builds a lazily connecting channel to `host:port` (over mutual TLS
/// when `tls` is set).
pub(crate) fn lazy_channel(
    addr: &str,
    tls: Option<&InterNodeTls>,
) -> Result<Channel, tonic::transport::Error> {
    Ok(peer_endpoint(addr, tls)?
        // A peer that is cut off or paused keeps the connection open; these
        // pings find out within seconds, so streams (metadata subscriptions)
        // and calls on it fail and move to another node instead of hanging.
        .http2_keep_alive_interval(Duration::from_secs(2))
        .keep_alive_timeout(Duration::from_secs(3))
        .keep_alive_while_idle(true)
        // A peer host that is gone (not just its process) never answers
        // the SYN: give up soon and try another controller.
        .connect_timeout(Duration::from_secs(2))
        .connect_lazy())
}

type RpcResult<T, E> = Result<T, RPCError<NodeId, BasicNode, RaftError<NodeId, E>>>;

impl GrpcNetwork {
    fn client(&mut self) -> Result<RaftServiceClient<Channel>, tonic::transport::Error> {
        if let Some(client) = &self.client {
            return Ok(client.clone());
        }
        let client = RaftServiceClient::new(lazy_channel(&self.addr, self.tls.as_ref())?)
            .max_decoding_message_size(MAX_MESSAGE_BYTES)
            .max_encoding_message_size(MAX_MESSAGE_BYTES);
        self.client = Some(client.clone());
        Ok(client)
    }

    async fn call<Req, Resp, E>(
        &mut self,
        method: Method,
        req: &Req,
        option: &RPCOption,
    ) -> RpcResult<Resp, E>
    where
        Req: Serialize,
        Resp: DeserializeOwned,
        E: std::error::Error + DeserializeOwned,
    {
        let payload =
            serde_json::to_vec(req).map_err(|e| RPCError::Network(NetworkError::new(&e)))?;
        let mut client = self
            .client()
            .map_err(|e| RPCError::Unreachable(Unreachable::new(&e)))?;
        let mut request = Request::new(RaftRequest {
            payload,
            cluster_id: self.cluster_id.borrow().clone().unwrap_or_default(),
            from_node: self.from,
        });
        request.set_timeout(option.hard_ttl());
        let reply = match method {
            Method::AppendEntries => client.append_entries(request).await,
            Method::Vote => client.vote(request).await,
            Method::InstallSnapshot => client.install_snapshot(request).await,
        };
        let reply = reply.map_err(|status| {
            tracing::debug!(target_node = self.target, %status, "raft rpc failed");
            match status.code() {
                tonic::Code::Unavailable | tonic::Code::FailedPrecondition => {
                    RPCError::Unreachable(Unreachable::new(&status))
                }
                _ => RPCError::Network(NetworkError::new(&status)),
            }
        })?;
        let result: Result<Resp, RaftError<NodeId, E>> =
            serde_json::from_slice(&reply.into_inner().payload)
                .map_err(|e| RPCError::Network(NetworkError::new(&e)))?;
        result.map_err(|e| RPCError::RemoteError(RemoteError::new(self.target, e)))
    }
}

impl RaftNetwork<TypeConfig> for GrpcNetwork {
    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> RpcResult<AppendEntriesResponse<NodeId>, openraft::error::Infallible> {
        let term = rpc.vote.leader_id().get_term();
        // What the target holds once it accepts this request.
        let sent_end = rpc
            .entries
            .last()
            .map(|e| e.log_id.index)
            .or(rpc.prev_log_id.map(|l| l.index));
        let result = self.call(Method::AppendEntries, &rpc, &option).await;
        let held = match &result {
            Ok(AppendEntriesResponse::Success) => Some(sent_end),
            Ok(AppendEntriesResponse::PartialSuccess(matched)) => Some(matched.map(|l| l.index)),
            _ => None,
        };
        if let Some(held) = held {
            let end = held.map_or(0, |i| i64::try_from(i).map_or(i64::MAX, |i| i + 1));
            self.clock.record_answer(self.target, term, end);
        }
        result
    }

    async fn install_snapshot(
        &mut self,
        rpc: InstallSnapshotRequest<TypeConfig>,
        option: RPCOption,
    ) -> RpcResult<InstallSnapshotResponse<NodeId>, InstallSnapshotError> {
        self.call(Method::InstallSnapshot, &rpc, &option).await
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<NodeId>,
        option: RPCOption,
    ) -> RpcResult<VoteResponse<NodeId>, openraft::error::Infallible> {
        self.call(Method::Vote, &rpc, &option).await
    }
}

#[cfg(test)]
mod tests {
    use super::check_cluster;

    #[test]
    fn cluster_ids_must_match_when_both_are_known() {
        assert!(check_cluster(None, "a", 1).is_ok());
        assert!(check_cluster(Some("a"), "", 1).is_ok());
        assert!(check_cluster(Some("a"), "a", 1).is_ok());
        let err = check_cluster(Some("a"), "b", 2).err();
        assert_eq!(err.map(|s| s.code()), Some(tonic::Code::FailedPrecondition));
    }
}
