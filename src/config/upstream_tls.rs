//! `[upstream_tls]`: what `https://` upstream proxies are trusted with.

use std::path::PathBuf;

use super::file::FileUpstreamTls;
use super::validate::Validator;

#[derive(Clone, Debug)]
pub struct UpstreamTlsConfig {
    /// Extra CA certificates (PEM) trusted for `https://` upstream proxies.
    pub ca_file: Option<PathBuf>,
    /// Whether the system's roots are trusted too.
    pub system_roots: bool,
}

impl Validator {
    pub(super) fn upstream_tls(&mut self, f: &FileUpstreamTls) -> UpstreamTlsConfig {
        let upstream_tls = UpstreamTlsConfig {
            ca_file: f.ca_file.as_deref().map(|p| self.path(p)),
            system_roots: f.system_roots.unwrap_or(true),
        };
        if let Some(ca) = &upstream_tls.ca_file {
            if !ca.is_file() {
                self.problem(
                    "upstream_tls.ca_file",
                    format!("no such file: {}", ca.display()),
                );
            }
        }
        upstream_tls
    }
}
