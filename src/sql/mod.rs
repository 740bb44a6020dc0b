//! Every statement the program sends, next to the table's name that each
//! is built with (quoted, validated: no SQL is ever built from unchecked
//! input). The migrations themselves are the files in migrations/.

pub(crate) mod adopt;
pub(crate) mod check;
pub(crate) mod columns;
pub mod figures;
pub mod migrations;
pub mod names;
pub(crate) mod notify;
pub mod outbox;
pub(crate) mod partitions;
pub(crate) mod prune;
pub(crate) mod requeue;
pub mod table;
pub(crate) mod wait;
