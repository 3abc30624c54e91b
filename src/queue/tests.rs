//! Unit tests of the queue rules, driven with explicit instants (the
//! equivalent of tokio's paused clock for sans-IO code).

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::num::{NonZeroU32, NonZeroU64};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use http::header;
use proptest::prelude::*;
use tokio::time::Instant;

use super::parq::{parq_retry_after, passive_retry_after};
use super::*;

const S: Duration = Duration::from_secs(1);

fn config(slots: u32, queue_max: u32) -> QueueConfig {
    QueueConfig::new(NonZeroU32::new(slots).expect("slots > 0"), queue_max)
}

fn queue(slots: u32, queue_max: u32) -> UploadQueue {
    UploadQueue::new(config(slots, queue_max), IdGenerator::from_seed([9; 32]))
}

fn ip(n: u8) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(10, 0, 0, n))
}

/// A PARQ request from 10.0.0.`n` on connection `n`, persistent.
fn parq(n: u8) -> QueueRequest<'static> {
    QueueRequest {
        peer: ip(n),
        connection: ConnectionId(u64::from(n)),
        persistent: true,
        offer: Some(QueueVersion::PARQ_1_0),
        queued: None,
        node: None,
        resource: "/file",
        expected_len: None,
    }
}

/// An Aq-style PARQ request: the client closes its connection.
fn parq_closing(n: u8) -> QueueRequest<'static> {
    QueueRequest {
        persistent: false,
        ..parq(n)
    }
}

fn passive(n: u8) -> QueueRequest<'static> {
    QueueRequest {
        offer: None,
        persistent: false,
        ..parq(n)
    }
}

fn legacy(n: u8, resource: &'static str) -> QueueRequest<'static> {
    QueueRequest {
        offer: Some(QueueVersion::ACTIVE_0_1),
        resource,
        ..parq(n)
    }
}

/// The request repeated with the place it was told.
fn again<'a>(request: &QueueRequest<'a>, reply: &QueuedReply) -> QueueRequest<'a> {
    QueueRequest {
        queued: Some(QueuedStatus {
            position: Some(reply.position),
            id: Some(reply.id),
            ..QueuedStatus::default()
        }),
        ..request.clone()
    }
}

#[track_caller]
fn queued(admission: Admission) -> QueuedReply {
    match admission {
        Admission::Queued(reply) => reply,
        other => panic!("expected Queued, got {other:?}"),
    }
}

#[track_caller]
fn served(admission: Admission) -> SlotToken {
    match admission {
        Admission::Serve(token) => token,
        other => panic!("expected Serve, got {other:?}"),
    }
}

#[track_caller]
fn refused(admission: Admission) -> Refusal {
    match admission {
        Admission::Refused(refusal) => refusal,
        other => panic!("expected Refused, got {other:?}"),
    }
}

#[test]
fn first_come_first_served_with_one_slot() {
    let t0 = Instant::now();
    let mut q = queue(1, 100);
    let a = served(q.admit(&parq(1), t0));
    let b = queued(q.admit(&parq(2), t0));
    let c = queued(q.admit(&parq(3), t0 + S));
    let d = queued(q.admit(&parq(4), t0 + 2 * S));
    assert_eq!((b.position, c.position, d.position), (1, 2, 3));
    assert_eq!(d.length, 3);
    q.release(a, Completion::Complete, t0 + 10 * S);
    // The free slot is held for b (until its Retry-After, 30 s, and a
    // grace): a newcomer waits.
    assert_eq!(queued(q.admit(&parq(5), t0 + 35 * S)).position, 4);
    let b_token = served(q.admit(&again(&parq(2), &b), t0 + 36 * S));
    assert_eq!(q.position_of(c.id, t0 + 36 * S), Some(1));
    q.release(b_token, Completion::Complete, t0 + 45 * S);
    // c comes back at its Retry-After (50 s) with the position it was told.
    let t = t0 + 51 * S;
    let _token = served(q.admit(&again(&parq(3), &c), t));
    assert_eq!(q.position_of(d.id, t), Some(1));
    assert_eq!(q.uploads(), 1);
}

#[test]
fn newcomer_is_served_only_while_free_slots_outnumber_the_queue() {
    let t0 = Instant::now();
    let mut q = queue(2, 100);
    let a = served(q.admit(&parq(1), t0));
    let _b = served(q.admit(&passive(2), t0));
    let c = queued(q.admit(&parq(3), t0));
    q.release(a, Completion::Complete, t0 + S);
    // One free slot, one waiting entry: the slot is c's.
    let d = queued(q.admit(&legacy(4, "/x"), t0 + S));
    assert_eq!(d.position, 2);
    let _token = served(q.admit(&again(&parq(3), &c), t0 + 31 * S));
}

#[test]
fn retry_after_follows_the_seed_formula() {
    let far = Duration::from_secs(600);
    assert_eq!(parq_retry_after(1, far), 30 * S);
    assert_eq!(parq_retry_after(2, far), 50 * S);
    assert_eq!(parq_retry_after(14, far), 290 * S);
    assert_eq!(parq_retry_after(20, far), 410 * S);
    assert_eq!(parq_retry_after(21, far), far);
    assert_eq!(parq_retry_after(5000, far), far);
    assert_eq!(passive_retry_after(1), 30 * S);
    assert_eq!(passive_retry_after(11), 230 * S);
    assert_eq!(passive_retry_after(12), 250 * S);
    assert_eq!(passive_retry_after(21), 250 * S);
    assert_eq!(passive_retry_after(u32::MAX), 250 * S);

    let t0 = Instant::now();
    let mut q = queue(1, 100);
    let _a = served(q.admit(&parq(1), t0));
    for n in 1..=25u8 {
        let reply = queued(q.admit(&parq_closing(n + 1), t0));
        assert_eq!(u32::from(n), reply.position);
        assert_eq!(reply.retry_after, parq_retry_after(reply.position, far));
        assert_eq!(
            reply.form,
            ReplyForm::Parq {
                lifetime: Some(reply.retry_after + 300 * S)
            }
        );
    }
}

#[test]
fn aq_reply_headers_carry_every_parq_field_and_close() {
    let t0 = Instant::now();
    let mut q = queue(1, 100);
    let _a = served(q.admit(&parq(1), t0));
    let reply = queued(q.admit(&parq_closing(2), t0));
    let headers = reply.to_headers();
    assert_eq!(headers[&X_QUEUE], "1.0");
    let x_queued = headers[&X_QUEUED].to_str().expect("ascii");
    assert_eq!(
        x_queued,
        format!("position=1; length=1; ETA=1; lifetime=330; ID={}", reply.id)
    );
    assert_eq!(
        headers::parse_x_queued(x_queued.as_bytes())
            .expect("parses")
            .id,
        Some(reply.id)
    );
    assert_eq!(headers[header::RETRY_AFTER], "30");
    assert_eq!(headers[header::CONNECTION], "close");
    assert!(!reply.keep_alive);
}

#[test]
fn eta_sums_the_bodies_up_to_the_position() {
    let t0 = Instant::now();
    let mut cfg = config(1, 100);
    cfg.upload_bandwidth = NonZeroU64::new(1 << 20).expect("non-zero");
    let mut q = UploadQueue::new(cfg, IdGenerator::from_seed([1; 32]));
    let _a = served(q.admit(&parq(1), t0));
    let mut last = None;
    for n in 2..=4 {
        let request = QueueRequest {
            expected_len: Some(2 << 20),
            ..parq_closing(n)
        };
        last = Some(queued(q.admit(&request, t0)));
    }
    assert_eq!(last.expect("three queued").eta, 6 * S);
}

