//! The interception CA: written by `poolgate ca init`, read and checked when the config loads,
//! and used to sign the leaf certificates the gateway presents to clients.
//!
//! Any CA whose key is a PKCS#8 PEM works (ECDSA P-256/P-384, Ed25519 or RSA), not only one made
//! here: the issuer's name and key identifier are taken from the certificate as it is, so the
//! leaves chain to it byte for byte. The key is never formatted into an error, a log or `Debug`.

use std::fmt;
use std::io::Write as _;
use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose, SerialNumber,
};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use time::{Duration as TimeDuration, OffsetDateTime};

/// Common name of a CA made by `poolgate ca init`.
pub const DEFAULT_CA_COMMON_NAME: &str = "poolgate interception CA";
/// Lifetime of a CA made by `poolgate ca init`.
pub const CA_VALIDITY_DAYS: i64 = 3650;
/// Lifetime of a leaf certificate; cached leaves are re-minted well before (see `certs`).
pub const LEAF_VALIDITY_DAYS: i64 = 30;
/// Leaves start a day in the past, so a client whose clock is a little behind accepts them.
const BACKDATE_DAYS: i64 = 1;
/// X.509 upper bound for a common name; longer names are carried by the SAN alone.
const MAX_COMMON_NAME: usize = 64;

/// Which of the two files a problem is about, so config validation can name the right key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CaFile {
    Cert,
    Key,
}

#[derive(Debug, thiserror::Error)]
pub enum CaError {
    #[error("cannot read {path}: {error}")]
    Read {
        file: CaFile,
        path: PathBuf,
        error: std::io::Error,
    },
    #[error("{path}: no PEM certificate found")]
    NoCert { path: PathBuf },
    #[error("{path}: the certificate cannot be parsed")]
    BadCert { path: PathBuf },
    #[error("{path}: not a CA certificate (basicConstraints CA:TRUE is missing)")]
    NotCa { path: PathBuf },
    #[error("{path}: the CA certificate expired")]
    Expired { path: PathBuf },
    #[error(
        "{path}: not a usable PKCS#8 private key (\"BEGIN PRIVATE KEY\"; convert others with `openssl pkcs8 -topk8 -nocrypt`)"
    )]
    BadKey { path: PathBuf },
    #[error("{path}: the key does not belong to the CA certificate")]
    Mismatch { path: PathBuf },
    #[error("{path} already exists (pass --force to overwrite it)")]
    Exists { file: CaFile, path: PathBuf },
    #[error("cannot write {path}: {error}")]
    Write {
        file: CaFile,
        path: PathBuf,
        error: std::io::Error,
    },
    #[error("certificate generation failed: {0}")]
    Generate(#[from] rcgen::Error),
}

impl CaError {
    /// The file at fault.
    pub fn file(&self) -> CaFile {
        match self {
            CaError::Read { file, .. }
            | CaError::Exists { file, .. }
            | CaError::Write { file, .. } => *file,
            CaError::NoCert { .. }
            | CaError::BadCert { .. }
            | CaError::NotCa { .. }
            | CaError::Expired { .. }
            | CaError::Generate(_) => CaFile::Cert,
            CaError::BadKey { .. } | CaError::Mismatch { .. } => CaFile::Key,
        }
    }
}

/// A loaded CA, ready to sign leaves.
pub struct Ca {
    /// The CA as rcgen's issuer: its own subject name and key identifier.
    issuer: rcgen::Certificate,
    key: KeyPair,
    cert_der: CertificateDer<'static>,
}

impl fmt::Debug for Ca {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Ca").finish_non_exhaustive()
    }
}

/// A freshly generated CA, as PEM text to be written to files.
pub struct GeneratedCa {
    pub cert_pem: String,
    /// Secret: write it with owner-only permissions and never print it.
    pub key_pem: String,
}

impl fmt::Debug for GeneratedCa {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GeneratedCa").finish_non_exhaustive()
    }
}

/// Generates a CA: an ECDSA P-256 key and a self-signed certificate that may sign leaves only
/// (path length 0), valid for [`CA_VALIDITY_DAYS`].
pub fn generate(common_name: &str) -> Result<GeneratedCa, CaError> {
    let key = KeyPair::generate()?;
    let mut params = CertificateParams::new(Vec::<String>::new())?;
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, common_name);
    dn.push(DnType::OrganizationName, "poolgate");
    params.distinguished_name = dn;
    params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    let now = OffsetDateTime::now_utc();
    params.not_before = now - TimeDuration::days(BACKDATE_DAYS);
    params.not_after = now + TimeDuration::days(CA_VALIDITY_DAYS);
    params.serial_number = Some(random_serial());
    let cert = params.self_signed(&key)?;
    Ok(GeneratedCa {
        cert_pem: cert.pem(),
        key_pem: key.serialize_pem(),
    })
}

