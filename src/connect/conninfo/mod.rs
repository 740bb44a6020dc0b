//! libpq's connection model, read into a typed value: what `psql` would
//! connect to, given the same `--database-url`, environment and files.
//!
//! Sources, strongest first, exactly as libpq (PostgreSQL 15/16,
//! `fe-connect.c`) merges them:
//! 1. the URL (`postgresql://` or `postgres://`) or key=value string;
//! 2. the service file section named by `service=` or PGSERVICE;
//! 3. the PG* variables (see `KEYWORDS`);
//! 4. the defaults: the local socket, port 5432, the account we run as,
//!    a database named after the user, `sslmode=prefer`.
//!
//! Passwords come from those sources or, failing them, from the password
//! file, looked up for each host and port on its own (a `.pgpass` line
//! names one server). Nothing here opens a connection: files are read
//! through [`Files`], so tests pass their own, and the result says which
//! hosts to try, in order, and how to check each server.
//!
//! The parts: `parse` (the URL or key=value string), `service` (the
//! service file), `passfile` (the password file) and `ssl` (sslmode and
//! the TLS files); this file merges them and reads the rest.
//!
//! Where this deliberately differs from libpq, the item says so. The
//! differences, all small (tests/libpq_differential.rs checks the rest
//! against the system's libpq, and lists these as expected):
//! - an empty variable counts as unset (docs/src/command-line.md; libpq takes
//!   `PGSSLMODE=` as an invalid empty value);
//! - `sslrootcert=system` works as in libpq 16 (libpq 15 reads a file
//!   named "system");
//! - the default socket directory may also be /tmp;
//! - libpq keywords that would change the connection in ways we do not
//!   implement are refused rather than ignored;
//! - a string that is neither a URL nor key=value is an error (psql would
//!   take it as a database name);
//! - a port that is not an integer fails before any host is tried (libpq
//!   fails on reaching its host, so a host before it could still connect);
//! - a URL part that is not UTF-8 once percent-decoded is refused (libpq
//!   passes the bytes on; the driver sends user, database and password as
//!   text, so they could not be used);
//! - the TLS files are checked when resolving, for a list with any TCP
//!   host (libpq checks them on reaching a TCP host, so a socket listed
//!   first could connect before the check fails), and a client key others
//!   can read fails `prefer` and `allow` too (libpq would fall back on a
//!   plain session, silently dropping the certificate the operator gave).

use std::collections::BTreeMap;
use std::fmt;
use std::io;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result, bail};

use crate::connect::libpq::Env;

mod parse;
mod passfile;
mod service;
mod ssl;
#[cfg(test)]
mod test_support;

use parse::parse_connection_string;
pub(crate) use parse::percent_decode;
use passfile::{PGPASS_LOCALHOST, password_from_file, pgpass_host, read_password_file};
use service::apply_service;
use ssl::ssl;

/// What the server sees as `application_name` unless told otherwise.
pub const DEFAULT_APPLICATION_NAME: &str = "outbox-poll";

const DEFAULT_PORT: u16 = 5432;

/// Where the server's socket lives when no host is given: Debian's
/// compiled-in directory (libpq's DEFAULT_PGSOCKET_DIR here), then the
/// upstream default. libpq only knows its own; trying both keeps a build
/// of PostgreSQL from source (socket in /tmp) working too.
const SOCKET_DIRS: [&str; 2] = ["/var/run/postgresql", "/tmp"];

/// Debian's compiled-in SYSCONFDIR (`pg_config --sysconfdir`), where the
/// system-wide pg_service.conf lives unless PGSYSCONFDIR says otherwise.
const SYSCONFDIR: &str = "/etc/postgresql-common";

/// The keywords we act on, each with the variable that supplies it when
/// neither the URL nor the service does. `service` is read before the
/// others (it decides which file section applies) and PGSYSCONFDIR only
/// locates the service file. libpq reads a few more variables (PGHOSTADDR,
/// PGSSLCRL, PGCHANNELBINDING...) for keywords we do not support; we leave
/// those unread rather than half-honour them.
pub(crate) const KEYWORDS: [(&str, Option<&str>); 16] = [
    ("host", Some("PGHOST")),
    ("port", Some("PGPORT")),
    ("dbname", Some("PGDATABASE")),
    ("user", Some("PGUSER")),
    ("password", Some("PGPASSWORD")),
    ("passfile", Some("PGPASSFILE")),
    ("service", Some("PGSERVICE")),
    ("sslmode", Some("PGSSLMODE")),
    ("sslrootcert", Some("PGSSLROOTCERT")),
    ("sslcert", Some("PGSSLCERT")),
    ("sslkey", Some("PGSSLKEY")),
    ("target_session_attrs", Some("PGTARGETSESSIONATTRS")),
    ("application_name", Some("PGAPPNAME")),
    ("fallback_application_name", None),
    ("options", Some("PGOPTIONS")),
    ("connect_timeout", Some("PGCONNECT_TIMEOUT")),
];

