//! conninfo against the real libpq: several hundred connection settings
//! (URLs, key=value strings, host and port lists, sslmode and its files,
//! service files, PG variables, password files) generated from a grammar,
//! plus mutations of them, each resolved by `conninfo::resolve` and by the
//! system's libpq, and the two views compared: whether it is an error, and
//! otherwise the hosts, ports and passwords tried, database, user, sslmode,
//! the TLS files used, target_session_attrs, application_name and options.
//!
//! Why a test binary of its own (`harness = false`): libpq reads the PG*
//! variables with getenv and the files named by them, and every case sets
//! its own. Setting the environment races any other thread of the process,
//! and the suite's tests run on threads. This binary is its own process,
//! one thread, one case after the other: nothing else can see or change
//! its environment.
//!
//! Why nothing is ever reached: libpq's view is taken with
//! `PQconnectStartParams`, which merges and checks everything and then
//! tries the first hosts. Every call passes `keepalives=x`, which libpq
//! parses after creating a TCP socket and before `connect()`: an invalid
//! value makes it give up that address at once, so no TCP connection is
//! ever attempted. Socket hosts are directories of our temporary
//! directory, where nothing listens, and a case whose hosts are anything
//! else (a name to look up, the real socket directory, libpq's default) is
//! skipped before libpq sees it. The one thing `PQconnectStartParams`
//! leaves out, `connect_timeout` (parsed by the blocking connect), is
//! checked with libpq's own integer reading, through `keepalives`.
//!
//! The "WARNING: password file ... has group or world access" lines on
//! stderr are libpq's own, for the cases that name the open password file.
//!
//! Replay: the seed is printed; `LIBPQ_DIFF_SEED=N cargo test --test
//! libpq_differential` runs the same cases, and `LIBPQ_DIFF_VERBOSE=1`
//! prints every one.

// The comparison calls libpq itself through pq-sys, and sets the PG*
// variables libpq reads (set_var is unsafe since edition 2024): every
// unsafe block here carries its SAFETY comment.
#![allow(unsafe_code)]

use std::collections::BTreeMap;
use std::ffi::{CStr, CString};
use std::fmt::Write as _;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::ptr;

use outbox_poll::connect::conninfo::{
    self, Account, ConnInfo, Host, RootCert, ServerCheck, SslMode, SystemFiles, TargetSessionAttrs,
};

const DEFAULT_SEED: u64 = 0x00C0_FFEE_2024;
const GENERATED: usize = 400;
const MUTATED: usize = 300;

/// The module's deliberate differences (its doc lists them, and README):
/// a case where one applies is expected to disagree, and is counted.
const EXPECTED: [(&str, Applies); 5] = [
    (
        "sslrootcert=system is libpq 16's (15 reads a file named system)",
        |_, libpq| matches!(libpq, Outcome::Resolved(view) if view.sslrootcert.as_deref() == Some("system")),
    ),
    (
        "keywords not implemented are refused, not ignored",
        |ours, _| ours.error_says("is not supported by outbox-poll"),
    ),
    ("a URL part not UTF-8 once decoded is refused", |ours, _| {
        ours.error_says("not UTF-8 once percent-decoded")
    }),
    (
        "TLS files are checked when resolving (libpq: on reaching a TCP host)",
        |ours, libpq| {
            matches!(libpq, Outcome::Resolved(view)
                if view.targets.iter().any(|(host, _, _)| !host.starts_with('/')))
                && (ours.error_says("root certificate file")
                    || ours.error_says("private key file")
                    || ours.error_says("client certificate's key"))
        },
    ),
    (
        "a string neither URL nor key=value is refused (psql: a database name)",
        |ours, _| ours.error_says("neither a postgresql:// URL nor key=value"),
    ),
];

/// Whether a deliberate difference applies, given (ours, libpq's).
type Applies = fn(&Outcome, &Outcome) -> bool;

