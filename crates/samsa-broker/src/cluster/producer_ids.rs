//! [`ControllerProducerIdBlockSource`]: producer-id blocks from the
//! controller quorum.
//!
//! Invariant: no producer id is handed out twice cluster-wide. The quorum
//! commits each block to the metadata log before answering, so a block whose
//! answer was lost is simply never used (ids are skipped, never repeated);
//! every failure here is retriable ([`ProducerIdError::Unavailable`]), and a
//! broker not yet registered asks for nothing.

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;

use futures::future::BoxFuture;
use samsa_controller::client::ControllerClient;
use tracing::info;

use crate::producer_ids::{ProducerIdBlock, ProducerIdBlockSource, ProducerIdError};

/// Producer-id blocks from the controller quorum. Any failure is retriable
/// ([`ProducerIdError::Unavailable`]): a block that was committed but whose
/// answer was lost is simply never used, which skips ids but never repeats one.
pub struct ControllerProducerIdBlockSource {
    client: ControllerClient,
    broker_id: i32,
    /// This broker's epoch; negative until it is registered.
    epoch: Arc<AtomicI64>,
}

impl ControllerProducerIdBlockSource {
    /// Blocks for `broker_id`, asked under the broker epoch `epoch` holds
    /// (negative until registered).
    pub fn new(client: ControllerClient, broker_id: i32, epoch: Arc<AtomicI64>) -> Self {
        Self {
            client,
            broker_id,
            epoch,
        }
    }
}

impl ProducerIdBlockSource for ControllerProducerIdBlockSource {
    fn allocate_block(&self) -> BoxFuture<'_, Result<ProducerIdBlock, ProducerIdError>> {
        Box::pin(async move {
            let epoch = self.epoch.load(Ordering::Acquire);
            if epoch < 0 {
                return Err(ProducerIdError::Unavailable(
                    "this broker is not registered with the controller yet".into(),
                ));
            }
            let block = self
                .client
                .allocate_producer_ids(self.broker_id, epoch)
                .await
                .map_err(|e| ProducerIdError::Unavailable(e.to_string()))?;
            if block.size <= 0 || block.first < 0 {
                return Err(ProducerIdError::Unavailable(format!(
                    "controller answered an invalid block [{}, +{})",
                    block.first, block.size
                )));
            }
            info!(
                first = block.first,
                size = block.size,
                "producer id block from the controller"
            );
            Ok(block)
        })
    }
}