/// libpq keywords accepted and then ignored, because they cannot make the
/// connection less safe or reach another server: TCP keepalive tuning
/// (the run is short), compression and SNI (rustls never compresses and
/// always sends SNI for a name), the client encoding (the driver always
/// speaks UTF8), and GSSAPI/Kerberos settings (never used without
/// `gssencmode=require`, which is refused).
const IGNORED: [&str; 11] = [
    "keepalives",
    "keepalives_idle",
    "keepalives_interval",
    "keepalives_count",
    "tcp_user_timeout",
    "client_encoding",
    "sslcompression",
    "sslsni",
    "krbsrvname",
    "gsslib",
    "gssdelegation",
];

/// libpq keywords that would change which server we reach or how it is
/// checked in ways we do not implement. Ignoring them would connect
/// somewhere, or somehow, the operator did not ask for, so they are
/// refused by name.
const UNSUPPORTED: [&str; 12] = [
    "hostaddr",
    "sslpassword",
    "sslcrl",
    "sslcrldir",
    "sslcertmode",
    "sslnegotiation",
    "ssl_min_protocol_version",
    "ssl_max_protocol_version",
    "requirepeer",
    "require_auth",
    "replication",
    "load_balance_hosts",
];

/// Everything needed to connect, in libpq's terms.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnInfo {
    /// The servers to try, in order; the first that accepts (and suits
    /// `target_session_attrs`) wins.
    pub targets: Vec<Target>,
    pub user: String,
    pub dbname: String,
    pub ssl: Ssl,
    pub target_session_attrs: TargetSessionAttrs,
    pub application_name: String,
    /// Command-line options for the server (`-c name=value ...`).
    pub options: Option<String>,
    /// libpq's per-host connect bound (`connect_timeout`, seconds, at least 2).
    pub(crate) connect_timeout: Option<Duration>,
    /// What libpq would print as a WARNING and then carry on (an unsafe
    /// password file, ignored): for the caller to log.
    pub(crate) warnings: Vec<String>,
    /// No URL, service or PG* variable said anything: only libpq's
    /// defaults (the local socket, this account's name). A failure to
    /// connect then says so first, as a newcomer's likeliest mistake.
    pub(crate) nothing_configured: bool,
}

/// One server to try.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    pub host: Host,
    pub port: u16,
    /// The password for this host and port: the one given, or the password
    /// file's first matching line.
    pub password: Option<Password>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Host {
    /// A name, or an IPv4 or IPv6 address (without brackets).
    Tcp(String),
    /// A directory holding the server's socket (`.s.PGSQL.PORT`). TLS is
    /// never used over a socket, whatever sslmode says (as in libpq).
    Socket(PathBuf),
}

/// A password; its Debug output never shows it.
#[derive(Clone, PartialEq, Eq)]
pub struct Password {
    secret: String,
    /// The password file it came from, for libpq's hint when the server
    /// refuses it ("password retrieved from file ...").
    pub(crate) file: Option<PathBuf>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SslMode {
    /// Never TLS.
    Disable,
    /// Plain first; TLS only if the server refuses the plain session.
    Allow,
    /// TLS if the server offers it, else plain; also plain again if the
    /// TLS handshake or the session over TLS fails (libpq retries once).
    Prefer,
    /// TLS or nothing.
    Require,
    VerifyCa,
    VerifyFull,
}

/// How the server's certificate is checked once TLS is up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ServerCheck {
    /// Not at all (`require` without a root certificate file, or
    /// `prefer`/`allow`): the handshake's signatures are still checked.
    Nothing,
    /// The chain up to a root, not the name (`verify-ca`; also `require`,
    /// `prefer` and `allow` when a root certificate file exists, as libpq
    /// does).
    Chain(RootCert),
    /// The chain and the host name (`verify-full`).
    ChainAndName(RootCert),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RootCert {
    /// A PEM file of trusted roots.
    File(PathBuf),
    /// The operating system's roots (`sslrootcert=system`).
    System,
}

/// A client certificate and its key, both PEM.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientCert {
    pub cert: PathBuf,
    pub key: PathBuf,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ssl {
    pub mode: SslMode,
    pub server: ServerCheck,
    pub client: Option<ClientCert>,
}

/// Which server of the list will do. libpq asks each server once it has
/// logged in: `SHOW transaction_read_only` for read-write and read-only,
/// `SELECT pg_catalog.pg_is_in_recovery()` for the other three (a server
/// of PostgreSQL 14 or later reports both at startup, sparing the query).
/// A server that does not suit is left for the next host, not the next
/// address of the same host.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TargetSessionAttrs {
    Any,
    ReadWrite,
    ReadOnly,
    Primary,
    Standby,
    /// A standby if any host is one, else any server (two passes).
    PreferStandby,
}

