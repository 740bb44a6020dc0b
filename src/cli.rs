//! The command line, exactly as the contract names it (the README's
//! "Command line"). Only parsing lives here; `config` turns it into
//! typed settings.

use std::path::PathBuf;
use std::time::Duration;

use clap::{ArgAction, Args, Parser, Subcommand, ValueEnum};

/// --max-attempts when not given: the tenth failure makes an event dead.
pub const DEFAULT_MAX_ATTEMPTS: i32 = 10;

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

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Create or upgrade the outbox table (idempotent).
    Migrate,
    /// Backlog figures: pending, due, retrying, dead, oldest pending age.
    Status(StatusArgs),
    /// Make events eligible again: attempts 0, last error cleared, due now.
    Requeue(RequeueArgs),
    /// Delete published events, in small transactions.
    Prune(PruneArgs),
    /// Print a shell completion script on stdout.
    Completions {
        /// The shell to complete for.
        shell: clap_complete::Shell,
    },
    /// Print the manual page (roff) on stdout.
    Man,
}

#[derive(Args, Debug)]
pub struct StatusArgs {
    /// Add the figures of each event type.
    #[arg(long)]
    pub by_type: bool,

    /// Exit 1 when any event is dead.
    #[arg(long)]
    pub fail_if_dead: bool,

    /// Exit 1 when the oldest pending event is older than this.
    #[arg(long, value_name = "DURATION", env = "OUTBOX_FAIL_IF_OLDEST_OVER",
          value_parser = parse_duration)]
    pub fail_if_oldest_over: Option<Duration>,
}

#[derive(Args, Debug)]
#[group(required = true, multiple = false)]
pub struct RequeueArgs {
    /// Every dead event (attempts >= --max-attempts).
    #[arg(long)]
    pub dead: bool,

    /// These events, by event_id (repeat or list several).
    #[arg(long, value_name = "ID", num_args = 1..)]
    pub event_id: Vec<String>,
}

#[derive(Args, Debug)]
pub struct PruneArgs {
    /// Delete events published longer ago than this (e.g. 7d).
    #[arg(long, value_name = "DURATION", env = "OUTBOX_PRUNE_OLDER_THAN",
          value_parser = parse_duration)]
    pub older_than: Duration,

    /// Rows deleted per transaction, so no lock is held for long.
    #[arg(long, env = "OUTBOX_PRUNE_BATCH_SIZE", default_value_t = 5000,
          value_parser = clap::value_parser!(i64).range(1..=100_000))]
    pub batch_size: i64,

    /// Count what would be deleted; delete nothing.
    #[arg(long)]
    pub dry_run: bool,

    /// Also delete dead events created longer ago than --older-than.
    #[arg(long)]
    pub include_dead: bool,
}

/// Options every subcommand needs to find the outbox.
#[derive(Args, Debug)]
pub struct DatabaseArgs {
    /// PostgreSQL URL or key=value string, as libpq reads it (several hosts,
    /// sslmode, target_session_attrs...); without it, libpq's PG* variables
    /// and files.
    #[arg(long, env = "DATABASE_URL", global = true, hide_env_values = true)]
    pub database_url: Option<String>,

    /// Outbox table, optionally schema-qualified.
    #[arg(long, env = "OUTBOX_TABLE", default_value = "outbox", global = true)]
    pub table: String,

    /// A row with attempts >= N is dead: never claimed again.
    #[arg(long, env = "OUTBOX_MAX_ATTEMPTS", default_value_t = DEFAULT_MAX_ATTEMPTS, global = true,
          value_parser = clap::value_parser!(i32).range(1..))]
    pub max_attempts: i32,

    /// Timeout for connecting to each of PostgreSQL and RabbitMQ.
    #[arg(long, env = "OUTBOX_CONNECT_TIMEOUT", default_value = "10s", global = true,
          value_parser = parse_duration)]
    pub connect_timeout: Duration,
}

/// Options of the poll run itself.
#[derive(Args, Debug)]
pub struct PollArgs {
    /// RabbitMQ URL, or several (the nodes of one cluster, tried in order)
    /// separated by commas or spaces; amqps:// takes cacertfile, certfile,
    /// keyfile, verify and server_name_indication.
    #[arg(
        long,
        env = "AMQP_URL",
        default_value = "amqp://guest:guest@localhost:5672/%2f",
        hide_default_value = true,
        hide_env_values = true
    )]
    pub amqp_url: String,

    /// Exchange to publish to; the routing key is the event type.
    #[arg(long, env = "OUTBOX_EXCHANGE", default_value = "outbox")]
    pub exchange: String,

    /// Declare the exchange (durable) of this kind instead of checking that it exists.
    #[arg(long, env = "OUTBOX_DECLARE_EXCHANGE", value_enum)]
    pub declare_exchange: Option<ExchangeKind>,

    /// Events claimed per batch (one transaction).
    #[arg(long, env = "OUTBOX_BATCH_SIZE", default_value_t = 100,
          value_parser = clap::value_parser!(u32).range(1..=10_000))]
    pub batch_size: u32,

    /// Batch after batch, each its own transaction, until none is claimed.
    #[arg(long, env = "OUTBOX_DRAIN", action = ArgAction::SetTrue,
          value_parser = clap::builder::BoolishValueParser::new())]
    pub drain: bool,

    /// With --drain: stop after N batches.
    #[arg(long, env = "OUTBOX_MAX_BATCHES", value_parser = clap::value_parser!(u64).range(1..))]
    pub max_batches: Option<u64>,

    /// With --drain: start no new batch after this long.
    #[arg(long, env = "OUTBOX_MAX_DURATION", value_parser = parse_duration)]
    pub max_duration: Option<Duration>,

    /// One publisher per table, strict id order, stop a batch at its first failure.
    #[arg(long, env = "OUTBOX_ORDERED", action = ArgAction::SetTrue,
          value_parser = clap::builder::BoolishValueParser::new())]
    pub ordered: bool,

    /// Print the claimed batch as JSON lines, publish nothing, roll back.
    #[arg(long)]
    pub dry_run: bool,

    /// Time allowed for the whole batch's publisher confirms.
    #[arg(long, env = "OUTBOX_CONFIRM_TIMEOUT", default_value = "30s",
          value_parser = parse_duration)]
    pub confirm_timeout: Duration,

    /// After the run, write Prometheus gauges to this file (written, then renamed).
    #[arg(long, env = "OUTBOX_METRICS_FILE", value_name = "PATH")]
    pub metrics_file: Option<PathBuf>,
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum ExchangeKind {
    Direct,
    Fanout,
    Topic,
    Headers,
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

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn definition_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn durations_read_as_operators_write_them() {
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("5m"), Ok(Duration::from_secs(300)));
        assert_eq!(parse_duration("7d"), Ok(Duration::from_secs(7 * 86_400)));
        assert!(parse_duration("0s").is_err());
        assert!(parse_duration("soon").is_err());
    }
}
