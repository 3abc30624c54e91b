//! Which cached body goes upstream as the basis of a fetch (DESIGN.md's
//! second question): the same URL's stale or partial entry, else the
//! longest-prefix entry of the same origin ([`crate::cache::select_basis`]),
//! from memory when the memory cache holds it; and its signature, cut to
//! what the upstream accepts.
//!
//! Leaves out: whether a stored response may be served at all
//! ([`super::hit`]) and decoding against the basis ([`super::transfer`]).
//!
//! A large basis gets a finer signature than a request header carries,
//! computed here from its body and sent as the request's body
//! ([`ClientProxy::body_signature`]), when the upstream takes one.
//!
//! Main types: [`BasisOffer`], [`BasisBody`].

use bytes::Bytes;
use http::header::HeaderValue;

use super::transfer::ClientBasis;
use super::{ClientProxy, ClientStats, Target};
use crate::cache::{CacheKey, Entry};
use crate::hsync::{DEFAULT_STRONG_LEN, FileBasis, SignatureParams, choose_block_size, sign};
use crate::http::headers::byte_sequence;

/// Block size of a signature sent in a request body: as fine as the
/// corpus's best (1 KiB) costs 1.2 % of the basis in signature; 1.5 KiB,
/// 0.8 %, finds a 50 MB body's 100 scattered edits within 1 MB on the link
/// where the header's 4.6 KB signature (130 KB blocks) found none.
const BODY_SIGNATURE_BLOCK: u32 = 1536;

/// Largest signature we send in a request body (bytes), whatever the
/// upstream takes: 8 MiB describes 1 GiB at 1.5 KiB blocks.
const MAX_BODY_SIGNATURE: usize = 8 << 20;

/// The basis sent upstream.
pub(super) struct BasisOffer {
    pub(super) key: CacheKey,
    /// The body the signature describes, even if the entry is replaced
    /// meanwhile (D-A7).
    pub(super) body: BasisBody,
    /// `Hsync-Basis`.
    pub(super) name: HeaderValue,
    /// The basis body's blake3, which `name` carries.
    pub(super) digest: [u8; 32],
    /// `Hsync-Signature`, cut to the budget.
    pub(super) signature: HeaderValue,
    /// Its length, decoded.
    pub(super) signature_len: usize,
    /// The basis body's length.
    pub(super) body_len: u64,
}

/// Where a basis's bytes are.
pub(super) enum BasisBody {
    /// The entry's body file, kept open.
    File(std::fs::File),
    /// The memory cache's copy.
    Memory(Bytes),
}

impl ClientProxy {
    /// Picks the basis for `key`: the stale or partial entry of the same
    /// URL, else the longest-prefix entry of the same origin.
    pub(super) async fn choose_basis(
        &self,
        target: &Target,
        key: &CacheKey,
        same_url: Option<&Entry>,
    ) -> Option<BasisOffer> {
        let budget = self.signature_budget(target);
        if budget == 0 {
            return None;
        }
        if let Some(entry) = same_url {
            // D-B1: an entry kept for one user (Authorization, Set-Cookie,
            // private) is never another request's basis, even for its URL.
            let usable =
                (entry.meta.shareable_as_basis || !self.is_shared()) && entry.meta.status == 200;
            return usable.then(|| basis_offer(entry, budget)).flatten();
        }
        // The choice is made in memory; only reading the entry needs a
        // thread, unless the memory cache holds it.
        let candidate = self.store.basis(key, self.config.scope)?;
        if let Some(hot) = self.hot.get(candidate.key.digest().as_bytes(), &candidate)
            && hot.is_intact()
            && let Some(signature) = cut_signature(&hot.signature, budget)
        {
            ClientStats::add(&self.stats.memory_bases, 1);
            return Some(BasisOffer {
                name: byte_sequence(candidate.body_blake3.as_bytes()),
                digest: *candidate.body_blake3.as_bytes(),
                signature: byte_sequence(signature),
                signature_len: signature.len(),
                body_len: hot.body.len() as u64,
                key: candidate.key,
                body: BasisBody::Memory(hot.body.clone()),
            });
        }
        let store = self.store.clone();
        tokio::task::spawn_blocking(move || {
            let entry = store.get(&candidate.key)?;
            basis_offer(&entry, budget)
        })
        .await
        .ok()
        .flatten()
    }

