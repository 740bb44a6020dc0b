//! The connection string: libpq's `parse_connection_string`, a
//! `postgresql://` URL or key=value pairs, into keyword and value pairs.

use anyhow::{Context, Result, anyhow, bail};

use crate::connect::redact::redact_url;

/// libpq's `parse_connection_string`: a URL if it starts with one of the
/// two prefixes, else key=value pairs.
pub(super) fn parse_connection_string(text: &str) -> Result<Vec<(String, String)>> {
    let parsed = match ["postgresql://", "postgres://"]
        .iter()
        .find_map(|prefix| text.strip_prefix(prefix))
    {
        Some(rest) => parse_uri(rest),
        None if text.contains('=') => parse_key_values(text),
        None => Err(anyhow!(
            "it is neither a postgresql:// URL nor key=value pairs"
        )),
    };
    parsed.with_context(|| {
        format!(
            "the database URL {} does not parse: use \
             postgresql://USER@HOST:PORT/DATABASE?PARAM=VALUE or key=value pairs",
            redact_url(text)
        )
    })
}

/// libpq's `conninfo_parse`: `key = value` pairs separated by white space;
/// a value may be single-quoted, and a backslash escapes the next
/// character, quoted or not.
fn parse_key_values(text: &str) -> Result<Vec<(String, String)>> {
    let mut pairs = Vec::new();
    let mut chars = text.chars().peekable();
    loop {
        while chars.next_if(|c| c.is_whitespace()).is_some() {}
        if chars.peek().is_none() {
            return Ok(pairs);
        }
        let mut key = String::new();
        while let Some(c) = chars.next_if(|c| *c != '=' && !c.is_whitespace()) {
            key.push(c);
        }
        while chars.next_if(|c| c.is_whitespace()).is_some() {}
        if chars.next() != Some('=') {
            bail!("missing \"=\" after {key:?}");
        }
        while chars.next_if(|c| c.is_whitespace()).is_some() {}
        let mut value = String::new();
        if chars.next_if_eq(&'\'').is_some() {
            loop {
                match chars.next() {
                    None => bail!("unterminated quoted value of {key:?}"),
                    Some('\'') => break,
                    Some('\\') => value.extend(chars.next()),
                    Some(c) => value.push(c),
                }
            }
        } else {
            while let Some(c) = chars.next_if(|c| !c.is_whitespace()) {
                if c == '\\' {
                    value.extend(chars.next());
                } else {
                    value.push(c);
                }
            }
        }
        pairs.push((key, value));
    }
}

/// libpq's `conninfo_uri_parse_options`, after the prefix:
/// `[user[:password]@][host][:port][,host[:port]...][/dbname][?key=value&...]`.
/// A host may be a bracketed IPv6 address. Every part is percent-decoded;
/// the host list is decoded as a whole and split on commas afterwards, as
/// libpq does. Empty parts are left unset, so the environment still
/// applies to them (but see the port list below).
fn parse_uri(rest: &str) -> Result<Vec<(String, String)>> {
    let mut pairs = Vec::new();
    let mut rest = rest;
    // Credentials end at the first '@' before any '/'.
    let credentials_end = rest.find(['@', '/']);
    if let Some(at) = credentials_end.filter(|&at| rest.as_bytes()[at] == b'@') {
        let (user, password) = match rest[..at].split_once(':') {
            Some((user, password)) => (user, Some(password)),
            None => (&rest[..at], None),
        };
        if !user.is_empty() {
            pairs.push(("user".into(), percent_decode(user, "user")?));
        }
        if let Some(password) = password.filter(|password| !password.is_empty()) {
            pairs.push(("password".into(), percent_decode(password, "password")?));
        }
        rest = &rest[at + 1..];
    }
    let mut hosts = String::new();
    let mut ports = String::new();
    loop {
        let host_end = if let Some(inner) = rest.strip_prefix('[') {
            let close = inner
                .find(']')
                .context("an IPv6 address lacks its closing \"]\"")?;
            if close == 0 {
                bail!("an IPv6 address in brackets is empty");
            }
            hosts.push_str(&inner[..close]);
            rest = &inner[close + 1..];
            if !rest.is_empty() && !rest.starts_with([':', '/', '?', ',']) {
                bail!("unexpected {:?} after an IPv6 address", &rest[..1]);
            }
            0
        } else {
            let end = rest.find([':', '/', '?', ',']).unwrap_or(rest.len());
            hosts.push_str(&rest[..end]);
            end
        };
        rest = &rest[host_end..];
        if let Some(after) = rest.strip_prefix(':') {
            let end = after.find(['/', '?', ',']).unwrap_or(after.len());
            ports.push_str(&after[..end]);
            rest = &after[end..];
        }
        match rest.strip_prefix(',') {
            Some(after) => {
                hosts.push(',');
                ports.push(',');
                rest = after;
            }
            None => break,
        }
    }
    if !hosts.is_empty() {
        pairs.push(("host".into(), percent_decode(&hosts, "host")?));
    }
    // A host list without ports still stores its commas (",") as the port
    // list, as libpq does: every host then gets 5432, and PGPORT does not
    // apply.
    if !ports.is_empty() {
        pairs.push(("port".into(), percent_decode(&ports, "port")?));
    }
    if let Some(after) = rest.strip_prefix('/') {
        let end = after.find('?').unwrap_or(after.len());
        if end > 0 {
            pairs.push(("dbname".into(), percent_decode(&after[..end], "dbname")?));
        }
        rest = &after[end..];
    }
    if let Some(query) = rest.strip_prefix('?') {
        // One "&" may end the query; any other empty parameter ("?&",
        // "a=1&&b=2") is an error, as in libpq.
        let mut params: Vec<&str> = query.split('&').collect();
        if params.last() == Some(&"") && (params.len() > 1 || query.is_empty()) {
            params.pop();
        }
        for param in params {
            let (key, value) = param
                .split_once('=')
                .with_context(|| format!("the query parameter {param:?} has no \"=\""))?;
            if value.contains('=') {
                bail!("the query parameter {key:?} has a second \"=\"");
            }
            let key = percent_decode(key, "a query parameter name")?;
            let value = percent_decode(value, &key)?;
            // JDBC's spelling, which libpq accepts too.
            if key == "ssl" && value == "true" {
                pairs.push(("sslmode".into(), "require".into()));
            } else {
                pairs.push((key, value));
            }
        }
    }
    Ok(pairs)
}