/// What libpq's `stat()` tells it about a file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FileStat {
    pub(crate) regular: bool,
    /// The permission bits (`st_mode & 0o7777`).
    pub(crate) mode: u32,
    pub(crate) uid: u32,
}

/// The only I/O this module does, injected so tests pass their own.
pub trait Files {
    /// The file's text, or None if there is no such file.
    fn read(&self, path: &Path) -> io::Result<Option<String>>;
    /// The file's type, permissions and owner, or None if there is no such
    /// file.
    fn stat(&self, path: &Path) -> io::Result<Option<FileStat>>;
}

/// The real file system.
pub struct SystemFiles;

impl Files for SystemFiles {
    fn read(&self, path: &Path) -> io::Result<Option<String>> {
        match std::fs::read_to_string(path) {
            Ok(text) => Ok(Some(text)),
            Err(error) if error.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(error) => Err(error),
        }
    }

    fn stat(&self, path: &Path) -> io::Result<Option<FileStat>> {
        use std::os::unix::fs::MetadataExt;
        match std::fs::metadata(path) {
            Ok(meta) => Ok(Some(FileStat {
                regular: meta.is_file(),
                mode: meta.mode() & 0o7777,
                uid: meta.uid(),
            })),
            Err(error) if error.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(error) => Err(error),
        }
    }
}

/// The account we run as: libpq's default user name, and the home
/// directory it falls back on when HOME is unset.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Account {
    pub(crate) name: String,
    pub home: Option<PathBuf>,
}

impl Account {
    /// Our own entry of /etc/passwd, as getpwuid(geteuid()) finds it for
    /// local accounts. None where there is none (a container running an
    /// unnamed uid): then PGUSER or the URL must name the user.
    pub fn current(files: &dyn Files) -> Option<Account> {
        let uid = files.stat(Path::new("/proc/self")).ok()??.uid;
        let passwd = files.read(Path::new("/etc/passwd")).ok()??;
        passwd.lines().find_map(|line| {
            let fields: Vec<&str> = line.split(':').collect();
            (fields.len() >= 6 && fields[2] == uid.to_string()).then(|| Account {
                name: fields[0].to_string(),
                home: Some(PathBuf::from(fields[5])).filter(|home| !home.as_os_str().is_empty()),
            })
        })
    }
}

impl Password {
    pub fn secret(&self) -> &str {
        &self.secret
    }
}

impl fmt::Debug for Password {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Password")
            .field("secret", &"***")
            .field("file", &self.file)
            .finish()
    }
}

impl fmt::Display for Host {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Host::Tcp(name) if name.contains(':') => write!(f, "[{name}]"),
            Host::Tcp(name) => f.write_str(name),
            Host::Socket(dir) => write!(f, "{}", dir.display()),
        }
    }
}

impl fmt::Display for Target {
    /// `db1:5432`, `[::1]:5432`, or the socket's path, for messages.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.host {
            Host::Socket(dir) => write!(
                f,
                "{}",
                dir.join(format!(".s.PGSQL.{}", self.port)).display()
            ),
            host => write!(f, "{host}:{}", self.port),
        }
    }
}

/// Reads the whole model. `url` is `--database-url`/DATABASE_URL, if
/// given; `account` is [`Account::current`], passed in so tests choose it.
/// Errors name the parameter, the value (never a password) and where it
/// came from; every one is a configuration problem.
pub fn resolve(
    url: Option<&str>,
    env: Env,
    files: &dyn Files,
    account: Option<&Account>,
) -> Result<ConnInfo> {
    let mut params = Params::default();
    if let Some(url) = url {
        for (key, value) in parse_connection_string(url)? {
            params.store(&key, value, Origin::Url)?;
        }
    }
    let home = env("HOME")
        .map(PathBuf::from)
        .or_else(|| account.and_then(|account| account.home.clone()));
    apply_service(&mut params, env, files, home.as_deref())?;
    for (key, var) in KEYWORDS {
        if let Some(var) = var
            && !params.has(key)
            && let Some(value) = env(var)
        {
            params.store(key, value, Origin::Env(var))?;
        }
    }
    // libpq's legacy variable: a value starting with "1" asks for TLS when
    // neither the URL, the service nor PGSSLMODE set sslmode. Ignoring it
    // would silently drop a "TLS required" setting.
    if !params.has("sslmode") && env("PGREQUIRESSL").is_some_and(|value| value.starts_with('1')) {
        params.store("sslmode", "require".into(), Origin::Env("PGREQUIRESSL"))?;
    }
    let mut info = build(&params, files, account, home.as_deref())?;
    info.nothing_configured = params.0.is_empty();
    Ok(info)
}

