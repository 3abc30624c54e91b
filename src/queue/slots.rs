//! Who may take a free upload slot, and what a queued client is told
//! about its wait: positions, the claims ahead of it, ETAs, and the slot
//! tokens handed out.

use std::net::IpAddr;
use std::time::Duration;

use super::{Admission, ConnectionId, QueueRequest, Seq, SlotToken, UploadQueue};

impl UploadQueue {
    pub(super) fn free_slots(&self) -> u32 {
        self.config.slots.get().saturating_sub(self.uploads())
    }

    pub(super) fn position(&self, seq: Seq) -> u32 {
        self.ranks.before(seq).entries.saturating_add(1)
    }

    /// Whether the entry at `seq`, whose client asks now, may take a free
    /// slot: fewer entries before it claim one than there are free slots.
    pub(super) fn may_be_served(&self, seq: Seq) -> bool {
        self.ranks.before(seq).claims < self.free_slots()
    }

    pub(super) fn length(&self) -> u32 {
        u32::try_from(self.entries.len()).unwrap_or(u32::MAX)
    }

    /// Whether a request not in the queue may be served now: only when the
    /// free slots outnumber the entries that claim one.
    pub(super) fn newcomer_may_be_served(&self) -> bool {
        self.ranks.total().claims < self.free_slots()
    }

    /// Estimated wait for the entry at `seq`: the bodies up to it at the
    /// upload bandwidth (seed 000: "summing the whole size of the last
    /// files requested at each queue position, and assuming an optimal
    /// transfer rate equal to the maximum upload bandwidth").
    pub(super) fn eta(&self, seq: Seq) -> Duration {
        let kib = self.ranks.through(seq).kib;
        let bytes = kib.saturating_mul(1024);
        Duration::from_secs(bytes.div_ceil(self.config.upload_bandwidth.get()))
    }

    pub(super) fn len_kib(&self, request: &QueueRequest<'_>) -> u32 {
        let len = request.expected_len.unwrap_or(self.config.assumed_body_len);
        u32::try_from(len.div_ceil(1024)).unwrap_or(u32::MAX)
    }

    pub(super) fn serve(&mut self, legacy: Option<(ConnectionId, u64, IpAddr)>) -> Admission {
        let id = self.next_token;
        self.next_token = self.next_token.wrapping_add(1);
        self.uploads.insert(id);
        Admission::Serve(SlotToken { id, legacy })
    }
}