fn main() {
    let seed = std::env::var("LIBPQ_DIFF_SEED")
        .ok()
        .and_then(|seed| seed.parse().ok())
        .unwrap_or(DEFAULT_SEED);
    let verbose = std::env::var_os("LIBPQ_DIFF_VERBOSE").is_some();
    // SAFETY: PQlibVersion reads a constant.
    let version = unsafe { pq_sys::PQlibVersion() };
    println!("libpq differential: seed {seed} (LIBPQ_DIFF_SEED={seed} replays), libpq {version}");
    let world = World::create();
    let account = Account::current(&SystemFiles);
    let mut random = Random(seed);
    let mut cases: Vec<Case> = (0..GENERATED)
        .map(|_| generate(&mut random, &world))
        .collect();
    for _ in 0..MUTATED {
        let mut case = cases[random.below(GENERATED)].clone();
        mutate(&mut random, &mut case);
        cases.push(case);
    }
    let mut tally: BTreeMap<&str, usize> = BTreeMap::new();
    let mut failures = Vec::new();
    for (index, case) in cases.iter().enumerate() {
        if !world.safe(case) {
            *tally
                .entry("skipped: would reach outside the test")
                .or_default() += 1;
            continue;
        }
        let libpq = world.libpq(case);
        let ours = ours(case, account.as_ref(), &world);
        let verdict = match EXPECTED.iter().find(|(_, applies)| applies(&ours, &libpq)) {
            Some((name, _)) => name,
            None if agree(&ours, &libpq) => "agree",
            None => {
                failures.push(format!(
                    "case {index}: {case}\n  ours:  {ours:?}\n  libpq: {libpq:?}"
                ));
                "DISAGREE"
            }
        };
        if verbose {
            println!("case {index} [{verdict}]: {case}\n  ours:  {ours:?}\n  libpq: {libpq:?}");
        }
        *tally.entry(verdict).or_default() += 1;
    }
    world.remove();
    for (verdict, count) in &tally {
        println!("  {count:4} {verdict}");
    }
    if !failures.is_empty() {
        eprintln!("{}", failures.join("\n"));
        eprintln!(
            "{} of {} cases disagree with libpq (seed {seed}): fix conninfo, or list a \
             deliberate difference in EXPECTED and the module's doc",
            failures.len(),
            cases.len()
        );
        std::process::exit(1);
    }
    let agreed = tally.get("agree").copied().unwrap_or(0);
    assert!(
        agreed * 2 > cases.len(),
        "only {agreed} of {} cases were compared: the grammar no longer exercises conninfo",
        cases.len()
    );
    println!("test libpq_differential ... ok ({} cases)", cases.len());
}

/// One input: the connection string (None: none given) and the variables.
#[derive(Clone)]
struct Case {
    url: Option<String>,
    env: Vec<(&'static str, String)>,
}

impl std::fmt::Display for Case {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:?}", self.url)?;
        for (name, value) in &self.env {
            write!(f, " {name}={value:?}")?;
        }
        Ok(())
    }
}

/// Either side's reading of a case.
#[derive(Debug)]
enum Outcome {
    Error(String),
    Resolved(Box<View>),
}

impl Outcome {
    fn error_says(&self, text: &str) -> bool {
        matches!(self, Outcome::Error(message) if message.contains(text))
    }
}

/// What both sides can say about a resolved case. libpq's TLS files are
/// the option values; ours are the files conninfo decided to use, so they
/// are compared through `expected_tls`.
#[derive(Debug)]
struct View {
    /// (host, port, password) of each host that is tried.
    targets: Vec<(String, String, String)>,
    user: String,
    dbname: String,
    sslmode: String,
    /// libpq's option (ours: None), for EXPECTED.
    sslrootcert: Option<String>,
    target_session_attrs: String,
    application_name: String,
    options: String,
    tls: Option<Tls>,
}

/// The files a TLS session would use: root file and whether the name is
/// checked, and the client certificate and key.
#[derive(Debug, Clone, PartialEq)]
struct Tls {
    root: Option<(String, bool)>,
    client: Option<(String, String)>,
}

fn agree(ours: &Outcome, libpq: &Outcome) -> bool {
    match (ours, libpq) {
        (Outcome::Error(_), Outcome::Error(_)) => true,
        (Outcome::Resolved(ours), Outcome::Resolved(libpq)) => {
            ours.targets == libpq.targets
                && ours.user == libpq.user
                && ours.dbname == libpq.dbname
                && ours.sslmode == libpq.sslmode
                && ours.target_session_attrs == libpq.target_session_attrs
                && ours.application_name == libpq.application_name
                && ours.options == libpq.options
                && ours.tls == libpq.tls
        }
        _ => false,
    }
}

/// conninfo's reading. The environment is the case's alone (plus the
/// baseline), read through the closure: the process's is never consulted.
fn ours(case: &Case, account: Option<&Account>, world: &World) -> Outcome {
    let env = world.environment(case);
    let lookup = |name: &str| {
        env.iter()
            .find(|(key, _)| *key == name)
            .map(|(_, value)| value.clone())
    };
    match conninfo::resolve(case.url.as_deref(), &lookup, &SystemFiles, account) {
        Err(error) => Outcome::Error(format!("{error:#}")),
        Ok(info) => Outcome::Resolved(Box::new(view_of(&info))),
    }
}

