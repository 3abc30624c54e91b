//! A parent-mode site's CONNECT tunnels: the 1999 parent proxy tunnels
//! for its authenticated client proxies (and their user agents'
//! `https://` URLs) as it fetches `http://` ones for them. Which tunnel
//! may be opened is [`Sites::tunnel`](super::sites::Sites)'s (the
//! parent's hosts and ports; an address literal the policy permits); the
//! addresses a name resolves to are checked where the connection is made
//! (a refused one: 403). Then the client is answered `200` and the bytes
//! are relayed by [`crate::http::tunnel`], as the client proxy's tunnels
//! are, until either side ends or both are quiet for the listener's
//! idle timeout; each tunnel counts in `tunnels` and `tunnel_bytes` and
//! logs one line at its end.
//!
//! Leaves out the upload slots: a tunnel is not a response they could
//! pace, and holds no slot.

use std::sync::Arc;

use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Empty};

use super::{Accelerator, Stats};
use crate::http::error::ProxyError;
use crate::http::headers::via_names_hop;
use crate::http::server::{ProxyBody, RequestBody};
use crate::http::tunnel::{Opened, Upgrade, dial_refusal, relay_upgraded};

impl Accelerator {
    /// A CONNECT: routed to a parent-mode site and checked against its
    /// allow-list, dialled, answered `200`, then relayed on a task of its
    /// own once hyper hands the connection over.
    pub(super) async fn tunnel(
        self: Arc<Self>,
        mut request: Request<RequestBody>,
    ) -> Response<ProxyBody> {
        let tunnel = match self.sites.tunnel(&request) {
            Ok(tunnel) => tunnel,
            Err(refusal) => return self.refuse(refusal),
        };
        if via_names_hop(request.headers(), self.config.via_name.as_bytes()) {
            return self.refuse(ProxyError::loop_detected(format!(
                "CONNECT {} already passed {}",
                tunnel.destination,
                self.config.via_name.to_str().unwrap_or("us")
            )));
        }
        let destination = tunnel.destination;
        let target = match tunnel
            .dialer
            .dial(&destination.host, destination.port, false)
            .await
        {
            Ok(target) => target,
            Err(error) => return self.refuse(dial_refusal(&destination, &error)),
        };
        Stats::add(&self.stats.tunnels, 1);
        let stats = self.stats.clone();
        let opened = Opened::direct(destination, &target);
        relay_upgraded(
            Upgrade::take(&mut request),
            target,
            opened,
            self.config.tunnel_idle_timeout,
            move |up, down| Stats::add(&stats.tunnel_bytes, up + down),
        );
        let mut response = Response::new(Empty::new().map_err(|never| match never {}).boxed());
        *response.status_mut() = StatusCode::OK;
        response
    }
}
