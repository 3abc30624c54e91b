//! The queue's order and its indexes: entries by seq (head first), by ID,
//! address, connection and (address, URL), their lapse and claim times and
//! the rank tree, all kept in step as entries are inserted, changed and
//! removed.

use std::net::IpAddr;

use tokio::time::Instant;

use super::ranks::{Ranks, Sums};
use super::{ConnectionId, Entry, Kind, QueueId, SEQ_MIDDLE, Seq, UploadQueue};
use crate::expiring::ExpiringMap;

impl UploadQueue {
    /// A random ID no live entry has.
    pub(super) fn fresh_id(&mut self, now: Instant) -> QueueId {
        loop {
            let id = self.ids.next_id();
            if !self.by_id.contains_key(&id, now) {
                return id;
            }
        }
    }

    /// Adds an entry at the back (or the head) and indexes it. It claims a
    /// free slot until `not_before` + `slot_hold_grace`.
    pub(super) fn insert(&mut self, entry: Entry, front: bool, now: Instant) -> Seq {
        self.make_room(front, now);
        let seq = if front {
            let seq = self.next_front;
            self.next_front -= 1;
            seq
        } else {
            let seq = self.next_back;
            self.next_back += 1;
            seq
        };
        let sums = self.link(seq, entry, now);
        self.ranks.add(seq, sums);
        seq
    }

    /// Makes the rank tree cover the next seq at the back (or the head):
    /// rebuilt over a wider window, or, when that window would be much
    /// wider than the queue (seqs are not reused, and entries come and go
    /// while an old one waits), over the entries renumbered from
    /// `SEQ_MIDDLE`. Either costs O(n) or so once per n insertions.
    fn make_room(&mut self, front: bool, now: Instant) {
        let next = |q: &Self| if front { q.next_front } else { q.next_back };
        if self.ranks.covers(next(self)) {
            return;
        }
        let live = u64::try_from(self.entries.len()).unwrap_or(u64::MAX) + 1;
        let (lo, hi) = self.span_with(next(self));
        if Ranks::capacity_for(lo, hi) > Ranks::capacity_for(0, live.saturating_mul(4)) {
            self.renumber(now);
        }
        let (lo, hi) = self.span_with(next(self));
        self.ranks
            .rebuild(lo, hi, self.entries.iter().map(|(&seq, e)| (seq, e.sums())));
    }

    /// The first and last seq of the entries and `seq`.
    fn span_with(&self, seq: Seq) -> (Seq, Seq) {
        let lo = self.entries.first_key_value().map_or(seq, |(&s, _)| s);
        let hi = self.entries.last_key_value().map_or(seq, |(&s, _)| s);
        (lo.min(seq), hi.max(seq))
    }

    /// Gives the entries new seqs from `SEQ_MIDDLE`, in order, and indexes
    /// them again; the rank tree is left for the caller to rebuild.
    fn renumber(&mut self, now: Instant) {
        let entries = std::mem::take(&mut self.entries);
        self.lapses.clear();
        self.claim_ends.clear();
        self.by_id = ExpiringMap::new(self.config.remanence);
        self.by_address = ExpiringMap::new(self.config.remanence);
        self.by_connection = ExpiringMap::new(self.config.remanence);
        self.by_request.clear();
        self.per_address.clear();
        self.ranks = Ranks::new();
        self.next_back = SEQ_MIDDLE;
        self.next_front = SEQ_MIDDLE - 1;
        for entry in entries.into_values() {
            let seq = self.next_back;
            self.next_back += 1;
            self.link(seq, entry, now);
        }
    }

    /// Puts the entry under `seq` in every table but the rank tree, and
    /// returns what it adds there.
    fn link(&mut self, seq: Seq, mut entry: Entry, now: Instant) -> Sums {
        entry.claims = entry.not_before + self.config.slot_hold_grace > now;
        if entry.claims {
            self.claim_ends
                .insert((entry.not_before + self.config.slot_hold_grace, seq));
        }
        let ttl = entry.deadline.saturating_duration_since(now);
        self.by_id.insert_with_ttl(entry.id, seq, ttl, now);
        match entry.kind {
            Kind::Passive => {
                self.by_address.insert_with_ttl(entry.peer, seq, ttl, now);
            }
            Kind::Parq | Kind::Active => {
                if let Some(connection) = entry.connection {
                    self.by_connection
                        .insert_with_ttl(connection, seq, ttl, now);
                }
            }
        }
        self.lapses.insert((entry.deadline, seq));
        *self.per_address.entry(entry.peer).or_default() += 1;
        if entry.kind == Kind::Parq && entry.resource != 0 {
            self.by_request
                .entry((entry.peer, entry.resource))
                .or_insert(seq);
        }
        let sums = entry.sums();
        self.entries.insert(seq, entry);
        sums
    }

