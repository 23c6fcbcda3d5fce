//! samsa-tools: everything the `samsa` binary runs besides a broker.
//!
//! The binary (`crates/samsa`) owns the shape of the command line, logging
//! and the `server`/`dev` wiring; each subcommand's flags and behaviour live
//! here, next to the code that reads them, and the binary calls the module's
//! `run`:
//!
//! - client tools on librdkafka: [`topic`], [`produce`], [`consume`],
//!   sharing [`client`] (connection flags, client configuration, log routing);
//! - [`cluster`]: the controller quorum and committed metadata, over gRPC;
//! - [`reassign`]: partition reassignment, rebalancing, decommissioning and
//!   leader elections over the Kafka protocol, planned by [`balance`];
//! - [`txn`]: transaction operator tools (`kafka-transactions.sh`), on the
//!   small Kafka protocol client in [`wire`] for the APIs librdkafka lacks;
//! - [`dump_log`]: the offline segment and index dumper (no broker, no runtime);
//! - [`bench`]: produce, consume and transaction load generators;
//! - [`demo`]: the transaction and consumer-group experiments;
//! - [`pipeline`]: the exactly-once consume-transform-produce stage process
//!   and the drivers that run pipelines of them ([`pipeline::driver`]);
//! - [`health`]: the container health check (`/readyz` over plain HTTP);
//! - [`signals`]: SIGTERM/SIGINT handling, shared with the broker processes.
//!
//! Invariants: what a tool prints on stdout is its data (records, tables,
//! dumps) and nothing else; logs go to stderr through `tracing`. Nothing a
//! broker answers (or a file holds) can panic a tool: a malformed answer is
//! an error with context, which the binary prints as one line.

pub mod acl;
pub mod balance;
pub mod bench;
pub mod client;
pub mod cluster;
pub mod config;
pub mod consume;
pub mod demo;
pub mod dump_log;
pub mod health;
pub mod pipeline;
pub mod produce;
pub mod reassign;
pub mod signals;
pub mod topic;
pub mod txn;
pub mod user;
pub mod wire;
