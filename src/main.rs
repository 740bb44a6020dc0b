//! outbox-poll: relay one batch of a PostgreSQL transactional outbox to
//! RabbitMQ, then exit with a code cron and CI can act on. The work is in
//! the library (src/lib.rs names its parts); this is its table of contents.

#![forbid(unsafe_code)]

use std::process::ExitCode;

use anyhow::Result;
use outbox_poll::cli::{Cli, Command};
use outbox_poll::commands::{check, generate, migrate, prune, replay, requeue, status, wait};
use outbox_poll::config::{Database, Relay};
use outbox_poll::connect::libpq::process_env;
use outbox_poll::exit::{self, Exit};
use outbox_poll::plan::Selection;
use outbox_poll::report::stderr;
use outbox_poll::sql::names;
use outbox_poll::{environment, relay, report};

fn main() -> ExitCode {
    let cli = environment::parse();
    report::logging::init(cli.verbose);
    report::panic::one_line();
    match run(&cli) {
        Ok(exit) => exit.into(),
        // A signal's stop is what the operator asked for, not an error.
        Err(error) if exit::is_stop(&error) => {
            stderr::line(&format!("outbox-poll: {error:#}"));
            Exit::of(&error).into()
        }
        Err(error) => {
            // One line, `{:#}`: never Debug output, so never a backtrace.
            stderr::line(&format!("outbox-poll: error: {error:#}"));
            Exit::of(&error).into()
        }
    }
}

fn run(cli: &Cli) -> Result<Exit> {
    if let Some(names) = &cli.database.columns {
        names::set(names.clone());
    }
    // Replay reads a file and publishes: it has no outbox to select.
    if let Some(Command::Replay(args)) = &cli.command {
        return replay::run(cli, args);
    }
    // Many outboxes: a --table list or pattern, --databases or --shard.
    match Selection::from_args(&cli.database, &process_env) {
        Ok(Some(selection)) => return many(cli, selection),
        Ok(None) => {}
        Err(error) if cli.command.is_none() => return relay::many::run(cli.json, Err(error)),
        Err(error) => return Err(error),
    }
    let database = Database::from_args(&cli.database, &process_env);
    match &cli.command {
        None => {
            let settings = database.and_then(|database| {
                let relay = Relay::from_args(&cli.poll, &database)?;
                Ok((database, relay))
            });
            relay::run(cli.json, settings)
        }
        Some(Command::Migrate(args)) => migrate::run(&database?, args),
        Some(Command::Status(args)) => status::run(&database?, cli.json, args),
        Some(Command::Requeue(args)) => requeue::run(&database?, cli.json, args),
        Some(Command::Prune(args)) => {
            let database = database?;
            prune::archived(args, |archive| {
                prune::run(&database, cli.json, args, archive)
            })
        }
        Some(Command::Wait(args)) => wait::run(&database?, cli.json, args),
        Some(Command::Check(args)) => check::run(&database?, cli.json, args),
        Some(Command::Replay(args)) => replay::run(cli, args),
        Some(Command::Completions { shell }) => generate::completions(*shell),
        Some(Command::Man) => generate::man(),
    }
}

/// A command over the outboxes of a selection.
fn many(cli: &Cli, selection: Selection) -> Result<Exit> {
    match &cli.command {
        None => {
            let relay = Relay::for_sessions(
                &cli.poll,
                selection.connect_timeout,
                selection.connect_budget(),
                selection.most_hosts(),
            );
            relay::many::run(cli.json, relay.map(|relay| (selection, relay)))
        }
        Some(Command::Status(args)) => status::run_many(&selection, cli.json, args),
        Some(Command::Migrate(args)) => migrate::run_many(&selection, args),
        Some(Command::Requeue(args)) => requeue::run_many(&selection, cli.json, args),
        Some(Command::Prune(args)) => prune::archived(args, |archive| {
            prune::run_many(&selection, cli.json, args, archive)
        }),
        Some(Command::Wait(args)) => wait::run_many(&selection, cli.json, args),
        Some(Command::Check(args)) => check::run_many(&selection, cli.json, args),
        Some(Command::Replay(args)) => replay::run(cli, args),
        Some(Command::Completions { shell }) => generate::completions(*shell),
        Some(Command::Man) => generate::man(),
    }
}
