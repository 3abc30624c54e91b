//! The accelerator's settings ([`AcceleratorSettings`]): every default of
//! `rproxy accelerator` is spelled in its `Default`, and
//! [`AcceleratorSettings::to_config`] resolves them into the runtime
//! [`AcceleratorConfig`]. [`AcceleratorConfig::for_origin`], which the
//! demo and the tests start from, comes from the same defaults.

use std::net::SocketAddr;
use std::num::NonZeroU32;
use std::path::PathBuf;
use std::time::Duration;

use http::{HeaderValue, Uri};
use serde::{Deserialize, Serialize};

use super::shared::saturating_usize;
use super::units::{self, Size};
use super::{AuthSettings, LimitSettings, Role, Settings, UsageError, via_name};
use crate::accelerator::AcceleratorConfig;
use crate::hsync::EncoderOptions;
use crate::queue::QueueConfig;

/// What `--level` takes: zstd's strong levels.
pub(crate) const LEVELS: std::ops::RangeInclusive<i32> = 1..=19;
/// What `--bulk-level` takes: zstd's fast levels too.
pub(crate) const BULK_LEVELS: std::ops::RangeInclusive<i32> = -7..=19;

/// The settings of `rproxy accelerator`, one field per flag (see its
/// `--help` for what each means).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "kebab-case")]
#[allow(missing_docs)]
pub struct AcceleratorSettings {
    /// `role = "accelerator"`, when the file says whom it is for.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub role: Option<Role>,
    pub listen: SocketAddr,
    pub origin: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub via_name: Option<String>,
    pub max_encode_len: Size,
    pub level: i32,
    pub bulk_level: i32,
    pub no_adapt: bool,
    pub max_signature: Size,
    pub max_encoders: usize,
    /// None: the system's temp directory.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub spool_dir: Option<PathBuf>,
    pub max_spool: Size,
    pub max_spool_total: Size,
    pub transfer_memory: Size,
    #[serde(with = "units::duration")]
    pub connect_timeout: Duration,
    #[serde(with = "units::duration")]
    pub origin_timeout: Duration,
    pub basis_store: Size,
    pub max_stored_body: Size,
    pub basis_store_private: bool,
    pub inetd: bool,
    pub slots: u32,
    pub queue_max: u32,
    /// None: a quarter of `queue_max`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub queue_per_address: Option<u32>,
    #[serde(with = "units::duration")]
    pub queue_hold_grace: Duration,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub queue_state: Option<PathBuf>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tls_cert: Option<PathBuf>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tls_key: Option<PathBuf>,
    pub limits: LimitSettings,
    pub auth: AuthSettings,
}

impl Default for AcceleratorSettings {
    fn default() -> Self {
        let encoder = EncoderOptions::default();
        AcceleratorSettings {
            role: None,
            listen: SocketAddr::from(([127, 0, 0, 1], 8081)),
            origin: "http://127.0.0.1:8080".into(),
            via_name: None,
            max_encode_len: Size::gib(1),
            level: encoder.zstd_level,
            bulk_level: encoder.fast_zstd_level,
            no_adapt: false,
            max_signature: Size::kib(24),
            max_encoders: 0,
            spool_dir: None,
            max_spool: Size::gib(1),
            max_spool_total: Size::gib(8),
            transfer_memory: Size(crate::http::transfer_memory::DEFAULT_ACCELERATOR_MEMORY),
            connect_timeout: Duration::from_secs(4),
            origin_timeout: Duration::from_secs(30),
            basis_store: Size::mib(256),
            max_stored_body: Size::mib(8),
            basis_store_private: false,
            inetd: false,
            slots: 0,
            queue_max: 1000,
            queue_per_address: None,
            queue_hold_grace: Duration::from_secs(10),
            queue_state: None,
            tls_cert: None,
            tls_key: None,
            limits: LimitSettings::default(),
            auth: AuthSettings::default(),
        }
    }
}

impl Settings for AcceleratorSettings {
    const ROLE: Role = Role::Accelerator;

    fn file_role(&self) -> Option<Role> {
        self.role
    }
}

