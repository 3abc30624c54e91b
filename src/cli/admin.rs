//! Starting the admin listener for `rproxy accelerator` and `rproxy
//! client`: bound before the runtime starts (a taken port is a start-up
//! error naming `--admin-listen`), served once the proxy is ready, and
//! described on its status page by a summary of the role's settings.
//!
//! Leaves out what it serves ([`crate::admin`]).

use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::Context;

use crate::admin::{self, Admin, Figures, Source, Summary, UpstreamView};
use crate::config::{AcceleratorSettings, ClientSettings, Role};
use crate::http::access_log::Logged;
use crate::http::auth::AuthGate;
use crate::http::auth::Authenticator;
use crate::http::server::{Handler, Reloadable};

/// An admin listener bound and waiting for the runtime.
pub(super) struct AdminListener {
    listener: std::net::TcpListener,
    summary: Summary,
    auth: Option<Arc<Authenticator>>,
}

impl AdminListener {
    /// Binds `address` (none: off); beyond loopback it asks
    /// for `auth`'s users (the config refused such an address without
    /// them).
    ///
    /// # Errors
    /// The address cannot be bound.
    pub(super) fn bind(
        address: Option<SocketAddr>,
        summary: Summary,
        auth: Option<Arc<Authenticator>>,
    ) -> anyhow::Result<Option<AdminListener>> {
        let Some(address) = address else {
            return Ok(None);
        };
        let listener = admin::bind(address)
            .with_context(|| format!("--admin-listen {address}: cannot listen there"))?;
        let auth = (!address.ip().is_loopback()).then_some(auth).flatten();
        Ok(Some(AdminListener {
            listener,
            summary,
            auth,
        }))
    }

    /// Serves `source`'s figures on the current runtime until the process
    /// stops, for a proxy bound to `listen`; returns its address, for the
    /// ready line.
    pub(super) fn spawn(self, listen: SocketAddr, source: Arc<dyn Source>) -> Option<SocketAddr> {
        let address = self.listener.local_addr().ok();
        let summary = Summary {
            listen,
            ..self.summary
        };
        let admin = Arc::new(Admin::new(source, summary, self.auth));
        let listener = self.listener;
        tokio::spawn(async move {
            // The runtime ends with the process: the listener with it.
            let stop = std::future::pending();
            if let Err(error) = admin::serve(listener, admin, stop).await {
                tracing::error!(%error, "cannot serve the admin listener");
            }
        });
        address
    }
}

/// `--admin-listen` for the ready line: the address, or `off`.
pub(super) fn shown(address: Option<SocketAddr>) -> String {
    address.map_or_else(|| "off".to_owned(), |address| address.to_string())
}

/// The client proxy's settings as its status page shows them: no
/// credentials, no user names, and only what an operator looks
/// for at a glance.
pub(super) fn client_summary(settings: &ClientSettings) -> Summary {
    Summary {
        role: Role::Client,
        listen: settings.listen,
        settings: vec![
            ("cache".into(), settings.cache.display().to_string()),
            ("cache-size".into(), settings.cache_size.to_string()),
            ("memory-cache".into(), settings.memory_cache.to_string()),
            (
                "transfer-memory".into(),
                settings.transfer_memory.to_string(),
            ),
            ("private".into(), settings.private.to_string()),
            (
                "store-set-cookie".into(),
                settings.store_set_cookie.to_string(),
            ),
            (
                "downstream coding".into(),
                (!settings.no_downstream_coding).to_string(),
            ),
            ("max-object".into(), settings.max_object.to_string()),
            (
                "upstream-timeout".into(),
                format!("{:?}", settings.upstream_timeout),
            ),
            (
                "queue-wait-max".into(),
                format!("{:?}", settings.queue_wait_max),
            ),
            (
                "authentication".into(),
                on_off(settings.auth.auth_file.is_some()),
            ),
            ("open proxy".into(), settings.allow_open.to_string()),
        ],
        upstreams: views(&settings.describe_routes()),
    }
}

/// The accelerator's settings as its status page shows them.
pub(super) fn accelerator_summary(settings: &AcceleratorSettings) -> Summary {
    Summary {
        role: Role::Accelerator,
        listen: settings.listen,
        settings: vec![
            ("level".into(), settings.level.to_string()),
            ("bulk-level".into(), settings.bulk_level.to_string()),
            ("adapt".into(), (!settings.no_adapt).to_string()),
            (
                "max-encoders".into(),
                match settings.max_encoders {
                    0 => "one per core".to_owned(),
                    n => n.to_string(),
                },
            ),
            ("max-encode-len".into(), settings.max_encode_len.to_string()),
            ("basis-store".into(), settings.basis_store.to_string()),
            (
                "transfer-memory".into(),
                settings.transfer_memory.to_string(),
            ),
            (
                "slots".into(),
                match settings.slots {
                    0 => "no limit".to_owned(),
                    n => format!("{n} (queue up to {})", settings.queue_max),
                },
            ),
            ("tls".into(), on_off(settings.tls_cert.is_some())),
            (
                "authentication".into(),
                on_off(settings.auth.auth_file.is_some()),
            ),
        ],
        upstreams: views(&settings.describe_sites()),
    }
}

fn on_off(on: bool) -> String {
    if on { "on" } else { "off" }.to_owned()
}

/// One view per `a -> b` of a `describe_*` line.
fn views(described: &str) -> Vec<UpstreamView> {
    described
        .split("; ")
        .map(|name| UpstreamView {
            name: name.to_owned(),
        })
        .collect()
}

/// The role serving now, whichever a reload made it: what the admin
/// listener reads, so its figures (and later states) follow reloads.
pub(super) struct Following<R: Handler>(pub(super) Arc<Reloadable<Logged<AuthGate<R>>>>);

impl<R: Handler + Source> Source for Following<R> {
    fn figures(&self) -> Figures {
        self.0.current().role().role().figures()
    }

    fn stats_json(&self) -> String {
        self.0.current().role().role().stats_json()
    }

    fn purge(&self, url_prefix: &str) -> Option<crate::cache::PurgeReport> {
        self.0.current().role().role().purge(url_prefix)
    }

    fn submit(&self, urls: String) -> crate::admin::Submission<'_> {
        Box::pin(async move {
            let current = self.0.current();
            current.role().role().submit(urls).await
        })
    }
}