#[test]
fn lapsed_lifetime_frees_the_entry_and_the_client_starts_again() {
    let t0 = Instant::now();
    let mut q = queue(1, 100);
    let _a = served(q.admit(&parq(1), t0));
    let b = queued(q.admit(&parq_closing(2), t0));
    let c = queued(q.admit(&parq_closing(3), t0));
    let ReplyForm::Parq {
        lifetime: Some(lifetime),
    } = b.form
    else {
        panic!("Aq reply has a lifetime");
    };
    assert!(q.tick(t0 + lifetime - S).is_empty());
    assert_eq!(q.position_of(b.id, t0 + lifetime - S), Some(1));
    // b lapses (no X-Node, no callback); c's lifetime is longer (position
    // 2 retries later) and it moves up.
    assert!(q.tick(t0 + lifetime).is_empty());
    assert_eq!(q.position_of(b.id, t0 + lifetime), None);
    let c2 = queued(q.admit(&again(&parq_closing(3), &c), t0 + lifetime));
    assert_eq!(c2.position, 1);
    assert_eq!(c2.lost, None);
    let b2 = queued(q.admit(&again(&parq_closing(2), &b), t0 + lifetime));
    assert_eq!(b2.lost, Some(LostPlace::UnknownId));
    assert_eq!(b2.position, 2);
    assert_ne!(b2.id, b.id);
}

#[test]
fn too_early_retry_frees_the_entry_and_repeats_are_refused_as_flooding() {
    let t0 = Instant::now();
    let mut q = queue(1, 100);
    let _a = served(q.admit(&parq(1), t0));
    let ahead = queued(q.admit(&parq_closing(9), t0));
    let mut reply = queued(q.admit(&parq_closing(2), t0));
    assert_eq!(reply.position, 2);
    let mut now = t0;
    // Retry-After is 50 s; 10 s (beyond the 1 s slack) is too early.
    for strike in 1..=3 {
        now += 10 * S;
        let old_id = reply.id;
        reply = queued(q.admit(&again(&parq_closing(2), &reply), now));
        assert_eq!(reply.lost, Some(LostPlace::TooEarly), "strike {strike}");
        assert_eq!(q.position_of(old_id, now), None);
        assert_eq!(reply.position, 2);
    }
    now += 10 * S;
    let refusal = refused(q.admit(&again(&parq_closing(2), &reply), now));
    assert_eq!(refusal.reason, RefusalReason::Flooding);
    assert!(refusal.close);
    assert_eq!(refusal.to_headers()[header::RETRY_AFTER], "60");
    // Banned for the flood window, even with a fresh request...
    assert_eq!(
        refused(q.admit(&parq_closing(2), now + S)).reason,
        RefusalReason::Flooding
    );
    // ...and not beyond it; the client that played fair kept its place.
    let later = queued(q.admit(&parq_closing(2), now + 60 * S));
    assert_eq!(later.lost, None);
    assert_eq!(q.position_of(ahead.id, now + 60 * S), Some(1));
}

#[test]
fn retry_within_slack_of_retry_after_is_on_time() {
    let t0 = Instant::now();
    let mut q = queue(1, 100);
    let _a = served(q.admit(&parq(1), t0));
    let b = queued(q.admit(&parq_closing(2), t0));
    let b2 = queued(q.admit(&again(&parq_closing(2), &b), t0 + 29 * S));
    assert_eq!((b2.id, b2.lost), (b.id, None));
}

#[test]
fn mismatched_position_frees_the_entry() {
    let t0 = Instant::now();
    let mut q = queue(1, 100);
    let _a = served(q.admit(&parq(1), t0));
    let b = queued(q.admit(&parq_closing(2), t0));
    let c = queued(q.admit(&parq_closing(3), t0));
    let mut wrong = again(&parq_closing(2), &b);
    if let Some(claim) = wrong.queued.as_mut() {
        claim.position = Some(7);
    }
    let b2 = queued(q.admit(&wrong, t0 + 30 * S));
    assert_eq!(b2.lost, Some(LostPlace::PositionMismatch));
    assert_eq!(q.position_of(b.id, t0 + 30 * S), None);
    assert_eq!(q.position_of(c.id, t0 + 30 * S), Some(1));
    // A claim without a position is a mismatch too.
    let mut bare = again(&parq_closing(3), &c);
    if let Some(claim) = bare.queued.as_mut() {
        claim.position = None;
    }
    assert_eq!(
        queued(q.admit(&bare, t0 + 60 * S)).lost,
        Some(LostPlace::PositionMismatch)
    );
}

#[test]
fn sq_keeps_the_connection_and_survives_one_disconnection_for_300s() {
    let t0 = Instant::now();
    let mut cfg = config(1, 100);
    cfg.sq_len = 2;
    let mut q = UploadQueue::new(cfg, IdGenerator::from_seed([2; 32]));
    let _a = served(q.admit(&parq(1), t0));
    let b = queued(q.admit(&parq(2), t0));
    let c = queued(q.admit(&parq(3), t0));
    let d = queued(q.admit(&parq(4), t0));
    assert!(b.keep_alive && c.keep_alive && !d.keep_alive);
    assert_eq!(b.form, ReplyForm::Parq { lifetime: None });
    assert!(!b.to_headers().contains_key(header::CONNECTION));
    assert!(matches!(d.form, ReplyForm::Parq { lifetime: Some(_) }));
    // b drops its connection: its place is held 300 s.
    let t1 = t0 + 10 * S;
    q.disconnected(ConnectionId(2), t1);
    assert_eq!(q.position_of(b.id, t1 + 299 * S), Some(1));
    // It reconnects (new connection) and is bound again.
    let reconnect = QueueRequest {
        connection: ConnectionId(20),
        ..parq(2)
    };
    let b2 = queued(q.admit(&again(&reconnect, &b), t1 + 40 * S));
    assert_eq!((b2.id, b2.keep_alive), (b.id, true));
    // The second disconnection frees it.
    q.disconnected(ConnectionId(20), t1 + 41 * S);
    assert_eq!(q.position_of(b.id, t1 + 41 * S), None);
    assert_eq!(q.position_of(c.id, t1 + 41 * S), Some(1));
}

#[test]
fn lapsed_entry_with_x_node_gets_one_queue_callback() {
    let t0 = Instant::now();
    let mut q = queue(1, 100);
    let _a = served(q.admit(&parq(1), t0));
    let node: SocketAddr = "13.4.5.6:4567".parse().expect("addr");
    let request = QueueRequest {
        node: Some(node),
        ..parq_closing(2)
    };
    let b = queued(q.admit(&request, t0));
    let lifetime = 330 * S;
    let callbacks = q.tick(t0 + lifetime);
    assert_eq!(callbacks, vec![Callback { id: b.id, node }]);
    let server: SocketAddr = "45.56.67.78:1234".parse().expect("addr");
    assert_eq!(
        callbacks[0].line(server),
        format!("QUEUE {} 45.56.67.78:1234\r\n", b.id)
    );
    // The client answers within callback_grace and keeps its place.
    let t1 = t0 + lifetime + 5 * S;
    let b2 = queued(q.admit(&again(&request, &b), t1));
    assert_eq!((b2.id, b2.position, b2.lost), (b.id, 1, None));
    // It lapses again: a new request earned a new callback.
    assert_eq!(q.tick(t1 + lifetime).len(), 1);
    // Ignoring the callback frees the entry, with no further callback.
    assert!(q.tick(t1 + lifetime + 60 * S).is_empty());
    assert_eq!(q.position_of(b.id, t1 + lifetime + 60 * S), None);
    assert!(q.is_empty());
}

#[test]
fn full_queue_refuses_with_retry_after() {
    let t0 = Instant::now();
    let mut q = queue(1, 2);
    let _a = served(q.admit(&parq(1), t0));
    queued(q.admit(&parq(2), t0));
    queued(q.admit(&passive(3), t0));
    for request in [parq(4), passive(5), legacy(6, "/f")] {
        let refusal = refused(q.admit(&request, t0));
        assert_eq!(refusal.reason, RefusalReason::QueueFull);
        let headers = refusal.to_headers();
        assert_eq!(headers[header::RETRY_AFTER], "600");
    }
    assert_eq!(q.len(), 2);
}

