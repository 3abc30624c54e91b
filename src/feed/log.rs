//! One site's change log, sans-IO: the committed updates, numbered by
//! commit sequence numbers (CSNs), collapsed to the latest per URL, and
//! the answer a peer gets for "updates since CSN n".
//!
//! The primary (the accelerator) [`FeedLog::commit`]s a body it saw with
//! a digest other than the last one for that path, under the next CSN. A
//! replica (a client proxy) [`FeedLog::apply`]s the primary's updates with
//! the primary's CSNs once it holds them, so the replica's own peers ask
//! it in the primary's numbering (seed 002 §4.1.4: one sequence space per
//! zone, whoever serves it).
//!
//! Collapsing (seed 002 §4.1.3) is how the log is kept, not a pass over
//! it: a path has one entry, the latest, so a peer far behind gets one
//! update per path however often it changed. Entries expire by age and,
//! as a backstop, by count (seed 003); the highest CSN an expiry removed
//! is `truncated`, and a peer asking from before it, or from another
//! incarnation of the log, gets a **reset**: every entry still held,
//! flagged so that it knows the listing is all there is (seed 002's
//! AllZoneData, where the log was truncated).
//!
//! Leaves out: where the log is kept (`state.rs`), who asks (the roles),
//! and reading the clock (every method that needs the time takes it, in
//! Unix seconds).
//!
//! Main types: [`FeedLog`], [`Update`], [`Answer`].

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// One committed update: a path of the site whose body changed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Update {
    /// Its commit sequence number, the primary's.
    pub csn: u64,
    /// The origin-form target (`/static/app.js?v=2`), relative to the
    /// site: each peer names the site by its own URL for it.
    pub path: String,
    /// The new body's blake3, hex: a peer holding that body has it.
    pub digest: String,
    /// The new body's length.
    pub length: u64,
    /// When the primary committed it (Unix seconds).
    pub at: u64,
}

/// What a peer asking for updates gets.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Answer {
    /// The log's incarnation: a peer that saw another must start over.
    pub incarnation: String,
    /// The CSN to ask from next time.
    pub csn: u64,
    /// Every entry held is listed (the peer asked from before what the
    /// log still holds, or from another incarnation): what is not listed
    /// is not known to have changed, nor known not to.
    #[serde(default)]
    pub reset: bool,
    /// The updates, by CSN, at most one per path.
    pub updates: Vec<Update>,
}

/// How long entries stay, and how many a log holds at most.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Retention {
    /// Entries older than this are dropped.
    pub max_age: Duration,
    /// Past this many entries, the oldest go (a backstop: age is the rule).
    pub max_entries: usize,
}

impl Default for Retention {
    fn default() -> Self {
        Retention {
            max_age: Duration::from_secs(7 * 24 * 3600),
            max_entries: 100_000,
        }
    }
}

/// A site's log (or a replica's copy of it).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(from = "Saved", into = "Saved")]
pub struct FeedLog {
    incarnation: String,
    csn: u64,
    truncated: u64,
    by_csn: BTreeMap<u64, Update>,
    by_path: HashMap<String, u64>,
}

/// The log as it is written down: its updates in CSN order.
#[derive(Serialize, Deserialize)]
struct Saved {
    incarnation: String,
    csn: u64,
    truncated: u64,
    updates: Vec<Update>,
}

impl From<Saved> for FeedLog {
    fn from(saved: Saved) -> FeedLog {
        let mut log = FeedLog::new(saved.incarnation);
        log.csn = saved.csn;
        log.truncated = saved.truncated;
        for update in saved.updates {
            log.insert(update);
        }
        log
    }
}

impl From<FeedLog> for Saved {
    fn from(log: FeedLog) -> Saved {
        Saved {
            incarnation: log.incarnation,
            csn: log.csn,
            truncated: log.truncated,
            updates: log.by_csn.into_values().collect(),
        }
    }
}

impl FeedLog {
    /// An empty log of `incarnation` (empty: a replica that has not heard
    /// from upstream yet).
    pub fn new(incarnation: String) -> FeedLog {
        FeedLog {
            incarnation,
            csn: 0,
            truncated: 0,
            by_csn: BTreeMap::new(),
            by_path: HashMap::new(),
        }
    }

    /// The incarnation; empty for a replica that has none yet.
    pub fn incarnation(&self) -> &str {
        &self.incarnation
    }

    /// The last CSN committed (primary) or caught up to (replica).
    pub fn csn(&self) -> u64 {
        self.csn
    }