    /// Sets when the entry's client may come back, and with it the end of
    /// its claim on a free slot.
    pub(super) fn set_not_before(&mut self, seq: Seq, not_before: Instant, now: Instant) {
        let grace = self.config.slot_hold_grace;
        let Some(entry) = self.entries.get_mut(&seq) else {
            return;
        };
        let claimed = entry.claims;
        if claimed {
            self.claim_ends.remove(&(entry.not_before + grace, seq));
        }
        entry.not_before = not_before;
        entry.claims = not_before + grace > now;
        if entry.claims {
            self.claim_ends.insert((not_before + grace, seq));
        }
        match (claimed, entry.claims) {
            (false, true) => self.ranks.add(seq, CLAIM),
            (true, false) => self.ranks.sub(seq, CLAIM),
            _ => {}
        }
    }

    /// Sets the body length the entry counts for in ETAs.
    pub(super) fn set_len_kib(&mut self, seq: Seq, len_kib: u32) {
        let Some(entry) = self.entries.get_mut(&seq) else {
            return;
        };
        let old = Sums {
            kib: u64::from(entry.len_kib),
            ..Sums::default()
        };
        entry.len_kib = len_kib;
        self.ranks.sub(seq, old);
        self.ranks.add(
            seq,
            Sums {
                kib: u64::from(len_kib),
                ..Sums::default()
            },
        );
    }

    /// The PARQ entry `peer` holds for `resource` (its hash), if any.
    pub(super) fn parq_entry_for(&self, peer: IpAddr, resource: u64) -> Option<Seq> {
        self.live(self.by_request.get(&(peer, resource)), Kind::Parq)
    }

    /// Moves a PARQ entry to another resource (the client changed its mind
    /// about the file), keeping the one-entry-per-request index.
    pub(super) fn set_resource(&mut self, seq: Seq, resource: u64) {
        let Some(entry) = self.entries.get_mut(&seq) else {
            return;
        };
        if entry.resource == resource {
            return;
        }
        let old = (entry.peer, entry.resource);
        entry.resource = resource;
        let new = (entry.peer, resource);
        if self.by_request.get(&old) == Some(&seq) {
            self.by_request.remove(&old);
        }
        if resource != 0 {
            self.by_request.entry(new).or_insert(seq);
        }
    }

    /// Moves the entry's deadline and its index entries' expiry with it.
    pub(super) fn set_deadline(&mut self, seq: Seq, deadline: Instant, now: Instant) {
        let Some(entry) = self.entries.get_mut(&seq) else {
            return;
        };
        self.lapses.remove(&(entry.deadline, seq));
        entry.deadline = deadline;
        self.lapses.insert((deadline, seq));
        let ttl = deadline.saturating_duration_since(now);
        self.by_id.insert_with_ttl(entry.id, seq, ttl, now);
        if entry.kind == Kind::Passive {
            self.by_address.insert_with_ttl(entry.peer, seq, ttl, now);
        }
        if let Some(connection) = entry.connection {
            self.by_connection
                .insert_with_ttl(connection, seq, ttl, now);
        }
    }

    /// Binds the entry to `connection` (Sq, legacy), or unbinds it.
    pub(super) fn bind(&mut self, seq: Seq, connection: Option<ConnectionId>, now: Instant) {
        let Some(entry) = self.entries.get_mut(&seq) else {
            return;
        };
        if let Some(old) = entry.connection.take()
            && self.by_connection.get(&old, now) == Some(&seq)
        {
            self.by_connection.remove(&old);
        }
        entry.connection = connection;
        if let Some(connection) = connection {
            let ttl = entry.deadline.saturating_duration_since(now);
            self.by_connection
                .insert_with_ttl(connection, seq, ttl, now);
        }
    }

    /// Takes an entry out of the queue and its indexes.
    pub(super) fn remove(&mut self, seq: Seq) -> Option<Entry> {
        let entry = self.entries.remove(&seq)?;
        self.ranks.sub(seq, entry.sums());
        self.lapses.remove(&(entry.deadline, seq));
        if entry.claims {
            self.claim_ends
                .remove(&(entry.not_before + self.config.slot_hold_grace, seq));
        }
        if self.by_id.remove(&entry.id).is_some_and(|s| s != seq) {
            debug_assert!(false, "an ID indexes one entry");
        }
        if entry.kind == Kind::Passive {
            self.by_address.remove(&entry.peer);
        }
        if let Some(connection) = entry.connection {
            self.by_connection.remove(&connection);
        }
        let request = (entry.peer, entry.resource);
        if self.by_request.get(&request) == Some(&seq) {
            self.by_request.remove(&request);
        }
        if let Some(count) = self.per_address.get_mut(&entry.peer) {
            *count -= 1;
            if *count == 0 {
                self.per_address.remove(&entry.peer);
            }
        }
        Some(entry)
    }

    /// The live entry of `kind` an index points to.
    pub(super) fn live(&self, seq: Option<&Seq>, kind: Kind) -> Option<Seq> {
        let seq = *seq?;
        self.entries
            .get(&seq)
            .is_some_and(|e| e.kind == kind)
            .then_some(seq)
    }
}

/// A claim on a free slot, for the rank tree.
pub(super) const CLAIM: Sums = Sums {
    entries: 0,
    claims: 1,
    kib: 0,
};
