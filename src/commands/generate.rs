//! Shell completions and the manual page, generated from the clap
//! definition itself so they can never drift from the real options.

use anyhow::{Context, Result};
use clap::CommandFactory;

use crate::cli::Cli;
use crate::exit::Exit;
use crate::report::stdout;

/// `outbox-poll completions SHELL`: e.g. `outbox-poll completions bash >
/// /etc/bash_completion.d/outbox-poll`.
pub fn completions(shell: clap_complete::Shell) -> Result<Exit> {
    let mut out = Vec::new();
    clap_complete::generate(shell, &mut Cli::command(), "outbox-poll", &mut out);
    stdout::write(&out).map_err(stdout::unwritable)?;
    Ok(Exit::Success)
}

/// `outbox-poll man`: e.g. `outbox-poll man > /usr/local/share/man/man1/outbox-poll.1`.
pub fn man() -> Result<Exit> {
    let mut out = Vec::new();
    clap_mangen::Man::new(Cli::command())
        .render(&mut out)
        .context("rendering the manual page")?;
    stdout::write(&out).map_err(stdout::unwritable)?;
    Ok(Exit::Success)
}
