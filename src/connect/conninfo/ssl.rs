//! sslmode and the TLS files: the root certificates the server is checked
//! against and the client certificate we present, as libpq's
//! `initialize_SSL` finds them.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};

use super::{ClientCert, Files, Params, RootCert, ServerCheck, Ssl, SslMode, stat};

/// sslmode, and how the server and we prove who we are. libpq's rules
/// (`fe-secure-openssl.c`, `initialize_SSL`): the root certificates are
/// `sslrootcert`, else ~/.postgresql/root.crt; when that file exists the
/// chain is verified in every mode, when it does not only verify-ca and
/// verify-full fail. `sslrootcert=system` needs verify-full and makes it
/// the default (libpq 16). The client certificate is `sslcert`, else
/// ~/.postgresql/postgresql.crt, sent only if the file exists, with
/// `sslkey` (else ~/.postgresql/postgresql.key), which must not be
/// readable by others.
///
/// libpq looks at those files only when it starts TLS, which it never does
/// over a socket: with no TCP host to try, none is looked at. (A list
/// mixing sockets and TCP hosts has them checked up front, where libpq
/// would fail only on reaching a TCP host.)
pub(super) fn ssl(
    params: &Params,
    files: &dyn Files,
    home: Option<&Path>,
    tcp: bool,
) -> Result<Ssl> {
    let in_dot_postgresql = |name: &str| home.map(|home| home.join(".postgresql").join(name));
    let rootcert = params.given("sslrootcert");
    let system = rootcert == Some("system");
    let mode = match params.get("sslmode") {
        None if system => SslMode::VerifyFull,
        None => SslMode::Prefer,
        Some("disable") => SslMode::Disable,
        Some("allow") => SslMode::Allow,
        Some("prefer") => SslMode::Prefer,
        Some("require") => SslMode::Require,
        Some("verify-ca") => SslMode::VerifyCa,
        Some("verify-full") => SslMode::VerifyFull,
        Some(_) => bail!(
            "{} is not one of disable, allow, prefer, require, verify-ca, verify-full",
            params.describe("sslmode")
        ),
    };
    if system && mode != SslMode::VerifyFull {
        bail!(
            "{} may not be used with sslrootcert=system: use sslmode=verify-full (the system's \
             roots vouch for names, so only the name check makes them mean anything)",
            params.describe("sslmode")
        );
    }
    if !tcp {
        return Ok(Ssl {
            mode,
            server: ServerCheck::Nothing,
            client: None,
        });
    }
    let root = if system {
        Some(RootCert::System)
    } else {
        match rootcert
            .map(PathBuf::from)
            .or_else(|| in_dot_postgresql("root.crt"))
        {
            Some(file) if stat(files, &file)?.is_some() => Some(RootCert::File(file)),
            missing => {
                if matches!(mode, SslMode::VerifyCa | SslMode::VerifyFull) {
                    let file = missing.map_or("~/.postgresql/root.crt".into(), |file| {
                        file.display().to_string()
                    });
                    bail!(
                        "sslmode={} needs the root certificate file {file}, which does not \
                         exist: give sslrootcert=FILE (or sslrootcert=system for the \
                         system's roots), or a weaker sslmode",
                        if mode == SslMode::VerifyCa {
                            "verify-ca"
                        } else {
                            "verify-full"
                        }
                    );
                }
                None
            }
        }
    };
    let server = match (mode, root) {
        (SslMode::Disable, _) | (_, None) => ServerCheck::Nothing,
        (SslMode::VerifyFull, Some(root)) => ServerCheck::ChainAndName(root),
        (_, Some(root)) => ServerCheck::Chain(root),
    };
    let client = match params
        .given("sslcert")
        .map(PathBuf::from)
        .or_else(|| in_dot_postgresql("postgresql.crt"))
    {
        Some(cert) if mode != SslMode::Disable && stat(files, &cert)?.is_some() => {
            let key = params
                .given("sslkey")
                .map(PathBuf::from)
                .or_else(|| in_dot_postgresql("postgresql.key"))
                .context("sslcert is given but not sslkey: give the client certificate's key")?;
            check_key_file(files, &key)?;
            Some(ClientCert { cert, key })
        }
        _ => None,
    };
    Ok(Ssl {
        mode,
        server,
        client,
    })
}

