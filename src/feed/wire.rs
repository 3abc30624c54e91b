//! The feed on the wire, sans-IO: what a pull asks (`GET FEED_PATH?…`),
//! what a submission lists (`POST FEED_PATH`), and the push line a
//! subscriber's callback listener gets.
//!
//! ```text
//! GET /.well-known/hsync-feed?since=41&incarnation=9f…&prefix=/static/&notify=5a… HTTP/1.1
//! Host: www.example.com
//! X-Node: 192.0.2.7:9083              (optional: where to push)
//!
//! 200, application/json: {"incarnation":"9f…","csn":44,"reset":false,
//!   "updates":[{"csn":43,"path":"/static/app.js","digest":"…","length":81234,"at":1795…}]}
//!
//! POST /.well-known/hsync-feed         (SubmitUpdate: the paths that changed)
//! /static/app.js
//! http://www.example.com/static/app.css
//!
//! FEED 5a… 44\r\n                      (pushed: the zone's token and CSN)
//! ```
//!
//! Main items: [`FEED_PATH`], [`Pull`], [`parse_submission`],
//! [`feed_line`], [`parse_feed_line`], [`callback_node`].

use std::net::SocketAddr;

use http::Uri;

use crate::queue::X_NODE;
use crate::queue::headers::parse_x_node;

/// Where a site's feed is, on the site's own host.
pub const FEED_PATH: &str = "/.well-known/hsync-feed";

/// Most paths one submission may list.
pub const MAX_SUBMITTED: usize = 256;

/// Longest submission body read.
pub const MAX_SUBMISSION_BYTES: usize = 64 * 1024;

/// Longest notify token.
const MAX_TOKEN_LEN: usize = 64;

/// A pull: "updates since `since` of `incarnation`, under `prefix`".
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pull {
    /// The last CSN the peer holds (0: none).
    pub since: u64,
    /// The incarnation it holds them of; `None` for a peer with nothing.
    pub incarnation: Option<String>,
    /// The zone's path prefix.
    pub prefix: String,
    /// The token to push with, when the peer gave a callback address.
    pub notify: Option<String>,
}

impl Pull {
    /// The query of a pull.
    pub fn to_query(&self) -> String {
        let mut query = format!("since={}&prefix={}", self.since, escape(&self.prefix));
        if let Some(incarnation) = &self.incarnation {
            query.push_str("&incarnation=");
            query.push_str(incarnation);
        }
        if let Some(token) = &self.notify {
            query.push_str("&notify=");
            query.push_str(token);
        }
        query
    }

    /// Reads a pull's query.
    ///
    /// # Errors
    /// What is wrong with it, for a 400.
    pub fn parse(query: Option<&str>) -> Result<Pull, String> {
        let mut pull = Pull {
            since: 0,
            incarnation: None,
            prefix: "/".into(),
            notify: None,
        };
        for pair in query
            .unwrap_or("")
            .split('&')
            .filter(|pair| !pair.is_empty())
        {
            let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
            match name {
                "since" => {
                    pull.since = value
                        .parse()
                        .map_err(|_| format!("since={value}: not a CSN"))?;
                }
                "incarnation" if is_token(value) => pull.incarnation = Some(value.into()),
                "notify" if is_token(value) => pull.notify = Some(value.into()),
                "prefix" => {
                    let prefix = unescape(value).ok_or("prefix: bad %-escape")?;
                    if !prefix.starts_with('/') {
                        return Err(format!("prefix={prefix}: a path starts with /"));
                    }
                    pull.prefix = prefix;
                }
                "incarnation" | "notify" => {
                    return Err(format!(
                        "{name}: at most {MAX_TOKEN_LEN} letters and digits"
                    ));
                }
                _ => {}
            }
        }
        Ok(pull)
    }
}

