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
//! argon2id hash (tens of milliseconds of CPU and 19 MiB, on a thread
//! kept for hashing); a credential that passed is remembered for five minutes, so a
//! user's later requests cost a hash lookup. An unknown user costs the
//! same hash as a known one with a wrong password (one timing class).
//! Failures are counted per peer address in a table whose entries expire
//! (seed 003), over a sliding minute: a peer with ten failures in the last
//! 60 seconds gets 429 without a password check until the oldest of them
//! is 60 seconds old, and Retry-After says how many seconds that is.
//!
//! What the checks may cost, and in which order a request meets the limits
//! (remembered credentials first, then the failure count, then a turn for
//! the hash), is the `budget` submodule's concern.

use std::collections::BTreeMap;
use std::fs;
use std::io::{self, Write};
use std::net::IpAddr;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use std::cell::RefCell;

use argon2::password_hash::rand_core::OsRng;
use argon2::password_hash::{Output, PasswordHash, PasswordHasher, SaltString};
use argon2::{Algorithm, Argon2, Block, Params, Version};
use base64::Engine as _;
use http::Response;
use http::{HeaderMap, HeaderValue, header};
use hyper::Request;
use tokio::time::Instant;
use tracing::Instrument;

use crate::http::error::ProxyError;
use crate::http::server::{Handler, Peer, ProxyBody, RequestBody};

mod budget;

#[cfg(test)]
use budget::FAILURE_WINDOW;
use budget::{BUSY_RETRY, Budget, NoCheck};
pub use budget::{CheckLimits, CheckStats, FAILURE_ENTRY_BYTES, FAILURE_TIME_BYTES};

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
    /// 429: too many failures from this peer; retry after the seconds,
    /// until the oldest of its failures in the window leaves it, rounded
    /// up.
    Throttled(u64),
    /// 429: all password checks are taken and none came free in time;
    /// retry after the seconds.
    Busy(u64),
}

/// Checks `Proxy-Authorization` against a users file.
pub struct Authenticator {
    users: Arc<BTreeMap<String, PasswordHash<'static>>>,
    /// A hash of an unknown user's "password", so that unknown users cost
    /// what known ones do.
    decoy: PasswordHash<'static>,
    realm: HeaderValue,
    budget: Budget,
    /// The largest argon2 memory cost among the hashes, in bytes.
    max_hash_memory: u64,
}

impl Authenticator {
    /// An authenticator for `file`'s users, answering with `realm`, with
    /// the default [`CheckLimits`].
    ///
    /// # Errors
    /// A realm that cannot be a header value.
    pub fn new(file: &AuthFile, realm: &str) -> Result<Authenticator, String> {
        Authenticator::with_limits(file, realm, CheckLimits::DEFAULT)
    }

    /// An authenticator for `file`'s users, answering with `realm`, whose
    /// password checks keep within `limits`.
    ///
    /// # Errors
    /// A realm that cannot be a header value.
    pub fn with_limits(
        file: &AuthFile,
        realm: &str,
        limits: CheckLimits,
    ) -> Result<Authenticator, String> {
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
        let users: BTreeMap<_, _> = file
            .users
            .iter()
            .map(|(user, hash)| (user.clone(), leak(hash)))
            .collect();
        let mut decoy_file = AuthFile::default();
        decoy_file
            .set("decoy", "no user has this password")
            .map_err(|e| e.to_string())?;
        let decoy = leak(&decoy_file.users["decoy"]);
        let max_hash_memory = users
            .values()
            .chain([&decoy])
            .filter_map(|hash| argon2::Params::try_from(hash).ok())
            .map(|params| u64::from(params.m_cost()) << 10)
            .max()
            .unwrap_or(0);
        Ok(Authenticator {
            users: Arc::new(users),
            decoy,
            realm: HeaderValue::from_str(&format!("Basic realm=\"{realm}\""))
                .map_err(|e| e.to_string())?,
            budget: Budget::new(limits)
                .map_err(|e| format!("cannot start the password-check threads: {e}"))?,
            max_hash_memory,
        })
    }

