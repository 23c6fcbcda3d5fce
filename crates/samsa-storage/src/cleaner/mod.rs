//! Log compaction (`cleanup.policy=compact`): the pieces of a cleaning
//! pass that need no file — the key → latest offset map in bounded memory
//! ([`offset_map`]), the decisions about records, batches and
//! transaction markers ([`retention`]), and rewriting a batch with the
//! records kept ([`rewrite`]). The pass that reads segments and
//! writes the cleaned ones is built on them.

pub mod offset_map;
pub mod pass;
pub mod retention;
pub mod rewrite;
