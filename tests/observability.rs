//! What deploy/ ships for watching the relay: the Prometheus alert rules
//! (checked and unit-tested with promtool, which scripts/setup.sh installs).

use std::path::Path;
use std::process::{Command, Output};

fn prometheus_dir() -> &'static Path {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/deploy/prometheus"))
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
