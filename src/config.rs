//! Typed settings, built from the parsed command line. Everything that can
//! be wrong with a value is found here, before any connection is opened, and
//! reported as a configuration problem (exit 78).

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Result, anyhow};

use crate::broker::publisher::BrokerConfig;
use crate::cli::{DatabaseArgs, PollArgs};
use crate::connect::amqp_url::amqp_nodes;
use crate::connect::conninfo::{self, Account, ConnInfo, SystemFiles};
use crate::connect::database::{self, STATEMENT_TIMEOUT};
use crate::connect::libpq::Env;
use crate::connect::secrets;
use crate::exit;
use crate::sql::outbox::{OnPublish, Order};
use crate::sql::table::TableName;

/// AMQP short strings (exchange names among them) hold at most 255 bytes.
const MAX_EXCHANGE_BYTES: usize = 255;
/// How long a transaction may idle, beyond the broker's own time limits,
/// before the server ends it and frees its rows.
pub(crate) const IDLE_MARGIN: Duration = Duration::from_secs(30);
/// Events a drain with a backlog keeps in flight: a batch's confirms come
/// back only after the broker has written it, and a few hundred messages
/// behind it keep the broker busy meanwhile (see README, Performance).
const IN_FLIGHT_EVENTS: u32 = 400;
/// Each batch in flight holds a PostgreSQL session of its own.
const MAX_IN_FLIGHT: usize = 4;
/// idle_in_transaction_session_timeout is an int of milliseconds.
const MAX_IDLE_LIMIT: Duration = Duration::from_millis(i32::MAX as u64);

/// How to reach the outbox.
#[derive(Debug, Clone)]
pub struct Database {
    /// libpq's connection model: the hosts to try, TLS, the login.
    pub(crate) conninfo: ConnInfo,
    pub(crate) table: TableName,
    pub(crate) max_attempts: i32,
    pub(crate) connect_timeout: Duration,
}

/// What a poll run (the relay) does.
#[derive(Debug, Clone)]
pub struct Relay {
    pub(crate) broker: BrokerConfig,
    /// The longest a PostgreSQL connect can take (Database::connect_budget),
    /// for the sessions a drain opens while a batch waits.
    pub(crate) session_connect_budget: Duration,
    pub(crate) batch_size: i64,
    /// Payload bytes one batch, and all a drain has in flight, may hold.
    pub(crate) batch_bytes: i64,
    pub(crate) drain: bool,
    /// --follow: a drain that waits for new events instead of ending.
    pub(crate) follow: bool,
    /// How many batches a drain may have in flight at once.
    pub(crate) in_flight: usize,
    pub(crate) max_batches: Option<u64>,
    pub(crate) max_duration: Option<Duration>,
    /// --ordered; never set together with `ordered_by_key` (clap refuses it).
    pub(crate) ordered: bool,
    pub(crate) ordered_by_key: bool,
    pub(crate) on_publish: OnPublish,
    pub(crate) dry_run: bool,
    pub(crate) metrics_file: Option<PathBuf>,
}

impl Database {
    pub fn from_args(args: &DatabaseArgs, env: Env) -> Result<Self> {
        let account = Account::current(&SystemFiles);
        let from_file = secrets::read(&secrets::DATABASE)?;
        let conninfo = conninfo::resolve(
            from_file.as_deref().or(args.database_url.as_deref()),
            env,
            &SystemFiles,
            account.as_ref(),
        )
        .map_err(exit::config)?;
        // What libpq prints as a WARNING and carries on from (a password
        // file others can read, ignored), and the hosts it skips for a port
        // outside 1-65535.
        for warning in &conninfo.warnings {
            log::warn!("{warning}");
        }
        let table = TableName::parse(&args.table)
            .map_err(|why| exit::config(anyhow!("invalid table name {:?}: {why}", args.table)))?;
        Ok(Database {
            conninfo,
            table,
            max_attempts: args.max_attempts,
            connect_timeout: args.connect_timeout,
        })
    }

