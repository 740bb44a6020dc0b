//! Typed settings, built from the parsed command line. Everything that can
//! be wrong with a value is found here, before any connection is opened, and
//! reported as a configuration problem (exit 78).

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Result, anyhow};

use crate::broker::publisher::BrokerConfig;
use crate::cli::{Cli, DatabaseArgs, OnPublish, PollArgs};
use crate::connect::amqp_url::amqp_uri;
use crate::connect::database::STATEMENT_TIMEOUT;
use crate::connect::libpq::{Env, database_config};
use crate::exit;
use crate::sql::outbox::Order;
use crate::sql::table::TableName;

/// AMQP short strings (exchange names among them) hold at most 255 bytes.
const MAX_EXCHANGE_BYTES: usize = 255;
/// How long a transaction may idle, beyond the broker's own time limits,
/// before the server ends it and frees its rows.
const IDLE_MARGIN: Duration = Duration::from_secs(30);
/// Events a drain with a backlog keeps in flight: a batch's confirms come
/// back only after the broker has written it, and a few hundred messages
/// behind it keep the broker busy meanwhile (see README, Performance).
const IN_FLIGHT_EVENTS: u32 = 400;
/// Each batch in flight holds a PostgreSQL session of its own.
const MAX_IN_FLIGHT: usize = 4;

/// How to reach the outbox.
#[derive(Debug, Clone)]
pub struct Database {
    pub config: postgres::Config,
    pub table: TableName,
    pub max_attempts: i32,
    pub connect_timeout: Duration,
}

/// What a poll run (the relay) does.
#[derive(Debug, Clone)]
pub struct Relay {
    pub broker: BrokerConfig,
    pub batch_size: i64,
    /// Payload bytes one batch, and all a drain has in flight, may hold.
    pub batch_bytes: i64,
    pub drain: bool,
    /// --follow: a drain that waits for new events instead of ending.
    pub follow: bool,
    /// How many batches a drain may have in flight at once.
    pub in_flight: usize,
    pub max_batches: Option<u64>,
    pub max_duration: Option<Duration>,
    /// --ordered; never set together with `ordered_by_key` (clap refuses it).
    pub ordered: bool,
    pub ordered_by_key: bool,
    pub on_publish: OnPublish,
    pub dry_run: bool,
    pub metrics_file: Option<PathBuf>,
}

impl Database {
    pub fn from_args(args: &DatabaseArgs, env: Env) -> Result<Self> {
        let config = database_config(args.database_url.as_deref(), env).map_err(exit::config)?;
        let table = TableName::parse(&args.table)
            .map_err(|why| exit::config(anyhow!("invalid table name {:?}: {why}", args.table)))?;
        Ok(Database {
            config,
            table,
            max_attempts: args.max_attempts,
            connect_timeout: args.connect_timeout,
        })
    }

    /// How long the server lets a subcommand's transaction sit idle before
    /// it ends it and frees its rows (see `connect::database::connect`):
    /// the subcommands never wait on anything but PostgreSQL itself.
    pub fn command_idle_limit(&self) -> Duration {
        IDLE_MARGIN + self.connect_timeout
    }
}

impl Relay {
    pub fn from_cli(cli: &Cli, database: &Database) -> Result<Self> {
        let args: &PollArgs = &cli.poll;
        let uri = amqp_uri(&args.amqp_url).map_err(exit::config)?;
        if args.exchange.len() > MAX_EXCHANGE_BYTES {
            return Err(exit::config(anyhow!(
                "the exchange name is longer than AMQP's {MAX_EXCHANGE_BYTES} bytes"
            )));
        }
        // A dry run claims one batch and rolls it back: nothing to drain,
        // nothing to follow.
        let follow = args.follow && !args.dry_run;
        let drain = (args.drain || follow) && !args.dry_run;
        Ok(Relay {
            broker: BrokerConfig {
                uri,
                exchange: args.exchange.clone(),
                declare_exchange: args.declare_exchange,
                connect_timeout: database.connect_timeout,
                confirm_timeout: args.confirm_timeout,
            },
            batch_size: i64::from(args.batch_size),
            // At most 1 GiB, checked by clap.
            batch_bytes: i64::try_from(args.batch_bytes).unwrap_or(i64::MAX),
            drain,
            follow,
            in_flight: in_flight(args.batch_size, drain, args.ordered),
            max_batches: args.max_batches,
            max_duration: args.max_duration,
            ordered: args.ordered,
            ordered_by_key: args.ordered_by_key,
            on_publish: args.on_publish,
            dry_run: args.dry_run,
            metrics_file: args.metrics_file.clone(),
        })
    }

