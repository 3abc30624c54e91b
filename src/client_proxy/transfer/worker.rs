//! The work on a relay's bytes, on the blocking pool: decoding an hsync
//! stream against its basis (or signing a plain body), holding rebuilt
//! bytes back until the stream vouches for them, hashing for the origin's
//! digests, writing the cache entry (a small body's here, a large one's
//! through a [`BackgroundWriter`]), and at the end the last checks
//! ([`Worker::conclude`]) and the commit ([`Worker::commit`]). It never
//! waits: what it produces for the user agent and the cache writer is
//! queued on it, and the driver hands it on.
//!
//! Main items: [`Worker`], [`Stop`], [`Ending`], [`Commit`].

use bytes::Bytes;

use super::digests::DigestCheck;
use super::window_pool::WindowPool;
use super::{
    ClientBasis, Coding, Outcome, RebuiltLen, Relay, StoreTarget, WHOLE_BELOW, WholeOrStream,
};
use crate::cache::{CacheError, CacheKey, Completeness, EntryWriter, NewEntry};
use crate::client_proxy::cache_writer::BackgroundWriter;
use crate::client_proxy::cached_body::SMALL_BODY;
use crate::hsync::{
    DecodeError, Decoder, EncoderOptions, SignatureBuilder, SignatureParams, choose_block_size,
};
use crate::http::body_pipe::AGENT_SLICE;
use crate::http::upstream_guard::ExchangeCheck;

/// Body bytes written to the cache on the relay's own thread; the rest of
/// a larger body is written by a [`BackgroundWriter`].
const BACKGROUND_WRITE_AFTER: u64 = SMALL_BODY;

/// The work on a relay's bytes, between waits (see [`Driver`](super::driver::Driver)): what it
/// produces for the user agent and the cache writer is queued here and
/// handed on by the driver.
pub(super) struct Worker {
    /// The decoder of an hsync body, with the basis's cache key.
    decoder: Option<(Decoder<ClientBasis>, Option<CacheKey>)>,
    /// A plain body's signature, computed here, and its announced length.
    plain: Option<(SignatureBuilder, Option<u64>)>,
    pool: WindowPool,
    /// Rebuilt bytes the stream has not vouched for yet.
    unverified: std::collections::VecDeque<Bytes>,
    unverified_len: u64,
    /// The cache entry while it is written here (a small body so far).
    pub(super) store: Option<StoreTarget>,
    /// The cache entry once the body is large: written by a task of its own.
    pub(super) background: Option<BackgroundWriter>,
    digests: DigestCheck,
    /// Body for the user agent, checked, in order (the driver's
    /// downstream slices it), and slices for the background writer.
    pub(super) to_agent: Vec<Bytes>,
    pub(super) to_write: Vec<Bytes>,
    pub(super) agent_gone: bool,
    /// The user agent's body was ended (cleanly or not): after what is
    /// in `to_agent`, with `agent_error` if it failed.
    pub(super) agent_ended: bool,
    /// Why the user agent's body failed, once it did.
    pub(super) agent_error: Option<String>,
    pub(super) upstream_bytes: u64,
    pub(super) body_bytes: u64,
    /// The user agent was told this Content-Length (a plain body's, or an
    /// hsync body's verified whole before any byte went on): the chunk
    /// that reaches it is held back until the checks pass, or the user
    /// agent would see a complete-looking body that then fails (D-A5).
    announced_len: Option<u64>,
    /// Where the relay reads an hsync body's length, once verified whole.
    rebuilt_len: RebuiltLen,
    held: Option<Bytes>,
    framing: Option<ExchangeCheck>,
    /// Whether the body goes whole, shared with the relay.
    choice: WholeOrStream,
}

/// Rebuilt bytes held back at most, waiting for the SIG entries that
/// vouch for them: two of the largest windows and eight blocks (the
/// decoder recomputes entries eight blocks at a time). An upstream that
/// sends more without them is not speaking hsync/1.
const MAX_UNVERIFIED: u64 =
    2 * crate::hsync::MAX_WINDOW_OUTPUT as u64 + 8 * crate::hsync::MAX_BLOCK_SIZE as u64;

