//! Many outboxes in one run (CONTRACT.md "Many outboxes"), against the
//! goals of issue 21, each ratio measured within one bench run:
//!
//! - `many_empty`: the empty run over BENCH_MANY_TENANTS (1,000) empty
//!   tenant outboxes, a schema each in one database, against the empty
//!   run over one outbox. Goal: at most 5x (medians).
//! - `many_databases`: the empty run over BENCH_MANY_DATABASES (20)
//!   databases (`--databases`), against one database's empty run and 20
//!   sequential single-database runs. Goal: at most 3x one database's run
//!   plus the sessions' own start-up (the other databases' connects, timed
//!   here from the bench as the relay opens them: TLS where the URL's
//!   sslmode negotiates it, which a plain connect leaves out; the plain
//!   figure is printed beside it).
//! - `fairness`: one outbox with BENCH_FAIR_BIG (100,000) events and 99
//!   with 10 each, `--drain`: the worst small outbox's delay (from the
//!   run's start to its last batch's claim) and whether every small outbox
//!   was claimed before the big one's 10th batch. Both read from
//!   published_at, which is the claiming transaction's now().
//! - `many_throughput`: 100 outboxes of 1,000 events against one outbox
//!   of 100,000, `--drain`, at each of BENCH_MANY_BATCHES (100,1000).
//!   Goal: at least 0.9x the one outbox's rate.
//!
//! Tenant tables are made with `CREATE TABLE ... (LIKE <the migrated
//! table> INCLUDING ALL)`: a thousand `migrate` runs would cost minutes.
//! In the throughput and fairness sections, the one big outbox is made the
//! same way, so both sides of a ratio have the same table.

use std::fmt::Write as _;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use postgres::{Client, NoTls};

use outbox_poll::connect::conninfo::{self, Account, ConnInfo, SystemFiles};
use outbox_poll::relay::session;

use crate::common::{Fixture, check, env_list, env_or, load_average, median, url_in_database};

/// How long the bench's own connects may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// Tenant schemas `<fixture>_<prefix><n>`, each with an outbox like the
/// fixture's, dropped with it.
struct Tenants {
    schemas: Vec<String>,
    url: String,
}

impl Tenants {
    /// `count` tenants named `<fixture>_<prefix><n>` in the fixture's
    /// database.
    fn create(fx: &mut Fixture, prefix: &str, count: usize) -> Tenants {
        let schemas: Vec<String> = (0..count)
            .map(|n| format!("{}_{prefix}{n:04}", fx.name))
            .collect();
        // Fifty a statement: each holds its locks to the end of it.
        for chunk in schemas.chunks(50) {
            let mut sql = String::new();
            for schema in chunk {
                write!(
                    sql,
                    "DROP SCHEMA IF EXISTS {schema} CASCADE; CREATE SCHEMA {schema}; \
                     CREATE TABLE {schema}.outbox (LIKE {} INCLUDING ALL);",
                    fx.table()
                )
                .unwrap();
            }
            fx.db.batch_execute(&sql).unwrap();
        }
        Tenants {
            schemas,
            url: fx.settings.database_url.clone(),
        }
    }

    fn pattern(fx: &Fixture, prefix: &str) -> String {
        format!("{}_{prefix}*.outbox", fx.name)
    }
}

impl Drop for Tenants {
    fn drop(&mut self) {
        let Ok(mut db) = Client::connect(&self.url, NoTls) else {
            return;
        };
        for chunk in self.schemas.chunks(50) {
            let sql: String = chunk
                .iter()
                .map(|schema| format!("DROP SCHEMA IF EXISTS {schema} CASCADE;"))
                .collect();
            let _ = db.batch_execute(&sql);
        }
    }
}

/// Inserts `count` events `<prefix>-<n>` of about 200 bytes of JSON into
/// `table`.
fn insert(db: &mut Client, table: &str, prefix: &str, count: i64) {
    let sql = format!(
        "INSERT INTO {table} (event_id, event_type, payload) \
         SELECT $1 || '-' || g, 'order.created', jsonb_build_object( \
           'order_id', g, 'customer', 'cust-' || (g % 977), \
           'amount_cents', (g * 7919) % 100000, 'currency', 'EUR', \
           'note', repeat('x', 90)) \
         FROM generate_series(1, $2::bigint) g"
    );
    db.execute(&sql, &[&prefix, &count]).unwrap();
    db.batch_execute(&format!("ANALYZE {table}")).unwrap();
}

