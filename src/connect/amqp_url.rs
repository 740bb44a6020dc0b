//! `--amqp-url`: one URL or several (the nodes of one cluster), each read
//! as RabbitMQ's URI spec says, never echoing a password, and never read
//! as naming another host than it does.
//!
//! Two mistakes of the URI crate are corrected here. It reads the host with
//! `Url::domain()`, which is None for an IP literal, and falls back to
//! "localhost": `amqp://u:p@[::1]:5672/` would silently reach localhost,
//! and a run could mark events published on the wrong broker. So the host
//! is read again with `Url::host()`, as written. And it ignores every query
//! parameter it does not know, TLS's among them; those are read here, and
//! a parameter nobody reads is refused rather than silently dropped.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Result, anyhow, bail};
use lapin::uri::{AMQPScheme, AMQPUri};
use url::{Host, Url};

use crate::connect::conninfo::percent_decode;
use crate::connect::redact::redact_url;
use crate::connect::tls::{self, Identity, Trust};

/// One node of the list.
#[derive(Debug, Clone)]
pub(crate) struct AmqpNode {
    /// What lapin logs in with: user, password, vhost, frame_max,
    /// channel_max, heartbeat, auth_mechanism, and the host as written.
    pub(crate) uri: AMQPUri,
    /// For amqps://: how the broker's certificate is checked, the name it
    /// must bear, and the client certificate.
    pub(crate) tls: Option<AmqpTls>,
    /// The URL's connection_timeout, where it is given.
    pub(crate) connection_timeout: Option<Duration>,
}

#[derive(Debug, Clone)]
pub(crate) struct AmqpTls {
    pub(crate) settings: tls::Settings,
    /// The name the certificate must bear (and SNI sends): the URL's host,
    /// or server_name_indication.
    pub(crate) server_name: String,
}

/// The query parameters of RabbitMQ's URI spec that the URI crate reads
/// itself.
const READ_BY_LAPIN: [&str; 5] = [
    "heartbeat",
    "connection_timeout",
    "channel_max",
    "frame_max",
    "auth_mechanism",
];
/// Those of amqps:// read here.
const TLS_PARAMETERS: [&str; 5] = [
    "cacertfile",
    "certfile",
    "keyfile",
    "verify",
    "server_name_indication",
];
/// The spec's remaining ones, which would change the TLS session in ways
/// not implemented: refused by name rather than ignored.
const UNSUPPORTED: [&str; 3] = ["password", "depth", "fail_if_no_peer_cert"];

/// Reads `--amqp-url`/AMQP_URL: the nodes in the order given.
pub(crate) fn amqp_nodes(text: &str) -> Result<Vec<AmqpNode>> {
    let urls = split_urls(text);
    if urls.is_empty() {
        bail!("the AMQP URL is empty: give amqp://USER:PASSWORD@HOST:5672/VHOST");
    }
    urls.into_iter().map(amqp_node).collect()
}

/// Splits the list: on white space, and on a comma only where the next URL
/// starts right after it. A comma anywhere else belongs to the URL, as one
/// may in a password (`amqp://u:a,b@h`): splitting there would cut the
/// password in two and show its second half as a URL that does not parse.
pub(crate) fn split_urls(text: &str) -> Vec<&str> {
    let mut urls = Vec::new();
    for word in text.split_whitespace() {
        let mut start = 0;
        for (comma, _) in word.match_indices(',') {
            let next = word[comma + 1..].to_ascii_lowercase();
            if next.starts_with("amqp://") || next.starts_with("amqps://") {
                urls.push(&word[start..comma]);
                start = comma + 1;
            }
        }
        urls.push(&word[start..]);
    }
    urls
}