    /// The limits its password checks keep within.
    pub fn limits(&self) -> CheckLimits {
        self.budget.limits()
    }

    /// The most memory its password checks can hold at once, in bytes:
    /// the checks allowed at once × the largest argon2 memory cost in the
    /// users file.
    pub fn max_check_memory(&self) -> u64 {
        self.max_hash_memory * self.budget.limits().max_checks.get() as u64
    }

    /// What its password checks have cost so far.
    pub fn stats(&self) -> CheckStats {
        self.budget.stats()
    }

    /// The `Proxy-Authenticate` value of a 407.
    pub fn challenge(&self) -> &HeaderValue {
        &self.realm
    }

    /// The user a request authenticates as, or why it may not pass.
    ///
    /// The order is what bounds the cost: credentials that passed
    /// recently are let through first, whoever else fails from the same
    /// address; then a failure is reserved for the address, so its
    /// eleventh guess in a minute is refused before any hash; only then
    /// does the check wait for a turn to hash.
    pub async fn check(
        &self,
        headers: &HeaderMap,
        peer: Option<IpAddr>,
    ) -> Result<String, Refusal> {
        let mut values = headers.get_all(header::PROXY_AUTHORIZATION).iter();
        let (Some(value), None) = (values.next(), values.next()) else {
            // None, or several: no password check, but no failure
            // either for a client that has not tried yet.
            return Err(Refusal::Unauthorized);
        };
        if let Some(user) = self.budget.recall(value, Instant::now()) {
            return Ok(user);
        }
        let reserved_at = Instant::now();
        self.budget
            .reserve_failure(peer, reserved_at)
            .map_err(refusal)?;
        // Malformed credentials keep their reserved failure: they are a
        // guess too, if a cheap one.
        let (user, password) = parse_basic(value).ok_or(Refusal::Unauthorized)?;
        let known = self.users.contains_key(&user);
        let hash = self.users.get(&user).unwrap_or(&self.decoy).clone();
        let verdict = self
            .budget
            .run(move || verify_in_kept_memory(&password, &hash))
            .await;
        match verdict {
            Ok(true) if known => {
                self.budget.give_back(peer, reserved_at);
                self.budget.remember(value, user.clone(), Instant::now());
                Ok(user)
            }
            Ok(_) => Err(Refusal::Unauthorized),
            Err(no_check) => {
                // No hash ran: this was not a guess.
                self.budget.give_back(peer, reserved_at);
                Err(refusal(no_check))
            }
        }
    }
}

/// Whether `password` matches `hash`, as argon2's own verifier decides
/// (the same hash, compared in constant time), but hashed in memory the
/// thread keeps from one check to the next.
///
/// Checks run only on the few threads kept for them, so this memory is
/// at most the checks allowed at once × the largest memory cost, held for
/// good; allocating it afresh for every check let the allocator keep a
/// growing heap of freed 19 MiB blocks (+370 MiB resident after a burst
/// of 300 guesses, two at a time).
fn verify_in_kept_memory(password: &str, hash: &PasswordHash<'_>) -> bool {
    thread_local! {
        static MEMORY: RefCell<Vec<Block>> = const { RefCell::new(Vec::new()) };
    }
    let (Some(expected), Some(salt)) = (&hash.hash, &hash.salt) else {
        return false;
    };
    let (Ok(algorithm), Ok(params)) = (Algorithm::try_from(hash.algorithm), Params::try_from(hash))
    else {
        return false;
    };
    let Ok(version) = hash
        .version
        .map_or(Ok(Version::default()), Version::try_from)
    else {
        return false;
    };
    let mut salt_bytes = [0; 64];
    let Ok(salt) = salt.decode_b64(&mut salt_bytes) else {
        return false;
    };
    let blocks = params.block_count();
    let argon2 = Argon2::new(algorithm, version, params);
    let mut out = [0; Output::MAX_LENGTH];
    let out = &mut out[..expected.len()];
    let hashed = MEMORY.with_borrow_mut(|memory| {
        if memory.len() < blocks {
            memory.resize(blocks, Block::default());
        }
        argon2.hash_password_into_with_memory(password.as_bytes(), salt, out, &mut memory[..blocks])
    });
    // Output's == is constant-time.
    hashed.is_ok() && Output::new(out).is_ok_and(|out| out == *expected)
}