/// Why the worker stopped before the end of the upstream body.
pub(super) enum Stop {
    /// Upstream failed (reset, cut): keep a partial entry.
    Interrupted(String),
    /// Upstream sent a malformed body (a bad chunk): keep nothing, since
    /// no byte of it can be trusted to be the body (P-5); the basis is
    /// not at fault.
    Malformed(String),
    /// The bytes are wrong: store nothing, drop the basis.
    Corrupt(String),
    /// Nobody wants the rest.
    Abandoned,
}

/// How a relay ends, once the upstream body is over.
pub(super) enum Ending {
    /// Nothing (more) to commit.
    Done(Outcome),
    /// An entry to commit.
    Commit(Commit),
}

/// An entry to commit, and how.
pub(super) struct Commit {
    completeness: Completeness,
    signature: Vec<u8>,
    /// The body's blake3 when the decoder computed it.
    body_digest: Option<blake3::Hash>,
    /// End the user agent's body before the commit (a large body: its
    /// fsync can take seconds the user agent need not wait for).
    pub(super) end_agent_first: bool,
    /// Why the transfer stopped early (a partial entry).
    interrupted: Option<String>,
}

impl Commit {
    /// The rebuilt body's blake3, when the decoder computed it and the
    /// body is whole.
    pub(super) fn whole_digest(&self) -> Option<blake3::Hash> {
        self.body_digest
            .filter(|_| self.completeness == Completeness::Complete)
    }
}

impl Worker {
    pub(super) fn new(relay: Relay, choice: WholeOrStream, rebuilt_len: RebuiltLen) -> Worker {
        let mut worker = Worker::idle();
        worker.choice = choice;
        worker.rebuilt_len = rebuilt_len;
        match relay.coding {
            Coding::Hsync {
                basis,
                basis_key,
                limits,
            } => {
                // The decoder hashes every byte it rebuilds (for END); the
                // cache writer hashes what it writes (for the outboard), and
                // the commit checks that both agree.
                worker.decoder = Some((Decoder::new(basis, limits), basis_key));
            }
            Coding::Plain { expected_len } => {
                let block = choose_block_size(
                    expected_len.unwrap_or(0),
                    EncoderOptions::default().max_signature_bytes,
                    EncoderOptions::default().min_block_size,
                );
                let signature = SignatureBuilder::new(SignatureParams {
                    block_size: block,
                    strong_len: crate::hsync::DEFAULT_STRONG_LEN,
                });
                worker.plain = Some((signature, expected_len));
                worker.announced_len = expected_len;
            }
        }
        worker.digests = DigestCheck::new(&relay.origin_digests);
        worker.framing = relay.framing;
        worker.store = relay.store;
        worker
    }

    /// A worker with nothing to do (a placeholder while the real one is on
    /// the blocking pool).
    pub(super) fn idle() -> Worker {
        Worker {
            decoder: None,
            plain: None,
            pool: WindowPool::default(),
            unverified: Default::default(),
            unverified_len: 0,
            store: None,
            background: None,
            digests: DigestCheck::default(),
            to_agent: Vec::new(),
            to_write: Vec::new(),
            agent_gone: false,
            agent_ended: false,
            agent_error: None,
            upstream_bytes: 0,
            body_bytes: 0,
            announced_len: None,
            rebuilt_len: RebuiltLen::default(),
            held: None,
            framing: None,
            choice: WholeOrStream::default(),
        }
    }

    /// Takes the next upstream chunk.
    pub(super) fn step(&mut self, chunk: &Bytes) -> Result<(), Stop> {
        if let Some((decoder, _)) = &mut self.decoder {
            let pool = &self.pool;
            let unverified = &mut self.unverified;
            let unverified_len = &mut self.unverified_len;
            let pushed = decoder.push_to(chunk, |window| {
                let rebuilt = std::mem::replace(window, pool.take());
                *unverified_len += rebuilt.len() as u64;
                unverified.push_back(pool.share(rebuilt));
                Ok(())
            });
            let verified = decoder.verified_len();
            pushed.map_err(|error| Stop::Corrupt(format!("hsync stream: {error}")))?;
            if decoder.is_complete() && self.body_bytes == 0 {
                // Verified whole before a byte went on (no SIG frames: held
                // until END): the relay may announce its length.
                let len = decoder.rebuilt_len();
                self.announced_len = Some(len);
                self.rebuilt_len.set(len);
            }
            self.release_verified(verified)?;
            return Ok(());
        }
        if let Some((signature, _)) = &mut self.plain
            && (self.store.is_some() || self.background.is_some())
        {
            signature.update(chunk);
        }
        self.emit(chunk);
        Ok(())
    }