fn view_of(info: &ConnInfo) -> View {
    let targets = info
        .targets
        .iter()
        .map(|target| {
            let host = match &target.host {
                Host::Tcp(name) => name.clone(),
                Host::Socket(dir) => dir.to_string_lossy().into_owned(),
            };
            let password = target
                .password
                .as_ref()
                .map_or(String::new(), |password| password.secret().to_string());
            (host, target.port.to_string(), password)
        })
        .collect();
    let tcp = info
        .targets
        .iter()
        .any(|target| matches!(target.host, Host::Tcp(_)));
    let root = match &info.ssl.server {
        ServerCheck::Nothing => None,
        ServerCheck::Chain(root) => Some((root_name(root), false)),
        ServerCheck::ChainAndName(root) => Some((root_name(root), true)),
    };
    let client = info.ssl.client.as_ref().map(|client| {
        (
            client.cert.to_string_lossy().into_owned(),
            client.key.to_string_lossy().into_owned(),
        )
    });
    View {
        targets,
        user: info.user.clone(),
        dbname: info.dbname.clone(),
        sslmode: mode_name(info.ssl.mode).into(),
        sslrootcert: None,
        target_session_attrs: attrs_name(info.target_session_attrs).into(),
        application_name: info.application_name.clone(),
        options: info.options.clone().unwrap_or_default(),
        tls: (tcp && info.ssl.mode != SslMode::Disable).then_some(Tls { root, client }),
    }
}

fn root_name(root: &RootCert) -> String {
    match root {
        RootCert::File(file) => file.to_string_lossy().into_owned(),
        RootCert::System => "system".into(),
    }
}

fn mode_name(mode: SslMode) -> &'static str {
    match mode {
        SslMode::Disable => "disable",
        SslMode::Allow => "allow",
        SslMode::Prefer => "prefer",
        SslMode::Require => "require",
        SslMode::VerifyCa => "verify-ca",
        SslMode::VerifyFull => "verify-full",
    }
}

fn attrs_name(attrs: TargetSessionAttrs) -> &'static str {
    match attrs {
        TargetSessionAttrs::Any => "any",
        TargetSessionAttrs::ReadWrite => "read-write",
        TargetSessionAttrs::ReadOnly => "read-only",
        TargetSessionAttrs::Primary => "primary",
        TargetSessionAttrs::Standby => "standby",
        TargetSessionAttrs::PreferStandby => "prefer-standby",
    }
}

/// The temporary directory with the files cases name, and the libpq side.
struct World {
    dir: PathBuf,
    home: PathBuf,
}

/// Variables libpq reads that a case may set; all are cleared between
/// cases.
const VARIABLES: [&str; 17] = [
    "PGHOST",
    "PGPORT",
    "PGUSER",
    "PGPASSWORD",
    "PGDATABASE",
    "PGSSLMODE",
    "PGREQUIRESSL",
    "PGSSLROOTCERT",
    "PGSSLCERT",
    "PGSSLKEY",
    "PGPASSFILE",
    "PGSERVICE",
    "PGSERVICEFILE",
    "PGSYSCONFDIR",
    "PGTARGETSESSIONATTRS",
    "PGAPPNAME",
    "PGCONNECT_TIMEOUT",
];

