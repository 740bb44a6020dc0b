//! Connecting to PostgreSQL as libpq does (docs/src/connecting.md):
//! sslmode against a server of the test's own (TLS only over TCP, with a
//! certificate the test issues for localhost, a trusted socket), so that
//! nothing hangs on the machine's own certificate or pg_hba.conf; the TLS
//! and login refusals a test-owned fake
//! server scripts (checked against psql where libpq has a word to say),
//! the password and service files, host and port lists, and
//! target_session_attrs over a private primary and standby. Every refusal
//! is one line naming the host, never a password.

use std::os::unix::fs::PermissionsExt;
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use crate::common::certs::{ClientAuth, TestCa};
use crate::common::fake_postgres::{FakePostgres, Login, Outcome, Received, Script, Tls};
use crate::common::private_postgres::PrivatePostgres;
use crate::common::proxy::Proxy;
use crate::common::scratch::{Scratch, free_port};
use crate::common::{
    Fixture, Run, amqp_addr, amqp_url_via, assert_a_signal_ends_a_hung_connect,
    assert_one_clear_line, assert_untouched, signal, wait_until,
};
use postgres::{Client, NoTls};

/// Generous bound for "it did not hang".
const NO_HANG: Duration = Duration::from_secs(15);

/// The run with the variables given and no DATABASE_URL: libpq's variables
/// and files alone say where to connect.
fn run_without_url(fx: &Fixture, env: &[(&str, &str)], args: &[&str]) -> Run {
    let mut command = fx.command();
    command.env_remove("DATABASE_URL").envs(env.iter().copied());
    Run::from(command.args(args).output().expect("running outbox-poll"))
}

/// The application_name the server sees for a run's session, read while the
/// run holds its claim (a stalled broker keeps it waiting), before SIGTERM
/// ends it.
fn application_name_of_a_held_run(fx: &mut Fixture, env: &[(&str, &str)]) -> String {
    let held_before = fx.rows().len();
    fx.insert(&format!("held{held_before}"), 1);
    let broker = Proxy::start(amqp_addr());
    broker.stall();
    let child = fx
        .command()
        .env("AMQP_URL", amqp_url_via(broker.port()))
        .envs(env.iter().copied())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("starting outbox-poll");
    let sql = format!(
        "SELECT a.application_name FROM pg_locks l JOIN pg_stat_activity a USING (pid) \
         WHERE l.relation = '{}'::regclass",
        fx.quoted_table()
    );
    let mut seen = None;
    let held = wait_until(NO_HANG, || {
        seen = fx
            .db
            .query(&sql, &[])
            .unwrap()
            .first()
            .map(|row| row.get(0));
        seen.is_some()
    });
    signal(&child, "-TERM");
    let run = Run::from(child.wait_with_output().unwrap());
    assert!(held, "the run never held its claim: {}", run.stderr);
    assert_eq!(run.code, 143, "{}", run.stderr);
    seen.unwrap()
}

/// A server of the test's own that admits TCP sessions over TLS only
/// (with a certificate for localhost from its CA) and trusts its socket,
/// its outbox migrated: a poll that exits 0 there over TCP used TLS.
struct TlsOnly {
    ca: TestCa,
    server: PrivatePostgres,
}

impl TlsOnly {
    fn start(fx: &Fixture) -> TlsOnly {
        let ca = TestCa::new(&["localhost"]);
        let server = PrivatePostgres::tls_only(&ca);
        let tls_only = TlsOnly { ca, server };
        let run = tls_only.poll(fx, &tls_only.socket(""), &["migrate"]);
        assert_eq!(run.code, 0, "migrate: {}", run.stderr);
        tls_only
    }

    /// A URL to localhost over TCP, with `query`; `{root}` in it is the CA's
    /// certificate.
    fn tcp(&self, host: &str, query: &str) -> String {
        let query = query.replace("{root}", &self.ca.ca_cert().display().to_string());
        format!(
            "postgresql://postgres@{host}:{}/postgres?{query}",
            self.server.primary_port()
        )
    }

