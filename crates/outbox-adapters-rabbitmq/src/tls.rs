//! TLS settings an `amqps://` URL cannot carry: the CA to trust and a client
//! certificate. rustls with the ring provider; the system's roots are trusted too.

use std::fmt;
use std::path::{Path, PathBuf};

use lapin::tcp::{OwnedIdentity, OwnedTLSConfig};
use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

/// A TLS file that cannot be used.
#[derive(Debug, thiserror::Error)]
#[error("{what} {path}: {reason}")]
pub struct TlsFileError {
    /// Which file: `CA certificate`, `client certificate` or `client key`.
    pub what: &'static str,
    /// Its path.
    pub path: PathBuf,
    /// What is wrong (never the file's content).
    pub reason: String,
}

/// Trust and identity for `amqps://` connections, beyond the system's root
/// certificates. `Default` is none of them: the system's roots, no client
/// certificate. Ignored for `amqp://` URLs.
///
/// `Debug` shows whether each part is set, never the key.
#[derive(Clone, Default)]
pub struct RabbitTls {
    ca_pem: Option<String>,
    identity: Option<(Vec<u8>, Vec<u8>)>,
}

impl fmt::Debug for RabbitTls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RabbitTls")
            .field("ca", &self.ca_pem.is_some())
            .field("client_certificate", &self.identity.is_some())
            .finish()
    }
}

impl RabbitTls {
    /// Reads and checks the files: `ca` holds one or more PEM certificates to trust;
    /// `client` is a PEM certificate chain and its PEM private key (PKCS#8, PKCS#1
    /// or SEC1), for brokers that ask for client certificates.
    ///
    /// # Errors
    /// [`TlsFileError`] naming the file that cannot be read or holds no certificate
    /// or key in PEM.
    pub fn from_files(
        ca: Option<&Path>,
        client: Option<(&Path, &Path)>,
    ) -> Result<Self, TlsFileError> {
        let ca_pem = ca
            .map(|path| {
                let bytes = read_certificates(path, "CA certificate")?;
                String::from_utf8(bytes).map_err(|_| TlsFileError {
                    what: "CA certificate",
                    path: path.to_owned(),
                    reason: "is not text (PEM expected)".to_owned(),
                })
            })
            .transpose()?;
        let identity = client
            .map(|(cert, key)| -> Result<_, TlsFileError> {
                let cert = read_certificates(cert, "client certificate")?;
                let key = read_private_key(key, "client key")?;
                Ok((cert, key))
            })
            .transpose()?;
        Ok(Self { ca_pem, identity })
    }

    /// Whether a CA or a client certificate is set.
    #[must_use]
    pub fn is_set(&self) -> bool {
        self.ca_pem.is_some() || self.identity.is_some()
    }

    pub(crate) fn lapin_config(&self) -> OwnedTLSConfig {
        OwnedTLSConfig {
            identity: self
                .identity
                .as_ref()
                .map(|(pem, key)| OwnedIdentity::PKCS8 {
                    pem: pem.clone(),
                    key: key.clone(),
                }),
            cert_chain: self.ca_pem.clone(),
        }
    }
}

fn read(path: &Path, what: &'static str) -> Result<Vec<u8>, TlsFileError> {
    std::fs::read(path).map_err(|e| TlsFileError {
        what,
        path: path.to_owned(),
        reason: e.to_string(),
    })
}

/// The file's bytes, once they are seen to hold at least one PEM certificate and
/// nothing unparsable.
pub(crate) fn read_certificates(path: &Path, what: &'static str) -> Result<Vec<u8>, TlsFileError> {
    let bytes = read(path, what)?;
    let bad = |reason: String| TlsFileError {
        what,
        path: path.to_owned(),
        reason,
    };
    let certs = CertificateDer::pem_slice_iter(&bytes)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| bad(format!("not a PEM certificate: {e}")))?;
    if certs.is_empty() {
        return Err(bad(
            "holds no PEM certificate (-----BEGIN CERTIFICATE-----)".to_owned(),
        ));
    }
    Ok(bytes)
}

/// The file's bytes, once they are seen to hold a PEM private key.
pub(crate) fn read_private_key(path: &Path, what: &'static str) -> Result<Vec<u8>, TlsFileError> {
    let bytes = read(path, what)?;
    // The error names no part of the content: it is a secret.
    PrivateKeyDer::from_pem_slice(&bytes).map_err(|_| TlsFileError {
        what,
        path: path.to_owned(),
        reason: "holds no PEM private key (PKCS#8, PKCS#1 or SEC1)".to_owned(),
    })?;
    Ok(bytes)
}
