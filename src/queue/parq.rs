//! PARQ 1.0.a (seed 000): active queueing for clients that send
//! `X-Queue: 1.0` (§4), and passive queueing by address for clients that
//! send no `X-Queue` (§5). The Retry-After formulas are public so the
//! client proxy and the simulation script can use the same numbers.
//!
//! Rules, as the seed writes them:
//! - a new request goes to the back and gets a random ID; the reply gives
//!   position, length, ETA, lifetime (Aq only) and ID;
//! - "Any PARQ-compliant client MUST honour the Retry-After. Sending the
//!   request too soon will cause the slot to be freed"; a wrong position
//!   ("If there is a mismatch, the corresponding slot is immediately
//!   freed") and a lapsed lifetime free it too. The request is then treated
//!   as a new one (at the back), and a violation counts as a flood strike;
//! - Sq (positions up to `sq_len`) on a persistent connection: no
//!   `Connection: close`, no lifetime, the entry is bound to the connection
//!   (a disconnection keeps the place for 300 s, or until the lifetime
//!   past its Retry-After if later: see [`super`]); Aq: `Connection:
//!   close` and a lifetime;
//! - passive: kept by address "as long as the servent retries within the
//!   next 300 seconds", never in Sq, retries before Retry-After are not
//!   penalised "other than banning the servent if he clearly hammers".
//!
//! Ours, so one address cannot fill the queue (issue 5):
//! - a PARQ request without a live ID, from an address that already waits
//!   for the same URL, gets that entry back rather than a new one: same
//!   ID, and the position and Retry-After it was last told, unchanged
//!   (once Retry-After has passed it counts as the retry it is). Before
//!   Retry-After such a request counts as passive hammering, not as a
//!   violation: it claimed no place. Behind a client proxy this is a
//!   second user agent asking for a URL the first one waits for;
//! - the two then hold one ID and retry at the same time. The first retry
//!   moves the entry on; the second, within `twin_window` of it and with
//!   the position of the reply before or of the latest one, gets the
//!   entry's state unchanged instead of losing the place as too early or
//!   mismatched (it also counts as hammering);
//! - an address holds at most `per_address_max` entries; past it a plain
//!   503 ([`RefusalReason::AddressFull`](super::RefusalReason::AddressFull)).
//!
//! Main functions: [`parq_retry_after`], [`passive_retry_after`].

use std::time::Duration;

use tokio::time::Instant;

use super::{
    Admission, Entry, Kind, LostPlace, QueueRequest, QueuedReply, ReplyForm, Seq, UploadQueue,
    resource_hash,
};

/// The last position the PARQ formula `30 + 20·(slot−1)` is used for (seed
/// 000: "which is valid up to x = 20", read as up to slot 20, 410 s, since
/// x itself starts at 30; §5 quotes "410 for slot=20").
pub const FORMULA_MAX_SLOT: u32 = 20;

/// The passive Retry-After far from the head, seconds (seed 000 §5).
pub const PASSIVE_RETRY_MAX_SECS: u64 = 250;

fn formula_secs(position: u32) -> u64 {
    30 + 20 * u64::from(position.max(1) - 1)
}

/// The PARQ Retry-After for `position`: `30 + 20·(position−1)` up to
/// [`FORMULA_MAX_SLOT`], `far` beyond.
pub fn parq_retry_after(position: u32, far: Duration) -> Duration {
    if position <= FORMULA_MAX_SLOT {
        Duration::from_secs(formula_secs(position))
    } else {
        far
    }
}

/// The passive Retry-After for `position`: 250 s, decreasing by the PARQ
/// formula near the head down to 30 s at position 1, i.e.
/// `min(250, 30 + 20·(position−1))`.
pub fn passive_retry_after(position: u32) -> Duration {
    Duration::from_secs(formula_secs(position).min(PASSIVE_RETRY_MAX_SECS))
}