    /// A key=value string for the server's socket, with `more`.
    fn socket(&self, more: &str) -> String {
        format!(
            "host={} port={} user=postgres dbname=postgres {more}",
            self.server.socket_dir().display(),
            self.server.primary_port()
        )
    }

    fn poll(&self, fx: &Fixture, url: &str, args: &[&str]) -> Run {
        let mut args = args.to_vec();
        args.extend(["--table", "public.outbox"]);
        fx.run_with(&[("DATABASE_URL", url)], &args)
    }
}

#[test]
fn the_default_sslmode_prefer_uses_tls_and_disable_does_not() {
    let fx = Fixture::new("pg_prefer");
    let server = TlsOnly::start(&fx);
    let prefer = server.poll(&fx, &server.tcp("127.0.0.1", ""), &[]);
    assert_eq!(prefer.code, 0, "{}", prefer.stderr);
    // The server admits no plain session over TCP.
    let disable = server.poll(&fx, &server.tcp("127.0.0.1", "sslmode=disable"), &[]);
    assert_eq!(disable.code, 78, "{}", disable.stderr);
    assert_one_clear_line(&disable);
}

#[test]
fn sslmode_require_and_verify_ca_with_the_servers_own_root_use_tls() {
    let fx = Fixture::new("pg_require");
    let server = TlsOnly::start(&fx);
    for query in ["sslmode=require", "sslmode=verify-ca&sslrootcert={root}"] {
        let run = server.poll(&fx, &server.tcp("127.0.0.1", query), &[]);
        assert_eq!(run.code, 0, "{query}: {}", run.stderr);
    }
}

#[test]
fn verify_full_accepts_the_name_on_the_certificate_and_refuses_another_with_78() {
    let fx = Fixture::new("pg_verify_full");
    let server = TlsOnly::start(&fx);
    let query = "sslmode=verify-full&sslrootcert={root}";
    let by_name = server.poll(&fx, &server.tcp("localhost", query), &[]);
    assert_eq!(by_name.code, 0, "{}", by_name.stderr);
    let by_address = server.poll(&fx, &server.tcp("127.0.0.1", query), &[]);
    assert_eq!(by_address.code, 78, "{}", by_address.stderr);
    assert_one_clear_line(&by_address);
    for said in [
        format!("127.0.0.1:{}", server.server.primary_port()),
        "not valid for name \"127.0.0.1\"".to_owned(),
        "sslrootcert".to_owned(),
    ] {
        assert!(
            by_address.stderr.contains(&said),
            "{said:?} in {}",
            by_address.stderr
        );
    }
}

#[test]
fn sslmode_require_over_the_local_socket_connects_without_tls_as_libpq_does() {
    let fx = Fixture::new("pg_socket");
    let server = TlsOnly::start(&fx);
    let run = server.poll(&fx, &server.socket("sslmode=require"), &[]);
    assert_eq!(run.code, 0, "{}", run.stderr);
}

#[test]
fn sslmode_verify_full_over_the_local_socket_needs_no_root_file_as_libpq() {
    let fx = Fixture::new("pg_socket_verify");
    let server = TlsOnly::start(&fx);
    let url = server.socket("sslmode=verify-full sslrootcert=/nonexistent/root.crt");
    let run = server.poll(&fx, &url, &[]);
    assert_eq!(run.code, 0, "{}", run.stderr);
}

#[test]
fn application_name_is_outbox_poll_unless_pgappname_says_otherwise() {
    let mut fx = Fixture::new("pg_appname");
    let default = application_name_of_a_held_run(&mut fx, &[]);
    let named = application_name_of_a_held_run(&mut fx, &[("PGAPPNAME", "billing-relay")]);
    assert_eq!(
        (default.as_str(), named.as_str()),
        ("outbox-poll", "billing-relay")
    );
}

/// psql against the fake server (user relay, database shop), never
/// prompting for a password.
fn psql(port: u16, conninfo: &str, env: &[(&str, &str)]) -> Output {
    Command::new("psql")
        .arg("-w")
        .arg(format!(
            "host=127.0.0.1 port={port} user=relay dbname=shop {conninfo}"
        ))
        .args(["-c", "select 1"])
        .env_remove("PGSERVICE")
        .envs(env.iter().copied())
        .output()
        .expect("running psql")
}

