//! The service file: libpq's `parseServiceInfo`, the `[service]` section
//! whose keys fill what the connection string left unset.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};

use super::{Files, Origin, Params, SYSCONFDIR, read};
use crate::connect::libpq::Env;

/// libpq's `parseServiceInfo`: PGSERVICEFILE (which must exist), else
/// ~/.pg_service.conf if it exists; if the service is not there, the
/// system-wide file in PGSYSCONFDIR (or Debian's /etc/postgresql-common).
/// A service's settings fill only what the URL left unset.
pub(super) fn apply_service(
    params: &mut Params,
    env: Env,
    files: &dyn Files,
    home: Option<&Path>,
) -> Result<()> {
    let service = match params.get("service") {
        Some(service) => service.to_string(),
        None => match env("PGSERVICE") {
            Some(service) => service,
            None => return Ok(()),
        },
    };
    let user_file = match env("PGSERVICEFILE") {
        Some(file) => Some(PathBuf::from(file)),
        None => home
            .map(|home| home.join(".pg_service.conf"))
            .filter(|file| matches!(files.stat(file), Ok(Some(_)))),
    };
    let system_file = PathBuf::from(env("PGSYSCONFDIR").unwrap_or_else(|| SYSCONFDIR.into()))
        .join("pg_service.conf");
    if let Some(file) = user_file {
        let text = read(files, &file)?
            .with_context(|| format!("service file {} not found", file.display()))?;
        if apply_service_section(params, &service, &file, &text)? {
            return Ok(());
        }
    }
    if let Some(text) = read(files, &system_file)?
        && apply_service_section(params, &service, &system_file, &text)?
    {
        return Ok(());
    }
    bail!(
        "definition of service {service:?} not found: add a [{service}] section to \
         ~/.pg_service.conf (or the file PGSERVICEFILE names), or fix service=/PGSERVICE"
    )
}

/// Applies the `[service]` section of one file; false if there is none.
/// Lines are trimmed; `#` starts a comment; a key runs up to the first `=`
/// with nothing trimmed around it, as in libpq (so `host = x` is a syntax
/// error there and here).
fn apply_service_section(
    params: &mut Params,
    service: &str,
    file: &Path,
    text: &str,
) -> Result<bool> {
    let mut found = false;
    for (index, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        if let Some(group) = line.strip_prefix('[') {
            if found {
                break;
            }
            found = group
                .strip_prefix(service)
                .is_some_and(|after| after.starts_with(']'));
            continue;
        }
        if !found {
            continue;
        }
        let origin = Origin::Service {
            file: file.to_path_buf(),
            line: index + 1,
        };
        let Some((key, value)) = line.split_once('=') else {
            bail!(
                "syntax error in service file {}, line {}: expected key=value",
                file.display(),
                index + 1
            );
        };
        if key == "service" {
            bail!(
                "nested service specifications are not supported (service file {}, line {})",
                file.display(),
                index + 1
            );
        }
        // libpq looks a service file's keys up in its list of keywords,
        // where the legacy `requiressl` is not (only a URL or key=value
        // string translates it): write sslmode=require.
        if key == "requiressl" {
            bail!(
                "syntax error in service file {}, line {}: requiressl is not a keyword here; \
                 write sslmode=require",
                file.display(),
                index + 1
            );
        }
        if !params.has(key) {
            params.store(key, value.to_string(), origin)?;
        }
    }
    Ok(found)
}

#[cfg(test)]
mod tests {
    use super::super::test_support::*;
    use super::super::*;

    const SERVICES: &str = "# comment\n[other]\nport=1\n[mainx]\nport=2\n[main]\nhost=db9\n  port=6001  \n\
                            user=svc\ndbname=svcdb\n[later]\nport=3\n";

