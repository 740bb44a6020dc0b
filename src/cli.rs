//! The command line, exactly as docs/src/command-line.md names it. Only
//! parsing lives here; `config` turns it into typed settings.

use std::path::PathBuf;
use std::time::Duration;

use clap::error::ErrorKind;
use clap::{ArgAction, Args, CommandFactory, Parser, Subcommand};

use crate::broker::publisher::ExchangeKind;
use crate::sql::names::Names;
// Here too, where the command line is: the bench names it cli::OnPublish.
pub use crate::sql::outbox::OnPublish;

/// --max-attempts when not given: the tenth failure makes an event dead.
pub const DEFAULT_MAX_ATTEMPTS: i32 = 10;

/// The longest --connect-timeout and --confirm-timeout: a day. Longer, a
/// batch would hold its rows (and the database's xmin horizon) for days;
/// and within it every bound the run derives from them stays what it can
/// be: the idle-in-transaction limit, which PostgreSQL holds as an int of
/// milliseconds (24.8 days at most, see config::batch_idle_limit_of), and
/// the watchdog's budgets.
pub(crate) const MAX_TIMEOUT: Duration = Duration::from_secs(86_400);
/// A year as humantime reads and writes `1year`: 365.25 days.
const YEAR: u64 = 31_557_600;
/// The longest --max-duration: a year, far past any drain's purpose.
pub(crate) const MAX_RUN: Duration = Duration::from_secs(YEAR);
/// The longest age (--older-than, --fail-if-oldest-over): a hundred years,
/// well within what PostgreSQL subtracts from now().
pub(crate) const MAX_AGE: Duration = Duration::from_secs(100 * YEAR);

#[derive(Parser, Debug)]
#[command(
    name = "outbox-poll",
    // `0.1.0 (abc1234)`: build.rs adds the commit when built from git.
    version = env!("OUTBOX_POLL_VERSION"),
    about = "Relay one batch of a PostgreSQL transactional outbox to RabbitMQ, then exit.",
    long_about = "Relay one batch of a PostgreSQL transactional outbox to RabbitMQ, then exit.\n\n\
        Claims due events with FOR UPDATE SKIP LOCKED, publishes them with publisher \
        confirms, marks what the broker confirmed and commits. Safe to run concurrently \
        and from cron. Exit codes: 0 done, 1 some events failed, 2 usage, 69 server \
        unavailable, 78 configuration or schema problem."
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Option<Command>,

    #[command(flatten)]
    pub database: DatabaseArgs,

    #[command(flatten)]
    pub poll: PollArgs,

    /// Print one JSON object on stdout at the end.
    #[arg(long, global = true)]
    pub json: bool,

    /// More logging on stderr (-v info, -vv debug); RUST_LOG overrides.
    #[arg(short, long, action = ArgAction::Count, global = true)]
    pub verbose: u8,
}