/// The PG* variables a connection string stands for, keyword by keyword:
/// a `--databases` line takes what it leaves out from `--database-url`
/// this way, as libpq would from the variables.
pub(crate) fn as_variables(text: &str) -> Result<Vec<(&'static str, String)>> {
    let mut variables = Vec::new();
    for (key, value) in parse_connection_string(text)? {
        if let Some((_, Some(var))) = KEYWORDS.iter().find(|(name, _)| *name == key) {
            variables.push((*var, value));
        }
    }
    Ok(variables)
}

/// Where a parameter's value came from, to name it in an error.
#[derive(Debug, Clone)]
enum Origin {
    Url,
    Service { file: PathBuf, line: usize },
    Env(&'static str),
}

/// The parameters gathered so far, each with where it came from.
#[derive(Default)]
struct Params(BTreeMap<&'static str, (String, Origin)>);

impl Params {
    fn has(&self, key: &str) -> bool {
        self.0.contains_key(key)
    }

    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).map(|(value, _)| value.as_str())
    }

    /// The value of `key` unless it is absent or empty: for the keys read
    /// so, an empty value means the default.
    fn given(&self, key: &str) -> Option<&str> {
        self.get(key).filter(|value| !value.is_empty())
    }

    /// Stores `key`, replacing an earlier value (in a URL or string the
    /// last occurrence wins, as in libpq). Unknown keywords are errors.
    fn store(&mut self, key: &str, value: String, origin: Origin) -> Result<()> {
        // libpq's legacy spelling of sslmode.
        let (key, value) = if key == "requiressl" {
            let mode = if value.starts_with('1') {
                "require"
            } else {
                "prefer"
            };
            ("sslmode", mode.to_string())
        } else {
            (key, value)
        };
        if let Some((name, _)) = KEYWORDS.iter().find(|(name, _)| *name == key) {
            self.0.insert(name, (value, origin));
            return Ok(());
        }
        let place = describe_origin(&origin);
        match key {
            "gssencmode" | "channel_binding" => match value.as_str() {
                "disable" | "prefer" => Ok(()),
                "require" => bail!(
                    "{key}=require{place} is not supported by outbox-poll: remove it, or use \
                     disable or prefer"
                ),
                _ => bail!("{key}={value:?}{place} is not one of disable, prefer, require"),
            },
            _ if IGNORED.contains(&key) => Ok(()),
            _ if UNSUPPORTED.contains(&key) => bail!(
                "the connection parameter {key}{place} is not supported by outbox-poll: remove it"
            ),
            _ => bail!(
                "unknown connection parameter {key:?}{place}: see libpq's list of parameter \
                 keywords (host, port, dbname, user, sslmode, ...)"
            ),
        }
    }

    /// "sslmode=bogus in the database URL", for errors about one value.
    fn describe(&self, key: &str) -> String {
        match self.0.get(key) {
            Some((value, Origin::Env(var))) => format!("{var}={value:?}"),
            Some((value, origin)) => format!("{key}={value:?}{}", describe_origin(origin)),
            None => key.to_string(),
        }
    }
}

fn describe_origin(origin: &Origin) -> String {
    match origin {
        Origin::Url => " in the database URL".into(),
        Origin::Service { file, line } => format!(" in {}, line {line}", file.display()),
        Origin::Env(var) => format!(" in {var}"),
    }
}

fn read(files: &dyn Files, path: &Path) -> Result<Option<String>> {
    files
        .read(path)
        .with_context(|| format!("cannot read {}", path.display()))
}

fn stat(files: &dyn Files, path: &Path) -> Result<Option<FileStat>> {
    files
        .stat(path)
        .with_context(|| format!("cannot examine {}", path.display()))
}