#[test]
fn passive_client_keeps_its_place_by_address_for_300s() {
    let t0 = Instant::now();
    let mut q = queue(1, 100);
    let a = served(q.admit(&passive(1), t0));
    let b = queued(q.admit(&passive(2), t0));
    let c = queued(q.admit(&passive(3), t0));
    assert_eq!((b.position, b.retry_after), (1, 30 * S));
    assert_eq!((c.position, c.retry_after), (2, 50 * S));
    let headers = c.to_headers();
    assert_eq!(headers.len(), 2);
    assert_eq!(headers[header::RETRY_AFTER], "50");
    assert_eq!(headers[header::CONNECTION], "close");
    // Same address, later, any resource: the same place (no penalty for
    // ignoring Retry-After).
    let c2 = queued(q.admit(
        &QueueRequest {
            resource: "/other",
            ..passive(3)
        },
        t0 + 5 * S,
    ));
    assert_eq!((c2.id, c2.position), (c.id, 2));
    // b stays silent for 300 s: its place is gone and c moves up.
    q.release(a, Completion::Complete, t0 + 10 * S);
    let t1 = t0 + 300 * S;
    assert!(q.tick(t1).is_empty());
    assert_eq!(q.position_of(b.id, t1), None);
    let _token = served(q.admit(&passive(3), t1));
}

#[test]
fn passive_retry_after_is_250_far_from_the_head() {
    let t0 = Instant::now();
    let mut q = queue(1, 100);
    let _a = served(q.admit(&passive(1), t0));
    let replies: Vec<QueuedReply> = (2..=20).map(|n| queued(q.admit(&passive(n), t0))).collect();
    assert_eq!(replies[0].retry_after, 30 * S);
    assert_eq!(replies[10].retry_after, 230 * S);
    assert!(replies[11..].iter().all(|r| r.retry_after == 250 * S));
}

#[test]
fn passive_hammering_is_refused() {
    let t0 = Instant::now();
    let mut cfg = config(1, 100);
    cfg.passive_hammer_max = 5;
    let mut q = UploadQueue::new(cfg, IdGenerator::from_seed([3; 32]));
    let _a = served(q.admit(&passive(1), t0));
    let b = queued(q.admit(&passive(2), t0));
    for i in 1..=5 {
        let again = queued(q.admit(&passive(2), t0 + i * S));
        assert_eq!(again.id, b.id);
    }
    let refusal = refused(q.admit(&passive(2), t0 + 6 * S));
    assert_eq!(refusal.reason, RefusalReason::Flooding);
    assert_eq!(q.position_of(b.id, t0 + 6 * S), None);
}

#[test]
fn legacy_client_gets_the_legacy_header_on_a_held_connection() {
    let t0 = Instant::now();
    let mut q = queue(4, 100);
    let tokens: Vec<SlotToken> = (1..=4).map(|n| served(q.admit(&parq(n), t0))).collect();
    assert_eq!(tokens.len(), 4);
    queued(q.admit(&parq(5), t0));
    let reply = queued(q.admit(&legacy(6, "/f"), t0));
    assert!(reply.keep_alive);
    let headers = reply.to_headers();
    assert_eq!(
        headers[&X_QUEUE],
        "position=2,length=2,limit=4,pollMin=45,pollMax=120"
    );
    assert!(!headers.contains_key(&X_QUEUED));
    assert!(!headers.contains_key(header::CONNECTION));
    assert_eq!(headers[header::RETRY_AFTER], "45");
}

#[test]
fn legacy_polling_faster_than_poll_min_disconnects_and_frees() {
    let t0 = Instant::now();
    let mut q = queue(1, 100);
    let _a = served(q.admit(&parq(1), t0));
    let b = queued(q.admit(&legacy(2, "/f"), t0));
    let c = queued(q.admit(&legacy(3, "/f"), t0));
    let refusal = refused(q.admit(&legacy(2, "/f"), t0 + 20 * S));
    assert_eq!(refusal.reason, RefusalReason::PollTooFast);
    assert!(refusal.close);
    assert_eq!(refusal.to_headers()[header::CONNECTION], "close");
    assert_eq!(q.position_of(b.id, t0 + 20 * S), None);
    assert_eq!(q.position_of(c.id, t0 + 20 * S), Some(1));
    // On time (pollMin 45 s): same place.
    let c2 = queued(q.admit(&legacy(3, "/f"), t0 + 45 * S));
    assert_eq!((c2.id, c2.position), (c.id, 1));
}

#[test]
fn legacy_place_lapses_at_poll_max_and_with_the_connection() {
    let t0 = Instant::now();
    let mut q = queue(1, 100);
    let _a = served(q.admit(&parq(1), t0));
    let b = queued(q.admit(&legacy(2, "/f"), t0));
    let c = queued(q.admit(&legacy(3, "/f"), t0));
    let c2 = queued(q.admit(&legacy(3, "/f"), t0 + 100 * S));
    assert_eq!((c2.id, c2.position), (c.id, 2));
    assert_eq!(q.position_of(b.id, t0 + 119 * S), Some(1));
    q.tick(t0 + 120 * S);
    assert_eq!(q.position_of(b.id, t0 + 120 * S), None);
    assert_eq!(q.position_of(c.id, t0 + 120 * S), Some(1));
    // Now c's connection drops: its place goes with it.
    q.disconnected(ConnectionId(3), t0 + 121 * S);
    assert_eq!(q.position_of(c.id, t0 + 121 * S), None);
    assert!(q.is_empty());
}

#[test]
fn legacy_different_file_moves_the_client_to_the_end() {
    let t0 = Instant::now();
    let mut q = queue(1, 100);
    let _a = served(q.admit(&parq(1), t0));
    let b = queued(q.admit(&legacy(2, "/f"), t0));
    let c = queued(q.admit(&legacy(3, "/f"), t0));
    let b2 = queued(q.admit(&legacy(2, "/g"), t0 + 45 * S));
    assert_eq!(b2.lost, Some(LostPlace::DifferentFile));
    assert_eq!(b2.position, 2);
    assert_ne!(b2.id, b.id);
    assert_eq!(q.position_of(c.id, t0 + 45 * S), Some(1));
}

#[test]
fn legacy_completed_partial_request_keeps_the_head() {
    let t0 = Instant::now();
    let mut q = queue(1, 100);
    let chunk = served(q.admit(&legacy(2, "/f"), t0));
    let c = queued(q.admit(&legacy(3, "/f"), t0));
    q.release(chunk, Completion::Partial, t0 + 10 * S);
    // The next chunk on the same connection goes first.
    assert_eq!(q.position_of(c.id, t0 + 10 * S), Some(2));
    let next = served(q.admit(&legacy(2, "/f"), t0 + 10 * S));
    // A complete (200) upload gives no such grace.
    q.release(next, Completion::Complete, t0 + 20 * S);
    assert_eq!(q.position_of(c.id, t0 + 20 * S), Some(1));
    queued(q.admit(&legacy(2, "/f"), t0 + 20 * S));
}

#[test]
fn legacy_partial_grace_lapses() {
    let t0 = Instant::now();
    let mut q = queue(1, 100);
    let chunk = served(q.admit(&legacy(2, "/f"), t0));
    let c = queued(q.admit(&legacy(3, "/f"), t0));
    q.release(chunk, Completion::Partial, t0);
    q.tick(t0 + 30 * S);
    assert_eq!(q.position_of(c.id, t0 + 30 * S), Some(1));
}

#[test]
fn release_of_a_token_frees_exactly_one_slot() {
    let t0 = Instant::now();
    let mut q = queue(2, 10);
    let a = served(q.admit(&parq(1), t0));
    let _b = served(q.admit(&parq(2), t0));
    assert_eq!(q.uploads(), 2);
    q.release(a, Completion::Aborted, t0);
    assert_eq!(q.uploads(), 1);
    let _token = served(q.admit(&parq(3), t0));
}