/// outbox-poll against the fake server, with the same settings.
fn against_fake(fx: &Fixture, port: u16, query: &str, env: &[(&str, &str)]) -> Run {
    let url = format!("postgresql://relay@127.0.0.1:{port}/shop?{query}");
    let mut env = env.to_vec();
    env.push(("DATABASE_URL", &url));
    fx.run_with(&env, &["status"])
}

/// The fake server let the run in: its first statement got the fake's
/// answer, not a connect error.
fn assert_logged_in(run: &Run, received: &Received) {
    assert!(
        run.stderr.contains("the fake server runs no queries"),
        "{}",
        run.stderr
    );
    assert_eq!(received.startups.len(), 1, "{received:?}");
}

#[test]
fn sslmode_require_against_a_server_without_tls_exits_78_where_psql_refuses_too() {
    let fx = Fixture::new("pg_tls_refused");
    let server = FakePostgres::start(Script::default());
    let psql = psql(server.port(), "sslmode=require", &[]);
    let psql_said = String::from_utf8_lossy(&psql.stderr).into_owned();
    assert!(psql_said.contains("SSL was required"), "{psql_said}");
    let run = against_fake(&fx, server.port(), "sslmode=require", &[]);
    assert_eq!(run.code, 78, "{}", run.stderr);
    assert_one_clear_line(&run);
    let host = format!("127.0.0.1:{}", server.port());
    assert!(run.stderr.contains(&host), "{}", run.stderr);
    assert!(run.stderr.contains("does not offer TLS"), "{}", run.stderr);
    assert!(server.received().startups.is_empty(), "never logged in");
}

#[test]
fn sslmode_prefer_logs_in_in_plain_when_the_server_refuses_tls() {
    let fx = Fixture::new("pg_prefer_plain");
    let server = FakePostgres::start(Script::default());
    let run = against_fake(&fx, server.port(), "sslmode=prefer", &[]);
    let received = server.received();
    assert_logged_in(&run, &received);
    assert_eq!((received.ssl_requests, received.tls_startups), (1, 0));
}

#[test]
fn sslmode_prefer_retries_in_plain_after_a_failed_handshake_as_psql_does() {
    let fx = Fixture::new("pg_prefer_retry");
    let (theirs, ours) = (TestCa::new(&["localhost"]), TestCa::new(&["localhost"]));
    let start = || {
        FakePostgres::start(Script {
            tls: Tls::Accept(theirs.server_config(ClientAuth::None)),
            ..Script::default()
        })
    };
    let (for_psql, for_us) = (start(), start());
    // A root file makes prefer check the chain (libpq's rule), and the
    // server's certificate is not of that CA: the handshake fails.
    let root = format!("sslrootcert={}", ours.ca_cert().display());
    psql(for_psql.port(), &format!("sslmode=prefer {root}"), &[]);
    let run = against_fake(&fx, for_us.port(), &format!("sslmode=prefer&{root}"), &[]);
    assert_logged_in(&run, &for_us.received());
    let shape = |received: Received| {
        let Received {
            connections,
            ssl_requests,
            tls_startups,
            startups,
            ..
        } = received;
        (connections, ssl_requests, tls_startups, startups.len())
    };
    assert_eq!(
        shape(for_us.received()),
        (2, 1, 0, 1),
        "TLS failed, then plain"
    );
    assert_eq!(shape(for_psql.received()), shape(for_us.received()));
}

#[test]
fn sslmode_allow_logs_in_in_plain_without_asking_for_tls() {
    let fx = Fixture::new("pg_allow");
    let ca = TestCa::new(&["localhost"]);
    let server = FakePostgres::start(Script {
        tls: Tls::Accept(ca.server_config(ClientAuth::None)),
        ..Script::default()
    });
    let run = against_fake(&fx, server.port(), "sslmode=allow", &[]);
    let received = server.received();
    assert_logged_in(&run, &received);
    assert_eq!((received.ssl_requests, received.tls_startups), (0, 0));
}

