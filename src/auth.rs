//! Proxy authentication (seed 004: "store these in a database file"): the
//! users file, and the check every request passes before anything else
//! (RELIABILITY A-1 … A-5).
//!
//! The file has one `user:PHC-hash` line per user (argon2id, salted; `#`
//! comments and blank lines allowed), written by `rproxy passwd`. It is
//! read once at start-up; an unparsable line stops start-up with its line
//! number, and a file others can read gets a warning.
//!
//! A request is let through only with `Proxy-Authorization: Basic` naming a
//! user of the file with the right password. Checking a password costs an
//! argon2id hash (tens of milliseconds of CPU, on a blocking thread); a
//! credential that passed is remembered, as its blake3, for five minutes,
//! so a user's later requests cost a hash lookup. An unknown user costs the
//! same hash as a known one with a wrong password (one timing class).
//! Failures are counted per peer address in a table whose entries expire
//! after a minute (seed 003): past ten, the peer gets 429 with Retry-After,
//! without a password check, until the minute is over.

use std::collections::BTreeMap;
use std::fs;
use std::io::{self, Write};
use std::net::IpAddr;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use argon2::Argon2;
use argon2::password_hash::rand_core::OsRng;
use argon2::password_hash::{PasswordHash, PasswordHasher, PasswordVerifier, SaltString};
use base64::Engine as _;
use http::{HeaderMap, HeaderValue, header};
use http::{Response, StatusCode};
use hyper::Request;
use hyper::body::Incoming;
use tokio::time::Instant;
use tracing::Instrument;

use crate::expiring::ExpiringMap;
use crate::server::{Handler, Peer, ProxyBody, text_response};

/// How long a credential that passed is taken without a new hash.
const VERIFIED_FOR: Duration = Duration::from_secs(300);
/// The window failures are counted in, per peer.
const FAILURE_WINDOW: Duration = Duration::from_secs(60);
/// Failures per peer and window before it is turned away.
const MAX_FAILURES: u32 = 10;
/// Longest `Proxy-Authorization` value looked at.
const MAX_CREDENTIALS: usize = 4096;

/// Why the users file cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum AuthFileError {
    /// The file cannot be read or written.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// A line is not `user:hash`.
    #[error("{path}:{line}: {reason}")]
    Syntax {
        /// The file.
        path: PathBuf,
        /// 1-based line number.
        line: usize,
        /// What is wrong.
        reason: String,
    },
    /// A user name that cannot be stored.
    #[error("user name {0:?}: use 1-64 printable characters without ':' or spaces")]
    BadUser(String),
    /// Hashing failed (should not happen with valid parameters).
    #[error("cannot hash the password: {0}")]
    Hash(String),
}

/// The users file: user → argon2id PHC string, in name order.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct AuthFile {
    users: BTreeMap<String, String>,
}

fn valid_user(user: &str) -> bool {
    (1..=64).contains(&user.len()) && user.chars().all(|c| c.is_ascii_graphic() && c != ':')
}

impl AuthFile {
    /// Parses the text of a users file; `path` is for messages.
    ///
    /// # Errors
    /// [`AuthFileError::Syntax`] naming the first bad line.
    pub fn parse(text: &str, path: &Path) -> Result<AuthFile, AuthFileError> {
        let mut users = BTreeMap::new();
        for (number, line) in text.lines().enumerate() {
            let bad = |reason: &str| AuthFileError::Syntax {
                path: path.to_owned(),
                line: number + 1,
                reason: reason.to_owned(),
            };
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let (user, hash) = line
                .split_once(':')
                .ok_or_else(|| bad("expected user:hash"))?;
            if !valid_user(user) {
                return Err(bad("bad user name"));
            }
            let parsed = PasswordHash::new(hash).map_err(|e| bad(&format!("bad hash: {e}")))?;
            if parsed.algorithm.as_str() != "argon2id" {
                return Err(bad("not an argon2id hash (write it with rproxy passwd)"));
            }
            if users.insert(user.to_owned(), hash.to_owned()).is_some() {
                return Err(bad("user listed twice"));
            }
        }
        Ok(AuthFile { users })
    }