impl World {
    fn create() -> World {
        let dir =
            std::env::temp_dir().join(format!("outbox-poll-libpq-diff-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        for sub in ["s1", "s2", "s 3", "sysconf"] {
            std::fs::create_dir_all(dir.join(sub)).expect("creating the test's directory");
        }
        let d = dir.to_string_lossy().into_owned();
        let write = |name: &str, text: &str, mode: u32| {
            let path = dir.join(name);
            std::fs::write(&path, text).expect("writing a test file");
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode))
                .expect("setting a test file's mode");
        };
        let pgpass = format!(
            "# host:port:db:user:password\n\
             127.0.0.2:1:*:*:p-tcp-1\n\
             127.0.0.3:*:d:*:p-db-d\n\
             {d}/s1:*:*:*:p-s1\n\
             {d}/s2/:*:*:*:p-s2-slash\n\
             {d}/s2:*:*:*:p-s2\n\
             *:05432:*:*:p-padded\n\
             *:+7:*:*:p-plus\n\
             \\:\\:1:*:*:*:p-v6\\:colon\n\
             *:2:*:app:p-any-2\n\
             *:*:my db:*:p-mydb\n"
        );
        write("pgpass", &pgpass, 0o600);
        write("pgpass-open", &pgpass, 0o644);
        write(
            "services.conf",
            &format!(
                "# services\n\
                 [svc]\nhost=127.0.0.3\nport=2\ndbname=sdb\nuser=suser\n\
                 [svc2]\nsslmode=require\nrequiressl=1\n\
                 [svc3]\nhost = 127.0.0.2\n\
                 [svc4]\nhost={d}/s1,{d}/s2/\nport=1,0\nconnect_timeout=\n\
                 [svc5]\nsslmode=verify-ca\nsslrootcert={d}/root.crt\npassword=from-svc\n\
                 [svc6]\nhostaddr=127.0.0.1\n"
            ),
            0o644,
        );
        write(
            "sysconf/pg_service.conf",
            "[sys]\nhost=localhost\nport=65535\napplication_name=sysapp\n",
            0o644,
        );
        write("root.crt", "", 0o644);
        write("client.crt", "", 0o644);
        write("client.key", "", 0o600);
        write("open.key", "", 0o644);
        let home = Account::current(&SystemFiles)
            .and_then(|account| account.home)
            .unwrap_or_else(|| PathBuf::from("/nonexistent"));
        World { dir, home }
    }

    fn remove(&self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }

    fn path(&self, name: &str) -> String {
        self.dir.join(name).to_string_lossy().into_owned()
    }

    /// The case's variables over a baseline that keeps both sides off this
    /// machine's own files and servers: a host (so libpq's default socket,
    /// where a server may listen, is never tried), a password file and a
    /// system service directory of ours.
    fn environment(&self, case: &Case) -> Vec<(&'static str, String)> {
        let mut env = case.env.clone();
        for (name, value) in [
            ("PGHOST", self.path("s1")),
            ("PGPASSFILE", self.path("absent-pgpass")),
            ("PGSYSCONFDIR", self.path("sysconf")),
        ] {
            if !env.iter().any(|(key, _)| *key == name) {
                env.push((name, value));
            }
        }
        env
    }

    /// Whether libpq could be handed the case without looking up a name
    /// or reaching a socket outside our directory: every host the string
    /// names (as libpq parses it) is a loopback address, localhost, or a
    /// path under our directory. Variables and service files come from the
    /// grammar, which only names such hosts.
    fn safe(&self, case: &Case) -> bool {
        let Some(url) = &case.url else { return true };
        let text = CString::new(url.as_str()).expect("no NUL in a case");
        let mut error = ptr::null_mut();
        // SAFETY: a NUL-terminated string; the result is freed below.
        let options = unsafe { pq_sys::PQconninfoParse(text.as_ptr(), &mut error) };
        if options.is_null() {
            // SAFETY: libpq's own message, freed with PQfreemem.
            unsafe { pq_sys::PQfreemem(error.cast()) };
            // A string libpq cannot parse is refused before any host is
            // tried, unless psql would take it as a database name.
            return true;
        }
        let host = read_options(options).remove("host").flatten();
        // SAFETY: from PQconninfoParse, freed once.
        unsafe { pq_sys::PQconninfoFree(options) };
        let prefix = self.dir.to_string_lossy().into_owned();
        host.is_none_or(|list| {
            list.split(',').all(|host| {
                host.parse::<std::net::IpAddr>()
                    .is_ok_and(|address| address.is_loopback())
                    || host == "localhost"
                    || (host.starts_with(&prefix) && !host.contains(".."))
            })
        })
    }

    /// libpq's reading: one PQconnectStartParams for the whole case, then
    /// one per host for its password and port (PQpass and PQport speak of
    /// the host being tried), and one reading connect_timeout.
    fn libpq(&self, case: &Case) -> Outcome {
        clear_variables();
        for (name, value) in self.environment(case) {
            // SAFETY: as above.
            unsafe { std::env::set_var(name, value) };
        }
        let url = case.url.clone().unwrap_or_default();
        let whole = start(&[("dbname", &url)]);
        if whole.refused() {
            return Outcome::Error(whole.message);
        }
        let whole = whole.options;
        let get = |key: &str| whole.get(key).cloned().flatten();
        let hosts = get("host").unwrap_or_default();
        let hosts: Vec<&str> = hosts.split(',').collect();
        let ports = get("port").unwrap_or_default();
        let ports: Vec<&str> = ports.split(',').collect();
        let mut targets = Vec::new();
        for (index, host) in hosts.iter().enumerate() {
            let port = if ports.len() == 1 {
                ports[0]
            } else {
                ports[index]
            };
            let port = if port.is_empty() { "5432" } else { port };
            let one = start(&[("dbname", &url), ("host", host), ("port", port)]);
            if one.refused() {
                return Outcome::Error(one.message);
            }
            if !one.skipped() {
                targets.push((host.to_string(), normal_port(port), one.password));
            }
        }
        if targets.is_empty() {
            return Outcome::Error("every host's port is out of range".into());
        }
        if let Some(timeout) = get("connect_timeout")
            && !is_libpq_integer(&timeout)
        {
            return Outcome::Error(format!(
                "invalid integer value {timeout:?} for connect_timeout"
            ));
        }
        let sslmode = get("sslmode").unwrap_or_else(|| "prefer".into());
        let tcp = targets.iter().any(|(host, _, _)| !host.starts_with('/'));
        let tls = (tcp && sslmode != "disable").then(|| self.expected_tls(&whole, &sslmode));
        let nonempty = |key: &str| get(key).filter(|value| !value.is_empty());
        Outcome::Resolved(Box::new(View {
            targets,
            user: get("user").unwrap_or_default(),
            dbname: get("dbname").unwrap_or_default(),
            sslrootcert: get("sslrootcert"),
            target_session_attrs: get("target_session_attrs").unwrap_or_else(|| "any".into()),
            application_name: nonempty("application_name")
                .or_else(|| nonempty("fallback_application_name"))
                .unwrap_or_else(|| conninfo::DEFAULT_APPLICATION_NAME.into()),
            options: get("options").unwrap_or_default(),
            sslmode,
            tls,
        }))
    }

    /// The files libpq's `initialize_SSL` would use, given its option
    /// values: the root file (sslrootcert, else ~/.postgresql/root.crt) if
    /// it exists, the client certificate (sslcert, else
    /// ~/.postgresql/postgresql.crt) and its key if the certificate exists.
    fn expected_tls(&self, options: &BTreeMap<String, Option<String>>, sslmode: &str) -> Tls {
        let file = |key: &str, default: &str| {
            options
                .get(key)
                .cloned()
                .flatten()
                .filter(|value| !value.is_empty())
                .unwrap_or_else(|| {
                    self.home
                        .join(".postgresql")
                        .join(default)
                        .to_string_lossy()
                        .into_owned()
                })
        };
        let root = file("sslrootcert", "root.crt");
        let cert = file("sslcert", "postgresql.crt");
        Tls {
            root: Path::new(&root)
                .exists()
                .then(|| (root, sslmode == "verify-full")),
            client: Path::new(&cert)
                .exists()
                .then(|| (cert, file("sslkey", "postgresql.key"))),
        }
    }
}