    /// How long the server lets a subcommand's transaction sit idle before
    /// it ends it and frees its rows (see `connect::database::connect`):
    /// the subcommands never wait on anything but PostgreSQL itself.
    pub(crate) fn command_idle_limit(&self) -> Duration {
        IDLE_MARGIN + self.connect_timeout
    }

    /// The longest a connect can take: --connect-timeout for each host of
    /// the list (see `connect::hosts`). Watchdog budgets include it.
    pub(crate) fn connect_budget(&self) -> Duration {
        database::connect_budget(&self.conninfo, self.connect_timeout)
    }
}

impl Relay {
    /// The run `args` configure, on `database`: a poll's, or the one
    /// `check` checks.
    pub fn from_args(args: &PollArgs, database: &Database) -> Result<Self> {
        Relay::for_sessions(
            args,
            database.connect_timeout,
            database.connect_budget(),
            database.conninfo.targets.len(),
        )
    }

    /// As `from_args`, for sessions whose connect takes at most
    /// `session_connect_budget`, over at most `hosts` hosts: those of the
    /// one database, or the longest of a `--databases` file's.
    pub fn for_sessions(
        args: &PollArgs,
        connect_timeout: Duration,
        session_connect_budget: Duration,
        hosts: usize,
    ) -> Result<Self> {
        let broker = broker_config(args, None, None, connect_timeout, None)?;
        // A dry run claims one batch and rolls it back: nothing to drain,
        // nothing to follow.
        let follow = args.follow && !args.dry_run;
        let drain = (args.drain || follow) && !args.dry_run;
        let relay = Relay {
            broker,
            session_connect_budget,
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
            // A dry run deletes nothing: it needs no DELETE privilege.
            on_publish: match args.dry_run {
                true => OnPublish::Mark,
                false => args.on_publish,
            },
            dry_run: args.dry_run,
            metrics_file: args.metrics_file.clone(),
        };
        // Each duration is bounded alone (cli.rs); their sum over long
        // lists of hosts and nodes is checked here.
        let idle = relay.batch_idle_limit();
        if idle > MAX_IDLE_LIMIT {
            return Err(exit::config(anyhow!(
                "--connect-timeout and --confirm-timeout, over {} database host(s) and {} \
                 broker node(s), make the idle-in-transaction limit {} longer than \
                 PostgreSQL can hold ({}): lower --connect-timeout or --confirm-timeout",
                hosts,
                relay.broker.nodes.len(),
                humantime::format_duration(idle),
                humantime::format_duration(MAX_IDLE_LIMIT)
            )));
        }
        Ok(relay)
    }

    /// How the run claims its events.
    pub(crate) fn order(&self) -> Order {
        match (self.ordered, self.ordered_by_key) {
            (true, _) => Order::Strict,
            (false, true) => Order::ByKey,
            (false, false) => Order::Plain,
        }
    }

    /// How many PostgreSQL sessions the run may have: one for each batch
    /// in flight, and one more for the batch a plain drain commits
    /// meanwhile.
    pub(crate) fn sessions(&self) -> usize {
        self.in_flight + usize::from(self.commits_apart())
    }

    /// Whether the run commits each batch on a thread of its own while it
    /// awaits the next batch's confirms (relay::committer): a plain drain.
    /// An ordered claim must see the batch before it committed.
    pub(crate) fn commits_apart(&self) -> bool {
        self.drain && self.order() == Order::Plain
    }

    /// While a batch waits for the broker its transaction is idle; the
    /// limit must outlive the longest legitimate wait, or the server would
    /// end the transaction between publishing and marking. That wait is the
    /// broker connect (--connect-timeout for each node of the list) and its
    /// channel (--connect-timeout), then the confirms. In a drain, the run
    /// also works on its other batches in flight meanwhile: each may open
    /// its session (--connect-timeout for each host of the database's list)
    /// and its channel (as a drain starts), and for each the run marks and
    /// commits the batch ahead and claims the next one (a statement's time
    /// each); the batch a plain drain commits meanwhile is one more. The
    /// confirms of the batches ahead of this one are due before its own.
    pub(crate) fn batch_idle_limit(&self) -> Duration {
        let broker = &self.broker;
        batch_idle_limit_of(
            Waits {
                session: self.session_connect_budget,
                broker: broker.connect_budget(),
                channel: broker.connect_timeout,
                confirm: broker.confirm_timeout,
            },
            self.sessions(),
        )
    }
}

