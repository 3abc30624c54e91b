//! Running under systemd: readiness, reloads and stopping told to the
//! service manager (`Type=notify`, the sd_notify protocol), and a
//! listening socket it passes (socket activation, `Accept=no`). Outside
//! systemd (no `NOTIFY_SOCKET`, no `LISTEN_FDS`) all of it does nothing.
//!
//! The binary takes the passed descriptor ([`hand_over_listener`]): owning
//! a raw descriptor needs `unsafe`, which the library forbids.

use std::sync::{Mutex, PoisonError};

use sd_notify::NotifyState;

/// The listening socket systemd passed, until the role takes it.
static ACTIVATED: Mutex<Option<std::net::TcpListener>> = Mutex::new(None);

/// Keeps `listener`, passed by systemd, for the role to serve instead of
/// binding its `listen` address.
pub fn hand_over_listener(listener: std::net::TcpListener) {
    *ACTIVATED.lock().unwrap_or_else(PoisonError::into_inner) = Some(listener);
}

/// The listening socket systemd passed, if any (once).
pub(super) fn activated_listener() -> Option<std::net::TcpListener> {
    ACTIVATED
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .take()
}

fn notify(states: &[NotifyState]) {
    if let Err(error) = sd_notify::notify(states) {
        tracing::warn!(%error, "cannot tell systemd (NOTIFY_SOCKET) how we are");
    }
}

/// Serving: `systemctl start` returns.
pub(super) fn ready(status: &str) {
    notify(&[NotifyState::Ready, NotifyState::Status(status)]);
}

/// A reload has begun (`systemctl reload` waits for [`ready`] again).
pub(super) fn reloading() {
    match NotifyState::monotonic_usec_now() {
        Ok(now) => notify(&[NotifyState::Reloading, now]),
        Err(_) => notify(&[NotifyState::Reloading]),
    }
}

/// Draining before the exit.
pub(super) fn stopping() {
    notify(&[NotifyState::Stopping, NotifyState::Status("draining")]);
}
