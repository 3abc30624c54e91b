//! rproxy: an HTTP proxy pair that sends rsync deltas instead of whole
//! responses.
//!
//! ```text
//!  user agent ──► client proxy ══ hsync/1 ══► accelerator ──► origin
//!                 (cache, basis,              (diffs the fresh body
//!                  rebuild, verify)            against the client's
//!                                              basis signature)
//! ```
//!
//! [`hsync`] is the wire codec, sans-IO: the accelerator's [`hsync::Encoder`]
//! turns a body into DELTA/SIG/END frames against a basis signature, and the
//! client's [`hsync::Decoder`] rebuilds and verifies it. [`cli`] holds the
//! `rproxy hsync` tools around the codec.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod accelerator;
pub mod cache;
pub mod cli;
pub mod client_proxy;
pub mod config;
pub mod demo;
pub mod expiring;
pub mod hsync;
pub mod http;
pub mod queue;
