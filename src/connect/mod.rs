//! Reaching the servers: PostgreSQL's settings read as libpq reads them
//! (`conninfo`) and its hosts tried as libpq tries them (`hosts`), the
//! session opened with every phase bounded (`database`); the AMQP URLs of
//! a cluster (`amqp_url`) and the node that accepts (`amqp`); one TLS stack
//! for both (`tls`, `postgres_tls`); waits that a signal ends (`wait`); and
//! the redaction that keeps passwords out of every message, and the URLs
//! read from secret files (`secrets`).

pub mod amqp;
pub mod amqp_url;
pub mod conninfo;
pub mod database;
pub mod hosts;
pub mod libpq;
pub mod pg_error;
pub mod postgres_tls;
pub mod redact;
pub mod secrets;
pub mod tls;
pub mod wait;
