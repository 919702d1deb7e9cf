//! A throw-away certificate authority for TLS tests (rcgen 0.13, ring).
//!
//! Every rustls config is built with `builder_with_provider(ring)`, so no
//! process-wide default crypto provider is needed.

use std::sync::Arc;

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair,
    KeyUsagePurpose,
};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer, ServerName};
use rustls::{ClientConfig, RootCertStore, ServerConfig};

/// A test CA: a self-signed root that signs leaf certificates on demand.
pub struct TestCa {
    cert: rcgen::Certificate,
    key: KeyPair,
}

impl std::fmt::Debug for TestCa {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TestCa").finish_non_exhaustive()
    }
}

impl Default for TestCa {
    fn default() -> Self {
        Self::new()
    }
}

/// The ring crypto provider, shared by every config built here.
pub fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

impl TestCa {
    /// Generates a fresh CA (ECDSA P-256).
    pub fn new() -> Self {
        let key = KeyPair::generate().expect("generate CA key");
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("CA params");
        params
            .distinguished_name
            .push(DnType::CommonName, "poolgate test CA");
        params
            .distinguished_name
            .push(DnType::OrganizationName, "poolgate tests");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let cert = params.self_signed(&key).expect("self-sign CA");
        Self { cert, key }
    }

    /// The CA certificate in PEM (e.g. for `reqwest::Certificate::from_pem`).
    pub fn cert_pem(&self) -> String {
        self.cert.pem()
    }

    /// The CA certificate in DER.
    pub fn cert_der(&self) -> CertificateDer<'static> {
        self.cert.der().clone()
    }

    /// A root store containing only this CA.
    pub fn root_store(&self) -> RootCertStore {
        let mut roots = RootCertStore::empty();
        roots.add(self.cert_der()).expect("add CA to root store");
        roots
    }

    /// Issues a leaf certificate for `names` (DNS names or IP literals),
    /// signed by this CA. Returns the chain (leaf, CA) and the leaf's key.
    pub fn leaf(&self, names: &[&str]) -> (Vec<CertificateDer<'static>>, PrivateKeyDer<'static>) {
        let leaf_key = KeyPair::generate().expect("generate leaf key");
        let sans: Vec<String> = names.iter().map(|s| (*s).to_string()).collect();
        let mut params = CertificateParams::new(sans).expect("leaf params");
        params.distinguished_name.push(
            DnType::CommonName,
            names.first().copied().unwrap_or("localhost"),
        );
        params.is_ca = IsCa::ExplicitNoCa;
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        params.use_authority_key_identifier_extension = true;
        let leaf = params
            .signed_by(&leaf_key, &self.cert, &self.key)
            .expect("sign leaf");
        let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(leaf_key.serialize_der()));
        (vec![leaf.der().clone(), self.cert_der()], key)
    }

    /// A leaf for `names` usable by a server and as a client certificate, in PEM: (certificate
    /// chain, PKCS#8 key). For servers outside this process (redis-server `tls-port`).
    pub fn leaf_pem(&self, names: &[&str]) -> (String, String) {
        let leaf_key = KeyPair::generate().expect("generate leaf key");
        let sans: Vec<String> = names.iter().map(|s| (*s).to_string()).collect();
        let mut params = CertificateParams::new(sans).expect("leaf params");
        params.distinguished_name.push(
            DnType::CommonName,
            names.first().copied().unwrap_or("localhost"),
        );
        params.is_ca = IsCa::ExplicitNoCa;
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        params.extended_key_usages = vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ];
        params.use_authority_key_identifier_extension = true;
        let leaf = params
            .signed_by(&leaf_key, &self.cert, &self.key)
            .expect("sign leaf");
        (leaf.pem() + &self.cert.pem(), leaf_key.serialize_pem())
    }

    /// A server config presenting a leaf for `names` signed by this CA.
    /// ALPN: `http/1.1` only.
    pub fn server_config(&self, names: &[&str]) -> Arc<ServerConfig> {
        let (chain, key) = self.leaf(names);
        let mut cfg = ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .expect("protocol versions")
            .with_no_client_auth()
            .with_single_cert(chain, key)
            .expect("server cert");
        cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
        Arc::new(cfg)
    }

    /// A client config trusting only this CA.
    pub fn client_config(&self) -> Arc<ClientConfig> {
        let cfg = ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .expect("protocol versions")
            .with_root_certificates(self.root_store())
            .with_no_client_auth();
        Arc::new(cfg)
    }

    /// `tokio_rustls` acceptor for `names`.
    pub fn acceptor(&self, names: &[&str]) -> tokio_rustls::TlsAcceptor {
        tokio_rustls::TlsAcceptor::from(self.server_config(names))
    }

    /// `tokio_rustls` connector trusting only this CA.
    pub fn connector(&self) -> tokio_rustls::TlsConnector {
        tokio_rustls::TlsConnector::from(self.client_config())
    }

    /// `reqwest` root certificate for this CA.
    pub fn reqwest_cert(&self) -> reqwest::Certificate {
        reqwest::Certificate::from_pem(self.cert_pem().as_bytes()).expect("CA pem")
    }
}

/// `ServerName` from a host string (DNS name or IP literal).
pub fn server_name(host: &str) -> ServerName<'static> {
    ServerName::try_from(host.to_string()).expect("server name")
}
