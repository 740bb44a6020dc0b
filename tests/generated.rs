//! What is generated from the clap definition: --version with the commit,
//! shell completions and the manual page. No server is needed.

use std::process::Command;

fn run(args: &[&str]) -> (i32, String, String) {
    let output = Command::new(crate::common::BIN)
        .args(args)
        .output()
        .unwrap();
    (
        output.status.code().unwrap_or(-1),
        String::from_utf8(output.stdout).unwrap(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

#[test]
fn version_names_the_git_commit() {
    let version = env!("CARGO_PKG_VERSION");
    let commit = Command::new("git")
        .args(["rev-parse", "--short", "HEAD"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .ok()
        .filter(|output| output.status.success())
        .map(|output| String::from_utf8(output.stdout).unwrap().trim().to_string());
    let expected = match commit {
        Some(commit) => format!("outbox-poll {version} ({commit})\n"),
        None => format!("outbox-poll {version}\n"), // not built from a git checkout
    };
    assert_eq!(run(&["--version"]), (0, expected, String::new()));
}

#[test]
fn bash_completions_cover_the_subcommands() {
    let (code, stdout, stderr) = run(&["completions", "bash"]);
    assert_eq!(code, 0, "{stderr}");
    assert!(stdout.contains("complete -F _outbox__poll"), "{stdout}");
    for word in [
        "status",
        "requeue",
        "prune",
        "--older-than",
        "--fail-if-dead",
    ] {
        assert!(stdout.contains(word), "no {word} in the completions");
    }
}

#[test]
fn completions_for_an_unknown_shell_are_a_usage_error() {
    assert_eq!(run(&["completions", "cmd.exe"]).0, 2);
}

#[test]
fn man_page_is_roff_for_outbox_poll() {
    let (code, stdout, stderr) = run(&["man"]);
    assert_eq!(code, 0, "{stderr}");
    assert!(stdout.starts_with(".ie \\n(.g .ds Aq"), "{}", &stdout[..80]);
    assert!(stdout.contains(".TH outbox-poll 1"), "{stdout}");
    assert!(
        stdout.contains(env!("CARGO_PKG_VERSION")),
        "the page names the version"
    );
    assert!(stdout.contains("requeue"), "{stdout}");
}
