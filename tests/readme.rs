//! The README's first screen is what a newcomer runs: its test command is
//! what CI runs, so a green CI means a new user's test run passes too.

use std::path::Path;

fn read(path: &str) -> String {
    std::fs::read_to_string(root().join(path))
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

/// The documentation whose links and anchors are checked: what a user or
/// a contributor reads, on GitHub or in the mdBook.
fn documents() -> Vec<String> {
    let mut documents: Vec<String> = [
        "README.md",
        "ARCHITECTURE.md",
        "CONTRIBUTING.md",
        "CHANGELOG.md",
        "bench/README.md",
    ]
    .map(String::from)
    .to_vec();
    for dir in ["docs/src", "bench/runs"] {
        let mut pages: Vec<String> = std::fs::read_dir(root().join(dir))
            .unwrap_or_else(|error| panic!("reading {dir}: {error}"))
            .map(|entry| entry.expect("a directory entry").file_name())
            .map(|name| name.to_string_lossy().into_owned())
            .filter(|name| name.ends_with(".md"))
            .map(|name| format!("{dir}/{name}"))
            .collect();
        pages.sort();
        documents.extend(pages);
    }
    documents
}

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// The lines of a Markdown text outside its fenced code blocks, inline
/// code spans blanked (a link or `#` in code is not one).
fn prose(text: &str) -> Vec<String> {
    let mut fenced = false;
    let mut lines = Vec::new();
    for line in text.lines() {
        let trimmed = line.trim_start();
        if trimmed.starts_with("```") || trimmed.starts_with("~~~") {
            fenced = !fenced;
            continue;
        }
        if !fenced {
            let spans: Vec<&str> = line.split('`').collect();
            let outside: Vec<&str> = spans.iter().step_by(2).copied().collect();
            lines.push(outside.join(" "));
        }
    }
    lines
}

/// The targets of the inline links (and images) of a Markdown text.
fn links(text: &str) -> Vec<String> {
    let mut targets = Vec::new();
    for line in prose(text) {
        let mut rest = line.as_str();
        while let Some(start) = rest.find("](") {
            rest = &rest[start + 2..];
            let end = rest.find(')').unwrap_or(rest.len());
            let target = rest[..end].split_whitespace().next().unwrap_or("");
            targets.push(target.to_string());
            rest = &rest[end..];
        }
    }
    targets
}

/// A heading's anchor as GitHub and mdBook make it: lower case, letters,
/// digits, `-` and `_` kept, white space turned into `-`, the rest dropped.
fn slug(heading: &str) -> String {
    heading
        .trim()
        .chars()
        .filter_map(|c| match c {
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c.to_lowercase().next()?),
            c if c.is_whitespace() => Some('-'),
            _ => None,
        })
        .collect()
}

/// Every anchor of a Markdown page: its headings' slugs, a repeated one
/// numbered as both renderers number it (`name-1`, `name-2`).
fn anchors(text: &str) -> Vec<String> {
    let mut counts: std::collections::HashMap<String, usize> = Default::default();
    let mut anchors = Vec::new();
    let mut fenced = false;
    for line in text.lines() {
        if line.trim_start().starts_with("```") || line.trim_start().starts_with("~~~") {
            fenced = !fenced;
            continue;
        }
        let hashes = line.chars().take_while(|&c| c == '#').count();
        if fenced || hashes == 0 || hashes > 6 || !line[hashes..].starts_with(' ') {
            continue;
        }
        let base = slug(&line[hashes..].replace('`', ""));
        let seen = counts.entry(base.clone()).or_insert(0);
        anchors.push(match *seen {
            0 => base,
            n => format!("{base}-{n}"),
        });
        *seen += 1;
    }
    anchors
}

/// The relative links of the documentation, each as (page, target), the
/// target's file resolved from the page's directory.
fn relative_links() -> Vec<(String, String)> {
    let mut found = Vec::new();
    for page in documents() {
        for target in links(&read(&page)) {
            let external = ["http://", "https://", "mailto:"]
                .iter()
                .any(|scheme| target.starts_with(scheme));
            if !external {
                found.push((page.clone(), target));
            }
        }
    }
    found
}

/// The file a link names, relative to the checkout's root (the page's own
/// for a bare `#anchor`).
fn linked_file(page: &str, target: &str) -> std::path::PathBuf {
    let file = target.split('#').next().unwrap_or("");
    let dir = Path::new(page).parent().unwrap_or(Path::new(""));
    match file {
        "" => Path::new(page).to_path_buf(),
        file => dir.join(file),
    }
}

