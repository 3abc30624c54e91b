//! What the writes have said about the disk (C-E1): the count of failed
//! writes for the stats, and one log line when the disk fills up and one
//! when room comes back, each at most once a minute.
//!
//! Main type: `DiskHealth`.

use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use tracing::{error, info};

use crate::cache::CacheError;

/// Least time between two "cache disk full" (or "room again") log lines, so
/// a disk hovering at full does not log once per response.
const DISK_LOG_INTERVAL: Duration = Duration::from_secs(60);

/// What the writes have said about the disk (C-E1): failed writes are
/// counted for the stats, and the operator reads one clear line when the
/// disk fills up and one when room comes back, not one per response.
#[derive(Default)]
pub(super) struct DiskHealth {
    /// File-system errors while storing (shared with the proxy's stats).
    pub(super) write_errors: Arc<AtomicU64>,
    /// The last write failed for want of space (ENOSPC, EDQUOT, EFBIG).
    pub(super) full: AtomicBool,
    /// When each of the two lines was last logged.
    logged_full: Mutex<Option<Instant>>,
    logged_room: Mutex<Option<Instant>>,
}

impl DiskHealth {
    /// Notes the outcome of a write; only file-system errors count.
    pub(super) fn note_error(&self, root: &Path, failure: &CacheError) {
        if !matches!(failure, CacheError::Io { .. }) {
            return;
        }
        self.write_errors.fetch_add(1, Ordering::Relaxed);
        if !failure.is_disk_full() {
            // The caller logs the failure with its context.
            return;
        }
        if !self.full.swap(true, Ordering::Relaxed) && due(&self.logged_full) {
            error!(
                cache = %root.display(),
                error = %failure,
                "cache disk full: responses pass through unstored until space is freed"
            );
        }
    }

    /// A write reached the disk: if it was full, it has room again.
    pub(super) fn note_stored(&self, root: &Path) {
        if self.full.swap(false, Ordering::Relaxed) && due(&self.logged_room) {
            info!(cache = %root.display(), "cache disk has room again; storing entries");
        }
    }
}

/// Whether a rate-limited line is due now; if so, marks it logged.
fn due(last: &Mutex<Option<Instant>>) -> bool {
    let mut last = last.lock().unwrap_or_else(PoisonError::into_inner);
    let now = Instant::now();
    if last.is_some_and(|at| now.duration_since(at) < DISK_LOG_INTERVAL) {
        return false;
    }
    *last = Some(now);
    true
}
