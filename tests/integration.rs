//! The integration tests, one binary: each area of the program is a module
//! here, over the shared harness in common/ (a schema, an exchange and a
//! queue per test, and a fault-injecting TCP proxy). `cargo test --test
//! integration delivery::` runs one area.

mod common;

mod broker_connect;
mod database_connect;
mod delivery;
mod errors;
mod faults;
mod generated;
mod metrics;
mod migrate;
mod operators;
mod ordered;
mod output;
mod packaging;
mod pipeline;
mod poll;
mod privileges;
mod progress;
mod readme;
