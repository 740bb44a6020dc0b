//! One TLS stack for both servers: rustls with the aws-lc-rs provider, the
//! one lapin's amqps already compiles (no second crypto library: `cargo
//! tree -i ring` stays empty). This module turns what the operator asked
//! for (whose certificates to trust, whether the name must match, a client
//! certificate) into a rustls client configuration; `postgres_tls` and
//! `amqp` put it on their sockets.
//!
//! The provider is named explicitly rather than taken from the process
//! default: rustls panics when two providers are compiled in and none was
//! installed, and lapin installs one only on its own first connect.

use std::fmt;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{Context, Result, anyhow, bail};
use rustls::client::WebPkiServerVerifier;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::{CryptoProvider, WebPkiSupportedAlgorithms};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::{CertificateError, ClientConfig, DigitallySignedStruct, NamedGroup, RootCertStore};

/// Whose word vouches for the server's certificate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Trust {
    /// The certificates of a PEM file, and only those (libpq's sslrootcert,
    /// RabbitMQ's cacertfile).
    File(PathBuf),
    /// The operating system's roots (SSL_CERT_FILE and SSL_CERT_DIR apply).
    System,
    /// Nobody: any certificate is taken (libpq's `require` without a root
    /// file, RabbitMQ's `verify=verify_none`). The handshake's signatures
    /// are still checked, so the session is encrypted to whoever holds the
    /// certificate's key; only who that is goes unchecked.
    Anyone,
}

/// A client certificate and its key, both PEM files.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Identity {
    pub(crate) cert: PathBuf,
    pub(crate) key: PathBuf,
}

/// What a TLS client does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Settings {
    pub(crate) trust: Trust,
    /// Whether the certificate must also name the server (verify-full,
    /// amqps' default), or only chain up to a trusted root (verify-ca).
    pub(crate) check_name: bool,
    pub(crate) identity: Option<Identity>,
    /// Whether to send the server's name (SNI); rustls never sends it for
    /// an IP address.
    pub(crate) sni: bool,
    /// Offer a P-256 key first. PostgreSQL accepts only P-256 unless told
    /// otherwise (ssl_ecdh_curve = prime256v1), and a first offer of
    /// another group costs a HelloRetryRequest: a round trip more, and a
    /// post-quantum key made for nothing (a millisecond of the 6 an empty
    /// run takes). The other groups stay on offer.
    pub(crate) p256_first: bool,
}

/// The one provider, named rather than taken from the process default,
/// with P-256 offered first if `p256_first`.
fn provider(p256_first: bool) -> Arc<CryptoProvider> {
    let mut provider = rustls::crypto::aws_lc_rs::default_provider();
    if p256_first {
        // A stable sort: P-256 first, the others in rustls's order.
        provider
            .kx_groups
            .sort_by_key(|group| group.name() != NamedGroup::secp256r1);
    }
    Arc::new(provider)
}

/// The client configuration for `settings`. Errors name the file at fault
/// and are configuration problems for the caller to classify.
pub(crate) fn client_config(settings: &Settings) -> Result<Arc<ClientConfig>> {
    let provider = provider(settings.p256_first);
    let algorithms = provider.signature_verification_algorithms;
    let builder = ClientConfig::builder_with_provider(Arc::clone(&provider))
        .with_safe_default_protocol_versions()
        .context("setting up TLS")?;
    let verifier: Arc<dyn ServerCertVerifier> = match &settings.trust {
        Trust::Anyone => Arc::new(AnyCertificate(algorithms)),
        trust => {
            let roots = match trust {
                Trust::File(file) => roots_from_file(file)?,
                _ => system_roots()?,
            };
            let webpki = WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider)
                .build()
                .context("setting up the certificate check")?;
            if settings.check_name {
                webpki
            } else {
                Arc::new(ChainOnly(webpki))
            }
        }
    };
    let builder = builder
        .dangerous()
        .with_custom_certificate_verifier(verifier);
    let mut config = match &settings.identity {
        Some(identity) => {
            let (chain, key) = identity_from_files(identity)?;
            builder.with_client_auth_cert(chain, key).with_context(|| {
                format!(
                    "the client certificate {} does not go with the key {}",
                    identity.cert.display(),
                    identity.key.display()
                )
            })?
        }
        None => builder.with_no_client_auth(),
    };
    config.enable_sni = settings.sni;
    Ok(Arc::new(config))
}

