//! libpq's connection model, read into a typed value: what `psql` would
//! connect to, given the same `--database-url`, environment and files.
//!
//! Sources, strongest first, exactly as libpq (PostgreSQL 15/16,
//! `fe-connect.c`) merges them:
//! 1. the URL (`postgresql://` or `postgres://`) or key=value string;
//! 2. the service file section named by `service=` or PGSERVICE;
//! 3. the PG* variables (see [`KEYWORDS`]);
//! 4. the defaults: the local socket, port 5432, the account we run as,
//!    a database named after the user, `sslmode=prefer`.
//!
//! Passwords come from those sources or, failing them, from the password
//! file, looked up for each host and port on its own (a `.pgpass` line
//! names one server). Nothing here opens a connection: files are read
//! through [`Files`], so tests pass their own, and the result says which
//! hosts to try, in order, and how to check each server.
//!
//! Where this deliberately differs from libpq, the item says so. The
//! differences, all small (tests/libpq_differential.rs checks the rest
//! against the system's libpq, and lists these as expected):
//! - an empty variable counts as unset (the contract; libpq takes
//!   `PGSSLMODE=` as an invalid empty value);
//! - `sslrootcert=system` works as in libpq 16 (libpq 15 reads a file
//!   named "system");
//! - the default socket directory may also be /tmp;
//! - libpq keywords that would change the connection in ways we do not
//!   implement are refused rather than ignored;
//! - a string that is neither a URL nor key=value is an error (psql would
//!   take it as a database name);
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

use anyhow::{Context, Result, anyhow, bail};

use crate::connect::libpq::Env;
use crate::connect::redact::redact_url;

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
pub const KEYWORDS: [(&str, Option<&str>); 16] = [
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
    pub connect_timeout: Option<Duration>,
    /// What libpq would print as a WARNING and then carry on (an unsafe
    /// password file, ignored): for the caller to log.
    pub warnings: Vec<String>,
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
    pub file: Option<PathBuf>,
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
    pub regular: bool,
    /// The permission bits (`st_mode & 0o7777`).
    pub mode: u32,
    pub uid: u32,
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
    pub name: String,
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
    /// "db1:5432", "[::1]:5432", or the socket's path, for messages.
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
    build(&params, files, account, home.as_deref())
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

/// libpq's `parse_connection_string`: a URL if it starts with one of the
/// two prefixes, else key=value pairs.
fn parse_connection_string(text: &str) -> Result<Vec<(String, String)>> {
    let parsed = match ["postgresql://", "postgres://"]
        .iter()
        .find_map(|prefix| text.strip_prefix(prefix))
    {
        Some(rest) => parse_uri(rest),
        None if text.contains('=') => parse_key_values(text),
        None => Err(anyhow!(
            "it is neither a postgresql:// URL nor key=value pairs"
        )),
    };
    parsed.with_context(|| {
        format!(
            "the database URL {} does not parse: use \
             postgresql://USER@HOST:PORT/DATABASE?PARAM=VALUE or key=value pairs",
            redact_url(text)
        )
    })
}

/// libpq's `conninfo_parse`: `key = value` pairs separated by white space;
/// a value may be single-quoted, and a backslash escapes the next
/// character, quoted or not.
fn parse_key_values(text: &str) -> Result<Vec<(String, String)>> {
    let mut pairs = Vec::new();
    let mut chars = text.chars().peekable();
    loop {
        while chars.next_if(|c| c.is_whitespace()).is_some() {}
        if chars.peek().is_none() {
            return Ok(pairs);
        }
        let mut key = String::new();
        while let Some(c) = chars.next_if(|c| *c != '=' && !c.is_whitespace()) {
            key.push(c);
        }
        while chars.next_if(|c| c.is_whitespace()).is_some() {}
        if chars.next() != Some('=') {
            bail!("missing \"=\" after {key:?}");
        }
        while chars.next_if(|c| c.is_whitespace()).is_some() {}
        let mut value = String::new();
        if chars.next_if_eq(&'\'').is_some() {
            loop {
                match chars.next() {
                    None => bail!("unterminated quoted value of {key:?}"),
                    Some('\'') => break,
                    Some('\\') => value.extend(chars.next()),
                    Some(c) => value.push(c),
                }
            }
        } else {
            while let Some(c) = chars.next_if(|c| !c.is_whitespace()) {
                if c == '\\' {
                    value.extend(chars.next());
                } else {
                    value.push(c);
                }
            }
        }
        pairs.push((key, value));
    }
}

/// libpq's `conninfo_uri_parse_options`, after the prefix:
/// `[user[:password]@][host][:port][,host[:port]...][/dbname][?key=value&...]`.
/// A host may be a bracketed IPv6 address. Every part is percent-decoded;
/// the host list is decoded as a whole and split on commas afterwards, as
/// libpq does. Empty parts are left unset, so the environment still
/// applies to them (but see the port list below).
fn parse_uri(rest: &str) -> Result<Vec<(String, String)>> {
    let mut pairs = Vec::new();
    let mut rest = rest;
    // Credentials end at the first '@' before any '/'.
    let credentials_end = rest.find(['@', '/']);
    if let Some(at) = credentials_end.filter(|&at| rest.as_bytes()[at] == b'@') {
        let (user, password) = match rest[..at].split_once(':') {
            Some((user, password)) => (user, Some(password)),
            None => (&rest[..at], None),
        };
        if !user.is_empty() {
            pairs.push(("user".into(), percent_decode(user, "user")?));
        }
        if let Some(password) = password.filter(|password| !password.is_empty()) {
            pairs.push(("password".into(), percent_decode(password, "password")?));
        }
        rest = &rest[at + 1..];
    }
    let mut hosts = String::new();
    let mut ports = String::new();
    loop {
        let host_end = if let Some(inner) = rest.strip_prefix('[') {
            let close = inner
                .find(']')
                .context("an IPv6 address lacks its closing \"]\"")?;
            if close == 0 {
                bail!("an IPv6 address in brackets is empty");
            }
            hosts.push_str(&inner[..close]);
            rest = &inner[close + 1..];
            if !rest.is_empty() && !rest.starts_with([':', '/', '?', ',']) {
                bail!("unexpected {:?} after an IPv6 address", &rest[..1]);
            }
            0
        } else {
            let end = rest.find([':', '/', '?', ',']).unwrap_or(rest.len());
            hosts.push_str(&rest[..end]);
            end
        };
        rest = &rest[host_end..];
        if let Some(after) = rest.strip_prefix(':') {
            let end = after.find(['/', '?', ',']).unwrap_or(after.len());
            ports.push_str(&after[..end]);
            rest = &after[end..];
        }
        match rest.strip_prefix(',') {
            Some(after) => {
                hosts.push(',');
                ports.push(',');
                rest = after;
            }
            None => break,
        }
    }
    if !hosts.is_empty() {
        pairs.push(("host".into(), percent_decode(&hosts, "host")?));
    }
    // A host list without ports still stores its commas (",") as the port
    // list, as libpq does: every host then gets 5432, and PGPORT does not
    // apply.
    if !ports.is_empty() {
        pairs.push(("port".into(), percent_decode(&ports, "port")?));
    }
    if let Some(after) = rest.strip_prefix('/') {
        let end = after.find('?').unwrap_or(after.len());
        if end > 0 {
            pairs.push(("dbname".into(), percent_decode(&after[..end], "dbname")?));
        }
        rest = &after[end..];
    }
    if let Some(query) = rest.strip_prefix('?') {
        // One "&" may end the query; any other empty parameter ("?&",
        // "a=1&&b=2") is an error, as in libpq.
        let mut params: Vec<&str> = query.split('&').collect();
        if params.last() == Some(&"") && (params.len() > 1 || query.is_empty()) {
            params.pop();
        }
        for param in params {
            let (key, value) = param
                .split_once('=')
                .with_context(|| format!("the query parameter {param:?} has no \"=\""))?;
            if value.contains('=') {
                bail!("the query parameter {key:?} has a second \"=\"");
            }
            let key = percent_decode(key, "a query parameter name")?;
            let value = percent_decode(value, &key)?;
            // JDBC's spelling, which libpq accepts too.
            if key == "ssl" && value == "true" {
                pairs.push(("sslmode".into(), "require".into()));
            } else {
                pairs.push((key, value));
            }
        }
    }
    Ok(pairs)
}

/// `%XX` sequences to bytes; libpq refuses `%00` and a `%` without two hex
/// digits. The error names the part, never its text (it may be a password).
/// Bytes that are not UTF-8 once decoded are refused where libpq takes
/// them: the driver passes user, database and password to the server as
/// text (a deliberate difference, see the module's list).
pub(crate) fn percent_decode(text: &str, part: &str) -> Result<String> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let byte = bytes
                .get(i + 1..i + 3)
                .and_then(|hex| std::str::from_utf8(hex).ok())
                .and_then(|hex| u8::from_str_radix(hex, 16).ok())
                .with_context(|| {
                    format!("the {part} has a \"%\" not followed by two hex digits")
                })?;
            if byte == 0 {
                bail!("the {part} holds %00, which libpq forbids");
            }
            out.push(byte);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).map_err(|error| {
        let byte = error.as_bytes()[error.utf8_error().valid_up_to()];
        anyhow!(
            "the {part} is not UTF-8 once percent-decoded (byte 0x{byte:02X}): outbox-poll \
             takes only UTF-8 text there; percent-encode the part's UTF-8 bytes"
        )
    })
}

