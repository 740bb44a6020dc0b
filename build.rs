//! Sets OUTBOX_POLL_VERSION to `0.1.0 (abc1234)` in a git checkout, and to
//! the bare package version anywhere else (a crate tarball, no git).

use std::process::Command;

fn git(args: &[&str]) -> Option<String> {
    let output = Command::new("git").args(args).output().ok()?;
    if !output.status.success() {
        return None;
    }
    let text = String::from_utf8(output.stdout).ok()?.trim().to_string();
    (!text.is_empty()).then_some(text)
}

fn main() {
    let version = env!("CARGO_PKG_VERSION");
    let full = match git(&["rev-parse", "--short", "HEAD"]) {
        Some(commit) => format!("{version} ({commit})"),
        None => version.to_string(),
    };
    println!("cargo:rustc-env=OUTBOX_POLL_VERSION={full}");
    // Rebuild when HEAD moves: a commit, a checkout. Paths from git itself,
    // since a worktree's .git is a file pointing elsewhere.
    let mut watched = vec!["HEAD".to_string(), "packed-refs".to_string()];
    if let Some(reference) = git(&["symbolic-ref", "-q", "HEAD"]) {
        // Its directory too: after `git gc` packs the ref, the next commit
        // writes a new loose file there that a watch on the old one misses.
        if let Some((directory, _)) = reference.rsplit_once('/') {
            watched.push(directory.to_string());
        }
        watched.push(reference);
    }
    let mut any = false;
    for path in watched {
        // A missing file would make cargo rerun this on every build.
        if let Some(path) = git(&["rev-parse", "--git-path", &path])
            && std::path::Path::new(&path).exists()
        {
            println!("cargo:rerun-if-changed={path}");
            any = true;
        }
    }
    if !any {
        println!("cargo:rerun-if-changed=build.rs");
    }
}
