//! The waiting page, sans-IO: which requests get it, which later request
//! may pick up the wait it stands for, and the page itself.
//!
//! A person who follows a link to a busy site would otherwise look at a
//! blank tab for up to `--queue-wait-max`. A navigation (a GET that a
//! browser makes to show a page) that has waited a few seconds gets a
//! `503` page instead, showing position, length and ETA, which reloads
//! itself (`Refresh`, header and meta) while the wait goes on in the
//! background; the reload picks the wait up by its [`WaitKey`].
//!
//! Everything variable on the page is HTML-escaped (`html-escape`'s
//! `encode_safe`, which covers text and quoted attributes).
//!
//! Main items: [`is_navigation`], [`WaitKey`], [`PageView`],
//! [`waiting_page`].

use std::time::Duration;

use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Method, Response, StatusCode};

use super::place::Dialect;
use crate::client_proxy::transfer::full;
use crate::http::server::ProxyBody;

/// How soon the page reloads itself.
pub const PAGE_REFRESH: Duration = Duration::from_secs(5);

/// `Sec-Fetch-Mode` (Fetch Metadata).
const SEC_FETCH_MODE: HeaderName = HeaderName::from_static("sec-fetch-mode");

/// Whether a request is a navigation a person waits on: a GET with
/// `Sec-Fetch-Mode: navigate`, or, from a user agent that sends no Fetch
/// Metadata, a GET that accepts `text/html`. A script's `fetch()` says
/// another mode, and gets the upstream's `503`, not a page, even when it
/// accepts HTML.
pub fn is_navigation(method: &Method, headers: &HeaderMap) -> bool {
    if method != Method::GET {
        return false;
    }
    if let Some(mode) = headers.get(SEC_FETCH_MODE) {
        return mode
            .as_bytes()
            .trim_ascii()
            .eq_ignore_ascii_case(b"navigate");
    }
    headers
        .get_all(header::ACCEPT)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(accepts_html)
}

/// Whether one `Accept` member is `text/html` with a non-zero weight.
fn accepts_html(member: &str) -> bool {
    let mut parts = member.split(';');
    let media = parts.next().unwrap_or("").trim();
    if !media.eq_ignore_ascii_case("text/html") {
        return false;
    }
    !parts.any(|p| {
        p.split_once('=').is_some_and(|(name, value)| {
            name.trim().eq_ignore_ascii_case("q") && value.trim().parse::<f32>() == Ok(0.0)
        })
    })
}

/// Request headers that must match for a reload to pick up a wait: what
/// makes the answer one user's (credentials, cookies) or one coding's.
/// The rest (`Cache-Control: max-age=0` on a reload, `Sec-Fetch-*`,
/// validators) may differ between the first request and its reload.
const KEYED_HEADERS: [HeaderName; 4] = [
    header::AUTHORIZATION,
    header::COOKIE,
    header::ACCEPT_ENCODING,
    header::ACCEPT_LANGUAGE,
];

/// Names a background wait: the request's cache key and the headers that
/// make its answer one user's. A reload with another cookie or credentials
/// never gets this wait's answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct WaitKey(blake3::Hash);

impl WaitKey {
    /// The key of a request whose cache key digest is `cache_key`.
    pub fn new(cache_key: &blake3::Hash, headers: &HeaderMap) -> WaitKey {
        let mut hasher = blake3::Hasher::new();
        hasher.update(cache_key.as_bytes());
        for name in &KEYED_HEADERS {
            // Length-prefixed, so values cannot run into each other.
            for value in headers.get_all(name) {
                hasher.update(&(value.len() as u64).to_le_bytes());
                hasher.update(value.as_bytes());
            }
            hasher.update(&u64::MAX.to_le_bytes());
        }
        WaitKey(hasher.finalize())
    }
}