    /// Entries held.
    pub fn len(&self) -> usize {
        self.by_csn.len()
    }

    /// Whether it holds no entry.
    pub fn is_empty(&self) -> bool {
        self.by_csn.is_empty()
    }

    /// The latest update of `path`, while held.
    pub fn latest(&self, path: &str) -> Option<&Update> {
        self.by_path.get(path).and_then(|csn| self.by_csn.get(csn))
    }

    /// The primary saw `path`'s body with `digest`: commits it under the
    /// next CSN, unless it is the body the log last saw there.
    pub fn commit(&mut self, path: &str, digest: &str, length: u64, now: u64) -> Option<u64> {
        if self.latest(path).is_some_and(|last| last.digest == digest) {
            return None;
        }
        self.csn += 1;
        self.insert(Update {
            csn: self.csn,
            path: path.to_owned(),
            digest: digest.to_owned(),
            length,
            at: now,
        });
        Some(self.csn)
    }

    /// A replica holds `update` now: it replaces an older one of its path
    /// (false, and nothing changes, if the log has a newer one).
    pub fn apply(&mut self, update: Update) -> bool {
        if self
            .latest(&update.path)
            .is_some_and(|held| held.csn >= update.csn)
        {
            return false;
        }
        self.csn = self.csn.max(update.csn);
        self.insert(update);
        true
    }

    /// A replica caught up to `csn` (its upstream's answer said so).
    pub fn caught_up(&mut self, csn: u64) {
        self.csn = self.csn.max(csn);
    }

    /// A replica starts over from a reset its upstream sent: nothing held,
    /// and its own peers reset in turn (they ask from before `csn`).
    pub fn restart(&mut self, incarnation: &str, csn: u64) {
        *self = FeedLog::new(incarnation.to_owned());
        self.truncated = csn;
    }

    /// After a crash that may have lost the last commits: CSNs go on
    /// `gap` further, so none given out before is given again, and every
    /// peer resets (what the lost commits said is unknown).
    pub fn skip_after_crash(&mut self, gap: u64) {
        self.csn = self.csn.saturating_add(gap);
        self.truncated = self.csn;
    }

    /// Drops entries older than the retention's age and, past its count,
    /// the oldest; returns how many went.
    pub fn expire(&mut self, now: u64, retention: &Retention) -> usize {
        let oldest_kept = now.saturating_sub(retention.max_age.as_secs());
        let mut dropped = 0;
        while let Some((&csn, first)) = self.by_csn.first_key_value() {
            if first.at >= oldest_kept && self.by_csn.len() <= retention.max_entries {
                break;
            }
            let update = self.by_csn.remove(&csn).expect("the first entry");
            self.by_path.remove(&update.path);
            self.truncated = self.truncated.max(csn);
            dropped += 1;
        }
        dropped
    }

    /// The answer to a peer that has everything up to `since` of
    /// `incarnation` (`None`: it has nothing yet), for paths starting with
    /// `prefix`.
    pub fn answer(&self, since: u64, incarnation: Option<&str>, prefix: &str) -> Answer {
        let reset = incarnation != Some(self.incarnation.as_str()) || since < self.truncated;
        let from = if reset { 0 } else { since };
        let updates = self
            .by_csn
            .range(from + 1..)
            .map(|(_, update)| update)
            .filter(|update| update.path.starts_with(prefix))
            .cloned()
            .collect();
        Answer {
            incarnation: self.incarnation.clone(),
            csn: self.csn,
            reset,
            updates,
        }
    }

