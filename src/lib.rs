//! outbox-poll: relay a PostgreSQL transactional outbox to RabbitMQ, one
//! short run at a time, and exit with a code cron and CI can act on.
//!
//! The binary (`main.rs`) is a thin table of contents over this library;
//! the benchmark imports the same SQL and rules. The folders follow one
//! run from the command line to the exit code:
//!
//! - [`cli`] and [`config`]: the command line, then the typed settings
//!   every value is checked into before anything connects; [`environment`]:
//!   the options' variables, read as docs/src/command-line.md says;
//! - [`connect`]: reaching PostgreSQL and RabbitMQ, and naming them in
//!   messages without a password;
//! - [`relay`]: what happens in one run: claim a batch, publish it, mark
//!   what the broker confirmed, commit; batch after batch with `--drain`;
//! - [`broker`]: the RabbitMQ side of a batch: pipelined publishes, the
//!   confirms, and whose fault each failure is;
//! - [`sql`]: every statement the program sends, and the table's name;
//! - [`commands`]: the subcommands (status, requeue, prune, migrate, check,
//!   completions and the manual page);
//! - [`report`]: what a run tells: stdout, the JSON summary, the metrics
//!   file, the progress bar, the log;
//! - `guard`: what bounds a run: the watchdog and the signals;
//! - [`exit`]: the exit codes, and which failure is whose;
//! - [`archive`]: the file `prune --archive` writes and `replay` reads.

#![forbid(unsafe_code)]
#![warn(unreachable_pub)]

pub mod archive;
pub mod broker;
pub mod cli;
pub mod commands;
pub mod config;
pub mod connect;
pub mod environment;
pub mod exit;
pub(crate) mod guard;
pub mod plan;
pub mod relay;
pub mod report;
pub mod sql;