impl UploadQueue {
    pub(super) fn admit_parq(&mut self, request: &QueueRequest<'_>, now: Instant) -> Admission {
        let mut lost = None;
        if let Some(claim) = request.queued
            && let Some(id) = claim.id
        {
            match self.live(self.by_id.get(&id, now), Kind::Parq) {
                None => lost = Some(LostPlace::UnknownId),
                Some(seq) => {
                    let entry = &self.entries[&seq];
                    let violation = if now + self.config.retry_slack < entry.not_before {
                        Some(LostPlace::TooEarly)
                    } else if claim.position != Some(entry.last_position) {
                        Some(LostPlace::PositionMismatch)
                    } else {
                        None
                    };
                    match violation {
                        None => return self.parq_keep(seq, request, now),
                        Some(_) if self.is_twin_retry(seq, claim.position, now) => {
                            return self.parq_unchanged(seq, request, now);
                        }
                        Some(reason) => {
                            self.remove(seq);
                            lost = Some(reason);
                            if self.strike(request.peer, now) {
                                return Admission::Refused(self.flood_refusal());
                            }
                        }
                    }
                }
            }
        }
        let resource = resource_hash(request.resource);
        if let Some(seq) = self.parq_entry_for(request.peer, resource) {
            return self.parq_rejoin(seq, request, now);
        }
        if self.newcomer_may_be_served() {
            return self.serve(None);
        }
        if let Some(refusal) = self.new_entry_refusal(request.peer) {
            return Admission::Refused(refusal);
        }
        let entry = Entry {
            id: self.fresh_id(now),
            not_before: now,
            deadline: now,
            peer: request.peer,
            node: request.node,
            connection: None,
            resource,
            len_kib: self.len_kib(request),
            last_position: 0,
            prev_position: 0,
            kind: Kind::Parq,
            disconnects: 0,
            called_back: false,
            claims: false,
            woken: false,
        };
        // A deadline of now is moved by parq_reply before anyone looks.
        let seq = self.insert(entry, false, now);
        Admission::Queued(self.parq_reply(seq, request, lost, now))
    }

    /// A request without a live ID for a URL its address already waits
    /// for: the entry as it is before its Retry-After, the retry it is
    /// after.
    fn parq_rejoin(&mut self, seq: Seq, request: &QueueRequest<'_>, now: Instant) -> Admission {
        if now + self.config.retry_slack >= self.entries[&seq].not_before {
            return self.parq_keep(seq, request, now);
        }
        self.parq_unchanged(seq, request, now)
    }

    /// Whether a retry with the entry's ID that broke a rule is the twin
    /// of the retry just answered (see the module doc): the entry moved
    /// within `twin_window`, and the claimed position is the one told
    /// before that move or after it.
    fn is_twin_retry(&self, seq: Seq, claimed: Option<u32>, now: Instant) -> bool {
        let entry = &self.entries[&seq];
        let retry_after = parq_retry_after(entry.last_position, self.config.retry_after_far);
        let Some(replied_at) = entry.not_before.checked_sub(retry_after) else {
            return false;
        };
        entry.prev_position != 0
            && (claimed == Some(entry.prev_position) || claimed == Some(entry.last_position))
            && now < replied_at + self.config.twin_window
    }

    /// Tells a request the entry's place as last told, changing nothing
    /// (its timing, position and held connection belong to the client that
    /// retried on time). Counted as hammering: a client cannot poll this
    /// way for ever.
    fn parq_unchanged(&mut self, seq: Seq, request: &QueueRequest<'_>, now: Instant) -> Admission {
        if self.hammer(request.peer, now) {
            self.remove(seq);
            return Admission::Refused(self.flood_refusal());
        }
        let eta = self.eta(seq);
        let length = self.length();
        let entry = &self.entries[&seq];
        // Only the connection the entry is bound to (Sq) stays open.
        let held = request.persistent && entry.connection == Some(request.connection);
        Admission::Queued(QueuedReply {
            id: entry.id,
            position: entry.last_position,
            length,
            eta,
            retry_after: entry.not_before.saturating_duration_since(now),
            keep_alive: held,
            form: ReplyForm::Parq {
                lifetime: (!held).then(|| entry.deadline.saturating_duration_since(now)),
            },
            lost: None,
        })
    }