/// One run of the binary with `args` and `env`: its wall time in ms, and
/// its summary's `published` (every run here ends with --json).
fn timed(fx: &Fixture, env: &[(&str, &str)], args: &[&str]) -> (f64, u64) {
    let started = Instant::now();
    let output = fx
        .command()
        .envs(env.iter().copied())
        .args(args)
        .output()
        .expect("running outbox-poll");
    let millis = started.elapsed().as_secs_f64() * 1000.0;
    let text = String::from_utf8_lossy(&output.stdout);
    check(
        !output.status.success(),
        &format!(
            "outbox-poll {args:?} exited {}: {}",
            output.status,
            String::from_utf8_lossy(&output.stderr)
        ),
    );
    let summary: serde_json::Value = text
        .lines()
        .last()
        .and_then(|line| serde_json::from_str(line).ok())
        .unwrap_or_default();
    (millis, summary["published"].as_u64().unwrap_or(0))
}

fn verdict(met: bool) -> &'static str {
    match met {
        true => "met",
        false => "MISSED",
    }
}

/// The sections of this file that BENCH_ONLY asks for (`many`: all four).
pub fn sections(fx: &mut Fixture) -> Vec<Vec<String>> {
    let wants = |fx: &Fixture, name: &str| fx.settings.wants(name) || fx.settings.named("many");
    let mut blocks = Vec::new();
    if wants(fx, "many_empty") {
        blocks.push(empty_tenants(fx));
    }
    if wants(fx, "many_databases") {
        blocks.push(databases(fx));
    }
    if wants(fx, "fairness") {
        blocks.push(fairness(fx));
    }
    if wants(fx, "many_throughput") {
        blocks.push(throughput(fx));
    }
    blocks
}

/// The empty run over a thousand empty tenant outboxes against the empty
/// run over one, interleaved so that a machine getting busier weighs on
/// both alike.
fn empty_tenants(fx: &mut Fixture) -> Vec<String> {
    fx.fill(0, 200);
    let count: usize = env_or("BENCH_MANY_TENANTS", "1000").parse().unwrap();
    let made = Instant::now();
    let _tenants = Tenants::create(fx, "e", count);
    let made = made.elapsed().as_secs_f64();
    let pattern = Tenants::pattern(fx, "e");
    let runs = fx.settings.empty_runs.min(20);
    let (mut one, mut many) = (Vec::new(), Vec::new());
    for _ in 0..runs {
        one.push(timed(fx, &[], &["--json"]).0);
        many.push(timed(fx, &[], &["--table", &pattern, "--json"]).0);
    }
    let (one, many) = (median(one), median(many));
    let ratio = many / one;
    vec![
        format!(
            "many outboxes, empty run over {count} empty tenant schemas (made in {made:.1}s), \
             {runs} runs each, interleaved (load {:.2}):",
            load_average()
        ),
        format!("  one outbox:         median {one:.1} ms"),
        format!("  {count} outboxes:    median {many:.1} ms"),
        format!(
            "  ratio {ratio:.2}x (goal: <= 5x): {}",
            verdict(ratio <= 5.0)
        ),
    ]
}

/// Databases `<fixture>_db<n>` on the fixture's server, each with the
/// fixture's table migrated, dropped with it.
struct Databases {
    names: Vec<String>,
    admin: String,
}