/// Writes a new CA to `cert_path` and `key_path` (the key readable by its owner only). Existing
/// files are kept unless `force`.
pub fn write_new(
    cert_path: &Path,
    key_path: &Path,
    common_name: &str,
    force: bool,
) -> Result<(), CaError> {
    if !force {
        for (file, path) in [(CaFile::Cert, cert_path), (CaFile::Key, key_path)] {
            if path.exists() {
                return Err(CaError::Exists {
                    file,
                    path: path.to_path_buf(),
                });
            }
        }
    }
    let ca = generate(common_name)?;
    write_file(CaFile::Key, key_path, ca.key_pem.as_bytes(), 0o600)?;
    write_file(CaFile::Cert, cert_path, ca.cert_pem.as_bytes(), 0o644)?;
    Ok(())
}

fn write_file(file: CaFile, path: &Path, contents: &[u8], mode: u32) -> Result<(), CaError> {
    let err = |error| CaError::Write {
        file,
        path: path.to_path_buf(),
        error,
    };
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create(true).truncate(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt as _;
        options.mode(mode);
    }
    #[cfg(not(unix))]
    let _ = mode;
    let mut out = options.open(path).map_err(err)?;
    // A file that existed keeps its old mode through `open`; tighten it explicitly.
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt as _;
        out.set_permissions(std::fs::Permissions::from_mode(mode))
            .map_err(err)?;
    }
    out.write_all(contents).map_err(err)?;
    out.sync_all().map_err(err)
}

impl Ca {
    /// Reads and checks a CA: the certificate parses and is a CA that has not expired, the key is
    /// PKCS#8, and the two belong together.
    pub fn load(cert_path: &Path, key_path: &Path) -> Result<Ca, CaError> {
        let cert_pem = std::fs::read_to_string(cert_path).map_err(|error| CaError::Read {
            file: CaFile::Cert,
            path: cert_path.to_path_buf(),
            error,
        })?;
        let key_pem = std::fs::read_to_string(key_path).map_err(|error| CaError::Read {
            file: CaFile::Key,
            path: key_path.to_path_buf(),
            error,
        })?;
        Self::from_pem(&cert_pem, cert_path, &key_pem, key_path)
    }

    /// Like [`Ca::load`] from PEM text; the paths only name the files in errors.
    pub fn from_pem(
        cert_pem: &str,
        cert_path: &Path,
        key_pem: &str,
        key_path: &Path,
    ) -> Result<Ca, CaError> {
        let cert_der =
            CertificateDer::from_pem_slice(cert_pem.as_bytes()).map_err(|_| CaError::NoCert {
                path: cert_path.to_path_buf(),
            })?;
        let params =
            CertificateParams::from_ca_cert_der(&cert_der).map_err(|_| CaError::BadCert {
                path: cert_path.to_path_buf(),
            })?;
        if !matches!(params.is_ca, IsCa::Ca(_)) {
            return Err(CaError::NotCa {
                path: cert_path.to_path_buf(),
            });
        }
        if params.not_after <= OffsetDateTime::now_utc() {
            return Err(CaError::Expired {
                path: cert_path.to_path_buf(),
            });
        }
        let bad_key = || CaError::BadKey {
            path: key_path.to_path_buf(),
        };
        let key_der =
            PrivatePkcs8KeyDer::from_pem_slice(key_pem.as_bytes()).map_err(|_| bad_key())?;
        let key = KeyPair::try_from(&key_der).map_err(|_| bad_key())?;
        check_pair(&cert_der, key_der, key_path)?;
        // rcgen signs as an issuer certificate object: re-issue the CA's own parameters (name,
        // key identifier, usages) under its key. Only its name and key identifier reach leaves.
        let issuer = params.self_signed(&key).map_err(|_| CaError::BadCert {
            path: cert_path.to_path_buf(),
        })?;
        Ok(Ca {
            issuer,
            key,
            cert_der,
        })
    }

