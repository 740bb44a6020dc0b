//! The HTTP client that carries a run's spans to the collector. For an
//! `https://` endpoint it speaks TLS with the one stack the relay already
//! has (connect/tls.rs: rustls on aws-lc-rs), trusting what the standard
//! variables say: `OTEL_EXPORTER_OTLP_CERTIFICATE` (a PEM file of the roots
//! to trust instead of the system's) and, for a collector that asks for a
//! client certificate, `OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE` with
//! `OTEL_EXPORTER_OTLP_CLIENT_KEY`; each has its `..._TRACES_...` form,
//! which wins. A plain `http://` endpoint reads none of them.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, Result, anyhow, bail};
use async_trait::async_trait;
use bytes::Bytes;
use opentelemetry_http::{HttpClient, HttpError, Request, Response};
use reqwest::blocking::Client;

use crate::connect::tls::{self, Identity, Settings, Trust};

/// The export timeout when `OTEL_EXPORTER_OTLP_TIMEOUT` does not set one:
/// the specification's default, 10 seconds.
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);

/// The exporter's client: reqwest's, remembering why its last request
/// failed. The OTLP exporter reports every failure to reach the collector
/// as "network error" alone, and the operator needs the cause (refused, a
/// certificate not trusted, a timeout).
#[derive(Debug, Clone)]
pub(crate) struct Remembering {
    client: Client,
    cause: Arc<Mutex<Option<String>>>,
}

impl Remembering {
    /// Why the last request failed, with every cause in the chain.
    pub(crate) fn cause(&self) -> Option<String> {
        self.cause.lock().ok()?.clone()
    }
}

#[async_trait]
impl HttpClient for Remembering {
    async fn send_bytes(&self, request: Request<Bytes>) -> Result<Response<Bytes>, HttpError> {
        let sent = self.client.send_bytes(request).await;
        if let (Err(error), Ok(mut cause)) = (&sent, self.cause.lock()) {
            let mut chain = error.to_string();
            let mut source = error.source();
            while let Some(error) = source {
                chain = format!("{chain}: {error}");
                source = error.source();
            }
            *cause = Some(chain);
        }
        sent
    }
}

/// The client for `endpoint`, each request bounded by `timeout`. Errors
/// say which variable or file is at fault.
pub(crate) fn for_endpoint(endpoint: &str, timeout: Option<Duration>) -> Result<Remembering> {
    let mut builder = Client::builder().timeout(timeout.unwrap_or(DEFAULT_TIMEOUT));
    builder = if endpoint.starts_with("https://") {
        builder.tls_backend_preconfigured((*tls::client_config(&settings()?)?).clone())
    } else {
        // No roots at all for a plain endpoint: reqwest's default TLS setup
        // (the platform verifier) would cost an empty run milliseconds for
        // a TLS it never speaks, and a redirect to https:// is refused.
        builder.tls_certs_only([])
    };
    // The blocking client runs a runtime of its own, which must not be
    // built on a thread that already is inside one: build it on its own.
    let client = std::thread::spawn(move || builder.build())
        .join()
        .map_err(|_| anyhow!("building the HTTP client for traces failed"))?
        .context("building the HTTP client for traces")?;
    Ok(Remembering {
        client,
        cause: Arc::default(),
    })
}

/// What the TLS client trusts and presents, from the OTEL_* variables.
fn settings() -> Result<Settings> {
    let trust = match variable("CERTIFICATE") {
        Some(file) => Trust::File(PathBuf::from(file)),
        None => Trust::System,
    };
    let identity = match (variable("CLIENT_CERTIFICATE"), variable("CLIENT_KEY")) {
        (Some(cert), Some(key)) => Some(Identity {
            cert: cert.into(),
            key: key.into(),
        }),
        (None, None) => None,
        (Some(_), None) => bail!(
            "OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE is set without OTEL_EXPORTER_OTLP_CLIENT_KEY: \
             set both, or neither"
        ),
        (None, Some(_)) => bail!(
            "OTEL_EXPORTER_OTLP_CLIENT_KEY is set without OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE: \
             set both, or neither"
        ),
    };
    Ok(Settings {
        trust,
        check_name: true,
        identity,
        sni: true,
        p256_first: false,
    })
}

/// `OTEL_EXPORTER_OTLP_TRACES_{suffix}`, else `OTEL_EXPORTER_OTLP_{suffix}`;
/// an empty variable counts as unset.
fn variable(suffix: &str) -> Option<String> {
    [
        format!("OTEL_EXPORTER_OTLP_TRACES_{suffix}"),
        format!("OTEL_EXPORTER_OTLP_{suffix}"),
    ]
    .iter()
    .find_map(|name| std::env::var(name).ok().filter(|value| !value.is_empty()))
}
