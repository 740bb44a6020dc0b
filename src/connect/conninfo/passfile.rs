//! The password file: libpq's `passwordFromFile`, one server's line of
//! `~/.pgpass` (or `passfile`, PGPASSFILE).

use std::path::{Path, PathBuf};

use anyhow::Result;

use super::{Files, SOCKET_DIRS, read, stat};

/// The name `.pgpass` lines give a host: `localhost` for libpq's
/// compiled-in socket directory spelled exactly so (no trailing slash,
/// as libpq compares the text), else the host as written.
pub(super) fn pgpass_host(written: &str) -> String {
    if written == SOCKET_DIRS[0] {
        PGPASS_LOCALHOST.into()
    } else {
        written.into()
    }
}

/// What `.pgpass` calls the default socket directory.
pub(super) const PGPASS_LOCALHOST: &str = "localhost";

/// Reads the password file if libpq would: it must be a plain file with
/// no group or world access; otherwise libpq warns and carries on without
/// it, and so do we.
pub(super) fn read_password_file(
    files: &dyn Files,
    file: &Path,
    warnings: &mut Vec<String>,
) -> Result<Option<(PathBuf, String)>> {
    let Some(stat) = stat(files, file)? else {
        return Ok(None);
    };
    if !stat.regular {
        warnings.push(format!(
            "password file {} is not a plain file; ignored",
            file.display()
        ));
        return Ok(None);
    }
    if stat.mode & 0o077 != 0 {
        warnings.push(format!(
            "password file {} has group or world access; ignored (chmod 0600 it)",
            file.display()
        ));
        return Ok(None);
    }
    Ok(read(files, file)?.map(|text| (file.to_path_buf(), text)))
}

/// libpq's `passwordFromFile`: the first line `host:port:dbname:user:password`
/// whose four fields match, `*` matching anything, `\` escaping `:` and
/// `\`. `host` is the name [`pgpass_host`] gives, and `port` the port as
/// written (`port=05432` misses a `5432` line, as in libpq). Lines
/// starting with `#` are comments. The password ends at the next
/// unescaped `:`.
pub(super) fn password_from_file(
    text: &str,
    host: &str,
    port: &str,
    dbname: &str,
    user: &str,
) -> Option<String> {
    text.lines()
        .map(|line| line.strip_suffix('\r').unwrap_or(line))
        .filter(|line| !line.is_empty() && !line.starts_with('#'))
        .find_map(|line| {
            let mut rest = line;
            for wanted in [host, port, dbname, user] {
                rest = pgpass_field_matches(rest, wanted)?;
            }
            Some(pgpass_unescape(rest))
        })
}

/// If the line's next field is `*` or `wanted` (escapes undone), the rest
/// of the line after its `:`.
fn pgpass_field_matches<'a>(line: &'a str, wanted: &str) -> Option<&'a str> {
    if let Some(rest) = line.strip_prefix("*:") {
        return Some(rest);
    }
    let mut field = String::new();
    let mut chars = line.char_indices();
    while let Some((index, c)) = chars.next() {
        match c {
            '\\' => field.extend(chars.next().map(|(_, c)| c)),
            ':' => return (field == wanted).then(|| &line[index + 1..]),
            c => field.push(c),
        }
    }
    None
}