    /// Frees buffers the next step would otherwise reuse.
    pub(super) fn release_scratch(&mut self) {
        if let Some((decoder, _)) = &mut self.decoder {
            decoder.release_scratch();
        }
        self.pool.clear();
    }

    /// Hands on the rebuilt bytes up to `verified` (a body offset).
    fn release_verified(&mut self, verified: u64) -> Result<(), Stop> {
        let mut releasable = verified.saturating_sub(self.body_bytes);
        while releasable > 0 {
            let Some(mut window) = self.unverified.pop_front() else {
                break;
            };
            if window.len() as u64 > releasable {
                let rest = window.split_off(releasable as usize);
                self.unverified.push_front(rest);
            }
            releasable -= window.len() as u64;
            self.unverified_len -= window.len() as u64;
            self.emit(&window);
        }
        if self.unverified_len > MAX_UNVERIFIED {
            return Err(Stop::Malformed(format!(
                "upstream sent {} bytes without the SIG entries for them",
                self.unverified_len
            )));
        }
        Ok(())
    }

    /// Hands body bytes to the cache writer, the digest check and the
    /// user agent's queue.
    fn emit(&mut self, data: &Bytes) {
        self.body_bytes += data.len() as u64;
        self.digests.update(data);
        // Past the first MiB the cache writes move to a task of their own,
        // which takes the body in slices.
        if self.body_bytes > BACKGROUND_WRITE_AFTER
            && let Some(target) = self.store.take()
        {
            self.background = Some(BackgroundWriter::start(target));
        }
        if let Some(target) = &mut self.store
            && let Err(error) = target.writer.write_body(data)
        {
            // Full disk or over budget: the user agent still gets its
            // bytes (C-E1); the entry is just not kept.
            tracing::warn!(cache = %target.store.root().display(), %error, "cache write failed; not storing this response");
            self.store = None;
        }
        // A rebuilt window can be many MiB: it goes to the writer's queue
        // in slices, so that the queue holds a few slices, not a few
        // windows' worth of bytes. These slices share the window: the
        // writer does not stall as a user agent may. (The user agent's
        // copies are cut by the driver's downstream, as room comes.)
        if self.background.is_some() {
            for start in (0..data.len()).step_by(AGENT_SLICE) {
                self.to_write
                    .push(data.slice(start..data.len().min(start + AGENT_SLICE)));
            }
        }
        if data.is_empty() {
            return;
        }
        if self.announced_len == Some(self.body_bytes) {
            // The last slice the downstream would cut is held back.
            let last = (data.len() - 1) / AGENT_SLICE * AGENT_SLICE;
            self.send_to_agent(data.slice(..last));
            self.held = Some(data.slice(last..));
        } else {
            self.send_to_agent(data.clone());
        }
    }

    /// Whether the body is still being written to a cache entry.
    pub(super) fn is_storing(&self) -> bool {
        self.store.is_some() || self.background.is_some()
    }

    /// Ends the user agent's body cleanly: the held chunk, then the end of
    /// the stream. Idempotent.
    pub(super) fn end_agent(&mut self) {
        if let Some(last) = self.held.take() {
            self.send_to_agent(last);
        }
        self.agent_ended = true;
    }

    fn send_to_agent(&mut self, piece: Bytes) {
        if !piece.is_empty() && !self.agent_gone && !self.agent_ended {
            self.to_agent.push(piece);
        }
    }

    /// Ends the user agent's body with an error, so it is never mistaken
    /// for a whole one.
    fn abort_agent(&mut self, reason: &str) {
        tracing::warn!(%reason, "aborting the response");
        self.held = None;
        if !self.agent_gone && !self.agent_ended {
            self.agent_error = Some(reason.to_owned());
        }
        self.agent_ended = true;
    }

