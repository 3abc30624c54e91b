//! The connection limits both roles share, as flags; their defaults are
//! [`LimitSettings`]'s.

use std::time::Duration;

use clap::Args;

use crate::config::units::{Size, parse_duration};
use crate::config::{LimitSettings, override_with_flags};

/// Limits on what a client may send and hold (`[limits]` in the file).
#[derive(Debug, Args)]
pub struct LimitArgs {
    /// Time a client has to send a whole request head (408, then close):
    /// 30s, 5m, 100ms or seconds. Also how long an idle keep-alive
    /// connection stays open, and the grace of --min-upload-rate.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub header_read_timeout: Option<Duration>,
    /// Time a connection with a request under way may go without a byte
    /// moving either way (a stalled upload or reader, an origin gone quiet
    /// mid-body) before it is closed, with a 408 first for a request body
    /// that stalled before its answer began: 30s, 5m, 100ms or seconds.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub idle_timeout: Option<Duration>,
    /// Least rate a request body must average, in bytes per second (K, M
    /// or G suffix allowed; 0: none): a body may take the header read
    /// timeout, plus a second per this many bytes it sent, counting only
    /// time spent waiting for its bytes; past that, 408 and close (over
    /// HTTP/2, per stream: 408 or a reset, and the connection goes on).
    /// Stops uploads trickled a few bytes at a time from holding
    /// connections for ever.
    #[arg(long, value_name = "BYTES")]
    pub min_upload_rate: Option<Size>,
    /// Largest request head, request line included (431 beyond): bytes,
    /// or with a K, M or G suffix.
    #[arg(long, value_name = "SIZE")]
    pub max_head: Option<Size>,
    /// Most header fields in a request (431 beyond).
    #[arg(long, value_name = "N")]
    pub max_headers: Option<usize>,
    /// Longest request target, the URL of the request line (414 beyond):
    /// bytes, or with a K, M or G suffix.
    #[arg(long, value_name = "SIZE")]
    pub max_target: Option<Size>,
    /// Most proxies a request may have passed, counted in Via (508
    /// Loop Detected beyond).
    #[arg(long, value_name = "N")]
    pub max_hops: Option<usize>,
    /// Connections served at once; more wait in the listen backlog. The
    /// open-file limit is raised to fit, as far as the hard limit allows.
    #[arg(long, value_name = "N")]
    pub max_connections: Option<usize>,
    /// Requests served at once on one HTTP/2 connection (TLS with h2);
    /// more are refused for the client to retry.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    pub max_streams: Option<u32>,
    /// On SIGTERM or SIGINT, no new connection is accepted, idle ones
    /// close, and requests under way have this long to finish before the
    /// process exits (0): 30s, 5m, 100ms or seconds.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub drain_timeout: Option<Duration>,
}

impl LimitArgs {
    /// Sets the limits given as flags.
    pub fn apply(&self, settings: &mut LimitSettings) {
        override_with_flags!(settings, self;
            plain: header_read_timeout, idle_timeout, min_upload_rate, max_head, max_headers,
                max_target,
                max_hops, max_connections, max_streams, drain_timeout;
            optional: ;
            switches: );
    }
}