/// libpq's `parseServiceInfo`: PGSERVICEFILE (which must exist), else
/// ~/.pg_service.conf if it exists; if the service is not there, the
/// system-wide file in PGSYSCONFDIR (or Debian's /etc/postgresql-common).
/// A service's settings fill only what the URL left unset.
fn apply_service(
    params: &mut Params,
    env: Env,
    files: &dyn Files,
    home: Option<&Path>,
) -> Result<()> {
    let service = match params.get("service") {
        Some(service) => service.to_string(),
        None => match env("PGSERVICE") {
            Some(service) => service,
            None => return Ok(()),
        },
    };
    let user_file = match env("PGSERVICEFILE") {
        Some(file) => Some(PathBuf::from(file)),
        None => home
            .map(|home| home.join(".pg_service.conf"))
            .filter(|file| matches!(files.stat(file), Ok(Some(_)))),
    };
    let system_file = PathBuf::from(env("PGSYSCONFDIR").unwrap_or_else(|| SYSCONFDIR.into()))
        .join("pg_service.conf");
    if let Some(file) = user_file {
        let text = read(files, &file)?
            .with_context(|| format!("service file {} not found", file.display()))?;
        if apply_service_section(params, &service, &file, &text)? {
            return Ok(());
        }
    }
    if let Some(text) = read(files, &system_file)?
        && apply_service_section(params, &service, &system_file, &text)?
    {
        return Ok(());
    }
    bail!(
        "definition of service {service:?} not found: add a [{service}] section to \
         ~/.pg_service.conf (or the file PGSERVICEFILE names), or fix service=/PGSERVICE"
    )
}

