//! TLS between the proxies (rustls): the accelerator's certificate and the
//! client proxy's trust roots, both offering HTTP/2 and HTTP/1.1 by ALPN.
//! The hsync exchange is a content coding, so it is the same over either.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, PoisonError, RwLock};

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::ResolvesServerCert;
use rustls::sign::CertifiedKey;

/// ALPN protocols both sides offer, preferred first.
const ALPN: [&[u8]; 2] = [b"h2", b"http/1.1"];

/// Why TLS cannot be set up.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A PEM file that cannot be read or holds nothing usable.
    #[error("{path}: {reason}")]
    Pem {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// rustls refused the certificate, key or roots.
    #[error("{0}")]
    Rustls(#[from] rustls::Error),
    /// No trust roots at all.
    #[error("no trust roots: the system has none ({0}); give --upstream-ca")]
    NoRoots(String),
}

fn pem_error(path: &Path, reason: impl ToString) -> TlsError {
    TlsError::Pem {
        path: path.to_owned(),
        reason: reason.to_string(),
    }
}

fn certificates(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let certs = CertificateDer::pem_file_iter(path)
        .map_err(|e| pem_error(path, e))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| pem_error(path, e))?;
    if certs.is_empty() {
        return Err(pem_error(path, "no CERTIFICATE block"));
    }
    Ok(certs)
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// The accelerator's TLS configuration from a PEM certificate chain and
/// its private key.
///
/// # Errors
/// Unreadable or mismatched files.
pub fn server_config(cert: &Path, key: &Path) -> Result<Arc<rustls::ServerConfig>, TlsError> {
    Arc::new(ServerCertificate::load(cert, key)?).config()
}

/// The accelerator's certificate and key, replaceable while it serves: a
/// reload reads renewed files ([`ServerCertificate::reload`]), and each
/// handshake from then on presents them.
#[derive(Debug)]
pub struct ServerCertificate {
    current: RwLock<Arc<CertifiedKey>>,
}

impl ServerCertificate {
    /// Reads a PEM certificate chain and its private key.
    ///
    /// # Errors
    /// Unreadable files, or a key that is not the certificate's.
    pub fn load(cert: &Path, key: &Path) -> Result<ServerCertificate, TlsError> {
        Ok(ServerCertificate {
            current: RwLock::new(Arc::new(certified_key(cert, key)?)),
        })
    }

    /// Reads the files again; on an error the certificate in use stays.
    ///
    /// # Errors
    /// As [`ServerCertificate::load`].
    pub fn reload(&self, cert: &Path, key: &Path) -> Result<(), TlsError> {
        let renewed = Arc::new(certified_key(cert, key)?);
        *self.current.write().unwrap_or_else(PoisonError::into_inner) = renewed;
        Ok(())
    }

    /// A server configuration presenting this certificate, with ALPN.
    ///
    /// # Errors
    /// rustls refusing the protocol versions (never with its defaults).
    pub fn config(self: Arc<Self>) -> Result<Arc<rustls::ServerConfig>, TlsError> {
        let mut config = rustls::ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()?
            .with_no_client_auth()
            .with_cert_resolver(self);
        config.alpn_protocols = ALPN.iter().map(|p| p.to_vec()).collect();
        Ok(Arc::new(config))
    }
}

impl ResolvesServerCert for ServerCertificate {
    fn resolve(&self, _hello: rustls::server::ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(
            self.current
                .read()
                .unwrap_or_else(PoisonError::into_inner)
                .clone(),
        )
    }
}

fn certified_key(cert: &Path, key: &Path) -> Result<CertifiedKey, TlsError> {
    let chain = certificates(cert)?;
    let key_der = PrivateKeyDer::from_pem_file(key).map_err(|e| pem_error(key, e))?;
    CertifiedKey::from_der(chain, key_der, &provider()).map_err(|e| pem_error(key, e))
}

/// The client proxy's TLS configuration: trusting the certificates of
/// `ca` (PEM) when given, else the system's roots.
///
/// # Errors
/// Unreadable `ca`, or no roots at all.
pub fn client_config(ca: Option<&Path>) -> Result<Arc<rustls::ClientConfig>, TlsError> {
    let mut roots = rustls::RootCertStore::empty();
    match ca {
        Some(path) => {
            for cert in certificates(path)? {
                roots.add(cert)?;
            }
        }
        None => {
            let found = rustls_native_certs::load_native_certs();
            let (added, _) = roots.add_parsable_certificates(found.certs);
            if added == 0 {
                let why = found
                    .errors
                    .first()
                    .map_or_else(|| "none found".to_owned(), ToString::to_string);
                return Err(TlsError::NoRoots(why));
            }
        }
    }
    let mut config = rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = ALPN.iter().map(|p| p.to_vec()).collect();
    Ok(Arc::new(config))
}

/// TLS towards origin servers: as [`client_config`], offering HTTP/1.1
/// only (the origin hop speaks HTTP/1.1).
///
/// # Errors
/// As [`client_config`].
pub fn origin_client_config(ca: Option<&Path>) -> Result<Arc<rustls::ClientConfig>, TlsError> {
    let mut config = (*client_config(ca)?).clone();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// What a request that came over TLS knows of its connection, in its
/// extensions: the name the client asked for and our address, so that an
/// HTTP/2 request (whose target always carries an authority) can be told
/// to name us or someone else.
#[derive(Debug, Clone)]
pub struct TlsSession {
    /// The SNI server name (absent when the client connected by address).
    pub server_name: Option<String>,
    /// Our socket address on the connection.
    pub local: SocketAddr,
}

impl TlsSession {
    /// Whether `authority` names this server as the client reached it.
    pub fn names_us(&self, authority: &http::uri::Authority) -> bool {
        let port = authority.port_u16().unwrap_or(443);
        let host = authority
            .host()
            .trim_start_matches('[')
            .trim_end_matches(']');
        let same_host = match &self.server_name {
            Some(name) => name.eq_ignore_ascii_case(host),
            None => host.parse::<std::net::IpAddr>() == Ok(self.local.ip()),
        };
        same_host && port == self.local.port()
    }
}
