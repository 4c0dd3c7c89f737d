//! The seeds a random-program test runs, as its knob (an environment variable the test reads
//! once) names them.

use std::ops::Range;

/// The seeds that `value`, the knob `name`'s value, names: `N` for `0..N`, `A..B` for `A` to
/// `B - 1` (fresh seeds, past the ones a test runs by default), and `default` when the knob is
/// not set. Any other value is an error naming the knob, so that a mistyped range never runs
/// the default seeds in its place.
pub fn seed_range(
    name: &str,
    value: Option<&str>,
    default: Range<u64>,
) -> Result<Range<u64>, String> {
    let Some(v) = value else {
        return Ok(default);
    };
    let number = |s: &str| s.trim().replace('_', "").parse::<u64>().ok();
    let range = match v.split_once("..") {
        Some((a, b)) => number(a).zip(number(b)).map(|(a, b)| a..b),
        None => number(v).map(|n| 0..n),
    };
    match range {
        Some(r) if r.start <= r.end => Ok(r),
        _ => Err(format!(
            "{name}={v}: a count `N` (seeds 0 to N - 1) or a range `A..B` (seeds A to B - 1) was expected"
        )),
    }
}
