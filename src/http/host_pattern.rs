//! Host names as an operator writes them in a site's `names` or a route's
//! `hosts`: `www.example.com` (that name), `*.example.com` (any name below
//! it, not the name itself, as nginx's `server_name` reads it) and `*`
//! (any name). Names compare without case and without a trailing dot.
//!
//! Leaves out ports (a site answers to a name on whatever port the
//! client reached us) and addresses (an IP literal is a host like any
//! other here; whether it may be reached is
//! [`super::address_policy`]'s question).
//!
//! Main type: [`HostPattern`].

use std::fmt;

/// One pattern of host names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HostPattern {
    /// `*`: every name.
    Any,
    /// `*.example.com`: names ending in `.example.com` (stored with the
    /// leading dot).
    Below(String),
    /// `www.example.com`: that name.
    Exactly(String),
}

/// Why a pattern cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("host pattern {pattern:?}: {reason}")]
pub struct BadHostPattern {
    /// The pattern as written.
    pub pattern: String,
    /// What is wrong with it.
    pub reason: &'static str,
}

/// A host name as patterns compare it: lower case, no trailing dot, IPv6
/// brackets kept.
pub fn normalise(host: &str) -> String {
    host.trim_end_matches('.').to_ascii_lowercase()
}

impl HostPattern {
    /// Parses `*`, `*.suffix` or a name.
    ///
    /// # Errors
    /// An empty pattern, a `*` anywhere but alone or first in `*.`, or a
    /// character no host name has.
    pub fn parse(pattern: &str) -> Result<HostPattern, BadHostPattern> {
        let bad = |reason| BadHostPattern {
            pattern: pattern.to_owned(),
            reason,
        };
        let name = pattern.trim().to_ascii_lowercase();
        if name == "*" {
            return Ok(HostPattern::Any);
        }
        let (below, rest) = match name.strip_prefix("*.") {
            Some(rest) => (true, rest),
            None => (false, name.as_str()),
        };
        let rest = rest.strip_suffix('.').unwrap_or(rest);
        if rest.is_empty() {
            return Err(bad("empty"));
        }
        let allowed = |c: char| c.is_ascii_alphanumeric() || "-._:[]".contains(c);
        if !rest.chars().all(allowed) {
            return Err(bad(
                "a host name has letters, digits, '-', '.' (and '*.' first)",
            ));
        }
        Ok(if below {
            HostPattern::Below(format!(".{rest}"))
        } else {
            HostPattern::Exactly(rest.to_owned())
        })
    }

    /// Whether `host` (as it came: any case, a trailing dot or not) is one
    /// of this pattern's names.
    pub fn matches(&self, host: &str) -> bool {
        let host = host.trim_end_matches('.');
        match self {
            HostPattern::Any => true,
            HostPattern::Exactly(name) => host.eq_ignore_ascii_case(name),
            HostPattern::Below(suffix) => {
                host.len() > suffix.len()
                    && host.is_char_boundary(host.len() - suffix.len())
                    && host[host.len() - suffix.len()..].eq_ignore_ascii_case(suffix)
            }
        }
    }

    /// Whether any of `patterns` matches `host`.
    pub fn any_matches(patterns: &[HostPattern], host: &str) -> bool {
        patterns.iter().any(|pattern| pattern.matches(host))
    }
}

impl fmt::Display for HostPattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HostPattern::Any => f.write_str("*"),
            HostPattern::Below(suffix) => write!(f, "*{suffix}"),
            HostPattern::Exactly(name) => f.write_str(name),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_match_without_case_or_trailing_dot() {
        let www = HostPattern::parse("WWW.Example.com").unwrap();
        assert!(www.matches("www.example.com"));
        assert!(www.matches("www.EXAMPLE.com."));
        assert!(!www.matches("example.com"));
        assert!(!www.matches("www.example.com.evil"));
    }

    #[test]
    fn a_wildcard_matches_names_below_only() {
        let below = HostPattern::parse("*.static.example.com").unwrap();
        assert!(below.matches("a.static.example.com"));
        assert!(below.matches("a.b.static.example.com"));
        assert!(!below.matches("static.example.com"));
        assert!(!below.matches("evilstatic.example.com"));
        assert!(HostPattern::parse("*").unwrap().matches("anything.test"));
    }

    #[test]
    fn bad_patterns_are_refused() {
        for pattern in [
            "",
            "*.",
            "a*.example.com",
            "www.*.com",
            "exa mple.com",
            "a/b",
        ] {
            assert!(HostPattern::parse(pattern).is_err(), "{pattern:?}");
        }
    }

    #[test]
    fn patterns_print_as_written() {
        for pattern in ["*", "*.example.com", "www.example.com"] {
            assert_eq!(HostPattern::parse(pattern).unwrap().to_string(), pattern);
        }
    }
}
