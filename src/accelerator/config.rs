//! The accelerator's settings once validated ([`AcceleratorConfig`]), and
//! why a configuration cannot be used ([`ConfigError`]). Filling them from a
//! file and flags, with their defaults, is [`crate::config`]'s job; what
//! each setting does is the role's.

use std::time::Duration;

use http::Uri;
use http::header::HeaderValue;

use crate::hsync::EncoderOptions;
use crate::queue::QueueConfig;

/// Accelerator settings, validated.
#[derive(Debug, Clone)]
pub struct AcceleratorConfig {
    /// The origin, `http://host[:port]`.
    pub origin: Uri,
    /// Our name in `Via`.
    pub via_name: HeaderValue,
    /// Encoder settings.
    pub encoder: EncoderOptions,
    /// Past the high-level budget, entropy-code literals only while that
    /// is faster than sending them without (see [`super::pace`]); false
    /// codes them always.
    pub adapt_entropy_coding: bool,
    /// Largest origin body encoded (bytes); larger ones pass through.
    pub max_encode_len: u64,
    /// Largest basis signature accepted from a request (bytes, decoded).
    pub max_signature_bytes: usize,
    /// Time to connect to the origin.
    pub connect_timeout: Duration,
    /// Time for the origin's response head.
    pub origin_timeout: Duration,
    /// Memory for bodies served, kept as future bases (bytes; 0: none).
    pub basis_store_bytes: usize,
    /// Largest body kept there (bytes).
    pub max_stored_body: usize,
    /// Keep every coded body there, including `private`, `no-store` and
    /// cookie-setting responses and answers to requests with credentials.
    /// Off by default: the store is then an oracle, since a client naming
    /// a body's hash learns from the codec whether someone was served it
    /// (D-B3, see [`super::basis_store::shareable`]).
    pub basis_store_private: bool,
    /// Upload slots and their queue (issue 5); `None` serves every request
    /// at once.
    pub queue: Option<QueueConfig>,
    /// Where the queue is saved every second and reloaded at start-up, so
    /// places survive a restart.
    pub queue_state: Option<std::path::PathBuf>,
    /// Encoders that run at once (0: one per core). The others wait for
    /// a turn, one per chunk of the origin body, so a burst of large bodies
    /// leaves the async workers, and cheap requests, their share of the CPU
    /// (D-S6).
    pub max_encoders: usize,
    /// Where a coded body is parked for a client that stopped reading
    /// (see [`crate::http::spool`]).
    pub spool_dir: std::path::PathBuf,
    /// Most bytes of a coded body parked ahead of its reader (0: never
    /// parked; the encoder then waits for the reader, holding its state).
    pub max_spool: u64,
    /// Disk that all parked bodies take together (bytes); past it, a
    /// coded body whose client stops reading waits in memory.
    pub max_spool_total: u64,
    /// Memory that streamed codings hold at once (bytes; 0: no bound):
    /// past it, a coded response waits for its turn before reading its
    /// origin body (see [`crate::http::transfer_memory`]).
    pub transfer_memory: u64,
}

/// Why the configuration cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The origin URL is not `http://host[:port]`.
    #[error("origin {origin} must be http://host[:port] (no path, no TLS yet)")]
    BadOrigin {
        /// The URL given.
        origin: String,
    },
}
