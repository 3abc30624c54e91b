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
//!   (a disconnection keeps the place for 300 s); Aq: `Connection: close`
//!   and a lifetime;
//! - passive: kept by address "as long as the servent retries within the
//!   next 300 seconds", never in Sq, retries before Retry-After are not
//!   penalised "other than banning the servent if he clearly hammers".
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
        if self.newcomer_may_be_served() {
            return self.serve(None);
        }
        if self.is_full() {
            return Admission::Refused(self.full_refusal());
        }
        let entry = Entry {
            id: self.fresh_id(now),
            not_before: now,
            deadline: now,
            peer: request.peer,
            node: request.node,
            connection: None,
            resource: 0,
            len_kib: self.len_kib(request),
            last_position: 0,
            kind: Kind::Parq,
            disconnects: 0,
            called_back: false,
        };
        // A deadline of now is moved by parq_reply before anyone looks.
        let seq = self.insert(entry, false, now);
        Admission::Queued(self.parq_reply(seq, request, lost, now))
    }

    /// A PARQ client that played by the rules: served if its position is
    /// within the free slots, else told its new place.
    fn parq_keep(&mut self, seq: Seq, request: &QueueRequest<'_>, now: Instant) -> Admission {
        if self.position(seq) <= self.free_slots() {
            self.remove(seq);
            return self.serve(None);
        }
        let len_kib = self.len_kib(request);
        if let Some(entry) = self.entries.get_mut(&seq) {
            // The client may change its mind about the file (§6) and its
            // address; a new request also earns a new callback.
            entry.node = request.node;
            entry.len_kib = len_kib;
            entry.called_back = false;
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
        entry.last_position = position;
        entry.not_before = now + retry_after;
        let id = entry.id;
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
            if self.position(seq) <= self.free_slots() {
                self.remove(seq);
                return self.serve(None);
            }
            return Admission::Queued(self.passive_reply(seq, now));
        }
        if self.newcomer_may_be_served() {
            return self.serve(None);
        }
        if self.is_full() {
            return Admission::Refused(self.full_refusal());
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
            kind: Kind::Passive,
            disconnects: 0,
            called_back: false,
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
        entry.not_before = now + retry_after;
        let id = entry.id;
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