/// The port as a number's usual spelling (libpq keeps the text; its
/// integer reading allows white space and a sign).
fn normal_port(port: &str) -> String {
    port.trim()
        .trim_start_matches('+')
        .parse::<u16>()
        .map_or(port.to_string(), |number| number.to_string())
}

fn clear_variables() {
    for name in VARIABLES {
        // SAFETY: this process has one thread (see the file's doc).
        unsafe { std::env::remove_var(name) };
    }
}

/// What one PQconnectStartParams said.
struct Started {
    /// CONNECTION_BAD: the settings were refused, or every attempt failed.
    bad: bool,
    message: String,
    /// The merged options (PQconninfo).
    options: BTreeMap<String, Option<String>>,
    /// PQpass: the password of the host being tried.
    password: String,
}

impl Started {
    /// libpq refused the settings, rather than failing to connect: a
    /// message with no mark of an attempt (connectOptions' checks come
    /// before any), or a port that is not an integer (which ends the
    /// attempts).
    fn refused(&self) -> bool {
        let attempted = [
            "connection to server",
            "keepalives parameter",
            "invalid port number",
        ]
        .iter()
        .any(|mark| self.message.contains(mark));
        self.bad && (!attempted || self.message.contains("for connection option \"port\""))
    }

    /// The only host's port is outside 1-65535: libpq skips the host.
    fn skipped(&self) -> bool {
        self.bad && self.message.contains("invalid port number")
    }
}