impl Cli {
    /// The rules between options that clap's own `requires` and
    /// `conflicts_with` cannot check: they count a flag whose variable says
    /// false (OUTBOX_FOLLOW=false, OUTBOX_ORDERED=0) as given
    /// (clap-rs/clap#5591), so these are checked on the parsed values.
    ///
    /// --follow needs --max-duration: a follow without an end would never
    /// exit, and cron would pile them up (a dry run follows nothing). The
    /// two ordered modes exclude each other: one order for the whole table
    /// cannot also be one per key.
    pub(crate) fn checked(self) -> Result<Cli, clap::Error> {
        if let Some(Command::Migrate(migrate)) = &self.command
            && !migrate.adopt
            && self
                .database
                .columns
                .as_ref()
                .is_some_and(|names| !names.is_plain())
        {
            return Err(Cli::command().error(
                ErrorKind::MissingRequiredArgument,
                "migrate --column needs --adopt: the migrations create the contract's own \
                 column names; --adopt upgrades a table with other names",
            ));
        }
        let poll = match &self.command {
            None => &self.poll,
            // `check` judges a poll's configuration: one the poll refuses
            // is refused here too.
            Some(Command::Check(args)) => &args.poll,
            Some(_) => return Ok(self),
        };
        if poll.follow && !poll.dry_run && poll.max_duration.is_none() {
            return Err(Cli::command().error(
                ErrorKind::MissingRequiredArgument,
                "--follow needs --max-duration (e.g. --follow --max-duration 55s from an \
                 every-minute crontab): a follow publishes new events until then",
            ));
        }
        if poll.ordered && poll.ordered_by_key {
            return Err(Cli::command().error(
                ErrorKind::ArgumentConflict,
                "--ordered and --ordered-by-key exclude each other: choose one order for the \
                 whole table, or one per ordering_key",
            ));
        }
        Ok(self)
    }
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Create or upgrade the outbox table (idempotent).
    Migrate(MigrateArgs),
    /// Backlog figures: pending, due, retrying, dead, oldest pending age.
    Status(StatusArgs),
    /// Make events eligible again: attempts 0, last error cleared, due now.
    Requeue(RequeueArgs),
    /// Delete published events, in small transactions.
    Prune(PruneArgs),
    /// Block until every event committed before it started is published or dead.
    Wait(WaitArgs),
    /// Can this configuration relay? Both servers, the table, the exchange,
    /// the grants; publishes and changes nothing.
    Check(CheckArgs),
    /// Republish archived events (prune --archive) to the broker; never
    /// touches the outbox.
    Replay(ReplayArgs),
    /// Print a shell completion script on stdout.
    Completions {
        /// The shell to complete for.
        shell: clap_complete::Shell,
    },
    /// Print the manual page (roff) on stdout.
    Man,
}

#[derive(Args, Debug)]
pub struct MigrateArgs {
    /// Also install the trigger that wakes `--follow` at each insert (costs
    /// concurrent producers throughput: see the README, Low latency).
    #[arg(long)]
    pub(crate) notify: bool,

    /// Upgrade an existing table the migrations did not create (with
    /// --column for its names): add only the claim order and the relay's
    /// own columns and indexes that it lacks, never touching the others.
    #[arg(long)]
    pub(crate) adopt: bool,
}

#[derive(Args, Debug)]
pub struct StatusArgs {
    /// Add the figures of each event type.
    #[arg(long)]
    pub(crate) by_type: bool,

    /// Exit 1 when any event is dead.
    #[arg(long)]
    pub(crate) fail_if_dead: bool,

    /// Exit 1 when the oldest pending event is older than this.
    #[arg(long, value_name = "DURATION", env = "OUTBOX_FAIL_IF_OLDEST_OVER",
          value_parser = duration_up_to(MAX_AGE))]
    pub(crate) fail_if_oldest_over: Option<Duration>,

    /// Exit 1 when the oldest due event (available now, not backing off)
    /// was created longer ago than this: a relay has stopped or fallen
    /// behind.
    #[arg(long, value_name = "DURATION", env = "OUTBOX_MAX_AGE",
          value_parser = duration_up_to(MAX_AGE))]
    pub(crate) max_age: Option<Duration>,
}

#[derive(Args, Debug)]
#[group(required = true, multiple = false)]
pub struct RequeueArgs {
    /// Every dead event (attempts >= --max-attempts).
    #[arg(long)]
    pub(crate) dead: bool,

    /// These events, by event_id (repeat or list several).
    #[arg(long, value_name = "ID", num_args = 1..)]
    pub(crate) event_id: Vec<String>,

    /// The failed head of each of these ordering keys (--ordered-by-key),
    /// so the key's events go again (repeat or list several).
    #[arg(long, value_name = "KEY", num_args = 1..)]
    pub(crate) key: Vec<String>,
}

/// `check` takes every option of the poll it checks, after its name
/// (`outbox-poll check --exchange events`) or from their variables.
#[derive(Args, Debug)]
pub struct CheckArgs {
    #[command(flatten)]
    pub(crate) poll: PollArgs,
}