/// One URL of the list. Errors show it with its password masked.
fn amqp_node(text: &str) -> Result<AmqpNode> {
    let shown = redact_url(text);
    let does_not_parse = |why: String| {
        anyhow!(
            "the AMQP URL {shown} does not parse ({why}): use \
             amqp://USER:PASSWORD@HOST:5672/VHOST (several: separated by commas or spaces)"
        )
    };
    let mut uri: AMQPUri = text
        .parse()
        .map_err(|error: String| does_not_parse(error.replace(text, &shown)))?;
    let url = Url::parse(text).map_err(|error| does_not_parse(error.to_string()))?;
    uri.authority.host = match url.host() {
        Some(Host::Domain(name)) if !name.is_empty() => {
            percent_decode(name, "host").map_err(|error| does_not_parse(error.to_string()))?
        }
        Some(Host::Ipv4(address)) => address.to_string(),
        Some(Host::Ipv6(address)) => address.to_string(),
        // RabbitMQ's URI spec: an absent host is the client's default.
        _ => "localhost".into(),
    };
    let query = |name: &str| {
        url.query_pairs()
            .find(|(key, _)| key == name)
            .map(|(_, value)| value.into_owned())
    };
    for (key, _) in url.query_pairs() {
        let key = key.as_ref();
        if UNSUPPORTED.contains(&key) {
            bail!(
                "the AMQP URL {shown}: the parameter {key} is not supported by outbox-poll: \
                 remove it"
            );
        }
        if !READ_BY_LAPIN.contains(&key) && !TLS_PARAMETERS.contains(&key) {
            bail!(
                "the AMQP URL {shown}: unknown parameter {key:?}; RabbitMQ's URI parameters \
                 are {}, {}",
                READ_BY_LAPIN.join(", "),
                TLS_PARAMETERS.join(", ")
            );
        }
        if uri.scheme == AMQPScheme::AMQP && TLS_PARAMETERS.contains(&key) {
            bail!(
                "the AMQP URL {shown}: {key} applies to amqps:// only (TLS); use amqps://, or \
                 remove it"
            );
        }
    }
    let tls = match uri.scheme {
        AMQPScheme::AMQP => None,
        AMQPScheme::AMQPS => Some(amqps(&uri, &shown, &query)?),
    };
    Ok(AmqpNode {
        connection_timeout: uri.query.connection_timeout.map(Duration::from_millis),
        uri,
        tls,
    })
}

/// RabbitMQ's TLS parameters (as its Erlang client reads them): the
/// broker's certificate is checked against `cacertfile` alone, or else
/// the system's roots, and must name the host (or `server_name_indication`)
/// unless `verify=verify_none`; `certfile` and `keyfile` go together.
fn amqps(uri: &AMQPUri, shown: &str, query: &dyn Fn(&str) -> Option<String>) -> Result<AmqpTls> {
    let verify = match query("verify").as_deref() {
        None | Some("verify_peer") => true,
        Some("verify_none") => false,
        Some(other) => {
            bail!("the AMQP URL {shown}: verify={other:?} is neither verify_peer nor verify_none")
        }
    };
    let trust = match (verify, query("cacertfile")) {
        (false, _) => Trust::Anyone,
        (true, Some(file)) => Trust::File(PathBuf::from(file)),
        (true, None) => Trust::System,
    };
    let identity = match (query("certfile"), query("keyfile")) {
        (Some(cert), Some(key)) => Some(Identity {
            cert: PathBuf::from(cert),
            key: PathBuf::from(key),
        }),
        (None, None) => None,
        _ => bail!(
            "the AMQP URL {shown}: certfile and keyfile go together (the client certificate \
             and its key)"
        ),
    };
    let (server_name, sni) = match query("server_name_indication") {
        Some(disable) if disable == "disable" => (uri.authority.host.clone(), false),
        Some(name) => (name, true),
        None => (uri.authority.host.clone(), true),
    };
    tls::server_name(&server_name).map_err(|error| anyhow!("the AMQP URL {shown}: {error}"))?;
    Ok(AmqpTls {
        settings: tls::Settings {
            trust,
            check_name: true,
            identity,
            sni,
            p256_first: false,
        },
        server_name,
    })
}

