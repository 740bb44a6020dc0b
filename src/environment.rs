//! The environment variables of the command line, read as
//! docs/src/command-line.md says: a variable set to the empty string counts as unset, and a value
//! that does not parse is named by its variable (`OUTBOX_BATCH_SIZE="abc"
//! is not a valid --batch-size: ...`), exit 2, while a flag given on the
//! command line still wins over its variable.
//!
//! clap 4 reads every variable it is told of when the command is built and
//! takes a set variable's value as given, the empty string included: an
//! empty OUTBOX_BATCH_SIZE fails to parse, and its error names only
//! `--batch-size`. So each variable is checked here first, with the
//! argument's own value parser, and clap is told to ignore the empty and
//! the bad ones; a bad one is an error unless its flag was given.

use std::error::Error as _;
use std::ffi::{OsStr, OsString};

use clap::error::{ContextKind, ContextValue, ErrorKind};
use clap::parser::ValueSource;
use clap::{Arg, ArgAction, ArgMatches, Command, CommandFactory, FromArgMatches};

use crate::cli::Cli;
use crate::connect::secrets;
use crate::report::stderr;

/// A variable whose value does not parse.
struct Bad {
    /// The subcommand whose argument it is; None for the top level's.
    subcommand: Option<String>,
    /// A global option (every command reads it), or the poll run's own.
    global: bool,
    arg: clap::Id,
    message: String,
}

/// The command line, with the environment read as docs/src/command-line.md says.
/// Exits 2 (clap's usage error) on a bad command line or a bad variable.
pub fn parse() -> Cli {
    let mut bad = Vec::new();
    let mut command = Cli::command().mut_args(|arg| read_env(arg, None, &mut bad));
    let names: Vec<String> = command
        .get_subcommands()
        .map(|sub| sub.get_name().to_owned())
        .collect();
    for name in names {
        command = command.mut_subcommand(&name, |sub| {
            sub.mut_args(|arg| read_env(arg, Some(&name), &mut bad))
        });
    }
    let matches = command
        .clone()
        .try_get_matches()
        .unwrap_or_else(|error| error.exit());
    if let Some(bad) = bad.iter().find(|bad| !given(&matches, bad)) {
        command
            .error(ErrorKind::ValueValidation, &bad.message)
            .exit();
    }
    url_sources(&mut command, &matches);
    poll_options_before_a_subcommand(&mut command, &matches);
    Cli::from_arg_matches(&matches)
        .and_then(Cli::checked)
        .unwrap_or_else(|error| error.exit())
}

/// The URLs' file variables (`connect::secrets`): given with their
/// variable or their flag, exit 2; a password in a flag's URL, one warning.
fn url_sources(command: &mut Command, matches: &ArgMatches) {
    let mut with_password = Vec::new();
    for source in [&secrets::DATABASE, &secrets::AMQP] {
        let given = on_command_line(matches, source.id);
        if let Some(message) = secrets::conflict(source, given.is_some()) {
            command.error(ErrorKind::ArgumentConflict, message).exit();
        }
        if given.is_some_and(|url| secrets::has_password(&url)) {
            with_password.push(source);
        }
    }
    if let Some(warning) = secrets::warning(&with_password) {
        stderr::line(&warning);
    }
}

/// A poll's own options (those not global) given before a subcommand's
/// name: `check` reads them after its name, `replay` reads the broker's
/// four, and the others read none. One given where it is not read is
/// refused (exit 2) rather than silently left out.
fn poll_options_before_a_subcommand(command: &mut Command, matches: &ArgMatches) {
    let Some(name) = matches.subcommand_name().map(str::to_owned) else {
        return;
    };
    let read: &[&str] = match name.as_str() {
        "replay" => &[
            "amqp-url",
            "exchange",
            "declare-exchange",
            "confirm-timeout",
        ],
        _ => &[],
    };
    let before = command.get_arguments().find(|arg| {
        !arg.is_global_set()
            && arg.get_long().is_some_and(|long| !read.contains(&long))
            && matches.value_source(arg.get_id().as_str()) == Some(ValueSource::CommandLine)
    });
    let Some(flag) = before.and_then(Arg::get_long).map(str::to_owned) else {
        return;
    };
    let message = match name.as_str() {
        "check" => format!(
            "--{flag} is given before `check`, which reads the poll's options after its name: \
             outbox-poll check --{flag} ..."
        ),
        _ => format!(
            "--{flag} is an option of a poll, which `{name}` does not read: leave it out, or \
             run the poll without `{name}`"
        ),
    };
    command.error(ErrorKind::ArgumentConflict, message).exit();
}

