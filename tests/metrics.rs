//! --metrics-file: Prometheus gauges after a poll run, written atomically.

use std::collections::HashMap;
use std::path::PathBuf;

use crate::common::Fixture;
use crate::common::scratch::Scratch;

/// The directory of a test's metrics file, removed at the end.
struct Dir(Scratch);

impl Dir {
    fn new(test: &str) -> Dir {
        Dir(Scratch::new(test))
    }

    fn file(&self) -> PathBuf {
        self.0.path().join("outbox.prom")
    }

    fn names(&self) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(self.0.path())
            .unwrap()
            .map(|entry| entry.unwrap().file_name().into_string().unwrap())
            .collect();
        names.sort();
        names
    }
}

/// Gauge name (without the outbox_poll_ prefix) to value, after checking
/// every sample has HELP and TYPE lines and the table label.
fn gauges(text: &str, table: &str) -> HashMap<String, f64> {
    let mut values = HashMap::new();
    let label = format!("{{table=\"{table}\"}}");
    for line in text.lines().filter(|line| !line.starts_with('#')) {
        let (series, value) = line.split_once(' ').unwrap();
        let name = series
            .strip_suffix(&label)
            .unwrap_or_else(|| panic!("{line}"));
        assert!(
            text.contains(&format!("# HELP {name} ")),
            "no HELP for {name}"
        );
        assert!(
            text.contains(&format!("# TYPE {name} gauge\n")),
            "no TYPE for {name}"
        );
        let short = name.strip_prefix("outbox_poll_").unwrap().to_string();
        values.insert(short, value.parse().unwrap());
    }
    values
}

