//! Typed settings, built from the parsed command line. Everything that can
//! be wrong with a value is found here, before any connection is opened, and
//! reported as a configuration problem (exit 78).

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Result, anyhow};

use crate::cli::{Cli, DatabaseArgs, PollArgs};
use crate::db;
use crate::exit;
use crate::publisher::BrokerConfig;
use crate::table::TableName;
use crate::urls::{self, Env};

/// AMQP short strings (exchange names among them) hold at most 255 bytes.
const MAX_EXCHANGE_BYTES: usize = 255;
/// How long a transaction may idle, beyond the broker's own time limits,
/// before the server ends it and frees its rows.
const IDLE_MARGIN: Duration = Duration::from_secs(30);

/// How to reach the outbox.
#[derive(Debug, Clone)]
pub struct Database {
    pub config: postgres::Config,
    pub table: TableName,
    pub max_attempts: i32,
    pub connect_timeout: Duration,
}

/// What a poll run does.
#[derive(Debug, Clone)]
pub struct Poll {
    pub broker: BrokerConfig,
    pub batch_size: i64,
    pub drain: bool,
    pub max_batches: Option<u64>,
    pub max_duration: Option<Duration>,
    pub ordered: bool,
    pub dry_run: bool,
    pub metrics_file: Option<PathBuf>,
}

impl Database {
    pub fn from_args(args: &DatabaseArgs, env: Env) -> Result<Self> {
        let config =
            urls::database_config(args.database_url.as_deref(), env).map_err(exit::config)?;
        let table = TableName::parse(&args.table)
            .map_err(|why| exit::config(anyhow!("invalid table name {:?}: {why}", args.table)))?;
        Ok(Database {
            config,
            table,
            max_attempts: args.max_attempts,
            connect_timeout: args.connect_timeout,
        })
    }

    /// How long the server lets a transaction of ours sit idle before it
    /// ends it and frees its rows (see `db::connect`): the subcommands never
    /// wait on anything but PostgreSQL itself.
    pub fn idle_limit(&self) -> Duration {
        IDLE_MARGIN + self.connect_timeout
    }
}

impl Poll {
    pub fn from_cli(cli: &Cli, database: &Database) -> Result<Self> {
        let args: &PollArgs = &cli.poll;
        let uri = urls::amqp_uri(&args.amqp_url).map_err(exit::config)?;
        if args.exchange.len() > MAX_EXCHANGE_BYTES {
            return Err(exit::config(anyhow!(
                "the exchange name is longer than AMQP's {MAX_EXCHANGE_BYTES} bytes"
            )));
        }
        Ok(Poll {
            broker: BrokerConfig {
                uri,
                exchange: args.exchange.clone(),
                declare_exchange: args.declare_exchange,
                connect_timeout: database.connect_timeout,
                confirm_timeout: args.confirm_timeout,
            },
            batch_size: i64::from(args.batch_size),
            drain: args.drain && !args.dry_run,
            max_batches: args.max_batches,
            max_duration: args.max_duration,
            ordered: args.ordered,
            dry_run: args.dry_run,
            metrics_file: args.metrics_file.clone(),
        })
    }

    /// While a batch waits for the broker its transaction is idle; the
    /// limit must outlive the longest legitimate wait, or the server would
    /// end the transaction between publishing and marking. That wait is the
    /// broker connect and its channel (--connect-timeout each), then the
    /// confirms; in a drain with two batches in flight, also the next
    /// batch's claim on the other session (one statement's time).
    pub fn idle_limit(&self) -> Duration {
        IDLE_MARGIN
            + 2 * self.broker.connect_timeout
            + self.broker.confirm_timeout
            + db::STATEMENT_TIMEOUT
    }
}