    /// Reads a users file. The second value is a warning to log when
    /// others than the owner may read it.
    ///
    /// # Errors
    /// An unreadable or unparsable file.
    pub fn load(path: &Path) -> Result<(AuthFile, Option<String>), AuthFileError> {
        let io = |source| AuthFileError::Io {
            path: path.to_owned(),
            source,
        };
        let text = fs::read_to_string(path).map_err(io)?;
        let mode = fs::metadata(path).map_err(io)?.permissions().mode();
        let warning = (mode & 0o077 != 0).then(|| {
            format!(
                "{}: readable by others (mode {:o}); chmod 600 it: the hashes are slow, not secret-proof",
                path.display(),
                mode & 0o777
            )
        });
        Ok((AuthFile::parse(&text, path)?, warning))
    }

    /// Writes the file crash-safely (temporary file, fsync, rename), mode
    /// 0600.
    ///
    /// # Errors
    /// When the directory cannot be written.
    pub fn save(&self, path: &Path) -> Result<(), AuthFileError> {
        let io = |source| AuthFileError::Io {
            path: path.to_owned(),
            source,
        };
        let mut tmp = path.as_os_str().to_owned();
        tmp.push(".tmp");
        let tmp = PathBuf::from(tmp);
        let mut file = fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&tmp)
            .map_err(io)?;
        file.write_all(self.to_text().as_bytes())
            .and_then(|()| file.sync_all())
            .map_err(io)?;
        fs::rename(&tmp, path).map_err(io)
    }

    /// The file's text.
    pub fn to_text(&self) -> String {
        let mut text = String::from("# rproxy users: user:argon2id hash (rproxy passwd)\n");
        for (user, hash) in &self.users {
            text.push_str(&format!("{user}:{hash}\n"));
        }
        text
    }

    /// Adds `user`, or changes their password.
    ///
    /// # Errors
    /// A user name that cannot be stored.
    pub fn set(&mut self, user: &str, password: &str) -> Result<(), AuthFileError> {
        if !valid_user(user) {
            return Err(AuthFileError::BadUser(user.to_owned()));
        }
        let salt = SaltString::generate(&mut OsRng);
        let hash = Argon2::default()
            .hash_password(password.as_bytes(), &salt)
            .map_err(|e| AuthFileError::Hash(e.to_string()))?
            .to_string();
        self.users.insert(user.to_owned(), hash);
        Ok(())
    }

    /// Removes `user`; whether they were there.
    pub fn remove(&mut self, user: &str) -> bool {
        self.users.remove(user).is_some()
    }

    /// The user names, in order.
    pub fn users(&self) -> impl Iterator<Item = &str> {
        self.users.keys().map(String::as_str)
    }
}

/// Why a request is turned away.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// 407: no, malformed or wrong credentials.
    Unauthorized,
    /// 429: too many failures from this peer; retry after the seconds.
    Throttled(u64),
}

/// Checks `Proxy-Authorization` against a users file.
pub struct Authenticator {
    users: Arc<BTreeMap<String, PasswordHash<'static>>>,
    /// A hash of an unknown user's "password", so that unknown users cost
    /// what known ones do.
    decoy: PasswordHash<'static>,
    realm: HeaderValue,
    verified: Mutex<ExpiringMap<[u8; 32], String>>,
    failures: Mutex<ExpiringMap<IpAddr, u32>>,
}