/// PQconnectStartParams with `keepalives=x` (see the file's doc: no TCP
/// connect is ever attempted) and `dbname` expanded as psql does.
fn start(params: &[(&str, &str)]) -> Started {
    let owned: Vec<(CString, CString)> = params
        .iter()
        .chain([("keepalives", "x")].iter())
        .map(|(key, value)| {
            (
                CString::new(*key).expect("no NUL"),
                CString::new(*value).expect("no NUL"),
            )
        })
        .collect();
    let mut keys: Vec<*const std::os::raw::c_char> =
        owned.iter().map(|(key, _)| key.as_ptr()).collect();
    let mut values: Vec<*const std::os::raw::c_char> =
        owned.iter().map(|(_, value)| value.as_ptr()).collect();
    keys.push(ptr::null());
    values.push(ptr::null());
    // SAFETY: NULL-terminated arrays of NUL-terminated strings that outlive
    // the call; the connection is read, then finished once.
    unsafe {
        let conn = pq_sys::PQconnectStartParams(keys.as_ptr(), values.as_ptr(), 1);
        assert!(!conn.is_null(), "libpq is out of memory");
        let list = pq_sys::PQconninfo(conn);
        let started = Started {
            bad: pq_sys::PQstatus(conn) == pq_sys::ConnStatusType::CONNECTION_BAD,
            message: text(pq_sys::PQerrorMessage(conn)).unwrap_or_default(),
            options: if list.is_null() {
                BTreeMap::new()
            } else {
                read_options(list)
            },
            password: text(pq_sys::PQpass(conn)).unwrap_or_default(),
        };
        if !list.is_null() {
            pq_sys::PQconninfoFree(list);
        }
        pq_sys::PQfinish(conn);
        started
    }
}

/// Whether libpq's integer reading (`parse_int_param`, which psql's
/// connect applies to connect_timeout) takes `value`, asked of libpq
/// itself: as `keepalives_idle`, which it reads with that function on a
/// TCP socket before connecting. `keepalives_interval=x`, read next, fails
/// the address whatever the answer, so nothing is ever connected to.
fn is_libpq_integer(value: &str) -> bool {
    // The case's variables (PGSSLMODE, PGSERVICE...) must not refuse the
    // question before it is asked; the next case sets its own again.
    clear_variables();
    let conninfo = format!(
        "host=127.0.0.1 port=1 keepalives=1 keepalives_idle='{}' keepalives_interval=x",
        value.replace('\\', "\\\\").replace('\'', "\\'")
    );
    let conninfo = CString::new(conninfo).expect("no NUL in a case");
    // SAFETY: a NUL-terminated string; the connection is finished once.
    unsafe {
        let conn = pq_sys::PQconnectStart(conninfo.as_ptr());
        assert!(!conn.is_null(), "libpq is out of memory");
        let message = text(pq_sys::PQerrorMessage(conn)).unwrap_or_default();
        pq_sys::PQfinish(conn);
        assert!(
            message.contains("keepalives_i") || message.contains("TCP_KEEPIDLE"),
            "libpq did not read keepalives_idle: {message}"
        );
        !message.contains("for connection option \"keepalives_idle\"")
    }
}

/// A PQconninfoOption array as keyword → value.
fn read_options(list: *mut pq_sys::PQconninfoOption) -> BTreeMap<String, Option<String>> {
    let mut options = BTreeMap::new();
    let mut at = list;
    // SAFETY: the array ends with a NULL keyword, as libpq documents.
    unsafe {
        while !(*at).keyword.is_null() {
            let key = text((*at).keyword).unwrap_or_default();
            options.insert(key, text((*at).val));
            at = at.add(1);
        }
    }
    options
}

/// A C string from libpq, as text (lossily: libpq passes bytes on).
unsafe fn text(pointer: *const std::os::raw::c_char) -> Option<String> {
    (!pointer.is_null()).then(|| {
        // SAFETY: the caller passes NULL or a NUL-terminated string.
        unsafe { CStr::from_ptr(pointer) }
            .to_string_lossy()
            .into_owned()
    })
}

/// SplitMix64: small, fast, and the same sequence for the same seed on
/// every machine.
struct Random(u64);

impl Random {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    fn chance(&mut self, percent: u64) -> bool {
        self.next() % 100 < percent
    }

    fn pick<'a, T: ?Sized>(&mut self, items: &[&'a T]) -> &'a T {
        items[self.below(items.len())]
    }
}