/// Defaults, validation and the password file: the gathered parameters
/// become the typed value.
fn build(
    params: &Params,
    files: &dyn Files,
    account: Option<&Account>,
    home: Option<&Path>,
) -> Result<ConnInfo> {
    let hosts = hosts(params, files)?;
    let ports = ports(params, hosts.len())?;
    let user = match params.given("user") {
        Some(user) => user.to_string(),
        None => account.map(|account| account.name.clone()).context(
            "no database user: set PGUSER or put the user in the database URL \
             (this account has no name to default to)",
        )?,
    };
    let dbname = params.given("dbname").unwrap_or(&user).to_string();
    let mut warnings = Vec::new();
    let given = params.given("password").map(|secret| Password {
        secret: secret.to_string(),
        file: None,
    });
    let passfile = match params.given("passfile") {
        Some(file) => Some(PathBuf::from(file)),
        None => home.map(|home| home.join(".pgpass")),
    };
    let pgpass = match (&given, &passfile) {
        (None, Some(file)) => read_password_file(files, file, &mut warnings)?,
        _ => None,
    };
    let mut targets = Vec::new();
    for ((host, written), port) in hosts.into_iter().zip(ports) {
        // libpq reads each port when it comes to its host, and skips a
        // host whose port is a number outside 1-65535.
        let Some(number) = port.number else {
            warnings.push(format!(
                "{} gives {} the port {:?}, which is not a port number (1-65535): that host \
                 is skipped, as libpq does",
                params.describe("port"),
                host,
                port.text
            ));
            continue;
        };
        let password = given.clone().or_else(|| {
            pgpass.as_ref().and_then(|(file, text)| {
                password_from_file(text, &written, &port.text, &dbname, &user).map(|secret| {
                    Password {
                        secret,
                        file: Some(file.clone()),
                    }
                })
            })
        });
        targets.push(Target {
            host,
            port: number,
            password,
        });
    }
    if targets.is_empty() {
        bail!(
            "{}: no host is left to try, as every port is outside 1-65535; fix the port list",
            params.describe("port")
        );
    }
    let tcp = targets
        .iter()
        .any(|target| matches!(target.host, Host::Tcp(_)));
    Ok(ConnInfo {
        targets,
        ssl: ssl(params, files, home, tcp)?,
        target_session_attrs: target_session_attrs(params)?,
        // An empty application_name gives way to the fallback, as libpq's
        // startup packet does.
        application_name: params
            .given("application_name")
            .or_else(|| params.given("fallback_application_name"))
            .unwrap_or(DEFAULT_APPLICATION_NAME)
            .to_string(),
        options: params.given("options").map(String::from),
        connect_timeout: connect_timeout(params)?,
        user,
        dbname,
        warnings,
        nothing_configured: false,
    })
}

/// The host list: names, addresses, and socket directories (anything
/// starting with `/`), each with the name the password file knows it by.
/// An empty entry, or none at all, means the local socket directory.
fn hosts(params: &Params, files: &dyn Files) -> Result<Vec<(Host, String)>> {
    let list = params.get("host").unwrap_or("");
    list.split(',')
        .map(|host| {
            Ok(match host {
                "" => (
                    Host::Socket(default_socket_dir(params, files)?),
                    PGPASS_LOCALHOST.to_string(),
                ),
                dir if dir.starts_with('/') => (Host::Socket(PathBuf::from(dir)), pgpass_host(dir)),
                name => (Host::Tcp(name.to_string()), name.to_string()),
            })
        })
        .collect()
}

/// The first of SOCKET_DIRS holding the server's socket for the (first)
/// port, else Debian's.
fn default_socket_dir(params: &Params, files: &dyn Files) -> Result<PathBuf> {
    let port = params
        .get("port")
        .and_then(|ports| ports.split(',').next())
        .filter(|port| !port.is_empty())
        .unwrap_or("5432");
    for dir in SOCKET_DIRS {
        let dir = PathBuf::from(dir);
        if stat(files, &dir.join(format!(".s.PGSQL.{port}")))?.is_some() {
            return Ok(dir);
        }
    }
    Ok(PathBuf::from(SOCKET_DIRS[0]))
}

/// One host's port: as written (what `.pgpass` lines are compared with)
/// and as a number, None when it is outside 1-65535.
struct Port {
    text: String,
    number: Option<u16>,
}

/// One port for every host, or exactly one per host; an empty entry is
/// 5432. An entry that is not an integer is an error; one outside
/// 1-65535 skips its host (see `build`).
fn ports(params: &Params, hosts: usize) -> Result<Vec<Port>> {
    let default = || Port {
        text: DEFAULT_PORT.to_string(),
        number: Some(DEFAULT_PORT),
    };
    let Some(list) = params.given("port") else {
        return Ok((0..hosts).map(|_| default()).collect());
    };
    let ports = list
        .split(',')
        .map(|port| match port {
            "" => Ok(default()),
            port => {
                let number = parse_int(port).with_context(|| {
                    format!(
                        "{} holds {port:?}, which is not a port number (1-65535)",
                        params.describe("port")
                    )
                })?;
                Ok(Port {
                    text: port.to_string(),
                    number: u16::try_from(number).ok().filter(|&number| number != 0),
                })
            }
        })
        .collect::<Result<Vec<Port>>>()?;
    match ports.len() {
        1 => {
            let port = &ports[0];
            Ok((0..hosts)
                .map(|_| Port {
                    text: port.text.clone(),
                    number: port.number,
                })
                .collect())
        }
        n if n == hosts => Ok(ports),
        n => bail!(
            "{}: could not match {n} port numbers to {hosts} hosts; give one port for all \
             hosts or one for each",
            params.describe("port")
        ),
    }
}

/// libpq's `parse_int_param`: an int as strtol reads it (white space, a
/// sign, digits), with nothing but white space after it.
fn parse_int(text: &str) -> Option<i32> {
    let space = |c: char| matches!(c, ' ' | '\t' | '\n' | '\u{b}' | '\u{c}' | '\r');
    text.trim_matches(space).parse().ok()
}