impl AcceleratorSettings {
    /// The runtime config, for an accelerator listening on `address` (the
    /// listen address, or under inetd the socket's own: it names us in Via
    /// unless `via-name` does).
    ///
    /// # Errors
    /// A [`UsageError`] naming the key (flag) at fault.
    pub fn to_config(&self, address: SocketAddr) -> Result<AcceleratorConfig, UsageError> {
        let origin = self
            .origin
            .parse()
            .map_err(|_| UsageError(format!("--origin {}: not a URL", self.origin)))?;
        if !LEVELS.contains(&self.level) {
            return Err(UsageError(format!(
                "--level {}: use {} to {}",
                self.level,
                LEVELS.start(),
                LEVELS.end()
            )));
        }
        if !BULK_LEVELS.contains(&self.bulk_level) {
            return Err(UsageError(format!(
                "--bulk-level {}: use {} to {}",
                self.bulk_level,
                BULK_LEVELS.start(),
                BULK_LEVELS.end()
            )));
        }
        if self.tls_cert.is_some() != self.tls_key.is_some() {
            return Err(UsageError(
                "--tls-cert and --tls-key: give both or neither".into(),
            ));
        }
        let via_name = via_name(self.via_name.as_deref(), address)?;
        Ok(self.config_with(origin, via_name))
    }

    /// The runtime config for `origin`, named `via_name`, with nothing
    /// left to check.
    fn config_with(&self, origin: Uri, via_name: HeaderValue) -> AcceleratorConfig {
        AcceleratorConfig {
            origin,
            via_name,
            encoder: self.encoder_options(),
            adapt_entropy_coding: !self.no_adapt,
            max_encode_len: self.max_encode_len.0,
            max_signature_bytes: saturating_usize(self.max_signature),
            connect_timeout: self.connect_timeout,
            origin_timeout: self.origin_timeout,
            basis_store_bytes: saturating_usize(self.basis_store),
            max_stored_body: saturating_usize(self.max_stored_body),
            basis_store_private: self.basis_store_private,
            queue: NonZeroU32::new(self.slots).map(|slots| {
                let mut queue = QueueConfig::new(slots, self.queue_max);
                if let Some(per_address) = self.queue_per_address {
                    queue.per_address_max = per_address;
                }
                queue.slot_hold_grace = self.queue_hold_grace;
                queue
            }),
            queue_state: self.queue_state.clone(),
            max_encoders: self.max_encoders,
            spool_dir: self.spool_dir.clone().unwrap_or_else(std::env::temp_dir),
            max_spool: self.max_spool.0,
            max_spool_total: self.max_spool_total.0,
            transfer_memory: self.transfer_memory.0,
        }
    }

    /// The encoder's settings: the codec's defaults, with `level` and
    /// `bulk-level`.
    pub fn encoder_options(&self) -> EncoderOptions {
        let defaults = EncoderOptions::default();
        EncoderOptions {
            zstd_level: self.level,
            fast_zstd_level: self.bulk_level,
            entropy_zstd_level: defaults.entropy_zstd_level.min(self.bulk_level),
            ..defaults
        }
    }
}

impl AcceleratorConfig {
    /// The settings `rproxy accelerator` uses by default, in front of
    /// `origin` and named `accelerator` in Via.
    pub fn for_origin(origin: Uri) -> AcceleratorConfig {
        AcceleratorSettings::default().config_with(origin, HeaderValue::from_static("accelerator"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn for_origin_is_the_default_settings() {
        let address = "127.0.0.1:8081".parse().unwrap();
        let resolved = AcceleratorSettings::default().to_config(address).unwrap();
        let for_origin = AcceleratorConfig::for_origin(resolved.origin.clone());
        assert_eq!(
            format!("{resolved:?}"),
            format!("{for_origin:?}").replace("\"accelerator\"", "\"127.0.0.1:8081\"")
        );
    }

    #[test]
    fn levels_from_a_file_are_checked_as_the_flags_are() {
        let address = "127.0.0.1:8081".parse().unwrap();
        for settings in [
            AcceleratorSettings {
                level: 0,
                ..Default::default()
            },
            AcceleratorSettings {
                bulk_level: 20,
                ..Default::default()
            },
            AcceleratorSettings {
                tls_key: Some("key.pem".into()),
                ..Default::default()
            },
        ] {
            assert!(settings.to_config(address).is_err(), "{settings:?}");
        }
    }
}
