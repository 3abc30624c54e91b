//! Request coalescing: identical concurrent misses share one upstream fetch
//! (C-W2). The first request for a key becomes the leader and fetches; the
//! others wait until the leader's entry is committed (or the leader gave
//! up) and then read the cache, as nginx's `proxy_cache_lock` does. A
//! follower waits at most the lock timeout and then fetches on its own; the
//! table's entries expire after the same time, so a hung leader never
//! blocks later requests (C-W3, seed 003: entries expire by age).
//!
//! Main types: [`InFlight`], [`Role`], [`Leader`].

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;

use crate::expiring::ExpiringMap;

/// The table of fetches in flight, by cache key digest.
#[derive(Clone)]
pub struct InFlight {
    table: Arc<Mutex<ExpiringMap<blake3::Hash, Slot>>>,
    lock_timeout: Duration,
}

#[derive(Clone)]
struct Slot {
    generation: u64,
    done: watch::Receiver<bool>,
}

/// What a request is in the table.
pub enum Role {
    /// Fetch, then drop the guard when the entry is committed or given up.
    Leader(Leader),
    /// Wait for the leader with [`Follower::wait`].
    Follower(Follower),
}

/// The leader's guard: dropping it wakes the followers and frees the slot.
pub struct Leader {
    table: Arc<Mutex<ExpiringMap<blake3::Hash, Slot>>>,
    key: blake3::Hash,
    generation: u64,
    done: watch::Sender<bool>,
}

/// A request waiting for a leader.
pub struct Follower {
    done: watch::Receiver<bool>,
    lock_timeout: Duration,
}

impl InFlight {
    /// An empty table; followers wait at most `lock_timeout`.
    pub fn new(lock_timeout: Duration) -> InFlight {
        InFlight {
            table: Arc::new(Mutex::new(ExpiringMap::new(lock_timeout))),
            lock_timeout,
        }
    }

    /// Joins the fetch for `key`: leader if none is in flight (or the one
    /// in flight is older than the lock timeout), follower otherwise.
    pub fn join(&self, key: blake3::Hash) -> Role {
        let now = Instant::now();
        let mut table = self.table.lock().expect("no panics under this lock");
        if let Some(slot) = table.get(&key, now) {
            return Role::Follower(Follower {
                done: slot.done.clone(),
                lock_timeout: self.lock_timeout,
            });
        }
        let (done, receiver) = watch::channel(false);
        let generation = rand_generation();
        table.insert(
            key,
            Slot {
                generation,
                done: receiver,
            },
            now,
        );
        Role::Leader(Leader {
            table: self.table.clone(),
            key,
            generation,
            done,
        })
    }

    /// Fetches in flight (for stats and tests).
    pub fn len(&self) -> usize {
        self.table.lock().expect("no panics under this lock").len()
    }

    /// Whether nothing is in flight.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A distinct number per leader, so an expired leader's guard never frees
/// the slot of the leader that replaced it.
fn rand_generation() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(1);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

impl Drop for Leader {
    fn drop(&mut self) {
        let mut table = self.table.lock().expect("no panics under this lock");
        if table
            .get(&self.key, Instant::now())
            .is_some_and(|slot| slot.generation == self.generation)
        {
            table.remove(&self.key);
        }
        drop(table);
        let _ = self.done.send(true);
    }
}

impl Follower {
    /// Waits until the leader is done. `false` when the lock timeout passed
    /// first: the caller fetches on its own.
    pub async fn wait(mut self) -> bool {
        let wait = self.done.wait_for(|done| *done);
        // A leader dropped without sending is done too.
        tokio::time::timeout(self.lock_timeout, wait).await.is_ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(n: u8) -> blake3::Hash {
        blake3::hash(&[n])
    }

    #[tokio::test(start_paused = true)]
    async fn the_first_request_leads_and_the_others_wait_for_it() {
        let table = InFlight::new(Duration::from_secs(5));
        let Role::Leader(leader) = table.join(key(1)) else {
            panic!("first is leader")
        };
        let Role::Follower(follower) = table.join(key(1)) else {
            panic!("second follows")
        };
        assert!(matches!(table.join(key(2)), Role::Leader(_)), "other key");
        let waiting = tokio::spawn(follower.wait());
        tokio::time::advance(Duration::from_secs(1)).await;
        assert!(!waiting.is_finished());
        drop(leader);
        assert!(
            waiting.await.unwrap(),
            "woken by the leader, not the timeout"
        );
        assert!(matches!(table.join(key(1)), Role::Leader(_)), "slot freed");
    }

    #[tokio::test(start_paused = true)]
    async fn a_hung_leader_releases_followers_at_the_lock_timeout() {
        let table = InFlight::new(Duration::from_secs(5));
        let Role::Leader(old) = table.join(key(1)) else {
            panic!()
        };
        let Role::Follower(follower) = table.join(key(1)) else {
            panic!()
        };
        let started = Instant::now();
        assert!(!follower.wait().await, "timed out");
        assert_eq!(started.elapsed(), Duration::from_secs(5));
        // The slot has expired: a new request leads, and the old leader's
        // late guard does not free the new leader's slot.
        let Role::Leader(_new) = table.join(key(1)) else {
            panic!("expired slot gives a new leader")
        };
        drop(old);
        assert!(matches!(table.join(key(1)), Role::Follower(_)));
    }
}
