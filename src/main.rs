//! outbox-poll: relay one batch of a PostgreSQL transactional outbox to
//! RabbitMQ, then exit with a code cron and CI can act on.

mod batch;
mod cli;
mod config;
mod conninfo;
mod db;
mod drain;
mod exit;
mod generate;
mod logging;
mod metrics;
mod migrate;
mod outbox;
mod poll;
mod progress;
mod prune;
mod publisher;
mod requeue;
mod round;
mod status;
mod stop;
mod table;
mod urls;
mod watchdog;

use std::process::ExitCode;

use anyhow::Result;
use clap::Parser;

use crate::cli::{Cli, Command};
use crate::config::{Database, Poll};

fn main() -> ExitCode {
    let cli = Cli::parse();
    logging::init(cli.verbose);
    match run(&cli) {
        Ok(code) => ExitCode::from(code),
        Err(error) => {
            // One line, `{:#}`: never Debug output, so never a backtrace.
            eprintln!("outbox-poll: error: {error:#}");
            ExitCode::from(exit::code_of(&error))
        }
    }
}

fn run(cli: &Cli) -> Result<u8> {
    let database = Database::from_args(&cli.database, &urls::process_env);
    match &cli.command {
        None => {
            let settings = database.and_then(|database| {
                let poll = Poll::from_cli(cli, &database)?;
                Ok((database, poll))
            });
            poll::run(cli.json, settings)
        }
        Some(Command::Migrate) => migrate::run(&database?),
        Some(Command::Status(args)) => status::run(&database?, cli.json, args),
        Some(Command::Requeue(args)) => requeue::run(&database?, cli.json, args),
        Some(Command::Prune(args)) => prune::run(&database?, cli.json, args),
        Some(Command::Completions { shell }) => generate::completions(*shell),
        Some(Command::Man) => generate::man(),
    }
}
