//! RFC 9110 §15.2: a proxy forwards the 1xx responses its upstream sends
//! ahead of the final one (103 Early Hints here), and never caches them.
//!
//! An origin written here over raw TCP answers every request with a
//! `103 Early Hints` naming a style sheet, then, a moment later, the page.
//! A raw user agent asks the client proxy alone, the accelerator alone,
//! and the pair, reading every byte each sends back on one kept-alive
//! connection, so a 1xx written inside another response would show.

mod support;

use std::net::SocketAddr;
use std::time::Duration;

use support::topology::{Accelerator, ClientProxy, accelerator_config};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

const HINT: &str = "</style.css>; rel=preload; as=style";

/// The origin: for each request, a 103 with [`HINT`], then after 50 ms a
/// cacheable 200 naming the path.
async fn hinting_origin() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((mut stream, _)) = listener.accept().await else {
                return;
            };
            tokio::spawn(async move {
                let mut buffered = Vec::new();
                loop {
                    let Some(head) = read_head(&mut stream, &mut buffered).await else {
                        return;
                    };
                    let path = head.split_whitespace().nth(1).unwrap_or("/").to_owned();
                    let hint = format!("HTTP/1.1 103 Early Hints\r\nLink: {HINT}\r\n\r\n");
                    if stream.write_all(hint.as_bytes()).await.is_err() {
                        return;
                    }
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    let body = format!("<html>page {path}</html>\n");
                    let answer = format!(
                        "HTTP/1.1 200 OK\r\nContent-Type: text/html\r\n\
                         Cache-Control: max-age=600\r\nContent-Length: {}\r\n\r\n{body}",
                        body.len()
                    );
                    if stream.write_all(answer.as_bytes()).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    addr
}

/// Reads one request head (no body is sent here); `None` at the end.
async fn read_head(stream: &mut TcpStream, buffered: &mut Vec<u8>) -> Option<String> {
    loop {
        if let Some(end) = buffered.windows(4).position(|w| w == b"\r\n\r\n") {
            let head: Vec<u8> = buffered.drain(..end + 4).collect();
            return Some(String::from_utf8_lossy(&head).into_owned());
        }
        let mut chunk = [0u8; 4096];
        match stream.read(&mut chunk).await {
            Ok(0) | Err(_) => return None,
            Ok(n) => buffered.extend_from_slice(&chunk[..n]),
        }
    }
}

/// One response as the user agent read it.
#[derive(Debug)]
struct Answer {
    status: u16,
    head: String,
    body: Vec<u8>,
}

/// Reads responses off `stream` until a final one (status ≥ 200) is whole:
/// the 1xx heads before it, then it (its body by `Content-Length`).
async fn read_until_final(stream: &mut TcpStream, buffered: &mut Vec<u8>) -> Vec<Answer> {
    let mut answers = Vec::new();
    loop {
        let head = tokio::time::timeout(Duration::from_secs(10), read_head(stream, buffered))
            .await
            .expect("an answer within 10 s")
            .expect("the proxy closed before a final answer");
        let status: u16 = head
            .split_whitespace()
            .nth(1)
            .and_then(|code| code.parse().ok())
            .unwrap_or_else(|| panic!("a status line: {head:?}"));
        if status < 200 {
            answers.push(Answer {
                status,
                head,
                body: Vec::new(),
            });
            continue;
        }
        let length: usize = head
            .lines()
            .find_map(|line| {
                let (name, value) = line.split_once(':')?;
                name.eq_ignore_ascii_case("content-length")
                    .then(|| value.trim().parse().ok())?
            })
            .unwrap_or_else(|| panic!("a Content-Length: {head:?}"));
        while buffered.len() < length {
            let mut chunk = [0u8; 4096];
            let n = stream.read(&mut chunk).await.unwrap();
            assert!(n > 0, "cut inside the body");
            buffered.extend_from_slice(&chunk[..n]);
        }
        let body = buffered.drain(..length).collect();
        answers.push(Answer { status, head, body });
        return answers;
    }
}

/// A raw HTTP/1.x connection to a proxy.
struct UserAgent {
    stream: TcpStream,
    buffered: Vec<u8>,
}

impl UserAgent {
    async fn connect(proxy: SocketAddr) -> UserAgent {
        UserAgent {
            stream: TcpStream::connect(proxy).await.unwrap(),
            buffered: Vec::new(),
        }
    }

    async fn get(&mut self, target: &str, host: SocketAddr, version: &str) -> Vec<Answer> {
        let request =
            format!("GET {target} {version}\r\nHost: {host}\r\nConnection: keep-alive\r\n\r\n");
        self.stream.write_all(request.as_bytes()).await.unwrap();
        read_until_final(&mut self.stream, &mut self.buffered).await
    }
}

fn is_early_hint(answer: &Answer) -> bool {
    answer.status == 103
        && answer.head.starts_with("HTTP/1.1 103 Early Hints\r\n")
        && answer
            .head
            .lines()
            .any(|line| line.eq_ignore_ascii_case(&format!("link: {HINT}")))
}

struct Rig {
    origin: SocketAddr,
    accelerator: Accelerator,
    direct: ClientProxy,
    pair: ClientProxy,
}

impl Rig {
    async fn start() -> Rig {
        let origin = hinting_origin().await;
        let accelerator = Accelerator::start(accelerator_config(origin)).await;
        let client = |upstream: SocketAddr| {
            ClientProxy::start(support::proxy::client_config(&format!("http://{upstream}")))
        };
        Rig {
            direct: client(origin).await,
            pair: client(accelerator.addr).await,
            accelerator,
            origin,
        }
    }

    /// (name, listener, how a path is written for it).
    fn fronts(&self) -> [(&'static str, SocketAddr, String); 3] {
        let absolute = format!("http://{}", self.origin);
        [
            ("accelerator", self.accelerator.addr, String::new()),
            ("client proxy", self.direct.addr, absolute.clone()),
            ("client proxy → accelerator", self.pair.addr, absolute),
        ]
    }
}

#[tokio::test]
async fn rfc9110_15_2_early_hints_reach_the_user_agent_before_the_page_on_a_kept_alive_connection()
{
    let rig = Rig::start().await;
    for (name, proxy, prefix) in rig.fronts() {
        let mut agent = UserAgent::connect(proxy).await;
        // Two misses on one connection: the second 103 must follow the
        // first page whole, not land inside it.
        for path in ["/a.html", "/b.html"] {
            let answers = agent
                .get(&format!("{prefix}{path}"), rig.origin, "HTTP/1.1")
                .await;
            assert_eq!(answers.len(), 2, "{name} {path}: {answers:?}");
            assert!(is_early_hint(&answers[0]), "{name} {path}: {answers:?}");
            assert_eq!(answers[1].status, 200, "{name} {path}");
            let page = String::from_utf8_lossy(&answers[1].body);
            assert!(
                page.ends_with(&format!("{path}</html>\n")),
                "{name} {path}: {page}"
            );
        }
    }
}

#[tokio::test]
async fn rfc9110_15_2_a_1xx_is_not_stored_with_the_page() {
    let rig = Rig::start().await;
    for (name, proxy, prefix) in [
        (
            "client proxy",
            rig.direct.addr,
            format!("http://{}", rig.origin),
        ),
        (
            "client proxy → accelerator",
            rig.pair.addr,
            format!("http://{}", rig.origin),
        ),
    ] {
        let mut agent = UserAgent::connect(proxy).await;
        let target = format!("{prefix}/cached.html");
        let first = agent.get(&target, rig.origin, "HTTP/1.1").await;
        assert!(is_early_hint(&first[0]), "{name}: {first:?}");
        // Fresh for 600 s: the hit comes from the cache, with no 1xx.
        let hit = agent.get(&target, rig.origin, "HTTP/1.1").await;
        assert_eq!(hit.len(), 1, "{name}: {hit:?}");
        assert_eq!(hit[0].status, 200, "{name}");
        assert_eq!(hit[0].body, first[1].body, "{name}");
    }
}

#[tokio::test]
async fn rfc9110_15_2_an_http_1_0_client_gets_no_1xx() {
    let rig = Rig::start().await;
    for (name, proxy, prefix) in rig.fronts() {
        let mut agent = UserAgent::connect(proxy).await;
        let answers = agent
            .get(&format!("{prefix}/old.html"), rig.origin, "HTTP/1.0")
            .await;
        assert_eq!(answers.len(), 1, "{name}: {answers:?}");
        assert_eq!(answers[0].status, 200, "{name}");
    }
}

#[tokio::test]
async fn rfc9110_15_2_curl_sees_the_early_hint_through_the_pair() {
    let rig = Rig::start().await;
    let proxy = format!("http://{}", rig.pair.addr);
    let url = format!("http://{}/curl.html", rig.origin);
    let output = tokio::process::Command::new("curl")
        .args(["--silent", "--show-error", "--include", "--max-time", "10"])
        .args(["--proxy", &proxy, &url])
        .output()
        .await
        .expect("curl runs");
    let shown = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{shown}");
    let hint = shown.find("HTTP/1.1 103 Early Hints").expect(&shown);
    let page = shown.find("HTTP/1.1 200 OK").expect(&shown);
    assert!(hint < page, "{shown}");
    assert!(
        shown
            .to_ascii_lowercase()
            .contains(&format!("link: {HINT}")),
        "{shown}"
    );
    assert!(shown.ends_with("/curl.html</html>\n"), "{shown}");
}

/// Two requests in one write (pipelined): each answer comes whole and in
/// order, a 1xx never inside the page before it.
#[tokio::test]
async fn rfc9110_15_2_pipelined_requests_get_their_hints_between_whole_answers() {
    let rig = Rig::start().await;
    for (name, proxy, prefix) in rig.fronts() {
        let mut agent = UserAgent::connect(proxy).await;
        let host = rig.origin;
        let both = format!(
            "GET {prefix}/p1.html HTTP/1.1\r\nHost: {host}\r\n\r\n\
             GET {prefix}/p2.html HTTP/1.1\r\nHost: {host}\r\n\r\n"
        );
        agent.stream.write_all(both.as_bytes()).await.unwrap();
        for path in ["/p1.html", "/p2.html"] {
            let answers = read_until_final(&mut agent.stream, &mut agent.buffered).await;
            let (last, hints) = answers.split_last().unwrap();
            assert!(
                hints.iter().all(is_early_hint),
                "{name} {path}: {answers:?}"
            );
            assert_eq!(last.status, 200, "{name} {path}");
            let page = String::from_utf8_lossy(&last.body);
            assert!(
                page.ends_with(&format!("{path}</html>\n")),
                "{name} {path}: {page}"
            );
        }
    }
}
