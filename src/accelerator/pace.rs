//! Whether a large body's literals are worth entropy coding, decided
//! window by window from what the last windows cost, as `zstd --adapt`
//! adapts its level to the speed of its output. Sans-IO: the accelerator
//! measures, [`Pacer`] decides.
//!
//! Entropy coding (zstd's Huffman stage) is most of both proxies' CPU on a
//! large body with little redundancy: on random text it takes a quarter of
//! the bytes off, and costs the accelerator about 2.5 ns and the client
//! about 1.5 ns per byte. Over a link slower than that the saving is time
//! too; over a faster one (loopback, a LAN of several Gbit/s) the coding
//! is what the user waits for.
//!
//! The pacer keeps, for each mode (coded or not), the encoder's time per
//! body byte and the wire bytes per body byte; the origin's time per body
//! byte and the link's time per wire byte, each the window's span less the
//! time that side waited for the encoder. Each mode would take `max(origin, encoder, link time)` per
//! body byte; the pacer picks the smaller, and coding on a tie. So it codes
//! whenever the link or the origin is slower than the coding encoder, and
//! stops coding when the encoder is what the link waits for and sending
//! more bytes costs less time.
//!
//! It starts coded and stays so for the first [`WARM_UP_BYTES`] on the
//! wire: until the socket buffer is full, a slow link looks fast. So only
//! bodies of more than about 10 MB are ever sent uncoded.
//!
//! The link as seen from the accelerator includes the client proxy: a
//! client that rebuilds slower than the accelerator encodes looks like a
//! slow link, and keeps entropy coding on.

use std::time::Duration;

/// What one window cost.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct WindowCost {
    /// The window's literals had entropy coding.
    pub coded: bool,
    /// Body bytes the window encoded.
    pub body_bytes: u64,
    /// Stream bytes it produced.
    pub wire_bytes: u64,
    /// Wall time from the end of the previous window to the end of this
    /// one's sending: reading the origin, encoding, sending.
    pub span: Duration,
    /// Time spent encoding it.
    pub encode: Duration,
    /// Time the origin's reader spent waiting for the encoder to take
    /// bytes, during the span.
    pub origin_idle: Duration,
    /// Time the link spent waiting for the encoder's bytes, during the
    /// span.
    pub link_idle: Duration,
}

/// Wire bytes coded from the start whatever they measure: more than a
/// socket send buffer (Linux lets one grow to 4 MiB) and the accelerator's
/// own queue (1 MiB) hold.
pub const WARM_UP_BYTES: u64 = 8 << 20;

/// Weight of a new observation in the running estimates.
const NEW_WEIGHT: f64 = 0.5;

/// Chooses entropy coding or not for each next window; see the module
/// documentation.
#[derive(Debug, Clone, Default)]
pub struct Pacer {
    /// Encoder seconds per body byte, uncoded and coded.
    cost: [Option<f64>; 2],
    /// Wire bytes per body byte, uncoded and coded.
    ratio: [Option<f64>; 2],
    /// Link seconds per wire byte.
    link: Option<f64>,
    /// Origin seconds per body byte.
    origin: Option<f64>,
    /// Wire bytes recorded.
    wire_bytes: u64,
}

impl Pacer {
    /// A pacer that knows nothing yet: the first windows are coded.
    pub fn new() -> Pacer {
        Pacer::default()
    }

    /// Learns from a finished window and says whether the next one should
    /// be entropy-coded.
    pub fn record(&mut self, window: WindowCost) -> bool {
        if window.body_bytes == 0 || window.wire_bytes == 0 {
            return self.choose();
        }
        let mode = usize::from(window.coded);
        let body = window.body_bytes as f64;
        let wire = window.wire_bytes as f64;
        let span = window.span.as_secs_f64();
        let busy = |idle: Duration| (span - idle.as_secs_f64()).max(0.0);
        blend(&mut self.cost[mode], window.encode.as_secs_f64() / body);
        blend(&mut self.ratio[mode], wire / body);
        blend(&mut self.origin, busy(window.origin_idle) / body);
        blend(&mut self.link, busy(window.link_idle) / wire);
        self.wire_bytes = self.wire_bytes.saturating_add(window.wire_bytes);
        self.choose()
    }

    /// True when the coded mode is expected to take no longer per body
    /// byte than the uncoded one.
    fn choose(&self) -> bool {
        if self.wire_bytes < WARM_UP_BYTES {
            return true;
        }
        let link = self.link.unwrap_or(0.0);
        let origin = self.origin.unwrap_or(0.0);
        // The uncoded mode before its trial: free to encode, and the
        // body's size on the wire.
        let time = |mode: usize| {
            let cost = self.cost[mode].unwrap_or(0.0);
            origin.max(cost).max(self.ratio[mode].unwrap_or(1.0) * link)
        };
        time(1) <= time(0)
    }
}

fn blend(estimate: &mut Option<f64>, observed: f64) {
    *estimate = Some(match *estimate {
        Some(old) => old + NEW_WEIGHT * (observed - old),
        None => observed,
    });
}

#[cfg(test)]
mod tests {
    use super::{Pacer, WARM_UP_BYTES, WindowCost};
    use std::time::Duration;