#[derive(Args, Debug)]
pub struct WaitArgs {
    /// Give up after this long: exit 1, saying what is left (default: wait
    /// until done, or a signal).
    #[arg(long, value_name = "DURATION", env = "OUTBOX_WAIT_TIMEOUT",
          value_parser = duration_up_to(MAX_TIMEOUT))]
    pub(crate) timeout: Option<Duration>,
}

#[derive(Args, Debug)]
pub struct PruneArgs {
    /// Delete events published longer ago than this (e.g. 7d).
    #[arg(long, value_name = "DURATION", env = "OUTBOX_PRUNE_OLDER_THAN",
          value_parser = duration_up_to(MAX_AGE))]
    pub(crate) older_than: Duration,

    /// Rows deleted per transaction, so no lock is held for long.
    #[arg(long, env = "OUTBOX_PRUNE_BATCH_SIZE", default_value_t = 5000,
          value_parser = clap::value_parser!(i64).range(1..=100_000))]
    pub(crate) batch_size: i64,

    /// Count what would be deleted; delete nothing.
    #[arg(long)]
    pub(crate) dry_run: bool,

    /// Also delete dead events created longer ago than --older-than.
    #[arg(long)]
    pub(crate) include_dead: bool,

    /// Write every row to FILE (JSON Lines; FILE.gz gzip, FILE.zst zstd;
    /// `-` stdout) and sync it before its deletion commits. Never
    /// overwrites a file.
    #[arg(long, value_name = "FILE")]
    pub(crate) archive: Option<PathBuf>,
}

#[derive(Args, Debug)]
pub struct ReplayArgs {
    /// The archive to read (plain, .gz or .zst), checked whole before
    /// anything is published.
    #[arg(long, value_name = "FILE")]
    pub(crate) from: PathBuf,

    /// Only events created at or after this RFC 3339 time.
    #[arg(long, value_name = "RFC3339", value_parser = parse_time)]
    pub(crate) since: Option<jiff::Timestamp>,

    /// Only events created before this RFC 3339 time.
    #[arg(long, value_name = "RFC3339", value_parser = parse_time)]
    pub(crate) until: Option<jiff::Timestamp>,

    /// Only events whose type matches this shell-style pattern (`*`, `?`),
    /// e.g. 'order.*'.
    #[arg(long, value_name = "PATTERN")]
    pub(crate) event_type: Option<String>,

    /// Only these events, by event_id (repeat or list several).
    #[arg(long, value_name = "ID", num_args = 1..)]
    pub(crate) event_id: Vec<String>,

    /// RabbitMQ URL (or several); as the poll's --amqp-url, which it
    /// overrides (AMQP_URL and AMQP_URL_FILE apply).
    #[arg(long, hide_env_values = true)]
    pub(crate) amqp_url: Option<String>,

    /// The exchange of events archived without an exchange column; as the
    /// poll's --exchange, which it overrides (OUTBOX_EXCHANGE applies).
    #[arg(long)]
    pub(crate) exchange: Option<String>,

    /// Time allowed for each batch's publisher confirms.
    #[arg(long, value_name = "DURATION", value_parser = duration_up_to(MAX_TIMEOUT))]
    pub(crate) confirm_timeout: Option<Duration>,
}

/// An RFC 3339 time with its offset: `2026-12-01T00:00:00Z`.
fn parse_time(text: &str) -> Result<jiff::Timestamp, String> {
    text.parse()
        .map_err(|error| format!("{error} (expected an RFC 3339 time, e.g. 2026-12-01T00:00:00Z)"))
}

/// Options every subcommand needs to find the outbox.
#[derive(Args, Debug)]
pub struct DatabaseArgs {
    /// PostgreSQL URL or key=value string, as libpq reads it (several hosts,
    /// sslmode, target_session_attrs...); without it, libpq's PG* variables
    /// and files. DATABASE_URL_FILE names a file holding it instead.
    #[arg(long, env = "DATABASE_URL", global = true, hide_env_values = true)]
    pub(crate) database_url: Option<String>,

