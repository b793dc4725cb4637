//! TLS on every listener (rustls, with the ring provider), from the
//! `security.tls_*` files, and the development CA that `kraft certs`
//! writes.
//!
//! One CA signs every node's certificate. With TLS on:
//!
//! - the raft listener takes a connection only from a peer that presents a
//!   certificate signed by the CA (mutual TLS), and a node dials its peers
//!   with its own certificate and checks theirs against the CA, under the
//!   host name of their `quorum.voters` entry; a refused handshake is
//!   logged with the peer's address;
//! - the HTTP API and the client listener speak TLS with the node's
//!   certificate; their clients present none (tokens authenticate them,
//!   `security.tokens_file`) and check the node's against the CA.
//!
//! A node certificate is for both ends (`serverAuth` and `clientAuth`), and
//! names every host the node is reached at (its subject alternative
//! names).

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::server::WebPkiClientVerifier;
use rustls::{ClientConfig, RootCertStore, ServerConfig};
use tokio_rustls::{TlsAcceptor, TlsConnector};

use crate::raft::NodeId;

/// Longest a TLS handshake may take on a listener before the connection is
/// closed.
pub const HANDSHAKE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// The three files of `[security]` that turn TLS on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TlsFiles {
    /// The cluster's CA certificate (PEM): what peers' and the node's own
    /// certificates are checked against.
    pub ca_file: PathBuf,
    /// This node's certificate chain (PEM), signed by the CA.
    pub cert_file: PathBuf,
    /// This node's private key (PEM: PKCS#8, PKCS#1 or SEC1).
    pub key_file: PathBuf,
}

/// Why TLS could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("{path}: {message}")]
    File { path: String, message: String },
    #[error("TLS: {0}")]
    Rustls(#[from] rustls::Error),
    #[error("TLS: {0}")]
    Verifier(#[from] rustls::server::VerifierBuilderError),
    #[error("generating certificates: {0}")]
    Generate(#[from] rcgen::Error),
    #[error("{0}")]
    Io(#[from] std::io::Error),
}

fn file_error(path: &Path, message: impl Into<String>) -> TlsError {
    TlsError::File {
        path: path.display().to_string(),
        message: message.into(),
    }
}

/// What every listener and the outbound raft connections use.
#[derive(Clone)]
pub struct Tls {
    /// The raft listener: a peer must present a certificate from the CA.
    pub peer_acceptor: TlsAcceptor,
    /// Outbound raft connections: this node's certificate; the peer's is
    /// checked against the CA.
    pub peer_connector: TlsConnector,
    /// The HTTP API and the client listener: this node's certificate; the
    /// client presents none.
    pub server: Arc<ServerConfig>,
}

impl std::fmt::Debug for Tls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Tls")
    }
}

/// rustls with ring: it builds with a C compiler alone (aws-lc-rs, which
/// rustls now recommends for its post-quantum key exchange, needs more of
/// the build machine). The classical key exchanges are what peers and
/// clients negotiate.
#[allow(deprecated)]
fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// The certificates of a PEM file; at least one.
fn read_certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let bytes = std::fs::read(path).map_err(|e| file_error(path, format!("cannot read: {e}")))?;
    let certs = rustls_pemfile::certs(&mut bytes.as_slice())
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| file_error(path, format!("not a PEM certificate file: {e}")))?;
    if certs.is_empty() {
        return Err(file_error(path, "holds no PEM certificate"));
    }
    Ok(certs)
}

fn read_key(path: &Path) -> Result<PrivateKeyDer<'static>, TlsError> {
    let bytes = std::fs::read(path).map_err(|e| file_error(path, format!("cannot read: {e}")))?;
    rustls_pemfile::private_key(&mut bytes.as_slice())
        .map_err(|e| file_error(path, format!("not a PEM key file: {e}")))?
        .ok_or_else(|| file_error(path, "holds no PEM private key"))
}

/// The CA file's certificates as trust roots.
pub fn read_roots(ca_file: &Path) -> Result<RootCertStore, TlsError> {
    let mut roots = RootCertStore::empty();
    for cert in read_certs(ca_file)? {
        roots
            .add(cert)
            .map_err(|e| file_error(ca_file, format!("not a usable CA certificate: {e}")))?;
    }
    Ok(roots)
}

impl Tls {
    /// Reads the three files and builds every configuration; an error
    /// names the file.
    pub fn load(files: &TlsFiles) -> Result<Tls, TlsError> {
        let roots = Arc::new(read_roots(&files.ca_file)?);
        let certs = read_certs(&files.cert_file)?;
        let key = read_key(&files.key_file)?;
        let provider = provider();

        let verifier = WebPkiClientVerifier::builder_with_provider(roots.clone(), provider.clone()).build()?;
        let peer_server = ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()?
            .with_client_cert_verifier(verifier)
            .with_single_cert(certs.clone(), key.clone_key())
            .map_err(|e| {
                file_error(
                    &files.key_file,
                    format!("does not go with {}: {e}", files.cert_file.display()),
                )
            })?;
        let peer_client = ClientConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()?
            .with_root_certificates(roots)
            .with_client_auth_cert(certs.clone(), key.clone_key())?;
        let server = ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()?
            .with_no_client_auth()
            .with_single_cert(certs, key)?;
        Ok(Tls {
            peer_acceptor: TlsAcceptor::from(Arc::new(peer_server)),
            peer_connector: TlsConnector::from(Arc::new(peer_client)),
            server: Arc::new(server),
        })
    }
}

