//! What the tests of every part share: a file system of their own, the
//! account they run as, and ways to resolve and assert.

use std::collections::HashMap;
use std::io;
use std::path::{Path, PathBuf};

use anyhow::Result;

use super::*;

pub(super) const HOME: &str = "/home/relay";

/// A file system of our own: path → (text, permission bits, owner).
#[derive(Default)]
pub(super) struct FakeFiles(HashMap<PathBuf, (String, u32, u32)>);

impl FakeFiles {
    /// A file of ours (uid 1000, the account's).
    pub(super) fn with(self, path: &str, text: &str, mode: u32) -> Self {
        self.owned_by(path, text, mode, 1000)
    }

    pub(super) fn owned_by(mut self, path: &str, text: &str, mode: u32, uid: u32) -> Self {
        self.0.insert(PathBuf::from(path), (text.into(), mode, uid));
        self
    }
}

impl Files for FakeFiles {
    fn read(&self, path: &Path) -> io::Result<Option<String>> {
        Ok(self.0.get(path).map(|(text, _, _)| text.clone()))
    }

    fn stat(&self, path: &Path) -> io::Result<Option<FileStat>> {
        Ok(self.0.get(path).map(|&(_, mode, uid)| FileStat {
            regular: !path.ends_with("not-a-file"),
            mode,
            uid,
        }))
    }
}

pub(super) fn account() -> Account {
    Account {
        name: "relay".into(),
        home: Some(PathBuf::from(HOME)),
    }
}

pub(super) fn env_of(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> + use<> {
    let pairs: Vec<(String, String)> = pairs
        .iter()
        .map(|(key, value)| (key.to_string(), value.to_string()))
        .collect();
    move |name| {
        pairs
            .iter()
            .find(|(key, _)| key == name)
            .map(|(_, value)| value.clone())
            .filter(|value| !value.is_empty())
    }
}

pub(super) fn resolve_with(
    url: Option<&str>,
    env: &[(&str, &str)],
    files: &FakeFiles,
) -> Result<ConnInfo> {
    resolve(url, &env_of(env), files, Some(&account()))
}

pub(super) fn info(url: &str) -> ConnInfo {
    resolve_with(Some(url), &[], &FakeFiles::default()).unwrap()
}

pub(super) fn error(url: Option<&str>, env: &[(&str, &str)], files: &FakeFiles) -> String {
    format!("{:#}", resolve_with(url, env, files).unwrap_err())
}

/// Asserts that resolving fails with a message that says `expected`.
pub(super) fn assert_fails(
    url: Option<&str>,
    env: &[(&str, &str)],
    files: &FakeFiles,
    expected: &str,
) {
    let message = error(url, env, files);
    assert!(message.contains(expected), "{message}");
}

/// The same for a URL alone, without variables or files.
pub(super) fn url_fails(url: &str, expected: &str) {
    assert_fails(Some(url), &[], &FakeFiles::default(), expected);
}

/// The same for variables alone, without a URL or files.
pub(super) fn env_fails(env: &[(&str, &str)], expected: &str) {
    assert_fails(None, env, &FakeFiles::default(), expected);
}

pub(super) fn tcp(host: &str, port: u16) -> (Host, u16) {
    (Host::Tcp(host.into()), port)
}

pub(super) fn places(info: &ConnInfo) -> Vec<(Host, u16)> {
    info.targets
        .iter()
        .map(|target| (target.host.clone(), target.port))
        .collect()
}

pub(super) fn passwords(info: &ConnInfo) -> Vec<Option<String>> {
    info.targets
        .iter()
        .map(|target| {
            target
                .password
                .as_ref()
                .map(|password| password.secret().to_string())
        })
        .collect()
}

pub(super) fn info_with_files(url: &str, files: &FakeFiles) -> ConnInfo {
    resolve_with(Some(url), &[], files).unwrap()
}
