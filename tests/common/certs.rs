//! A certificate authority of the test's own, made with the `openssl`
//! command (no crate needed): a CA, a server certificate it signs for the
//! names the test chooses, and a client certificate it signs, all as PEM
//! files in a scratch directory, to pass as sslrootcert / cacertfile,
//! certfile, keyfile. The same files configure the test-owned TLS servers
//! (rustls, the TLS stack outbox-poll uses).

use std::path::PathBuf;
use std::process::Command;
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
use rustls::{RootCertStore, ServerConfig};

use super::scratch::Scratch;

pub struct TestCa {
    dir: Scratch,
}

/// Whether a TLS server asks for a client certificate.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ClientAuth {
    None,
    /// A client certificate signed by the test CA is required.
    Required,
}

impl TestCa {
    /// A CA, a server certificate for `server_names` (DNS names or IP
    /// addresses, as subject alternative names) and a client certificate
    /// for the user "guest". Keys are P-256, files are 0600 where libpq
    /// insists on it. Takes a few tens of milliseconds.
    pub fn new(server_names: &[&str]) -> TestCa {
        let dir = Scratch::new("ca");
        let sans: Vec<String> = server_names
            .iter()
            .map(|name| match name.parse::<std::net::IpAddr>() {
                Ok(_) => format!("IP:{name}"),
                Err(_) => format!("DNS:{name}"),
            })
            .collect();
        let ca = TestCa { dir };
        ca.openssl(
            "req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -keyout ca.key \
             -out ca.crt -days 2 -subj /CN=outbox-poll-test-CA \
             -addext basicConstraints=critical,CA:TRUE -addext keyUsage=critical,keyCertSign,cRLSign",
        );
        let server_extensions = format!(
            "subjectAltName={}\nextendedKeyUsage=serverAuth\n",
            sans.join(",")
        );
        let first_name = server_names.first().copied().unwrap_or("localhost");
        ca.issue("server", first_name, &server_extensions);
        ca.issue("client", "guest", "extendedKeyUsage=clientAuth\n");
        for key in ["ca.key", "server.key", "client.key"] {
            use std::os::unix::fs::PermissionsExt;
            let permissions = std::fs::Permissions::from_mode(0o600);
            std::fs::set_permissions(ca.file(key), permissions).unwrap();
        }
        ca
    }

    /// A key and a certificate signed by the CA, as NAME.key and NAME.crt.
    fn issue(&self, name: &str, common_name: &str, extensions: &str) {
        let extensions =
            format!("basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature\n{extensions}");
        self.dir.write(&format!("{name}.ext"), &extensions);
        self.openssl(&format!(
            "req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -keyout {name}.key \
             -out {name}.csr -subj /CN={common_name}"
        ));
        self.openssl(&format!(
            "x509 -req -in {name}.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 2 \
             -out {name}.crt -extfile {name}.ext"
        ));
    }

    /// Runs openssl in the directory; `args` are split on white space.
    fn openssl(&self, args: &str) {
        let output = Command::new("openssl")
            .args(args.split_whitespace())
            .current_dir(self.dir.path())
            .output()
            .expect("running openssl (the test CA needs the openssl command)");
        assert!(
            output.status.success(),
            "openssl {args} failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
    }

    fn file(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    pub fn ca_cert(&self) -> PathBuf {
        self.file("ca.crt")
    }

    pub fn server_cert(&self) -> PathBuf {
        self.file("server.crt")
    }

    pub fn server_key(&self) -> PathBuf {
        self.file("server.key")
    }

    pub fn client_cert(&self) -> PathBuf {
        self.file("client.crt")
    }

    pub fn client_key(&self) -> PathBuf {
        self.file("client.key")
    }

    /// A rustls server configuration presenting the server certificate,
    /// optionally requiring a client certificate signed by this CA.
    pub fn server_config(&self, client_auth: ClientAuth) -> Arc<ServerConfig> {
        let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(self.server_cert())
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        let key = PrivateKeyDer::from_pem_file(self.server_key()).unwrap();
        let builder = ServerConfig::builder();
        let builder = match client_auth {
            ClientAuth::None => builder.with_no_client_auth(),
            ClientAuth::Required => {
                let mut roots = RootCertStore::empty();
                for cert in CertificateDer::pem_file_iter(self.ca_cert()).unwrap() {
                    roots.add(cert.unwrap()).unwrap();
                }
                let verifier = WebPkiClientVerifier::builder(Arc::new(roots))
                    .build()
                    .unwrap();
                builder.with_client_cert_verifier(verifier)
            }
        };
        Arc::new(builder.with_single_cert(chain, key).unwrap())
    }
}
