//! The data directory's identity: which cluster and node its data belongs
//! to (`meta/cluster.json`, [`CLUSTER_FILE`]).
//!
//! Invariants: a cluster node never starts on single-node data
//! ([`SINGLE_NODE_FILE`]), on another node's data, or on another cluster's
//! data; the cluster id is written once, atomically, the first time the node
//! joins (and never changed after), so a crash mid-write leaves either no
//! file or a whole one.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use tracing::info;

use crate::error::BrokerError;
use crate::fsutil::write_atomic;

/// `meta/<this>` in a cluster node's data directory.
pub const CLUSTER_FILE: &str = "cluster.json";
/// `meta/<this>` in a single-node data directory.
pub const SINGLE_NODE_FILE: &str = "topics.json";

#[derive(Serialize, Deserialize)]
struct ClusterFile {
    version: u32,
    cluster_id: String,
    node_id: i32,
}

/// Which cluster and node a data directory belongs to (`meta/cluster.json`,
/// written once the cluster id is known).
pub(super) struct DataDirIdentity {
    path: PathBuf,
    node_id: i32,
    /// `None` until the node has joined a cluster.
    pub(super) cluster_id: Option<String>,
}

impl DataDirIdentity {
    /// Reads the identity of `data_dir` (creating the directory), refusing
    /// single-node data and another node's data.
    pub(super) fn load(data_dir: &Path, node_id: i32) -> Result<Self, BrokerError> {
        let meta = data_dir.join("meta");
        std::fs::create_dir_all(&meta).map_err(|source| BrokerError::Io {
            path: meta.clone(),
            source,
        })?;
        if meta.join(SINGLE_NODE_FILE).exists() {
            return Err(BrokerError::Cluster(format!(
                "data directory {} holds single-node data ({}); a cluster node needs an empty \
                 data directory or one from its own cluster, so it refuses to start",
                data_dir.display(),
                meta.join(SINGLE_NODE_FILE).display()
            )));
        }
        let path = meta.join(CLUSTER_FILE);
        let cluster_id = match std::fs::read(&path) {
            Ok(bytes) => {
                let file: ClusterFile = serde_json::from_slice(&bytes).map_err(|e| {
                    BrokerError::Cluster(format!("{} is corrupt: {e}", path.display()))
                })?;
                if file.node_id != node_id {
                    return Err(BrokerError::Cluster(format!(
                        "data directory {} belongs to node {}, not node_id {node_id}; use that \
                         node's id or an empty data directory",
                        data_dir.display(),
                        file.node_id
                    )));
                }
                Some(file.cluster_id)
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(source) => return Err(BrokerError::Io { path, source }),
        };
        Ok(Self {
            path,
            node_id,
            cluster_id,
        })
    }

    /// Refuses a configured `cluster_id` other than the one this data
    /// directory already belongs to (checked before anything starts).
    pub(super) fn check_configured(
        &self,
        configured: Option<&str>,
        data_dir: &Path,
    ) -> Result<(), BrokerError> {
        match (configured, &self.cluster_id) {
            (Some(configured), Some(stored)) if configured != stored => {
                Err(BrokerError::Cluster(format!(
                    "data directory {} belongs to cluster {stored}, but this node is configured \
                     for cluster {configured} (cluster_id); refusing to start on another \
                     cluster's data",
                    data_dir.display()
                )))
            }
            _ => Ok(()),
        }
    }

    /// Checks the quorum's cluster id against this data directory's and the
    /// configured one, and records it the first time.
    pub(super) fn check_and_record(
        &mut self,
        quorum: &str,
        configured: Option<&str>,
    ) -> Result<(), BrokerError> {
        if let Some(configured) = configured.filter(|c| *c != quorum) {
            return Err(BrokerError::Cluster(format!(
                "this node is configured for cluster {configured}, but the controller quorum is \
                 cluster {quorum}; refusing to start"
            )));
        }
        match &self.cluster_id {
            Some(stored) if stored != quorum => Err(another_cluster(stored, quorum)),
            Some(_) => Ok(()),
            None => {
                let bytes = serde_json::to_vec_pretty(&ClusterFile {
                    version: 0,
                    cluster_id: quorum.to_owned(),
                    node_id: self.node_id,
                })
                .map_err(|e| BrokerError::Cluster(e.to_string()))?;
                write_atomic(&self.path, &bytes).map_err(|source| BrokerError::Io {
                    path: self.path.clone(),
                    source,
                })?;
                info!(
                    cluster_id = quorum,
                    "joined cluster; recorded its id in the data directory"
                );
                self.cluster_id = Some(quorum.to_owned());
                Ok(())
            }
        }
    }
}

fn another_cluster(ours: &str, quorum: &str) -> BrokerError {
    BrokerError::Cluster(format!(
        "this node's data belongs to cluster {ours}, but the controller quorum is cluster \
         {quorum}; refusing to start on another cluster's data (use an empty data directory to \
         join cluster {quorum})"
    ))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    #[test]
    fn data_dir_identity_refuses_other_nodes_clusters_and_single_node_data() {
        let dir = tempfile::tempdir().unwrap();
        let mut identity = DataDirIdentity::load(dir.path(), 1).unwrap();
        assert_eq!(identity.cluster_id, None);
        identity.check_and_record("c1", None).unwrap();
        let mut again = DataDirIdentity::load(dir.path(), 1).unwrap();
        assert_eq!(again.cluster_id.as_deref(), Some("c1"));
        let err = again.check_and_record("c2", None).unwrap_err();
        assert!(err.to_string().contains("another cluster"), "{err}");
        let err = again.check_and_record("c1", Some("c3")).unwrap_err();
        assert!(
            err.to_string().contains("configured for cluster c3"),
            "{err}"
        );
        let err = again.check_configured(Some("c3"), dir.path()).unwrap_err();
        assert!(err.to_string().contains("belongs to cluster c1"), "{err}");
        again.check_configured(Some("c1"), dir.path()).unwrap();
        again.check_configured(None, dir.path()).unwrap();
        let err = DataDirIdentity::load(dir.path(), 2).err().unwrap();
        assert!(err.to_string().contains("belongs to node 1"), "{err}");

        let single = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(single.path().join("meta")).unwrap();
        std::fs::write(single.path().join("meta").join(SINGLE_NODE_FILE), b"{}").unwrap();
        let err = DataDirIdentity::load(single.path(), 1).err().unwrap();
        assert!(err.to_string().contains("single-node data"), "{err}");
    }
}
