//! `[intercept]`: the interception CA, checked at load.

use crate::intercept::{self, InterceptConfig};

use super::file::FileIntercept;
use super::validate::Validator;

impl Validator {
    /// `[intercept]`: both CA files readable, parsable and matching; `None` when unusable.
    pub(super) fn intercept(&mut self, f: FileIntercept) -> Option<InterceptConfig> {
        let cert = f.ca_cert.as_deref().map(|p| self.path(p));
        let key = f.ca_key.as_deref().map(|p| self.path(p));
        if cert.is_none() {
            self.problem(
                "intercept.ca_cert",
                "required (`poolgate ca init` writes one)",
            );
        }
        if key.is_none() {
            self.problem(
                "intercept.ca_key",
                "required (`poolgate ca init` writes one)",
            );
        }
        let size = f
            .cert_cache_size
            .unwrap_or(intercept::DEFAULT_CERT_CACHE_SIZE);
        let cert_cache_size = std::num::NonZeroUsize::new(size);
        if cert_cache_size.is_none() {
            self.problem("intercept.cert_cache_size", "must be greater than zero");
        }
        let origin_ca_file = f.origin_ca_file.as_deref().map(|p| self.path(p));
        if let Some(p) = &origin_ca_file {
            if !p.is_file() {
                self.problem(
                    "intercept.origin_ca_file",
                    format!("no such file: {}", p.display()),
                );
            }
        }
        let (ca_cert, ca_key) = (cert?, key?);
        if let Err(e) = intercept::ca::Ca::load(&ca_cert, &ca_key) {
            let key = match e.file() {
                intercept::ca::CaFile::Cert => "intercept.ca_cert",
                intercept::ca::CaFile::Key => "intercept.ca_key",
            };
            self.problem(key, e);
        }
        Some(InterceptConfig {
            ca_cert,
            ca_key,
            cert_cache_size: cert_cache_size?,
            origin_ca_file,
        })
    }
}