/// The grammar: a key=value string or a URL (or nothing), with hosts,
/// ports, names, passwords and parameters from small pools that hold the
/// awkward values (quotes, spaces, colons, out-of-range ports, empty
/// values), plus PG variables.
fn generate(random: &mut Random, world: &World) -> Case {
    let sockets = [
        world.path("s1"),
        world.path("s2/"),
        world.path("s 3"),
        world.path("s2"),
    ];
    let socket_refs: Vec<&str> = sockets.iter().map(String::as_str).collect();
    let tcp = ["127.0.0.2", "127.0.0.3", "::1", "localhost"];
    let ports = [
        "1",
        "2",
        "65535",
        "0",
        "-1",
        "65536",
        "99999999999",
        "x",
        "+7",
        " 8 ",
        "05432",
        "",
        " ",
    ];
    let host_count = 1 + random.below(3);
    let hosts: Vec<&str> = (0..host_count)
        .map(|_| {
            if random.chance(50) {
                random.pick(&socket_refs)
            } else {
                random.pick(&tcp)
            }
        })
        .collect();
    let port_count = match random.below(4) {
        0 => 0,
        1 => 1,
        2 => host_count,
        _ => 1 + random.below(3),
    };
    let port_list: Vec<&str> = (0..port_count).map(|_| random.pick(&ports)).collect();
    let mut params: Vec<(&str, String)> = Vec::new();
    let mut maybe = |random: &mut Random, percent: u64, key: &'static str, values: &[&str]| {
        if random.chance(percent) {
            params.push((key, random.pick(values).to_string()));
        }
    };
    maybe(
        random,
        50,
        "user",
        &["u", "app", "o'neil", "sp ace", "ü", ""],
    );
    maybe(random, 50, "dbname", &["d", "my db", "x%y", "", "ü", "sdb"]);
    maybe(random, 25, "password", &["pw", "p:w", "p'w\\", ""]);
    let files: Vec<String> = [
        "root.crt",
        "none.crt",
        "client.crt",
        "client.key",
        "open.key",
        "pgpass",
        "pgpass-open",
        "services.conf",
    ]
    .iter()
    .map(|name| world.path(name))
    .collect();
    let [
        root,
        none,
        cert,
        key,
        open_key,
        pgpass,
        pgpass_open,
        services,
    ] = [0, 1, 2, 3, 4, 5, 6, 7].map(|index| files[index].as_str());
    let modes = [
        "disable",
        "allow",
        "prefer",
        "require",
        "verify-ca",
        "verify-full",
        "bogus",
        "",
    ];
    maybe(random, 40, "sslmode", &modes);
    maybe(random, 25, "sslrootcert", &[root, none, "system", ""]);
    maybe(random, 20, "sslcert", &[cert, none]);
    maybe(random, 20, "sslkey", &[key, open_key, none]);
    maybe(
        random,
        15,
        "connect_timeout",
        &["", "0", "1", "5", " 3 ", "-2", "x", "2s", "+4"],
    );
    maybe(
        random,
        15,
        "target_session_attrs",
        &[
            "any",
            "read-write",
            "primary",
            "standby",
            "prefer-standby",
            "read-only",
            "bogus",
        ],
    );
    maybe(random, 15, "application_name", &["", "app", "my app"]);
    maybe(random, 10, "fallback_application_name", &["fb", ""]);
    maybe(random, 10, "options", &["-c work_mem=8MB", ""]);
    maybe(random, 10, "requiressl", &["0", "1"]);
    maybe(random, 25, "passfile", &[pgpass, pgpass_open, none]);
    maybe(
        random,
        20,
        "service",
        &[
            "svc", "svc2", "svc3", "svc4", "svc5", "svc6", "sys", "missing",
        ],
    );
    maybe(random, 4, "hostaddr", &["127.0.0.1"]);
    maybe(random, 4, "keepalives_idle", &["5"]);
    maybe(random, 3, "frobnicate", &["1"]);
    let url = match random.below(10) {
        0 => None,
        1..=5 => Some(key_values(random, &hosts, &port_list, &params)),
        _ => Some(uri(random, &hosts, &port_list, &params)),
    };
    let mut env: Vec<(&'static str, String)> = Vec::new();
    let mut var = |random: &mut Random, percent: u64, name: &'static str, values: &[&str]| {
        if random.chance(percent) {
            env.push((name, random.pick(values).to_string()));
        }
    };
    let pghosts = [
        socket_refs[0].to_string(),
        "127.0.0.2".into(),
        "127.0.0.2,127.0.0.3".into(),
        format!("{},127.0.0.3", socket_refs[1]),
    ];
    let pghost_refs: Vec<&str> = pghosts.iter().map(String::as_str).collect();
    var(random, 20, "PGHOST", &pghost_refs);
    var(
        random,
        20,
        "PGPORT",
        &["1", "2,1", "0", "x", "65536,2", "7"],
    );
    var(random, 20, "PGUSER", &["envuser", "app"]);
    var(random, 10, "PGPASSWORD", &["envpw"]);
    var(random, 15, "PGDATABASE", &["envdb", "my db"]);
    var(
        random,
        15,
        "PGSSLMODE",
        &["require", "verify-full", "disable", "sometimes"],
    );
    var(random, 15, "PGREQUIRESSL", &["1", "0", "1x"]);
    var(random, 8, "PGSSLROOTCERT", &[root, none]);
    var(random, 8, "PGSSLCERT", &[cert]);
    var(random, 8, "PGSSLKEY", &[key, open_key]);
    var(random, 15, "PGPASSFILE", &[pgpass, pgpass_open]);
    var(
        random,
        10,
        "PGSERVICE",
        &["svc", "svc2", "svc4", "sys", "missing"],
    );
    var(random, 40, "PGSERVICEFILE", &[services]);
    var(
        random,
        8,
        "PGTARGETSESSIONATTRS",
        &["read-write", "writable"],
    );
    var(random, 8, "PGAPPNAME", &["envapp"]);
    var(random, 10, "PGCONNECT_TIMEOUT", &["7", "soon"]);
    Case { url, env }
}

