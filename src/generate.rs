//! Shell completions and the manual page, generated from the clap
//! definition itself so they can never drift from the real options.

use std::io::Write;

use anyhow::{Context, Result};
use clap::CommandFactory;

use crate::cli::Cli;
use crate::exit;

/// `outbox-poll completions SHELL`: e.g. `outbox-poll completions bash >
/// /etc/bash_completion.d/outbox-poll`.
pub fn completions(shell: clap_complete::Shell) -> Result<u8> {
    let mut out = Vec::new();
    clap_complete::generate(shell, &mut Cli::command(), "outbox-poll", &mut out);
    write_stdout(&out)
}

/// `outbox-poll man`: e.g. `outbox-poll man > /usr/local/share/man/man1/outbox-poll.1`.
pub fn man() -> Result<u8> {
    let mut out = Vec::new();
    clap_mangen::Man::new(Cli::command())
        .render(&mut out)
        .context("rendering the manual page")?;
    write_stdout(&out)
}

fn write_stdout(bytes: &[u8]) -> Result<u8> {
    let mut stdout = std::io::stdout().lock();
    stdout
        .write_all(bytes)
        .and_then(|()| stdout.flush())
        .context("writing to stdout")?;
    Ok(exit::SUCCESS)
}
