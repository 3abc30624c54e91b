//! Legacy Active Queueing 0.1 (seed 001), for clients that send
//! `X-Queue: 0.1` on a persistent connection. The place is held by the
//! connection ("drop the connection, lose your place"), and:
//!
//! - "Requesting more often than pollMin will be seen as flooding, and
//!   cause a disconnection": the entry is freed and the reply is a
//!   [`RefusalReason::PollTooFast`]
//!   with `Connection: close`;
//! - "Failing to issue a request before pollMax will be seen as a dropped
//!   connection": the entry lapses at pollMax;
//! - "If the requesting client issues a request for a different file while
//!   it is in a queued state, it is shifted back to the end of the queue";
//! - "When a successful partial request completes, the client is allowed
//!   to make an additional request without being shifted to the end of the
//!   queue": see [`UploadQueue::release`] with
//!   [`Completion::Partial`](super::Completion::Partial), which puts the
//!   connection back at the head for `partial_follow_up`.
//!
//! pollMin and pollMax are the configured constants; the seed's
//! suggestion to shrink them near the head is not taken, so a client's
//! polling window never changes under it.

use tokio::time::Instant;

use super::{
    Admission, Entry, Kind, LostPlace, QueueRequest, QueuedReply, Refusal, RefusalReason,
    ReplyForm, Seq, UploadQueue, resource_hash,
};

impl UploadQueue {
    pub(super) fn admit_active(&mut self, request: &QueueRequest<'_>, now: Instant) -> Admission {
        let resource = resource_hash(request.resource);
        let legacy = Some((request.connection, resource, request.peer));
        let mut lost = None;
        if let Some(seq) = self.live(
            self.by_connection.get(&request.connection, now),
            Kind::Active,
        ) {
            let entry = &self.entries[&seq];
            if now + self.config.retry_slack < entry.not_before {
                self.remove(seq);
                self.strike(request.peer, now);
                return Admission::Refused(Refusal {
                    reason: RefusalReason::PollTooFast,
                    retry_after: self.config.legacy_poll_min,
                    close: true,
                });
            }
            if entry.resource == resource {
                if self.may_be_served(seq) {
                    self.remove(seq);
                    return self.serve(legacy);
                }
                return Admission::Queued(self.active_reply(seq, None, now));
            }
            self.remove(seq);
            lost = Some(LostPlace::DifferentFile);
        }
        if self.newcomer_may_be_served() {
            return self.serve(legacy);
        }
        if let Some(refusal) = self.new_entry_refusal(request.peer) {
            return Admission::Refused(refusal);
        }
        let entry = Entry {
            id: self.fresh_id(now),
            not_before: now,
            deadline: now,
            peer: request.peer,
            node: None,
            connection: Some(request.connection),
            resource,
            len_kib: self.len_kib(request),
            last_position: 0,
            prev_position: 0,
            kind: Kind::Active,
            disconnects: 0,
            called_back: false,
            claims: false,
            woken: false,
        };
        let seq = self.insert(entry, false, now);
        Admission::Queued(self.active_reply(seq, lost, now))
    }

    fn active_reply(&mut self, seq: Seq, lost: Option<LostPlace>, now: Instant) -> QueuedReply {
        let position = self.position(seq);
        let eta = self.eta(seq);
        let length = self.length();
        let poll_min = self.config.legacy_poll_min;
        let poll_max = self.config.legacy_poll_max;
        let entry = self
            .entries
            .get_mut(&seq)
            .expect("active_reply is called on a queued entry");
        entry.last_position = position;
        let id = entry.id;
        self.set_not_before(seq, now + poll_min, now);
        self.set_deadline(seq, now + poll_max, now);
        QueuedReply {
            id,
            position,
            length,
            eta,
            retry_after: poll_min,
            keep_alive: true,
            form: ReplyForm::Active {
                limit: self.config.slots.get(),
                poll_min,
                poll_max,
            },
            lost,
        }
    }
}
