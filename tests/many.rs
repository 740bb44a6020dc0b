//! Many outboxes in one run: --table lists and patterns over real tenant
//! schemas, a second database (created here) through --databases with a
//! service= line, --shard, fairness between a backlog and small outboxes,
//! isolation of an unreachable database and a broken table, the exit code
//! over the outboxes, and the JSON summary's `outboxes`.

use std::collections::{HashMap, HashSet};
use std::process::Child;
use std::time::Duration;

use postgres::{Client, NoTls};

use crate::common::proxy::Proxy;
use crate::common::scratch::Scratch;
use crate::common::{Fixture, Run, connect_db, database_addr, database_url_in, database_url_via};

/// Tenant schemas beside a fixture's own (`<schema>_<name>`, each with a
/// migrated outbox), dropped with it.
struct Tenants {
    prefix: String,
    /// Each tenant's schema and the database URL it lives in.
    made: Vec<(String, String)>,
}

impl Tenants {
    fn of(fx: &Fixture) -> Tenants {
        let mut prefix = fx.schema.clone();
        prefix.truncate(54);
        Tenants {
            prefix,
            made: Vec::new(),
        }
    }

    /// The pattern that matches every tenant's outbox. It matches any
    /// schema that begins with the prefix, so no test here may be named
    /// another's name followed by `_` (`many_pool` once matched
    /// `many_pool_follow`'s tenants and drained them mid-follow).
    fn pattern(&self) -> String {
        format!("{}_*.outbox", self.prefix)
    }

    /// A tenant's table name.
    fn table(&self, name: &str) -> String {
        format!("{}_{name}.outbox", self.prefix)
    }

    /// Creates tenant `name` in the database of `url`, with `events`
    /// events named `<name>-<n>`.
    fn add(&mut self, fx: &Fixture, url: &str, name: &str, events: i64) {
        let schema = format!("{}_{name}", self.prefix);
        let mut db = Client::connect(url, NoTls).unwrap();
        db.batch_execute(&format!(
            "DROP SCHEMA IF EXISTS \"{schema}\" CASCADE; CREATE SCHEMA \"{schema}\""
        ))
        .unwrap();
        self.made.push((schema.clone(), url.to_string()));
        let table = format!("{schema}.outbox");
        let run = fx.run_with(&[("DATABASE_URL", url)], &["--table", &table, "migrate"]);
        assert_eq!(run.code, 0, "migrate {table}: {}", run.stderr);
        insert(&mut db, &table, name, events);
    }

    /// Creates tenant `name`'s schema in the database of `url`, with no
    /// table in it.
    fn add_schema(&mut self, url: &str, name: &str) {
        let schema = format!("{}_{name}", self.prefix);
        let mut db = Client::connect(url, NoTls).unwrap();
        db.batch_execute(&format!(
            "DROP SCHEMA IF EXISTS \"{schema}\" CASCADE; CREATE SCHEMA \"{schema}\""
        ))
        .unwrap();
        self.made.push((schema, url.to_string()));
    }
}

impl Drop for Tenants {
    fn drop(&mut self) {
        for (schema, url) in &self.made {
            if let Ok(mut db) = Client::connect(url, NoTls) {
                let _ = db.batch_execute(&format!("DROP SCHEMA IF EXISTS \"{schema}\" CASCADE"));
            }
        }
    }
}

fn insert(db: &mut Client, table: &str, name: &str, events: i64) {
    let (schema, _) = table.split_once('.').unwrap();
    db.execute(
        &format!(
            "INSERT INTO \"{schema}\".outbox (event_id, event_type, payload) \
             SELECT $1 || '-' || g, 'order.created', '{{}}' FROM generate_series(1, $2::bigint) g"
        ),
        &[&name, &events],
    )
    .unwrap();
}

/// A database of its own on the shared server, dropped with it.
struct OwnDatabase {
    name: String,
}

impl OwnDatabase {
    fn create(fx: &Fixture, suffix: &str) -> OwnDatabase {
        let mut name = format!("{}_{suffix}", fx.schema);
        name.truncate(63);
        let mut db = connect_db();
        db.batch_execute(&format!("DROP DATABASE IF EXISTS \"{name}\" WITH (FORCE)"))
            .unwrap();
        db.batch_execute(&format!("CREATE DATABASE \"{name}\" TEMPLATE template0"))
            .unwrap();
        OwnDatabase { name }
    }

    fn url(&self) -> String {
        database_url_in(&self.name)
    }
}

impl Drop for OwnDatabase {
    fn drop(&mut self) {
        let _ = connect_db().batch_execute(&format!(
            "DROP DATABASE IF EXISTS \"{}\" WITH (FORCE)",
            self.name
        ));
    }
}

/// How many messages of each tenant (the event id's prefix) arrived.
fn per_tenant(fx: &Fixture) -> HashMap<String, usize> {
    let mut counts = HashMap::new();
    for message in fx.messages() {
        let (tenant, _) = message.message_id.split_once('-').unwrap();
        *counts.entry(tenant.to_string()).or_insert(0) += 1;
    }
    counts
}

/// The summary's `outboxes`, by table: (database, exit_code, published).
fn outboxes(run: &Run) -> HashMap<String, (String, i64, i64)> {
    let summary = run.summary();
    let list = summary["outboxes"]
        .as_array()
        .unwrap_or_else(|| panic!("no outboxes in {}", run.stdout));
    list.iter()
        .map(|outbox| {
            (
                outbox["table"].as_str().unwrap().to_string(),
                (
                    outbox["database"].as_str().unwrap().to_string(),
                    outbox["exit_code"].as_i64().unwrap(),
                    outbox["published"].as_i64().unwrap(),
                ),
            )
        })
        .collect()
}

/// host:port/dbname of the shared test database, as the summary names it.
fn label_of(dbname: &str) -> String {
    let addr = database_addr();
    format!("{}:{}/{dbname}", addr.ip(), addr.port())
}