impl Authenticator {
    /// An authenticator for `file`'s users, answering with `realm`.
    ///
    /// # Errors
    /// A realm that cannot be a header value.
    pub fn new(file: &AuthFile, realm: &str) -> Result<Authenticator, String> {
        let valid_realm = realm
            .chars()
            .all(|c| c.is_ascii_graphic() && c != '"' && c != '\\' || c == ' ');
        if !valid_realm || realm.is_empty() || realm.len() > 64 {
            return Err(format!(
                "realm {realm:?}: use 1-64 printable characters without quotes"
            ));
        }
        let leak = |hash: &str| -> PasswordHash<'static> {
            // Parsed once at start-up; the strings live as long as the process.
            PasswordHash::new(Box::leak(hash.to_owned().into_boxed_str()))
                .expect("checked when the file was parsed")
        };
        let users = file
            .users
            .iter()
            .map(|(user, hash)| (user.clone(), leak(hash)))
            .collect();
        let mut decoy_file = AuthFile::default();
        decoy_file
            .set("decoy", "no user has this password")
            .map_err(|e| e.to_string())?;
        let decoy = leak(&decoy_file.users["decoy"]);
        Ok(Authenticator {
            users: Arc::new(users),
            decoy,
            realm: HeaderValue::from_str(&format!("Basic realm=\"{realm}\""))
                .map_err(|e| e.to_string())?,
            verified: Mutex::new(ExpiringMap::new(VERIFIED_FOR)),
            failures: Mutex::new(ExpiringMap::new(FAILURE_WINDOW)),
        })
    }

    /// The `Proxy-Authenticate` value of a 407.
    pub fn challenge(&self) -> &HeaderValue {
        &self.realm
    }

    /// The user a request authenticates as, or why it may not pass.
    pub async fn check(
        &self,
        headers: &HeaderMap,
        peer: Option<IpAddr>,
    ) -> Result<String, Refusal> {
        let now = Instant::now();
        if let Some(peer) = peer
            && let Some(&failures) = lock(&self.failures).get(&peer, now)
            && failures >= MAX_FAILURES
        {
            return Err(Refusal::Throttled(FAILURE_WINDOW.as_secs()));
        }
        let mut values = headers.get_all(header::PROXY_AUTHORIZATION).iter();
        let (Some(value), None) = (values.next(), values.next()) else {
            // None, or several: no password check, but no failure
            // either for a client that has not tried yet.
            return Err(Refusal::Unauthorized);
        };
        let fingerprint = *blake3::hash(value.as_bytes()).as_bytes();
        if let Some(user) = lock(&self.verified).get(&fingerprint, now) {
            return Ok(user.clone());
        }
        let verdict = match parse_basic(value) {
            Some((user, password)) => {
                let hash = self.users.get(&user).unwrap_or(&self.decoy).clone();
                let known = self.users.contains_key(&user);
                let ok = tokio::task::spawn_blocking(move || {
                    Argon2::default()
                        .verify_password(password.as_bytes(), &hash)
                        .is_ok()
                })
                .await
                .unwrap_or(false);
                (ok && known).then_some(user)
            }
            None => None,
        };
        match verdict {
            Some(user) => {
                lock(&self.verified).insert(fingerprint, user.clone(), now);
                Ok(user)
            }
            None => {
                if let Some(peer) = peer {
                    *lock(&self.failures).get_or_insert_with(peer, now, || 0) += 1;
                }
                Err(Refusal::Unauthorized)
            }
        }
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

/// `Basic base64(user:password)` → (user, password); `None` for anything
/// malformed.
pub fn parse_basic(value: &HeaderValue) -> Option<(String, String)> {
    if value.len() > MAX_CREDENTIALS {
        return None;
    }
    let text = value.to_str().ok()?.trim();
    let (scheme, encoded) = text.split_once(' ')?;
    if !scheme.eq_ignore_ascii_case("basic") {
        return None;
    }
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(encoded.trim())
        .ok()?;
    let decoded = String::from_utf8(decoded).ok()?;
    let (user, password) = decoded.split_once(':')?;
    Some((user.to_owned(), password.to_owned()))
}

/// A role behind proxy authentication (or none, without a users file):
/// every request passes the check before the role sees it, so a refused
/// one makes no upstream request and no cache lookup.
pub struct AuthGate<H> {
    role: Arc<H>,
    auth: Option<Authenticator>,
}

impl<H: Handler> AuthGate<H> {
    /// `role`, answering only authenticated requests when `auth` is given.
    pub fn new(role: H, auth: Option<Authenticator>) -> AuthGate<H> {
        AuthGate {
            role: Arc::new(role),
            auth,
        }
    }

    /// The role behind the gate.
    pub fn role(&self) -> &H {
        &self.role
    }

    async fn admit(self: Arc<Self>, request: Request<Incoming>) -> Response<ProxyBody> {
        let Some(auth) = &self.auth else {
            return self.role.clone().handle(request).await;
        };
        let peer = request.extensions().get::<Peer>().map(|peer| peer.0.ip());
        match auth.check(request.headers(), peer).await {
            Ok(user) => {
                let span = tracing::info_span!("user", %user);
                self.role.clone().handle(request).instrument(span).await
            }
            Err(refusal) => {
                let (status, message) = match refusal {
                    Refusal::Unauthorized => (
                        StatusCode::PROXY_AUTHENTICATION_REQUIRED,
                        "proxy authentication required: send Proxy-Authorization: Basic".to_owned(),
                    ),
                    Refusal::Throttled(seconds) => (
                        StatusCode::TOO_MANY_REQUESTS,
                        format!("too many failed logins from this address; retry in {seconds} s"),
                    ),
                };
                tracing::info!(
                    method = %request.method(),
                    url = %request.uri(),
                    status = status.as_u16(),
                    "refused: not authenticated"
                );
                let mut response = text_response(status, message);
                let headers = response.headers_mut();
                match refusal {
                    Refusal::Unauthorized => {
                        headers.insert(header::PROXY_AUTHENTICATE, auth.challenge().clone());
                    }
                    Refusal::Throttled(seconds) => {
                        headers.insert(header::RETRY_AFTER, HeaderValue::from(seconds));
                    }
                }
                response
            }
        }
    }
}

impl<H: Handler> Handler for AuthGate<H> {
    fn handle(
        self: Arc<Self>,
        request: Request<Incoming>,
    ) -> impl std::future::Future<Output = Response<ProxyBody>> + Send {
        self.admit(request)
    }

    fn connection_closed(&self, number: crate::server::ConnectionNumber) {
        self.role.connection_closed(number);
    }
}

/// `Proxy-Authorization: Basic …` for `user` and `password`.
pub fn basic_credentials(user: &str, password: &str) -> HeaderValue {
    let encoded = base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"));
    HeaderValue::from_str(&format!("Basic {encoded}")).expect("base64 is a valid header value")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file_with(users: &[(&str, &str)]) -> AuthFile {
        let mut file = AuthFile::default();
        for (user, password) in users {
            file.set(user, password).unwrap();
        }
        file
    }

    fn headers(value: &str) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert(
            header::PROXY_AUTHORIZATION,
            HeaderValue::from_str(value).unwrap(),
        );
        headers
    }

    #[test]
    fn the_file_round_trips_and_bad_lines_are_named() {
        let file = file_with(&[("alice", "wonderland"), ("bob", "builder")]);
        let text = file.to_text();
        assert!(!text.contains("wonderland"), "never the password itself");
        let path = Path::new("users");
        assert_eq!(AuthFile::parse(&text, path).unwrap(), file);
        let users: Vec<_> = file.users().collect();
        assert_eq!(users, ["alice", "bob"]);

        let bad = format!("{text}\nmallory\n");
        let error = AuthFile::parse(&bad, path).unwrap_err().to_string();
        assert!(error.starts_with("users:5:"), "{error}");
        let plain = "# comment\ncarol:secret\n";
        let error = AuthFile::parse(plain, path).unwrap_err().to_string();
        assert!(error.starts_with("users:2: bad hash"), "{error}");
        let twice = format!("{text}{}", text.lines().nth(1).unwrap());
        assert!(
            AuthFile::parse(&twice, path)
                .unwrap_err()
                .to_string()
                .contains("twice")
        );
    }

    #[test]
    fn user_names_that_would_break_the_file_are_refused() {
        let mut file = AuthFile::default();
        for user in ["", "a:b", "a b", "a\nb", &"x".repeat(65)] {
            assert!(file.set(user, "pw").is_err(), "{user:?}");
        }
        assert!(file.set("ok.user-1", "pw").is_ok());
    }

    #[tokio::test]
    async fn a_1_only_the_right_password_passes() {
        let auth = Authenticator::new(&file_with(&[("alice", "wonderland")]), "rproxy").unwrap();
        let peer = Some(IpAddr::from([127, 0, 0, 1]));
        let right = headers(basic_credentials("alice", "wonderland").to_str().unwrap());
        assert_eq!(auth.check(&right, peer).await, Ok("alice".to_owned()));
        // Remembered: the second time costs no hash, and still says who.
        assert_eq!(auth.check(&right, peer).await, Ok("alice".to_owned()));
        for wrong in [
            basic_credentials("alice", "wonderlan"),
            basic_credentials("alice", ""),
            basic_credentials("mallory", "wonderland"),
        ] {
            let refused = auth.check(&headers(wrong.to_str().unwrap()), peer).await;
            assert_eq!(refused, Err(Refusal::Unauthorized));
        }
        assert_eq!(
            auth.check(&HeaderMap::new(), peer).await,
            Err(Refusal::Unauthorized)
        );
        assert_eq!(auth.challenge().to_str().unwrap(), "Basic realm=\"rproxy\"");
    }

    #[tokio::test]
    async fn a_2_malformed_credentials_are_refused_without_panic() {
        let auth = Authenticator::new(&file_with(&[("alice", "wonderland")]), "rproxy").unwrap();
        let long = format!("Basic {}", "A".repeat(64 << 10));
        for value in [
            "Basic !!!not-base64!!!",
            "Basic YWxpY2U=", // "alice", no colon
            "Bearer abc",
            "Basic",
            long.as_str(),
            "Basic //79/g==", // not UTF-8
        ] {
            assert_eq!(
                auth.check(&headers(value), None).await,
                Err(Refusal::Unauthorized),
                "{value:.40}"
            );
        }
        let mut twice = headers(basic_credentials("alice", "wonderland").to_str().unwrap());
        twice.append(
            header::PROXY_AUTHORIZATION,
            basic_credentials("alice", "wonderland"),
        );
        assert_eq!(auth.check(&twice, None).await, Err(Refusal::Unauthorized));
    }

    #[tokio::test(start_paused = true)]
    async fn a_5_a_guessing_peer_is_throttled_for_a_minute_and_others_are_not() {
        let auth = Authenticator::new(&file_with(&[("alice", "wonderland")]), "rproxy").unwrap();
        let guesser = Some(IpAddr::from([192, 0, 2, 1]));
        let other = Some(IpAddr::from([192, 0, 2, 2]));
        let right = headers(basic_credentials("alice", "wonderland").to_str().unwrap());
        for n in 0..MAX_FAILURES {
            let guess = basic_credentials("alice", &format!("guess{n}"));
            let verdict = auth.check(&headers(guess.to_str().unwrap()), guesser).await;
            assert_eq!(verdict, Err(Refusal::Unauthorized));
        }
        // Now even the right password waits out the window.
        assert_eq!(
            auth.check(&right, guesser).await,
            Err(Refusal::Throttled(60))
        );
        assert_eq!(auth.check(&right, other).await, Ok("alice".to_owned()));
        tokio::time::advance(FAILURE_WINDOW + Duration::from_secs(1)).await;
        assert_eq!(auth.check(&right, guesser).await, Ok("alice".to_owned()));
    }
}