#[test]
fn every_relative_link_in_the_docs_names_a_file_that_exists() {
    let broken: Vec<String> = relative_links()
        .into_iter()
        .filter(|(page, target)| !root().join(linked_file(page, target)).exists())
        .map(|(page, target)| format!("{page}: ({target})"))
        .collect();
    assert!(
        broken.is_empty(),
        "links to no file:\n{}",
        broken.join("\n")
    );
}

#[test]
fn every_anchor_in_the_docs_names_a_heading_of_the_page_it_links_to() {
    let broken: Vec<String> = relative_links()
        .into_iter()
        .filter_map(|(page, target)| {
            let (_, anchor) = target.split_once('#')?;
            let file = linked_file(&page, &target);
            let text = std::fs::read_to_string(root().join(&file)).ok()?;
            let known = file.extension().is_some_and(|ext| ext == "md");
            (known && !anchors(&text).iter().any(|a| a == anchor))
                .then(|| format!("{page}: ({target})"))
        })
        .collect();
    assert!(
        broken.is_empty(),
        "anchors that name no heading:\n{}",
        broken.join("\n")
    );
}

#[test]
fn every_page_of_the_book_is_in_its_summary() {
    // mdBook renders only what SUMMARY.md lists; a page left out is a
    // page nobody finds. (The links check covers the other way round.)
    let summary = read("docs/src/SUMMARY.md");
    let listed = links(&summary);
    let missing: Vec<String> = documents()
        .into_iter()
        .filter_map(|page| page.strip_prefix("docs/src/").map(String::from))
        .filter(|page| page != "SUMMARY.md" && !listed.contains(page))
        .collect();
    assert!(
        missing.is_empty(),
        "pages not in docs/src/SUMMARY.md: {missing:?}"
    );
}

/// The shell blocks the docs mark runnable: a `<!-- runnable ... -->`
/// comment on the line before a ```sh fence. Each as (page, block).
fn runnable_blocks() -> Vec<(String, String)> {
    let mut blocks = Vec::new();
    for page in documents() {
        let text = read(&page);
        let mut lines = text.lines();
        while let Some(line) = lines.next() {
            if !line.starts_with("<!-- runnable") {
                continue;
            }
            assert_eq!(
                lines.next(),
                Some("```sh"),
                "{page}: a runnable marker must come right before a ```sh block"
            );
            let block: Vec<&str> = lines.by_ref().take_while(|l| *l != "```").collect();
            blocks.push((page.clone(), block.join("\n")));
        }
    }
    blocks
}

#[test]
fn the_docs_runnable_shell_blocks_succeed_against_the_test_servers() {
    let blocks = runnable_blocks();
    assert!(
        !blocks.is_empty(),
        "no block of the docs is marked runnable"
    );
    for (n, (page, block)) in blocks.iter().enumerate() {
        // Each block in a scratch schema, exchange and queue of its own.
        let fx = crate::common::Fixture::bare(&format!("readme_block_{n}"));
        let output = fx.shell(block).output().expect("running bash");
        assert!(
            output.status.success(),
            "a runnable block of {page} failed ({}):\n{block}\n--- stdout\n{}\n--- stderr\n{}",
            output.status,
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
    }
}

#[test]
fn every_test_architecture_md_cites_exists() {
    // An invariant's "tested by" must name a real test: `area::name` is the
    // function `name` in tests/area.rs.
    let architecture = read("ARCHITECTURE.md");
    let cited: Vec<&str> = architecture
        .split('`')
        .skip(1)
        .step_by(2)
        .filter(|span| {
            span.split_once("::").is_some_and(|(area, name)| {
                !name.is_empty()
                    && root().join(format!("tests/{area}.rs")).exists()
                    && name
                        .chars()
                        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
            })
        })
        .collect();
    assert!(
        cited.len() >= 10,
        "ARCHITECTURE.md cites {} tests",
        cited.len()
    );
    let missing: Vec<&&str> = cited
        .iter()
        .filter(|span| {
            let (area, name) = span.split_once("::").expect("area::name");
            !read(&format!("tests/{area}.rs")).contains(&format!("fn {name}()"))
        })
        .collect();
    assert!(
        missing.is_empty(),
        "ARCHITECTURE.md cites tests that do not exist: {missing:?}"
    );
}