#[test]
fn a_client_certificate_is_presented_from_sslcert_and_sslkey() {
    let fx = Fixture::new("pg_client_cert");
    let ca = TestCa::new(&["localhost"]);
    let server = FakePostgres::start(Script {
        tls: Tls::Accept(ca.server_config(ClientAuth::Required)),
        ..Script::default()
    });
    let url = |client: &str| {
        format!(
            "postgresql://relay@localhost:{}/shop?sslmode=verify-full&sslrootcert={}{client}",
            server.port(),
            ca.ca_cert().display()
        )
    };
    let without = fx.run_with(&[("DATABASE_URL", &url(""))], &["status"]);
    assert_eq!(without.code, 78, "{}", without.stderr);
    assert!(
        without.stderr.contains("refused the TLS session"),
        "{}",
        without.stderr
    );
    let client = format!(
        "&sslcert={}&sslkey={}",
        ca.client_cert().display(),
        ca.client_key().display()
    );
    let with = fx.run_with(&[("DATABASE_URL", &url(&client))], &["status"]);
    let received = server.received();
    assert_logged_in(&with, &received);
    assert_eq!(received.tls_startups, 1);
}

/// A fake server that asks for a cleartext password and lets the client
/// in: it records the password it was given.
fn asking_for_a_password() -> FakePostgres {
    FakePostgres::start(Script {
        login: Login::CleartextPassword,
        ..Script::default()
    })
}

/// A password file in `dir` with lines for other servers around the one
/// for the fake server's host and port, with the mode given.
fn password_file(dir: &Scratch, port: u16, mode: u32) -> String {
    let text = format!(
        "# host:port:database:user:password\n\
         127.0.0.2:{port}:shop:relay:wrong-host\n\
         127.0.0.1:{}:shop:relay:wrong-port\n\
         127.0.0.1:{port}:shop:relay:the-right-one\n\
         *:*:*:*:the-catch-all\n",
        port + 1
    );
    let file = dir.write("pgpass", &text);
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(mode)).unwrap();
    file.display().to_string()
}

#[test]
fn the_password_file_gives_the_line_of_that_host_and_port_as_psql_does() {
    let fx = Fixture::new("pg_pgpass");
    let dir = Scratch::new("pgpass");
    let server = asking_for_a_password();
    let file = password_file(&dir, server.port(), 0o600);
    let env = [("PGPASSFILE", file.as_str())];
    // psql logs in, then gets the fake's error for its query.
    psql(server.port(), "sslmode=disable", &env);
    let run = against_fake(&fx, server.port(), "sslmode=disable", &env);
    let received = server.received();
    assert!(
        run.stderr.contains("the fake server runs no queries"),
        "{}",
        run.stderr
    );
    assert_eq!(received.passwords, ["the-right-one", "the-right-one"]);
}

#[test]
fn a_password_file_others_can_read_is_ignored_with_a_warning() {
    let fx = Fixture::new("pg_pgpass_0644");
    let dir = Scratch::new("pgpass");
    let server = asking_for_a_password();
    let file = password_file(&dir, server.port(), 0o644);
    let run = against_fake(
        &fx,
        server.port(),
        "sslmode=disable",
        &[("PGPASSFILE", &file)],
    );
    assert_eq!(run.code, 78, "{}", run.stderr);
    let warning = format!("password file {file} has group or world access; ignored");
    assert!(run.stderr.contains(&warning), "{}", run.stderr);
    assert!(run.stderr.contains("asks for a password"), "{}", run.stderr);
    assert!(server.received().passwords.is_empty());
}

