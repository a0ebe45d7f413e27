//! Resolution of the limit of a new budget: environment, then config, then 64.

use std::fmt;

use serde_json::Value;

use crate::{DEFAULT_LIMIT, LIMIT_ENV, LIMIT_ENV_ALIAS, MAX_LIMIT};

/// Where a resolved limit came from (the doctor report shows it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LimitSource {
    /// The env override normalised to a value.
    Environment,
    /// The config value normalised to a value.
    Config,
    /// Neither did: [`DEFAULT_LIMIT`].
    Default,
}

impl fmt::Display for LimitSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Environment => "environment",
            Self::Config => "config",
            Self::Default => "default",
        })
    }
}

/// A resolved limit and its source.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ResolvedLimit {
    /// The limit to store in a new budget's manifest.
    pub limit: u64,
    /// Where it came from.
    pub source: LimitSource,
}

/// Resolves the limit of a new budget from the env override value and the
/// config value; invalid values silently fall through to the next source.
pub fn resolve_limit(env: Option<&str>, config: Option<&Value>) -> ResolvedLimit {
    if let Some(limit) = env.and_then(normalize_limit_str) {
        return ResolvedLimit {
            limit,
            source: LimitSource::Environment,
        };
    }
    if let Some(limit) = config.and_then(normalize_limit) {
        return ResolvedLimit {
            limit,
            source: LimitSource::Config,
        };
    }
    ResolvedLimit {
        limit: DEFAULT_LIMIT,
        source: LimitSource::Default,
    }
}

/// The env override from the process environment: the first non-empty of
/// [`LIMIT_ENV`] and [`LIMIT_ENV_ALIAS`].
pub fn limit_env_value() -> Option<String> {
    [LIMIT_ENV, LIMIT_ENV_ALIAS]
        .into_iter()
        .filter_map(|name| std::env::var(name).ok())
        .find(|v| !v.is_empty())
}

/// Normalises a config value: a JSON number or a numeric string giving an
/// integer in `1..=MAX_LIMIT`; anything else is no value.
pub fn normalize_limit(value: &Value) -> Option<u64> {
    match value {
        Value::Number(n) => n.as_f64().and_then(positive_integer),
        Value::String(s) => normalize_limit_str(s),
        _ => None,
    }
}

/// Normalises a string with JavaScript `Number()` semantics (trimmed, `""` is
/// 0, `1e1`, `0x10`, `.5` accepted) to an integer in `1..=MAX_LIMIT`.
pub fn normalize_limit_str(text: &str) -> Option<u64> {
    js_number(text).and_then(positive_integer)
}

fn positive_integer(n: f64) -> Option<u64> {
    let in_range = n.is_finite() && n.fract() == 0.0 && n >= 1.0 && n <= MAX_LIMIT as f64;
    // The range check makes the cast exact.
    in_range.then_some(n as u64)
}

/// `Number(text)` for the cases that can yield a positive integer.
fn js_number(text: &str) -> Option<f64> {
    let t = text.trim_matches(|c: char| c.is_whitespace() || c == '\u{feff}');
    if t.is_empty() {
        return Some(0.0);
    }
    for (prefix, radix) in [("0x", 16), ("0o", 8), ("0b", 2)] {
        if let Some(digits) = t.get(..2).filter(|p| p.eq_ignore_ascii_case(prefix)) {
            let rest = &t[digits.len()..];
            if rest.is_empty() || !rest.chars().all(|c| c.is_digit(radix)) {
                return None;
            }
            return u128::from_str_radix(rest, radix).ok().map(|v| v as f64);
        }
    }
    // Rust's float grammar also takes "inf"/"nan", which JS rejects; both are
    // non-integers here anyway, so only the plain decimal grammar matters.
    let decimal = t
        .chars()
        .all(|c| c.is_ascii_digit() || matches!(c, '+' | '-' | '.' | 'e' | 'E'));
    if decimal { t.parse().ok() } else { None }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn reference_cases() {
        assert_eq!(resolve_limit(None, None).limit, 64);
        assert_eq!(resolve_limit(None, None).source, LimitSource::Default);
        assert_eq!(resolve_limit(None, Some(&json!(12))).limit, 12);
        for bad in [json!(0), json!(-1), json!(1.5), json!("bad"), json!(null)] {
            assert_eq!(resolve_limit(None, Some(&bad)).limit, 64, "{bad}");
        }
        let env = resolve_limit(Some("7"), Some(&json!(12)));
        assert_eq!((env.limit, env.source), (7, LimitSource::Environment));
        for bad in ["0", "-1", "1.5", "bad", "", "  "] {
            assert_eq!(resolve_limit(Some(bad), None).limit, 64, "{bad:?}");
        }
        let fallback = resolve_limit(Some("invalid"), Some(&json!(12)));
        assert_eq!((fallback.limit, fallback.source), (12, LimitSource::Config));
    }

    #[test]
    fn js_number_grammar() {
        for (text, want) in [
            ("12", Some(12)),
            (" 12 ", Some(12)),
            ("1e1", Some(10)),
            ("0x10", Some(16)),
            ("0b11", Some(3)),
            ("+5", Some(5)),
            ("5.", Some(5)),
            ("5.0", Some(5)),
            ("Infinity", None),
            ("inf", None),
            ("1_0", None),
            ("0x", None),
            ("0x+5", None),
            ("1000001", None),
            ("1000000", Some(1_000_000)),
        ] {
            assert_eq!(normalize_limit_str(text), want, "{text:?}");
        }
        assert_eq!(normalize_limit(&json!("3")), Some(3));
        assert_eq!(normalize_limit(&json!(3.0)), Some(3));
        assert_eq!(normalize_limit(&json!([3])), None);
    }

    #[test]
    fn sources_are_named_for_the_doctor_report() {
        let names = [
            LimitSource::Environment,
            LimitSource::Config,
            LimitSource::Default,
        ]
        .map(|s| s.to_string());
        assert_eq!(names, ["environment", "config", "default"]);
    }
}