/// `%XX` sequences to bytes; libpq refuses `%00` and a `%` without two hex
/// digits. The error names the part, never its text (it may be a password).
/// Bytes that are not UTF-8 once decoded are refused where libpq takes
/// them: the driver passes user, database and password to the server as
/// text (a deliberate difference, see the module's list).
pub(crate) fn percent_decode(text: &str, part: &str) -> Result<String> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let byte = bytes
                .get(i + 1..i + 3)
                .and_then(|hex| std::str::from_utf8(hex).ok())
                .and_then(|hex| u8::from_str_radix(hex, 16).ok())
                .with_context(|| {
                    format!("the {part} has a \"%\" not followed by two hex digits")
                })?;
            if byte == 0 {
                bail!("the {part} holds %00, which libpq forbids");
            }
            out.push(byte);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).map_err(|error| {
        let byte = error.as_bytes()[error.utf8_error().valid_up_to()];
        anyhow!(
            "the {part} is not UTF-8 once percent-decoded (byte 0x{byte:02X}): outbox-poll \
             takes only UTF-8 text there; percent-encode the part's UTF-8 bytes"
        )
    })
}

#[cfg(test)]
mod tests {
    use super::super::test_support::*;
    use super::super::*;

    #[test]
    fn a_url_names_user_password_hosts_ports_database_and_parameters() {
        let info =
            info("postgresql://app:s3cret@db1:6543/orders?sslmode=require&application_name=relay");
        assert_eq!(places(&info), [tcp("db1", 6543)]);
        assert_eq!(
            (info.user.as_str(), info.dbname.as_str()),
            ("app", "orders")
        );
        assert_eq!(passwords(&info), [Some("s3cret".to_string())]);
        assert_eq!(info.ssl.mode, SslMode::Require);
        assert_eq!(info.application_name, "relay");
    }

    #[test]
    fn the_short_postgres_scheme_is_a_url_too() {
        assert_eq!(places(&info("postgres://u@db1/x")), [tcp("db1", 5432)]);
    }

    #[test]
    fn a_url_lists_hosts_each_with_its_port_or_the_default() {
        let info = info("postgresql://u@a:5433,b,c:5435/x");
        assert_eq!(
            places(&info),
            [tcp("a", 5433), tcp("b", 5432), tcp("c", 5435)]
        );
    }

    #[test]
    fn a_url_host_list_without_ports_gets_5432_everywhere_whatever_pgport_says() {
        let env = [("PGPORT", "6000")];
        let info = resolve_with(Some("postgresql://u@a,b/x"), &env, &FakeFiles::default()).unwrap();
        assert_eq!(places(&info), [tcp("a", 5432), tcp("b", 5432)]);
    }