#[test]
fn a_pattern_serves_every_tenant_schema_and_a_tenant_created_later_is_served_by_the_next_run() {
    let fx = Fixture::bare("many_pattern");
    let mut tenants = Tenants::of(&fx);
    let url = fx.database_url.clone();
    tenants.add(&fx, &url, "a", 3);
    tenants.add(&fx, &url, "b", 2);
    let pattern = tenants.pattern();
    let run = fx.run(&["--table", &pattern, "--json"]);
    assert_eq!((run.code, run.stderr.as_str()), (0, ""), "{}", run.stdout);
    assert_eq!(run.field("published"), 5);
    assert_eq!(
        per_tenant(&fx),
        HashMap::from([("a".into(), 3), ("b".into(), 2)])
    );
    tenants.add(&fx, &url, "c", 4);
    let run = fx.run(&["--table", &pattern, "--json"]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert_eq!(per_tenant(&fx), HashMap::from([("c".into(), 4)]));
    let listed = outboxes(&run);
    assert_eq!(listed.len(), 3, "{}", run.stdout);
    assert_eq!(listed[&tenants.table("c")].2, 4);
    assert_eq!(listed[&tenants.table("a")].2, 0);
}

#[test]
fn a_list_takes_names_and_patterns_and_a_pattern_that_matches_nothing_is_no_error() {
    let fx = Fixture::bare("many_list");
    let mut tenants = Tenants::of(&fx);
    let url = fx.database_url.clone();
    tenants.add(&fx, &url, "a", 1);
    tenants.add(&fx, &url, "b", 1);
    tenants.add(&fx, &url, "c", 1);
    let list = format!(
        "{},{}_nobody*.outbox,{}_[bx].outbox",
        tenants.table("a"),
        tenants.prefix,
        tenants.prefix
    );
    let run = fx.run(&["--table", &list, "--json"]);
    assert_eq!((run.code, run.stderr.as_str()), (0, ""));
    assert_eq!(
        per_tenant(&fx),
        HashMap::from([("a".into(), 1), ("b".into(), 1)])
    );
}

#[test]
fn a_selection_that_matches_no_table_at_all_exits_78_naming_it() {
    let fx = Fixture::bare("many_none");
    let pattern = format!("{}_nobody*.outbox", fx.schema);
    let run = fx.run(&["--table", &pattern, "--json"]);
    assert_eq!(run.code, 78, "{}", run.stderr);
    assert!(run.stderr.contains("matches no table"), "{}", run.stderr);
    assert!(run.stderr.contains(&pattern), "{}", run.stderr);
    assert_eq!(run.field("exit_code"), 78);
}

#[test]
fn a_databases_file_serves_a_second_database_through_a_service_line() {
    let fx = Fixture::bare("many_dbs");
    let second = OwnDatabase::create(&fx, "2nd");
    let mut tenants = Tenants::of(&fx);
    tenants.add(&fx, &fx.database_url.clone(), "a", 2);
    tenants.add(&fx, &second.url(), "b", 3);
    let dir = Scratch::new("many_dbs");
    // The service names only the database: host, port and user come from
    // --database-url, the defaults of every line.
    let services = dir.write(
        "pg_service.conf",
        &format!("[tenants]\ndbname={}\n", second.name),
    );
    let file = dir.write(
        "databases",
        &format!(
            "# the shared database\n{}\n\n   service=tenants\n",
            fx.database_url
        ),
    );
    let (services, file) = (services.display().to_string(), file.display().to_string());
    let run = fx.run_with(
        &[("PGSERVICEFILE", &services)],
        &[
            "--databases",
            &file,
            "--table",
            &tenants.pattern(),
            "--json",
        ],
    );
    assert_eq!((run.code, run.stderr.as_str()), (0, ""), "{}", run.stdout);
    assert_eq!(
        per_tenant(&fx),
        HashMap::from([("a".into(), 2), ("b".into(), 3)])
    );
    let listed = outboxes(&run);
    assert_eq!(listed[&tenants.table("b")].0, label_of(&second.name));
    assert_eq!(listed[&tenants.table("a")].0, label_of("test"));
}

#[test]
fn an_unreachable_database_fails_alone_with_69_while_the_others_publish() {
    let fx = Fixture::bare("many_down");
    let mut tenants = Tenants::of(&fx);
    tenants.add(&fx, &fx.database_url.clone(), "a", 2);
    // A tenant database reached through a proxy that stops answering.
    let proxy = Proxy::start(database_addr());
    proxy.stall();
    let dir = Scratch::new("many_down");
    let file = dir.write(
        "databases",
        &format!("{}\n{}\n", database_url_via(proxy.port()), fx.database_url),
    );
    let file = file.display().to_string();
    let args = [
        "--databases",
        &file,
        "--table",
        &tenants.pattern(),
        "--connect-timeout",
        "1s",
        "--json",
    ];
    let run = fx.run(&args);
    assert_eq!(run.code, 69, "{}", run.stderr);
    assert_eq!(per_tenant(&fx), HashMap::from([("a".into(), 2)]));
    let lines: Vec<&str> = run.stderr.lines().collect();
    assert_eq!(lines.len(), 1, "{}", run.stderr);
    let unreachable = format!("database 127.0.0.1:{}/test", proxy.port());
    assert!(lines[0].starts_with("outbox-poll: error: "), "{}", lines[0]);
    assert!(lines[0].contains(&unreachable), "{}", lines[0]);
    assert_eq!(run.summary()["outboxes"].as_array().unwrap().len(), 2);
}

#[test]
fn a_broken_table_exits_78_naming_its_database_and_table_while_the_others_publish() {
    let mut fx = Fixture::bare("many_broken");
    let mut tenants = Tenants::of(&fx);
    let url = fx.database_url.clone();
    tenants.add(&fx, &url, "a", 2);
    tenants.add(&fx, &url, "b", 2);
    tenants.add(&fx, &url, "c", 2);
    let broken = tenants.table("b");
    fx.execute(&format!(
        "ALTER TABLE \"{}_b\".outbox DROP COLUMN last_error",
        tenants.prefix
    ));
    let run = fx.run(&["--table", &tenants.pattern(), "--json"]);
    assert_eq!(run.code, 78, "{}", run.stderr);
    assert_eq!(
        per_tenant(&fx),
        HashMap::from([("a".into(), 2), ("c".into(), 2)])
    );
    let lines: Vec<&str> = run.stderr.lines().collect();
    assert_eq!(lines.len(), 1, "{}", run.stderr);
    assert!(
        lines[0].contains(&format!("database {}", label_of("test"))),
        "{}",
        lines[0]
    );
    assert!(
        lines[0].contains(&format!("table {broken}")),
        "{}",
        lines[0]
    );
    assert!(lines[0].contains("last_error"), "{}", lines[0]);
    let listed = outboxes(&run);
    assert_eq!(listed[&broken].1, 78);
    assert_eq!(listed[&tenants.table("a")].1, 0);
}

#[test]
fn the_exit_code_is_the_most_urgent_over_the_outboxes_78_then_69_then_1() {
    let mut fx = Fixture::bare("many_exit");
    let mut db = fx.connect();
    let mut tenants = Tenants::of(&fx);
    let url = fx.database_url.clone();
    tenants.add(&fx, &url, "ok", 1);
    // Events no queue takes: they fail (exit 1).
    tenants.add(&fx, &url, "fail", 1);
    let prefix = tenants.prefix.clone();
    fx.execute(&format!(
        "UPDATE \"{prefix}_fail\".outbox SET event_type = 'nowhere'"
    ));
    fx.route_only("order.#");
    tenants.add(&fx, &url, "broken", 1);
    let proxy = Proxy::start(database_addr());
    proxy.stall();
    let dir = Scratch::new("many_exit");
    let write = |name: &str, down: bool| {
        let mut lines = vec![url.clone()];
        if down {
            lines.push(database_url_via(proxy.port()));
        }
        dir.write(name, &(lines.join("\n") + "\n"))
            .display()
            .to_string()
    };
    let (with_down, without) = (write("down", true), write("up", false));
    let run = |file: &str, table: &str| {
        let args = [
            "--databases",
            file,
            "--table",
            table,
            "--connect-timeout",
            "1s",
        ];
        fx.run(&args).code
    };
    let all = tenants.pattern();
    let not_broken = format!("{prefix}_ok.outbox,{prefix}_fail.outbox");
    db.batch_execute(&format!(
        "ALTER TABLE \"{prefix}_broken\".outbox DROP COLUMN last_error"
    ))
    .unwrap();
    assert_eq!(run(&with_down, &all), 78);
    assert_eq!(run(&with_down, &not_broken), 69);
    db.batch_execute(&format!(
        "UPDATE \"{prefix}_fail\".outbox SET available_at = now()"
    ))
    .unwrap();
    assert_eq!(run(&without, &not_broken), 1);
    assert_eq!(
        run(
            &without,
            &format!("{prefix}_ok.outbox,{prefix}_nobody*.outbox")
        ),
        0
    );
}

#[test]
fn shards_split_the_outboxes_so_that_their_union_is_every_outbox_exactly_once() {
    let fx = Fixture::bare("many_shards");
    let mut tenants = Tenants::of(&fx);
    let url = fx.database_url.clone();
    let names: Vec<String> = (0..9).map(|n| format!("s{n}")).collect();
    for name in &names {
        tenants.add(&fx, &url, name, 2);
    }
    // Each tenant's events are published by one shard's run, all of them.
    let mut served: HashMap<String, usize> = HashMap::new();
    let mut sizes = Vec::new();
    for index in 0..3 {
        let shard = format!("{index}/3");
        let run = fx.run_with(
            &[("OUTBOX_SHARD", &shard)],
            &["--table", &tenants.pattern(), "--json"],
        );
        assert_eq!((run.code, run.stderr.as_str()), (0, ""), "shard {shard}");
        let counts = per_tenant(&fx);
        sizes.push(counts.len());
        for (tenant, count) in counts {
            assert_eq!(count, 2, "{tenant} in shard {shard}");
            assert!(
                served.insert(tenant.clone(), index).is_none(),
                "{tenant} twice"
            );
        }
    }
    let every: HashSet<String> = names.iter().cloned().collect();
    assert_eq!(served.keys().cloned().collect::<HashSet<_>>(), every);
    // The hash spreads them: no shard took all nine.
    assert!(sizes.iter().all(|&size| size < 9), "{sizes:?}");
    let run = fx.run(&["--table", &tenants.pattern(), "--shard", "3/3"]);
    assert_eq!(run.code, 2, "{}", run.stderr);
}

#[test]
fn a_backlog_in_one_outbox_delays_the_small_ones_by_one_batch_each_at_most() {
    let fx = Fixture::bare("many_fair");
    let mut tenants = Tenants::of(&fx);
    let url = fx.database_url.clone();
    // "a" sorts first: a run that drained it before the others would spend
    // every batch below on it.
    tenants.add(&fx, &url, "a", 500);
    for small in ["s1", "s2", "s3", "s4", "s5"] {
        tenants.add(&fx, &url, small, 3);
    }
    let args = [
        "--table",
        &tenants.pattern(),
        "--drain",
        "--batch-size",
        "10",
        "--max-batches",
        "7",
        // Two batches in flight at most: with more than the outboxes, every
        // one would be opened at once whatever the order of turns.
        "--max-connections",
        "2",
        "--json",
    ];
    let run = fx.run(&args);
    assert_eq!((run.code, run.stderr.as_str()), (0, ""));
    let counts = per_tenant(&fx);
    for small in ["s1", "s2", "s3", "s4", "s5"] {
        assert_eq!(counts.get(small), Some(&3), "{small}: {counts:?}");
    }
    assert_eq!(counts["a"], 20, "{counts:?}");
}

#[test]
fn an_empty_run_over_many_outboxes_never_connects_to_the_broker() {
    let fx = Fixture::bare("many_empty");
    let mut tenants = Tenants::of(&fx);
    let url = fx.database_url.clone();
    for name in ["a", "b", "c"] {
        tenants.add(&fx, &url, name, 0);
    }
    let broker = Proxy::start(crate::common::amqp_addr());
    let amqp = crate::common::amqp_url_via(broker.port());
    let run = fx.run_with(
        &[("AMQP_URL", &amqp)],
        &["--table", &tenants.pattern(), "--json"],
    );
    assert_eq!((run.code, run.stderr.as_str()), (0, ""));
    assert_eq!(run.field("claimed"), 0);
    assert_eq!(broker.connections(), 0);
}

#[test]
fn one_broker_connection_and_at_most_max_connections_sessions_serve_every_outbox() {
    let fx = Fixture::bare("many_bounds");
    let mut tenants = Tenants::of(&fx);
    let url = fx.database_url.clone();
    for name in ["a", "b", "c", "d"] {
        tenants.add(&fx, &url, name, 30);
    }
    let broker = Proxy::start(crate::common::amqp_addr());
    let db = Proxy::start(database_addr());
    let env = [
        ("AMQP_URL", crate::common::amqp_url_via(broker.port())),
        ("DATABASE_URL", database_url_via(db.port())),
    ];
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let args = [
        "--table",
        &tenants.pattern(),
        "--drain",
        "--batch-size",
        "10",
        "--max-connections",
        "2",
        "--json",
    ];
    let run = fx.run_with(&env, &args);
    assert_eq!((run.code, run.stderr.as_str()), (0, ""));
    assert_eq!(run.field("published"), 120);
    assert_eq!(broker.connections(), 1);
    assert!(db.connections() <= 2, "{} sessions", db.connections());
}

#[test]
fn status_reports_each_outbox_of_the_selection_and_the_totals() {
    let fx = Fixture::bare("many_status");
    let mut tenants = Tenants::of(&fx);
    let url = fx.database_url.clone();
    tenants.add(&fx, &url, "a", 2);
    tenants.add(&fx, &url, "b", 5);
    let run = fx.run(&["--table", &tenants.pattern(), "status", "--json"]);
    assert_eq!((run.code, run.stderr.as_str()), (0, ""));
    let summary = run.summary();
    assert_eq!(summary["pending"], 7);
    let listed = summary["outboxes"].as_array().unwrap();
    let pending: HashMap<&str, i64> = listed
        .iter()
        .map(|o| (o["table"].as_str().unwrap(), o["pending"].as_i64().unwrap()))
        .collect();
    let (a, b) = (tenants.table("a"), tenants.table("b"));
    assert_eq!(pending, HashMap::from([(a.as_str(), 2), (b.as_str(), 5)]));
    assert_eq!(
        listed[0]["database"].as_str(),
        Some(label_of("test").as_str())
    );
}

#[test]
fn the_metrics_file_labels_each_outbox_with_its_database_and_table() {
    let fx = Fixture::bare("many_metrics");
    let mut tenants = Tenants::of(&fx);
    let url = fx.database_url.clone();
    tenants.add(&fx, &url, "a", 2);
    tenants.add(&fx, &url, "b", 1);
    let dir = Scratch::new("many_metrics");
    let path = dir.path().join("outbox.prom");
    let path_text = path.display().to_string();
    let run = fx.run(&["--table", &tenants.pattern(), "--metrics-file", &path_text]);
    assert_eq!((run.code, run.stderr.as_str()), (0, ""));
    let text = std::fs::read_to_string(&path).unwrap();
    let database = label_of("test");
    for (tenant, published) in [("a", 2), ("b", 1)] {
        let line = format!(
            "outbox_poll_last_run_published{{database=\"{database}\",table=\"{}\"}} {published}",
            tenants.table(tenant)
        );
        assert!(text.contains(&line), "{line} not in\n{text}");
    }
    assert_eq!(
        text.matches("# TYPE outbox_poll_last_run_published ")
            .count(),
        1
    );
}

#[test]
fn a_follow_over_two_databases_publishes_events_committed_later_in_a_tenant_of_each() {
    let fx = Fixture::bare("many_follow");
    let second = OwnDatabase::create(&fx, "2nd");
    let mut tenants = Tenants::of(&fx);
    let url = fx.database_url.clone();
    tenants.add(&fx, &url, "a", 1);
    tenants.add(&fx, &second.url(), "b", 0);
    let dir = Scratch::new("many_follow");
    let file = dir.write("databases", &format!("{url}\n{}\n", second.url()));
    let mut child = fx
        .command()
        .args(["--databases", &file.display().to_string()])
        .args(["--table", &tenants.pattern(), "--follow"])
        .args(["--max-duration", "4s", "--json"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // Both tenants quiet, the run looking: then an event in each database.
    let first_done = crate::common::wait_until(Duration::from_secs(3), || {
        per_tenant_count(&url, &tenants, "a") == 1
    });
    let mut a = Client::connect(&url, NoTls).unwrap();
    let mut b = Client::connect(&second.url(), NoTls).unwrap();
    // "a-late-<n>": tenant a's (see per_tenant), not its first events' ids.
    insert(&mut a, &tenants.table("a"), "a-late", 2);
    insert(&mut b, &tenants.table("b"), "b", 2);
    let published = crate::common::wait_until(Duration::from_secs(3), || {
        per_tenant_count(&url, &tenants, "a") == 3
            && per_tenant_count(&second.url(), &tenants, "b") == 2
    });
    let status = child.wait().unwrap();
    let mut stderr = String::new();
    std::io::Read::read_to_string(child.stderr.as_mut().unwrap(), &mut stderr).unwrap();
    assert!(first_done && published, "{stderr}");
    assert_eq!(status.code(), Some(0), "{stderr}");
    assert_eq!(
        per_tenant(&fx),
        HashMap::from([("a".into(), 3), ("b".into(), 2)])
    );
}

/// How many of tenant `name`'s events (in the database of `url`) are
/// published.
fn per_tenant_count(url: &str, tenants: &Tenants, name: &str) -> i64 {
    let mut db = Client::connect(url, NoTls).unwrap();
    let sql = format!(
        "SELECT count(*) FROM \"{}_{name}\".outbox WHERE published_at IS NOT NULL",
        tenants.prefix
    );
    db.query_one(&sql, &[]).unwrap().get(0)
}

/// Two tenants, `a` in the fixture's database and `b` in a second one,
/// each table with the notify trigger (`migrate --notify`) when `notify`.
fn notifying_tenants(fx: &Fixture, second: &OwnDatabase, notify: bool) -> Tenants {
    let mut tenants = Tenants::of(fx);
    for (url, name) in [(fx.database_url.clone(), "a"), (second.url(), "b")] {
        tenants.add(fx, &url, name, 0);
        if notify {
            let table = tenants.table(name);
            let args = ["--table", &table, "migrate", "--notify"];
            let run = fx.run_with(&[("DATABASE_URL", &url)], &args);
            assert_eq!(run.code, 0, "migrate --notify {table}: {}", run.stderr);
        }
    }
    tenants
}

/// A follow over both tenants' databases for `seconds`, tracing the
/// relay's decisions on stderr.
fn follow_both(fx: &Fixture, second: &OwnDatabase, tenants: &Tenants, dir: &Scratch) -> Child {
    let file = dir.write(
        "databases",
        &format!("{}\n{}\n", fx.database_url, second.url()),
    );
    fx.command()
        .env("RUST_LOG", "outbox_poll::relay=trace")
        .args(["--databases", &file.display().to_string()])
        .args(["--table", &tenants.pattern(), "--follow"])
        .args(["--max-duration", "60s", "--json"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap()
}

/// Ends a follow with SIGTERM; its stderr.
fn end_follow(mut child: Child) -> String {
    let pid = child.id().to_string();
    let killed = std::process::Command::new("kill")
        .args(["-TERM", &pid])
        .status();
    assert!(killed.unwrap().success());
    let status = child.wait().unwrap();
    let mut stderr = String::new();
    std::io::Read::read_to_string(child.stderr.as_mut().unwrap(), &mut stderr).unwrap();
    assert_eq!(status.code(), Some(143), "{stderr}");
    stderr
}

/// Commits one event at a time in each tenant, 300 ms apart, and waits
/// until each tenant's `count` are published: a look (once a second where
/// every table has the trigger) may find one of them first, not all.
fn produce_one_by_one(fx: &Fixture, second: &OwnDatabase, tenants: &Tenants, count: i64) {
    let mut a = Client::connect(&fx.database_url, NoTls).unwrap();
    let mut b = Client::connect(&second.url(), NoTls).unwrap();
    for n in 1..=count {
        insert(&mut a, &tenants.table("a"), &format!("a{n}"), 1);
        insert(&mut b, &tenants.table("b"), &format!("b{n}"), 1);
        std::thread::sleep(Duration::from_millis(300));
    }
    let published = crate::common::wait_until(Duration::from_secs(10), || {
        per_tenant_count(&fx.database_url, tenants, "a") == count
            && per_tenant_count(&second.url(), tenants, "b") == count
    });
    assert!(published, "not every event was published");
}

/// How many times the follow's trace says a commit in `table` woke it.
fn woken_by(stderr: &str, table: &str) -> usize {
    stderr
        .lines()
        .filter(|line| line.ends_with(&format!("woken by a commit in {table}")))
        .count()
}

#[test]
fn a_follow_over_many_databases_is_woken_by_each_tables_notify_trigger() {
    let fx = Fixture::bare("many_woken");
    let second = OwnDatabase::create(&fx, "2nd");
    let tenants = notifying_tenants(&fx, &second, true);
    let dir = Scratch::new("many_woken");
    let child = follow_both(&fx, &second, &tenants, &dir);
    std::thread::sleep(Duration::from_millis(500));
    produce_one_by_one(&fx, &second, &tenants, 4);
    let stderr = end_follow(child);
    for (database, name) in [(fx.database_url.as_str(), "a"), (&second.url(), "b")] {
        let table = tenants.table(name);
        assert!(
            woken_by(&stderr, &table) >= 2,
            "no commit in {table} ({database}) woke the follow: {stderr}"
        );
    }
    assert_eq!(
        stderr
            .matches("1 of 1 tables woken by their notify trigger")
            .count(),
        2,
        "{stderr}"
    );
}

#[test]
fn a_follow_over_many_databases_polls_the_tables_without_the_trigger() {
    let fx = Fixture::bare("many_polled");
    let second = OwnDatabase::create(&fx, "2nd");
    let tenants = notifying_tenants(&fx, &second, false);
    let dir = Scratch::new("many_polled");
    let child = follow_both(&fx, &second, &tenants, &dir);
    std::thread::sleep(Duration::from_millis(500));
    produce_one_by_one(&fx, &second, &tenants, 2);
    let stderr = end_follow(child);
    assert_eq!(
        stderr
            .matches("0 of 1 tables woken by their notify trigger")
            .count(),
        2,
        "{stderr}"
    );
    assert_eq!(woken_by(&stderr, &tenants.table("a")), 0, "{stderr}");
}

#[test]
fn a_follow_whose_listening_session_is_lost_goes_on_by_polling_that_database() {
    let fx = Fixture::bare("many_listener_lost");
    let second = OwnDatabase::create(&fx, "2nd");
    let tenants = notifying_tenants(&fx, &second, true);
    let dir = Scratch::new("many_listener_lost");
    let child = follow_both(&fx, &second, &tenants, &dir);
    // The session that LISTENs on tenant b's channel, in the second
    // database, ended by the server as an administrator would.
    let mut admin = Client::connect(&second.url(), NoTls).unwrap();
    let channel = format!(
        "outbox_poll_{}",
        admin
            .query_one(
                "SELECT $1::text::regclass::oid::text",
                &[&tenants.table("b")]
            )
            .unwrap()
            .get::<_, String>(0)
    );
    let ended = crate::common::wait_until(Duration::from_secs(5), || {
        let sql = "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity \
                   WHERE datname = current_database() AND query LIKE '%LISTEN %' || $1 || '%'";
        admin.query_one(sql, &[&channel]).unwrap().get::<_, i64>(0) == 1
    });
    assert!(ended, "no session listened on {channel}");
    std::thread::sleep(Duration::from_millis(500));
    produce_one_by_one(&fx, &second, &tenants, 2);
    let stderr = end_follow(child);
    assert!(
        stderr.contains("the session watching it was lost: looked at between batches from now on"),
        "{stderr}"
    );
    assert_eq!(woken_by(&stderr, &tenants.table("b")), 0, "{stderr}");
}

#[test]
fn ordered_takes_one_lock_per_table_so_a_lock_held_on_one_outbox_holds_back_only_it() {
    let fx = Fixture::bare_isolated("many_ordered");
    let mut tenants = Tenants::of(&fx);
    let url = fx.database_url.clone();
    tenants.add(&fx, &url, "a", 2);
    tenants.add(&fx, &url, "b", 2);
    // Another ordered run, as far as this one can tell, on a's table only.
    let mut other = Client::connect(&url, NoTls).unwrap();
    let mut tx = other.transaction().unwrap();
    let sql = format!(
        "SELECT pg_try_advisory_xact_lock(2052318419, '\"{}_a\".outbox'::regclass::oid::int)",
        tenants.prefix
    );
    assert!(tx.query_one(&sql, &[]).unwrap().get::<_, bool>(0));
    let args = ["--table", &tenants.pattern(), "--ordered", "--json"];
    let run = fx.run(&args);
    assert_eq!((run.code, run.stderr.as_str()), (0, ""), "{}", run.stdout);
    assert_eq!(per_tenant(&fx), HashMap::from([("b".into(), 2)]));
    tx.rollback().unwrap();
    let run = fx.run(&args);
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert_eq!(per_tenant(&fx), HashMap::from([("a".into(), 2)]));
}

#[test]
fn sessions_over_four_databases_never_exceed_max_connections_at_once() {
    sessions_over_four_databases_stay_within_two("many_drain_pool", &["--drain"]);
}

#[test]
fn a_follow_over_four_databases_counts_its_listening_sessions_within_max_connections() {
    let follow = ["--follow", "--max-duration", "4s"];
    let seen = sessions_over_four_databases_stay_within_two("many_pool_follow", &follow);
    // Its last second, quiet: the listener and the pool's session, and no
    // session closing to make room for another (the slack above).
    let quiet: Vec<i64> = seen
        .iter()
        .filter(|(at, _)| *at >= Duration::from_secs(3))
        .map(|(_, count)| *count)
        .collect();
    assert!(
        !quiet.is_empty() && quiet.iter().all(|&count| count <= 2),
        "sessions in the quiet last second: {quiet:?}"
    );
}

/// A run in `mode` over four databases with --max-connections 2 drains
/// them all, never holding more than two sessions at once; the sessions
/// seen, counted every few milliseconds, with when.
fn sessions_over_four_databases_stay_within_two(test: &str, mode: &[&str]) -> Vec<(Duration, i64)> {
    let fx = Fixture::bare(test);
    let others: Vec<OwnDatabase> = ["2nd", "3rd", "4th"]
        .iter()
        .map(|suffix| OwnDatabase::create(&fx, suffix))
        .collect();
    let mut tenants = Tenants::of(&fx);
    let mut urls = vec![fx.database_url.clone()];
    urls.extend(others.iter().map(OwnDatabase::url));
    for (n, url) in urls.iter().enumerate() {
        tenants.add(&fx, url, &format!("t{n}"), 60);
    }
    let dir = Scratch::new(test);
    let file = dir.write("databases", &(urls.join("\n") + "\n"));
    let file = file.display().to_string();
    // The run's sessions, told apart by their application_name, counted
    // every few milliseconds for as long as it runs.
    let app = format!("{}_pool", fx.schema);
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let started = std::time::Instant::now();
    let watcher = {
        let (done, app) = (done.clone(), app.clone());
        std::thread::spawn(move || {
            let mut db = connect_db();
            let mut seen = Vec::new();
            while !done.load(std::sync::atomic::Ordering::SeqCst) {
                let sql = "SELECT count(*) FROM pg_stat_activity WHERE application_name = $1";
                let count: i64 = db.query_one(sql, &[&app]).unwrap().get(0);
                seen.push((started.elapsed(), count));
                std::thread::sleep(Duration::from_millis(2));
            }
            seen
        })
    };
    let pattern = tenants.pattern();
    let mut args = vec!["--databases", &file, "--table", &pattern];
    args.extend(mode);
    args.extend(["--batch-size", "5", "--max-connections", "2", "--json"]);
    let run = fx.run_with(&[("PGAPPNAME", &app)], &args);
    done.store(true, std::sync::atomic::Ordering::SeqCst);
    let seen = watcher.join().unwrap();
    assert_eq!((run.code, run.stderr.as_str()), (0, ""), "{}", run.stdout);
    assert_eq!(run.field("published"), 240);
    // A session the run closed to make room for another database's may
    // still be seen on the server for a moment after (its backend exits
    // once it has read the goodbye): one more than the limit, never two.
    let most = seen.iter().map(|(_, count)| *count).max().unwrap_or(0);
    assert!((1..=3).contains(&most), "{most} sessions at once");
    seen
}

#[test]
fn requeue_dead_over_a_pattern_requeues_the_dead_events_of_every_tenant() {
    let mut fx = Fixture::bare("many_requeue");
    let mut tenants = Tenants::of(&fx);
    let url = fx.database_url.clone();
    tenants.add(&fx, &url, "a", 2);
    tenants.add(&fx, &url, "b", 3);
    let prefix = tenants.prefix.clone();
    for name in ["a", "b"] {
        fx.execute(&format!(
            "UPDATE \"{prefix}_{name}\".outbox SET attempts = 10"
        ));
    }
    let run = fx.run(&["--table", &tenants.pattern(), "requeue", "--dead"]);
    assert_eq!((run.code, run.stderr.as_str()), (0, ""), "{}", run.stdout);
    let run = fx.run(&["--table", &tenants.pattern(), "--json"]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert_eq!(
        per_tenant(&fx),
        HashMap::from([("a".into(), 2), ("b".into(), 3)])
    );
}

#[test]
fn ordered_by_key_drains_every_outbox_in_order_per_key() {
    let fx = Fixture::bare_isolated("many_by_key");
    let mut tenants = Tenants::of(&fx);
    let url = fx.database_url.clone();
    tenants.add(&fx, &url, "a", 0);
    tenants.add(&fx, &url, "b", 0);
    let mut db = Client::connect(&url, NoTls).unwrap();
    // Keys k<tenant>0 and k<tenant>1, 5 events each, interleaved: event n
    // of a key is `<key>-<n>`. A claim takes one event of each key.
    for tenant in ["a", "b"] {
        db.batch_execute(&format!(
            "INSERT INTO \"{}_{tenant}\".outbox (event_id, event_type, payload, ordering_key) \
             SELECT 'k{tenant}' || g % 2 || '-' || g / 2, 'order.created', '{{}}', \
                    'k{tenant}' || g % 2 FROM generate_series(0, 9) g",
            tenants.prefix
        ))
        .unwrap();
    }
    let args = [
        "--table",
        &tenants.pattern(),
        "--ordered-by-key",
        "--drain",
        "--json",
    ];
    let run = fx.run(&args);
    assert_eq!((run.code, run.stderr.as_str()), (0, ""), "{}", run.stdout);
    assert_eq!(run.field("published"), 20);
    assert_eq!(crate::common::assert_in_order_per_key(&fx.messages()), 20);
}

#[test]
fn a_partitioned_outbox_in_a_list_is_served_though_it_has_no_pages_of_its_own() {
    let mut fx = Fixture::partitioned("many_parts");
    fx.insert("p", 3);
    let mut tenants = Tenants::of(&fx);
    let url = fx.database_url.clone();
    tenants.add(&fx, &url, "a", 2);
    // An outbox never written to has no page: the plan asks it nothing.
    tenants.add(&fx, &url, "none", 0);
    let list = format!("{},{}", fx.table, tenants.pattern());
    let run = fx.run(&["--table", &list, "--json"]);
    assert_eq!((run.code, run.stderr.as_str()), (0, ""), "{}", run.stdout);
    assert_eq!(
        per_tenant(&fx),
        HashMap::from([("p".into(), 3), ("a".into(), 2)])
    );
    assert_eq!(outboxes(&run).len(), 3, "{}", run.stdout);
}

/// Whether the outbox table of tenant `name` exists in the database of `url`.
fn has_table(url: &str, tenants: &Tenants, name: &str) -> bool {
    let mut db = Client::connect(url, NoTls).unwrap();
    let sql = "SELECT to_regclass($1) IS NOT NULL";
    let table = format!("\"{}_{name}\".outbox", tenants.prefix);
    db.query_one(sql, &[&table]).unwrap().get(0)
}

#[test]
fn migrate_over_a_list_creates_each_listed_table_that_is_missing_and_upgrades_the_others() {
    let fx = Fixture::bare("many_mig_list");
    let mut tenants = Tenants::of(&fx);
    let url = fx.database_url.clone();
    tenants.add(&fx, &url, "a", 1);
    tenants.add_schema(&url, "b");
    tenants.add_schema(&url, "c");
    let list = [tenants.table("a"), tenants.table("b"), tenants.table("c")].join(",");
    let run = fx.run(&["--table", &list, "migrate"]);
    assert_eq!((run.code, run.stderr.as_str()), (0, ""), "{}", run.stdout);
    for name in ["b", "c"] {
        assert!(has_table(&url, &tenants, name), "{name}: {}", run.stdout);
        let line = format!("created the table {}", tenants.table(name));
        assert!(run.stdout.contains(&line), "{line} not in {}", run.stdout);
    }
    assert!(
        run.stdout
            .contains(&format!("the table {} is up to date", tenants.table("a"))),
        "{}",
        run.stdout
    );
    // The tables it created are outboxes like the others.
    let run = fx.run(&["--table", &tenants.pattern(), "status", "--json"]);
    assert_eq!((run.code, run.stderr.as_str()), (0, ""), "{}", run.stdout);
    assert_eq!(run.summary()["outboxes"].as_array().unwrap().len(), 3);
}

#[test]
fn migrate_over_a_pattern_that_matches_nothing_is_78_saying_how_to_create_a_table() {
    let fx = Fixture::bare("many_mig_nomatch");
    let mut tenants = Tenants::of(&fx);
    let url = fx.database_url.clone();
    // A schema without its table: a pattern creates nothing in it.
    tenants.add_schema(&url, "a");
    let pattern = tenants.pattern();
    let run = fx.run(&["--table", &pattern, "migrate"]);
    assert_eq!(run.code, 78, "{}", run.stderr);
    assert_eq!(run.stdout, "");
    let lines: Vec<&str> = run.stderr.lines().collect();
    assert_eq!(lines.len(), 1, "{}", run.stderr);
    assert!(lines[0].starts_with("outbox-poll: error: "), "{}", lines[0]);
    assert!(lines[0].contains("matches no table"), "{}", lines[0]);
    assert!(lines[0].contains(&pattern), "{}", lines[0]);
    // Naming the table is what creates it.
    assert!(
        lines[0].contains("name it: `outbox-poll migrate --table "),
        "{}",
        lines[0]
    );
    assert!(!has_table(&url, &tenants, "a"));
}

/// Makes every event of tenant `name` published 8 days ago.
fn published_long_ago(fx: &mut Fixture, tenants: &Tenants, name: &str) {
    fx.execute(&format!(
        "UPDATE \"{}_{name}\".outbox SET published_at = now() - interval '8 days'",
        tenants.prefix
    ));
}

/// The `outboxes` of a subcommand's summary, by table: the object.
fn listed_by_table(run: &Run) -> HashMap<String, serde_json::Value> {
    let summary = run.summary();
    let list = summary["outboxes"]
        .as_array()
        .unwrap_or_else(|| panic!("no outboxes in {}", run.stdout));
    list.iter()
        .map(|outbox| {
            (
                outbox["table"].as_str().unwrap().to_string(),
                outbox.clone(),
            )
        })
        .collect()
}

#[test]
fn prune_over_many_outboxes_prints_one_summary_archives_every_row_and_exits_the_most_urgent() {
    let mut fx = Fixture::bare("many_prune_all");
    let mut tenants = Tenants::of(&fx);
    let url = fx.database_url.clone();
    tenants.add(&fx, &url, "a", 2);
    tenants.add(&fx, &url, "b", 3);
    tenants.add(&fx, &url, "broken", 1);
    for name in ["a", "b", "broken"] {
        published_long_ago(&mut fx, &tenants, name);
    }
    fx.execute(&format!(
        "ALTER TABLE \"{}_broken\".outbox DROP COLUMN published_at",
        tenants.prefix
    ));
    let dir = Scratch::new("many_prune_all");
    let archive = dir.path().join("pruned.jsonl");
    let archive_text = archive.display().to_string();
    let pattern = tenants.pattern();
    let args = ["--table", &pattern, "prune", "--older-than", "7d"];
    let run = fx.run(&[&args[..], &["--archive", &archive_text, "--json"]].concat());
    assert_eq!(run.code, 78, "{}", run.stderr);
    let lines: Vec<&str> = run.stderr.lines().collect();
    assert_eq!(lines.len(), 1, "{}", run.stderr);
    assert!(
        lines[0].contains(&format!("table {}", tenants.table("broken"))),
        "{}",
        lines[0]
    );
    assert_eq!(run.stdout.lines().count(), 1, "{}", run.stdout);
    assert_eq!(run.field("published"), 5);
    let listed = listed_by_table(&run);
    assert_eq!(listed.len(), 2, "{}", run.stdout);
    for (name, published) in [("a", 2), ("b", 3)] {
        let one = &listed[&tenants.table(name)];
        assert_eq!(one["published"], published, "{}", run.stdout);
        assert_eq!(one["database"].as_str(), Some(label_of("test").as_str()));
    }
    let text = std::fs::read_to_string(&archive).unwrap();
    let mut archived: Vec<String> = text
        .lines()
        .map(|line| {
            let row: serde_json::Value = serde_json::from_str(line).unwrap();
            row["event_id"].as_str().unwrap().to_string()
        })
        .collect();
    archived.sort();
    assert_eq!(archived, ["a-1", "a-2", "b-1", "b-2", "b-3"]);
    // In text, a line per outbox and the total.
    tenants.add(&fx, &url, "c", 1);
    published_long_ago(&mut fx, &tenants, "c");
    let list = [tenants.table("a"), tenants.table("c")].join(",");
    let run = fx.run(&["--table", &list, "prune", "--older-than", "7d"]);
    assert_eq!((run.code, run.stderr.as_str()), (0, ""), "{}", run.stdout);
    assert!(
        run.stdout.contains(&format!(
            "table {}: deleted 1 published event older than 7d",
            tenants.table("c")
        )),
        "{}",
        run.stdout
    );
    assert!(
        run.stdout
            .ends_with("total over 2 outbox(es): deleted 1 published event older than 7d\n"),
        "{}",
        run.stdout
    );
}

#[test]
fn prune_over_shards_prunes_each_outbox_once_each_shard_one_summary_of_its_own() {
    let mut fx = Fixture::bare("many_prune_shard");
    let mut tenants = Tenants::of(&fx);
    let url = fx.database_url.clone();
    let names: Vec<String> = (0..6).map(|n| format!("p{n}")).collect();
    for name in &names {
        tenants.add(&fx, &url, name, 2);
        published_long_ago(&mut fx, &tenants, name);
    }
    let rows = |name: &str| -> i64 {
        let sql = format!("SELECT count(*) FROM \"{}_{name}\".outbox", tenants.prefix);
        fx.connect().query_one(&sql, &[]).unwrap().get(0)
    };
    let mut seen = HashSet::new();
    for index in 0..2 {
        let shard = format!("{index}/2");
        let args = ["--table", &tenants.pattern(), "--shard", &shard];
        let run = fx.run(&[&args[..], &["prune", "--older-than", "7d", "--json"]].concat());
        assert_eq!((run.code, run.stderr.as_str()), (0, ""), "{}", run.stdout);
        assert_eq!(run.stdout.lines().count(), 1, "{}", run.stdout);
        // The tenants this shard pruned, as the tables say.
        let pruned: HashSet<String> = names
            .iter()
            .filter(|name| !seen.contains(&tenants.table(name)) && rows(name) == 0)
            .map(|name| tenants.table(name))
            .collect();
        assert_eq!(
            run.field("published"),
            2 * pruned.len() as i64,
            "{}",
            run.stdout
        );
        // A shard of one outbox reports it as a single outbox's summary.
        if pruned.len() > 1 {
            let listed: HashSet<String> = listed_by_table(&run).into_keys().collect();
            assert_eq!(listed, pruned, "{}", run.stdout);
        }
        seen.extend(pruned);
    }
    let every: HashSet<String> = names.iter().map(|name| tenants.table(name)).collect();
    assert_eq!(seen, every);
}

#[test]
fn wait_over_many_outboxes_gives_up_at_one_deadline_for_all_saying_what_is_left_in_each() {
    let fx = Fixture::bare("many_wait_left");
    let mut tenants = Tenants::of(&fx);
    let url = fx.database_url.clone();
    for name in ["a", "b", "c"] {
        tenants.add(&fx, &url, name, 1);
    }
    let started = std::time::Instant::now();
    let args = ["--table", &tenants.pattern(), "wait", "--timeout", "1s"];
    let run = fx.run(&[&args[..], &["--json"]].concat());
    let took = started.elapsed();
    assert_eq!(run.code, 1, "{}", run.stderr);
    // One deadline: not a second per outbox.
    assert!(took < Duration::from_millis(2500), "took {took:?}");
    let lines: Vec<&str> = run.stderr.lines().collect();
    assert_eq!(lines.len(), 3, "{}", run.stderr);
    for name in ["a", "b", "c"] {
        let table = tenants.table(name);
        let line = lines
            .iter()
            .find(|line| line.contains(&format!("{table} of")));
        let line = line.unwrap_or_else(|| panic!("nothing about {table}: {}", run.stderr));
        assert!(line.contains("timed out after 1s: 1 event "), "{line}");
    }
    assert_eq!(run.stdout.lines().count(), 1, "{}", run.stdout);
    assert_eq!(run.field("left"), 3);
    assert_eq!(run.field("exit_code"), 1);
    let listed = listed_by_table(&run);
    assert_eq!(listed.len(), 3, "{}", run.stdout);
    for name in ["a", "b", "c"] {
        let one = &listed[&tenants.table(name)];
        assert_eq!(one["left"], 1, "{}", run.stdout);
        assert_eq!(one["database"].as_str(), Some(label_of("test").as_str()));
    }
}

#[test]
fn wait_over_many_outboxes_waits_only_for_the_events_committed_before_it_started_in_each() {
    let fx = Fixture::bare("many_wait_since");
    let mut tenants = Tenants::of(&fx);
    let url = fx.database_url.clone();
    tenants.add(&fx, &url, "a", 1);
    tenants.add(&fx, &url, "b", 0);
    let wait = fx
        .command()
        .args(["--table", &tenants.pattern(), "wait", "--timeout", "5s"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // The wait is looking at what is left in a (b has nothing to wait for).
    let mut db = fx.connect();
    let looking = crate::common::wait_until(Duration::from_secs(5), || {
        let sql = "SELECT EXISTS (SELECT FROM pg_stat_activity \
                   WHERE query LIKE '%pg_visible_in_snapshot%' AND query LIKE '%' || $1 || '%')";
        let a = format!("{}_a", tenants.prefix);
        db.query_one(sql, &[&a]).unwrap().get(0)
    });
    assert!(looking, "the wait never looked at tenant a");
    // Committed in b after the wait started: not waited for, though a
    // wait that took b's horizon only once a was done would wait for it.
    insert(&mut db, &tenants.table("b"), "late", 1);
    db.batch_execute(&format!(
        "UPDATE \"{}_a\".outbox SET published_at = now()",
        tenants.prefix
    ))
    .unwrap();
    let run = Run::from(wait.wait_with_output().unwrap());
    assert_eq!((run.code, run.stderr.as_str()), (0, ""), "{}", run.stdout);
}

/// The shard of `table` in the shared test database, of `count`: the
/// FNV-1a hash the contract gives, computed here on its own.
fn shard_of(table: &str, count: u64) -> u64 {
    let key = format!("{}/{table}", label_of("test"));
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in key.bytes() {
        hash = (hash ^ u64::from(byte)).wrapping_mul(0x0000_0100_0000_01b3);
    }
    hash % count
}

#[test]
fn each_shard_counts_its_own_outboxes_and_alone_reports_a_listed_table_that_is_missing() {
    let fx = Fixture::bare("many_st_shard");
    let mut tenants = Tenants::of(&fx);
    let url = fx.database_url.clone();
    let names: Vec<String> = (0..6).map(|n| format!("s{n}")).collect();
    for (n, name) in names.iter().enumerate() {
        tenants.add(&fx, &url, name, n as i64 + 1);
    }
    // A listed table whose schema does not exist either: even migrate
    // cannot create it, so every command reports it.
    let missing = tenants.table("gone");
    let list = format!("{},{missing}", tenants.pattern());
    let mut pending = [0, 0];
    for (n, name) in names.iter().enumerate() {
        pending[shard_of(&tenants.table(name), 2) as usize] += n as i64 + 1;
    }
    let owner = shard_of(&missing, 2);
    for index in 0..2u64 {
        let shard = format!("{index}/2");
        let run = fx.run(&["--table", &list, "--shard", &shard, "status", "--json"]);
        assert_eq!(
            run.field("pending"),
            pending[index as usize],
            "{}",
            run.stdout
        );
        let expected = match index == owner {
            true => (78, 1),
            false => (0, 0),
        };
        assert_eq!(
            (run.code, run.stderr.matches(&missing).count().min(1)),
            expected,
            "shard {shard}: {}",
            run.stderr
        );
    }
    // Every command over the same selection: the missing table is the
    // business of its shard's run alone.
    let commands: [&[&str]; 7] = [
        &["--json"],
        &["check", "--json"],
        &["requeue", "--dead"],
        &["prune", "--older-than", "7d"],
        &["wait", "--timeout", "5s"],
        &["migrate"],
        &["status"],
    ];
    for command in commands {
        for index in 0..2u64 {
            let shard = format!("{index}/2");
            let args = [&["--table", &list, "--shard", &shard][..], command].concat();
            let run = fx.run(&args);
            assert_eq!(
                run.stderr.contains(&missing),
                index == owner,
                "{command:?} in shard {shard} (the table is in shard {owner}): {}",
                run.stderr
            );
            assert_eq!(
                run.code == 78,
                index == owner,
                "{command:?}: {}",
                run.stderr
            );
        }
    }
    // The plain runs above published every tenant's events once.
    assert_eq!(per_tenant(&fx).values().sum::<usize>(), 21);
}

#[test]
fn check_over_a_selection_checks_each_outbox_and_names_the_ones_that_fail() {
    let mut fx = Fixture::bare("many_check_each");
    let mut tenants = Tenants::of(&fx);
    let url = fx.database_url.clone();
    for name in ["a", "b", "c"] {
        tenants.add(&fx, &url, name, 0);
    }
    fx.execute(&format!(
        "ALTER TABLE \"{}_b\".outbox DROP COLUMN last_error",
        tenants.prefix
    ));
    let missing = tenants.table("gone");
    let list = format!("{},{missing}", tenants.pattern());
    let run = fx.run(&["--table", &list, "check", "--json"]);
    assert_eq!(run.code, 78, "{}", run.stderr);
    let summary = run.summary();
    let mut by_table: HashMap<String, Vec<String>> = HashMap::new();
    for check in summary["checks"].as_array().unwrap() {
        if let Some(table) = check["table"].as_str() {
            assert_eq!(check["database"].as_str(), Some(label_of("test").as_str()));
            let outcome = format!("{} {}", check["name"], check["status"]).replace('"', "");
            by_table.entry(table.to_string()).or_default().push(outcome);
        }
    }
    let all_ok = ["postgresql ok", "table ok", "columns ok", "grants ok"];
    assert_eq!(by_table[&tenants.table("a")], all_ok, "{}", run.stdout);
    assert_eq!(by_table[&tenants.table("c")], all_ok, "{}", run.stdout);
    assert_eq!(
        by_table[&tenants.table("b")],
        [
            "postgresql ok",
            "table ok",
            "columns failed",
            "grants skipped"
        ],
        "{}",
        run.stdout
    );
    assert_eq!(
        by_table[&missing],
        [
            "postgresql ok",
            "table failed",
            "columns skipped",
            "grants skipped"
        ],
        "{}",
        run.stdout
    );
    assert_eq!(by_table.len(), 4, "{}", run.stdout);
    // The broker's checks, once.
    let publish = summary["checks"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|check| check["name"] == "publish")
        .count();
    assert_eq!(publish, 1, "{}", run.stdout);
}

#[test]
fn requeue_over_many_outboxes_prints_one_summary_and_tells_each_id_once() {
    let mut fx = Fixture::bare("many_rq_json");
    let mut tenants = Tenants::of(&fx);
    let url = fx.database_url.clone();
    tenants.add(&fx, &url, "a", 2);
    tenants.add(&fx, &url, "b", 2);
    tenants.add(&fx, &url, "c", 1);
    let prefix = tenants.prefix.clone();
    fx.execute(&format!("UPDATE \"{prefix}_a\".outbox SET attempts = 10"));
    fx.execute(&format!(
        "UPDATE \"{prefix}_b\".outbox SET published_at = now() WHERE event_id = 'b-2'"
    ));
    let pattern = tenants.pattern();
    let ids = ["a-1", "b-2", "nobody-1"];
    let args = [
        &["--table", &pattern, "requeue", "--json", "--event-id"][..],
        &ids,
    ]
    .concat();
    let run = fx.run(&args);
    assert_eq!(run.code, 1, "{}", run.stderr);
    // a-1 is a's, requeued; b-2 is b's, published; nobody-1 is nowhere:
    // a line each, whatever the other outboxes hold.
    let mut lines: Vec<&str> = run.stderr.lines().collect();
    lines.sort();
    assert_eq!(
        lines,
        [
            "outbox-poll: event id b-2 is already published; left as it is",
            "outbox-poll: unknown event id: nobody-1",
        ],
        "{}",
        run.stderr
    );
    assert_eq!(run.stdout.lines().count(), 1, "{}", run.stdout);
    let summary = run.summary();
    assert_eq!(summary["requeued"], 1, "{}", run.stdout);
    assert_eq!(summary["unknown"], serde_json::json!(["nobody-1"]));
    assert_eq!(summary["already_published"], serde_json::json!(["b-2"]));
    let listed = listed_by_table(&run);
    assert_eq!(listed.len(), 3, "{}", run.stdout);
    for (name, requeued) in [("a", 1), ("b", 0), ("c", 0)] {
        let one = &listed[&tenants.table(name)];
        assert_eq!(one["requeued"], requeued, "{}", run.stdout);
        assert_eq!(one["database"].as_str(), Some(label_of("test").as_str()));
    }
    // The dead of every tenant, in text: a line per outbox and the total.
    let run = fx.run(&["--table", &pattern, "requeue", "--dead"]);
    assert_eq!((run.code, run.stderr.as_str()), (0, ""), "{}", run.stdout);
    assert!(
        run.stdout
            .contains(&format!("table {}: requeued 1 event\n", tenants.table("a"))),
        "{}",
        run.stdout
    );
    assert!(
        run.stdout
            .ends_with("total over 3 outbox(es): requeued 1 event\n"),
        "{}",
        run.stdout
    );
}