#[test]
fn a_refused_login_names_the_host_that_refused_and_ends_the_list() {
    let fx = Fixture::new("pg_refused");
    let refusing = FakePostgres::start(Script {
        login: Login::CleartextPassword,
        outcome: Outcome::Fail {
            sqlstate: "28P01".into(),
            message: "password authentication failed for user \"relay\"".into(),
        },
        ..Script::default()
    });
    let dead = free_port();
    // The shared server comes third: a wrong password ends the list, as in
    // libpq, so it is never tried (it would let the run in).
    let url = format!(
        "postgresql://relay:s3cret-pw@127.0.0.1:{dead},127.0.0.1:{},127.0.0.1:5432/shop?sslmode=disable",
        refusing.port()
    );
    let run = fx.run_with(&[("DATABASE_URL", &url)], &[]);
    assert_eq!(run.code, 78, "{}", run.stderr);
    assert_one_clear_line(&run);
    let refuser = format!(
        "PostgreSQL at 127.0.0.1:{} refused the login",
        refusing.port()
    );
    assert!(run.stderr.contains(&refuser), "{}", run.stderr);
    assert!(!run.stderr.contains("s3cret-pw"), "{}", run.stderr);
    assert_eq!(refusing.received().passwords, ["s3cret-pw"]);
}