    const WINDOW: u64 = 4 << 20;

    /// Coded windows of `WINDOW` within the warm-up.
    const WARM_UP_WINDOWS: usize = (WARM_UP_BYTES as usize).div_ceil(WINDOW as usize * 3 / 4);

    /// A window of random text from an origin that needs `origin_ns` per
    /// byte, over a link that needs `link_ns` per wire byte, from an
    /// encoder that needs 4 ns per byte coded (sending 0.75x) and 1 ns
    /// uncoded (1.0x), in steady state: the slowest sets the pace.
    fn window(coded: bool, origin_ns: f64, link_ns: f64) -> WindowCost {
        let (encode_ns, ratio) = if coded { (4.0, 0.75) } else { (1.0, 1.0) };
        let body = WINDOW as f64;
        let wire = body * ratio;
        let (origin, encode, link) = (body * origin_ns, body * encode_ns, wire * link_ns);
        let span = origin.max(encode).max(link);
        let nanos = |n: f64| Duration::from_nanos(n as u64);
        WindowCost {
            coded,
            body_bytes: WINDOW,
            wire_bytes: wire as u64,
            span: nanos(span),
            encode: nanos(encode),
            origin_idle: nanos(span - origin),
            link_idle: nanos(span - link),
        }
    }

    /// Runs `windows` windows over a link of `link_ns` per wire byte from
    /// `pacer`, from a fast origin; returns how many were coded.
    fn run(pacer: &mut Pacer, coded: &mut bool, windows: usize, link_ns: f64) -> usize {
        run_from(pacer, coded, windows, 0.1, link_ns)
    }

    fn run_from(
        pacer: &mut Pacer,
        coded: &mut bool,
        windows: usize,
        origin_ns: f64,
        link_ns: f64,
    ) -> usize {
        let mut count = 0;
        for _ in 0..windows {
            count += usize::from(*coded);
            *coded = pacer.record(window(*coded, origin_ns, link_ns));
        }
        count
    }

    #[test]
    fn a_fast_link_gets_uncoded_literals_after_the_first_windows() {
        let mut pacer = Pacer::new();
        let mut coded = true;
        // Link at 0.5 ns per byte: 2 GB/s, faster than either mode.
        assert_eq!(run(&mut pacer, &mut coded, 64, 0.5), WARM_UP_WINDOWS);
        assert!(!coded);
    }

    #[test]
    fn a_slow_link_keeps_entropy_coding_throughout() {
        let mut pacer = Pacer::new();
        let mut coded = true;
        // 10 ns per byte: 100 MB/s, slower than the coded encoder.
        assert_eq!(run(&mut pacer, &mut coded, 64, 10.0), 64);
    }

    /// Between the two (the coded encoder slower than the link, but the
    /// link slower than the uncoded encoder), the faster mode wins: coded
    /// when the link needs longer for an uncoded window than the encoder
    /// for a coded one.
    #[test]
    fn a_link_between_the_modes_keeps_the_faster_one() {
        // 5 ns per wire byte: uncoded 5 ns per body byte, coded 4.
        let mut pacer = Pacer::new();
        let mut coded = true;
        assert_eq!(run(&mut pacer, &mut coded, 64, 5.0), 64);

        // 3 ns per wire byte: uncoded 3, coded 4.
        let mut pacer = Pacer::new();
        let mut coded = true;
        assert_eq!(run(&mut pacer, &mut coded, 64, 3.0), WARM_UP_WINDOWS);
        assert!(!coded);
    }

    /// An origin slower than the coding encoder leaves time to code
    /// whatever the link.
    #[test]
    fn a_slow_origin_keeps_entropy_coding_on_a_fast_link() {
        let mut pacer = Pacer::new();
        let mut coded = true;
        assert_eq!(run_from(&mut pacer, &mut coded, 64, 5.0, 0.5), 64);
        // An origin between the modes: coding costs 4, not coding 2.
        let mut pacer = Pacer::new();
        let mut coded = true;
        run_from(&mut pacer, &mut coded, 64, 2.0, 0.5);
        assert!(!coded);
    }

    /// The mode follows the link as its speed changes, both ways, within a
    /// few windows.
    #[test]
    fn a_change_of_link_speed_changes_the_mode() {
        let mut pacer = Pacer::new();
        let mut coded = true;
        run(&mut pacer, &mut coded, 16, 10.0);
        assert!(coded);
        let coded_windows = run(&mut pacer, &mut coded, 16, 0.5);
        assert!(!coded);
        assert!(coded_windows <= 3, "{coded_windows}");
        let coded_windows = run(&mut pacer, &mut coded, 16, 10.0);
        assert!(coded);
        assert!(coded_windows >= 14, "{coded_windows}");
    }

    #[test]
    fn an_empty_window_changes_nothing() {
        let mut pacer = Pacer::new();
        assert!(pacer.record(WindowCost::default()));
        let before = format!("{pacer:?}");
        pacer.record(WindowCost {
            coded: true,
            ..WindowCost::default()
        });
        assert_eq!(format!("{pacer:?}"), before);
    }
}