/// "host:port (vhost /)", for messages; an IPv6 address in brackets.
pub(crate) fn describe_broker(uri: &AMQPUri) -> String {
    let vhost = if uri.vhost.is_empty() {
        "\"\""
    } else {
        &uri.vhost
    };
    let host = &uri.authority.host;
    let host = if host.contains(':') {
        format!("[{host}]")
    } else {
        host.clone()
    };
    format!("{host}:{} (vhost {vhost})", uri.authority.port)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hosts(text: &str) -> Vec<String> {
        amqp_nodes(text)
            .unwrap()
            .iter()
            .map(|node| describe_broker(&node.uri))
            .collect()
    }

    fn refusal(text: &str) -> String {
        format!("{:#}", amqp_nodes(text).unwrap_err())
    }

    #[test]
    fn bad_amqp_url_is_reported_without_its_password() {
        let error = refusal("amqp://u:hunter2@[::1");
        assert!(error.contains("does not parse"), "{error}");
        assert!(!error.contains("hunter2"), "{error}");
    }

    #[test]
    fn broker_is_described_by_host_port_and_vhost() {
        assert_eq!(
            hosts("amqp://guest:guest@rabbit:5673/%2f"),
            ["rabbit:5673 (vhost /)"]
        );
    }

    #[test]
    fn an_ip_literal_is_the_host_not_localhost() {
        assert_eq!(
            hosts("amqp://g:g@[::ffff:127.0.0.2]:5672/v amqp://g:g@10.1.2.3/v"),
            [
                "[::ffff:127.0.0.2]:5672 (vhost v)",
                "10.1.2.3:5672 (vhost v)"
            ]
        );
    }

    #[test]
    fn a_list_splits_on_white_space_and_on_commas_before_a_url() {
        let list = "amqp://u:p@a:5672/%2f,amqps://u:p@b/%2f\n amqp://u:p@c/%2f";
        assert_eq!(
            hosts(list),
            ["a:5672 (vhost /)", "b:5671 (vhost /)", "c:5672 (vhost /)"]
        );
    }

    #[test]
    fn a_comma_in_a_password_stays_in_it() {
        let nodes = amqp_nodes("amqp://u:se,cret@a/v,amqp://u:p,q@b/v").unwrap();
        let passwords: Vec<&str> = nodes
            .iter()
            .map(|node| node.uri.authority.userinfo.password.as_str())
            .collect();
        assert_eq!(passwords, ["se,cret", "p,q"]);
    }

    #[test]
    fn the_second_url_of_a_list_never_becomes_a_vhost() {
        let nodes = amqp_nodes("amqp://a:1@x/%2f amqp://b:s3cret@y/%2f").unwrap();
        assert_eq!(nodes.len(), 2);
        assert_eq!(nodes[0].uri.vhost, "/");
    }

    #[test]
    fn a_bad_url_in_a_list_is_named_without_any_password() {
        let error = refusal("amqp://a:first-s3cret@x/%2f amqp://b:second-s3cret@y:notaport/");
        assert!(error.contains("amqp://b:***@y:notaport/"), "{error}");
        assert!(!error.contains("s3cret"), "{error}");
    }

    #[test]
    fn tls_parameters_are_read_for_amqps() {
        let node = &amqp_nodes(
            "amqps://u:p@10.0.0.5/v?cacertfile=/ca.pem&certfile=/c.pem&keyfile=/k.pem\
             &server_name_indication=broker.internal&heartbeat=5",
        )
        .unwrap()[0];
        let tls = node.tls.as_ref().unwrap();
        assert_eq!(tls.settings.trust, Trust::File("/ca.pem".into()));
        assert!(tls.settings.check_name && tls.settings.sni);
        assert_eq!(tls.server_name, "broker.internal");
        assert_eq!(
            tls.settings.identity.as_ref().map(|id| id.key.clone()),
            Some("/k.pem".into())
        );
        assert_eq!(node.uri.query.heartbeat, Some(5));
    }

    #[test]
    fn verify_none_trusts_anyone_and_amqps_without_a_ca_file_the_system() {
        let trust = |url| {
            amqp_nodes(url).unwrap()[0]
                .tls
                .clone()
                .unwrap()
                .settings
                .trust
        };
        assert_eq!(trust("amqps://h/v?verify=verify_none"), Trust::Anyone);
        assert_eq!(trust("amqps://h/v"), Trust::System);
    }

    #[test]
    fn unknown_misplaced_or_half_given_parameters_are_refused() {
        for (url, said) in [
            ("amqp://h/v?hearbeat=5", "unknown parameter \"hearbeat\""),
            ("amqp://h/v?cacertfile=/ca.pem", "applies to amqps:// only"),
            ("amqps://h/v?certfile=/c.pem", "go together"),
            (
                "amqps://h/v?verify=maybe",
                "neither verify_peer nor verify_none",
            ),
            ("amqps://h/v?depth=3", "not supported"),
        ] {
            let error = refusal(url);
            assert!(error.contains(said), "{url}: {error}");
        }
    }
}