#[test]
fn a_server_not_accepting_connections_yet_gives_way_to_the_next_host() {
    let mut fx = Fixture::new("pg_57p03");
    fx.insert("e", 2);
    let starting = FakePostgres::start(Script {
        outcome: Outcome::Fail {
            sqlstate: "57P03".into(),
            message: "the database system is starting up".into(),
        },
        ..Script::default()
    });
    let url = format!(
        "postgresql://postgres@127.0.0.1:{},127.0.0.1:5432/test",
        starting.port()
    );
    let run = fx.run_with(&[("DATABASE_URL", &url), ("PGSSLMODE", "disable")], &[]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert_eq!(starting.received().startups.len(), 1);
    assert_eq!(fx.published_count(), 2);
}

#[test]
fn a_host_whose_port_is_out_of_range_is_skipped_with_a_warning_as_libpq_does() {
    let mut fx = Fixture::new("pg_port_range");
    fx.insert("e", 1);
    let url = "host=127.0.0.1,127.0.0.1 port=0,5432 user=postgres dbname=test sslmode=disable";
    let run = fx.run_with(&[("DATABASE_URL", url)], &[]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    let warning = "gives 127.0.0.1 the port \"0\", which is not a port number (1-65535): \
                   that host is skipped";
    assert!(run.stderr.contains(warning), "{}", run.stderr);
    assert_eq!(fx.published_count(), 1);
}

#[test]
fn pgservice_reads_the_service_file() {
    let mut fx = Fixture::new("pg_service");
    fx.insert("e", 1);
    let dir = Scratch::new("service");
    let file = dir.write(
        "pg_service.conf",
        "[elsewhere]\nhost=127.0.0.2\n\n[outbox]\n# the shared server\nhost=127.0.0.1\n\
         port=5432\nuser=postgres\ndbname=test\n",
    );
    let file = file.display().to_string();
    let env = [("PGSERVICEFILE", file.as_str()), ("PGSERVICE", "outbox")];
    let run = run_without_url(&fx, &env, &[]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert_eq!(fx.published_count(), 1);
}

#[test]
fn sigterm_while_the_database_does_not_answer_the_connect_exits_143_at_once() {
    let mut fx = Fixture::new("pg_hung_sigterm");
    fx.insert("e", 1);
    assert_a_signal_ends_a_hung_connect(
        &fx,
        "DATABASE_URL",
        |port| format!("postgresql://postgres@127.0.0.1:{port}/test"),
        (
            "-TERM",
            143,
            "stopped by SIGTERM while connecting to PostgreSQL",
        ),
    );
    let rows = fx.rows();
    assert!(rows.iter().all(|row| !row.published), "{rows:?}");
    assert_untouched(&rows);
}

/// A private primary and standby with the fixture's table (made on the
/// primary, replayed on the standby) and `events` events in it; a client
/// of the primary.
fn pair_with_table(fx: &Fixture, events: i64) -> (PrivatePostgres, Client) {
    let pair = PrivatePostgres::primary_and_standby();
    let mut primary = Client::connect(&pair.url(pair.primary_port()), NoTls).unwrap();
    primary
        .batch_execute(&format!("CREATE SCHEMA \"{}\"", fx.schema))
        .unwrap();
    let migrate = fx.run_with(
        &[("DATABASE_URL", &pair.url(pair.primary_port()))],
        &["migrate"],
    );
    assert_eq!(migrate.code, 0, "{}", migrate.stderr);
    primary
        .execute(
            &format!(
                "INSERT INTO {} (event_id, event_type, payload) \
                 SELECT 'e-' || g, 'order.created', '{{}}' FROM generate_series(1, $1::bigint) g",
                fx.quoted_table()
            ),
            &[&events],
        )
        .unwrap();
    let mut standby = Client::connect(&pair.url(pair.standby_port()), NoTls).unwrap();
    let replayed = format!("SELECT count(*) FROM {}", fx.quoted_table());
    assert!(
        wait_until(NO_HANG, || standby
            .query_one(&replayed, &[])
            .is_ok_and(|row| row.get::<_, i64>(0) == events)),
        "the standby never replayed the table"
    );
    (pair, primary)
}

fn published_on(client: &mut Client, fx: &Fixture) -> i64 {
    let sql = format!(
        "SELECT count(*) FROM {} WHERE published_at IS NOT NULL",
        fx.quoted_table()
    );
    client.query_one(&sql, &[]).unwrap().get(0)
}

#[test]
fn target_session_attrs_read_write_over_a_standby_and_a_primary_picks_the_primary() {
    let fx = Fixture::bare("pg_read_write");
    let (pair, mut primary) = pair_with_table(&fx, 2);
    let (standby, primary_port) = (pair.standby_port(), pair.primary_port());
    let url = format!(
        "postgresql://postgres@127.0.0.1:{standby},127.0.0.1:{primary_port}/postgres\
         ?target_session_attrs=read-write"
    );
    let run = fx.run_with(&[("DATABASE_URL", &url)], &["--batch-size", "1"]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    // The same list from libpq's variables: PGPORT as a list.
    let ports = format!("{standby},{primary_port}");
    let env = [
        ("PGHOST", "127.0.0.1,127.0.0.1"),
        ("PGPORT", ports.as_str()),
        ("PGUSER", "postgres"),
        ("PGDATABASE", "postgres"),
        ("PGTARGETSESSIONATTRS", "read-write"),
    ];
    let run = run_without_url(&fx, &env, &["--batch-size", "1"]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert_eq!(published_on(&mut primary, &fx), 2);
}

#[test]
fn a_run_pointed_only_at_a_standby_exits_69_saying_standby() {
    let fx = Fixture::bare("pg_standby_only");
    let (pair, mut primary) = pair_with_table(&fx, 1);
    let standby = pair.url(pair.standby_port());
    let picky = format!("{standby}?target_session_attrs=read-write");
    for (url, said) in [
        (picky.as_str(), "is a read-only standby"),
        // target_session_attrs=any: the claim itself is refused (25006).
        (standby.as_str(), "target_session_attrs=read-write"),
    ] {
        let run = fx.run_with(&[("DATABASE_URL", url)], &[]);
        assert_eq!(run.code, 69, "{url}: {}", run.stderr);
        assert_one_clear_line(&run);
        assert!(run.stderr.contains("standby"), "{url}: {}", run.stderr);
        assert!(run.stderr.contains(said), "{url}: {}", run.stderr);
    }
    assert_eq!(published_on(&mut primary, &fx), 0);
}

#[test]
fn during_failover_read_write_waits_for_the_promoted_standby() {
    let fx = Fixture::bare("pg_failover");
    let (pair, _) = pair_with_table(&fx, 1);
    let url = format!(
        "postgresql://postgres@127.0.0.1:{},127.0.0.1:{}/postgres?target_session_attrs=read-write",
        pair.primary_port(),
        pair.standby_port()
    );
    pair.stop_primary();
    let run = fx.run_with(&[("DATABASE_URL", &url)], &[]);
    assert_eq!(run.code, 69, "{}", run.stderr);
    assert!(run.stderr.contains("read-only standby"), "{}", run.stderr);
    pair.promote_standby();
    let run = fx.run_with(&[("DATABASE_URL", &url)], &[]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    let mut promoted = Client::connect(&pair.url(pair.standby_port()), NoTls).unwrap();
    assert_eq!(published_on(&mut promoted, &fx), 1);
}