    /// The upstream body is over (`result`): the last checks, and what to
    /// commit. The background writer is settled by now.
    pub(super) fn conclude(&mut self, result: Result<(), Stop>) -> Ending {
        let signature;
        let mut body_digest = None;
        let mut basis_key = None;
        let result = match self.decoder.take() {
            Some((mut decoder, key)) => {
                basis_key = key;
                // A clean end without END is a cut, as an aborted body is.
                let result = result.and_then(|()| {
                    decoder.finish().map_err(|e| match e {
                        DecodeError::Truncated { .. } => Stop::Interrupted(e.to_string()),
                        other => Stop::Corrupt(format!("hsync stream: {other}")),
                    })
                });
                match result {
                    Ok(decoded) => {
                        // END vouched for the rest.
                        if let Err(stop) = self.release_verified(decoded.len) {
                            return self.stopped(stop, None, None, None);
                        }
                        signature = Some(decoded.signature);
                        body_digest = Some(decoded.digest.into());
                        Ok(())
                    }
                    Err(stop) => {
                        // What was never vouched for is not the body's
                        // prefix: the partial entry ends where checks did
                        // (a whole number of blocks), and the writer's own
                        // digest of it is the one kept.
                        let partial = decoder.into_partial();
                        if self.unverified_len == 0 {
                            signature = partial.signature;
                            body_digest = Some(partial.digest.into());
                        } else {
                            signature = partial
                                .signature
                                .and_then(|s| signature_prefix(s, self.body_bytes));
                        }
                        Err(stop)
                    }
                }
            }
            None => {
                let (mut builder, expected_len) = self.plain.take().expect("plain or hsync");
                let result = result.and_then(|()| match expected_len {
                    Some(len) if len != self.body_bytes => Err(Stop::Interrupted(format!(
                        "body of {} bytes where Content-Length said {len}",
                        self.body_bytes
                    ))),
                    _ => Ok(()),
                });
                builder.finish();
                signature = Some(builder.to_signature_bytes());
                result
            }
        };
        match result {
            Ok(()) => self.complete(signature.unwrap_or_default(), body_digest),
            Err(stop) => self.stopped(stop, signature, body_digest, basis_key.as_ref()),
        }
    }

    /// Every byte arrived: check the origin's digests, and commit.
    fn complete(&mut self, signature: Vec<u8>, body_digest: Option<blake3::Hash>) -> Ending {
        // hyper ends a body at its length; bytes after it that its
        // connection read by now make the response untrustworthy (P-17).
        // Later ones are not seen here (the connection still fails on
        // them, and is not reused). The body itself came whole as
        // declared: it is served, never stored, when it goes whole (the
        // caller's head then forbids storing it, as `Upstream::send` made
        // it when they came with the head). A streamed one's head went
        // with the origin's caching fields, and a clean end would let a
        // cache after us keep it: cut, as the accelerator cuts a streamed
        // body. Any other violation fails it.
        if let Some(check) = &self.framing
            && let Some(violation) = check.violation()
        {
            let reason = format!("upstream body: {}", ExchangeCheck::error(violation));
            if !(check.has_excess() && self.body_bytes < WHOLE_BELOW as u64 && self.choice.whole())
            {
                return self.stopped(Stop::Malformed(reason), None, None, None);
            }
            tracing::warn!(%reason, "served whole as declared, not stored");
            if let Some(target) = self.store.take() {
                target.writer.abort();
            }
        }
        let digests = std::mem::take(&mut self.digests);
        if let Err(reason) = digests.verify() {
            self.abort_agent(&reason);
            if let Some(target) = self.store.take() {
                target.writer.abort();
            }
            return Ending::Done(Outcome::Corrupt { reason });
        }
        if self.store.is_none() {
            return Ending::Done(Outcome::Complete { stored: false });
        }
        // A small body is committed before the user agent sees its end (the
        // relay ends it after the report), so the next request (the next
        // release a page asks for) finds it.
        Ending::Commit(Commit {
            completeness: Completeness::Complete,
            signature,
            body_digest,
            end_agent_first: self.body_bytes > SMALL_BODY,
            interrupted: None,
        })
    }

