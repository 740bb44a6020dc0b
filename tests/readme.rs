//! The README's test commands are what CI runs: a green CI then means a new
//! user's `cargo test` passes too.

use std::path::Path;

/// The command lines of the README's "Running the tests" block, comments
/// and padding dropped.
fn readme_test_commands() -> Vec<String> {
    let readme = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("README.md"))
        .expect("reading README.md");
    let section = readme
        .split("### Running the tests")
        .nth(1)
        .expect("README.md has a 'Running the tests' section");
    let block = section
        .split("```sh\n")
        .nth(1)
        .and_then(|rest| rest.split("```").next())
        .expect("the section opens with a sh block");
    block
        .lines()
        .map(command)
        .filter(|line| !line.is_empty())
        .collect()
}

fn command(line: &str) -> String {
    line.split(" #").next().unwrap_or("").trim().to_string()
}

/// The shell's own set-up in .ci/run, which is not a test command: strict
/// mode, the checkout's root, and the PATH of a Rust that tests/setup.sh
/// has just installed (the README says to do the same).
fn is_preamble(line: &str) -> bool {
    line.starts_with("set ") || line.starts_with("cd ") || line.contains("/.cargo/env")
}

#[test]
fn ci_runs_exactly_the_readme_test_commands_ending_with_cargo_test() {
    let ci = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join(".ci/run"))
        .expect("reading .ci/run");
    let ran: Vec<String> = ci
        .lines()
        .filter(|line| !line.starts_with('#'))
        .map(command)
        .filter(|line| !line.is_empty() && !is_preamble(line))
        .collect();
    let readme = readme_test_commands();
    assert_eq!(
        ran, readme,
        ".ci/run must run README's test commands and nothing else"
    );
    assert_eq!(readme.last().map(String::as_str), Some("cargo test"));
}
