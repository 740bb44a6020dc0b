//! The integration tests, one binary: each area of the program is a module
//! here, over the shared harness in common/ (a schema, an exchange and a
//! queue per test, and a fault-injecting TCP proxy). `cargo test --test
//! integration delivery::` runs one area.

mod common;

mod adopt;
mod archive;
mod broker_connect;
mod by_key;
mod check;
mod columns;
mod commit_order;
mod database_connect;
mod delivery;
mod environment;
mod errors;
mod faults;
mod follow;
mod generated;
mod layers;
mod many;
mod memory;
mod message_columns;
mod metrics;
mod migrate;
mod observability;
mod odd_rows;
mod on_publish;
mod operators;
mod ordered;
mod output;
mod packaging;
mod partitions;
mod payloads;
mod pipeline;
mod poll;
mod privileges;
mod progress;
mod readme;
mod refusals;
mod soak;
mod traces;
mod wait;
