//! outbox-poll: relay one batch of a PostgreSQL transactional outbox to
//! RabbitMQ, then exit with a code cron and CI can act on. The work is in
//! the library (src/lib.rs names its parts); this is its table of contents.

use std::process::ExitCode;

use anyhow::Result;
use outbox_poll::cli::{Cli, Command};
use outbox_poll::commands::{generate, migrate, prune, requeue, status, wait};
use outbox_poll::config::{Database, Relay};
use outbox_poll::connect::libpq::process_env;
use outbox_poll::exit::{self, Exit};
use outbox_poll::report::stderr;
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
    let database = Database::from_args(&cli.database, &process_env);
    match &cli.command {
        None => {
            let settings = database.and_then(|database| {
                let relay = Relay::from_cli(cli, &database)?;
                Ok((database, relay))
            });
            relay::run(cli.json, settings)
        }
        Some(Command::Migrate(args)) => migrate::run(&database?, args),
        Some(Command::Status(args)) => status::run(&database?, cli.json, args),
        Some(Command::Requeue(args)) => requeue::run(&database?, cli.json, args),
        Some(Command::Prune(args)) => prune::run(&database?, cli.json, args),
        Some(Command::Wait(args)) => wait::run(&database?, cli.json, args),
        Some(Command::Completions { shell }) => generate::completions(*shell),
        Some(Command::Man) => generate::man(),
    }
}
