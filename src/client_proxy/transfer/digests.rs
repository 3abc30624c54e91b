//! The digests an origin sends for a body (`Content-Digest`,
//! `Repr-Digest`; RFC 9530): reading them from the headers, and checking
//! the bytes the user agent gets against them. Nothing here decides what
//! a failed check does to the response or the cache; the worker does.
//!
//! Main items: [`OriginDigest`], [`DigestCheck`].

use base64::Engine;
use http::HeaderMap;
use sha2::Digest;

/// A digest from `Content-Digest` or `Repr-Digest` (RFC 9530) that we can
/// check.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OriginDigest {
    /// `sha-256`.
    Sha256(Vec<u8>),
    /// `sha-512`.
    Sha512(Vec<u8>),
}

impl OriginDigest {
    /// The digests of a header value like `sha-256=:…:, sha-512=:…:`;
    /// algorithms we do not know are ignored (nothing to check), a known
    /// one with an unreadable value is kept as an empty digest, which then
    /// fails (a header the origin botched is not silently skipped).
    pub fn parse_all(headers: &HeaderMap, name: &str) -> Vec<OriginDigest> {
        let mut digests = Vec::new();
        for value in headers.get_all(name) {
            let Ok(text) = value.to_str() else { continue };
            for item in text.split(',') {
                let Some((algorithm, value)) = item.split_once('=') else {
                    continue;
                };
                let bytes = value
                    .trim()
                    .strip_prefix(':')
                    .and_then(|v| v.strip_suffix(':'))
                    .and_then(|v| base64::engine::general_purpose::STANDARD.decode(v).ok())
                    .unwrap_or_default();
                match algorithm.trim().to_ascii_lowercase().as_str() {
                    "sha-256" => digests.push(OriginDigest::Sha256(bytes)),
                    "sha-512" => digests.push(OriginDigest::Sha512(bytes)),
                    _ => {}
                }
            }
        }
        digests
    }
}

/// Hashers for the origin's digests.
#[derive(Default)]
pub(super) struct DigestCheck {
    sha256: Option<(sha2::Sha256, Vec<u8>)>,
    sha512: Option<(sha2::Sha512, Vec<u8>)>,
}

impl DigestCheck {
    pub(super) fn new(digests: &[OriginDigest]) -> DigestCheck {
        let mut check = DigestCheck::default();
        for digest in digests {
            match digest {
                OriginDigest::Sha256(d) => check.sha256 = Some((sha2::Sha256::new(), d.clone())),
                OriginDigest::Sha512(d) => check.sha512 = Some((sha2::Sha512::new(), d.clone())),
            }
        }
        check
    }

    pub(super) fn update(&mut self, data: &[u8]) {
        if let Some((hasher, _)) = &mut self.sha256 {
            hasher.update(data);
        }
        if let Some((hasher, _)) = &mut self.sha512 {
            hasher.update(data);
        }
    }

    /// `Err` names the digest that did not match.
    pub(super) fn verify(self) -> Result<(), String> {
        if let Some((hasher, expected)) = self.sha256
            && hasher.finalize().as_slice() != expected.as_slice()
        {
            return Err("origin sha-256 digest mismatch".into());
        }
        if let Some((hasher, expected)) = self.sha512
            && hasher.finalize().as_slice() != expected.as_slice()
        {
            return Err("origin sha-512 digest mismatch".into());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn origin_digests_are_read_and_unknown_algorithms_skipped() {
        let mut headers = HeaderMap::new();
        let sha = sha2::Sha256::digest(b"hello");
        let b64 = base64::engine::general_purpose::STANDARD.encode(sha);
        headers.insert(
            "content-digest",
            format!("md5=:abc:, sha-256=:{b64}:").parse().unwrap(),
        );
        let digests = OriginDigest::parse_all(&headers, "content-digest");
        assert_eq!(digests, vec![OriginDigest::Sha256(sha.to_vec())]);
        let mut check = DigestCheck::new(&digests);
        check.update(b"hel");
        check.update(b"lo");
        assert!(check.verify().is_ok());
        let mut wrong = DigestCheck::new(&digests);
        wrong.update(b"hello!");
        assert!(wrong.verify().is_err());
    }

    #[test]
    fn a_botched_known_digest_fails_rather_than_being_skipped() {
        let mut headers = HeaderMap::new();
        headers.insert("repr-digest", "sha-256=not-base64".parse().unwrap());
        let digests = OriginDigest::parse_all(&headers, "repr-digest");
        let mut check = DigestCheck::new(&digests);
        check.update(b"anything");
        assert!(check.verify().is_err());
    }
}