fn target_session_attrs(params: &Params) -> Result<TargetSessionAttrs> {
    Ok(match params.get("target_session_attrs").unwrap_or("any") {
        "any" => TargetSessionAttrs::Any,
        "read-write" => TargetSessionAttrs::ReadWrite,
        "read-only" => TargetSessionAttrs::ReadOnly,
        "primary" => TargetSessionAttrs::Primary,
        "standby" => TargetSessionAttrs::Standby,
        "prefer-standby" => TargetSessionAttrs::PreferStandby,
        _ => bail!(
            "{} is not one of any, read-write, read-only, primary, standby, prefer-standby",
            params.describe("target_session_attrs")
        ),
    })
}

/// Whole seconds; zero or less means no bound, and libpq never waits less
/// than 2 s. An empty value is an error, as in libpq (which takes it as
/// given, so PGCONNECT_TIMEOUT does not apply either).
fn connect_timeout(params: &Params) -> Result<Option<Duration>> {
    let Some(text) = params.get("connect_timeout") else {
        return Ok(None);
    };
    let seconds = parse_int(text).with_context(|| {
        format!(
            "{} is not a whole number of seconds",
            params.describe("connect_timeout")
        )
    })?;
    Ok((seconds > 0).then(|| Duration::from_secs(u64::from(seconds.max(2).unsigned_abs()))))
}

#[cfg(test)]
mod tests {
    use super::test_support::*;
    use super::*;

    #[test]
    fn pgrequiressl_1_means_sslmode_require_unless_sslmode_is_given() {
        let mode = |url: &str, env: &[(&str, &str)]| {
            resolve_with(Some(url), env, &FakeFiles::default())
                .unwrap()
                .ssl
                .mode
        };
        let required = [("PGREQUIRESSL", "1")];
        assert_eq!(mode("host=a user=u", &required), SslMode::Require);
        assert_eq!(
            mode("host=a user=u", &[("PGREQUIRESSL", "0")]),
            SslMode::Prefer
        );
        assert_eq!(
            mode("host=a user=u sslmode=disable", &required),
            SslMode::Disable
        );
        let both = [("PGREQUIRESSL", "1"), ("PGSSLMODE", "allow")];
        assert_eq!(mode("host=a user=u", &both), SslMode::Allow);
    }

    #[test]
    fn unknown_keywords_are_errors_and_unsupported_ones_are_named() {
        url_fails(
            "postgresql://u@a/x?frob=1",
            "unknown connection parameter \"frob\" in the database URL",
        );
        url_fails(
            "host=a hostaddr=10.0.0.1",
            "hostaddr in the database URL is not supported",
        );
        url_fails(
            "host=a channel_binding=require",
            "channel_binding=require in the database URL is not supported",
        );
    }

    #[test]
    fn harmless_libpq_keywords_are_accepted() {
        let info =
            info("host=a user=u keepalives=1 sslsni=1 gssencmode=disable client_encoding=UTF8");
        assert_eq!(places(&info), [tcp("a", 5432)]);
    }

    #[test]
    fn a_port_count_that_matches_neither_one_nor_the_hosts_is_an_error() {
        url_fails(
            "host=a,b,c port=1,2 user=u",
            "could not match 2 port numbers to 3 hosts",
        );
        assert_fails(
            Some("host=a user=u"),
            &[("PGPORT", "5442,5441")],
            &FakeFiles::default(),
            "PGPORT=\"5442,5441\": could not match 2",
        );
    }

    #[test]
    fn one_port_applies_to_every_host_even_from_the_environment() {
        let info = resolve_with(
            Some("host=a,b user=u"),
            &[("PGPORT", "6000")],
            &FakeFiles::default(),
        )
        .unwrap();
        assert_eq!(places(&info), [tcp("a", 6000), tcp("b", 6000)]);
    }

    #[test]
    fn a_port_list_in_pgport_pairs_with_a_host_list_in_pghost() {
        let env = [
            ("PGHOST", "db1,db2"),
            ("PGPORT", "5442,5441"),
            ("PGUSER", "u"),
        ];
        let info = resolve_with(None, &env, &FakeFiles::default()).unwrap();
        assert_eq!(places(&info), [tcp("db1", 5442), tcp("db2", 5441)]);
    }

    #[test]
    fn a_bad_port_is_named_with_its_source() {
        url_fails(
            "postgresql://u@a:54x2/x",
            "port=\"54x2\" in the database URL holds \"54x2\"",
        );
        env_fails(&[("PGPORT", "x")], "PGPORT=\"x\" holds \"x\"");
        url_fails("host=a port=' '", "holds \" \", which is not a port number");
    }

