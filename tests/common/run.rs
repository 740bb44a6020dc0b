//! Running the binary: the command a fixture configures and the Run it
//! gives back, and signals to a run still going.

use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

use super::fixture::Fixture;
use super::servers::amqp_url;

pub const BIN: &str = env!("CARGO_BIN_EXE_outbox-poll");

/// The result of one run of the binary.
pub struct Run {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

impl Run {
    pub fn from(output: Output) -> Run {
        Run {
            code: output.status.code().unwrap_or(-1),
            stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
        }
    }

    /// The --json summary's fields.
    pub fn summary(&self) -> serde_json::Value {
        let line = self
            .stdout
            .lines()
            .last()
            .unwrap_or_else(|| panic!("no stdout; stderr: {}", self.stderr));
        serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line:?}"))
    }

    pub fn field(&self, name: &str) -> i64 {
        self.summary()[name]
            .as_i64()
            .unwrap_or_else(|| panic!("no {name} in {}", self.stdout))
    }
}

impl Fixture {
    /// The binary, pointed at this fixture's table, exchange and servers,
    /// with nothing inherited from the environment that could change it.
    pub fn command(&self) -> Command {
        self.configured(Command::new(BIN))
    }

    /// A shell (`bash -c SCRIPT`) in the binary's environment, with
    /// `outbox-poll` first on its PATH: for the docs' runnable blocks.
    pub fn shell(&self, script: &str) -> Command {
        let bin = std::path::Path::new(BIN)
            .parent()
            .expect("the binary's directory");
        let path = match std::env::var_os("PATH") {
            Some(path) => format!("{}:{}", bin.display(), path.to_string_lossy()),
            None => bin.display().to_string(),
        };
        let mut command = self.configured(Command::new("bash"));
        command
            .env("PATH", path)
            .args(["-euo", "pipefail", "-c", script]);
        command
    }

    fn configured(&self, mut command: Command) -> Command {
        for (name, _) in std::env::vars() {
            if name.starts_with("PG")
                || name.starts_with("OUTBOX_")
                || name.starts_with("OTEL_")
                || [
                    "DATABASE_URL",
                    "DATABASE_URL_FILE",
                    "AMQP_URL",
                    "AMQP_URL_FILE",
                    "RUST_LOG",
                ]
                .contains(&name.as_str())
            {
                command.env_remove(name);
            }
        }
        command
            .env("RUST_BACKTRACE", "1")
            .env("DATABASE_URL", &self.database_url)
            .env("AMQP_URL", amqp_url())
            .env("OUTBOX_TABLE", &self.table)
            .env("OUTBOX_EXCHANGE", &self.exchange)
            .stdin(Stdio::null());
        command
    }

    pub fn run(&self, args: &[&str]) -> Run {
        Run::from(
            self.command()
                .args(args)
                .output()
                .expect("running outbox-poll"),
        )
    }

    pub fn run_with(&self, env: &[(&str, &str)], args: &[&str]) -> Run {
        let mut command = self.command();
        command.envs(env.iter().copied());
        Run::from(command.args(args).output().expect("running outbox-poll"))
    }
}

/// Sends a signal ("-TERM", "-INT") to a running outbox-poll.
pub fn signal(child: &Child, name: &str) {
    let status = Command::new("kill")
        .args([name, &child.id().to_string()])
        .status()
        .expect("running kill");
    assert!(status.success(), "kill {name} failed");
}

/// A run whose connect, to the server `variable` names, goes to a port
/// that accepts (the kernel does, for the backlog) and never answers: sent
/// `name` (`-INT`, `-TERM`) once it waits, it must exit with `code` within
/// 2 s, with its summary and one line saying it was `stopped`.
pub fn assert_a_signal_ends_a_hung_connect(
    fx: &Fixture,
    variable: &str,
    url: impl Fn(u16) -> String,
    (name, code, stopped): (&str, i32, &str),
) {
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let child = fx
        .command()
        .env(variable, url(silent.local_addr().unwrap().port()))
        .args(["--connect-timeout", "60s", "--json"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("starting outbox-poll");
    std::thread::sleep(Duration::from_millis(800));
    let signalled = std::time::Instant::now();
    signal(&child, name);
    let run = Run::from(child.wait_with_output().unwrap());
    let took = signalled.elapsed();
    assert_eq!(run.code, code, "{}", run.stderr);
    assert!(took < Duration::from_secs(2), "took {took:?} after {name}");
    assert_eq!(run.field("exit_code"), i64::from(code));
    assert_eq!(run.stderr.lines().count(), 1, "one line: {}", run.stderr);
    assert!(run.stderr.contains(stopped), "{}", run.stderr);
}