fn key_values(
    random: &mut Random,
    hosts: &[&str],
    ports: &[&str],
    params: &[(&str, String)],
) -> String {
    let mut pairs: Vec<(&str, String)> = vec![("host", hosts.join(","))];
    if !ports.is_empty() {
        pairs.push(("port", ports.join(",")));
    }
    pairs.extend(params.iter().cloned());
    let mut text = String::new();
    for (key, value) in pairs {
        let plain = !value.is_empty() && !value.contains([' ', '\'', '\\']) && random.chance(80);
        let value = if plain {
            value
        } else {
            format!("'{}'", value.replace('\\', "\\\\").replace('\'', "\\'"))
        };
        let equals = if random.chance(15) { " = " } else { "=" };
        let _ = write!(text, "{key}{equals}{value} ");
    }
    text.trim_end().to_string()
}

fn uri(random: &mut Random, hosts: &[&str], ports: &[&str], params: &[(&str, String)]) -> String {
    let scheme = if random.chance(80) {
        "postgresql://"
    } else {
        "postgres://"
    };
    let mut text = String::from(scheme);
    let mut rest: Vec<(&str, String)> = Vec::new();
    let user = params.iter().find(|(key, _)| *key == "user");
    let password = params.iter().find(|(key, _)| *key == "password");
    if let Some((_, user)) = user {
        text.push_str(&encode(user));
        if let Some((_, password)) = password {
            text.push(':');
            text.push_str(&encode(password));
        }
        text.push('@');
    }
    let list: Vec<String> = hosts
        .iter()
        .enumerate()
        .map(|(index, host)| {
            let host = if host.contains(':') {
                format!("[{host}]")
            } else {
                encode(host)
            };
            match ports
                .get(index)
                .or(ports.first().filter(|_| ports.len() == 1))
            {
                Some(port) if !port.is_empty() || random.chance(30) => {
                    format!("{host}:{}", encode(port))
                }
                _ => host,
            }
        })
        .collect();
    text.push_str(&list.join(","));
    if ports.len() > hosts.len() {
        rest.push(("port", ports.join(",")));
    }
    for (key, value) in params {
        match *key {
            "user" => {}
            "password" if user.is_some() => {}
            "dbname" if random.chance(70) => {
                text.push('/');
                text.push_str(&encode(value));
            }
            _ => rest.push((key, value.clone())),
        }
    }
    if random.chance(5) {
        text.push_str("/%ff");
    }
    if !rest.is_empty() || random.chance(10) {
        text.push('?');
        let query: Vec<String> = rest
            .iter()
            .map(|(key, value)| format!("{key}={}", encode(value)))
            .collect();
        text.push_str(&query.join(if random.chance(5) { "&&" } else { "&" }));
        if random.chance(10) {
            text.push('&');
        }
    }
    text
}

/// Percent-encodes all but unreserved characters.
fn encode(text: &str) -> String {
    text.bytes()
        .map(|byte| match byte {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                (byte as char).to_string()
            }
            _ => format!("%{byte:02X}"),
        })
        .collect()
}

/// One to three edits of the string: a character deleted, doubled, or one
/// of the grammar's separators inserted.
fn mutate(random: &mut Random, case: &mut Case) {
    let Some(url) = &mut case.url else { return };
    for _ in 0..1 + random.below(3) {
        let chars: Vec<char> = url.chars().collect();
        if chars.is_empty() {
            return;
        }
        let at = random.below(chars.len());
        let mut edited: Vec<char> = chars.clone();
        match random.below(3) {
            0 => {
                edited.remove(at);
            }
            1 => edited.insert(at, chars[at]),
            _ => {
                let inserted = random.pick(&[
                    "=", "'", "\\", " ", ",", ":", "/", "?", "&", "%", "@", "[", "]", "%2", "\t",
                ]);
                for (offset, c) in inserted.chars().enumerate() {
                    edited.insert(at + offset, c);
                }
            }
        }
        *url = edited.into_iter().collect();
    }
}
