//! The coordinators: transactions ([`txn`]) and consumer groups ([`group`]).
pub mod group;
pub mod placement;
pub mod runtime;
pub mod txn;
