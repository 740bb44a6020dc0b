//! Reaching the servers: PostgreSQL's settings read as libpq reads them
//! (`conninfo`) and its hosts tried as libpq tries them (`hosts`), the
//! session opened with every phase bounded (`database`); the AMQP URLs of
//! a cluster (`amqp_url`) and the node that accepts (`amqp`); one TLS stack
//! for both (`tls`, `postgres_tls`); waits that a signal ends (`wait`); and
//! the redaction that keeps passwords out of every message, and the URLs
//! read from secret files (`secrets`).

pub(crate) mod amqp;
pub(crate) mod amqp_url;
pub mod conninfo;
pub(crate) mod database;
pub(crate) mod hosts;
pub mod libpq;
pub(crate) mod pg_error;
pub(crate) mod postgres_tls;
pub(crate) mod redact;
pub(crate) mod secrets;
pub(crate) mod tls;
pub(crate) mod wait;
