//! The subcommands: `status`, `requeue`, `prune`, `migrate`, and the
//! generated `completions` and `man`. Each needs PostgreSQL only (or
//! nothing), never the broker.

pub mod generate;
pub mod migrate;
pub mod prune;
pub mod requeue;
pub mod status;
