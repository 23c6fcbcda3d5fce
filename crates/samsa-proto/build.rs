//! Compiles `proto/*.proto` at the workspace root into tonic/prost code.
//!
//! `protox` parses the files in pure Rust, so no system `protoc` is needed.

use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let proto_dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../proto");
    let files = [
        "raft.proto",
        "controller.proto",
        "replication.proto",
        "txn.proto",
    ];
    for file in &files {
        println!("cargo:rerun-if-changed={}", proto_dir.join(file).display());
    }
    let descriptors = protox::compile(files, [&proto_dir])?;
    tonic_prost_build::configure()
        // Record batches cross replication as `Bytes`: the leader hands the
        // log read to the encoder and the follower appends from the decode
        // buffer, two 1 MB copies fewer per follower per fetch.
        .bytes(".samsa.replication.v1.PartitionData.records")
        .build_server(true)
        .build_client(true)
        .compile_fds(descriptors)?;
    Ok(())
}
