//! Reading a queued answer from the upstream, sans-IO: where it put us,
//! in which dialect, and when to come back.
//!
//! - PARQ 1.0.a (seed 000): `X-Queue: 1.0` and `X-Queued: position=…;
//!   length=…; ETA=…; lifetime=…; ID=…`. We come back at `Retry-After`
//!   ("Any PARQ-compliant client MUST honour the Retry-After. Sending the
//!   request too soon will cause the slot to be freed") with `position`
//!   and `ID`. A reply without `Connection: close` is in the synchronous
//!   part (Sq): the place is kept by the connection.
//! - Active Queueing 0.1 (seed 001): `X-Queue: position=…,length=…,
//!   limit=…,pollMin=…,pollMax=…`, possibly split over several headers. The
//!   place is always kept by the connection; we poll "comfortably within
//!   pollMin and pollMax" ([`Place::come_back_after`]).
//!
//! The header grammars are [`crate::queue::headers`]'; this module only
//! decides what they mean to a waiting client. Also here: an ETA from the
//! progress of the position when the upstream gives none ([`EtaEstimate`]).
//!
//! Main types: [`Place`], [`Dialect`], [`EtaEstimate`].

use std::time::Duration;

use http::header::{self, HeaderMap, HeaderValue};
use http::{StatusCode, Version};
use tokio::time::Instant;

use crate::queue::headers::{LegacyStatus, XQueue, format_x_queued, parse_x_queue, parse_x_queued};
use crate::queue::{QueueId, QueuedStatus, X_QUEUE, X_QUEUED};

/// Longest `Retry-After` taken from an upstream queue (PARQ's constant
/// beyond the formula is 600 s).
pub const MAX_RETRY_AFTER: Duration = Duration::from_secs(600);
/// The retry interval when the upstream says none (seed 001: "in which
/// case a default retry interval can be used"; PARQ's shortest is 30 s).
pub const DEFAULT_RETRY: Duration = Duration::from_secs(30);
/// How far past pollMin a legacy poll goes at most: a quarter of the
/// window, but no more than this, so a place near the head is claimed
/// soon after it may be.
pub const MAX_POLL_MARGIN: Duration = Duration::from_secs(5);

/// The queueing dialect an upstream answered in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Dialect {
    /// PARQ 1.0.a: an ID, Retry-After, lifetime.
    Parq,
    /// Active Queueing 0.1: polled on one connection.
    Legacy,
}

/// Where the upstream queued a request, read from its `503`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Place {
    /// The dialect of the answer.
    pub dialect: Dialect,
    /// Position, 1 is next.
    pub position: u32,
    /// Entries in the queue, when said.
    pub length: Option<u32>,
    /// The upstream's estimate of the wait (PARQ `ETA`), when said.
    pub eta: Option<Duration>,
    /// The earliest time to come back: `Retry-After` (PARQ) or pollMin.
    pub earliest: Duration,
    /// The latest time to come back and keep the place: pollMax (legacy);
    /// PARQ's lifetime is never reached, since we come back at
    /// Retry-After.
    pub latest: Option<Duration>,
    /// PARQ: the ID, for QUEUE callbacks.
    pub id: Option<QueueId>,
    /// Whether the place is kept by the connection the answer came on:
    /// always in the legacy dialect, in PARQ when the answer keeps the
    /// connection open (the synchronous part, Sq).
    pub held: bool,
}

impl Place {
    /// Reads a queued answer: a `503` with a PARQ `X-Queued` (position
    /// and ID required) or a legacy `X-Queue` status (position required).
    /// `None` for any other answer, including a `503` without a place
    /// (queue full, flooding) and headers that do not parse.
    pub fn read(status: StatusCode, version: Version, headers: &HeaderMap) -> Option<Place> {
        if status != StatusCode::SERVICE_UNAVAILABLE {
            return None;
        }
        let retry_after = retry_after(headers);
        if let Some(value) = headers.get(&X_QUEUED) {
            let status = parse_x_queued(value.as_bytes()).ok()?;
            let (position, id) = (status.position?, status.id?);
            return Some(Place {
                dialect: Dialect::Parq,
                position,
                length: status.length,
                eta: status.eta.map(|s| Duration::from_secs(s.into())),
                earliest: retry_after.unwrap_or(DEFAULT_RETRY),
                latest: None,
                id: Some(id),
                held: version == Version::HTTP_11
                    && !crate::http::headers::closes_connection(headers),
            });
        }
        let mut legacy: Option<LegacyStatus> = None;
        for value in headers.get_all(&X_QUEUE) {
            match parse_x_queue(value.as_bytes()) {
                Ok(XQueue::Legacy(status)) => {
                    legacy = Some(legacy.map_or(status, |seen| seen.merge(status)));
                }
                // A version alongside a legacy list is not an answer we
                // can trust either way.
                Ok(XQueue::Version(_)) | Err(_) => return None,
            }
        }
        let status = legacy?;
        let secs = |s: u32| Duration::from_secs(s.into());
        let poll_min = status
            .poll_min
            .map(secs)
            .or(retry_after)
            .unwrap_or(DEFAULT_RETRY)
            .min(MAX_RETRY_AFTER);
        let poll_max = status.poll_max.map(secs).filter(|max| *max >= poll_min);
        Some(Place {
            dialect: Dialect::Legacy,
            position: status.position?,
            length: status.length,
            eta: None,
            earliest: poll_min,
            latest: poll_max,
            id: None,
            held: true,
        })
    }

