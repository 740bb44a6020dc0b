//! The AMQP URL: parsed without ever echoing its password, and the broker
//! named in messages by host, port and vhost.

use anyhow::{Result, anyhow};
use lapin::uri::AMQPUri;

use crate::connect::redact::redact_url;

/// Parses the AMQP URL; the parser's own message may echo the URL, so the
/// text we show is rebuilt from the redacted form.
pub fn amqp_uri(url: &str) -> Result<AMQPUri> {
    url.parse::<AMQPUri>().map_err(|error| {
        let error = error.replace(url, &redact_url(url));
        anyhow!(
            "the AMQP URL {} does not parse ({error}): use amqp://USER:PASSWORD@HOST:5672/VHOST",
            redact_url(url)
        )
    })
}

/// "host:port, vhost /", for messages.
pub fn describe_broker(uri: &AMQPUri) -> String {
    let vhost = if uri.vhost.is_empty() {
        "\"\""
    } else {
        &uri.vhost
    };
    format!(
        "{}:{} (vhost {vhost})",
        uri.authority.host, uri.authority.port
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_amqp_url_is_reported_without_its_password() {
        let error = amqp_uri("amqp://u:hunter2@[::1").unwrap_err().to_string();
        assert!(error.contains("does not parse"), "{error}");
        assert!(!error.contains("hunter2"), "{error}");
    }

    #[test]
    fn broker_is_described_by_host_port_and_vhost() {
        let uri = amqp_uri("amqp://guest:guest@rabbit:5673/%2f").unwrap();
        assert_eq!(describe_broker(&uri), "rabbit:5673 (vhost /)");
    }
}
