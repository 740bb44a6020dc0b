//! Every statement the program sends, next to the table's name that each
//! is built with (quoted, validated: no SQL is ever built from unchecked
//! input). The migrations themselves are the files in migrations/.

pub mod adopt;
pub mod check;
pub mod columns;
pub mod figures;
pub mod migrations;
pub mod names;
pub mod notify;
pub mod outbox;
pub mod partitions;
pub mod prune;
pub mod requeue;
pub mod table;
pub mod wait;