#[test]
fn metrics_file_has_the_runs_figures_and_the_backlog() {
    let mut fx = Fixture::new("metrics");
    let dir = Dir::new("metrics");
    fx.insert("e", 5);
    fx.execute("UPDATE {table} SET attempts = 10 WHERE event_id = 'e-5'");
    let path = dir.file();
    let before = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    let run = fx.run(&[
        "--batch-size",
        "3",
        "--metrics-file",
        path.to_str().unwrap(),
    ]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert_eq!(dir.names(), ["outbox.prom"], "no temporary file is left");
    let values = gauges(&std::fs::read_to_string(&path).unwrap(), &fx.table);
    let exact: Vec<(&str, f64)> = [
        "last_run_exit_code",
        "last_run_batches",
        "last_run_claimed",
        "last_run_published",
        "last_run_failed",
        "last_run_unknown",
        "pending",
        "due",
        "retrying",
        "dead",
        "held_back_keys",
    ]
    .into_iter()
    .map(|name| (name, values[name]))
    .collect();
    assert_eq!(
        exact,
        [
            ("last_run_exit_code", 0.0),
            ("last_run_batches", 1.0),
            ("last_run_claimed", 3.0),
            ("last_run_published", 3.0),
            ("last_run_failed", 0.0),
            ("last_run_unknown", 0.0),
            ("pending", 1.0),
            ("due", 1.0),
            ("retrying", 0.0),
            ("dead", 1.0),
            ("held_back_keys", 0.0),
        ]
    );
    // Whole seconds since the insert: the run's own time, on a busy machine.
    let age = values["oldest_pending_age_seconds"];
    assert!((0.0..10.0).contains(&age), "{age}");
    let due_age = values["oldest_due_age_seconds"];
    assert!((0.0..10.0).contains(&due_age), "{due_age}");
    let ended = values["last_run_timestamp_seconds"];
    assert!(ended >= before.floor() && ended < before + 60.0, "{ended}");
    assert!(values["last_run_duration_seconds"] < 60.0);
    // When the server counted the rows is its business (NaN: not yet).
    let ratio = values["dead_tuple_ratio"];
    assert!(ratio.is_nan() || (0.0..=1.0).contains(&ratio), "{ratio}");
    assert_eq!(values.len(), 18);
}

#[test]
fn metrics_file_exports_the_dead_tuple_ratio() {
    let mut fx = Fixture::new("metrics_dead_tuples");
    let dir = Dir::new("metrics_dead_tuples");
    fx.insert("e", 3);
    // Every row marked by hand: three dead versions beside three live
    // ones, and nothing due for the run.
    fx.execute("UPDATE {table} SET published_at = now()");
    fx.flush_stats();
    let path = dir.file();
    let run = fx.run(&["--metrics-file", path.to_str().unwrap()]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    let values = gauges(&std::fs::read_to_string(&path).unwrap(), &fx.table);
    assert_eq!(values["dead_tuple_ratio"], 0.5);
}

#[test]
fn metrics_file_env_var_and_a_failed_runs_exit_code() {
    let mut fx = Fixture::new("metrics_env");
    let dir = Dir::new("metrics_env");
    fx.insert("e", 1);
    let path = dir.file();
    // A missing exchange is a configuration problem: exit 78, and the
    // metrics say so.
    let run = fx.run_with(
        &[("OUTBOX_METRICS_FILE", path.to_str().unwrap())],
        &["--exchange", "no_such_exchange_for_metrics"],
    );
    assert_eq!(run.code, 78, "{}", run.stderr);
    let values = gauges(&std::fs::read_to_string(&path).unwrap(), &fx.table);
    assert_eq!(
        (
            values["last_run_exit_code"],
            values["last_run_published"],
            values["pending"]
        ),
        (78.0, 0.0, 1.0)
    );
}

#[test]
fn metrics_file_replaces_the_previous_one() {
    let mut fx = Fixture::new("metrics_replace");
    let dir = Dir::new("metrics_replace");
    let path = dir.file();
    std::fs::write(&path, "stale\n").unwrap();
    fx.insert("e", 2);
    let run = fx.run(&["--metrics-file", path.to_str().unwrap()]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    let values = gauges(&std::fs::read_to_string(&path).unwrap(), &fx.table);
    assert_eq!(
        (values["last_run_published"], values["pending"]),
        (2.0, 0.0)
    );
}

#[test]
fn unwritable_metrics_file_exits_78_after_publishing() {
    let mut fx = Fixture::new("metrics_unwritable");
    fx.insert("e", 2);
    let run = fx.run(&["--metrics-file", "/nonexistent-dir/outbox.prom", "--json"]);
    assert_eq!(run.code, 78, "{}", run.stderr);
    // The cause names the temporary it could not create beside the file.
    assert!(
        run.stderr.starts_with(
            "outbox-poll: error: cannot write the metrics file /nonexistent-dir/outbox.prom: \
             check that its directory exists and is writable: No such file or directory (os error 2) \
             at path \"/nonexistent-dir/.outbox.prom."
        ),
        "{}",
        run.stderr
    );
    assert_eq!(run.stderr.lines().count(), 1, "{}", run.stderr);
    assert_eq!(run.field("published"), 2, "the events were still published");
    assert_eq!(run.field("exit_code"), 78);
    assert_eq!(fx.published_count(), 2);
}

#[test]
fn concurrent_runs_sharing_one_metrics_file_all_succeed_and_it_is_always_whole() {
    let fx = Fixture::new("metrics_concurrent");
    let dir = Dir::new("metrics_concurrent");
    let path = dir.file();
    let done = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|scope| {
        // A reader like node_exporter's: every complete read is a whole file.
        let reader = scope.spawn(|| {
            let mut reads = 0;
            while !done.load(std::sync::atomic::Ordering::SeqCst) {
                if let Ok(text) = std::fs::read_to_string(&path) {
                    assert_eq!(gauges(&text, &fx.table).len(), 18, "{text}");
                    reads += 1;
                }
            }
            reads
        });
        let mut failures = Vec::new();
        for _ in 0..4 {
            let runs: Vec<_> = (0..8)
                .map(|_| {
                    fx.command()
                        .args(["--metrics-file", path.to_str().unwrap()])
                        .stderr(std::process::Stdio::piped())
                        .spawn()
                        .unwrap()
                })
                .collect();
            for run in runs {
                let output = run.wait_with_output().unwrap();
                if output.status.code() != Some(0) {
                    failures.push(String::from_utf8_lossy(&output.stderr).into_owned());
                }
            }
        }
        // Stop the reader before asserting, so a failure cannot leave it running.
        done.store(true, std::sync::atomic::Ordering::SeqCst);
        assert!(reader.join().unwrap() > 0, "the file was read");
        assert_eq!(failures, Vec::<String>::new(), "every run exits 0");
    });
    assert_eq!(dir.names(), ["outbox.prom"], "no temporary file is left");
}

#[test]
fn metrics_file_has_the_oldest_due_age_and_the_held_back_keys() {
    let mut fx = Fixture::new("metrics_due_keys");
    let dir = Dir::new("metrics_due_keys");
    fx.insert("e", 3);
    fx.execute(
        "UPDATE {table} SET created_at = now() - interval '1 hour',
                available_at = now() + interval '1 hour', attempts = 1, ordering_key = 'k'
           WHERE event_id IN ('e-1', 'e-2');
         UPDATE {table} SET attempts = 0 WHERE event_id = 'e-2';",
    );
    let path = dir.file();
    let run = fx.run(&["--metrics-file", path.to_str().unwrap()]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    let values = gauges(&std::fs::read_to_string(&path).unwrap(), &fx.table);
    // e-1, an hour old, backs off and holds e-2 back; e-3 went: none is due.
    assert_eq!(values["held_back_keys"], 1.0);
    assert_eq!(values["oldest_due_age_seconds"], 0.0);
    assert!(values["oldest_pending_age_seconds"] >= 3600.0, "{values:?}");
}
