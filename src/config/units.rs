//! The one syntax for sizes and durations, in flags and in the TOML file
//! alike: sizes as bytes or with a binary suffix (`4608`, `64K`, `256M`,
//! `1G`), durations with a unit (`100ms`, `30s`, `5m`, `1h`) or as plain
//! seconds (`30`, what the flags took before units).
//!
//! Our own few lines rather than humantime or bytesize: those accept more
//! than we want to document (`1 year 2 months`, `1.5 GB` in decimal
//! units) and print differently from what they parse here, and
//! `rproxy check` prints the effective configuration back in this syntax.
//! Left out: fractions (`1.5G`), compound durations (`1m30s`), decimal
//! units (`MB`).
//!
//! Main items: [`Size`], [`parse_size`], [`parse_duration`],
//! [`format_duration`], and the serde adapter [`duration`].

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use serde::de::{self, Visitor};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A number of bytes, written `4608`, `64K`, `256M` or `1G` (binary
/// multiples: `1K` is 1024).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Size(pub u64);

impl Size {
    /// `n` KiB.
    pub const fn kib(n: u64) -> Size {
        Size(n << 10)
    }

    /// `n` MiB.
    pub const fn mib(n: u64) -> Size {
        Size(n << 20)
    }

    /// `n` GiB.
    pub const fn gib(n: u64) -> Size {
        Size(n << 30)
    }

    /// The bytes as a `usize`.
    ///
    /// # Errors
    /// On a target whose `usize` cannot hold it (never on 64-bit).
    pub fn to_usize(self) -> Result<usize, String> {
        usize::try_from(self.0).map_err(|_| format!("{self}: too large for this machine"))
    }
}

/// Parses `1234`, `64K`, `512M`, `1G` (binary multiples; the suffix in
/// either case).
///
/// # Errors
/// Anything else, or a size past `u64`.
pub fn parse_size(text: &str) -> Result<u64, String> {
    let text = text.trim();
    let (digits, shift) = match text.char_indices().last() {
        Some((i, 'k' | 'K')) => (&text[..i], 10),
        Some((i, 'm' | 'M')) => (&text[..i], 20),
        Some((i, 'g' | 'G')) => (&text[..i], 30),
        _ => (text, 0),
    };
    let n: u64 = digits
        .parse()
        .map_err(|_| format!("{text:?} is not a size (like 1048576, 64K, 512M or 1G)"))?;
    n.checked_mul(1 << shift)
        .ok_or_else(|| format!("{text} is too large"))
}

impl FromStr for Size {
    type Err = String;

    fn from_str(text: &str) -> Result<Size, String> {
        parse_size(text).map(Size)
    }
}

/// The largest unit that divides the size exactly: `1G`, `24K`, `4608`.
impl fmt::Display for Size {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let n = self.0;
        match [(30, 'G'), (20, 'M'), (10, 'K')]
            .into_iter()
            .find(|&(shift, _)| n != 0 && n.trailing_zeros() >= shift)
        {
            Some((shift, unit)) => write!(f, "{}{unit}", n >> shift),
            None => write!(f, "{n}"),
        }
    }
}

/// As a string with a suffix when one fits (`"64M"`), else as an integer.
impl Serialize for Size {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let text = self.to_string();
        if text.ends_with(char::is_numeric) {
            serializer.serialize_u64(self.0)
        } else {
            serializer.serialize_str(&text)
        }
    }
}

/// From an integer (bytes) or a string in the size syntax.
impl<'de> Deserialize<'de> for Size {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Size, D::Error> {
        struct SizeVisitor;
        impl Visitor<'_> for SizeVisitor {
            type Value = Size;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a size: bytes, or a string like \"64K\", \"256M\" or \"1G\"")
            }

            fn visit_u64<E: de::Error>(self, n: u64) -> Result<Size, E> {
                Ok(Size(n))
            }

            fn visit_i64<E: de::Error>(self, n: i64) -> Result<Size, E> {
                u64::try_from(n)
                    .map(Size)
                    .map_err(|_| E::custom(format!("{n}: a size is not negative")))
            }

            fn visit_str<E: de::Error>(self, text: &str) -> Result<Size, E> {
                text.parse().map_err(E::custom)
            }
        }
        deserializer.deserialize_any(SizeVisitor)
    }
}

/// Parses `100ms`, `30s`, `5m`, `1h`, or plain seconds (`30`).
///
/// # Errors
/// Anything else, or a duration past what [`Duration`] holds.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (digits, unit) = text.split_at(split);
    let bad = || format!("{text:?} is not a duration (like 100ms, 30s, 5m, 1h, or seconds)");
    let n: u64 = digits.parse().map_err(|_| bad())?;
    let seconds = |factor: u64| {
        n.checked_mul(factor)
            .map(Duration::from_secs)
            .ok_or_else(|| format!("{text} is too long"))
    };
    match unit {
        "ms" => Ok(Duration::from_millis(n)),
        "" | "s" => seconds(1),
        "m" => seconds(60),
        "h" => seconds(3600),
        _ => Err(bad()),
    }
}