    #[test]
    fn bracketed_ipv6_addresses_lose_their_brackets() {
        let info = info("postgresql://u@[::1]:5433,[fe80::2]/x");
        assert_eq!(places(&info), [tcp("::1", 5433), tcp("fe80::2", 5432)]);
        assert_eq!(info.targets[0].to_string(), "[::1]:5433");
    }

    #[test]
    fn an_unclosed_ipv6_bracket_is_named() {
        url_fails("postgresql://u@[::1/x", "closing \"]\"");
    }

    #[test]
    fn every_url_part_is_percent_decoded() {
        let info = info("postgresql://us%40r:p%3Aw%2Fd@%2Frun%2Fpg/my%20db?options=-c%20a%3Db");
        assert_eq!(info.user, "us@r");
        assert_eq!(passwords(&info), [Some("p:w/d".to_string())]);
        assert_eq!(places(&info), [(Host::Socket("/run/pg".into()), 5432)]);
        assert_eq!(info.dbname, "my db");
        assert_eq!(info.options.as_deref(), Some("-c a=b"));
    }

    #[test]
    fn a_bad_percent_escape_is_reported_without_the_password() {
        let message = error(
            Some("postgresql://u:hun%zzter2@h/x"),
            &[],
            &FakeFiles::default(),
        );
        assert!(message.contains("two hex digits"), "{message}");
        assert!(!message.contains("hun"), "{message}");
    }

    #[test]
    fn a_percent_encoded_nul_is_refused() {
        url_fails("postgresql://u@h/a%00b", "the dbname holds %00");
    }

    #[test]
    fn query_parameters_override_the_authority() {
        let info = info("postgresql://u@a/x?host=b&port=7000&dbname=y");
        assert_eq!(places(&info), [tcp("b", 7000)]);
        assert_eq!(info.dbname, "y");
    }

    #[test]
    fn a_query_parameter_without_a_value_is_an_error() {
        url_fails("postgresql://u@a/x?sslmode", "\"sslmode\" has no \"=\"");
    }

    #[test]
    fn jdbc_ssl_true_and_legacy_requiressl_mean_require() {
        assert_eq!(
            info("postgresql://u@a/x?ssl=true").ssl.mode,
            SslMode::Require
        );
        assert_eq!(
            info("host=a user=u requiressl=1").ssl.mode,
            SslMode::Require
        );
    }

    #[test]
    fn an_empty_query_parameter_is_an_error_but_one_trailing_ampersand_is_not() {
        url_fails(
            "postgresql://h/db?&",
            "the query parameter \"\" has no \"=\"",
        );
        url_fails(
            "postgresql://h/db?sslmode=require&&user=u",
            "the query parameter \"\" has no \"=\"",
        );
        assert_eq!(
            info("postgresql://u@h/db?sslmode=require&").ssl.mode,
            SslMode::Require
        );
        assert_eq!(info("postgresql://u@h/db?").dbname, "db");
    }

    #[test]
    fn a_url_part_that_is_not_utf8_once_decoded_is_refused_naming_the_part() {
        url_fails(
            "postgresql://u@h/%ff",
            "the dbname is not UTF-8 once percent-decoded (byte 0xFF)",
        );
        url_fails(
            "postgresql://u:%c3@h/x",
            "the password is not UTF-8 once percent-decoded",
        );
    }

    #[test]
    fn key_values_take_quotes_escapes_and_spaces_around_the_equals_sign() {
        let info = info(r"host = a  user=u password='it\'s' dbname='my \'db\'' options=-c\ x=1");
        assert_eq!(passwords(&info), [Some("it's".to_string())]);
        assert_eq!(info.dbname, "my 'db'");
        assert_eq!(info.options.as_deref(), Some("-c x=1"));
        assert_eq!(places(&info), [tcp("a", 5432)]);
    }

    #[test]
    fn key_values_list_hosts_and_ports() {
        let info = info("host=a,b,/run/pg port=5433,,5434 user=u");
        assert_eq!(
            places(&info),
            [
                tcp("a", 5433),
                tcp("b", 5432),
                (Host::Socket("/run/pg".into()), 5434)
            ]
        );
    }

    #[test]
    fn the_last_occurrence_of_a_key_wins() {
        assert_eq!(
            info("host=a host=b user=u").targets[0].host,
            Host::Tcp("b".into())
        );
    }

    #[test]
    fn an_unterminated_quote_is_an_error() {
        url_fails("host='a user=u", "unterminated quoted value of \"host\"");
    }

    #[test]
    fn a_key_without_equals_is_an_error() {
        url_fails("host=a user", "missing \"=\" after \"user\"");
    }

    #[test]
    fn a_string_that_is_neither_url_nor_key_values_is_refused() {
        url_fails("postgres:/oops", "neither a postgresql:// URL");
    }
}
