//! [`ResponseFraming`]: the response side of the framing guard, on our
//! own upstream connections (P-5, P-6 and P-17 on the response side). It
//! pairs two [`Framing`]s: one follows the requests we write (how many,
//! which were HEAD), the other checks the responses we read against them,
//! so that a response nobody asked for, or a body longer than its length,
//! is refused rather than read as the next response.
//!
//! It leaves out the byte-level rules and the state machine ([`Framing`]),
//! and what a connection does about a violation
//! ([`crate::http::upstream_guard`]).

use super::{Checked, Framing};

/// Follows the response framing of one HTTP/1.1 client connection: the
/// requests written on it (for which responses may come, and which were
/// HEAD) and the responses read. Sans-IO.
///
/// A response is held to the request rules (see [the module](super)), and besides: its status
/// line must begin `HTTP/1.x NNN` (no control byte but HTAB after); 101 is
/// refused (no request of ours asks for an upgrade); 1xx is interim; a
/// response to HEAD, a 204 and a 304 end with their head, one with neither
/// `Content-Length` nor chunked with the connection. A byte read while no
/// request awaits its response (a body longer than its `Content-Length`,
/// a response nobody asked for) is
/// [`Reason::Unsolicited`](super::Reason::Unsolicited).
#[derive(Debug, Clone)]
pub struct ResponseFraming {
    requests: Framing,
    responses: Framing,
}

impl Default for ResponseFraming {
    fn default() -> Self {
        ResponseFraming::new()
    }
}

impl ResponseFraming {
    /// A connection's framing before its first byte either way.
    pub fn new() -> ResponseFraming {
        ResponseFraming {
            requests: Framing::new(),
            responses: Framing::responses(),
        }
    }

    /// Notes `bytes` written to the connection (requests, ours). Were they
    /// malformed, no further request would count, and its response would be
    /// unsolicited: the connection fails rather than being misread.
    pub fn sent(&mut self, bytes: &[u8]) {
        self.requests.check(bytes);
        self.responses.answer(&self.requests);
    }

    /// Checks `bytes` read from the connection: how many of them may go on
    /// to the HTTP parser, and the violation, if any, which every later
    /// call repeats. Bytes after a response's end
    /// ([`Reason::Unsolicited`](super::Reason::Unsolicited)) leave the
    /// response before them safe.
    pub fn received(&mut self, bytes: &[u8]) -> Checked {
        self.responses.check(bytes)
    }

    /// Requests whose request line was written: the last one's index is
    /// this less one.
    pub fn requests_sent(&self) -> u64 {
        self.requests.start_lines()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::http::head_guard::{Part, Reason, Violation};

    /// Requests `sent`, then `received` whole: the violation, if any.
    fn response_violation(sent: &[&str], received: &[u8]) -> Option<Violation> {
        let mut framing = ResponseFraming::new();
        for request in sent {
            framing.sent(request.as_bytes());
        }
        framing.received(received).violation
    }

    const GET: &str = "GET /a HTTP/1.1\r\nHost: a\r\n\r\n";

    #[test]
    fn well_formed_responses_pass_whole_and_split_anywhere() {
        let head = "HEAD /a HTTP/1.1\r\nHost: a\r\n\r\n";
        let post = "POST /a HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n";
        let exchanges: [(&[&str], &str); 7] = [
            (&[GET], "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello"),
            (
                &[GET],
                "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\nT: t\r\n\r\n",
            ),
            (&[head], "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n"),
            (
                &[GET],
                "HTTP/1.1 304 Not Modified\r\nContent-Length: 5\r\n\r\n",
            ),
            (
                &[post],
                "HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 204 No Content\r\n\r\n",
            ),
            (
                &[GET],
                "HTTP/1.0 200 \tfine\u{ff}\r\n\r\nuntil the end, HTTP/1.1 200 OK\r\n\r\n",
            ),
            (
                &[GET, head],
                "HTTP/1.1 200 OK\r\nContent-Length: 1\r\n\r\nxHTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\n",
            ),
        ];
        for (sent, received) in exchanges {
            // The test strings are Latin-1 where they go past ASCII.
            let received: Vec<u8> = received.chars().map(|c| c as u8).collect();
            assert_eq!(response_violation(sent, &received), None, "{received:?}");
            let mut framing = ResponseFraming::new();
            sent.iter().for_each(|r| framing.sent(r.as_bytes()));
            for byte in received.chunks(1) {
                let checked = framing.received(byte);
                assert_eq!(checked.violation, None, "{received:?} byte by byte");
            }
        }
    }

    #[test]
    fn p5_a_zero_padded_17_digit_response_chunk_size_is_refused() {
        let response = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n00000000000000005\r\nhello\r\n0\r\n\r\n";
        let v = response_violation(&[GET], response).expect("refused");
        assert_eq!((v.reason, v.part), (Reason::BadChunkSize, Part::Body));
    }

    #[test]
    fn p17_bytes_past_a_response_are_unsolicited_and_belong_to_it() {
        let long = b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhelloHTTP/1.1 200 OK\r\n\r\n";
        let v = response_violation(&[GET], long).expect("refused");
        assert_eq!((v.reason, v.message, v.at), (Reason::Unsolicited, 0, 43));
        // The response itself, whole, may go on (RFC 9112 §6.3).
        let mut framing = ResponseFraming::new();
        framing.sent(GET.as_bytes());
        assert_eq!(framing.received(long).safe, 43);
        // The same bytes arriving after the next request was written are
        // that request's response.
        assert_eq!(response_violation(&[GET, GET], long), None);
        // Nothing asked, nothing may come.
        let v = response_violation(&[], b"\r\n").expect("refused");
        assert_eq!((v.reason, v.message), (Reason::Unsolicited, 0));
        // Our own requests split anywhere still count once each.
        let mut framing = ResponseFraming::new();
        for byte in [GET, GET].concat().as_bytes().chunks(1) {
            framing.sent(byte);
        }
        assert_eq!(framing.requests_sent(), 2);
    }

    #[test]
    fn response_heads_are_held_to_the_request_rules_and_a_status_line() {
        let cases: [(&[u8], Reason); 7] = [
            (b"HTTP/1.1 200 O\x01K\r\n\r\n", Reason::ControlByte(1)),
            (
                b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: x\r\n\r\n",
                Reason::UnrequestedSwitch,
            ),
            (b"HTTP/2 200 OK\r\n\r\n", Reason::BadStatusLine),
            (b"HTTP/1.1 20 OK\r\n\r\n", Reason::BadStatusLine),
            (b"HTTP/1.1 200 OK\r\nX: a\r\n b\r\n\r\n", Reason::ObsFold),
            (
                b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n",
                Reason::ContentLengthWithTransferEncoding,
            ),
            (
                b"HTTP/1.0 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n",
                Reason::TransferEncodingOnHttp10,
            ),
        ];
        for (response, expected) in cases {
            let v = response_violation(&[GET], response).expect("refused");
            assert_eq!(
                v.reason,
                expected,
                "{:?}",
                String::from_utf8_lossy(response)
            );
        }
    }
}