const WALL: Duration = Duration::from_secs(1_700_000_000);

fn wall(offset: Duration) -> SystemTime {
    UNIX_EPOCH + WALL + offset
}

/// A queue with two PARQ entries (one with X-Node), one passive and one
/// legacy, behind one upload.
fn mixed_queue(t0: Instant) -> (UploadQueue, Vec<QueuedReply>) {
    let mut q = queue(1, 100);
    let _a = served(q.admit(&parq(1), t0));
    let node: SocketAddr = "[2001:db8::5]:6346".parse().expect("addr");
    let replies = vec![
        queued(q.admit(&parq(2), t0)),
        queued(q.admit(&passive(3), t0)),
        queued(q.admit(
            &QueueRequest {
                node: Some(node),
                peer: "2001:db8::4".parse().expect("ip"),
                ..parq_closing(4)
            },
            t0,
        )),
        queued(q.admit(&legacy(5, "/f"), t0)),
    ];
    (q, replies)
}

fn restore(bytes: &[u8], now: Instant, offset: Duration) -> Result<UploadQueue, RemanenceError> {
    UploadQueue::from_bytes(
        config(1, 100),
        IdGenerator::from_seed([4; 32]),
        bytes,
        now,
        wall(offset),
    )
}

#[test]
fn remanence_round_trip_keeps_order_ids_and_times() {
    let t0 = Instant::now();
    let (q, replies) = mixed_queue(t0);
    let bytes = q.to_bytes(t0 + 5 * S, wall(Duration::ZERO));
    // A restart of 100 s, in a new process with its own clock.
    let t1 = t0 + 1000 * S;
    let mut r = restore(&bytes, t1, 100 * S).expect("intact bytes load");
    // Legacy entries are not saved (seed 001: no remanence).
    assert_eq!(r.len(), 3);
    assert_eq!(r.position_of(replies[0].id, t1), Some(1));
    assert_eq!(r.position_of(replies[1].id, t1), Some(2));
    assert_eq!(r.position_of(replies[2].id, t1), Some(3));
    assert_eq!(r.position_of(replies[3].id, t1), None);
    // No upload survived the restart: the head comes back with its ID and
    // position, is known, and gets the free slot (an unknown ID would
    // have been queued behind the others).
    let _upload = served(r.admit(&again(&parq(2), &replies[0]), t1));
    // The passive one is known by its address, now first.
    let passive_back = queued(r.admit(&passive(3), t1));
    assert_eq!((passive_back.id, passive_back.position), (replies[1].id, 1));
}

#[test]
fn remanence_keeps_x_node_and_the_callback() {
    let t0 = Instant::now();
    let (q, replies) = mixed_queue(t0);
    let bytes = q.to_bytes(t0, wall(Duration::ZERO));
    let t1 = t0 + 10 * S;
    let mut r = restore(&bytes, t1, 10 * S).expect("loads");
    // Entry 3 (Aq, position 3, Retry-After 70 s, lifetime 370 s) lapses 360 s
    // after the restart and is called back.
    let callbacks = r.tick(t1 + 360 * S);
    assert_eq!(callbacks.len(), 1);
    assert_eq!(callbacks[0].id, replies[2].id);
    assert_eq!(
        callbacks[0].node,
        "[2001:db8::5]:6346".parse().expect("addr")
    );
}

#[test]
fn restart_longer_than_300s_drops_every_entry() {
    let t0 = Instant::now();
    let (q, _) = mixed_queue(t0);
    let bytes = q.to_bytes(t0, wall(Duration::ZERO));
    assert_eq!(restore(&bytes, t0, 299 * S).expect("loads").len(), 3);
    let r = restore(&bytes, t0, 301 * S).expect("loads");
    assert!(r.is_empty());
    // A wall clock that went backwards is no downtime.
    let r = UploadQueue::from_bytes(
        config(1, 100),
        IdGenerator::from_seed([4; 32]),
        &bytes,
        t0,
        UNIX_EPOCH,
    )
    .expect("loads");
    assert_eq!(r.len(), 3);
}

#[test]
fn restart_drops_entries_whose_time_ran_out_and_sq_gets_300s() {
    let t0 = Instant::now();
    let mut q = queue(1, 100);
    let _a = served(q.admit(&parq(1), t0));
    let sq = queued(q.admit(&parq(2), t0));
    assert!(sq.keep_alive);
    let passive_reply = queued(q.admit(&passive(3), t0));
    // 250 s later, the passive entry (300 s) has 50 s left.
    let bytes = q.to_bytes(t0 + 250 * S, wall(Duration::ZERO));
    let t1 = t0 + 5000 * S;
    let r = restore(&bytes, t1, 60 * S).expect("loads");
    assert_eq!(r.position_of(passive_reply.id, t1), None);
    // The Sq entry had 80 s of lifetime left (330 − 250).
    assert_eq!(r.position_of(sq.id, t1 + 19 * S), Some(1));
    assert_eq!(r.position_of(sq.id, t1 + 20 * S), None);
}

#[test]
fn restart_with_a_smaller_queue_max_keeps_the_head() {
    let t0 = Instant::now();
    let (q, replies) = mixed_queue(t0);
    let bytes = q.to_bytes(t0, wall(Duration::ZERO));
    let r = UploadQueue::from_bytes(
        config(1, 2),
        IdGenerator::from_seed([4; 32]),
        &bytes,
        t0,
        wall(Duration::ZERO),
    )
    .expect("loads");
    assert_eq!(r.len(), 2);
    assert_eq!(r.position_of(replies[1].id, t0), Some(2));
}

#[test]
fn corrupt_remanence_bytes_are_refused() {
    let t0 = Instant::now();
    let (q, _) = mixed_queue(t0);
    let bytes = q.to_bytes(t0, wall(Duration::ZERO));
    for i in 0..bytes.len() {
        let mut bad = bytes.clone();
        bad[i] ^= 0x40;
        assert!(restore(&bad, t0, S).is_err(), "flipped byte {i} accepted");
    }
    for len in 0..bytes.len() {
        assert!(restore(&bytes[..len], t0, S).is_err(), "truncated to {len}");
    }
    let mut longer = bytes.clone();
    longer.push(0);
    assert!(restore(&longer, t0, S).is_err());
    assert_eq!(
        restore(b"RPQ2", t0, S).err(),
        Some(RemanenceError::TooShort { len: 4, min: 49 })
    );
}

/// Re-signs bytes after a field edit, as a buggy (not torn) writer would.
fn resign(mut bytes: Vec<u8>) -> Vec<u8> {
    let body_len = bytes.len() - 32;
    let sum = blake3::hash(&bytes[..body_len]);
    bytes[body_len..].copy_from_slice(sum.as_bytes());
    bytes
}

#[test]
fn remanence_rejects_impossible_records_even_with_a_good_checksum() {
    let t0 = Instant::now();
    let (q, _) = mixed_queue(t0);
    let bytes = q.to_bytes(t0, wall(Duration::ZERO));
    let record = 17;
    let cases: [(usize, u8, &str); 4] = [
        (record, 9, "unknown kind"),
        (record + 1, 0x80, "unknown flags"),
        (record + 3, 1, "reserved byte set"),
        (record + 52, 0, "X-Node fields without X-Node"),
    ];
    for (offset, value, problem) in cases {
        let mut bad = bytes.clone();
        bad[offset] = value;
        if problem.starts_with("X-Node") {
            // Record 0 has no X-Node: give it a stray port.
            bad[offset] = 1;
        }
        assert_eq!(
            restore(&resign(bad), t0, S).err(),
            Some(RemanenceError::BadRecord { index: 0, problem })
        );
    }
    // Two records with one ID.
    let mut dup = bytes.clone();
    let (first, second) = (record + 4, record + 78 + 4);
    let id: Vec<u8> = dup[first..first + 16].to_vec();
    dup[second..second + 16].copy_from_slice(&id);
    assert_eq!(
        restore(&resign(dup), t0, S).err(),
        Some(RemanenceError::BadRecord {
            index: 1,
            problem: "duplicate ID"
        })
    );
    // A count far beyond the limit is refused before any allocation.
    let mut huge = bytes.clone();
    huge[13..17].copy_from_slice(&u32::MAX.to_be_bytes());
    assert!(matches!(
        restore(&huge, t0, S),
        Err(RemanenceError::TooManyRecords { .. })
    ));
}