    fn insert(&mut self, update: Update) {
        if let Some(old) = self.by_path.insert(update.path.clone(), update.csn) {
            self.by_csn.remove(&old);
        }
        self.by_csn.insert(update.csn, update);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn log() -> FeedLog {
        FeedLog::new("i1".into())
    }

    #[test]
    fn a_body_seen_again_is_no_update() {
        let mut log = log();
        assert_eq!(log.commit("/a", "d1", 1, 100), Some(1));
        assert_eq!(log.commit("/a", "d1", 1, 101), None);
        assert_eq!(log.commit("/a", "d2", 2, 102), Some(2));
        assert_eq!(log.commit("/b", "d2", 2, 103), Some(3));
        assert_eq!(log.csn(), 3);
    }

    #[test]
    fn a_peer_far_behind_gets_the_latest_update_of_each_path_once() {
        let mut log = log();
        for version in 0..10 {
            log.commit("/often", &format!("v{version}"), 10, 100 + version);
        }
        log.commit("/once", "x", 1, 200);
        let answer = log.answer(0, Some("i1"), "/");
        assert!(!answer.reset);
        assert_eq!(answer.csn, 11);
        let paths: Vec<_> = answer
            .updates
            .iter()
            .map(|u| (&*u.path, &*u.digest))
            .collect();
        assert_eq!(paths, [("/often", "v9"), ("/once", "x")]);
        // A peer that saw the ninth version gets the tenth and the rest.
        let answer = log.answer(9, Some("i1"), "/");
        assert_eq!(answer.updates.len(), 2);
        assert!(log.answer(11, Some("i1"), "/").updates.is_empty());
    }

    #[test]
    fn a_zone_is_a_path_prefix() {
        let mut log = log();
        log.commit("/static/a.js", "a", 1, 1);
        log.commit("/index.html", "b", 1, 1);
        let answer = log.answer(0, Some("i1"), "/static/");
        assert_eq!(answer.updates.len(), 1);
        assert_eq!(answer.updates[0].path, "/static/a.js");
        // The peer moves past the other zone's commits all the same.
        assert_eq!(answer.csn, 2);
    }

    #[test]
    fn a_peer_behind_what_expired_or_of_another_incarnation_is_reset() {
        let mut log = log();
        log.commit("/old", "a", 1, 100);
        log.commit("/new", "b", 1, 1_000_000);
        let retention = Retention {
            max_age: Duration::from_secs(3600),
            ..Retention::default()
        };
        assert_eq!(log.expire(1_000_100, &retention), 1);
        let behind = log.answer(0, Some("i1"), "/");
        assert!(behind.reset);
        assert_eq!(behind.updates.len(), 1);
        assert_eq!(behind.updates[0].path, "/new");
        // One that saw the expired update needs no reset.
        assert!(!log.answer(1, Some("i1"), "/").reset);
        assert!(log.answer(1, Some("other"), "/").reset);
        assert!(log.answer(2, None, "/").reset);
    }

    #[test]
    fn the_count_is_a_backstop() {
        let mut log = log();
        for n in 0..5 {
            log.commit(&format!("/{n}"), "d", 1, 100);
        }
        let retention = Retention {
            max_entries: 3,
            ..Retention::default()
        };
        assert_eq!(log.expire(100, &retention), 2);
        assert_eq!(log.len(), 3);
        assert!(log.answer(1, Some("i1"), "/").reset);
        assert!(!log.answer(2, Some("i1"), "/").reset);
    }

    #[test]
    fn a_replica_keeps_the_primarys_numbers_and_only_newer_updates() {
        let mut primary = log();
        primary.commit("/a", "1", 1, 1);
        primary.commit("/b", "1", 1, 1);
        primary.commit("/a", "2", 1, 1);
        let mut replica = FeedLog::new(String::new());
        let answer = primary.answer(0, None, "/");
        assert!(answer.reset);
        replica.restart(&answer.incarnation, 0);
        for update in answer.updates.iter().rev() {
            replica.apply(update.clone());
        }
        replica.caught_up(answer.csn);
        assert_eq!(replica.csn(), 3);
        assert_eq!(replica.latest("/a").unwrap().digest, "2");
        assert!(!replica.apply(Update {
            csn: 1,
            path: "/a".into(),
            digest: "1".into(),
            length: 1,
            at: 1
        }));
        assert_eq!(
            replica.answer(0, Some("i1"), "/"),
            answer_without_reset(&answer)
        );
    }

    fn answer_without_reset(answer: &Answer) -> Answer {
        Answer {
            reset: false,
            ..answer.clone()
        }
    }

    #[test]
    fn after_a_crash_no_number_is_given_twice_and_every_peer_resets() {
        let mut log = log();
        log.commit("/a", "1", 1, 1);
        log.skip_after_crash(1000);
        assert!(log.answer(1, Some("i1"), "/").reset);
        assert_eq!(log.commit("/a", "2", 1, 2), Some(1002));
        assert!(!log.answer(1001, Some("i1"), "/").reset);
    }

    #[test]
    fn it_survives_being_written_down() {
        let mut log = log();
        log.commit("/a", "1", 1, 1);
        log.commit("/b", "1", 1, 1);
        log.commit("/a", "2", 1, 1);
        let text = serde_json::to_string(&log).unwrap();
        let back: FeedLog = serde_json::from_str(&text).unwrap();
        assert_eq!(back, log);
        assert_eq!(back.latest("/a").unwrap().csn, 3);
    }
}
