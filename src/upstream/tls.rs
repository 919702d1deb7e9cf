//! TLS settings for `https://` upstream proxies (TLS to the proxy itself).

use std::sync::Arc;

use rustls::ClientConfig;
use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject;

use crate::config::UpstreamTlsConfig;

#[derive(Debug, thiserror::Error)]
pub enum TlsSetupError {
    #[error("upstream_tls.ca_file: {0}")]
    CaFile(String),
    #[error("upstream_tls: no trusted roots (system roots unavailable and no ca_file)")]
    NoRoots,
    #[error("upstream_tls: {0}")]
    Rustls(#[from] rustls::Error),
}

/// The client config used towards https:// upstreams: the system roots (unless disabled) plus the
/// configured CA file.
pub fn client_config(cfg: &UpstreamTlsConfig) -> Result<Arc<ClientConfig>, TlsSetupError> {
    let mut roots = rustls::RootCertStore::empty();
    if cfg.system_roots {
        let found = rustls_native_certs::load_native_certs();
        for cert in found.certs {
            // One unparsable system certificate must not take the others down.
            let _ = roots.add(cert);
        }
    }
    if let Some(path) = &cfg.ca_file {
        let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(path)
            .map_err(|e| TlsSetupError::CaFile(format!("{}: {e}", path.display())))?
            .collect::<Result<_, _>>()
            .map_err(|e| TlsSetupError::CaFile(format!("{}: {e}", path.display())))?;
        if certs.is_empty() {
            return Err(TlsSetupError::CaFile(format!(
                "{}: no certificate found",
                path.display()
            )));
        }
        for cert in certs {
            roots
                .add(cert)
                .map_err(|e| TlsSetupError::CaFile(format!("{}: {e}", path.display())))?;
        }
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}
