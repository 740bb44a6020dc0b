//! PostgreSQL settings as libpq reads them, so that what works with `psql`
//! works here.
//!
//! The postgres crate reads no environment variables, but operators expect
//! libpq's: a cron line with `PGHOST=db1 PGDATABASE=app` must just work. So
//! `database_config` fills every parameter the URL leaves out from PGHOST,
//! PGPORT, PGUSER, PGPASSWORD and PGDATABASE, then from libpq's own defaults
//! (the local socket, the current user).

use std::path::Path;

use anyhow::{Context, Result, anyhow};
use postgres::config::Host;

use crate::connect::redact::redact_url;

/// Where libpq looks for the server's socket: Debian's directory, then the
/// compiled-in default.
const SOCKET_DIRS: [&str; 2] = ["/var/run/postgresql", "/tmp"];
const DEFAULT_PG_PORT: u16 = 5432;

/// A way to read the environment, so tests can pass their own.
pub type Env<'a> = &'a dyn Fn(&str) -> Option<String>;

/// The process environment, with empty variables treated as unset (libpq
/// does the same).
pub fn process_env(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|value| !value.is_empty())
}

/// Builds the PostgreSQL configuration from `--database-url`/DATABASE_URL
/// (a URL or a `key=value` string), completed libpq-style from `env`.
pub fn database_config(url: Option<&str>, env: Env) -> Result<postgres::Config> {
    let mut config = match url {
        Some(url) => url.parse::<postgres::Config>().map_err(|error| {
            anyhow!(
                "the database URL {} does not parse ({error}): use \
                 postgresql://USER@HOST:PORT/DATABASE or key=value pairs",
                redact_url(url)
            )
        })?,
        None => postgres::Config::new(),
    };
    if config.get_hosts().is_empty() {
        match env("PGHOST") {
            Some(host) => add_host(&mut config, &host),
            None => add_socket_host(&mut config, env),
        }
    }
    if config.get_ports().is_empty() {
        let port = match env("PGPORT") {
            Some(port) => port
                .parse()
                .map_err(|_| anyhow!("PGPORT={port:?} is not a port number"))?,
            None => DEFAULT_PG_PORT,
        };
        config.port(port);
    }
    if config.get_user().is_none() {
        let user = env("PGUSER")
            .or_else(os_user)
            .or_else(|| env("USER"))
            .context("no database user: set PGUSER or put the user in DATABASE_URL")?;
        config.user(&user);
    }
    if config.get_password().is_none()
        && let Some(password) = env("PGPASSWORD")
    {
        config.password(password);
    }
    if config.get_dbname().is_none()
        && let Some(dbname) = env("PGDATABASE")
    {
        config.dbname(&dbname);
    }
    Ok(config)
}

/// The name of the account we run as, as libpq finds it (it asks
/// getpwuid; reading /etc/passwd for our uid gives the same answer for local
/// accounts without any unsafe code). Not $USER, which a service manager or
/// `su` may leave pointing at someone else.
fn os_user() -> Option<String> {
    use std::os::unix::fs::MetadataExt;
    let uid = std::fs::metadata("/proc/self").ok()?.uid().to_string();
    let passwd = std::fs::read_to_string("/etc/passwd").ok()?;
    passwd.lines().find_map(|line| {
        let mut fields = line.split(':');
        let name = fields.next()?;
        (fields.nth(1)? == uid).then(|| name.to_string())
    })
}

/// libpq takes a host starting with `/` as a socket directory.
fn add_host(config: &mut postgres::Config, host: &str) {
    for host in host.split(',') {
        if host.starts_with('/') {
            config.host_path(host);
        } else {
            config.host(host);
        }
    }
}

fn add_socket_host(config: &mut postgres::Config, env: Env) {
    let port = env("PGPORT").unwrap_or_else(|| DEFAULT_PG_PORT.to_string());
    let dir = SOCKET_DIRS
        .iter()
        .find(|dir| Path::new(dir).join(format!(".s.PGSQL.{port}")).exists())
        .unwrap_or(&SOCKET_DIRS[0]);
    config.host_path(dir);
}

/// "host:port/database as user", for messages. Never the password.
pub fn describe_database(config: &postgres::Config) -> String {
    let host = match config.get_hosts().first() {
        Some(Host::Tcp(host)) => host.clone(),
        Some(Host::Unix(path)) => path.display().to_string(),
        None => "localhost".into(),
    };
    let port = config
        .get_ports()
        .first()
        .copied()
        .unwrap_or(DEFAULT_PG_PORT);
    let user = config.get_user().unwrap_or("?");
    let dbname = config.get_dbname().unwrap_or(user);
    format!("{host}:{port}/{dbname} as {user}")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env_of(pairs: &'static [(&'static str, &'static str)]) -> impl Fn(&str) -> Option<String> {
        move |name| {
            pairs
                .iter()
                .find(|(key, _)| *key == name)
                .map(|(_, value)| value.to_string())
        }
    }

    #[test]
    fn url_parameters_win_over_the_environment() {
        let env = env_of(&[("PGHOST", "elsewhere"), ("PGUSER", "nobody")]);
        let config = database_config(Some("postgresql://app@db1:6543/orders"), &env).unwrap();
        assert_eq!(describe_database(&config), "db1:6543/orders as app");
    }

    #[test]
    fn pg_variables_fill_what_the_url_leaves_out() {
        let env = env_of(&[
            ("PGHOST", "db2"),
            ("PGPORT", "7000"),
            ("PGUSER", "relay"),
            ("PGPASSWORD", "s3cret"),
            ("PGDATABASE", "shop"),
        ]);
        let config = database_config(None, &env).unwrap();
        assert_eq!(describe_database(&config), "db2:7000/shop as relay");
        assert_eq!(config.get_password(), Some(&b"s3cret"[..]));
    }

    #[test]
    fn no_host_means_the_local_socket_and_the_account_we_run_as() {
        let env = env_of(&[("USER", "someone-else")]);
        let config = database_config(None, &env).unwrap();
        assert!(matches!(config.get_hosts()[0], Host::Unix(_)));
        let whoami = std::process::Command::new("id")
            .arg("-un")
            .output()
            .unwrap();
        assert_eq!(
            config.get_user(),
            Some(String::from_utf8_lossy(&whoami.stdout).trim())
        );
    }

    #[test]
    fn pghost_starting_with_a_slash_is_a_socket_directory() {
        let env = env_of(&[("PGHOST", "/run/pg"), ("PGUSER", "u")]);
        let config = database_config(None, &env).unwrap();
        assert_eq!(config.get_hosts(), &[Host::Unix("/run/pg".into())]);
    }

    #[test]
    fn bad_database_url_is_reported_without_its_password() {
        let env = env_of(&[]);
        let error = database_config(Some("postgresql://u:hunter2@h:notaport/db"), &env)
            .unwrap_err()
            .to_string();
        assert!(error.contains("does not parse"), "{error}");
        assert!(!error.contains("hunter2"), "{error}");
    }

    #[test]
    fn bad_pgport_is_named() {
        let env = env_of(&[("PGPORT", "x"), ("PGUSER", "u")]);
        let error = database_config(None, &env).unwrap_err().to_string();
        assert!(error.contains("PGPORT"), "{error}");
    }
}
