//! What deploy/ ships for watching the relay: the Prometheus alert rules
//! (checked and unit-tested with promtool, which scripts/setup.sh installs)
//! and the Grafana dashboard, both over only the gauges the metrics file
//! holds, so that renaming one fails here.

use std::collections::BTreeSet;
use std::path::Path;
use std::process::{Command, Output};

use outbox_poll::report::metrics::{self, Backlog, Run};
use outbox_poll::report::totals::Totals;
use outbox_poll::sql::figures::Figures;
use yaml_rust2::YamlLoader;

fn prometheus_dir() -> &'static Path {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/deploy/prometheus"))
}

fn read(path: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(path);
    std::fs::read_to_string(&path).unwrap_or_else(|error| panic!("{}: {error}", path.display()))
}

/// Every metric a metrics file can hold: a file rendered by the program's
/// own metrics module, with the backlog read (all gauges present).
fn written_metrics() -> BTreeSet<String> {
    let run = Run {
        ended: 0.0,
        code: 0,
        duration_s: 0.0,
        totals: Totals::default(),
    };
    let backlog = Backlog {
        figures: Figures::default(),
        dead_tuple_ratio: Some(0.0),
        held_back_keys: Some(0),
    };
    metrics::render("app.outbox", &run, Some(&backlog))
        .lines()
        .filter_map(|line| line.strip_prefix("# TYPE "))
        .map(|rest| rest.split(' ').next().unwrap().to_string())
        .collect()
}

/// The metric names (outbox_poll_...) a PromQL query mentions.
fn metric_names(query: &str) -> Vec<&str> {
    query
        .match_indices("outbox_poll_")
        .map(|(start, _)| {
            let rest = &query[start..];
            let end = rest
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .unwrap_or(rest.len());
            &rest[..end]
        })
        .collect()
}

/// Panics unless `query` names at least one metric and only ones the
/// program writes.
fn assert_names_written_metrics(context: &str, query: &str, written: &BTreeSet<String>) {
    let names = metric_names(query);
    assert!(
        !names.is_empty(),
        "{context}: {query} names no outbox-poll metric"
    );
    for name in names {
        assert!(
            written.contains(name),
            "{context}: {query}: the metrics file has no {name} (it has {written:?})"
        );
    }
}

/// promtool run in deploy/prometheus, or None (with a line on stderr) where
/// it is not installed.
fn promtool(args: &[&str]) -> Option<Output> {
    match Command::new("promtool")
        .args(args)
        .current_dir(prometheus_dir())
        .output()
    {
        Ok(output) => Some(output),
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => {
            eprintln!(
                "skipped: promtool is not installed (scripts/setup.sh installs it: apt install prometheus)"
            );
            None
        }
        Err(error) => panic!("running promtool: {error}"),
    }
}

fn assert_success(output: &Output) {
    assert!(
        output.status.success(),
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}

#[test]
fn the_alert_rules_pass_promtool_check_rules() {
    let Some(output) = promtool(&["check", "rules", "alerts.yml"]) else {
        return;
    };
    assert_success(&output);
}

#[test]
fn the_alert_rules_pass_their_unit_tests_over_synthetic_series() {
    let Some(output) = promtool(&["test", "rules", "alerts.test.yml"]) else {
        return;
    };
    assert_success(&output);
}

#[test]
fn every_alert_names_only_gauges_the_metrics_file_holds() {
    let written = written_metrics();
    let rules = YamlLoader::load_from_str(&read("deploy/prometheus/alerts.yml")).unwrap();
    let mut alerts = 0;
    for group in rules[0]["groups"].as_vec().unwrap() {
        for rule in group["rules"].as_vec().unwrap() {
            let name = rule["alert"].as_str().unwrap();
            assert_names_written_metrics(name, rule["expr"].as_str().unwrap(), &written);
            alerts += 1;
        }
    }
    assert!(alerts > 0, "no alert in alerts.yml");
}

fn dashboard() -> serde_json::Value {
    serde_json::from_str(&read("deploy/grafana/outbox-poll.json")).expect("the dashboard is JSON")
}

#[test]
fn every_dashboard_query_names_gauges_the_metrics_file_holds_per_table() {
    let written = written_metrics();
    let dashboard = dashboard();
    let panels = dashboard["panels"].as_array().unwrap();
    assert!(!panels.is_empty(), "a dashboard without panels");
    for panel in panels {
        let title = panel["title"].as_str().unwrap();
        let targets = panel["targets"].as_array().unwrap();
        assert!(!targets.is_empty(), "{title}: no query");
        for target in targets {
            let expr = target["expr"].as_str().unwrap();
            assert_names_written_metrics(title, expr, &written);
            for name in metric_names(expr) {
                assert!(
                    expr.contains(&format!("{name}{{table=~\"$table\"}}")),
                    "{title}: {expr}: {name} is not filtered by the table variable"
                );
            }
        }
    }
}

#[test]
fn the_dashboards_table_variable_lists_the_table_label_of_a_written_gauge() {
    let written = written_metrics();
    let dashboard = dashboard();
    let variables = dashboard["templating"]["list"].as_array().unwrap();
    let table = variables
        .iter()
        .find(|variable| variable["name"] == "table")
        .expect("a variable named table");
    let query = table["query"]["query"].as_str().unwrap();
    let metric = query
        .strip_prefix("label_values(")
        .and_then(|rest| rest.strip_suffix(", table)"))
        .unwrap_or_else(|| panic!("{query}: not label_values(METRIC, table)"));
    assert!(
        written.contains(metric),
        "{query}: the metrics file has no {metric}"
    );
    assert!(
        metrics::render(
            "app.outbox",
            &Run {
                ended: 0.0,
                code: 0,
                duration_s: 0.0,
                totals: Totals::default()
            },
            None
        )
        .contains(&format!("{metric}{{table=\"app.outbox\"}}")),
        "{metric} is not labelled with the table, or not written when the backlog is unknown"
    );
}