    /// Outbox table, optionally schema-qualified; or a comma-separated
    /// list of names and shell-style patterns over schema-qualified names
    /// ('tenant_*.outbox'), resolved from the catalog at every run.
    #[arg(long, env = "OUTBOX_TABLE", default_value = "outbox", global = true)]
    pub(crate) table: String,

    /// The table's own column for each role, for a table the migrations
    /// did not create: e.g. event_id=id,event_type=type,routing_key=aggregatetype
    /// (roles: the contract's columns and the optional ones).
    #[arg(long = "column", env = "OUTBOX_COLUMNS", value_name = "ROLE=NAME,...",
          global = true, value_parser = Names::parse)]
    pub columns: Option<Names>,

    /// A file listing the databases to serve, one connection string (URL,
    /// key=value or service=NAME) per line; --database-url and the PG*
    /// variables give what a line leaves out.
    #[arg(
        long,
        env = "OUTBOX_DATABASES_FILE",
        value_name = "FILE",
        global = true
    )]
    pub(crate) databases: Option<PathBuf>,

    /// Serve only shard I of N of the selected outboxes (by a stable hash
    /// of database and table), e.g. 2/4 or $JOB_COMPLETION_INDEX/4.
    #[arg(long, env = "OUTBOX_SHARD", value_name = "I/N", global = true,
          value_parser = parse_shard)]
    pub(crate) shard: Option<Shard>,

    /// PostgreSQL sessions a run may hold at once, over every database.
    #[arg(long, env = "OUTBOX_MAX_CONNECTIONS", default_value_t = 8, global = true,
          value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub(crate) max_connections: u32,

    /// A row with attempts >= N is dead: never claimed again.
    #[arg(long, env = "OUTBOX_MAX_ATTEMPTS", default_value_t = DEFAULT_MAX_ATTEMPTS, global = true,
          value_parser = clap::value_parser!(i32).range(1..))]
    pub(crate) max_attempts: i32,

    /// Timeout for connecting to each of PostgreSQL and RabbitMQ.
    #[arg(long, env = "OUTBOX_CONNECT_TIMEOUT", default_value = "10s", global = true,
          value_parser = duration_up_to(MAX_TIMEOUT))]
    pub(crate) connect_timeout: Duration,
}