    /// Signature bytes to send: what the upstream advertised, within our
    /// own cap, else the default. On a direct route, a host that has not
    /// answered in hsync (within the advertisement's TTL) is most likely an
    /// ordinary origin, which would ignore a signature: it gets none until
    /// it does (its first coded answer, without a basis, says so).
    pub(super) fn signature_budget(&self, target: &Target) -> usize {
        match target.upstream.advertised(&target.url) {
            Some(advertised) => advertised
                .max_signature
                .min(self.config.max_signature_bytes),
            None if target.upstream.is_direct() => 0,
            None => self.config.default_signature_bytes,
        }
    }
}

impl ClientProxy {
    /// A signature of `offer`'s body at [`BODY_SIGNATURE_BLOCK`] for the
    /// request's body, when the header's budget would need coarser blocks
    /// and the upstream takes a signature that large in a body
    /// (`max-body-signature`); `None` otherwise, or when the body cannot
    /// be read (the header's signature goes instead).
    ///
    /// Computed from the body each time (a 50 MB basis takes ~0.1 s of a
    /// blocking thread), rather than taken from the stream: SIG frames
    /// that fine would cost as much on every download.
    pub(super) async fn body_signature(
        &self,
        target: &Target,
        offer: &BasisOffer,
    ) -> Option<Bytes> {
        let entry_len = 4 + DEFAULT_STRONG_LEN as usize;
        let header_budget = self.signature_budget(target);
        let wanted = crate::hsync::SIGNATURE_HEADER_LEN
            + usize::try_from(offer.body_len.div_ceil(u64::from(BODY_SIGNATURE_BLOCK)))
                .ok()?
                .checked_mul(entry_len)?;
        if wanted <= header_budget {
            return None;
        }
        let budget = target
            .upstream
            .advertised(&target.url)?
            .max_body_signature
            .min(MAX_BODY_SIGNATURE)
            .min(wanted);
        if budget <= header_budget {
            return None;
        }
        let params = SignatureParams {
            block_size: choose_block_size(offer.body_len, budget, BODY_SIGNATURE_BLOCK),
            strong_len: DEFAULT_STRONG_LEN,
        };
        // Positional reads of the entry's file: the decoder reads the
        // same open file.
        let body = match &offer.body {
            BasisBody::Memory(bytes) => ClientBasis::Memory(bytes.clone()),
            BasisBody::File(file) => {
                ClientBasis::File(FileBasis::new(file.try_clone().ok()?).ok()?)
            }
        };
        tokio::task::spawn_blocking(move || sign(&body, params).ok())
            .await
            .ok()?
            .map(Bytes::from)
    }
}

/// The `Hsync-Basis` and cut `Hsync-Signature` for an entry, or `None` when
/// it has no usable signature.
fn basis_offer(entry: &Entry, budget: usize) -> Option<BasisOffer> {
    let signature = cut_signature(&entry.signature, budget)?;
    let digest = entry.meta.body_digest().ok()?;
    Some(BasisOffer {
        key: entry.meta.key().ok()?,
        body: BasisBody::File(entry.body.try_clone().ok()?),
        name: byte_sequence(digest.as_bytes()),
        digest: *digest.as_bytes(),
        signature: byte_sequence(signature),
        signature_len: signature.len(),
        body_len: entry.meta.body_len,
    })
}

/// The signature cut to `budget` bytes at an entry boundary (the
/// accelerator uses the blocks it gets); `None` when not even the header
/// and one entry fit, or the signature is malformed.
fn cut_signature(signature: &[u8], budget: usize) -> Option<&[u8]> {
    const HEADER: usize = crate::hsync::SIGNATURE_HEADER_LEN;
    let strong_len = u32::from_be_bytes(signature.get(8..12)?.try_into().ok()?) as usize;
    if !(8..=32).contains(&strong_len) {
        return None;
    }
    let entry_len = 4 + strong_len;
    let room = budget.min(signature.len()).checked_sub(HEADER)?;
    let entries = room / entry_len;
    (entries > 0).then(|| &signature[..HEADER + entries * entry_len])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signatures_are_cut_at_entry_boundaries() {
        let mut sig = vec![0x72, 0x73, 0x01, 0x36, 0, 0, 4, 0, 0, 0, 0, 8];
        sig.extend(std::iter::repeat_n(7u8, 12 * 10));
        assert_eq!(cut_signature(&sig, 1000).unwrap().len(), sig.len());
        assert_eq!(cut_signature(&sig, 12 + 12 * 3 + 5).unwrap().len(), 12 + 36);
        assert_eq!(cut_signature(&sig, 20), None, "not one entry");
        assert_eq!(cut_signature(&sig[..10], 1000), None, "no header");
    }
}