/// The value of the option `id` when the command line gave it, at the top
/// level or in the subcommand run (a global option may be given in both).
fn on_command_line(matches: &ArgMatches, id: &str) -> Option<String> {
    let levels = std::iter::once(matches).chain(matches.subcommand().map(|(_, sub)| sub));
    for level in levels {
        // A subcommand without the option: asking its source would panic.
        let Ok(given) = level.try_get_one::<String>(id) else {
            continue;
        };
        if level.value_source(id) == Some(ValueSource::CommandLine) {
            return given.cloned();
        }
    }
    None
}

/// `arg` as clap should see it: without its variable when that is empty,
/// or when its value does not parse (noted in `bad`).
fn read_env(arg: Arg, subcommand: Option<&str>, bad: &mut Vec<Bad>) -> Arg {
    let Some(name) = arg.get_env().map(OsStr::to_owned) else {
        return arg;
    };
    let Some(value) = std::env::var_os(&name) else {
        return arg;
    };
    if value.is_empty() {
        return arg.env(None);
    }
    match check(&arg, &value) {
        Ok(()) => arg,
        Err(error) => {
            bad.push(Bad {
                subcommand: subcommand.map(str::to_owned),
                global: arg.is_global_set(),
                arg: arg.get_id().clone(),
                message: describe(&arg, &name, &value, &error),
            });
            arg.env(None)
        }
    }
}

/// Parses `value` as clap parses a variable's value for `arg`: with the
/// argument's own value parser (a flag's variable too: `OUTBOX_DRAIN=yes`
/// goes through its boolean parser), on a command of its own.
fn check(arg: &Arg, value: &OsStr) -> Result<(), clap::Error> {
    let probe = Arg::new("probe")
        .long("probe")
        .action(ArgAction::Set)
        .value_parser(arg.get_value_parser().clone());
    // `--probe=VALUE`, so that a value starting with `-` is a value.
    let mut given = OsString::from("--probe=");
    given.push(value);
    Command::new("probe")
        .arg(probe)
        .try_get_matches_from([OsString::from("probe"), given])
        .map(|_| ())
}

/// `OUTBOX_BATCH_SIZE="abc" is not a valid --batch-size: why`; never the
/// value of a variable clap hides (the URLs: they may hold a password).
fn describe(arg: &Arg, name: &OsStr, value: &OsString, error: &clap::Error) -> String {
    let name = name.to_string_lossy();
    let shown = match arg.is_hide_env_values_set() {
        true => format!("{name} (value not shown)"),
        false => format!("{name}={:?}", value.to_string_lossy()),
    };
    let flag = arg.get_long().unwrap_or_default();
    format!("{shown} is not a valid --{flag}: {}", reason(error))
}

fn reason(error: &clap::Error) -> String {
    if let Some(source) = error.source() {
        return source.to_string();
    }
    if let Some(ContextValue::Strings(valid)) = error.get(ContextKind::ValidValue) {
        return format!("expected one of {}", valid.join(", "));
    }
    error
        .kind()
        .as_str()
        .unwrap_or("not a valid value")
        .to_owned()
}

/// Whether the variable of `bad`'s argument does not matter: its flag was
/// given on the command line (the flag wins), or the command run does not
/// read it (a subcommand reads the global options and its own, not the
/// poll run's).
fn given(matches: &ArgMatches, bad: &Bad) -> bool {
    let matches = match &bad.subcommand {
        None if matches.subcommand_name().is_some() && !bad.global => None,
        None => Some(matches),
        Some(name) => matches.subcommand_matches(name),
    };
    // A subcommand not invoked does not read its variables at all.
    matches.is_none_or(|matches| {
        matches.value_source(bad.arg.as_str()) == Some(ValueSource::CommandLine)
    })
}
