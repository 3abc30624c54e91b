//! What keeps one client from filling the queue: the queue's and each
//! address's caps, the flood counters (rule violations, passive
//! hammering), and the refusals they give.

use std::net::IpAddr;

use tokio::time::Instant;

use super::{Refusal, RefusalReason, UploadQueue};

impl UploadQueue {
    pub(super) fn is_full(&self) -> bool {
        self.entries.len() >= self.config.queue_max as usize
    }

    fn full_refusal(&self) -> Refusal {
        Refusal {
            reason: RefusalReason::QueueFull,
            retry_after: self.config.retry_after_far,
            close: true,
        }
    }

    /// Whether `peer` may not get another entry: it holds
    /// `per_address_max` already.
    fn address_is_full(&self, peer: IpAddr) -> bool {
        let max = self.config.per_address_max;
        max != 0 && self.per_address.get(&peer).is_some_and(|&n| n >= max)
    }

    fn address_refusal(&self) -> Refusal {
        Refusal {
            reason: RefusalReason::AddressFull,
            retry_after: self.config.retry_after_far,
            close: true,
        }
    }

    /// The refusal a request that would make a new entry gets, if any:
    /// the queue or the address is full.
    pub(super) fn new_entry_refusal(&self, peer: IpAddr) -> Option<Refusal> {
        if self.is_full() {
            Some(self.full_refusal())
        } else if self.address_is_full(peer) {
            Some(self.address_refusal())
        } else {
            None
        }
    }

    pub(super) fn flood_refusal(&self) -> Refusal {
        Refusal {
            reason: RefusalReason::Flooding,
            retry_after: self.config.flood_window,
            close: true,
        }
    }

    pub(super) fn is_flooding(&self, peer: IpAddr, now: Instant) -> bool {
        self.strikes
            .get(&peer, now)
            .is_some_and(|&n| n > self.config.flood_max_strikes)
            || self
                .hammering
                .get(&peer, now)
                .is_some_and(|&n| n > self.config.passive_hammer_max)
    }

    /// Counts a rule violation; true if the address is now flooding.
    pub(super) fn strike(&mut self, peer: IpAddr, now: Instant) -> bool {
        let count = self.strikes.get_or_insert_with(peer, now, || 0);
        *count = count.saturating_add(1);
        *count > self.config.flood_max_strikes
    }

    /// Counts a passive request before Retry-After; true if the address is
    /// now hammering.
    pub(super) fn hammer(&mut self, peer: IpAddr, now: Instant) -> bool {
        let count = self.hammering.get_or_insert_with(peer, now, || 0);
        *count = count.saturating_add(1);
        *count > self.config.passive_hammer_max
    }
}
