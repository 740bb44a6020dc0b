//! Reaching the servers: PostgreSQL's settings read as libpq reads them,
//! a session opened with every phase bounded, the AMQP URL, and the
//! redaction that keeps passwords out of every message.

pub mod amqp_url;
pub mod conninfo;
pub mod database;
pub mod libpq;
pub mod redact;
