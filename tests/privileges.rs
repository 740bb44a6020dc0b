//! Least privilege: the roles of migrations/example_least_privilege_role.sql
//! do their jobs and nothing more. Roles are cluster-wide, so each test
//! creates its own (named after the process and the test) and drops it.

use crate::common::{Fixture, assert_one_clear_line, connect_db};

const EXAMPLE: &str = include_str!("../migrations/example_least_privilege_role.sql");

/// The example's roles, renamed for this test and granted on its table.
struct Roles {
    relay: String,
    pruner: String,
}

impl Roles {
    fn create(fx: &mut Fixture, test: &str) -> Roles {
        let pid = std::process::id();
        let roles = Roles {
            relay: format!("outbox_relay_{pid}_{test}"),
            pruner: format!("outbox_pruner_{pid}_{test}"),
        };
        roles.drop_roles();
        let sql = EXAMPLE
            .replace("outbox_relay", &roles.relay)
            .replace("outbox_pruner", &roles.pruner)
            .replace("SCHEMA public", &format!("SCHEMA \"{}\"", fx.schema))
            .replace("\"outbox\"", &fx.quoted_table());
        fx.db.batch_execute(&sql).expect("applying the example");
        roles
    }

    fn url(role: &str) -> String {
        let config: postgres::Config = crate::common::database_url().parse().unwrap();
        let dbname = config.get_dbname().unwrap_or("test");
        let port = config.get_ports()[0];
        format!("postgresql://{role}@127.0.0.1:{port}/{dbname}")
    }

    fn drop_roles(&self) {
        let mut db = connect_db();
        for role in [&self.relay, &self.pruner] {
            let exists = db
                .query_opt("SELECT 1 FROM pg_roles WHERE rolname = $1", &[role])
                .unwrap()
                .is_some();
            if exists {
                db.batch_execute(&format!("DROP OWNED BY \"{role}\"; DROP ROLE \"{role}\""))
                    .unwrap();
            }
        }
    }
}

impl Drop for Roles {
    fn drop(&mut self) {
        self.drop_roles();
    }
}