    /// How long after this answer to come back. PARQ: at Retry-After.
    /// Legacy: a little after pollMin (a quarter of the window to pollMax,
    /// at most [`MAX_POLL_MARGIN`]), so that a poll is never too fast
    /// however the two clocks' timers round, and never late.
    pub fn come_back_after(&self) -> Duration {
        match self.dialect {
            Dialect::Parq => self.earliest,
            Dialect::Legacy => {
                let window = self
                    .latest
                    .map_or(self.earliest, |latest| latest - self.earliest);
                self.earliest + (window / 4).min(MAX_POLL_MARGIN)
            }
        }
    }

    /// The `X-Queued` a PARQ retry sends to keep the place: the position
    /// last told and the ID.
    pub fn claim(&self) -> Option<HeaderValue> {
        let status = QueuedStatus {
            position: Some(self.position),
            id: Some(self.id?),
            ..QueuedStatus::default()
        };
        HeaderValue::try_from(format_x_queued(&status)).ok()
    }
}

/// `Retry-After` in seconds, capped at [`MAX_RETRY_AFTER`] (an HTTP date
/// is not used by queues and is ignored).
fn retry_after(headers: &HeaderMap) -> Option<Duration> {
    let secs: u64 = headers
        .get(header::RETRY_AFTER)?
        .to_str()
        .ok()?
        .trim()
        .parse()
        .ok()?;
    Some(Duration::from_secs(secs).min(MAX_RETRY_AFTER))
}

/// An ETA from how fast the position has been falling, for upstreams that
/// give none (the legacy dialect has no ETA field).
#[derive(Debug, Clone, Copy, Default)]
pub struct EtaEstimate {
    first: Option<(Instant, u32)>,
    last: Option<(Instant, u32)>,
}

impl EtaEstimate {
    /// Notes the position told at `now`.
    pub fn observe(&mut self, position: u32, now: Instant) {
        if self.first.is_none_or(|(_, first)| position > first) {
            // A position further back (the place was lost and taken
            // again) starts the measure afresh.
            self.first = Some((now, position));
        }
        self.last = Some((now, position));
    }