proptest! {
    #[test]
    fn from_bytes_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..400)) {
        let _ = restore(&bytes, Instant::now(), S);
    }

    #[test]
    fn from_bytes_never_panics_on_resigned_mutations(
        edits in proptest::collection::vec((0usize..280, any::<u8>()), 1..8),
    ) {
        let t0 = Instant::now();
        let (q, _) = mixed_queue(t0);
        let mut bytes = q.to_bytes(t0, wall(Duration::ZERO));
        let body = bytes.len() - 32;
        for (at, value) in edits {
            bytes[at % body] = value;
        }
        let _ = restore(&resign(bytes), t0, S);
    }
}

#[test]
fn entry_size_is_well_under_one_kib() {
    assert!(
        size_of::<Entry>() <= 160,
        "Entry is {} bytes",
        size_of::<Entry>()
    );
    const { assert!(ESTIMATED_BYTES_PER_ENTRY <= 1024) };
    println!("estimated {ESTIMATED_BYTES_PER_ENTRY} bytes per entry");
}

#[test]
fn a_thousand_mixed_clients_are_never_overtaken_beyond_the_free_slots() {
    // Every client plays by the rules: each comes back exactly at its
    // Retry-After (pollMin for legacy); uploads take 10 s. A client is
    // served only at a position within the free slots, so when anyone is
    // served, fewer than `slots` earlier arrivals are still waiting. (A
    // client far back retries after 600 s, so the rank it is served at may
    // differ from its arrival by more: its slot is held, the others run.)
    const SLOTS: usize = 8;
    let t0 = Instant::now();
    let mut q = queue(SLOTS as u32, 2000);
    let mut now = t0;
    let mut waiting: Vec<(usize, QueueRequest<'static>, QueuedReply, Instant)> = Vec::new();
    let mut uploads: Vec<(Instant, SlotToken)> = Vec::new();
    let mut served_order = Vec::new();
    let n_clients = 1000;
    for i in 0..n_clients {
        let n = (i % 250) as u8 + 1;
        let connection = ConnectionId(i as u64 + 1000);
        let peer = IpAddr::V4(Ipv4Addr::new(10, 1, (i / 250) as u8, n));
        let request = match i % 3 {
            0 => QueueRequest {
                peer,
                connection,
                ..parq_closing(n)
            },
            1 => QueueRequest {
                peer,
                connection,
                ..passive(n)
            },
            _ => QueueRequest {
                peer,
                connection,
                ..legacy(n, "/f")
            },
        };
        match q.admit(&request, now) {
            Admission::Serve(token) => {
                served_order.push(i);
                uploads.push((now + 10 * S, token));
            }
            Admission::Queued(reply) => {
                let at = now + reply.retry_after;
                waiting.push((i, request, reply, at));
            }
            Admission::Refused(refusal) => panic!("client {i} refused: {refusal:?}"),
        }
    }
    while !waiting.is_empty() {
        now += S;
        assert!(now < t0 + 100_000 * S, "simulation does not end");
        let (ended, running): (Vec<_>, Vec<_>) =
            uploads.into_iter().partition(|(end, _)| *end <= now);
        uploads = running;
        for (_, token) in ended {
            q.release(token, Completion::Complete, now);
        }
        q.tick(now);
        let mut still = Vec::new();
        let due = std::mem::take(&mut waiting);
        let mut waiting_ids: Vec<usize> = due.iter().map(|w| w.0).collect();
        for (i, request, reply, at) in due {
            if at > now {
                still.push((i, request, reply, at));
                continue;
            }
            let retry = match reply.form {
                ReplyForm::Parq { .. } => again(&request, &reply),
                _ => request.clone(),
            };
            match q.admit(&retry, now) {
                Admission::Serve(token) => {
                    let earlier = waiting_ids.iter().filter(|&&j| j < i).count();
                    assert!(earlier < SLOTS, "client {i} overtook {earlier}");
                    waiting_ids.retain(|&j| j != i);
                    served_order.push(i);
                    uploads.push((now + 10 * S, token));
                }
                Admission::Queued(next) => {
                    assert_eq!(next.lost, None, "client {i} lost its place");
                    let at = now + next.retry_after;
                    still.push((i, request, next, at));
                }
                Admission::Refused(refusal) => panic!("client {i} refused: {refusal:?}"),
            }
        }
        waiting = still;
    }
    assert_eq!(served_order.len(), n_clients);
    assert!(q.is_empty());
    assert!(q.by_request.is_empty() && q.per_address.is_empty());
}

// ---- one address cannot fill the queue

/// A PARQ request from 10.0.0.`n` for `resource` on `connection`.
fn parq_for(n: u8, resource: &'static str, connection: u64) -> QueueRequest<'static> {
    QueueRequest {
        resource,
        connection: ConnectionId(connection),
        ..parq_closing(n)
    }
}

/// Checks the address tables against the entries: each address's count,
/// at most one PARQ entry per (address, resource), all of them indexed.
#[track_caller]
fn assert_address_tables(q: &UploadQueue) {
    let mut counts: HashMap<IpAddr, u32> = HashMap::new();
    let mut requests = HashMap::new();
    for (&seq, entry) in &q.entries {
        *counts.entry(entry.peer).or_default() += 1;
        if entry.kind == Kind::Parq && entry.resource != 0 {
            let earlier = requests.insert((entry.peer, entry.resource), seq);
            assert!(earlier.is_none(), "two PARQ entries for one request");
        }
    }
    assert_eq!(q.per_address, counts);
    assert_eq!(q.by_request, requests);
}

#[test]
fn parq_request_without_id_for_a_url_its_address_waits_for_gets_the_same_entry() {
    let t0 = Instant::now();
    let mut q = queue(1, 100);
    let _a = served(q.admit(&parq(1), t0));
    let b = queued(q.admit(&parq_for(2, "/b", 20), t0));
    let c = queued(q.admit(&parq_for(3, "/c", 30), t0));
    assert_eq!((b.position, c.position), (1, 2));

    // The same address and URL, another connection, no ID, before
    // Retry-After: the same entry, as last told.
    let b2 = queued(q.admit(&parq_for(2, "/b", 21), t0 + 5 * S));
    assert_eq!((b2.id, b2.position, b2.length), (b.id, 1, 2));
    assert_eq!(b2.retry_after, b.retry_after - 5 * S);
    assert_eq!(b2.lost, None);
    assert_eq!(q.len(), 2);
    // Its Retry-After and lifetime are the entry's, unchanged: the first
    // client's retry at its own Retry-After is still on time.
    let b1 = queued(q.admit(&again(&parq_for(2, "/b", 20), &b), t0 + b.retry_after));
    assert_eq!((b1.id, b1.position, b1.lost), (b.id, 1, None));

    // Another URL from the same address is another request: its own place.
    let d = queued(q.admit(&parq_for(2, "/d", 22), t0 + 40 * S));
    assert_ne!(d.id, b.id);
    assert_eq!(d.position, 3);
    // Another address for the same URL too.
    let e = queued(q.admit(&parq_for(4, "/b", 40), t0 + 40 * S));
    assert_eq!(e.position, 4);
    assert_address_tables(&q);
}

#[test]
fn parq_request_without_id_after_retry_after_is_the_retry() {
    let t0 = Instant::now();
    let mut q = queue(1, 100);
    let a = served(q.admit(&parq(1), t0));
    let b = queued(q.admit(&parq_for(2, "/b", 20), t0));
    q.release(a, Completion::Complete, t0 + 10 * S);
    // Position 1 with a free slot: served, though it lost its ID.
    let _b = served(q.admit(&parq_for(2, "/b", 21), t0 + b.retry_after));
    assert!(q.is_empty());
    assert_address_tables(&q);
}

#[test]
fn parq_requests_without_id_before_retry_after_count_as_hammering() {
    let t0 = Instant::now();
    let mut cfg = config(1, 100);
    cfg.passive_hammer_max = 3;
    let mut q = UploadQueue::new(cfg, IdGenerator::from_seed([4; 32]));
    let _a = served(q.admit(&parq(1), t0));
    let b = queued(q.admit(&parq_for(2, "/b", 20), t0));
    for i in 1..=3 {
        let again = queued(q.admit(&parq_for(2, "/b", 20), t0 + i * S));
        assert_eq!((again.id, again.position), (b.id, 1));
    }
    let refusal = refused(q.admit(&parq_for(2, "/b", 20), t0 + 4 * S));
    assert_eq!(refusal.reason, RefusalReason::Flooding);
    assert_eq!(q.position_of(b.id, t0 + 4 * S), None);
    assert_address_tables(&q);
}

#[test]
fn two_holders_of_one_id_retrying_together_both_keep_the_place() {
    let t0 = Instant::now();
    let mut q = queue(1, 100);
    let a = served(q.admit(&parq(1), t0));
    let ahead = queued(q.admit(&parq_for(3, "/x", 30), t0));
    let first = parq_for(2, "/b", 20);
    let second = parq_for(2, "/b", 21);
    let b = queued(q.admit(&first, t0));
    assert_eq!(b.position, 2);
    // A second user agent behind the same client proxy joins the entry.
    let joined = queued(q.admit(&second, t0 + 5 * S));
    assert_eq!((joined.id, joined.position), (b.id, 2));

    // The entry ahead is served: the first holder, on time, is told
    // position 1.
    q.release(a, Completion::Complete, t0 + 20 * S);
    let _ahead = served(q.admit(
        &again(&parq_for(3, "/x", 30), &ahead),
        t0 + ahead.retry_after,
    ));
    let due = t0 + b.retry_after;
    let moved = queued(q.admit(&again(&first, &b), due));
    assert_eq!((moved.id, moved.position), (b.id, 1));
    // The second, a moment later with the position it was told (2): the
    // entry as it now is, not a lost place.
    let twin = queued(q.admit(&again(&second, &joined), due + S));
    assert_eq!((twin.id, twin.position, twin.lost), (b.id, 1, None));
    assert_eq!(twin.retry_after, moved.retry_after - S);
    // Both come back at the new Retry-After with position 1.
    let next = due + moved.retry_after;
    let again_first = queued(q.admit(&again(&first, &moved), next));
    assert_eq!((again_first.id, again_first.lost), (b.id, None));
    let again_second = queued(q.admit(&again(&second, &twin), next + S));
    assert_eq!((again_second.id, again_second.lost), (b.id, None));
    assert_eq!(q.len(), 1);
    assert!(!q.is_flooding(ip(2), next + S), "no strike for either");
}

#[test]
fn too_early_retry_outside_the_twin_window_still_loses_the_place() {
    let t0 = Instant::now();
    let mut q = queue(1, 100);
    let _a = served(q.admit(&parq(1), t0));
    let b = queued(q.admit(&parq_for(2, "/b", 20), t0));
    let due = t0 + b.retry_after;
    let b1 = queued(q.admit(&again(&parq_for(2, "/b", 20), &b), due));
    // Within the twin window with the same position: unchanged.
    let echo = queued(q.admit(&again(&parq_for(2, "/b", 20), &b1), due + 2 * S));
    assert_eq!((echo.id, echo.lost), (b.id, None));
    // After it, too early is too early (PARQ: the slot is freed).
    let late = queued(q.admit(&again(&parq_for(2, "/b", 20), &b1), due + 10 * S));
    assert_eq!(late.lost, Some(LostPlace::TooEarly));
    assert_ne!(late.id, b.id);
    // And a mismatched position within the window is still a mismatch.
    let wrong = QueueRequest {
        queued: Some(QueuedStatus {
            position: Some(late.position + 5),
            id: Some(late.id),
            ..QueuedStatus::default()
        }),
        ..parq_for(2, "/b", 20)
    };
    let t1 = due + 10 * S + late.retry_after;
    let mismatched = queued(q.admit(&wrong, t1));
    assert_eq!(mismatched.lost, Some(LostPlace::PositionMismatch));
    assert_address_tables(&q);
}

#[test]
fn one_address_holds_at_most_per_address_max_entries() {
    let t0 = Instant::now();
    let mut cfg = config(1, 100);
    cfg.per_address_max = 3;
    let mut q = UploadQueue::new(cfg, IdGenerator::from_seed([5; 32]));
    let a = served(q.admit(&parq(1), t0));
    let b = queued(q.admit(&parq_for(2, "/1", 20), t0));
    queued(q.admit(&parq_for(2, "/2", 21), t0));
    queued(q.admit(&legacy(2, "/3"), t0));
    for request in [
        parq_for(2, "/4", 22),
        passive(2),
        QueueRequest {
            connection: ConnectionId(23),
            ..legacy(2, "/5")
        },
    ] {
        let refusal = refused(q.admit(&request, t0 + S));
        assert_eq!(refusal.reason, RefusalReason::AddressFull);
        let headers = refusal.to_headers();
        assert_eq!(headers[header::RETRY_AFTER], "600");
        assert_eq!(headers[header::CONNECTION], "close");
    }
    // Its own entries still answer, and other addresses still queue.
    let b2 = queued(q.admit(&parq_for(2, "/1", 24), t0 + S));
    assert_eq!(b2.id, b.id);
    assert_eq!(queued(q.admit(&passive(3), t0 + S)).position, 4);
    assert_eq!(q.len(), 4);
    assert_address_tables(&q);

    // Once one of its entries is served, the address may queue again.
    q.release(a, Completion::Complete, t0 + 10 * S);
    let _b = served(q.admit(&again(&parq_for(2, "/1", 20), &b), t0 + b.retry_after));
    let d = queued(q.admit(&parq_for(2, "/4", 22), t0 + b.retry_after));
    assert_eq!(d.position, 4);
    assert_address_tables(&q);
}

#[test]
fn per_address_max_defaults_to_a_quarter_of_the_queue_and_zero_means_no_cap() {
    assert_eq!(config(8, 1000).per_address_max, 250);
    assert_eq!(config(8, 2).per_address_max, 1);
    let t0 = Instant::now();
    let mut cfg = config(1, 50);
    cfg.per_address_max = 0;
    let mut q = UploadQueue::new(cfg, IdGenerator::from_seed([6; 32]));
    let _a = served(q.admit(&parq(1), t0));
    let urls: Vec<String> = (0..50).map(|i| format!("/f{i}")).collect();
    for url in &urls {
        let request = QueueRequest {
            resource: url,
            ..parq_closing(2)
        };
        queued(q.admit(&request, t0));
    }
    let refusal = refused(q.admit(&parq_for(2, "/last", 2), t0));
    assert_eq!(refusal.reason, RefusalReason::QueueFull);
}

#[test]
fn legacy_follow_up_counts_under_its_address() {
    let t0 = Instant::now();
    let mut q = queue(1, 100);
    let token = served(q.admit(&legacy(7, "/f"), t0));
    q.release(token, Completion::Partial, t0 + S);
    assert_eq!(q.per_address.get(&ip(7)), Some(&1));
    assert_address_tables(&q);
    q.tick(t0 + 100 * S);
    assert!(q.per_address.is_empty());
}

#[test]
fn a_parq_client_that_changes_its_file_moves_its_index_with_it() {
    let t0 = Instant::now();
    let mut q = queue(1, 100);
    let _a = served(q.admit(&parq(1), t0));
    let b = queued(q.admit(&parq_for(2, "/old", 20), t0));
    let moved = queued(q.admit(&again(&parq_for(2, "/new", 20), &b), t0 + b.retry_after));
    assert_eq!(moved.id, b.id);
    assert_address_tables(&q);
    // The old URL is now a new request; the new one finds the entry.
    let old = queued(q.admit(&parq_for(2, "/old", 21), t0 + b.retry_after));
    assert_ne!(old.id, b.id);
    let new = queued(q.admit(&parq_for(2, "/new", 22), t0 + b.retry_after + S));
    assert_eq!(new.id, b.id);
    assert_address_tables(&q);
}

proptest! {
    /// Whatever a few addresses send, in whatever order and timing, the
    /// address tables match the entries and no address passes its cap.
    #[test]
    fn address_tables_follow_the_entries(
        steps in proptest::collection::vec((0u8..4, 0u8..4, 0u8..3, 0u64..40, any::<bool>()), 1..120),
    ) {
        const URLS: [&str; 4] = ["/a", "/b", "/c", "/d"];
        let t0 = Instant::now();
        let mut cfg = config(2, 12);
        cfg.per_address_max = 3;
        let mut q = UploadQueue::new(cfg, IdGenerator::from_seed([8; 32]));
        let mut now = t0;
        let mut replies: HashMap<(u8, u8), QueuedReply> = HashMap::new();
        let mut tokens = Vec::new();
        for (i, (who, url, dialect, wait, with_id)) in steps.into_iter().enumerate() {
            now += Duration::from_secs(wait);
            let n = who + 1;
            let base = match dialect {
                0 => parq_for(n, URLS[url as usize], i as u64),
                1 => passive(n),
                _ => QueueRequest {
                    connection: ConnectionId(u64::from(n)),
                    ..legacy(n, URLS[url as usize])
                },
            };
            let request = match replies.get(&(who, url)) {
                Some(reply) if with_id && dialect == 0 => again(&base, reply),
                _ => base,
            };
            match q.admit(&request, now) {
                Admission::Serve(token) => tokens.push(token),
                Admission::Queued(reply) => {
                    replies.insert((who, url), reply);
                }
                Admission::Refused(_) => {}
            }
            if tokens.len() > 1 || (wait > 30 && !tokens.is_empty()) {
                q.release(tokens.remove(0), Completion::Complete, now);
            }
            q.tick(now);
            assert_address_tables(&q);
            assert_ranks(&q, now);
            prop_assert!(q.per_address.values().all(|&c| c <= 3));
        }
    }
}

// ---- slots held for absent heads, lifetimes, callbacks (issue 5 fixes)

/// A PARQ request that closes its connection and gives `node` for
/// callbacks.
fn parq_calling(n: u8, node: SocketAddr) -> QueueRequest<'static> {
    QueueRequest {
        node: Some(node),
        ..parq_closing(n)
    }
}

#[test]
fn an_abandoned_head_holds_a_free_slot_only_a_grace_past_its_retry_after() {
    let t0 = Instant::now();
    let mut q = queue(1, 100);
    let a = served(q.admit(&parq(1), t0));
    let b = queued(q.admit(&parq_closing(2), t0));
    let c = queued(q.admit(&parq_closing(3), t0));
    assert_eq!((b.retry_after, c.retry_after), (30 * S, 50 * S));
    q.release(a, Completion::Complete, t0 + 5 * S);
    // Until b's Retry-After and the grace (10 s), the slot is b's.
    let n = queued(q.admit(&parq_closing(4), t0 + 39 * S));
    assert_eq!(n.position, 3);
    // b gave up (PARQ has no cancel). c, on time, gets the slot rather
    // than waiting for b's lifetime (330 s) to lapse.
    let c_token = served(q.admit(&again(&parq_closing(3), &c), t0 + 50 * S));
    // b keeps its place for its next retry...
    assert_eq!(q.position_of(b.id, t0 + 50 * S), Some(1));
    let b2 = queued(q.admit(&again(&parq_closing(2), &b), t0 + 100 * S));
    assert_eq!((b2.id, b2.position, b2.lost), (b.id, 1, None));
    // ...and the next free slot is its, not the later arrival's.
    q.release(c_token, Completion::Complete, t0 + 110 * S);
    let n2 = queued(q.admit(&again(&parq_closing(4), &n), t0 + 115 * S));
    assert_eq!((n2.id, n2.position), (n.id, 2));
    let _b = served(q.admit(&again(&parq_closing(2), &b2), t0 + 130 * S));
}

#[test]
fn an_absent_passive_head_does_not_hold_the_slot_for_300s() {
    let t0 = Instant::now();
    let mut q = queue(1, 100);
    let a = served(q.admit(&passive(1), t0));
    let b = queued(q.admit(&passive(2), t0));
    let c = queued(q.admit(&passive(3), t0));
    q.release(a, Completion::Complete, t0 + 5 * S);
    let _c = served(q.admit(&passive(3), t0 + c.retry_after));
    // b, back within its 300 s, is still first in line.
    let b2 = queued(q.admit(&passive(2), t0 + 200 * S));
    assert_eq!((b2.id, b2.position), (b.id, 1));
}

#[test]
fn an_sq_place_outlives_its_retry_after_after_a_lost_connection() {
    let t0 = Instant::now();
    let mut q = queue(1, 100);
    let _a = served(q.admit(&parq(1), t0));
    for n in 2..=16 {
        queued(q.admit(&parq(n), t0));
    }
    // Position 16 of Sq: told to come back after 330 s, no lifetime.
    let e = queued(q.admit(&parq(17), t0));
    assert_eq!(
        (e.position, e.retry_after, e.keep_alive),
        (16, 330 * S, true)
    );
    assert_eq!(e.form, ReplyForm::Parq { lifetime: None });
    q.disconnected(ConnectionId(17), t0 + 10 * S);
    // It comes back at its Retry-After on a new connection: same place.
    let reconnect = QueueRequest {
        connection: ConnectionId(170),
        ..parq(17)
    };
    let t = t0 + 330 * S;
    q.tick(t);
    let e2 = queued(q.admit(&again(&reconnect, &e), t));
    assert_eq!((e2.id, e2.lost), (e.id, None));
}

#[test]
fn a_callback_never_makes_a_client_come_back_too_early() {
    let t0 = Instant::now();
    let mut q = queue(1, 100);
    let _a = served(q.admit(&parq(1), t0));
    for n in 2..=16 {
        queued(q.admit(&parq(n), t0));
    }
    let node: SocketAddr = "192.0.2.17:6346".parse().expect("addr");
    let request = QueueRequest {
        node: Some(node),
        ..parq(17)
    };
    let e = queued(q.admit(&request, t0));
    assert_eq!(e.retry_after, 330 * S);
    q.disconnected(ConnectionId(17), t0 + 10 * S);
    // Whatever callback comes, answering it at once keeps the place.
    let reconnect = QueueRequest {
        connection: ConnectionId(170),
        ..request.clone()
    };
    let mut last = e.clone();
    for second in 11..=330 {
        let now = t0 + second * S;
        for callback in q.tick(now) {
            assert_eq!(callback.id, e.id);
            let answer = queued(q.admit(&again(&reconnect, &last), now + S));
            assert_eq!((answer.id, answer.lost), (e.id, None), "at {second} s");
            last = answer;
        }
    }
    if last.position == e.position {
        let back = queued(q.admit(&again(&reconnect, &last), t0 + 330 * S));
        assert_eq!((back.id, back.lost), (e.id, None));
    }
}

#[test]
fn a_slot_held_for_a_head_with_x_node_calls_it_back_once() {
    let t0 = Instant::now();
    let node: SocketAddr = "192.0.2.2:6346".parse().expect("addr");
    let mut q = queue(1, 100);
    let a = served(q.admit(&parq(1), t0));
    let h = queued(q.admit(&parq_calling(2, node), t0));
    assert_eq!(h.retry_after, 30 * S);
    assert!(q.tick(t0 + S).is_empty(), "no slot free, no callback");
    q.release(a, Completion::Complete, t0 + 5 * S);
    // The free slot is h's: it is called back rather than waited for.
    assert_eq!(q.tick(t0 + 6 * S), vec![Callback { id: h.id, node }]);
    assert!(q.tick(t0 + 7 * S).is_empty(), "once per request");
    // It does not answer within the grace: the slot goes to a newcomer.
    let _n = served(q.admit(&parq_closing(3), t0 + 17 * S));
    // Its answer, before its Retry-After, is still on time (once)...
    let h2 = queued(q.admit(&again(&parq_calling(2, node), &h), t0 + 20 * S));
    assert_eq!((h2.id, h2.position, h2.lost), (h.id, 1, None));
    // ...but the next retry must honour the new Retry-After.
    let h3 = queued(q.admit(&again(&parq_calling(2, node), &h2), t0 + 25 * S));
    assert_eq!(h3.lost, Some(LostPlace::TooEarly));
}

#[test]
fn a_called_back_head_that_answers_gets_the_slot() {
    let t0 = Instant::now();
    let node: SocketAddr = "192.0.2.2:6346".parse().expect("addr");
    let mut q = queue(1, 100);
    let a = served(q.admit(&parq(1), t0));
    let h = queued(q.admit(&parq_calling(2, node), t0));
    let k = queued(q.admit(&parq_closing(3), t0));
    q.release(a, Completion::Complete, t0 + 5 * S);
    assert_eq!(q.tick(t0 + 6 * S).len(), 1);
    let _h = served(q.admit(&again(&parq_calling(2, node), &h), t0 + 7 * S));
    assert_eq!(q.position_of(k.id, t0 + 7 * S), Some(1));
}

#[test]
fn a_restart_keeps_each_parq_entrys_url() {
    let t0 = Instant::now();
    let mut q = queue(1, 100);
    let _a = served(q.admit(&parq(1), t0));
    let b = queued(q.admit(&parq_for(2, "/b", 20), t0));
    let bytes = q.to_bytes(t0 + 5 * S, wall(Duration::ZERO));
    let t1 = t0 + 1000 * S;
    let mut r = restore(&bytes, t1, 5 * S).expect("loads");
    // The same address asks for /b without the ID: its entry, not a new one.
    let b2 = queued(r.admit(&parq_for(2, "/b", 21), t1));
    assert_eq!((b2.id, b2.position), (b.id, 1));
    assert_eq!(r.len(), 1);
    assert_address_tables(&r);
}

/// The bytes of a version 1 file with the same records: without the URL
/// digest, re-signed.
fn as_version_1(bytes: &[u8]) -> Vec<u8> {
    let count = u32::from_be_bytes(bytes[13..17].try_into().expect("4 bytes")) as usize;
    let mut out = bytes[..17].to_vec();
    out[4] = 1;
    for i in 0..count {
        let record = 17 + i * 78;
        out.extend_from_slice(&bytes[record..record + 70]);
    }
    out.extend_from_slice(&[0; 32]);
    resign(out)
}

#[test]
fn a_version_1_file_is_still_read_without_urls() {
    let t0 = Instant::now();
    let (q, replies) = mixed_queue(t0);
    let bytes = q.to_bytes(t0, wall(Duration::ZERO));
    assert_eq!(bytes[4], 2, "version 2 is written");
    let old = as_version_1(&bytes);
    assert_eq!(old.len(), bytes.len() - 3 * 8);
    let t1 = t0 + 1000 * S;
    let mut r = restore(&old, t1, 10 * S).expect("a version 1 file loads");
    assert_eq!(r.len(), 3);
    assert_eq!(r.position_of(replies[2].id, t1), Some(3));
    // Its entries have no URL: a request without its ID is a new entry.
    let other = queued(r.admit(&parq(2), t1));
    assert_ne!(other.id, replies[0].id);
    assert_eq!(r.len(), 4);
    assert_address_tables(&r);
}

#[test]
fn a_version_1_sq_entry_cut_before_its_retry_after_gets_its_lifetime_back() {
    let t0 = Instant::now();
    let (q, replies) = mixed_queue(t0);
    let mut old = as_version_1(&q.to_bytes(t0, wall(Duration::ZERO)));
    // Record 0 (PARQ, Sq): Retry-After in 330 s, but lapsing in 300 s, as
    // version 1 saved Sq entries.
    let record = 17;
    old[record + 62..record + 66].copy_from_slice(&330_000u32.to_be_bytes());
    old[record + 66..record + 70].copy_from_slice(&300_000u32.to_be_bytes());
    let old = resign(old);
    let t1 = t0 + 1000 * S;
    let r = restore(&old, t1, Duration::ZERO).expect("loads");
    assert_eq!(r.position_of(replies[0].id, t1 + 629 * S), Some(1));
}

#[test]
fn an_unknown_format_version_is_refused() {
    let t0 = Instant::now();
    let (q, _) = mixed_queue(t0);
    let mut bytes = q.to_bytes(t0, wall(Duration::ZERO));
    for version in [0, 3, 255] {
        bytes[4] = version;
        assert_eq!(
            restore(&resign(bytes.clone()), t0, S).err(),
            Some(RemanenceError::UnsupportedVersion { version })
        );
    }
}

#[test]
fn positions_stay_right_through_heavy_churn_behind_an_old_head() {
    // Entries come and go behind a head that stays: the rank tree's window
    // would follow the churn; the entries are renumbered instead.
    let t0 = Instant::now();
    let mut q = queue(1, 100);
    let _a = served(q.admit(&parq(1), t0));
    let head = queued(q.admit(&parq_closing(2), t0));
    let second = queued(q.admit(&passive(3), t0));
    for i in 0..20_000u64 {
        let connection = ConnectionId(1000 + i);
        let churn = QueueRequest {
            connection,
            ..legacy(4, "/churn")
        };
        let reply = queued(q.admit(&churn, t0 + S));
        assert_eq!(reply.position, 3);
        q.disconnected(connection, t0 + S);
    }
    assert!(q.ranks.capacity() <= 256, "window {}", q.ranks.capacity());
    assert_eq!(q.position_of(head.id, t0 + S), Some(1));
    assert_eq!(q.position_of(second.id, t0 + S), Some(2));
    let back = queued(q.admit(&again(&parq_closing(2), &head), t0 + 30 * S));
    assert_eq!((back.id, back.position, back.lost), (head.id, 1, None));
    assert_address_tables(&q);
    assert_ranks(&q, t0 + 30 * S);
}

/// Checks the rank tree and claims against a walk over the entries, and
/// that every place outlives the time its client was told to come back.
#[track_caller]
fn assert_ranks(q: &UploadQueue, now: Instant) {
    let grace = q.config.slot_hold_grace;
    let (mut ahead, mut claims, mut kib) = (0u32, 0u32, 0u64);
    for (&seq, entry) in &q.entries {
        kib += u64::from(entry.len_kib);
        assert_eq!(q.position(seq), ahead + 1);
        assert_eq!(q.ranks.before(seq).claims, claims);
        assert_eq!(q.ranks.through(seq).kib, kib);
        if entry.deadline > now {
            assert!(
                entry.claims == (entry.not_before + grace > now),
                "claim of {seq} out of step"
            );
        }
        assert!(
            entry.deadline >= entry.not_before,
            "entry {seq} lapses before its client may come back"
        );
        ahead += 1;
        claims += u32::from(entry.claims);
    }
    assert_eq!(q.ranks.total().entries, ahead);
    assert_eq!(q.claim_ends.len(), claims as usize);
}