fn refusal(no_check: NoCheck) -> Refusal {
    match no_check {
        NoCheck::Throttled { retry_after } => Refusal::Throttled(whole_seconds(retry_after)),
        NoCheck::Busy => Refusal::Busy(whole_seconds(BUSY_RETRY)),
    }
}

/// `wait` in whole seconds for Retry-After: rounded up, so a client that
/// obeys it does not come back a moment too early, and at least 1, since
/// 0 would invite an immediate retry.
fn whole_seconds(wait: Duration) -> u64 {
    let seconds = wait.as_secs() + u64::from(wait.subsec_nanos() > 0);
    seconds.max(1)
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
    /// Shared with the admin listener, which asks the same users (and
    /// counts their failures in the same budget).
    auth: Option<Arc<Authenticator>>,
}

impl<H: Handler> AuthGate<H> {
    /// `role`, answering only authenticated requests when `auth` is given.
    pub fn new(role: H, auth: Option<Authenticator>) -> AuthGate<H> {
        AuthGate {
            role: Arc::new(role),
            auth: auth.map(Arc::new),
        }
    }

    /// The role behind the gate.
    pub fn role(&self) -> &H {
        &self.role
    }

    /// The role behind the gate, to share with other listeners (the
    /// admin listener reads its counters).
    pub fn shared_role(&self) -> Arc<H> {
        self.role.clone()
    }

    /// The authenticator in front of the role, if any.
    pub fn authenticator(&self) -> Option<&Authenticator> {
        self.auth.as_deref()
    }

    /// The authenticator, to share with other listeners.
    pub fn shared_authenticator(&self) -> Option<Arc<Authenticator>> {
        self.auth.clone()
    }

    async fn admit(self: Arc<Self>, request: Request<RequestBody>) -> Response<ProxyBody> {
        let Some(auth) = &self.auth else {
            return self.role.clone().handle(request).await;
        };
        let peer = request.extensions().get::<Peer>().map(|peer| peer.0.ip());
        match auth.check(request.headers(), peer).await {
            Ok(user) => {
                if let Some(note) = request.extensions().get::<crate::http::access_log::Note>() {
                    note.user(&user);
                }
                let span = tracing::info_span!("user", %user);
                self.role.clone().handle(request).instrument(span).await
            }
            Err(refusal) => {
                let refusal = match refusal {
                    Refusal::Unauthorized => ProxyError::unauthenticated(auth.challenge().clone()),
                    Refusal::Throttled(seconds) => ProxyError::logins_throttled(seconds),
                    Refusal::Busy(seconds) => ProxyError::auth_busy(seconds),
                };
                let _request = tracing::info_span!(
                    "request",
                    method = %request.method(),
                    url = %request.uri()
                )
                .entered();
                refusal.log_and_respond()
            }
        }
    }
}

impl<H: Handler> Handler for AuthGate<H> {
    fn handle(
        self: Arc<Self>,
        request: Request<RequestBody>,
    ) -> impl std::future::Future<Output = Response<ProxyBody>> + Send {
        self.admit(request)
    }

    fn connection_closed(&self, number: crate::http::server::ConnectionNumber) {
        self.role.connection_closed(number);
    }

    fn stopped(&self) {
        self.role.stopped();
    }