/// A client configuration that trusts the CA in `ca_file` and presents no
/// certificate: what a client of the HTTP API or the client listener uses.
pub fn client_config(ca_file: &Path) -> Result<Arc<ClientConfig>, TlsError> {
    let roots = read_roots(ca_file)?;
    Ok(Arc::new(
        ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()?
            .with_root_certificates(roots)
            .with_no_client_auth(),
    ))
}

/// The name a peer's certificate must hold: the host of a `host:port`
/// endpoint (an IP address, `[v6]` included, or a DNS name).
pub fn server_name(endpoint: &str) -> std::io::Result<ServerName<'static>> {
    let host = match endpoint.rsplit_once(':') {
        Some((host, _port)) => host,
        None => endpoint,
    };
    let host = host.trim_start_matches('[').trim_end_matches(']');
    if let Ok(ip) = host.parse::<IpAddr>() {
        return Ok(ServerName::IpAddress(ip.into()));
    }
    ServerName::try_from(host.to_string()).map_err(|e| {
        std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!("{endpoint:?} has no host name TLS can check: {e}"),
        )
    })
}

/// Writes a development CA and a certificate for each node into `dir`:
/// `ca.pem`, `ca.key`, `node-<id>.pem` and `node-<id>.key`, each node's
/// naming every one of `hosts` (IP addresses or DNS names). Key files are
/// readable by their owner only. Returns the files written.
pub fn generate(dir: &Path, nodes: &[NodeId], hosts: &[String]) -> Result<Vec<PathBuf>, TlsError> {
    use rcgen::{BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair, KeyUsagePurpose};
    std::fs::create_dir_all(dir).map_err(|e| file_error(dir, format!("cannot create: {e}")))?;
    let mut written = Vec::new();
    let mut write = |name: &str, contents: &str, secret: bool| -> Result<(), TlsError> {
        let path = dir.join(name);
        write_file(&path, contents.as_bytes(), secret).map_err(|e| file_error(&path, format!("cannot write: {e}")))?;
        written.push(path);
        Ok(())
    };

    let ca_key = KeyPair::generate()?;
    let mut ca = CertificateParams::new(Vec::<String>::new())?;
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.distinguished_name.push(DnType::CommonName, "kraft development CA");
    ca.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    let ca = ca.self_signed(&ca_key)?;
    write("ca.pem", &ca.pem(), false)?;
    write("ca.key", &ca_key.serialize_pem(), true)?;

    for node in nodes {
        let key = KeyPair::generate()?;
        let mut params = CertificateParams::new(hosts.to_vec())?;
        params
            .distinguished_name
            .push(DnType::CommonName, format!("kraft node {node}"));
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature, KeyUsagePurpose::KeyEncipherment];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth, ExtendedKeyUsagePurpose::ClientAuth];
        let cert = params.signed_by(&key, &ca, &ca_key)?;
        write(&format!("node-{node}.pem"), &cert.pem(), false)?;
        write(&format!("node-{node}.key"), &key.serialize_pem(), true)?;
    }
    Ok(written)
}

fn write_file(path: &Path, contents: &[u8], secret: bool) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create(true).truncate(true);
    if secret {
        options.mode(0o600);
    }
    let mut file = options.open(path)?;
    file.write_all(contents)?;
    file.sync_all()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn server_names_come_from_the_endpoint_host() {
        assert!(matches!(
            server_name("127.0.0.1:9093").unwrap(),
            ServerName::IpAddress(_)
        ));
        assert!(matches!(server_name("[::1]:9093").unwrap(), ServerName::IpAddress(_)));
        assert!(matches!(
            server_name("node-1.kraft:9093").unwrap(),
            ServerName::DnsName(_)
        ));
        assert!(server_name("bad host:9093").is_err());
    }

    #[test]
    fn generated_files_load_and_a_missing_or_foreign_file_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let written = generate(dir.path(), &[1, 2], &["127.0.0.1".to_string(), "localhost".to_string()]).unwrap();
        assert_eq!(written.len(), 6);
        let files = TlsFiles {
            ca_file: dir.path().join("ca.pem"),
            cert_file: dir.path().join("node-1.pem"),
            key_file: dir.path().join("node-1.key"),
        };
        Tls::load(&files).expect("generated files load");
        client_config(&files.ca_file).unwrap();

        let missing = TlsFiles {
            cert_file: dir.path().join("node-9.pem"),
            ..files.clone()
        };
        let error = Tls::load(&missing).unwrap_err().to_string();
        assert!(error.contains("node-9.pem"), "{error}");
        let crossed = TlsFiles {
            key_file: dir.path().join("node-2.key"),
            ..files.clone()
        };
        let error = Tls::load(&crossed).unwrap_err().to_string();
        assert!(error.contains("node-2.key"), "{error}");
        let not_pem = TlsFiles {
            ca_file: dir.path().join("node-1.key"),
            ..files
        };
        let error = Tls::load(&not_pem).unwrap_err().to_string();
        assert!(error.contains("node-1.key"), "{error}");
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(dir.path().join("ca.key"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o077, 0, "a key is its owner's only");
    }
}