/// libpq refuses a private key others can read: 0640 or less if root owns
/// it (a group of trusted readers), 0600 or less whoever else does.
fn check_key_file(files: &dyn Files, key: &Path) -> Result<()> {
    let stat = stat(files, key)?.with_context(|| {
        format!(
            "the client certificate's key {} does not exist: give sslkey=FILE",
            key.display()
        )
    })?;
    if !stat.regular {
        bail!(
            "the client certificate's key {} is not a plain file",
            key.display()
        );
    }
    let forbidden = if stat.uid == 0 { 0o037 } else { 0o077 };
    if stat.mode & forbidden != 0 {
        bail!(
            "the private key file {} has group or world access: chmod 0600 it (or 0640 if \
             root owns it)",
            key.display()
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::super::test_support::*;
    use super::super::*;

    #[test]
    fn a_root_certificate_file_makes_require_verify_the_chain() {
        let files = FakeFiles::default().with("/home/relay/.postgresql/root.crt", "", 0o644);
        let info = info_with_files("host=h user=u sslmode=require", &files);
        let root = RootCert::File("/home/relay/.postgresql/root.crt".into());
        assert_eq!(info.ssl.server, ServerCheck::Chain(root));
        assert_eq!(
            self::info("host=h user=u sslmode=require").ssl.server,
            ServerCheck::Nothing
        );
    }

    #[test]
    fn verify_full_checks_the_name_against_the_given_roots() {
        let files = FakeFiles::default().with("/ca.pem", "", 0o644);
        let info = info_with_files(
            "host=h user=u sslmode=verify-full sslrootcert=/ca.pem",
            &files,
        );
        assert_eq!(
            info.ssl.server,
            ServerCheck::ChainAndName(RootCert::File("/ca.pem".into()))
        );
    }

    #[test]
    fn verify_modes_without_a_root_file_say_which_file_is_missing() {
        url_fails(
            "host=h user=u sslmode=verify-ca",
            "/home/relay/.postgresql/root.crt, which does not exist",
        );
        url_fails(
            "host=h user=u sslmode=verify-full sslrootcert=/nope.pem",
            "/nope.pem, which does not exist",
        );
    }

    #[test]
    fn sslrootcert_system_means_verify_full_and_refuses_weaker_modes() {
        let info = info("host=h user=u sslrootcert=system");
        assert_eq!(info.ssl.mode, SslMode::VerifyFull);
        assert_eq!(info.ssl.server, ServerCheck::ChainAndName(RootCert::System));
        url_fails(
            "host=h user=u sslrootcert=system sslmode=require",
            "sslmode=\"require\" in the database URL may not be used with sslrootcert=system",
        );
    }

    #[test]
    fn a_client_certificate_is_sent_only_if_its_file_exists() {
        let files = FakeFiles::default()
            .with("/home/relay/.postgresql/postgresql.crt", "", 0o644)
            .with("/home/relay/.postgresql/postgresql.key", "", 0o600);
        let client = info_with_files("host=h user=u", &files).ssl.client;
        assert_eq!(
            client,
            Some(ClientCert {
                cert: "/home/relay/.postgresql/postgresql.crt".into(),
                key: "/home/relay/.postgresql/postgresql.key".into(),
            })
        );
        assert_eq!(info("host=h user=u sslcert=/missing.crt").ssl.client, None);
    }

    #[test]
    fn a_client_key_readable_by_others_is_refused() {
        let files = FakeFiles::default()
            .with("/c.crt", "", 0o644)
            .with("/c.key", "", 0o644);
        assert_fails(
            Some("host=h user=u sslcert=/c.crt sslkey=/c.key"),
            &[],
            &files,
            "private key file /c.key has group or world access",
        );
    }

    #[test]
    fn tls_files_are_not_checked_when_every_host_is_a_socket() {
        let files = FakeFiles::default()
            .with("/c.crt", "", 0o644)
            .with("/c.key", "", 0o644);
        let info = info_with_files(
            "host=/var/run/postgresql,/tmp user=u sslmode=verify-full sslcert=/c.crt sslkey=/c.key",
            &files,
        );
        assert_eq!(info.ssl.mode, SslMode::VerifyFull);
        assert_eq!(
            (info.ssl.server, info.ssl.client),
            (ServerCheck::Nothing, None)
        );
        assert_fails(
            Some("host=/tmp,h user=u sslmode=verify-full"),
            &[],
            &files,
            "needs the root certificate file",
        );
    }

    #[test]
    fn a_root_owned_key_may_be_0640_and_any_other_owner_needs_0600() {
        let key = |mode: u32, uid: u32| {
            let files = FakeFiles::default()
                .with("/c.crt", "", 0o644)
                .owned_by("/c.key", "", mode, uid);
            resolve_with(
                Some("host=h user=u sslcert=/c.crt sslkey=/c.key"),
                &[],
                &files,
            )
            .map(|info| info.ssl.client.is_some())
            .map_err(|error| format!("{error:#}"))
        };
        assert_eq!(key(0o640, 0), Ok(true));
        assert_eq!(key(0o600, 2000), Ok(true));
        for (mode, uid) in [(0o660, 0), (0o644, 0), (0o640, 2000), (0o640, 1000)] {
            let error = key(mode, uid).unwrap_err();
            assert!(
                error.contains("has group or world access"),
                "{mode:o} {uid}: {error}"
            );
        }
    }
}