#[test]
fn relay_role_polls_requeues_and_reads_status() {
    let mut fx = Fixture::new("priv_relay");
    let roles = Roles::create(&mut fx, "relay");
    let url = Roles::url(&roles.relay);
    let env = [("DATABASE_URL", url.as_str())];
    fx.insert("e", 5);
    fx.execute("UPDATE {table} SET attempts = 10 WHERE event_id = 'e-5'");

    let run = fx.run_with(&env, &["--json"]);
    assert_eq!((run.code, run.field("published")), (0, 4), "{}", run.stderr);
    assert_eq!(fx.published_count(), 4);
    assert_eq!(fx.messages().len(), 4);

    let run = fx.run_with(&env, &["requeue", "--dead"]);
    assert_eq!((run.code, run.stdout.as_str()), (0, "requeued 1 event\n"));

    let run = fx.run_with(&env, &["status", "--json"]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert_eq!(run.summary()["pending"], 1);
}

#[test]
fn prune_without_delete_exits_78_naming_the_privilege() {
    let mut fx = Fixture::new("priv_no_delete");
    let roles = Roles::create(&mut fx, "nodelete");
    fx.insert("e", 3);
    fx.execute("UPDATE {table} SET published_at = now() - interval '8 days'");
    let url = Roles::url(&roles.relay);
    let run = fx.run_with(&[("DATABASE_URL", &url)], &["prune", "--older-than", "7d"]);
    assert_eq!(run.code, 78, "{}", run.stderr);
    assert_eq!(run.stdout, "");
    assert_eq!(run.stderr.lines().count(), 1, "{}", run.stderr);
    assert!(
        run.stderr.starts_with(&format!(
            "outbox-poll: error: prune needs the DELETE privilege on table {}",
            fx.table
        )),
        "{}",
        run.stderr
    );
    assert_eq!(fx.rows().len(), 3, "nothing was deleted");
}

#[test]
fn pruner_role_prunes() {
    let mut fx = Fixture::new("priv_pruner");
    let roles = Roles::create(&mut fx, "pruner");
    fx.insert("e", 3);
    fx.execute("UPDATE {table} SET published_at = now() - interval '8 days' WHERE id < 3");
    let url = Roles::url(&roles.pruner);
    let run = fx.run_with(&[("DATABASE_URL", &url)], &["prune", "--older-than", "7d"]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert_eq!(run.stdout, "deleted 2 published events older than 7d\n");
    assert_eq!(fx.rows().len(), 1);
}

#[test]
fn delete_mode_without_the_delete_grant_exits_78_before_publishing() {
    let mut fx = Fixture::new("priv_delete_mode");
    let roles = Roles::create(&mut fx, "deletemode");
    fx.insert("e", 3);
    let url = Roles::url(&roles.relay);
    let run = fx.run_with(&[("DATABASE_URL", &url)], &["--on-publish", "delete"]);
    assert_eq!(run.code, 78, "{}", run.stderr);
    assert_one_clear_line(&run);
    assert!(
        run.stderr.starts_with(&format!(
            "outbox-poll: error: --on-publish delete needs the DELETE privilege on table {}",
            fx.table
        )),
        "{}",
        run.stderr
    );
    assert!(fx.messages().is_empty(), "nothing was published");
    assert_eq!((fx.rows().len(), fx.published_count()), (3, 0));
    // A dry run deletes nothing, and needs no DELETE.
    let args = ["--on-publish", "delete", "--dry-run"];
    let run = fx.run_with(&[("DATABASE_URL", &url)], &args);
    assert_eq!(run.code, 0, "{}", run.stderr);
}

#[test]
fn the_relay_role_with_the_delete_grant_deletes_what_it_published() {
    let mut fx = Fixture::new("priv_delete_grant");
    let roles = Roles::create(&mut fx, "deletegrant");
    // The grant the example names for --on-publish delete.
    fx.execute(&format!("GRANT DELETE ON {{table}} TO \"{}\"", roles.relay));
    fx.insert("e", 3);
    let url = Roles::url(&roles.relay);
    let env = [
        ("DATABASE_URL", url.as_str()),
        ("OUTBOX_ON_PUBLISH", "delete"),
    ];
    let run = fx.run_with(&env, &["--json"]);
    assert_eq!((run.code, run.field("published")), (0, 3), "{}", run.stderr);
    assert!(fx.rows().is_empty());
    assert_eq!(fx.messages().len(), 3);
}

#[test]
fn a_pruner_that_does_not_own_a_partitioned_table_prunes_row_by_row() {
    let mut fx = Fixture::partitioned("priv_parts_pruner");
    let roles = Roles::create(&mut fx, "partspruner");
    crate::partitions::aged_partitions(&mut fx);
    let before = partition_count(&mut fx);
    let url = Roles::url(&roles.pruner);
    let run = fx.run_with(
        &[("DATABASE_URL", &url)],
        &["prune", "--older-than", "7d", "--json"],
    );
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert_eq!(
        run.summary(),
        serde_json::json!({"published": 6, "dead": null, "dry_run": false,
                           "partitions_dropped": []})
    );
    assert_eq!(partition_count(&mut fx), before, "no partition was dropped");
    assert_eq!(fx.rows().len(), 4);
}

fn partition_count(fx: &mut Fixture) -> i64 {
    let sql = format!(
        "SELECT count(*) FROM pg_inherits WHERE inhparent = '{}'::regclass",
        fx.quoted_table()
    );
    fx.db.query_one(&sql, &[]).unwrap().get(0)
}

/// Drains 50 events in batches of 10 as a relay role allowed `limit`
/// connections: fewer than the 4 batches in flight a drain of such small
/// batches wants. Returns the run's stderr, once every event is checked
/// published and delivered once.
fn drain_under_a_connection_limit(test: &str, limit: u32) -> String {
    let mut fx = Fixture::new(test);
    let roles = Roles::create(&mut fx, test);
    fx.execute(&format!(
        "ALTER ROLE \"{}\" CONNECTION LIMIT {limit}",
        roles.relay
    ));
    fx.insert("e", 50);
    let url = Roles::url(&roles.relay);
    let args = ["--drain", "--batch-size", "10", "--json"];
    let run = fx.run_with(&[("DATABASE_URL", &url)], &args);
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert_eq!((run.field("published"), run.field("batches")), (50, 5));
    assert_eq!(fx.published_count(), 50);
    assert_eq!(fx.messages().len(), 50);
    run.stderr
}

#[test]
fn a_drain_under_a_one_connection_role_drains_one_batch_at_a_time() {
    let stderr = drain_under_a_connection_limit("priv_one_connection", 1);
    assert!(stderr.contains("draining one batch at a time"), "{stderr}");
}

#[test]
fn a_drain_under_a_two_connection_role_says_it_keeps_two_batches_in_flight() {
    let stderr = drain_under_a_connection_limit("priv_two_connections", 2);
    assert!(
        stderr.contains("draining with 2 batches in flight"),
        "{stderr}"
    );
}
