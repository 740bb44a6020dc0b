//! The README's first screen is what a newcomer runs: its test command is
//! what CI runs, so a green CI means a new user's test run passes too.

use std::path::Path;

fn read(path: &str) -> String {
    std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join(path))
        .unwrap_or_else(|error| panic!("reading {path}: {error}"))
}

/// The command lines of a shell block or script, comments and padding
/// dropped.
fn commands(text: &str) -> Vec<String> {
    text.lines()
        .filter(|line| !line.trim_start().starts_with('#'))
        .map(|line| line.split(" #").next().unwrap_or("").trim().to_string())
        .filter(|line| !line.is_empty())
        .collect()
}

/// The first sh block of the README's "Running the tests" section.
fn readme_test_block() -> String {
    let readme = read("README.md");
    let section = readme
        .split("\n## Running the tests\n")
        .nth(1)
        .expect("README.md has a 'Running the tests' section");
    section
        .split("```sh\n")
        .nth(1)
        .and_then(|rest| rest.split("```").next())
        .expect("the section opens with a sh block")
        .to_string()
}

/// The shell's own set-up in .ci/run, which is not a test command: strict
/// mode and the checkout's root.
fn is_preamble(line: &str) -> bool {
    line.starts_with("set ") || line.starts_with("cd ")
}

#[test]
fn ci_runs_exactly_the_readme_test_command() {
    let ran: Vec<String> = commands(&read(".ci/run"))
        .into_iter()
        .filter(|line| !is_preamble(line))
        .collect();
    assert_eq!(
        ran,
        commands(&readme_test_block()),
        ".ci/run must run the README's test command and nothing else"
    );
}

#[test]
fn the_test_script_ends_with_cargo_test() {
    // Its closing lines are then cargo test's own: the run's verdict.
    let script = commands(&read("scripts/test.sh"));
    assert_eq!(script.last().map(String::as_str), Some("cargo test"));
}

/// What a newcomer sees without scrolling.
const FIRST_SCREEN: usize = 60;

#[test]
fn install_and_the_test_and_demo_commands_are_on_the_readme_first_screen() {
    let readme = read("README.md");
    let first_screen: Vec<&str> = readme.lines().take(FIRST_SCREEN).collect();
    for wanted in [
        "## Install",
        "cargo install --locked --path .",
        "scripts/test.sh",
        "scripts/demo.sh",
    ] {
        assert!(
            first_screen.iter().any(|line| line.starts_with(wanted)),
            "no line starting with {wanted:?} in the README's first {FIRST_SCREEN} lines"
        );
    }
}