fn pgpass_unescape(field: &str) -> String {
    let mut out = String::new();
    let mut chars = field.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => match chars.next() {
                Some(next) => out.push(next),
                None => out.push('\\'),
            },
            ':' => break,
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::super::test_support::*;
    use super::super::*;

    const PGPASS: &str = "# host:port:db:user:password\n\
                          db1:5432:orders:app:first\n\
                          db1:5432:orders:app:shadowed\n\
                          db2:*:*:app:any-db\n\
                          localhost:5432:*:*:on-the-socket\n\
                          /run/pg:5432:*:*:other-socket\n\
                          db\\:3:5432:*:*:escaped\\:colon\\\\:extra\n\
                          *:*:*:*:fallback\n";

    fn pgpass_files(mode: u32) -> FakeFiles {
        FakeFiles::default().with("/home/relay/.pgpass", PGPASS, mode)
    }

    fn password_for(url: &str, files: &FakeFiles) -> Option<String> {
        passwords(&resolve_with(Some(url), &[], files).unwrap()).remove(0)
    }

    /// Asserts the password the first host of `url` gets.
    fn assert_password(url: &str, files: &FakeFiles, expected: &str) {
        assert_eq!(password_for(url, files).as_deref(), Some(expected), "{url}");
    }

    #[test]
    fn the_first_matching_pgpass_line_gives_the_password() {
        let files = pgpass_files(0o600);
        assert_password("host=db1 dbname=orders user=app", &files, "first");
        assert_password("host=db2 port=7 dbname=x user=app", &files, "any-db");
        assert_password("host=db3 user=other", &files, "fallback");
    }

    #[test]
    fn pgpass_is_matched_per_host_and_port() {
        let files = pgpass_files(0o600);
        let info = resolve_with(
            Some("host=db1,db2 port=5432,5433 dbname=orders user=app"),
            &[],
            &files,
        )
        .unwrap();
        assert_eq!(
            passwords(&info),
            [Some("first".to_string()), Some("any-db".to_string())]
        );
        let file = info.targets[0].password.as_ref().unwrap().file.clone();
        assert_eq!(file, Some(PathBuf::from("/home/relay/.pgpass")));
    }

    #[test]
    fn pgpass_escapes_colons_and_backslashes_and_ends_the_password_at_a_colon() {
        let files = pgpass_files(0o600);
        assert_password("host=db:3 user=u", &files, "escaped:colon\\");
    }

    #[test]
    fn localhost_in_pgpass_matches_the_default_socket_only() {
        let files = pgpass_files(0o600).with("/var/run/postgresql/.s.PGSQL.5432", "", 0o777);
        assert_password("user=u", &files, "on-the-socket");
        assert_password("host=/run/pg user=u", &files, "other-socket");
        assert_password("host=/srv/pg user=u", &files, "fallback");
    }

    #[test]
    fn a_socket_directory_with_a_trailing_slash_is_matched_in_pgpass_as_written() {
        let files = FakeFiles::default().with(
            "/home/relay/.pgpass",
            "localhost:5432:*:*:sock\n/var/run/postgresql/:5432:*:*:as-written\n",
            0o600,
        );
        assert_password("host=/var/run/postgresql user=u", &files, "sock");
        assert_password("host=/var/run/postgresql/ user=u", &files, "as-written");
    }

    #[test]
    fn an_explicit_tmp_socket_is_not_localhost_in_pgpass() {
        let files = FakeFiles::default().with(
            "/home/relay/.pgpass",
            "localhost:5432:*:*:sock\n/tmp:5432:*:*:tmp\n",
            0o600,
        );
        assert_password("host=/tmp user=u", &files, "tmp");
    }

    #[test]
    fn the_pgpass_port_is_compared_as_written() {
        let files = FakeFiles::default().with(
            "/home/relay/.pgpass",
            "h:5432:*:*:plain\nh:05432:*:*:padded\n",
            0o600,
        );
        assert_password("host=h port=05432 user=u", &files, "padded");
        assert_password("host=h port=5432 user=u", &files, "plain");
    }

    #[test]
    fn a_password_given_anywhere_beats_pgpass() {
        let files = pgpass_files(0o600);
        assert_password(
            "host=db1 dbname=orders user=app password=given",
            &files,
            "given",
        );
        let info = resolve_with(
            Some("host=db1 dbname=orders user=app"),
            &[("PGPASSWORD", "env")],
            &files,
        )
        .unwrap();
        assert_eq!(passwords(&info), [Some("env".to_string())]);
    }

    #[test]
    fn a_given_password_leaves_the_password_file_unread() {
        let info = resolve_with(
            Some("host=db1 user=app password=given"),
            &[],
            &pgpass_files(0o644),
        )
        .unwrap();
        assert_eq!(info.warnings, Vec::<String>::new());
    }

    #[test]
    fn a_commented_pgpass_line_is_never_used() {
        let files = FakeFiles::default().with(
            "/home/relay/.pgpass",
            "#db:5432:*:*:commented\n*:*:*:*:live\n",
            0o600,
        );
        assert_password("host=#db user=u", &files, "live");
    }

    #[test]
    fn an_empty_password_still_consults_pgpass() {
        let files = pgpass_files(0o600);
        assert_password(
            "host=db1 dbname=orders user=app password=''",
            &files,
            "first",
        );
    }

    /// Asserts that the password file was ignored, with one warning that
    /// says `warning`.
    fn assert_file_ignored(url: &str, files: &FakeFiles, warning: &str) {
        let info = resolve_with(Some(url), &[], files).unwrap();
        assert_eq!(passwords(&info), [None]);
        assert_eq!(info.warnings.len(), 1, "{:?}", info.warnings);
        assert!(info.warnings[0].contains(warning), "{:?}", info.warnings);
    }

    #[test]
    fn a_pgpass_readable_by_others_is_ignored_with_a_warning() {
        let warning = "/home/relay/.pgpass has group or world access";
        assert_file_ignored(
            "host=db1 dbname=orders user=app",
            &pgpass_files(0o640),
            warning,
        );
    }

    #[test]
    fn a_pgpass_that_is_not_a_plain_file_is_ignored_with_a_warning() {
        let files = FakeFiles::default().with("/p/not-a-file", PGPASS, 0o600);
        let url = "host=db1 user=u passfile=/p/not-a-file";
        assert_file_ignored(url, &files, "/p/not-a-file is not a plain file");
    }

    #[test]
    fn passfile_and_pgpassfile_name_the_password_file() {
        let files = FakeFiles::default()
            .with("/a/pass", "*:*:*:*:from-param\n", 0o600)
            .with("/b/pass", "*:*:*:*:from-env\n", 0o600);
        assert_password("host=h user=u passfile=/a/pass", &files, "from-param");
        let info =
            resolve_with(Some("host=h user=u"), &[("PGPASSFILE", "/b/pass")], &files).unwrap();
        assert_eq!(passwords(&info), [Some("from-env".to_string())]);
    }

    #[test]
    fn home_comes_from_home_before_the_account() {
        let files = FakeFiles::default().with("/elsewhere/.pgpass", "*:*:*:*:via-home\n", 0o600);
        let info = resolve_with(Some("host=h user=u"), &[("HOME", "/elsewhere")], &files).unwrap();
        assert_eq!(passwords(&info), [Some("via-home".to_string())]);
    }
}
