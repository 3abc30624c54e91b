//! The change feed: ANTACID's commit-and-propagate (seed 002, ars-c) for
//! web sites, so a client proxy's cache is fresh before its users ask.
//!
//! - **Zone** = a site's URL prefix (`http://www.example.com/static/`).
//! - **Primary** = the accelerator: each time a path of a site is served
//!   (coded) or submitted with a body whose digest differs from the last
//!   one seen there, it commits an update under the site's next **CSN**
//!   ([`primary::Feeds`]).
//! - **SubmitUpdate** = `POST /.well-known/hsync-feed` on the site's host,
//!   listing the paths that changed (a deploy hook): the accelerator
//!   fetches each from the origin and commits what changed. At a replica
//!   the same request passes upstream as any POST does, so a submission
//!   reaches the primary from anywhere in the tree (ars-s). A watched
//!   document root (`--feed-watch`, [`watch`]) submits the files that
//!   change in it.
//! - **PullCommittedUpdates** = `GET /.well-known/hsync-feed?since=n`: the
//!   updates after CSN n under the zone's prefix, collapsed to the latest
//!   per path, or a reset (the whole listing) for a peer behind what the
//!   log retains ([`log::FeedLog::answer`]).
//! - **PushCommittedUpdates** = a `FEED token csn` line sent to the
//!   callback address a pull gave (`X-Node`, as PARQ's QUEUE callback): the
//!   replica pulls at once instead of at its next interval.
//! - **Replica** = a client proxy subscribed to a zone: it pulls, prefetches
//!   each changed body through its own cache (a delta against what it
//!   holds), and then commits the update to its own log under the primary's
//!   CSN, so proxies behind it replicate from it in turn.
//!
//! Where this departs from the seed, and why:
//! - No submission sequence numbers or commit notifications: a submitter
//!   gets the CSNs (or why nothing changed) in the POST's answer; the
//!   origin, not the feed, holds the documents.
//! - The update carries the body's digest and length, never the body: a
//!   replica fetches it as any request, so it comes coded against what the
//!   replica holds, counted in the upload slots, and only if a shared cache
//!   may store it (privacy: nothing a user's request alone could see).
//! - Collapsing is how the log is kept (one entry per path), and the
//!   retained log is bounded by age (and count), so a reset replaces
//!   AllZoneData.
//!
//! Main parts: [`log`] (sans-IO), [`wire`] (sans-IO), [`state`] (the
//! files), [`primary`] (the accelerator's feeds). The replica is the client
//! proxy's (`client_proxy::replica`).

pub mod log;
pub mod primary;
pub mod state;
pub mod watch;
pub mod wire;

pub use log::{Answer, FeedLog, Retention, Update};
pub use primary::Feeds;
pub use wire::{FEED_PATH, Pull};
