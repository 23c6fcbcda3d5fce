//! `samsa.txn.v1.TxnService` (`proto/txn.proto`), served on the node's
//! internal gRPC port: markers from other brokers' coordinators to the
//! partitions this broker leads, and KIP-890 verification requests from
//! other brokers' partition leaders to this broker's coordinator. Both
//! answer exactly what the local calls answer.

use std::sync::{Arc, OnceLock};

use samsa_proto::txn::txn_service_server::TxnService;
use samsa_proto::txn::{
    AddPartitionsToTxnRequest, AddPartitionsToTxnResponse, PartitionResult, WriteTxnMarkersRequest,
    WriteTxnMarkersResponse,
};
use samsa_storage::EndTxnMarker;
use tonic::{Request, Response, Status};
use tracing::Instrument;

use super::markers::write_markers;
use super::verify::add_partitions_local;
use crate::error::grpc_error_code;
use crate::topic_partition::TopicPartition;
use crate::trace::served_span;
use crate::Broker;

/// The service; answers UNAVAILABLE until the broker is attached (the gRPC
/// server starts with the controller, before the broker is open).
#[derive(Clone, Default)]
pub struct TxnGrpc {
    broker: Arc<OnceLock<Arc<Broker>>>,
}

impl TxnGrpc {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn attach(&self, broker: Arc<Broker>) {
        let _ = self.broker.set(broker);
    }

    fn broker(&self) -> Result<Arc<Broker>, Status> {
        self.broker
            .get()
            .cloned()
            .ok_or_else(|| Status::unavailable("the broker is starting"))
    }
}

fn partition_results(
    results: Vec<(TopicPartition, Option<kafka_protocol::error::ResponseError>)>,
) -> Vec<PartitionResult> {
    results
        .into_iter()
        .map(|(tp, e)| PartitionResult {
            topic: tp.topic,
            partition: tp.partition,
            error_code: grpc_error_code(e),
        })
        .collect()
}

#[tonic::async_trait]
impl TxnService for TxnGrpc {
    async fn write_txn_markers(
        &self,
        request: Request<WriteTxnMarkersRequest>,
    ) -> Result<Response<WriteTxnMarkersResponse>, Status> {
        let broker = self.broker()?;
        let (metadata, _, req) = request.into_parts();
        let producer_epoch = i16::try_from(req.producer_epoch)
            .map_err(|_| Status::invalid_argument("producer epoch out of range"))?;
        let marker = EndTxnMarker {
            producer_id: req.producer_id,
            producer_epoch,
            coordinator_epoch: req.coordinator_epoch,
            commit: req.commit,
        };
        let partitions: Vec<TopicPartition> = req
            .partitions
            .into_iter()
            .map(|p| TopicPartition::new(p.topic, p.partition))
            .collect();
        let span = served_span!(
            &metadata,
            "write_txn_markers",
            producer_id = req.producer_id,
            producer_epoch,
            commit = req.commit
        );
        let results = write_markers(&broker, marker, &partitions)
            .instrument(span)
            .await;
        Ok(Response::new(WriteTxnMarkersResponse {
            partitions: partition_results(results),
        }))
    }

    async fn add_partitions_to_txn(
        &self,
        request: Request<AddPartitionsToTxnRequest>,
    ) -> Result<Response<AddPartitionsToTxnResponse>, Status> {
        let broker = self.broker()?;
        let (metadata, _, req) = request.into_parts();
        let producer_epoch = i16::try_from(req.producer_epoch)
            .map_err(|_| Status::invalid_argument("producer epoch out of range"))?;
        let partitions = req
            .partitions
            .into_iter()
            .map(|p| TopicPartition::new(p.topic, p.partition))
            .collect();
        let span = served_span!(
            &metadata,
            "add_partitions_to_txn",
            transactional_id = %req.transactional_id,
            producer_id = req.producer_id,
            producer_epoch
        );
        let results = add_partitions_local(
            &broker,
            &req.transactional_id,
            req.producer_id,
            producer_epoch,
            partitions,
            req.verify_only,
        )
        .instrument(span)
        .await;
        Ok(Response::new(AddPartitionsToTxnResponse {
            partitions: partition_results(results),
        }))
    }
}