    /// The relay stopped early.
    fn stopped(
        &mut self,
        stop: Stop,
        signature: Option<Vec<u8>>,
        body_digest: Option<blake3::Hash>,
        basis_key: Option<&CacheKey>,
    ) -> Ending {
        match stop {
            Stop::Abandoned => {
                self.store = None;
                Ending::Done(Outcome::Abandoned)
            }
            // The cache is settled before the user agent learns of the
            // failure, so a retry sees the state that follows from it.
            Stop::Corrupt(reason) => {
                if let Some(target) = self.store.take() {
                    if let Some(key) = basis_key {
                        target.store.remove(key);
                        tracing::warn!(basis = %key, %reason, "dropped the basis of a stream that failed its checks");
                    }
                    target.writer.abort();
                }
                self.abort_agent(&reason);
                Ending::Done(Outcome::Corrupt { reason })
            }
            Stop::Malformed(reason) => {
                if let Some(target) = self.store.take() {
                    target.writer.abort();
                }
                self.abort_agent(&reason);
                Ending::Done(Outcome::Interrupted {
                    partial_stored: false,
                })
            }
            Stop::Interrupted(reason) => match signature {
                Some(signature) if self.body_bytes > 0 && self.store.is_some() => {
                    Ending::Commit(Commit {
                        completeness: Completeness::Partial,
                        signature,
                        body_digest,
                        end_agent_first: false,
                        interrupted: Some(reason),
                    })
                }
                _ => {
                    self.store = None;
                    self.abort_agent(&reason);
                    Ending::Done(Outcome::Interrupted {
                        partial_stored: false,
                    })
                }
            },
        }
    }

    /// Commits the entry as `commit` says (blocking: fsyncs).
    pub(super) fn commit(&mut self, commit: Commit) -> Outcome {
        let stored = match self.store.take() {
            Some(mut target) => {
                target.entry.completeness = commit.completeness;
                // A piece (a 206 from the first byte) that checked out is
                // whole only if it reached the end (RFC 9111 §3.3).
                if target
                    .entry
                    .complete_len
                    .is_some_and(|len| len > self.body_bytes)
                {
                    target.entry.completeness = Completeness::Partial;
                }
                match commit_entry(
                    target.writer,
                    target.entry,
                    &commit.signature,
                    commit.body_digest,
                ) {
                    Ok(()) => true,
                    Err(error) => {
                        if commit.interrupted.is_none() {
                            tracing::warn!(%error, "cache commit failed; response served, not stored");
                        }
                        false
                    }
                }
            }
            None => false,
        };
        match commit.interrupted {
            None => Outcome::Complete { stored },
            Some(reason) => {
                self.abort_agent(&reason);
                Outcome::Interrupted {
                    partial_stored: stored,
                }
            }
        }
    }
}

/// The part of a body's `signature` (librsync format) that describes its
/// first `len` bytes, when those are a whole number of its blocks.
fn signature_prefix(mut signature: Vec<u8>, len: u64) -> Option<Vec<u8>> {
    let header = signature.get(..crate::hsync::SIGNATURE_HEADER_LEN)?;
    let block = u64::from(u32::from_be_bytes(header[4..8].try_into().ok()?));
    let strong = u64::from(u32::from_be_bytes(header[8..12].try_into().ok()?));
    if block == 0 || !len.is_multiple_of(block) {
        return None;
    }
    let keep = crate::hsync::SIGNATURE_HEADER_LEN as u64 + len / block * (4 + strong);
    if keep > signature.len() as u64 {
        return None;
    }
    signature.truncate(keep as usize);
    Some(signature)
}

fn commit_entry(
    writer: EntryWriter,
    entry: NewEntry,
    signature: &[u8],
    body_digest: Option<blake3::Hash>,
) -> Result<(), CacheError> {
    match body_digest {
        Some(digest) => writer.commit_with_digest(entry, signature, digest),
        None => writer.commit(entry, signature),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_signature_prefix_describes_the_first_whole_blocks() {
        let body: Vec<u8> = (0..10_000u32).map(|i| (i * 31 % 251) as u8).collect();
        let params = SignatureParams {
            block_size: 1024,
            strong_len: 8,
        };
        let signature_of = |bytes: &[u8]| {
            let mut builder = SignatureBuilder::new(params);
            builder.update(bytes);
            builder.finish();
            builder.to_signature_bytes()
        };
        let whole = signature_of(&body);
        assert_eq!(
            signature_prefix(whole.clone(), 3072),
            Some(signature_of(&body[..3072]))
        );
        assert_eq!(signature_prefix(whole.clone(), 0), Some(signature_of(&[])));
        assert_eq!(
            signature_prefix(whole, 3000),
            None,
            "not a whole number of blocks"
        );
    }
}