/// Options of the poll run itself.
#[derive(Args, Debug)]
pub struct PollArgs {
    /// RabbitMQ URL, or several (the nodes of one cluster, tried in order)
    /// separated by commas or spaces; amqps:// takes cacertfile, certfile,
    /// keyfile, verify and server_name_indication. AMQP_URL_FILE names a
    /// file holding it instead.
    #[arg(
        long,
        env = "AMQP_URL",
        default_value = "amqp://guest:guest@localhost:5672/%2f",
        hide_default_value = true,
        hide_env_values = true
    )]
    pub(crate) amqp_url: String,

    /// Exchange to publish to; the routing key is the event type (or the routing_key column).
    #[arg(long, env = "OUTBOX_EXCHANGE", default_value = "outbox")]
    pub(crate) exchange: String,

    /// Declare the exchange (durable) of this kind instead of checking that it exists.
    #[arg(long, env = "OUTBOX_DECLARE_EXCHANGE", value_enum)]
    pub(crate) declare_exchange: Option<ExchangeKind>,

    /// Events claimed per batch (one transaction).
    #[arg(long, env = "OUTBOX_BATCH_SIZE", default_value_t = 100,
          value_parser = clap::value_parser!(u32).range(1..=10_000))]
    pub(crate) batch_size: u32,

    /// Payload bytes a batch may hold, and all the batches a drain has in
    /// flight together: past it a claim takes no more events (though always
    /// its first). Bounds the memory a run needs.
    #[arg(long, env = "OUTBOX_BATCH_BYTES", value_name = "SIZE", default_value = "16MiB",
          value_parser = parse_bytes)]
    pub(crate) batch_bytes: u64,

    /// Batch after batch, each its own transaction, until none is claimed.
    #[arg(long, env = "OUTBOX_DRAIN", action = ArgAction::SetTrue,
          value_parser = clap::builder::BoolishValueParser::new())]
    pub(crate) drain: bool,

    /// A drain that keeps publishing new events as they commit, until
    /// --max-duration (required with it) or a signal.
    #[arg(long, env = "OUTBOX_FOLLOW", action = ArgAction::SetTrue,
          value_parser = clap::builder::BoolishValueParser::new())]
    pub(crate) follow: bool,

    /// With --drain: stop after N batches.
    #[arg(long, env = "OUTBOX_MAX_BATCHES", value_parser = clap::value_parser!(u64).range(1..))]
    pub(crate) max_batches: Option<u64>,

    /// With --drain: start no new batch after this long.
    #[arg(long, env = "OUTBOX_MAX_DURATION", value_parser = duration_up_to(MAX_RUN))]
    pub(crate) max_duration: Option<Duration>,

    /// One publisher per table, strict order, stop a batch at its first failure.
    #[arg(long, env = "OUTBOX_ORDERED", action = ArgAction::SetTrue,
          value_parser = clap::builder::BoolishValueParser::new())]
    pub(crate) ordered: bool,

    /// Order per ordering_key: one event of a key at a time, keys in parallel.
    #[arg(long, env = "OUTBOX_ORDERED_BY_KEY", action = ArgAction::SetTrue,
          value_parser = clap::builder::BoolishValueParser::new())]
    pub(crate) ordered_by_key: bool,

    /// What becomes of a confirmed event: marked published, or deleted.
    #[arg(long, env = "OUTBOX_ON_PUBLISH", value_enum, default_value_t = OnPublish::Mark)]
    pub(crate) on_publish: OnPublish,

    /// Print the claimed batch as JSON lines, publish nothing, roll back.
    #[arg(long)]
    pub(crate) dry_run: bool,

    /// Time allowed for the whole batch's publisher confirms.
    #[arg(long, env = "OUTBOX_CONFIRM_TIMEOUT", default_value = "30s",
          value_parser = duration_up_to(MAX_TIMEOUT))]
    pub(crate) confirm_timeout: Duration,

    /// After the run, write Prometheus gauges to this file (written, then renamed).
    #[arg(long, env = "OUTBOX_METRICS_FILE", value_name = "PATH")]
    pub(crate) metrics_file: Option<PathBuf>,
}

/// `--shard I/N`: this run serves shard `index` of `count`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Shard {
    pub(crate) index: u32,
    pub(crate) count: u32,
}

/// `I/N` with N at least 1 and I in 0..N: anything else is a usage error.
fn parse_shard(text: &str) -> Result<Shard, String> {
    let usage = "expected I/N with 0 <= I < N, e.g. 0/4 (I may be $JOB_COMPLETION_INDEX)";
    let (index, count) = text.split_once('/').ok_or(usage)?;
    let (Ok(index), Ok(count)) = (index.trim().parse::<u32>(), count.trim().parse::<u32>()) else {
        return Err(usage.into());
    };
    if count == 0 || index >= count {
        return Err(format!(
            "shard {index} is outside 0..{}: {usage}",
            count.max(1) - 1
        ));
    }
    Ok(Shard { index, count })
}

/// `500ms`, `30s`, `5m`, `7d`, as humantime reads them; zero is refused,
/// since a zero timeout or limit can never be what the operator meant.
fn parse_duration(text: &str) -> Result<Duration, String> {
    let duration = humantime::parse_duration(text)
        .map_err(|error| format!("{error} (examples: 500ms, 30s, 5m, 7d)"))?;
    if duration.is_zero() {
        return Err("must be longer than zero".into());
    }
    Ok(duration)
}

/// The largest --batch-bytes: a batch's payloads are in memory about twice
/// over while it is published (the events, and the client's frames).
pub(crate) const MAX_BATCH_BYTES: u64 = 1 << 30;

