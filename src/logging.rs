//! The diagnostic log (`tracing`): set up once by the binary, its level
//! from `RUST_LOG` or else the configuration's `log-level`, which a reload
//! may change. Colour only for a person at a terminal. The access log,
//! one line per request, is [`crate::http::access_log`]'s.

use std::sync::OnceLock;

use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Registry, reload};

use crate::config::UsageError;

/// The level in force until a role's configuration sets one.
pub const DEFAULT_LEVEL: &str = "info";

/// Where [`set_level`] changes the level; unset when `RUST_LOG` decides it
/// (or in tests, which set up no subscriber).
static LEVEL: OnceLock<reload::Handle<EnvFilter, Registry>> = OnceLock::new();

/// Sends diagnostics to stderr (nothing at all when `quiet`: under inetd
/// stderr may be the connection).
pub fn init(quiet: bool) {
    let from_environment = std::env::var_os("RUST_LOG").is_some();
    let filter = if quiet {
        EnvFilter::new("off")
    } else {
        EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(DEFAULT_LEVEL))
    };
    let (filter, handle) = reload::Layer::new(filter);
    if !quiet && !from_environment {
        let _ = LEVEL.set(handle);
    }
    let colour = std::io::IsTerminal::is_terminal(&std::io::stderr())
        && std::env::var_os("NO_COLOR").is_none();
    tracing_subscriber::registry()
        .with(filter)
        .with(
            tracing_subscriber::fmt::layer()
                .with_writer(std::io::stderr)
                .with_ansi(colour),
        )
        .init();
}

/// Checks a `log-level` directive (`info`, `warn,rproxy::cache=debug`…).
///
/// # Errors
/// A directive `RUST_LOG` would not take either.
pub fn parse_level(directive: &str) -> Result<EnvFilter, UsageError> {
    EnvFilter::builder()
        .parse(directive)
        .map_err(|e| UsageError(format!("log-level {directive:?}: {e}")))
}

/// Sets the diagnostic level to `directive`, unless `RUST_LOG` set it.
///
/// # Errors
/// A bad directive ([`parse_level`]).
pub fn set_level(directive: &str) -> Result<(), UsageError> {
    let filter = parse_level(directive)?;
    if let Some(handle) = LEVEL.get() {
        handle
            .reload(filter)
            .map_err(|e| UsageError(format!("log-level: {e}")))?;
    }
    Ok(())
}