    /// How the run claims its events.
    pub fn order(&self) -> Order {
        match (self.ordered, self.ordered_by_key) {
            (true, _) => Order::Strict,
            (false, true) => Order::ByKey,
            (false, false) => Order::Plain,
        }
    }

    /// While a batch waits for the broker its transaction is idle; the
    /// limit must outlive the longest legitimate wait, or the server would
    /// end the transaction between publishing and marking. That wait is the
    /// broker connect and its channel (--connect-timeout each), then the
    /// confirms. In a drain, the run also works on its other batches in
    /// flight meanwhile: each may open its session and its channel
    /// (--connect-timeout each, as a drain starts), and for each the run
    /// marks and commits the batch ahead and claims the next one (a
    /// statement's time each). The confirms of the batches ahead of this
    /// one are due before its own.
    pub fn batch_idle_limit(&self) -> Duration {
        let broker = &self.broker;
        batch_idle_limit_of(
            broker.connect_timeout,
            broker.confirm_timeout,
            self.in_flight,
        )
    }
}

/// Relay::batch_idle_limit, from --connect-timeout, --confirm-timeout and
/// the batches in flight.
fn batch_idle_limit_of(connect: Duration, confirm: Duration, in_flight: usize) -> Duration {
    let others = u32::try_from(in_flight - 1).unwrap_or(u32::MAX);
    let other = 2 * connect + 2 * STATEMENT_TIMEOUT;
    IDLE_MARGIN + 2 * connect + confirm + other * others
}

/// How many batches a run may have in flight. Small batches need more of
/// them to keep IN_FLIGHT_EVENTS at the broker; large ones need two, so
/// that the broker works on one while PostgreSQL marks and commits the
/// other. A single run has nothing to overlap, and --ordered may not: a
/// batch would be sent before the failures of the one before it were known.
/// --ordered-by-key may: a batch holds at most one event of a key, and the
/// next batch's claim sees it unpublished, so it takes no later event of
/// that key until the batch holding it has settled.
pub fn in_flight(batch_size: u32, drain: bool, ordered: bool) -> usize {
    if !drain || ordered {
        return 1;
    }
    let wanted = IN_FLIGHT_EVENTS.div_ceil(batch_size) as usize;
    wanted.clamp(2, MAX_IN_FLIGHT)
}

#[cfg(test)]
mod tests {
    use super::{Duration, MAX_IN_FLIGHT, batch_idle_limit_of, in_flight};
    use crate::cli::MAX_TIMEOUT;

    #[test]
    fn the_longest_timeouts_keep_the_idle_limit_within_postgresqls_int_of_milliseconds() {
        let longest = batch_idle_limit_of(MAX_TIMEOUT, MAX_TIMEOUT, MAX_IN_FLIGHT);
        assert!(longest.as_millis() <= i32::MAX as u128, "{longest:?}");
    }

    #[test]
    fn the_idle_limit_grows_with_the_batches_in_flight() {
        // The defaults: --connect-timeout 10s, --confirm-timeout 30s.
        let secs = |in_flight| {
            batch_idle_limit_of(Duration::from_secs(10), Duration::from_secs(30), in_flight)
                .as_secs()
        };
        assert_eq!((secs(1), secs(2), secs(4)), (80, 160, 320));
    }

    #[test]
    fn a_drain_of_small_batches_keeps_up_to_four_in_flight() {
        assert_eq!(in_flight(1, true, false), 4);
        assert_eq!(in_flight(100, true, false), 4);
        assert_eq!(in_flight(150, true, false), 3);
    }

    #[test]
    fn a_drain_of_large_batches_keeps_two_in_flight() {
        assert_eq!(in_flight(200, true, false), 2);
        assert_eq!(in_flight(10_000, true, false), 2);
    }

    #[test]
    fn a_single_run_or_an_ordered_drain_keeps_one() {
        assert_eq!(in_flight(100, false, false), 1);
        assert_eq!(in_flight(100, true, true), 1);
    }
}
