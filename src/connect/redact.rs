//! Passwords never reach a message: URLs are shown with theirs masked.

/// Replaces the password of a `scheme://user:password@host` URL with `***`.
/// The password ends at the *last* `@`: an unencoded `/`, `#`, `?` or `@`
/// in it is the usual reason a URL fails to parse, which is exactly when it
/// is shown. Anything that is not such a URL is returned unchanged when it
/// holds no `password`, and fully masked when it does.
pub(crate) fn redact_url(url: &str) -> String {
    if let Some((scheme, rest)) = url.split_once("://") {
        let (userinfo, after) = match rest.rfind('@') {
            Some(at) => rest.split_at(at),
            None => ("", rest),
        };
        let userinfo = match userinfo.split_once(':') {
            Some((user, _password)) => format!("{user}:***"),
            None => userinfo.to_string(),
        };
        return format!("{scheme}://{userinfo}{}", redact_query(after));
    }
    if url.contains("password") {
        "(a key=value string with a password)".into()
    } else {
        url.to_string()
    }
}

/// `?password=...` is also legal in a PostgreSQL URL, and so is
/// `sslpassword=` (the client key's): every query parameter whose name
/// holds "password" has its value masked.
fn redact_query(path: &str) -> String {
    let Some((before, query)) = path.split_once('?') else {
        return path.to_string();
    };
    let pairs: Vec<String> = query
        .split('&')
        .map(|pair| match pair.split_once('=') {
            Some((key, _)) if key.to_ascii_lowercase().contains("password") => {
                format!("{key}=***")
            }
            _ => pair.to_string(),
        })
        .collect();
    format!("{before}?{}", pairs.join("&"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redaction_hides_userinfo_and_query_passwords() {
        assert_eq!(
            redact_url("amqp://guest:guest@localhost:5672/%2f"),
            "amqp://guest:***@localhost:5672/%2f"
        );
        assert_eq!(
            redact_url("postgresql://h/db?user=u&password=p&sslmode=off"),
            "postgresql://h/db?user=u&password=***&sslmode=off"
        );
        assert_eq!(redact_url("amqp://localhost"), "amqp://localhost");
        for url in [
            "postgresql://app:pa/ss@db:54x2/x",
            "amqp://guest:pa#ss@h/%2f",
            "amqp://u:a?b@c@h/",
        ] {
            assert!(
                !redact_url(url).contains("ss") && !redact_url(url).contains("a?b"),
                "{url}"
            );
        }
        assert!(!redact_url("host=h password=p").contains("=p"));
        let both = redact_url("postgresql://h/db?sslpassword=x&password=SECRET&a=%zz");
        assert!(!both.contains("SECRET") && !both.contains("=x"), "{both}");
    }
}