/// The paths a submission lists, one per line: origin-form paths, or
/// absolute `http://` URLs whose path is taken (the host is the request's).
///
/// # Errors
/// A line that is neither, or more than [`MAX_SUBMITTED`] lines.
pub fn parse_submission(body: &str) -> Result<Vec<String>, String> {
    let mut paths: Vec<String> = Vec::new();
    for line in body.lines().map(str::trim).filter(|line| !line.is_empty()) {
        let path = if line.starts_with('/') {
            line.parse::<Uri>()
                .ok()
                .and_then(|uri| uri.path_and_query().map(|p| p.as_str().to_owned()))
        } else {
            line.parse::<Uri>()
                .ok()
                .filter(|uri| uri.scheme().is_some() && uri.authority().is_some())
                .and_then(|uri| uri.path_and_query().map(|p| p.as_str().to_owned()))
        };
        let path = path.ok_or_else(|| format!("{line}: neither a path nor an http:// URL"))?;
        if !paths.contains(&path) {
            paths.push(path);
        }
        if paths.len() > MAX_SUBMITTED {
            return Err(format!("more than {MAX_SUBMITTED} paths in one submission"));
        }
    }
    Ok(paths)
}

/// The line pushed to a subscriber: its zone's token and the new CSN.
pub fn feed_line(token: &str, csn: u64) -> String {
    format!("FEED {token} {csn}\r\n")
}

/// Reads a pushed line: the token and the CSN.
pub fn parse_feed_line(line: &[u8]) -> Option<(String, u64)> {
    let line = std::str::from_utf8(line).ok()?;
    let rest = line.trim_end_matches(['\r', '\n']).strip_prefix("FEED ")?;
    let (token, csn) = rest.split_once(' ')?;
    is_token(token).then_some(())?;
    Some((token.to_owned(), csn.parse().ok()?))
}

/// Where a pull asked to be pushed: its `X-Node`, only when that is the
/// puller's own address `peer` (never a third party's).
pub fn callback_node(headers: &http::HeaderMap, peer: Option<SocketAddr>) -> Option<SocketAddr> {
    let node = parse_x_node(headers.get(&X_NODE)?.as_bytes()).ok()?;
    (node.ip() == peer?.ip()).then_some(node)
}

fn is_token(text: &str) -> bool {
    !text.is_empty()
        && text.len() <= MAX_TOKEN_LEN
        && text.bytes().all(|b| b.is_ascii_alphanumeric())
}

/// A path prefix in a query: `%`, `&`, `=`, `+`, `#` and controls escaped.
fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for byte in text.bytes() {
        match byte {
            b'%' | b'&' | b'=' | b'+' | b'#' | b' ' | 0..=0x1f | 0x7f.. => {
                out.push_str(&format!("%{byte:02X}"));
            }
            _ => out.push(byte as char),
        }
    }
    out
}

fn unescape(text: &str) -> Option<String> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = std::str::from_utf8(bytes.get(i + 1..i + 3)?).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pull_goes_and_comes_back_whole() {
        let pull = Pull {
            since: 41,
            incarnation: Some("9f3a".into()),
            prefix: "/static/a b&c=%".into(),
            notify: Some("5a".into()),
        };
        assert_eq!(Pull::parse(Some(&pull.to_query())), Ok(pull));
        assert_eq!(Pull::parse(None).unwrap().prefix, "/");
    }

    #[test]
    fn a_bad_pull_says_what_is_wrong() {
        assert!(
            Pull::parse(Some("since=x"))
                .unwrap_err()
                .contains("since=x")
        );
        assert!(Pull::parse(Some("prefix=static")).is_err());
        assert!(Pull::parse(Some("notify=a/b")).is_err());
        assert!(Pull::parse(Some(&format!("incarnation={}", "a".repeat(65)))).is_err());
    }

    #[test]
    fn a_submission_lists_paths_once() {
        let paths =
            parse_submission("/a.js\n\nhttp://www.example.com/b.css?v=1\r\n/a.js\n").unwrap();
        assert_eq!(paths, ["/a.js", "/b.css?v=1"]);
        assert!(parse_submission("a.js").is_err());
        let many: String = (0..=MAX_SUBMITTED).map(|n| format!("/{n}\n")).collect();
        assert!(parse_submission(&many).is_err());
    }

    #[test]
    fn a_feed_line_names_the_token_and_the_csn() {
        assert_eq!(
            parse_feed_line(feed_line("5a", 44).as_bytes()),
            Some(("5a".into(), 44))
        );
        assert_eq!(parse_feed_line(b"QUEUE 5a 44\r\n"), None);
        assert_eq!(parse_feed_line(b"FEED 5a\r\n"), None);
        assert_eq!(parse_feed_line(b"FEED a/b 4\r\n"), None);
    }
}
