//! Integration tests against real `samsa server` processes. Each test starts
//! its own node (free port, temp data dir) and kills it when done.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod bad_input;
mod basics;
mod chaos;
mod cluster;
mod compacted_state;
mod compression;
mod coordinator_loss;
mod declared_security;
mod dev;
mod disk_full;
mod dynamic_configs;
mod failover;
mod groups;
mod groups_smoke;
mod idempotence;
mod inter_node_tls;
mod listeners;
mod offsets;
mod persistence;
mod pipeline;
mod pipelined_clients;
mod pipelined_produce;
mod protocol_details;
mod rdkafka_eos;
mod rdkafka_sasl_ssl;
mod read_apis;
mod replication;
mod sasl_bad_input;
mod secured_cluster;
mod stage_start;
mod transactions;
mod transactions_smoke;
mod txn_tools;
mod verify;