    /// The time left at the rate seen so far; `None` until the position
    /// has moved.
    pub fn eta(&self) -> Option<Duration> {
        let ((t0, p0), (t1, p1)) = (self.first?, self.last?);
        let moved = p0.checked_sub(p1).filter(|&m| m > 0)?;
        let per_place = t1.saturating_duration_since(t0) / moved;
        Some(per_place * p1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ID: &str = "0123456789abcdef0123456789abcdef";

    fn headers(list: &[(&str, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in list {
            map.append(
                http::HeaderName::from_bytes(name.as_bytes()).unwrap(),
                HeaderValue::from_str(value).unwrap(),
            );
        }
        map
    }

    fn read(list: &[(&str, &str)]) -> Option<Place> {
        Place::read(
            StatusCode::SERVICE_UNAVAILABLE,
            Version::HTTP_11,
            &headers(list),
        )
    }

    #[test]
    fn a_parq_answer_gives_place_eta_id_and_retry_after() {
        let queued = format!("position=3; length=7; ETA=42; lifetime=330; ID={ID}");
        let aq = [
            ("x-queue", "1.0"),
            ("x-queued", queued.as_str()),
            ("retry-after", "70"),
            ("connection", "close"),
        ];
        let place = read(&aq).unwrap();
        assert_eq!(place.dialect, Dialect::Parq);
        assert_eq!((place.position, place.length), (3, Some(7)));
        assert_eq!(place.eta, Some(Duration::from_secs(42)));
        assert_eq!(place.come_back_after(), Duration::from_secs(70));
        assert!(!place.held, "Aq: Connection: close");
        assert_eq!(
            place.claim().unwrap(),
            format!("position=3; ID={ID}").as_str()
        );
        assert_eq!(place.id.unwrap().to_string(), ID);

        let sq = read(&aq[..3]).unwrap();
        assert!(sq.held, "Sq keeps the connection");
        let http10 = Place::read(
            StatusCode::SERVICE_UNAVAILABLE,
            Version::HTTP_10,
            &headers(&aq[..3]),
        )
        .unwrap();
        assert!(!http10.held, "HTTP/1.0 keeps no connection");
    }

    #[test]
    fn parq_retry_after_is_capped_and_defaults_to_30_s() {
        let queued = format!("position=1; ID={ID}");
        let far = read(&[("x-queued", &queued), ("retry-after", "86400")]).unwrap();
        assert_eq!(far.come_back_after(), MAX_RETRY_AFTER);
        let none = read(&[("x-queued", &queued)]).unwrap();
        assert_eq!(none.come_back_after(), DEFAULT_RETRY);
        let date = read(&[
            ("x-queued", &queued),
            ("retry-after", "Wed, 21 Oct 2015 07:28:00 GMT"),
        ])
        .unwrap();
        assert_eq!(date.come_back_after(), DEFAULT_RETRY);
    }

    #[test]
    fn a_legacy_answer_is_polled_within_its_window() {
        let place = read(&[
            (
                "x-queue",
                "position=2,length=5,limit=4,pollMin=45,pollMax=120",
            ),
            ("retry-after", "45"),
        ])
        .unwrap();
        assert_eq!(place.dialect, Dialect::Legacy);
        assert_eq!((place.position, place.length), (2, Some(5)));
        assert!(place.held);
        assert_eq!(place.id, None);
        assert_eq!(place.claim(), None);
        let back = place.come_back_after();
        assert_eq!(back, Duration::from_secs(50), "pollMin + at most 5 s");
        // A narrow window: a quarter of it past pollMin.
        let narrow = read(&[("x-queue", "position=1,pollMin=1,pollMax=3")]).unwrap();
        assert_eq!(narrow.come_back_after(), Duration::from_millis(1500));
        // The seed allows the list to be split over several headers.
        let split = read(&[
            ("x-queue", "position=4, length=9"),
            ("x-queue", "pollMin=10,pollMax=30"),
        ])
        .unwrap();
        assert_eq!((split.position, split.length), (4, Some(9)));
        assert_eq!(split.latest, Some(Duration::from_secs(30)));
        assert_eq!(split.come_back_after(), Duration::from_secs(15));
    }

    #[test]
    fn legacy_polling_without_poll_times_uses_retry_after_or_the_default() {
        let retry = read(&[("x-queue", "position=2"), ("retry-after", "20")]).unwrap();
        assert_eq!(retry.earliest, Duration::from_secs(20));
        assert_eq!(retry.come_back_after(), Duration::from_secs(25));
        let bare = read(&[("x-queue", "position=2")]).unwrap();
        assert_eq!(bare.earliest, DEFAULT_RETRY);
        // A pollMax below pollMin is not believed.
        let odd = read(&[("x-queue", "position=2,pollMin=60,pollMax=10")]).unwrap();
        assert_eq!(odd.latest, None);
        assert!(odd.come_back_after() >= Duration::from_secs(60));
    }

    #[test]
    fn answers_without_a_usable_place_are_not_waited_on() {
        assert_eq!(read(&[("retry-after", "30")]), None, "passive 503");
        assert_eq!(read(&[("x-queue", "1.0")]), None, "version only");
        assert_eq!(read(&[("x-queued", "position=3")]), None, "no ID");
        assert_eq!(read(&[("x-queued", &format!("ID={ID}"))]), None);
        assert_eq!(read(&[("x-queue", "length=5")]), None, "no position");
        assert_eq!(read(&[("x-queue", "position=x")]), None);
        assert_eq!(
            read(&[("x-queue", "position=2"), ("x-queue", "1.0")]),
            None,
            "mixed dialects"
        );
        assert_eq!(
            read(&[("x-queue", "position=1,position=2")]),
            None,
            "a field twice"
        );
        let queued = format!("position=1; ID={ID}");
        assert_eq!(
            Place::read(
                StatusCode::OK,
                Version::HTTP_11,
                &headers(&[("x-queued", &queued)])
            ),
            None,
            "only a 503 queues"
        );
    }

    #[test]
    fn the_eta_follows_the_positions_progress() {
        let start = Instant::now();
        let mut eta = EtaEstimate::default();
        eta.observe(10, start);
        assert_eq!(eta.eta(), None, "one sighting says nothing");
        eta.observe(10, start + Duration::from_secs(50));
        assert_eq!(eta.eta(), None, "no progress yet");
        eta.observe(8, start + Duration::from_secs(100));
        // 2 places in 100 s: 50 s a place, 8 places to go.
        assert_eq!(eta.eta(), Some(Duration::from_secs(400)));
        eta.observe(12, start + Duration::from_secs(150));
        assert_eq!(eta.eta(), None, "a place lost starts afresh");
    }
}