/// Applies the `[service]` section of one file; false if there is none.
/// Lines are trimmed; `#` starts a comment; a key runs up to the first `=`
/// with nothing trimmed around it, as in libpq (so `host = x` is a syntax
/// error there and here).
fn apply_service_section(
    params: &mut Params,
    service: &str,
    file: &Path,
    text: &str,
) -> Result<bool> {
    let mut found = false;
    for (index, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        if let Some(group) = line.strip_prefix('[') {
            if found {
                break;
            }
            found = group
                .strip_prefix(service)
                .is_some_and(|after| after.starts_with(']'));
            continue;
        }
        if !found {
            continue;
        }
        let origin = Origin::Service {
            file: file.to_path_buf(),
            line: index + 1,
        };
        let Some((key, value)) = line.split_once('=') else {
            bail!(
                "syntax error in service file {}, line {}: expected key=value",
                file.display(),
                index + 1
            );
        };
        if key == "service" {
            bail!(
                "nested service specifications are not supported (service file {}, line {})",
                file.display(),
                index + 1
            );
        }
        // libpq looks a service file's keys up in its list of keywords,
        // where the legacy `requiressl` is not (only a URL or key=value
        // string translates it): write sslmode=require.
        if key == "requiressl" {
            bail!(
                "syntax error in service file {}, line {}: requiressl is not a keyword here; \
                 write sslmode=require",
                file.display(),
                index + 1
            );
        }
        if !params.has(key) {
            params.store(key, value.to_string(), origin)?;
        }
    }
    Ok(found)
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

/// The name `.pgpass` lines give a host: `localhost` for libpq's
/// compiled-in socket directory spelled exactly so (no trailing slash,
/// as libpq compares the text), else the host as written.
fn pgpass_host(written: &str) -> String {
    if written == SOCKET_DIRS[0] {
        PGPASS_LOCALHOST.into()
    } else {
        written.into()
    }
}

/// What `.pgpass` calls the default socket directory.
const PGPASS_LOCALHOST: &str = "localhost";

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

/// sslmode, and how the server and we prove who we are. libpq's rules
/// (`fe-secure-openssl.c`, `initialize_SSL`): the root certificates are
/// `sslrootcert`, else ~/.postgresql/root.crt; when that file exists the
/// chain is verified in every mode, when it does not only verify-ca and
/// verify-full fail. `sslrootcert=system` needs verify-full and makes it
/// the default (libpq 16). The client certificate is `sslcert`, else
/// ~/.postgresql/postgresql.crt, sent only if the file exists, with
/// `sslkey` (else ~/.postgresql/postgresql.key), which must not be
/// readable by others.
///
/// libpq looks at those files only when it starts TLS, which it never does
/// over a socket: with no TCP host to try, none is looked at. (A list
/// mixing sockets and TCP hosts has them checked up front, where libpq
/// would fail only on reaching a TCP host.)
fn ssl(params: &Params, files: &dyn Files, home: Option<&Path>, tcp: bool) -> Result<Ssl> {
    let in_dot_postgresql = |name: &str| home.map(|home| home.join(".postgresql").join(name));
    let rootcert = params.given("sslrootcert");
    let system = rootcert == Some("system");
    let mode = match params.get("sslmode") {
        None if system => SslMode::VerifyFull,
        None => SslMode::Prefer,
        Some("disable") => SslMode::Disable,
        Some("allow") => SslMode::Allow,
        Some("prefer") => SslMode::Prefer,
        Some("require") => SslMode::Require,
        Some("verify-ca") => SslMode::VerifyCa,
        Some("verify-full") => SslMode::VerifyFull,
        Some(_) => bail!(
            "{} is not one of disable, allow, prefer, require, verify-ca, verify-full",
            params.describe("sslmode")
        ),
    };
    if system && mode != SslMode::VerifyFull {
        bail!(
            "{} may not be used with sslrootcert=system: use sslmode=verify-full (the system's \
             roots vouch for names, so only the name check makes them mean anything)",
            params.describe("sslmode")
        );
    }
    if !tcp {
        return Ok(Ssl {
            mode,
            server: ServerCheck::Nothing,
            client: None,
        });
    }
    let root = if system {
        Some(RootCert::System)
    } else {
        match rootcert
            .map(PathBuf::from)
            .or_else(|| in_dot_postgresql("root.crt"))
        {
            Some(file) if stat(files, &file)?.is_some() => Some(RootCert::File(file)),
            missing => {
                if matches!(mode, SslMode::VerifyCa | SslMode::VerifyFull) {
                    let file = missing.map_or("~/.postgresql/root.crt".into(), |file| {
                        file.display().to_string()
                    });
                    bail!(
                        "sslmode={} needs the root certificate file {file}, which does not \
                         exist: give sslrootcert=FILE (or sslrootcert=system for the \
                         system's roots), or a weaker sslmode",
                        if mode == SslMode::VerifyCa {
                            "verify-ca"
                        } else {
                            "verify-full"
                        }
                    );
                }
                None
            }
        }
    };
    let server = match (mode, root) {
        (SslMode::Disable, _) | (_, None) => ServerCheck::Nothing,
        (SslMode::VerifyFull, Some(root)) => ServerCheck::ChainAndName(root),
        (_, Some(root)) => ServerCheck::Chain(root),
    };
    let client = match params
        .given("sslcert")
        .map(PathBuf::from)
        .or_else(|| in_dot_postgresql("postgresql.crt"))
    {
        Some(cert) if mode != SslMode::Disable && stat(files, &cert)?.is_some() => {
            let key = params
                .given("sslkey")
                .map(PathBuf::from)
                .or_else(|| in_dot_postgresql("postgresql.key"))
                .context("sslcert is given but not sslkey: give the client certificate's key")?;
            check_key_file(files, &key)?;
            Some(ClientCert { cert, key })
        }
        _ => None,
    };
    Ok(Ssl {
        mode,
        server,
        client,
    })
}

/// libpq refuses a private key others can read: 0640 or less if root owns
/// it (a group of trusted readers), 0600 or less whoever else does.
fn check_key_file(files: &dyn Files, key: &Path) -> Result<()> {
    let stat = stat(files, key)?.with_context(|| {
        format!(
            "the client certificate's key {} does not exist: give sslkey=FILE",
            key.display()
        )
    })?;
    if !stat.regular {
        bail!(
            "the client certificate's key {} is not a plain file",
            key.display()
        );
    }
    let forbidden = if stat.uid == 0 { 0o037 } else { 0o077 };
    if stat.mode & forbidden != 0 {
        bail!(
            "the private key file {} has group or world access: chmod 0600 it (or 0640 if \
             root owns it)",
            key.display()
        );
    }
    Ok(())
}

/// Reads the password file if libpq would: it must be a plain file with
/// no group or world access; otherwise libpq warns and carries on without
/// it, and so do we.
fn read_password_file(
    files: &dyn Files,
    file: &Path,
    warnings: &mut Vec<String>,
) -> Result<Option<(PathBuf, String)>> {
    let Some(stat) = stat(files, file)? else {
        return Ok(None);
    };
    if !stat.regular {
        warnings.push(format!(
            "password file {} is not a plain file; ignored",
            file.display()
        ));
        return Ok(None);
    }
    if stat.mode & 0o077 != 0 {
        warnings.push(format!(
            "password file {} has group or world access; ignored (chmod 0600 it)",
            file.display()
        ));
        return Ok(None);
    }
    Ok(read(files, file)?.map(|text| (file.to_path_buf(), text)))
}

/// libpq's `passwordFromFile`: the first line `host:port:dbname:user:password`
/// whose four fields match, `*` matching anything, `\` escaping `:` and
/// `\`. `host` is the name [`pgpass_host`] gives, and `port` the port as
/// written (`port=05432` misses a `5432` line, as in libpq). Lines
/// starting with `#` are comments. The password ends at the next
/// unescaped `:`.
fn password_from_file(
    text: &str,
    host: &str,
    port: &str,
    dbname: &str,
    user: &str,
) -> Option<String> {
    text.lines()
        .map(|line| line.strip_suffix('\r').unwrap_or(line))
        .filter(|line| !line.is_empty() && !line.starts_with('#'))
        .find_map(|line| {
            let mut rest = line;
            for wanted in [host, port, dbname, user] {
                rest = pgpass_field_matches(rest, wanted)?;
            }
            Some(pgpass_unescape(rest))
        })
}

/// If the line's next field is `*` or `wanted` (escapes undone), the rest
/// of the line after its `:`.
fn pgpass_field_matches<'a>(line: &'a str, wanted: &str) -> Option<&'a str> {
    if let Some(rest) = line.strip_prefix("*:") {
        return Some(rest);
    }
    let mut field = String::new();
    let mut chars = line.char_indices();
    while let Some((index, c)) = chars.next() {
        match c {
            '\\' => field.extend(chars.next().map(|(_, c)| c)),
            ':' => return (field == wanted).then(|| &line[index + 1..]),
            c => field.push(c),
        }
    }
    None
}

