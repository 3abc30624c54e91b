//! The log settings both roles share, as flags; their defaults are
//! [`LogSettings`]'s.

use clap::Args;

use crate::config::{LogSettings, override_with_flags};
use crate::http::access_log::LogFormat;

/// Where and how the logs go (`[log]` in the file).
#[derive(Debug, Args)]
pub struct LogArgs {
    /// The diagnostic log's level, as RUST_LOG takes it (info, debug,
    /// warn,rproxy::cache=debug); RUST_LOG, when set, wins.
    #[arg(long, value_name = "LEVEL")]
    pub log_level: Option<String>,
    /// Where the access log (a line per request) goes: stderr, off, or a
    /// file, appended to and reopened on SIGUSR1 (for logrotate).
    #[arg(long, value_name = "stderr|off|FILE")]
    pub access_log: Option<String>,
    /// The access log's lines: logfmt (key=value) or json.
    #[arg(long, value_enum)]
    pub log_format: Option<LogFormat>,
}

impl LogArgs {
    /// Sets the log settings given as flags.
    pub fn apply(&self, settings: &mut LogSettings) {
        override_with_flags!(settings, self;
            plain: log_level, access_log, log_format;
            optional: ;
            switches: );
    }
}
