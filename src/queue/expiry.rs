//! Time running out: claims on a free slot that end, entries that lapse,
//! and the QUEUE callbacks that both can call for (to a lapsing PARQ entry
//! with `X-Node`, and to one a free slot is held for before its
//! Retry-After).

use tokio::time::Instant;

use super::order::CLAIM;
use super::{Callback, Kind, UploadQueue};

impl UploadQueue {
    /// Calls back the PARQ entries with an `X-Node` that a free slot is held
    /// for before their Retry-After, once per request of theirs: seed 000
    /// §6, "the server would then send back QUEUE requests to them, and
    /// they would get back their slot immediately". They may come back at
    /// once, and the slot waits `slot_hold_grace` for them.
    pub(super) fn wake_slot_holders(&mut self, now: Instant) {
        for k in 1..=self.free_slots() {
            let Some(seq) = self.ranks.nth_claim(k) else {
                break;
            };
            let Some(entry) = self.entries.get_mut(&seq) else {
                continue;
            };
            let Some(node) = entry.node else {
                continue;
            };
            if entry.kind != Kind::Parq
                || entry.woken
                || entry.not_before <= now + self.config.retry_slack
            {
                continue;
            }
            entry.woken = true;
            let id = entry.id;
            // Still a claim (from now), so the k-th claim stays this one.
            self.set_not_before(seq, now, now);
            self.push_callback(Callback { id, node });
        }
    }

    /// Queues a callback for `tick` to hand out; at most `queue_max` wait.
    fn push_callback(&mut self, callback: Callback) {
        if self.callbacks.len() >= self.config.queue_max as usize {
            self.callbacks.remove(0);
        }
        self.callbacks.push(callback);
    }

    /// Frees lapsed entries; a PARQ entry with an `X-Node` that was not
    /// called back yet gets its callback and `callback_grace` instead, and
    /// may come back at once. Ends the claims whose time is up.
    pub(super) fn purge(&mut self, now: Instant) {
        while let Some(&(end, seq)) = self.claim_ends.first() {
            if end > now {
                break;
            }
            self.claim_ends.pop_first();
            if let Some(entry) = self.entries.get_mut(&seq) {
                entry.claims = false;
                self.ranks.sub(seq, CLAIM);
            }
        }
        while let Some(&(deadline, seq)) = self.lapses.first() {
            if deadline > now {
                break;
            }
            let Some(entry) = self.entries.get_mut(&seq) else {
                self.lapses.pop_first();
                continue;
            };
            match entry.node {
                Some(node) if entry.kind == Kind::Parq && !entry.called_back => {
                    entry.called_back = true;
                    let id = entry.id;
                    self.bind(seq, None, now);
                    self.set_deadline(seq, now + self.config.callback_grace, now);
                    // Answering the callback is never too early (once: the
                    // answer gets a new Retry-After), and a free slot waits
                    // for the answer a grace.
                    self.set_not_before(seq, now, now);
                    self.push_callback(Callback { id, node });
                }
                _ => {
                    self.remove(seq);
                }
            }
        }
    }
}