fn pgpass_unescape(field: &str) -> String {
    let mut out = String::new();
    let mut chars = field.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => match chars.next() {
                Some(next) => out.push(next),
                None => out.push('\\'),
            },
            ':' => break,
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    const HOME: &str = "/home/relay";

    /// A file system of our own: path → (text, permission bits, owner).
    #[derive(Default)]
    struct FakeFiles(HashMap<PathBuf, (String, u32, u32)>);

    impl FakeFiles {
        /// A file of ours (uid 1000, the account's).
        fn with(self, path: &str, text: &str, mode: u32) -> Self {
            self.owned_by(path, text, mode, 1000)
        }

        fn owned_by(mut self, path: &str, text: &str, mode: u32, uid: u32) -> Self {
            self.0.insert(PathBuf::from(path), (text.into(), mode, uid));
            self
        }
    }

    impl Files for FakeFiles {
        fn read(&self, path: &Path) -> io::Result<Option<String>> {
            Ok(self.0.get(path).map(|(text, _, _)| text.clone()))
        }

        fn stat(&self, path: &Path) -> io::Result<Option<FileStat>> {
            Ok(self.0.get(path).map(|&(_, mode, uid)| FileStat {
                regular: !path.ends_with("not-a-file"),
                mode,
                uid,
            }))
        }
    }

    fn account() -> Account {
        Account {
            name: "relay".into(),
            home: Some(PathBuf::from(HOME)),
        }
    }

    fn env_of(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> + use<> {
        let pairs: Vec<(String, String)> = pairs
            .iter()
            .map(|(key, value)| (key.to_string(), value.to_string()))
            .collect();
        move |name| {
            pairs
                .iter()
                .find(|(key, _)| key == name)
                .map(|(_, value)| value.clone())
                .filter(|value| !value.is_empty())
        }
    }

    fn resolve_with(
        url: Option<&str>,
        env: &[(&str, &str)],
        files: &FakeFiles,
    ) -> Result<ConnInfo> {
        resolve(url, &env_of(env), files, Some(&account()))
    }

    fn info(url: &str) -> ConnInfo {
        resolve_with(Some(url), &[], &FakeFiles::default()).unwrap()
    }

    fn error(url: Option<&str>, env: &[(&str, &str)], files: &FakeFiles) -> String {
        format!("{:#}", resolve_with(url, env, files).unwrap_err())
    }

    /// Asserts that resolving fails with a message that says `expected`.
    fn assert_fails(url: Option<&str>, env: &[(&str, &str)], files: &FakeFiles, expected: &str) {
        let message = error(url, env, files);
        assert!(message.contains(expected), "{message}");
    }

    /// The same for a URL alone, without variables or files.
    fn url_fails(url: &str, expected: &str) {
        assert_fails(Some(url), &[], &FakeFiles::default(), expected);
    }

    /// The same for variables alone, without a URL or files.
    fn env_fails(env: &[(&str, &str)], expected: &str) {
        assert_fails(None, env, &FakeFiles::default(), expected);
    }

    fn tcp(host: &str, port: u16) -> (Host, u16) {
        (Host::Tcp(host.into()), port)
    }

    fn places(info: &ConnInfo) -> Vec<(Host, u16)> {
        info.targets
            .iter()
            .map(|target| (target.host.clone(), target.port))
            .collect()
    }

    fn passwords(info: &ConnInfo) -> Vec<Option<String>> {
        info.targets
            .iter()
            .map(|target| {
                target
                    .password
                    .as_ref()
                    .map(|password| password.secret().to_string())
            })
            .collect()
    }

    #[test]
    fn a_url_names_user_password_hosts_ports_database_and_parameters() {
        let info =
            info("postgresql://app:s3cret@db1:6543/orders?sslmode=require&application_name=relay");
        assert_eq!(places(&info), [tcp("db1", 6543)]);
        assert_eq!(
            (info.user.as_str(), info.dbname.as_str()),
            ("app", "orders")
        );
        assert_eq!(passwords(&info), [Some("s3cret".to_string())]);
        assert_eq!(info.ssl.mode, SslMode::Require);
        assert_eq!(info.application_name, "relay");
    }

    #[test]
    fn the_short_postgres_scheme_is_a_url_too() {
        assert_eq!(places(&info("postgres://u@db1/x")), [tcp("db1", 5432)]);
    }

    #[test]
    fn a_url_lists_hosts_each_with_its_port_or_the_default() {
        let info = info("postgresql://u@a:5433,b,c:5435/x");
        assert_eq!(
            places(&info),
            [tcp("a", 5433), tcp("b", 5432), tcp("c", 5435)]
        );
    }

    #[test]
    fn a_url_host_list_without_ports_gets_5432_everywhere_whatever_pgport_says() {
        let env = [("PGPORT", "6000")];
        let info = resolve_with(Some("postgresql://u@a,b/x"), &env, &FakeFiles::default()).unwrap();
        assert_eq!(places(&info), [tcp("a", 5432), tcp("b", 5432)]);
    }

    #[test]
    fn bracketed_ipv6_addresses_lose_their_brackets() {
        let info = info("postgresql://u@[::1]:5433,[fe80::2]/x");
        assert_eq!(places(&info), [tcp("::1", 5433), tcp("fe80::2", 5432)]);
        assert_eq!(info.targets[0].to_string(), "[::1]:5433");
    }

    #[test]
    fn an_unclosed_ipv6_bracket_is_named() {
        url_fails("postgresql://u@[::1/x", "closing \"]\"");
    }

    #[test]
    fn every_url_part_is_percent_decoded() {
        let info = info("postgresql://us%40r:p%3Aw%2Fd@%2Frun%2Fpg/my%20db?options=-c%20a%3Db");
        assert_eq!(info.user, "us@r");
        assert_eq!(passwords(&info), [Some("p:w/d".to_string())]);
        assert_eq!(places(&info), [(Host::Socket("/run/pg".into()), 5432)]);
        assert_eq!(info.dbname, "my db");
        assert_eq!(info.options.as_deref(), Some("-c a=b"));
    }

    #[test]
    fn a_bad_percent_escape_is_reported_without_the_password() {
        let message = error(
            Some("postgresql://u:hun%zzter2@h/x"),
            &[],
            &FakeFiles::default(),
        );
        assert!(message.contains("two hex digits"), "{message}");
        assert!(!message.contains("hun"), "{message}");
    }

    #[test]
    fn a_percent_encoded_nul_is_refused() {
        url_fails("postgresql://u@h/a%00b", "the dbname holds %00");
    }

    #[test]
    fn query_parameters_override_the_authority() {
        let info = info("postgresql://u@a/x?host=b&port=7000&dbname=y");
        assert_eq!(places(&info), [tcp("b", 7000)]);
        assert_eq!(info.dbname, "y");
    }

    #[test]
    fn a_query_parameter_without_a_value_is_an_error() {
        url_fails("postgresql://u@a/x?sslmode", "\"sslmode\" has no \"=\"");
    }

    #[test]
    fn jdbc_ssl_true_and_legacy_requiressl_mean_require() {
        assert_eq!(
            info("postgresql://u@a/x?ssl=true").ssl.mode,
            SslMode::Require
        );
        assert_eq!(
            info("host=a user=u requiressl=1").ssl.mode,
            SslMode::Require
        );
    }

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
    fn an_empty_query_parameter_is_an_error_but_one_trailing_ampersand_is_not() {
        url_fails(
            "postgresql://h/db?&",
            "the query parameter \"\" has no \"=\"",
        );
        url_fails(
            "postgresql://h/db?sslmode=require&&user=u",
            "the query parameter \"\" has no \"=\"",
        );
        assert_eq!(
            info("postgresql://u@h/db?sslmode=require&").ssl.mode,
            SslMode::Require
        );
        assert_eq!(info("postgresql://u@h/db?").dbname, "db");
    }

    #[test]
    fn a_url_part_that_is_not_utf8_once_decoded_is_refused_naming_the_part() {
        url_fails(
            "postgresql://u@h/%ff",
            "the dbname is not UTF-8 once percent-decoded (byte 0xFF)",
        );
        url_fails(
            "postgresql://u:%c3@h/x",
            "the password is not UTF-8 once percent-decoded",
        );
    }

    #[test]
    fn key_values_take_quotes_escapes_and_spaces_around_the_equals_sign() {
        let info = info(r"host = a  user=u password='it\'s' dbname='my \'db\'' options=-c\ x=1");
        assert_eq!(passwords(&info), [Some("it's".to_string())]);
        assert_eq!(info.dbname, "my 'db'");
        assert_eq!(info.options.as_deref(), Some("-c x=1"));
        assert_eq!(places(&info), [tcp("a", 5432)]);
    }

    #[test]
    fn key_values_list_hosts_and_ports() {
        let info = info("host=a,b,/run/pg port=5433,,5434 user=u");
        assert_eq!(
            places(&info),
            [
                tcp("a", 5433),
                tcp("b", 5432),
                (Host::Socket("/run/pg".into()), 5434)
            ]
        );
    }

    #[test]
    fn the_last_occurrence_of_a_key_wins() {
        assert_eq!(
            info("host=a host=b user=u").targets[0].host,
            Host::Tcp("b".into())
        );
    }

    #[test]
    fn an_unterminated_quote_is_an_error() {
        url_fails("host='a user=u", "unterminated quoted value of \"host\"");
    }

    #[test]
    fn a_key_without_equals_is_an_error() {
        url_fails("host=a user", "missing \"=\" after \"user\"");
    }

    #[test]
    fn a_string_that_is_neither_url_nor_key_values_is_refused() {
        url_fails("postgres:/oops", "neither a postgresql:// URL");
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

    const SERVICES: &str = "# comment\n[other]\nport=1\n[mainx]\nport=2\n[main]\nhost=db9\n  port=6001  \n\
                            user=svc\ndbname=svcdb\n[later]\nport=3\n";

    #[test]
    fn a_service_fills_what_the_url_leaves_out_and_wins_over_the_environment() {
        let files = FakeFiles::default().with("/etc/svc.conf", SERVICES, 0o644);
        let env = [
            ("PGSERVICEFILE", "/etc/svc.conf"),
            ("PGUSER", "envuser"),
            ("PGDATABASE", "envdb"),
        ];
        let info = resolve_with(Some("service=main user=explicit"), &env, &files).unwrap();
        assert_eq!(places(&info), [tcp("db9", 6001)]);
        assert_eq!(
            (info.user.as_str(), info.dbname.as_str()),
            ("explicit", "svcdb")
        );
    }

    #[test]
    fn pgservice_names_the_service() {
        let files = FakeFiles::default().with("/etc/svc.conf", SERVICES, 0o644);
        let env = [("PGSERVICE", "main"), ("PGSERVICEFILE", "/etc/svc.conf")];
        assert_eq!(
            places(&resolve_with(None, &env, &files).unwrap()),
            [tcp("db9", 6001)]
        );
    }

    #[test]
    fn the_service_file_in_home_comes_before_the_system_one() {
        let files = FakeFiles::default()
            .with("/home/relay/.pg_service.conf", "[main]\nhost=mine\n", 0o600)
            .with(
                "/etc/postgresql-common/pg_service.conf",
                "[main]\nhost=system\n[sys]\nhost=only-system\n",
                0o644,
            );
        assert_eq!(
            info_with_files("service=main user=u", &files).targets[0].host,
            Host::Tcp("mine".into())
        );
        assert_eq!(
            info_with_files("service=sys user=u", &files).targets[0].host,
            Host::Tcp("only-system".into())
        );
    }

    fn info_with_files(url: &str, files: &FakeFiles) -> ConnInfo {
        resolve_with(Some(url), &[], files).unwrap()
    }

    #[test]
    fn pgsysconfdir_moves_the_system_service_file() {
        let files =
            FakeFiles::default().with("/opt/pg/pg_service.conf", "[main]\nhost=opt\n", 0o644);
        let info = resolve_with(
            Some("service=main user=u"),
            &[("PGSYSCONFDIR", "/opt/pg")],
            &files,
        )
        .unwrap();
        assert_eq!(info.targets[0].host, Host::Tcp("opt".into()));
    }

    #[test]
    fn a_missing_service_or_service_file_is_an_error() {
        let files = FakeFiles::default().with("/etc/svc.conf", SERVICES, 0o644);
        assert_fails(
            Some("service=nope"),
            &[("PGSERVICEFILE", "/etc/svc.conf")],
            &files,
            "definition of service \"nope\" not found",
        );
        assert_fails(
            Some("service=main"),
            &[("PGSERVICEFILE", "/etc/none.conf")],
            &files,
            "service file /etc/none.conf not found",
        );
    }

    #[test]
    fn a_service_line_with_spaces_around_equals_or_an_unknown_key_is_named_by_line() {
        for (text, expected) in [
            (
                "[main]\nhost = x\n",
                "unknown connection parameter \"host \" in /s.conf, line 2",
            ),
            (
                "[main]\n\nfrob=1\n",
                "unknown connection parameter \"frob\" in /s.conf, line 3",
            ),
            (
                "[main]\njunk\n",
                "syntax error in service file /s.conf, line 2",
            ),
            ("[main]\nservice=other\n", "nested service specifications"),
        ] {
            let files = FakeFiles::default().with("/s.conf", text, 0o644);
            assert_fails(
                Some("service=main"),
                &[("PGSERVICEFILE", "/s.conf")],
                &files,
                expected,
            );
        }
    }

    #[test]
    fn requiressl_in_a_service_file_is_a_syntax_error() {
        let files = FakeFiles::default().with("/s.conf", "[main]\nrequiressl=1\n", 0o644);
        assert_fails(
            Some("service=main user=u"),
            &[("PGSERVICEFILE", "/s.conf")],
            &files,
            "syntax error in service file /s.conf, line 2: requiressl",
        );
    }

    #[test]
    fn a_bad_value_from_a_service_names_its_file_and_line() {
        let files = FakeFiles::default().with("/s.conf", "[main]\nsslmode=sure\n", 0o644);
        assert_fails(
            Some("service=main"),
            &[("PGSERVICEFILE", "/s.conf")],
            &files,
            "sslmode=\"sure\" in /s.conf, line 2 is not one of",
        );
    }

    const PGPASS: &str = "# host:port:db:user:password\n\
                          db1:5432:orders:app:first\n\
                          db1:5432:orders:app:shadowed\n\
                          db2:*:*:app:any-db\n\
                          localhost:5432:*:*:on-the-socket\n\
                          /run/pg:5432:*:*:other-socket\n\
                          db\\:3:5432:*:*:escaped\\:colon\\\\:extra\n\
                          *:*:*:*:fallback\n";

    fn pgpass_files(mode: u32) -> FakeFiles {
        FakeFiles::default().with("/home/relay/.pgpass", PGPASS, mode)
    }

    fn password_for(url: &str, files: &FakeFiles) -> Option<String> {
        passwords(&resolve_with(Some(url), &[], files).unwrap()).remove(0)
    }

    /// Asserts the password the first host of `url` gets.
    fn assert_password(url: &str, files: &FakeFiles, expected: &str) {
        assert_eq!(password_for(url, files).as_deref(), Some(expected), "{url}");
    }

    #[test]
    fn the_first_matching_pgpass_line_gives_the_password() {
        let files = pgpass_files(0o600);
        assert_password("host=db1 dbname=orders user=app", &files, "first");
        assert_password("host=db2 port=7 dbname=x user=app", &files, "any-db");
        assert_password("host=db3 user=other", &files, "fallback");
    }

    #[test]
    fn pgpass_is_matched_per_host_and_port() {
        let files = pgpass_files(0o600);
        let info = resolve_with(
            Some("host=db1,db2 port=5432,5433 dbname=orders user=app"),
            &[],
            &files,
        )
        .unwrap();
        assert_eq!(
            passwords(&info),
            [Some("first".to_string()), Some("any-db".to_string())]
        );
        let file = info.targets[0].password.as_ref().unwrap().file.clone();
        assert_eq!(file, Some(PathBuf::from("/home/relay/.pgpass")));
    }

    #[test]
    fn pgpass_escapes_colons_and_backslashes_and_ends_the_password_at_a_colon() {
        let files = pgpass_files(0o600);
        assert_password("host=db:3 user=u", &files, "escaped:colon\\");
    }

    #[test]
    fn localhost_in_pgpass_matches_the_default_socket_only() {
        let files = pgpass_files(0o600).with("/var/run/postgresql/.s.PGSQL.5432", "", 0o777);
        assert_password("user=u", &files, "on-the-socket");
        assert_password("host=/run/pg user=u", &files, "other-socket");
        assert_password("host=/srv/pg user=u", &files, "fallback");
    }

    #[test]
    fn a_socket_directory_with_a_trailing_slash_is_matched_in_pgpass_as_written() {
        let files = FakeFiles::default().with(
            "/home/relay/.pgpass",
            "localhost:5432:*:*:sock\n/var/run/postgresql/:5432:*:*:as-written\n",
            0o600,
        );
        assert_password("host=/var/run/postgresql user=u", &files, "sock");
        assert_password("host=/var/run/postgresql/ user=u", &files, "as-written");
    }

    #[test]
    fn an_explicit_tmp_socket_is_not_localhost_in_pgpass() {
        let files = FakeFiles::default().with(
            "/home/relay/.pgpass",
            "localhost:5432:*:*:sock\n/tmp:5432:*:*:tmp\n",
            0o600,
        );
        assert_password("host=/tmp user=u", &files, "tmp");
    }

    #[test]
    fn the_pgpass_port_is_compared_as_written() {
        let files = FakeFiles::default().with(
            "/home/relay/.pgpass",
            "h:5432:*:*:plain\nh:05432:*:*:padded\n",
            0o600,
        );
        assert_password("host=h port=05432 user=u", &files, "padded");
        assert_password("host=h port=5432 user=u", &files, "plain");
    }

    #[test]
    fn a_password_given_anywhere_beats_pgpass() {
        let files = pgpass_files(0o600);
        assert_password(
            "host=db1 dbname=orders user=app password=given",
            &files,
            "given",
        );
        let info = resolve_with(
            Some("host=db1 dbname=orders user=app"),
            &[("PGPASSWORD", "env")],
            &files,
        )
        .unwrap();
        assert_eq!(passwords(&info), [Some("env".to_string())]);
    }

    #[test]
    fn a_given_password_leaves_the_password_file_unread() {
        let info = resolve_with(
            Some("host=db1 user=app password=given"),
            &[],
            &pgpass_files(0o644),
        )
        .unwrap();
        assert_eq!(info.warnings, Vec::<String>::new());
    }

    #[test]
    fn a_commented_pgpass_line_is_never_used() {
        let files = FakeFiles::default().with(
            "/home/relay/.pgpass",
            "#db:5432:*:*:commented\n*:*:*:*:live\n",
            0o600,
        );
        assert_password("host=#db user=u", &files, "live");
    }

    #[test]
    fn an_empty_password_still_consults_pgpass() {
        let files = pgpass_files(0o600);
        assert_password(
            "host=db1 dbname=orders user=app password=''",
            &files,
            "first",
        );
    }

    /// Asserts that the password file was ignored, with one warning that
    /// says `warning`.
    fn assert_file_ignored(url: &str, files: &FakeFiles, warning: &str) {
        let info = resolve_with(Some(url), &[], files).unwrap();
        assert_eq!(passwords(&info), [None]);
        assert_eq!(info.warnings.len(), 1, "{:?}", info.warnings);
        assert!(info.warnings[0].contains(warning), "{:?}", info.warnings);
    }

    #[test]
    fn a_pgpass_readable_by_others_is_ignored_with_a_warning() {
        let warning = "/home/relay/.pgpass has group or world access";
        assert_file_ignored(
            "host=db1 dbname=orders user=app",
            &pgpass_files(0o640),
            warning,
        );
    }

    #[test]
    fn a_pgpass_that_is_not_a_plain_file_is_ignored_with_a_warning() {
        let files = FakeFiles::default().with("/p/not-a-file", PGPASS, 0o600);
        let url = "host=db1 user=u passfile=/p/not-a-file";
        assert_file_ignored(url, &files, "/p/not-a-file is not a plain file");
    }

    #[test]
    fn passfile_and_pgpassfile_name_the_password_file() {
        let files = FakeFiles::default()
            .with("/a/pass", "*:*:*:*:from-param\n", 0o600)
            .with("/b/pass", "*:*:*:*:from-env\n", 0o600);
        assert_password("host=h user=u passfile=/a/pass", &files, "from-param");
        let info =
            resolve_with(Some("host=h user=u"), &[("PGPASSFILE", "/b/pass")], &files).unwrap();
        assert_eq!(passwords(&info), [Some("from-env".to_string())]);
    }

    #[test]
    fn home_comes_from_home_before_the_account() {
        let files = FakeFiles::default().with("/elsewhere/.pgpass", "*:*:*:*:via-home\n", 0o600);
        let info = resolve_with(Some("host=h user=u"), &[("HOME", "/elsewhere")], &files).unwrap();
        assert_eq!(passwords(&info), [Some("via-home".to_string())]);
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
    fn a_root_certificate_file_makes_require_verify_the_chain() {
        let files = FakeFiles::default().with("/home/relay/.postgresql/root.crt", "", 0o644);
        let info = info_with_files("host=h user=u sslmode=require", &files);
        let root = RootCert::File("/home/relay/.postgresql/root.crt".into());
        assert_eq!(info.ssl.server, ServerCheck::Chain(root));
        assert_eq!(
            self::info("host=h user=u sslmode=require").ssl.server,
            ServerCheck::Nothing
        );
    }

    #[test]
    fn verify_full_checks_the_name_against_the_given_roots() {
        let files = FakeFiles::default().with("/ca.pem", "", 0o644);
        let info = info_with_files(
            "host=h user=u sslmode=verify-full sslrootcert=/ca.pem",
            &files,
        );
        assert_eq!(
            info.ssl.server,
            ServerCheck::ChainAndName(RootCert::File("/ca.pem".into()))
        );
    }

    #[test]
    fn verify_modes_without_a_root_file_say_which_file_is_missing() {
        url_fails(
            "host=h user=u sslmode=verify-ca",
            "/home/relay/.postgresql/root.crt, which does not exist",
        );
        url_fails(
            "host=h user=u sslmode=verify-full sslrootcert=/nope.pem",
            "/nope.pem, which does not exist",
        );
    }

    #[test]
    fn sslrootcert_system_means_verify_full_and_refuses_weaker_modes() {
        let info = info("host=h user=u sslrootcert=system");
        assert_eq!(info.ssl.mode, SslMode::VerifyFull);
        assert_eq!(info.ssl.server, ServerCheck::ChainAndName(RootCert::System));
        url_fails(
            "host=h user=u sslrootcert=system sslmode=require",
            "sslmode=\"require\" in the database URL may not be used with sslrootcert=system",
        );
    }

    #[test]
    fn a_client_certificate_is_sent_only_if_its_file_exists() {
        let files = FakeFiles::default()
            .with("/home/relay/.postgresql/postgresql.crt", "", 0o644)
            .with("/home/relay/.postgresql/postgresql.key", "", 0o600);
        let client = info_with_files("host=h user=u", &files).ssl.client;
        assert_eq!(
            client,
            Some(ClientCert {
                cert: "/home/relay/.postgresql/postgresql.crt".into(),
                key: "/home/relay/.postgresql/postgresql.key".into(),
            })
        );
        assert_eq!(info("host=h user=u sslcert=/missing.crt").ssl.client, None);
    }

    #[test]
    fn a_client_key_readable_by_others_is_refused() {
        let files = FakeFiles::default()
            .with("/c.crt", "", 0o644)
            .with("/c.key", "", 0o644);
        assert_fails(
            Some("host=h user=u sslcert=/c.crt sslkey=/c.key"),
            &[],
            &files,
            "private key file /c.key has group or world access",
        );
    }

    #[test]
    fn tls_files_are_not_checked_when_every_host_is_a_socket() {
        let files = FakeFiles::default()
            .with("/c.crt", "", 0o644)
            .with("/c.key", "", 0o644);
        let info = info_with_files(
            "host=/var/run/postgresql,/tmp user=u sslmode=verify-full sslcert=/c.crt sslkey=/c.key",
            &files,
        );
        assert_eq!(info.ssl.mode, SslMode::VerifyFull);
        assert_eq!(
            (info.ssl.server, info.ssl.client),
            (ServerCheck::Nothing, None)
        );
        assert_fails(
            Some("host=/tmp,h user=u sslmode=verify-full"),
            &[],
            &files,
            "needs the root certificate file",
        );
    }

    #[test]
    fn a_root_owned_key_may_be_0640_and_any_other_owner_needs_0600() {
        let key = |mode: u32, uid: u32| {
            let files = FakeFiles::default()
                .with("/c.crt", "", 0o644)
                .owned_by("/c.key", "", mode, uid);
            resolve_with(
                Some("host=h user=u sslcert=/c.crt sslkey=/c.key"),
                &[],
                &files,
            )
            .map(|info| info.ssl.client.is_some())
            .map_err(|error| format!("{error:#}"))
        };
        assert_eq!(key(0o640, 0), Ok(true));
        assert_eq!(key(0o600, 2000), Ok(true));
        for (mode, uid) in [(0o660, 0), (0o644, 0), (0o640, 2000), (0o640, 1000)] {
            let error = key(mode, uid).unwrap_err();
            assert!(
                error.contains("has group or world access"),
                "{mode:o} {uid}: {error}"
            );
        }
    }

    #[test]
    fn sockets_and_hosts_print_as_an_operator_would_write_them() {
        let info = info("host=db1,/run/pg port=5432,5433 user=u");
        let shown: Vec<String> = info.targets.iter().map(ToString::to_string).collect();
        assert_eq!(shown, ["db1:5432", "/run/pg/.s.PGSQL.5433"]);
    }
}