    /// The CA certificate, sent after each leaf so clients can build the chain.
    pub fn cert_der(&self) -> &CertificateDer<'static> {
        &self.cert_der
    }

    /// Signs a leaf for `name` (a DNS name or an IP literal) carrying `leaf_key`'s public key.
    pub fn sign_leaf(
        &self,
        name: &str,
        leaf_key: &KeyPair,
    ) -> Result<CertificateDer<'static>, rcgen::Error> {
        let mut params = CertificateParams::new(vec![name.to_string()])?;
        let mut dn = DistinguishedName::new();
        if name.len() <= MAX_COMMON_NAME {
            dn.push(DnType::CommonName, name);
        }
        params.distinguished_name = dn;
        params.is_ca = IsCa::ExplicitNoCa;
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        params.use_authority_key_identifier_extension = true;
        // Every leaf shares one key, so serials must not be derived from it: clients reject two
        // certificates from one issuer with the same serial.
        params.serial_number = Some(random_serial());
        let now = OffsetDateTime::now_utc();
        params.not_before = now - TimeDuration::days(BACKDATE_DAYS);
        params.not_after = now + TimeDuration::days(LEAF_VALIDITY_DAYS);
        let cert = params.signed_by(leaf_key, &self.issuer, &self.key)?;
        Ok(cert.der().clone())
    }
}

/// Whether the private key belongs to the certificate (their public keys are compared).
fn check_pair(
    cert: &CertificateDer<'static>,
    key: PrivatePkcs8KeyDer<'static>,
    key_path: &Path,
) -> Result<(), CaError> {
    let provider = rustls::crypto::ring::default_provider();
    let signing = provider
        .key_provider
        .load_private_key(PrivateKeyDer::Pkcs8(key))
        .map_err(|_| CaError::BadKey {
            path: key_path.to_path_buf(),
        })?;
    let pair = rustls::sign::CertifiedKey::new(vec![cert.clone()], signing);
    match pair.keys_match() {
        Ok(()) => Ok(()),
        // The key type cannot tell its public key: nothing to compare, let signing decide.
        Err(rustls::Error::InconsistentKeys(rustls::InconsistentKeys::Unknown)) => Ok(()),
        Err(_) => Err(CaError::Mismatch {
            path: key_path.to_path_buf(),
        }),
    }
}

/// A positive 127-bit serial number (RFC 5280 allows up to 20 octets).
fn random_serial() -> SerialNumber {
    let mut bytes: [u8; 16] = rand::random();
    bytes[0] &= 0x7f;
    // A leading zero octet would be dropped in DER and shorten it; keep 16 octets.
    bytes[0] |= 0x01;
    SerialNumber::from_slice(&bytes)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use rustls::client::danger::ServerCertVerifier as _;

    use super::*;

    #[test]
    fn generated_ca_loads_and_a_foreign_key_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let (cert, key) = (dir.path().join("ca.pem"), dir.path().join("ca-key.pem"));
        write_new(&cert, &key, DEFAULT_CA_COMMON_NAME, false).unwrap();
        Ca::load(&cert, &key).unwrap();
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt as _;
            let mode = std::fs::metadata(&key).unwrap().permissions().mode();
            assert_eq!(mode & 0o777, 0o600);
        }
        assert!(matches!(
            write_new(&cert, &key, DEFAULT_CA_COMMON_NAME, false),
            Err(CaError::Exists { .. })
        ));

        let other = generate("other").unwrap();
        let other_key = dir.path().join("other-key.pem");
        std::fs::write(&other_key, other.key_pem).unwrap();
        let err = Ca::load(&cert, &other_key).unwrap_err();
        assert!(matches!(err, CaError::Mismatch { .. }), "{err}");
        assert_eq!(err.file(), CaFile::Key);
        // The key's text never appears in the message.
        assert!(!err.to_string().contains("PRIVATE"));

        let err = Ca::load(&key, &key).unwrap_err();
        assert_eq!(err.file(), CaFile::Cert, "{err}");
    }

    #[test]
    fn a_leaf_chains_to_the_ca() {
        let made = generate("t").unwrap();
        let ca = Ca::from_pem(
            &made.cert_pem,
            Path::new("c"),
            &made.key_pem,
            Path::new("k"),
        )
        .unwrap();
        let leaf_key = KeyPair::generate().unwrap();
        let leaf = ca.sign_leaf("shop.example", &leaf_key).unwrap();

        let mut roots = rustls::RootCertStore::empty();
        roots.add(ca.cert_der().clone()).unwrap();
        let verifier = rustls::client::WebPkiServerVerifier::builder_with_provider(
            Arc::new(roots),
            Arc::new(rustls::crypto::ring::default_provider()),
        )
        .build()
        .unwrap();
        let name = rustls::pki_types::ServerName::try_from("shop.example").unwrap();
        verifier
            .verify_server_cert(&leaf, &[], &name, &[], rustls::pki_types::UnixTime::now())
            .unwrap();
        let ip = ca.sign_leaf("127.0.0.1", &leaf_key).unwrap();
        let name = rustls::pki_types::ServerName::try_from("127.0.0.1").unwrap();
        verifier
            .verify_server_cert(&ip, &[], &name, &[], rustls::pki_types::UnixTime::now())
            .unwrap();
    }
}