/// Where and how a run publishes: the poll's options, and those a
/// subcommand gives in their place (replay's `url`, `exchange` and
/// `confirm_timeout`, given after its name).
pub(crate) fn broker_config(
    args: &PollArgs,
    url: Option<&str>,
    exchange: Option<&str>,
    connect_timeout: Duration,
    confirm_timeout: Option<Duration>,
) -> Result<BrokerConfig> {
    // The file variable and the flag exclude each other (environment.rs).
    let from_file = secrets::read(&secrets::AMQP)?;
    let url = url.or(from_file.as_deref()).unwrap_or(&args.amqp_url);
    let nodes = amqp_nodes(url).map_err(exit::config)?;
    let exchange = exchange.unwrap_or(&args.exchange);
    if exchange.len() > MAX_EXCHANGE_BYTES {
        return Err(exit::config(anyhow!(
            "the exchange name is longer than AMQP's {MAX_EXCHANGE_BYTES} bytes"
        )));
    }
    Ok(BrokerConfig {
        nodes,
        exchange: exchange.to_owned(),
        declare_exchange: args.declare_exchange,
        connect_timeout,
        confirm_timeout: confirm_timeout.unwrap_or(args.confirm_timeout),
    })
}

/// The waits that add up to a batch's idle limit.
struct Waits {
    /// Opening a PostgreSQL session.
    session: Duration,
    /// Connecting to the broker.
    broker: Duration,
    /// Opening a channel.
    channel: Duration,
    /// A batch's confirms.
    confirm: Duration,
}

/// Relay::batch_idle_limit, from the waits and the run's sessions (a
/// batch each).
fn batch_idle_limit_of(waits: Waits, sessions: usize) -> Duration {
    let others = u32::try_from(sessions - 1).unwrap_or(u32::MAX);
    let other = waits.session + waits.channel + 2 * STATEMENT_TIMEOUT;
    IDLE_MARGIN + waits.broker + waits.channel + waits.confirm + other * others
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
    use super::{Duration, MAX_IDLE_LIMIT, MAX_IN_FLIGHT, Waits, batch_idle_limit_of, in_flight};
    use crate::cli::MAX_TIMEOUT;

    /// The waits with the defaults (--connect-timeout 10s, --confirm-timeout
    /// 30s), `hosts` database hosts and `nodes` broker nodes.
    fn waits(hosts: u64, nodes: u64) -> Waits {
        Waits {
            session: Duration::from_secs(10 * hosts),
            broker: Duration::from_secs(10 * nodes),
            channel: Duration::from_secs(10),
            confirm: Duration::from_secs(30),
        }
    }

    #[test]
    fn the_longest_timeouts_over_one_host_and_node_keep_the_idle_limit_within_postgresqls_int() {
        let longest = Waits {
            session: MAX_TIMEOUT,
            broker: MAX_TIMEOUT,
            channel: MAX_TIMEOUT,
            confirm: MAX_TIMEOUT,
        };
        assert!(batch_idle_limit_of(longest, MAX_IN_FLIGHT + 1) <= MAX_IDLE_LIMIT);
    }

    #[test]
    fn the_idle_limit_grows_with_the_sessions() {
        let secs = |sessions| batch_idle_limit_of(waits(1, 1), sessions).as_secs();
        assert_eq!((secs(1), secs(2), secs(3), secs(5)), (80, 160, 240, 400));
    }

    #[test]
    fn the_idle_limit_outlives_a_connect_through_every_host_and_node() {
        let secs =
            |hosts, nodes, in_flight| batch_idle_limit_of(waits(hosts, nodes), in_flight).as_secs();
        assert_eq!((secs(1, 3, 1), secs(2, 1, 2)), (100, 170));
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