    #[test]
    fn a_port_out_of_range_in_a_host_list_skips_that_host() {
        for port in ["0", "-1", "65536", "99999"] {
            let info = info(&format!("host=127.0.0.1,127.0.0.2 port={port},5432 user=u"));
            assert_eq!(places(&info), [tcp("127.0.0.2", 5432)], "{port}");
            assert_eq!(info.warnings.len(), 1, "{:?}", info.warnings);
            assert!(
                info.warnings[0].contains("127.0.0.1 the port")
                    && info.warnings[0].contains("skipped"),
                "{:?}",
                info.warnings
            );
        }
    }

    #[test]
    fn a_port_list_with_no_port_in_range_is_an_error() {
        env_fails(&[("PGPORT", "0")], "PGPORT=\"0\": no host is left to try");
    }

    #[test]
    fn a_port_outside_an_int_is_an_error_as_in_libpq() {
        url_fails("host=a port=4294967296 user=u", "holds \"4294967296\"");
    }

    #[test]
    fn every_listed_variable_fills_what_the_url_leaves_out() {
        let files = FakeFiles::default()
            .with("/certs/root.pem", "", 0o644)
            .with("/certs/me.crt", "", 0o644)
            .with("/certs/me.key", "", 0o600);
        let env = [
            ("PGHOST", "db2"),
            ("PGPORT", "7000"),
            ("PGUSER", "relay2"),
            ("PGPASSWORD", "pw"),
            ("PGDATABASE", "shop"),
            ("PGSSLMODE", "verify-ca"),
            ("PGSSLROOTCERT", "/certs/root.pem"),
            ("PGSSLCERT", "/certs/me.crt"),
            ("PGSSLKEY", "/certs/me.key"),
            ("PGTARGETSESSIONATTRS", "read-write"),
            ("PGAPPNAME", "nightly"),
            ("PGOPTIONS", "-c work_mem=8MB"),
            ("PGCONNECT_TIMEOUT", "5"),
        ];
        let info = resolve_with(None, &env, &files).unwrap();
        assert_eq!(places(&info), [tcp("db2", 7000)]);
        assert_eq!(
            (info.user.as_str(), info.dbname.as_str()),
            ("relay2", "shop")
        );
        assert_eq!(passwords(&info), [Some("pw".to_string())]);
        assert_eq!(info.ssl.mode, SslMode::VerifyCa);
        assert_eq!(
            info.ssl.server,
            ServerCheck::Chain(RootCert::File("/certs/root.pem".into()))
        );
        assert_eq!(
            info.ssl.client,
            Some(ClientCert {
                cert: "/certs/me.crt".into(),
                key: "/certs/me.key".into()
            })
        );
        assert_eq!(info.target_session_attrs, TargetSessionAttrs::ReadWrite);
        assert_eq!(info.application_name, "nightly");
        assert_eq!(info.options.as_deref(), Some("-c work_mem=8MB"));
        assert_eq!(info.connect_timeout, Some(Duration::from_secs(5)));
    }

    #[test]
    fn the_url_wins_over_the_environment() {
        let env = [
            ("PGHOST", "elsewhere"),
            ("PGUSER", "nobody"),
            ("PGSSLMODE", "require"),
        ];
        let info = resolve_with(
            Some("postgresql://app@db1/orders?sslmode=disable"),
            &env,
            &FakeFiles::default(),
        )
        .unwrap();
        assert_eq!(places(&info), [tcp("db1", 5432)]);
        assert_eq!(info.user, "app");
        assert_eq!(info.ssl.mode, SslMode::Disable);
    }

    #[test]
    fn an_empty_variable_counts_as_unset() {
        let info = resolve_with(
            Some("host=a"),
            &[("PGSSLMODE", ""), ("PGUSER", "")],
            &FakeFiles::default(),
        )
        .unwrap();
        assert_eq!(info.ssl.mode, SslMode::Prefer);
        assert_eq!(info.user, "relay");
    }

    #[test]
    fn a_bad_variable_is_named() {
        env_fails(
            &[("PGSSLMODE", "sometimes")],
            "PGSSLMODE=\"sometimes\" is not one of disable",
        );
        env_fails(
            &[("PGTARGETSESSIONATTRS", "writable")],
            "PGTARGETSESSIONATTRS=\"writable\" is not one of any",
        );
        env_fails(
            &[("PGCONNECT_TIMEOUT", "soon")],
            "PGCONNECT_TIMEOUT=\"soon\" is not a whole number",
        );
    }

    #[test]
    fn defaults_are_the_local_socket_port_5432_our_account_and_its_database() {
        let files = FakeFiles::default().with("/var/run/postgresql/.s.PGSQL.5432", "", 0o777);
        let info = resolve_with(None, &[], &files).unwrap();
        assert_eq!(
            places(&info),
            [(Host::Socket("/var/run/postgresql".into()), 5432)]
        );
        assert_eq!(
            (info.user.as_str(), info.dbname.as_str()),
            ("relay", "relay")
        );
        assert_eq!(
            info.ssl,
            Ssl {
                mode: SslMode::Prefer,
                server: ServerCheck::Nothing,
                client: None
            }
        );
        assert_eq!(info.target_session_attrs, TargetSessionAttrs::Any);
        assert_eq!(info.application_name, DEFAULT_APPLICATION_NAME);
        assert_eq!((info.options.clone(), info.connect_timeout), (None, None));
    }

