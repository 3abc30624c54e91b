//! The connection limits both roles share, as flags.

use std::time::Duration;

use clap::Args;

use super::client::parse_size;
use crate::server::ConnectionLimits;

/// Limits on what a client may send and hold, and their defaults.
#[derive(Debug, Args)]
pub struct LimitArgs {
    /// Seconds a client has to send a whole request head (408, then
    /// close). Also how long an idle keep-alive connection stays open.
    #[arg(long, default_value_t = 10, value_name = "SECS")]
    pub header_read_timeout: u64,
    /// Seconds a connection with a request under way may go without a
    /// byte moving either way (a stalled upload or reader, an origin gone
    /// quiet mid-body) before it is closed.
    #[arg(long, default_value_t = 60, value_name = "SECS")]
    pub idle_timeout: u64,
    /// Largest request head, request line included (431 beyond): bytes,
    /// or with a K or M suffix.
    #[arg(long, default_value = "64K", value_parser = parse_size, value_name = "BYTES")]
    pub max_head: u64,
    /// Most header fields in a request (431 beyond).
    #[arg(long, default_value_t = 100, value_name = "N")]
    pub max_headers: usize,
    /// Longest request target, the URL of the request line (414 beyond):
    /// bytes, or with a K suffix.
    #[arg(long, default_value = "8K", value_parser = parse_size, value_name = "BYTES")]
    pub max_target: u64,
    /// Most proxies a request may have passed, counted in Via (508
    /// Loop Detected beyond).
    #[arg(long, default_value_t = 10, value_name = "N")]
    pub max_hops: usize,
    /// Connections served at once; more wait in the listen backlog. The
    /// open-file limit is raised to fit, as far as the hard limit allows.
    #[arg(long, default_value_t = 16384, value_name = "N")]
    pub max_connections: usize,
    /// Requests served at once on one HTTP/2 connection (TLS with h2);
    /// more are refused for the client to retry.
    #[arg(long, default_value_t = 128, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    pub max_streams: u32,
}

impl LimitArgs {
    /// The limits for the connection layer.
    pub fn limits(&self) -> ConnectionLimits {
        let bytes = |n: u64| usize::try_from(n).unwrap_or(usize::MAX);
        ConnectionLimits {
            header_read_timeout: Duration::from_secs(self.header_read_timeout),
            max_head_bytes: bytes(self.max_head),
            max_headers: self.max_headers,
            max_target_bytes: bytes(self.max_target),
            idle_timeout: Duration::from_secs(self.idle_timeout),
            max_hops: self.max_hops,
            max_connections: self.max_connections,
            max_streams: self.max_streams,
        }
    }
}