/// What the page shows.
#[derive(Debug, Clone)]
pub struct PageView<'a> {
    /// The URL waited for.
    pub url: &'a str,
    /// The upstream's dialect.
    pub dialect: Dialect,
    /// Position, 1 is next.
    pub position: u32,
    /// Queue length, when known.
    pub length: Option<u32>,
    /// Estimated wait, when known.
    pub eta: Option<Duration>,
    /// Time until the upstream is asked again.
    pub next_check: Duration,
    /// Time waited so far.
    pub waited: Duration,
}

/// A duration as a person reads it: `40 s`, `3 min`, `2 h 5 min`.
pub fn approximately(duration: Duration) -> String {
    let secs = duration.as_secs();
    match secs {
        0..60 => format!("{secs} s"),
        60..3600 => format!("{} min", secs.div_ceil(60)),
        _ => format!("{} h {} min", secs / 3600, secs % 3600 / 60),
    }
}

/// The `503` page for a navigation waiting in the upstream's queue:
/// `Refresh` (header and meta) and `Retry-After` `refresh` ahead,
/// `Cache-Control: no-store`.
pub fn waiting_page(view: &PageView<'_>, refresh: Duration) -> Response<ProxyBody> {
    let escape = |text: &str| html_escape::encode_safe(text).into_owned();
    let refresh_secs = refresh.as_secs().max(1);
    let place = match view.length {
        Some(length) => format!("{} of {}", view.position, length),
        None => view.position.to_string(),
    };
    let eta = view.eta.map_or_else(
        || "not known yet".to_owned(),
        |eta| format!("about {}", approximately(eta)),
    );
    let dialect = match view.dialect {
        Dialect::Parq => "PARQ",
        Dialect::Legacy => "Active Queueing",
    };
    let body = format!(
        r#"<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta http-equiv="refresh" content="{refresh_secs}">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>Waiting in line: {place}</title>
<style>body{{font-family:sans-serif;max-width:40em;margin:3em auto;padding:0 1em;line-height:1.5}}th{{text-align:left;padding-right:1em}}code{{word-break:break-all}}</style>
</head>
<body>
<h1>Waiting in line</h1>
<p>The server is busy sending to others. Your request for <code>{url}</code> keeps its place in line, and this page reloads itself every {refresh_secs} seconds until it is your turn.</p>
<table>
<tr><th>Position</th><td>{place}</td></tr>
<tr><th>Estimated wait</th><td>{eta}</td></tr>
<tr><th>Next check with the server</th><td>in {next_check}</td></tr>
<tr><th>Waited so far</th><td>{waited}</td></tr>
</table>
<p><small>Queued by the server's {dialect} upload queue.</small></p>
</body>
</html>
"#,
        url = escape(view.url),
        place = escape(&place),
        eta = escape(&eta),
        next_check = escape(&approximately(view.next_check)),
        waited = escape(&approximately(view.waited)),
        dialect = escape(dialect),
    );
    let mut response = Response::new(full(body));
    *response.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/html; charset=utf-8"),
    );
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    headers.insert(header::RETRY_AFTER, HeaderValue::from(refresh_secs));
    headers.insert(
        HeaderName::from_static("refresh"),
        HeaderValue::from(refresh_secs),
    );
    response
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;

    fn headers(list: &[(&str, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in list {
            map.append(
                HeaderName::from_bytes(name.as_bytes()).unwrap(),
                HeaderValue::from_str(value).unwrap(),
            );
        }
        map
    }

    #[test]
    fn navigations_are_told_apart_from_other_requests() {
        let get = Method::GET;
        let browser = headers(&[(
            "accept",
            "text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8",
        )]);
        assert!(is_navigation(&get, &browser));
        assert!(!is_navigation(&Method::HEAD, &browser));
        assert!(is_navigation(
            &get,
            &headers(&[("sec-fetch-mode", "navigate")])
        ));
        assert!(
            !is_navigation(
                &get,
                &headers(&[("sec-fetch-mode", "cors"), ("accept", "text/html")])
            ),
            "a script's fetch of HTML is not a navigation"
        );
        assert!(!is_navigation(&get, &headers(&[("accept", "*/*")])), "curl");
        assert!(!is_navigation(
            &get,
            &headers(&[("accept", "text/html;q=0")])
        ));
        assert!(is_navigation(
            &get,
            &headers(&[("accept", "TEXT/HTML ; q=0.5")])
        ));
        assert!(!is_navigation(&get, &HeaderMap::new()));
    }

    #[test]
    fn a_wait_key_separates_users_but_not_reloads() {
        let digest = blake3::hash(b"http://site.test/page");
        let first = headers(&[
            ("cookie", "session=alice"),
            ("accept", "text/html"),
            ("sec-fetch-mode", "navigate"),
        ]);
        let reload = headers(&[
            ("cookie", "session=alice"),
            ("accept", "text/html"),
            ("cache-control", "max-age=0"),
        ]);
        let other_user = headers(&[("cookie", "session=bob"), ("accept", "text/html")]);
        let key = WaitKey::new(&digest, &first);
        assert_eq!(key, WaitKey::new(&digest, &reload));
        assert_ne!(key, WaitKey::new(&digest, &other_user));
        assert_ne!(key, WaitKey::new(&blake3::hash(b"other"), &first));
        // Values cannot be shifted from one header into the next.
        let a = headers(&[("authorization", "ab"), ("cookie", "c")]);
        let b = headers(&[("authorization", "a"), ("cookie", "bc")]);
        assert_ne!(WaitKey::new(&digest, &a), WaitKey::new(&digest, &b));
    }

    #[test]
    fn durations_read_as_a_person_would() {
        assert_eq!(approximately(Duration::from_secs(40)), "40 s");
        assert_eq!(approximately(Duration::from_secs(61)), "2 min");
        assert_eq!(approximately(Duration::from_secs(7500)), "2 h 5 min");
    }

    #[tokio::test]
    async fn the_page_shows_the_place_refreshes_and_escapes_everything() {
        let view = PageView {
            url: "http://site.test/<script>alert(1)</script>?a=1&b=\"2\"",
            dialect: Dialect::Parq,
            position: 3,
            length: Some(12),
            eta: Some(Duration::from_secs(95)),
            next_check: Duration::from_secs(26),
            waited: Duration::from_secs(4),
        };
        let page = waiting_page(&view, PAGE_REFRESH);
        assert_eq!(page.status(), StatusCode::SERVICE_UNAVAILABLE);
        let h = page.headers();
        assert_eq!(h[header::CONTENT_TYPE], "text/html; charset=utf-8");
        assert_eq!(h[header::CACHE_CONTROL], "no-store");
        assert_eq!(h[header::RETRY_AFTER], "5");
        assert_eq!(h["refresh"], "5");
        let body = page.into_body().collect().await.unwrap().to_bytes();
        let body = String::from_utf8(body.to_vec()).unwrap();
        assert!(body.contains(r#"<meta http-equiv="refresh" content="5">"#));
        assert!(body.contains("<td>3 of 12</td>"), "{body}");
        assert!(body.contains("about 2 min"), "{body}");
        assert!(body.contains("<td>4 s</td>"), "{body}");
        assert!(body.contains("<td>in 26 s</td>"), "{body}");
        assert!(!body.contains("<script>"), "{body}");
        assert!(!body.contains("\"2\""), "{body}");
        assert!(
            body.contains("&lt;script&gt;alert(1)&lt;&#x2F;script&gt;?a=1&amp;b=&quot;2&quot;"),
            "{body}"
        );

        let unknown = PageView {
            length: None,
            eta: None,
            dialect: Dialect::Legacy,
            ..view
        };
        let body = waiting_page(&unknown, PAGE_REFRESH)
            .into_body()
            .collect()
            .await
            .unwrap()
            .to_bytes();
        let body = String::from_utf8(body.to_vec()).unwrap();
        assert!(body.contains("<td>3</td>"), "{body}");
        assert!(body.contains("not known yet"), "{body}");
    }
}