/// The name to check the certificate against: a DNS name, or an IP address
/// (checked against the certificate's IP addresses).
pub(crate) fn server_name(name: &str) -> Result<ServerName<'static>> {
    ServerName::try_from(name.to_string())
        .map_err(|_| anyhow!("{name:?} is neither a host name nor an IP address for TLS"))
}

/// What went wrong in a handshake, in one phrase: rustls's own words when
/// it was rustls that refused ("invalid peer certificate: UnknownIssuer"),
/// and whether it was (a certificate or protocol problem, which a rerun
/// does not fix) rather than the network failing mid-handshake.
pub(crate) fn describe_handshake_error(error: &io::Error) -> (String, bool) {
    match error
        .get_ref()
        .and_then(|inner| inner.downcast_ref::<rustls::Error>())
    {
        Some(tls) => (tls.to_string(), true),
        None => (error.to_string(), false),
    }
}

fn roots_from_file(file: &Path) -> Result<RootCertStore> {
    let certs = read_certs(file, "root certificate file")?;
    let mut roots = RootCertStore::empty();
    for cert in certs {
        roots.add(cert).with_context(|| {
            format!(
                "the root certificate file {} holds a certificate that cannot be used",
                file.display()
            )
        })?;
    }
    Ok(roots)
}

/// The operating system's roots, as rustls-native-certs finds them (the
/// distribution's bundle; SSL_CERT_FILE and SSL_CERT_DIR replace it).
/// Certificates that do not parse are skipped, as OpenSSL skips them.
fn system_roots() -> Result<RootCertStore> {
    let found = rustls_native_certs::load_native_certs();
    let mut roots = RootCertStore::empty();
    let (added, _) = roots.add_parsable_certificates(found.certs);
    if added == 0 {
        match found.errors.first() {
            Some(error) => bail!("the system's root certificates cannot be read: {error}"),
            None => bail!(
                "the system has no root certificates: install ca-certificates, or name a CA file"
            ),
        }
    }
    Ok(roots)
}

fn read_certs(file: &Path, what: &str) -> Result<Vec<CertificateDer<'static>>> {
    let certs = CertificateDer::pem_file_iter(file)
        .map_err(|error| pem_error(file, what, error))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|error| pem_error(file, what, error))?;
    if certs.is_empty() {
        bail!(
            "the {what} {} holds no PEM certificate (-----BEGIN CERTIFICATE-----)",
            file.display()
        );
    }
    Ok(certs)
}

fn identity_from_files(
    identity: &Identity,
) -> Result<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>)> {
    let chain = read_certs(&identity.cert, "client certificate")?;
    let key = PrivateKeyDer::from_pem_file(&identity.key)
        .map_err(|error| pem_error(&identity.key, "client certificate's key", error))?;
    Ok((chain, key))
}

fn pem_error(file: &Path, what: &str, error: rustls::pki_types::pem::Error) -> anyhow::Error {
    use rustls::pki_types::pem::Error;
    match error {
        Error::Io(error) => anyhow!("cannot read the {what} {}: {error}", file.display()),
        Error::NoItemsFound => anyhow!(
            "the {what} {} holds no PEM private key (PKCS#8, PKCS#1 or SEC1; an encrypted \
             key is not supported)",
            file.display()
        ),
        error => anyhow!("the {what} {} is not valid PEM: {error:?}", file.display()),
    }
}

/// verify-ca: the chain must reach a trusted root, the name may be any.
/// webpki checks the chain before the name, so a name error means the
/// chain was good.
#[derive(Debug)]
struct ChainOnly(Arc<WebPkiServerVerifier>);

impl ServerCertVerifier for ChainOnly {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        match self
            .0
            .verify_server_cert(end_entity, intermediates, server_name, ocsp_response, now)
        {
            Err(rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) => Ok(ServerCertVerified::assertion()),
            verified => verified,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.supported_verify_schemes()
    }
}

/// Trust::Anyone: every certificate is accepted, but the handshake's
/// signatures are checked against it, as libpq's `require` does.
struct AnyCertificate(WebPkiSupportedAlgorithms);

impl fmt::Debug for AnyCertificate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("AnyCertificate")
    }
}

impl ServerCertVerifier for AnyCertificate {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.0)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.0)
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.supported_schemes()
    }
}