/// The largest unit that divides the duration exactly: `5m`, `30s`,
/// `100ms` (sub-millisecond parts are dropped; nothing here sets them).
pub fn format_duration(duration: Duration) -> String {
    let ms = duration.as_millis();
    if !ms.is_multiple_of(1000) {
        return format!("{ms}ms");
    }
    let s = duration.as_secs();
    if s != 0 && s.is_multiple_of(3600) {
        format!("{}h", s / 3600)
    } else if s != 0 && s.is_multiple_of(60) {
        format!("{}m", s / 60)
    } else {
        format!("{s}s")
    }
}

/// Serde adapter for a [`Duration`] field: written as `"30s"`, read from
/// that syntax or from an integer number of seconds.
pub mod duration {
    use super::*;

    /// Writes `"30s"`, `"5m"`, `"100ms"`.
    ///
    /// # Errors
    /// Whatever the serializer reports.
    pub fn serialize<S: Serializer>(value: &Duration, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&format_duration(*value))
    }

    /// Reads `"30s"` and the like, or an integer (seconds).
    ///
    /// # Errors
    /// Anything else.
    pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Duration, D::Error> {
        struct DurationVisitor;
        impl Visitor<'_> for DurationVisitor {
            type Value = Duration;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a duration: seconds, or a string like \"100ms\", \"30s\" or \"5m\"")
            }

            fn visit_u64<E: de::Error>(self, n: u64) -> Result<Duration, E> {
                Ok(Duration::from_secs(n))
            }

            fn visit_i64<E: de::Error>(self, n: i64) -> Result<Duration, E> {
                u64::try_from(n)
                    .map(Duration::from_secs)
                    .map_err(|_| E::custom(format!("{n}: a duration is not negative")))
            }

            fn visit_str<E: de::Error>(self, text: &str) -> Result<Duration, E> {
                parse_duration(text).map_err(E::custom)
            }
        }
        deserializer.deserialize_any(DurationVisitor)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_take_binary_suffixes() {
        assert_eq!(parse_size("1234"), Ok(1234));
        assert_eq!(parse_size("64K"), Ok(64 << 10));
        assert_eq!(parse_size("512m"), Ok(512 << 20));
        assert_eq!(parse_size("1G"), Ok(1 << 30));
        assert!(parse_size("1T").is_err());
        assert!(parse_size("G").is_err());
        assert!(parse_size("99999999999G").is_err());
        assert!(parse_size("1.5G").is_err());
    }

    #[test]
    fn a_size_prints_in_its_largest_exact_unit_and_parses_back() {
        for (n, text) in [
            (0, "0"),
            (4608, "4608"),
            (24 << 10, "24K"),
            (256 << 20, "256M"),
            (1 << 30, "1G"),
            (4 << 30, "4G"),
            ((1 << 30) + 1, "1073741825"),
        ] {
            assert_eq!(Size(n).to_string(), text);
            assert_eq!(text.parse(), Ok(Size(n)));
        }
    }

    #[test]
    fn durations_take_units_or_plain_seconds() {
        assert_eq!(parse_duration("30"), Ok(Duration::from_secs(30)));
        assert_eq!(parse_duration("30s"), Ok(Duration::from_secs(30)));
        assert_eq!(parse_duration("5m"), Ok(Duration::from_secs(300)));
        assert_eq!(parse_duration("1h"), Ok(Duration::from_secs(3600)));
        assert_eq!(parse_duration("100ms"), Ok(Duration::from_millis(100)));
        assert_eq!(parse_duration("0"), Ok(Duration::ZERO));
        for bad in [
            "",
            "s",
            "1d",
            "1.5s",
            "-1s",
            "1m30s",
            "99999999999999999999",
        ] {
            assert!(parse_duration(bad).is_err(), "{bad}");
        }
        assert!(parse_duration(&format!("{}h", u64::MAX / 60)).is_err());
    }

    #[test]
    fn a_duration_prints_in_its_largest_exact_unit_and_parses_back() {
        for (duration, text) in [
            (Duration::ZERO, "0s"),
            (Duration::from_millis(100), "100ms"),
            (Duration::from_millis(1500), "1500ms"),
            (Duration::from_secs(30), "30s"),
            (Duration::from_secs(90), "90s"),
            (Duration::from_secs(300), "5m"),
            (Duration::from_secs(7200), "2h"),
        ] {
            assert_eq!(format_duration(duration), text);
            assert_eq!(parse_duration(text), Ok(duration));
        }
    }

    #[test]
    fn the_file_takes_integers_or_strings_for_both() {
        #[derive(Debug, Deserialize, Serialize, PartialEq)]
        struct Both {
            size: Size,
            #[serde(with = "duration")]
            wait: Duration,
        }
        let plain: Both = toml::from_str("size = 4608\nwait = 30").unwrap();
        let units: Both = toml::from_str("size = \"4608\"\nwait = \"30s\"").unwrap();
        assert_eq!(plain, units);
        assert_eq!(
            toml::to_string(&Both {
                size: Size::mib(64),
                wait: Duration::from_secs(300)
            })
            .unwrap(),
            "size = \"64M\"\nwait = \"5m\"\n"
        );
        let error = toml::from_str::<Both>("size = \"1T\"\nwait = 1").unwrap_err();
        assert!(error.to_string().contains("not a size"), "{error}");
        assert!(toml::from_str::<Both>("size = -1\nwait = 1").is_err());
    }
}