impl Drop for Databases {
    fn drop(&mut self) {
        if let Ok(mut admin) = Client::connect(&self.admin, NoTls) {
            for name in &self.names {
                let _ =
                    admin.batch_execute(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"));
            }
        }
    }
}

/// The empty run over 20 databases against one database's, and against 20
/// sequential single-database runs; the bound allows the other databases'
/// sessions their own start-up, timed from here.
fn databases(fx: &mut Fixture) -> Vec<String> {
    let count: usize = env_or("BENCH_MANY_DATABASES", "20").parse().unwrap();
    let admin = fx.settings.database_url.clone();
    let mut dbs = Databases {
        names: Vec::new(),
        admin: admin.clone(),
    };
    let mut server = Client::connect(&admin, NoTls).unwrap();
    let mut urls = Vec::new();
    for n in 0..count {
        let name = format!("{}_db{n:02}", fx.name);
        server
            .batch_execute(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE); "))
            .unwrap();
        server
            .batch_execute(&format!("CREATE DATABASE {name} TEMPLATE template0"))
            .unwrap();
        dbs.names.push(name.clone());
        let url = url_in_database(&admin, &name);
        Client::connect(&url, NoTls)
            .unwrap()
            .batch_execute(&format!("CREATE SCHEMA {}", fx.name))
            .unwrap();
        let (_, _) = timed(fx, &[("DATABASE_URL", &url)], &["migrate"]);
        urls.push(url);
    }
    let file = std::env::temp_dir().join(format!("{}_databases", fx.name));
    std::fs::write(&file, urls.join("\n") + "\n").unwrap();
    let file_arg = file.display().to_string();
    let table = fx.table();
    let runs = fx.settings.empty_runs.min(10);
    // The relay reads the URLs with the PG* variables it is given: none.
    let account = Account::current(&SystemFiles);
    let infos: Vec<ConnInfo> = urls
        .iter()
        .map(|url| conninfo::resolve(Some(url), &|_| None, &SystemFiles, account.as_ref()))
        .collect::<anyhow::Result<_>>()
        .unwrap();
    let (mut one, mut many, mut sequential, mut connects, mut plain) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
    // A session's own start-up: connect as the relay does, one statement,
    // close; and without TLS, for comparison. Whichever loop runs first
    // after the runs above is the slower (a scratch program over 19
    // databases without TLS: the relay's first, 63.0 ms against plain
    // 42.4; plain first, 39.7 against the relay's 42.3), so they take
    // turns.
    let relay_start_up = || {
        let started = Instant::now();
        for info in &infos[1..] {
            let mut client = session::start_up(info, CONNECT_TIMEOUT, CONNECT_TIMEOUT).unwrap();
            client.batch_execute("SELECT 1").unwrap();
        }
        started.elapsed().as_secs_f64() * 1000.0
    };
    let plain_start_up = || {
        let started = Instant::now();
        for url in &urls[1..] {
            let mut client = Client::connect(url, NoTls).unwrap();
            client.batch_execute("SELECT 1").unwrap();
        }
        started.elapsed().as_secs_f64() * 1000.0
    };
    for run in 0..runs {
        let one_db = [("DATABASE_URL", urls[0].as_str())];
        one.push(timed(fx, &one_db, &["--json"]).0);
        let args = ["--databases", &file_arg, "--table", &table, "--json"];
        many.push(timed(fx, &[], &args).0);
        let started = Instant::now();
        for url in &urls {
            timed(fx, &[("DATABASE_URL", url)], &["--json"]);
        }
        sequential.push(started.elapsed().as_secs_f64() * 1000.0);
        if run % 2 == 0 {
            connects.push(relay_start_up());
            plain.push(plain_start_up());
        } else {
            plain.push(plain_start_up());
            connects.push(relay_start_up());
        }
    }
    let _ = std::fs::remove_file(&file);
    drop(dbs);
    let (one, many, sequential, connects, plain) = (
        median(one),
        median(many),
        median(sequential),
        median(connects),
        median(plain),
    );
    let bound = 3.0 * one + connects;
    vec![
        format!(
            "many outboxes, empty run over {count} databases (--databases), {runs} runs each, \
             interleaved (load {:.2}):",
            load_average()
        ),
        format!("  one database:                        median {one:.1} ms"),
        format!(
            "  {count} databases, one run:              median {many:.1} ms ({:.2}x one)",
            many / one
        ),
        format!(
            "  {count} sequential single-database runs: median {sequential:.1} ms \
             (one run over {count} takes {:.2}x of it)",
            many / sequential
        ),
        format!(
            "  the other {} databases' sessions' start-up, from the bench as the relay opens \
             them (sslmode {:?}, the relay's options): median {connects:.1} ms (without TLS: \
             {plain:.1} ms)",
            count - 1,
            infos[0].ssl.mode
        ),
        format!(
            "  goal: <= 3x one database + the sessions' start-up = {bound:.1} ms: {}",
            verdict(many <= bound)
        ),
    ]
}

/// One big backlog and 99 small outboxes, drained: how long each small
/// one waited.
fn fairness(fx: &mut Fixture) -> Vec<String> {
    fx.purge();
    let big: i64 = env_or("BENCH_FAIR_BIG", "100000").parse().unwrap();
    let small = 10;
    // "f0000" sorts first: the big one is the first outbox of every turn.
    let tenants = Tenants::create(fx, "f", 100);
    for (n, schema) in tenants.schemas.iter().enumerate() {
        let events = if n == 0 { big } else { small };
        insert(
            &mut fx.db,
            &format!("{schema}.outbox"),
            &format!("f{n}"),
            events,
        );
    }
    let pattern = Tenants::pattern(fx, "f");
    let wall = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    let (millis, published) = timed(fx, &[], &["--table", &pattern, "--drain", "--json"]);
    let total = big + 99 * small;
    let arrived = fx.arrivals().len() as i64;
    // Each batch's rows carry its transaction's now(): one value a batch.
    let batches_sql = format!(
        "SELECT DISTINCT extract(epoch FROM published_at)::float8 AS t \
         FROM {}.outbox ORDER BY t LIMIT 10",
        tenants.schemas[0]
    );
    let big_batches: Vec<f64> = fx
        .db
        .query(&batches_sql, &[])
        .unwrap()
        .iter()
        .map(|row| row.get(0))
        .collect();
    let mut worst: f64 = 0.0;
    let mut unmarked = 0;
    for schema in &tenants.schemas[1..] {
        let row = fx
            .db
            .query_one(
                &format!(
                    "SELECT extract(epoch FROM max(published_at))::float8, \
                     count(*) FILTER (WHERE published_at IS NULL) FROM {schema}.outbox"
                ),
                &[],
            )
            .unwrap();
        worst = worst.max(row.get::<_, Option<f64>>(0).unwrap_or(f64::INFINITY));
        unmarked += row.get::<_, i64>(1);
    }
    let tenth = big_batches.get(9).copied().unwrap_or(f64::INFINITY);
    let before_tenth = worst < tenth;
    let lost = arrived != total || published as i64 != total || unmarked > 0;
    check(
        lost,
        &format!("fairness: {arrived} of {total} arrived, {unmarked} small unmarked"),
    );
    vec![
        format!(
            "many outboxes, fairness: one outbox of {big} events and 99 of {small}, --drain \
             --batch-size 100, in {millis:.0} ms (load {:.2}):",
            load_average()
        ),
        format!(
            "  worst small outbox's delay (run start to its last batch's claim): {:.0} ms",
            (worst - wall) * 1000.0
        ),
        format!(
            "  the big one's 10th batch claimed at {:.0} ms; every small outbox before it: {}",
            (tenth - wall) * 1000.0,
            verdict(before_tenth)
        ),
        format!("  {arrived} of {total} arrived, {unmarked} small rows unmarked"),
    ]
}

/// 100 outboxes of 1,000 events against one of 100,000, drained at each
/// batch size: BENCH_MANY_ROUNDS rounds of one drain each, the two taking
/// turns at going first, and the ratio the median of the rounds' ratios.
/// One pair alone spread 0.75-1.01 over four runs on one machine (the
/// drains share two cores with PostgreSQL and RabbitMQ).
fn throughput(fx: &mut Fixture) -> Vec<String> {
    let outboxes = 100;
    let each: i64 = 1000;
    let total = outboxes as i64 * each;
    let rounds: usize = env_or("BENCH_MANY_ROUNDS", "3").parse().unwrap();
    let many = Tenants::create(fx, "m", outboxes);
    let one = Tenants::create(fx, "big", 1);
    let one_table = format!("{}.outbox", one.schemas[0]);
    let pattern = Tenants::pattern(fx, "m");
    let mut lines = vec![format!(
        "many outboxes, throughput: {outboxes} outboxes of {each} events against one of \
         {total}, --drain, the median of {rounds} rounds (load {:.2}):",
        load_average()
    )];
    for batch in env_list("BENCH_MANY_BATCHES", "100,1000") {
        let batch = batch.to_string();
        let mut rate = |table: &str, fill: &dyn Fn(&mut Client)| {
            fx.purge();
            fill(&mut fx.db);
            let args = [
                "--table",
                table,
                "--drain",
                "--batch-size",
                &batch,
                "--json",
            ];
            let (millis, published) = timed(fx, &[], &args);
            let arrived = fx.arrivals().len() as i64;
            check(
                arrived != total || published as i64 != total,
                &format!("throughput {table}: {arrived} of {total} arrived"),
            );
            total as f64 / millis * 1000.0
        };
        let fill_one = |db: &mut Client| {
            db.batch_execute(&format!("TRUNCATE {one_table}")).unwrap();
            insert(db, &one_table, "big", total);
        };
        let fill_many = |db: &mut Client| {
            for (n, schema) in many.schemas.iter().enumerate() {
                let table = format!("{schema}.outbox");
                db.batch_execute(&format!("TRUNCATE {table}")).unwrap();
                insert(db, &table, &format!("m{n}"), each);
            }
        };
        let (mut singles, mut spreads, mut ratios) = (Vec::new(), Vec::new(), Vec::new());
        for round in 0..rounds {
            let (single, spread) = match round % 2 {
                0 => {
                    let single = rate(&one_table, &fill_one);
                    (single, rate(&pattern, &fill_many))
                }
                _ => {
                    let spread = rate(&pattern, &fill_many);
                    (rate(&one_table, &fill_one), spread)
                }
            };
            eprintln!(
                "  many_throughput --batch-size {batch}, round {}: one {single:.0}/s, \
                 {outboxes} outboxes {spread:.0}/s: {:.2}x",
                round + 1,
                spread / single
            );
            singles.push(single);
            spreads.push(spread);
            ratios.push(spread / single);
        }
        let ratio = median(ratios.clone());
        let shown: Vec<String> = ratios.iter().map(|ratio| format!("{ratio:.2}")).collect();
        lines.push(format!(
            "  --batch-size {batch}: one outbox {:.0}/s, {outboxes} outboxes {:.0}/s \
             (medians); rounds {}: {ratio:.2}x (goal: >= 0.9x): {}",
            median(singles),
            median(spreads),
            shown.join(", "),
            verdict(ratio >= 0.9)
        ));
    }
    lines
}