    #[test]
    fn a_service_fills_what_the_url_leaves_out_and_wins_over_the_environment() {
        let files = FakeFiles::default().with("/etc/svc.conf", SERVICES, 0o644);
        let env = [
            ("PGSERVICEFILE", "/etc/svc.conf"),
            ("PGUSER", "envuser"),
            ("PGDATABASE", "envdb"),
        ];
        let info = resolve_with(Some("service=main user=explicit"), &env, &files).unwrap();
        assert_eq!(places(&info), [tcp("db9", 6001)]);
        assert_eq!(
            (info.user.as_str(), info.dbname.as_str()),
            ("explicit", "svcdb")
        );
    }

    #[test]
    fn pgservice_names_the_service() {
        let files = FakeFiles::default().with("/etc/svc.conf", SERVICES, 0o644);
        let env = [("PGSERVICE", "main"), ("PGSERVICEFILE", "/etc/svc.conf")];
        assert_eq!(
            places(&resolve_with(None, &env, &files).unwrap()),
            [tcp("db9", 6001)]
        );
    }

    #[test]
    fn the_service_file_in_home_comes_before_the_system_one() {
        let files = FakeFiles::default()
            .with("/home/relay/.pg_service.conf", "[main]\nhost=mine\n", 0o600)
            .with(
                "/etc/postgresql-common/pg_service.conf",
                "[main]\nhost=system\n[sys]\nhost=only-system\n",
                0o644,
            );
        assert_eq!(
            info_with_files("service=main user=u", &files).targets[0].host,
            Host::Tcp("mine".into())
        );
        assert_eq!(
            info_with_files("service=sys user=u", &files).targets[0].host,
            Host::Tcp("only-system".into())
        );
    }

    #[test]
    fn pgsysconfdir_moves_the_system_service_file() {
        let files =
            FakeFiles::default().with("/opt/pg/pg_service.conf", "[main]\nhost=opt\n", 0o644);
        let info = resolve_with(
            Some("service=main user=u"),
            &[("PGSYSCONFDIR", "/opt/pg")],
            &files,
        )
        .unwrap();
        assert_eq!(info.targets[0].host, Host::Tcp("opt".into()));
    }

    #[test]
    fn a_missing_service_or_service_file_is_an_error() {
        let files = FakeFiles::default().with("/etc/svc.conf", SERVICES, 0o644);
        assert_fails(
            Some("service=nope"),
            &[("PGSERVICEFILE", "/etc/svc.conf")],
            &files,
            "definition of service \"nope\" not found",
        );
        assert_fails(
            Some("service=main"),
            &[("PGSERVICEFILE", "/etc/none.conf")],
            &files,
            "service file /etc/none.conf not found",
        );
    }

    #[test]
    fn a_service_line_with_spaces_around_equals_or_an_unknown_key_is_named_by_line() {
        for (text, expected) in [
            (
                "[main]\nhost = x\n",
                "unknown connection parameter \"host \" in /s.conf, line 2",
            ),
            (
                "[main]\n\nfrob=1\n",
                "unknown connection parameter \"frob\" in /s.conf, line 3",
            ),
            (
                "[main]\njunk\n",
                "syntax error in service file /s.conf, line 2",
            ),
            ("[main]\nservice=other\n", "nested service specifications"),
        ] {
            let files = FakeFiles::default().with("/s.conf", text, 0o644);
            assert_fails(
                Some("service=main"),
                &[("PGSERVICEFILE", "/s.conf")],
                &files,
                expected,
            );
        }
    }

    #[test]
    fn requiressl_in_a_service_file_is_a_syntax_error() {
        let files = FakeFiles::default().with("/s.conf", "[main]\nrequiressl=1\n", 0o644);
        assert_fails(
            Some("service=main user=u"),
            &[("PGSERVICEFILE", "/s.conf")],
            &files,
            "syntax error in service file /s.conf, line 2: requiressl",
        );
    }

    #[test]
    fn a_bad_value_from_a_service_names_its_file_and_line() {
        let files = FakeFiles::default().with("/s.conf", "[main]\nsslmode=sure\n", 0o644);
        assert_fails(
            Some("service=main"),
            &[("PGSERVICEFILE", "/s.conf")],
            &files,
            "sslmode=\"sure\" in /s.conf, line 2 is not one of",
        );
    }
}
