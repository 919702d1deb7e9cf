//! `[log]` (the access log) and `[metrics]` (bounds on the exported series): what operators
//! read besides `/status`. `[log]` is fixed at start (a reload that changes it is refused);
//! `[metrics]` follows the live config.

use std::path::PathBuf;

use super::file::{FileLog, FileMetrics};
use super::validate::Validator;

/// Lines the access log queues for its writer; past it lines are dropped and counted, never
/// waited for.
pub const DEFAULT_ACCESS_BUFFER_LINES: usize = 8192;
pub const MAX_ACCESS_BUFFER_LINES: usize = 1 << 20;
/// Pools with at most this many members export bytes per upstream; larger pools per pool only.
pub const DEFAULT_PER_UPSTREAM_MAX: usize = 1000;

/// Where access-log lines go.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AccessTarget {
    Stderr,
    /// Appended to; reopened on SIGHUP and SIGUSR1 (for logrotate).
    File(PathBuf),
}

/// How a line is written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AccessFormat {
    /// One JSON object per line, with stable keys (docs/operations.md, "Access log").
    Json,
    /// Apache's combined format followed by `key=value` fields.
    Combined,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LogConfig {
    /// `None`: no access log (the default).
    pub access: Option<AccessTarget>,
    pub access_format: AccessFormat,
    /// Bound of the queue between the request path and the writer.
    pub access_buffer_lines: usize,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MetricsConfig {
    /// Bytes are exported per upstream only for pools of at most this many members (label
    /// cardinality stays bounded); larger pools are exported per pool alone.
    pub per_upstream_max: usize,
}

impl Default for LogConfig {
    fn default() -> Self {
        LogConfig {
            access: None,
            access_format: AccessFormat::Json,
            access_buffer_lines: DEFAULT_ACCESS_BUFFER_LINES,
        }
    }
}

impl Default for MetricsConfig {
    fn default() -> Self {
        MetricsConfig {
            per_upstream_max: DEFAULT_PER_UPSTREAM_MAX,
        }
    }
}

impl Validator {
    pub(super) fn log(&mut self, f: &FileLog) -> LogConfig {
        let access = match f.access.as_deref() {
            None => None,
            Some("") => {
                self.problem("log.access", "must be \"stderr\" or a file path");
                None
            }
            Some("stderr") => Some(AccessTarget::Stderr),
            Some(path) => {
                let path = self.path(std::path::Path::new(path));
                let dir = path
                    .parent()
                    .filter(|d| !d.as_os_str().is_empty())
                    .map_or_else(|| PathBuf::from("."), std::path::Path::to_path_buf);
                if path.is_dir() {
                    self.problem(
                        "log.access",
                        format!("`{}` is a directory, not a file", path.display()),
                    );
                } else if !dir.is_dir() {
                    self.problem(
                        "log.access",
                        format!("the folder `{}` does not exist", dir.display()),
                    );
                }
                Some(AccessTarget::File(path))
            }
        };
        let access_format = match f.access_format.as_deref() {
            None | Some("json") => AccessFormat::Json,
            Some("combined") => AccessFormat::Combined,
            Some(other) => {
                self.problem(
                    "log.access_format",
                    format!("`{other}` is not one of \"json\", \"combined\""),
                );
                AccessFormat::Json
            }
        };
        if access.is_none() {
            for (key, set) in [
                ("log.access_format", f.access_format.is_some()),
                ("log.access_buffer_lines", f.access_buffer_lines.is_some()),
            ] {
                if set {
                    self.problem(key, "only used with log.access");
                }
            }
        }
        let mut access_buffer_lines = self.positive(
            "log.access_buffer_lines",
            f.access_buffer_lines,
            DEFAULT_ACCESS_BUFFER_LINES,
        );
        if access_buffer_lines > MAX_ACCESS_BUFFER_LINES {
            self.problem(
                "log.access_buffer_lines",
                format!("at most {MAX_ACCESS_BUFFER_LINES}"),
            );
            access_buffer_lines = DEFAULT_ACCESS_BUFFER_LINES;
        }
        LogConfig {
            access,
            access_format,
            access_buffer_lines,
        }
    }

    pub(super) fn metrics(&mut self, f: &FileMetrics) -> MetricsConfig {
        MetricsConfig {
            per_upstream_max: f.per_upstream_max.unwrap_or(DEFAULT_PER_UPSTREAM_MAX),
        }
    }
}