    /// A PARQ client that played by the rules: served if its position is
    /// within the free slots, else told its new place.
    fn parq_keep(&mut self, seq: Seq, request: &QueueRequest<'_>, now: Instant) -> Admission {
        if self.may_be_served(seq) {
            self.remove(seq);
            return self.serve(None);
        }
        self.set_resource(seq, resource_hash(request.resource));
        let len_kib = self.len_kib(request);
        self.set_len_kib(seq, len_kib);
        if let Some(entry) = self.entries.get_mut(&seq) {
            // The client may change its mind about the file (§6) and its
            // address; a new request also earns new callbacks.
            entry.node = request.node;
            entry.called_back = false;
            entry.woken = false;
        }
        Admission::Queued(self.parq_reply(seq, request, None, now))
    }

    fn parq_reply(
        &mut self,
        seq: Seq,
        request: &QueueRequest<'_>,
        lost: Option<LostPlace>,
        now: Instant,
    ) -> QueuedReply {
        let position = self.position(seq);
        let retry_after = parq_retry_after(position, self.config.retry_after_far);
        let lifetime = retry_after + self.config.lifetime_grace;
        let in_sq = request.persistent && position <= self.config.sq_len;
        let eta = self.eta(seq);
        let length = self.length();
        let entry = self
            .entries
            .get_mut(&seq)
            .expect("parq_reply is called on a queued entry");
        entry.prev_position = entry.last_position;
        entry.last_position = position;
        let id = entry.id;
        self.set_not_before(seq, now + retry_after, now);
        self.set_deadline(seq, now + lifetime, now);
        self.bind(seq, in_sq.then_some(request.connection), now);
        QueuedReply {
            id,
            position,
            length,
            eta,
            retry_after,
            keep_alive: in_sq,
            form: ReplyForm::Parq {
                lifetime: (!in_sq).then_some(lifetime),
            },
            lost,
        }
    }

    pub(super) fn admit_passive(&mut self, request: &QueueRequest<'_>, now: Instant) -> Admission {
        let peer = request.peer;
        if let Some(seq) = self.live(self.by_address.get(&peer, now), Kind::Passive) {
            if now + self.config.retry_slack < self.entries[&seq].not_before
                && self.hammer(peer, now)
            {
                self.remove(seq);
                return Admission::Refused(self.flood_refusal());
            }
            if self.may_be_served(seq) {
                self.remove(seq);
                return self.serve(None);
            }
            return Admission::Queued(self.passive_reply(seq, now));
        }
        if self.newcomer_may_be_served() {
            return self.serve(None);
        }
        if let Some(refusal) = self.new_entry_refusal(peer) {
            return Admission::Refused(refusal);
        }
        let entry = Entry {
            id: self.fresh_id(now),
            not_before: now,
            deadline: now,
            peer,
            node: None,
            connection: None,
            resource: resource_hash(request.resource),
            len_kib: self.len_kib(request),
            last_position: 0,
            prev_position: 0,
            kind: Kind::Passive,
            disconnects: 0,
            called_back: false,
            claims: false,
            woken: false,
        };
        let seq = self.insert(entry, false, now);
        Admission::Queued(self.passive_reply(seq, now))
    }

    fn passive_reply(&mut self, seq: Seq, now: Instant) -> QueuedReply {
        let position = self.position(seq);
        let retry_after = passive_retry_after(position);
        let eta = self.eta(seq);
        let length = self.length();
        let entry = self
            .entries
            .get_mut(&seq)
            .expect("passive_reply is called on a queued entry");
        entry.last_position = position;
        let id = entry.id;
        self.set_not_before(seq, now + retry_after, now);
        self.set_deadline(seq, now + self.config.remanence, now);
        QueuedReply {
            id,
            position,
            length,
            eta,
            retry_after,
            keep_alive: false,
            form: ReplyForm::Passive,
            lost: None,
        }
    }
}