/// `16MiB`, `500kB`, `1048576`: bytes, with an optional unit (kB, MB, GB
/// count in thousands, KiB, MiB, GiB in 1024s), from 1 byte to 1GiB.
fn parse_bytes(text: &str) -> Result<u64, String> {
    let digits = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(digits);
    let number: u64 = number
        .parse()
        .map_err(|_| "expected bytes, e.g. 16MiB, 500kB or 1048576".to_string())?;
    let scale: u64 = match unit.trim() {
        "" | "B" => 1,
        "kB" => 1_000,
        "KiB" => 1 << 10,
        "MB" => 1_000_000,
        "MiB" => 1 << 20,
        "GB" => 1_000_000_000,
        "GiB" => 1 << 30,
        other => {
            return Err(format!(
                "unknown unit {other:?}: use B, kB, MB, GB, KiB, MiB or GiB"
            ));
        }
    };
    match number.checked_mul(scale) {
        Some(bytes) if (1..=MAX_BATCH_BYTES).contains(&bytes) => Ok(bytes),
        _ => Err("must be from 1 byte to 1GiB".into()),
    }
}

/// parse_duration, refusing anything longer than `max`: a usage error that
/// names the option and its maximum, never a panic or an overflow later.
fn duration_up_to(
    max: Duration,
) -> impl Fn(&str) -> Result<Duration, String> + Clone + Send + Sync + 'static {
    move |text| {
        let duration = parse_duration(text)?;
        if duration > max {
            return Err(format!(
                "longer than the {} this option allows",
                humantime::format_duration(max)
            ));
        }
        Ok(duration)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn definition_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn follow_needs_a_max_duration() {
        let parse = |args: &[&str]| Cli::try_parse_from(args).unwrap().checked();
        let error = parse(&["outbox-poll", "--follow"]).unwrap_err();
        assert_eq!(error.kind(), ErrorKind::MissingRequiredArgument);
        assert!(parse(&["outbox-poll", "--follow", "--max-duration", "55s"]).is_ok());
        assert!(parse(&["outbox-poll", "--max-duration", "55s"]).is_ok());
    }

    #[test]
    fn a_shard_is_an_index_below_its_count() {
        assert_eq!(parse_shard("2/4"), Ok(Shard { index: 2, count: 4 }));
        assert_eq!(parse_shard("0/1"), Ok(Shard { index: 0, count: 1 }));
        for bad in ["4/4", "-1/4", "1/0", "1", "a/b", "1/4/5"] {
            assert!(parse_shard(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn durations_read_as_operators_write_them() {
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("5m"), Ok(Duration::from_secs(300)));
        assert_eq!(parse_duration("7d"), Ok(Duration::from_secs(7 * 86_400)));
        assert!(parse_duration("0s").is_err());
        assert!(parse_duration("soon").is_err());
    }

    #[test]
    fn byte_sizes_read_with_their_units() {
        assert_eq!(parse_bytes("16MiB"), Ok(16 << 20));
        assert_eq!(parse_bytes("500kB"), Ok(500_000));
        assert_eq!(parse_bytes("1048576"), Ok(1 << 20));
        assert_eq!(parse_bytes("1 GiB"), Ok(1 << 30));
        for bad in ["0", "2GiB", "16XB", "MiB", "-1", "99999999999999999999"] {
            assert!(parse_bytes(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_duration_past_its_options_maximum_is_refused_by_name() {
        let timeout = duration_up_to(MAX_TIMEOUT);
        assert_eq!(timeout("1day"), Ok(MAX_TIMEOUT));
        assert_eq!(
            timeout("25d"),
            Err("longer than the 1day this option allows".into())
        );
        assert!(timeout("300000000000years").is_err());
        let error = Cli::command()
            .try_get_matches_from(["outbox-poll", "--connect-timeout", "300000000000years"])
            .unwrap_err();
        assert_eq!(error.kind(), clap::error::ErrorKind::ValueValidation);
        let text = error.to_string();
        assert!(
            text.contains("--connect-timeout") && text.contains("1day"),
            "{text}"
        );
    }
}