    #[test]
    fn the_socket_may_also_be_in_tmp() {
        let files = FakeFiles::default().with("/tmp/.s.PGSQL.6000", "", 0o777);
        let info = resolve_with(None, &[("PGPORT", "6000")], &files).unwrap();
        assert_eq!(places(&info), [(Host::Socket("/tmp".into()), 6000)]);
    }

    #[test]
    fn without_a_user_anywhere_the_error_says_how_to_give_one() {
        let message = format!(
            "{:#}",
            resolve(Some("host=a"), &env_of(&[]), &FakeFiles::default(), None).unwrap_err()
        );
        assert!(message.contains("set PGUSER"), "{message}");
    }

    #[test]
    fn every_target_session_attrs_value_of_libpq_is_read() {
        for (text, attrs) in [
            ("any", TargetSessionAttrs::Any),
            ("read-write", TargetSessionAttrs::ReadWrite),
            ("read-only", TargetSessionAttrs::ReadOnly),
            ("primary", TargetSessionAttrs::Primary),
            ("standby", TargetSessionAttrs::Standby),
            ("prefer-standby", TargetSessionAttrs::PreferStandby),
        ] {
            let info = info(&format!("host=a user=u target_session_attrs={text}"));
            assert_eq!(info.target_session_attrs, attrs, "{text}");
        }
    }

    #[test]
    fn connect_timeout_is_at_least_two_seconds_and_zero_means_none() {
        assert_eq!(
            info("host=a user=u connect_timeout=1").connect_timeout,
            Some(Duration::from_secs(2))
        );
        assert_eq!(
            info("host=a user=u connect_timeout=0").connect_timeout,
            None
        );
        assert_eq!(
            info("host=a user=u connect_timeout=-3").connect_timeout,
            None
        );
    }

    #[test]
    fn an_empty_connect_timeout_is_an_error_even_with_pgconnect_timeout_set() {
        url_fails(
            "host=a user=u connect_timeout=",
            "connect_timeout=\"\" in the database URL is not a whole number",
        );
        assert_fails(
            Some("host=a user=u connect_timeout=''"),
            &[("PGCONNECT_TIMEOUT", "7")],
            &FakeFiles::default(),
            "connect_timeout=\"\" in the database URL is not a whole number",
        );
    }

    #[test]
    fn connect_timeout_reads_white_space_and_signs_as_libpq() {
        assert_eq!(
            info("host=a user=u connect_timeout=' +5 '").connect_timeout,
            Some(Duration::from_secs(5))
        );
        url_fails("host=a user=u connect_timeout='5 s'", "not a whole number");
    }

    #[test]
    fn application_name_falls_back_to_fallback_application_name_then_ours() {
        assert_eq!(
            info("host=a user=u fallback_application_name=x").application_name,
            "x"
        );
        assert_eq!(
            info("host=a user=u application_name=y fallback_application_name=x").application_name,
            "y"
        );
        assert_eq!(
            info("host=a user=u application_name='' fallback_application_name=x").application_name,
            "x"
        );
    }

    #[test]
    fn the_current_account_is_the_passwd_entry_of_our_uid() {
        let passwd =
            "other:x:1001:1000::/home/other:/bin/sh\nrelay:x:1000:1001::/home/relay:/bin/sh\n";
        let files =
            FakeFiles::default()
                .with("/proc/self", "", 0o555)
                .with("/etc/passwd", passwd, 0o644);
        assert_eq!(Account::current(&files), Some(account()));
    }

    #[test]
    fn the_current_account_is_the_one_id_names() {
        let account = Account::current(&SystemFiles).unwrap();
        let whoami = std::process::Command::new("id")
            .arg("-un")
            .output()
            .unwrap();
        assert_eq!(account.name, String::from_utf8_lossy(&whoami.stdout).trim());
    }

    #[test]
    fn debug_output_never_shows_a_password() {
        let shown = format!("{:?}", info("postgresql://u:hunter2@h/x"));
        assert!(!shown.contains("hunter2"), "{shown}");
    }

    #[test]
    fn sockets_and_hosts_print_as_an_operator_would_write_them() {
        let info = info("host=db1,/run/pg port=5432,5433 user=u");
        let shown: Vec<String> = info.targets.iter().map(ToString::to_string).collect();
        assert_eq!(shown, ["db1:5432", "/run/pg/.s.PGSQL.5433"]);
    }
}
