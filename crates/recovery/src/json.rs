//! Small JSON predicates with the semantics of the reference's JavaScript checks.

use serde_json::{Map, Value};

/// Largest integer a JavaScript number holds exactly (2^53 - 1).
const MAX_SAFE_INTEGER: f64 = 9_007_199_254_740_991.0;

/// The value as an integer when JavaScript's `Number.isInteger` would agree.
///
/// `2.0` counts as an integer, as in the reference. Integers beyond 2^53 are
/// refused: no field of these files legitimately holds one.
pub(crate) fn integer(value: &Value) -> Option<i64> {
    if let Some(i) = value.as_i64() {
        return (i.unsigned_abs() as f64 <= MAX_SAFE_INTEGER).then_some(i);
    }
    let f = value.as_f64()?;
    (f.is_finite() && f.fract() == 0.0 && f.abs() <= MAX_SAFE_INTEGER).then_some(f as i64)
}

/// A string that is non-empty after trimming whitespace.
pub(crate) fn non_empty_str(value: &Value) -> Option<&str> {
    value.as_str().filter(|s| !s.trim().is_empty())
}

/// An array whose every element is a string non-empty after trimming.
pub(crate) fn is_string_list(value: &Value) -> bool {
    value
        .as_array()
        .is_some_and(|items| items.iter().all(|item| non_empty_str(item).is_some()))
}

/// A non-null, non-array JSON object.
pub(crate) fn object(value: &Value) -> Option<&Map<String, Value>> {
    value.as_object()
}

/// Rewrites an integer-valued number (`2.0`) as a JSON integer (`2`), so the
/// typed structs can read it and the writer stores it as JavaScript would print it.
pub(crate) fn canonical_integer(map: &mut Map<String, Value>, key: &str) {
    if let Some(value) = map.get_mut(key)
        && let Some(i) = integer(value)
    {
        *value = Value::from(i);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn integers_follow_javascript() {
        assert_eq!(integer(&json!(2)), Some(2));
        assert_eq!(integer(&json!(2.0)), Some(2));
        assert_eq!(integer(&json!(-3)), Some(-3));
        assert_eq!(integer(&json!(2.5)), None);
        assert_eq!(integer(&json!("2")), None);
        assert_eq!(integer(&json!(1e300)), None);
    }

    #[test]
    fn strings_are_trimmed_before_the_emptiness_check() {
        assert!(non_empty_str(&json!(" a ")).is_some());
        assert!(non_empty_str(&json!(" \t")).is_none());
        assert!(is_string_list(&json!([])));
        assert!(!is_string_list(&json!(["a", " "])));
        assert!(!is_string_list(&json!(["a", 1])));
    }
}