    fn reopen_logs(&self) {
        self.role.reopen_logs();
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
        for n in 0..CheckLimits::DEFAULT.max_failures {
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

    #[tokio::test(start_paused = true)]
    async fn a_10_retry_after_is_what_is_left_of_the_window_rounded_up() {
        let auth = Authenticator::new(&file_with(&[("alice", "wonderland")]), "rproxy").unwrap();
        let guesser = Some(IpAddr::from([192, 0, 2, 1]));
        let right = headers(basic_credentials("alice", "wonderland").to_str().unwrap());
        for _ in 0..CheckLimits::DEFAULT.max_failures {
            // Malformed: a failure without a hash, so the clock stays put.
            let verdict = auth.check(&headers("Basic !!!"), guesser).await;
            assert_eq!(verdict, Err(Refusal::Unauthorized));
        }
        assert_eq!(
            auth.check(&right, guesser).await,
            Err(Refusal::Throttled(60))
        );
        tokio::time::advance(Duration::from_millis(44_250)).await;
        assert_eq!(
            auth.check(&right, guesser).await,
            Err(Refusal::Throttled(16))
        );
        tokio::time::advance(Duration::from_millis(15_749)).await;
        assert_eq!(
            auth.check(&right, guesser).await,
            Err(Refusal::Throttled(1))
        );
        tokio::time::advance(Duration::from_millis(1)).await;
        assert_eq!(auth.check(&right, guesser).await, Ok("alice".to_owned()));
    }

    #[tokio::test(start_paused = true)]
    async fn a_10_no_more_than_n_guesses_in_any_minute_across_the_window_edge() {
        let auth = Authenticator::new(&file_with(&[("alice", "wonderland")]), "rproxy").unwrap();
        let guesser = Some(IpAddr::from([192, 0, 2, 1]));
        let max = CheckLimits::DEFAULT.max_failures as usize;
        // Malformed guesses: failures without a hash, so only `advance`
        // moves the clock.
        let guess = headers("Basic !!!");
        let start = Instant::now();
        // One guess, then the other nine just before the minute is over.
        assert_eq!(
            auth.check(&guess, guesser).await,
            Err(Refusal::Unauthorized)
        );
        tokio::time::advance(Duration::from_secs(59)).await;
        for _ in 1..max {
            assert_eq!(
                auth.check(&guess, guesser).await,
                Err(Refusal::Unauthorized)
            );
        }
        // A second later the first guess has left the minute, the nine
        // have not: one more guess, then 429 until the nine leave it too,
        // 59 s from now (a window fixed at the first guess would take ten).
        tokio::time::advance(Duration::from_secs(1)).await;
        let mut checked = Vec::new();
        for _ in 0..max {
            if auth.check(&guess, guesser).await == Err(Refusal::Unauthorized) {
                checked.push(Instant::now());
            }
        }
        assert_eq!(checked.len(), 1, "guesses right after the edge");
        assert_eq!(
            auth.check(&guess, guesser).await,
            Err(Refusal::Throttled(59))
        );
        // A guesser that tries every quarter second for five minutes, as
        // soon as it may: in no 60-s span does it get more than ten.
        let mut times = vec![start];
        times.extend(std::iter::repeat_n(
            start + Duration::from_secs(59),
            max - 1,
        ));
        times.extend(checked);
        for _ in 0..4 * 300 {
            tokio::time::advance(Duration::from_millis(250)).await;
            while auth.check(&guess, guesser).await == Err(Refusal::Unauthorized) {
                times.push(Instant::now());
            }
        }
        for (i, &t) in times.iter().enumerate() {
            let in_span = times[i..]
                .iter()
                .take_while(|&&later| later < t + FAILURE_WINDOW)
                .count();
            assert!(
                in_span <= max,
                "{in_span} guesses in the minute from {:?}",
                t - start
            );
        }
        // It did get its ten a minute, not fewer.
        assert!(
            times.len() >= 5 * max,
            "{} guesses in six minutes",
            times.len()
        );
    }

    #[test]
    fn a_10_retry_after_rounds_up_to_whole_seconds_and_is_never_zero() {
        let ms = Duration::from_millis;
        assert_eq!(whole_seconds(Duration::ZERO), 1);
        assert_eq!(whole_seconds(Duration::from_nanos(1)), 1);
        assert_eq!(whole_seconds(ms(1000)), 1);
        assert_eq!(whole_seconds(ms(1001)), 2);
        assert_eq!(whole_seconds(ms(59_999)), 60);
        assert_eq!(whole_seconds(FAILURE_WINDOW), 60);
    }

    /// Throttled for what is left of the minute since the first failure:
    /// these tests hash for real, which on a loaded machine takes seconds,
    /// so the time left is not always the whole minute.
    fn throttled_about_a_minute(verdict: &Result<String, Refusal>) -> bool {
        matches!(verdict, Err(Refusal::Throttled(seconds)) if (45..=60).contains(seconds))
    }

    #[tokio::test]
    async fn a_10_the_eleventh_guess_in_a_minute_is_refused_before_any_hash() {
        let auth = Authenticator::new(&file_with(&[("alice", "wonderland")]), "rproxy").unwrap();
        let guesser = Some(IpAddr::from([192, 0, 2, 1]));
        // Malformed credentials are guesses too, and cost no hash.
        let verdict = auth.check(&headers("Basic !!!"), guesser).await;
        assert_eq!(verdict, Err(Refusal::Unauthorized));
        for n in 1..10 {
            let guess = basic_credentials("alice", &format!("guess{n}"));
            let verdict = auth.check(&headers(guess.to_str().unwrap()), guesser).await;
            assert_eq!(verdict, Err(Refusal::Unauthorized));
        }
        assert_eq!(auth.stats().hashes, 9);
        for n in 10..20 {
            let guess = basic_credentials("mallory", &format!("guess{n}"));
            let verdict = auth.check(&headers(guess.to_str().unwrap()), guesser).await;
            assert!(throttled_about_a_minute(&verdict), "{verdict:?}");
        }
        let stats = auth.stats();
        assert_eq!(stats.hashes, 9, "no hash past the tenth failure");
        assert_eq!(stats.throttled, 10);
    }

    #[tokio::test]
    async fn a_10_a_credential_that_passed_is_not_locked_out_by_others_guesses() {
        let users = file_with(&[("alice", "wonderland"), ("bob", "builder")]);
        let auth = Authenticator::new(&users, "rproxy").unwrap();
        let shared = Some(IpAddr::from([192, 0, 2, 1]));
        let alice = headers(basic_credentials("alice", "wonderland").to_str().unwrap());
        assert_eq!(auth.check(&alice, shared).await, Ok("alice".to_owned()));
        for n in 0..10 {
            let guess = basic_credentials("alice", &format!("guess{n}"));
            let verdict = auth.check(&headers(guess.to_str().unwrap()), shared).await;
            assert_eq!(verdict, Err(Refusal::Unauthorized));
        }
        let hashes = auth.stats().hashes;
        assert_eq!(auth.check(&alice, shared).await, Ok("alice".to_owned()));
        assert_eq!(auth.stats().hashes, hashes, "remembered: no hash");
        // Bob's right password never passed before: it waits out the
        // minute like any guess from there.
        let bob = headers(basic_credentials("bob", "builder").to_str().unwrap());
        let verdict = auth.check(&bob, shared).await;
        assert!(throttled_about_a_minute(&verdict), "{verdict:?}");
        assert_eq!(auth.stats().hashes, hashes);
    }

    #[tokio::test]
    async fn a_10_a_remembered_credential_never_lets_a_wrong_password_through() {
        let users = file_with(&[("alice", "wonderland"), ("bob", "builder")]);
        let auth = Authenticator::new(&users, "rproxy").unwrap();
        let alice = headers(basic_credentials("alice", "wonderland").to_str().unwrap());
        assert_eq!(auth.check(&alice, None).await, Ok("alice".to_owned()));
        let wrong = [
            basic_credentials("alice", "wonderlan"),
            basic_credentials("alice", "wonderland "),
            basic_credentials("alice", "Wonderland"),
            basic_credentials("alice", ""),
            basic_credentials("bob", "wonderland"),
            basic_credentials("alicе", "wonderland"), // Cyrillic e
        ];
        for (n, wrong) in wrong.iter().enumerate() {
            let before = auth.stats().hashes;
            let peer = Some(IpAddr::from([192, 0, 2, n as u8]));
            let verdict = auth.check(&headers(wrong.to_str().unwrap()), peer).await;
            assert_eq!(verdict, Err(Refusal::Unauthorized), "{wrong:?}");
            assert_eq!(auth.stats().hashes, before + 1, "checked, not recalled");
        }
        // Still remembered, and still only for alice.
        assert_eq!(auth.check(&alice, None).await, Ok("alice".to_owned()));
    }

    #[tokio::test]
    async fn a_10_a_spray_from_many_addresses_locks_out_no_user() {
        let users = file_with(&[("alice", "wonderland"), ("bob", "builder")]);
        let limits = CheckLimits {
            max_failure_addresses: std::num::NonZeroUsize::new(8).unwrap(),
            ..CheckLimits::DEFAULT
        };
        let auth = Authenticator::with_limits(&users, "rproxy", limits).unwrap();
        let home = Some(IpAddr::from([192, 0, 2, 1]));
        let alice = headers(basic_credentials("alice", "wonderland").to_str().unwrap());
        assert_eq!(auth.check(&alice, home).await, Ok("alice".to_owned()));
        // Malformed guesses from a /64, ten per address: each address is
        // locked, and the table is full many times over.
        let guess = headers("Basic !!!");
        for n in 0..200u16 {
            let sprayed = Some(IpAddr::from([0x2001, 0xdb8, 0, 0, 0, 0, 1, n]));
            for _ in 0..10 {
                assert_eq!(
                    auth.check(&guess, sprayed).await,
                    Err(Refusal::Unauthorized)
                );
            }
            let verdict = auth.check(&guess, sprayed).await;
            assert!(matches!(verdict, Err(Refusal::Throttled(_))), "{n}");
        }
        assert!(auth.stats().forgotten_addresses >= 200 - 8);
        // Alice, verified, passes; bob, never seen, gets his check from a
        // new address and passes too.
        assert_eq!(auth.check(&alice, home).await, Ok("alice".to_owned()));
        let bob = headers(basic_credentials("bob", "builder").to_str().unwrap());
        let elsewhere = Some(IpAddr::from([198, 51, 100, 7]));
        assert_eq!(auth.check(&bob, elsewhere).await, Ok("bob".to_owned()));
    }

    #[tokio::test]
    async fn a_10_the_memory_bound_follows_the_limits_and_the_hashes() {
        let users = file_with(&[("alice", "wonderland")]);
        let limits = CheckLimits {
            max_checks: std::num::NonZeroUsize::new(3).unwrap(),
            ..CheckLimits::DEFAULT
        };
        let auth = Authenticator::with_limits(&users, "rproxy", limits).unwrap();
        assert_eq!(auth.limits(), limits);
        // rproxy passwd writes argon2's defaults: 19 MiB each.
        assert_eq!(auth.max_check_memory(), 3 * 19 * 1024 * 1024);
    }

    #[test]
    fn a_4_verifying_in_kept_memory_agrees_with_argon2() {
        use argon2::password_hash::PasswordVerifier;
        let file = file_with(&[("alice", "wonderland"), ("bob", "builder")]);
        // Twice over, so the second round hashes in memory the first left
        // full of other passwords' state.
        for _ in 0..2 {
            for (user, stored) in &file.users {
                let hash = PasswordHash::new(stored).unwrap();
                for password in ["wonderland", "builder", "", "wonderlan"] {
                    let theirs = Argon2::default()
                        .verify_password(password.as_bytes(), &hash)
                        .is_ok();
                    assert_eq!(
                        verify_in_kept_memory(password, &hash),
                        theirs,
                        "{user} {password:?}"
                    );
                }
            }
        }
        let no_hash = PasswordHash::new("$argon2id$v=19$m=19456,t=2,p=1$c2FsdHNhbHQ").unwrap();
        assert!(!verify_in_kept_memory("", &no_hash));
    }
}
