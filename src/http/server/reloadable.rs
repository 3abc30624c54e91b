//! A role that can be replaced while it serves ([`Reloadable`]): the
//! configuration reload on SIGHUP builds a new role and swaps it in.
//!
//! Each request takes the role current when it arrives and keeps it to its
//! end, so a request (and its body) under way at a reload finishes with
//! the configuration it started with; the next request gets the new one.
//! Nothing is dropped: the old role lives on until its last request ends.
//!
//! Leaves out what a role shares between its versions (the cache, the
//! counters, queue state): that is each role's `reconfigured`.

use std::sync::{Arc, PoisonError, RwLock};

use hyper::{Request, Response};

use super::body::ProxyBody;
use super::handler::{ConnectionNumber, Handler};
use super::request_body::RequestBody;

/// A role behind a swap: see the module documentation.
pub struct Reloadable<H> {
    current: RwLock<Arc<H>>,
}

impl<H: Handler> Reloadable<H> {
    /// Serves `role` until [`Reloadable::replace`] swaps it.
    pub fn new(role: H) -> Reloadable<H> {
        Reloadable {
            current: RwLock::new(Arc::new(role)),
        }
    }

    /// The role new requests go to.
    pub fn current(&self) -> Arc<H> {
        // A panic while swapping leaves the pointer whole: no poisoning
        // can make it unsafe to read.
        self.current
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Sends the next requests to `role`; the one replaced serves the
    /// requests it has until they end.
    pub fn replace(&self, role: H) {
        *self.current.write().unwrap_or_else(PoisonError::into_inner) = Arc::new(role);
    }
}

impl<H: Handler> Handler for Reloadable<H> {
    async fn handle(self: Arc<Self>, request: Request<RequestBody>) -> Response<ProxyBody> {
        self.current().handle(request).await
    }

    fn connection_closed(&self, number: ConnectionNumber) {
        self.current().connection_closed(number);
    }

    fn stopped(&self) {
        self.current().stopped();
    }

    fn reopen_logs(&self) {
        self.current().reopen_logs();
    }
}
