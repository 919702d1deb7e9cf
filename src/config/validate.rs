//! The validator core: problems with their keys, and the readers of values that several
//! sections share (durations, addresses, paths, ratios, positive numbers).

use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Collects every problem of a file, each with its key, while building the validated config.
pub(super) struct Validator {
    pub(super) problems: Vec<String>,
    /// Folder that relative paths are taken from.
    pub(super) base: Option<PathBuf>,
}

impl Validator {
    pub(super) fn problem(&mut self, key: &str, msg: impl fmt::Display) {
        self.problems.push(format!("{key}: {msg}"));
    }

    pub(super) fn duration(&mut self, key: &str, value: Option<&str>, default_ms: u64) -> Duration {
        match value {
            None => Duration::from_millis(default_ms),
            Some(s) => match humantime::parse_duration(s) {
                Ok(d) if !d.is_zero() => d,
                Ok(_) => {
                    self.problem(key, "must be greater than zero");
                    Duration::from_millis(default_ms)
                }
                Err(e) => {
                    self.problem(
                        key,
                        format!("`{s}` is not a duration like \"5s\" or \"10m\" ({e})"),
                    );
                    Duration::from_millis(default_ms)
                }
            },
        }
    }

    pub(super) fn addr(&mut self, key: &str, value: Option<&str>, default: &str) -> SocketAddr {
        let s = value.unwrap_or(default);
        match s.parse() {
            Ok(a) => a,
            Err(_) => {
                self.problem(
                    key,
                    format!("`{s}` is not an address like \"127.0.0.1:8080\""),
                );
                SocketAddr::from(([127, 0, 0, 1], 0))
            }
        }
    }

    pub(super) fn path(&self, p: &Path) -> PathBuf {
        match &self.base {
            Some(base) if p.is_relative() => base.join(p),
            _ => p.to_path_buf(),
        }
    }

    pub(super) fn ratio(&mut self, key: &str, value: Option<f64>, default: f64) -> f64 {
        match value {
            None => default,
            Some(v) if (0.0..=1.0).contains(&v) => v,
            Some(v) => {
                self.problem(key, format!("{v} is not a ratio between 0 and 1"));
                default
            }
        }
    }

    pub(super) fn positive<T: PartialOrd + Default + Copy + fmt::Display>(
        &mut self,
        key: &str,
        value: Option<T>,
        default: T,
    ) -> T {
        match value {
            Some(v) if v <= T::default() => {
                self.problem(key, "must be greater than zero");
                default
            }
            Some(v) => v,
            None => default,
        }
    }
}
