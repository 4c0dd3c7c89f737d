//! How a `sort` runs, decided from its comparator.
//!
//! A comparator that only asks whether one operand's element is less (or greater) than the
//! other's (`compare %lhs_k, %rhs_k {comparison_direction = LT}`, what `Tensor::sort` and
//! `argsort` trace) orders the slices by that operand's keys alone: the runtime sorts them as
//! integer keys (a radix sort, stable, so equal keys keep their order as the comparator's
//! stable sort keeps them), and a comparator that is anything else runs as a compiled region
//! inside a merge sort, the same merge the reference interpreter runs. A sort by keys whose
//! users read only a short prefix of each slice (`Tensor::top_k`) runs as a top-k ([`top_k`]):
//! one pass over each slice's keys, with only the first `k` ordered and written.

use kiln_ir::{ComparisonDirection, Func, Op, ValueId};

/// How a `sort` runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SortPlan {
    /// By the keys of one operand, ascending or descending.
    Keys {
        /// The operand whose elements are the keys.
        operand: usize,
        /// Greatest first.
        descending: bool,
        /// A NaN key counts as greater than every number (and equal to other NaNs), as the
        /// front end's comparator says (`lt(a, b) or (b != b and a == a)`); otherwise NaN
        /// keys are unordered, as a bare `LT` leaves them.
        nan_greatest: bool,
    },
    /// By the comparator region, called for each comparison.
    Comparator,
}

/// A `sort` by one operand's keys: its dimension and [`SortPlan::Keys`]'s fields.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KeySort {
    /// The dimension sorted along.
    pub dimension: i64,
    /// The operand whose elements are the keys.
    pub operand: usize,
    /// Greatest first.
    pub descending: bool,
    /// A NaN key counts as greater than every number (see [`SortPlan::Keys`]).
    pub nan_greatest: bool,
}

/// `op` as a sort by keys, when it is a `sort` of `operands` operands whose plan is
/// [`SortPlan::Keys`]; `None` for any other op or comparator.
pub fn key_sort(op: &Op, operands: usize) -> Option<KeySort> {
    let Op::Sort {
        dimension,
        comparator,
        ..
    } = op
    else {
        return None;
    };
    match sort_plan(comparator, operands) {
        SortPlan::Keys {
            operand,
            descending,
            nan_greatest,
        } => Some(KeySort {
            dimension: *dimension,
            operand,
            descending,
            nan_greatest,
        }),
        SortPlan::Comparator => None,
    }
}

/// The plan for a `sort` of `operands` operands with `comparator`.
pub fn sort_plan(comparator: &Func, operands: usize) -> SortPlan {
    let [out] = comparator.outputs[..] else {
        return SortPlan::Comparator;
    };
    if comparator.params.len() != 2 * operands {
        return SortPlan::Comparator;
    }
    let def = |v: ValueId| comparator.insts.iter().find(|i| i.results.contains(&v));
    let param = |v: ValueId| comparator.params.iter().position(|p| *p == v);
    // `compare a, b` of two parameters: (direction, a's parameter, b's parameter).
    let compare = |v: ValueId| -> Option<(ComparisonDirection, usize, usize)> {
        let i = def(v)?;
        match (&i.op, &i.operands[..]) {
            (
                Op::Compare {
                    comparison_direction,
                },
                [a, b],
            ) => Some((*comparison_direction, param(*a)?, param(*b)?)),
            _ => None,
        }
    };
    // `x op y` of two values, either way round.
    let pair = |v: ValueId, want: fn(&Op) -> bool| -> Option<[ValueId; 2]> {
        let i = def(v)?;
        match &i.operands[..] {
            [x, y] if want(&i.op) => Some([*x, *y]),
            _ => None,
        }
    };
    let uses = comparator.insts.len();
    // A bare comparison of the keys, or one with NaN counted greatest.
    let (strict, nan_greatest) = match compare(out) {
        Some(c) if uses == 1 => (c, false),
        _ => {
            let Some([x, y]) = pair(out, |o| matches!(o, Op::Or {})) else {
                return SortPlan::Comparator;
            };
            let (c, nan) = match (compare(x), compare(y)) {
                (Some(c), _) if pair(y, |o| matches!(o, Op::And {})).is_some() => (c, y),
                (_, Some(c)) if pair(x, |o| matches!(o, Op::And {})).is_some() => (c, x),
                _ => return SortPlan::Comparator,
            };
            let Some([u, w]) = pair(nan, |o| matches!(o, Op::And {})) else {
                return SortPlan::Comparator;
            };
            // `s != s` (s is NaN) and `t == t` (t is not), either way round.
            let self_test = |v: ValueId, d: ComparisonDirection| match compare(v) {
                Some((dir, a, b)) if dir == d && a == b => Some(a),
                _ => None,
            };
            let (nan_side, number_side) = match (
                self_test(u, ComparisonDirection::Ne),
                self_test(w, ComparisonDirection::Eq),
                self_test(w, ComparisonDirection::Ne),
                self_test(u, ComparisonDirection::Eq),
            ) {
                (Some(s), Some(t), _, _) | (_, _, Some(s), Some(t)) => (s, t),
                _ => return SortPlan::Comparator,
            };
            if uses != 5 || nan_side / 2 != c.1 / 2 || number_side / 2 != c.1 / 2 {
                return SortPlan::Comparator;
            }
            // Ascending (`a < b`): b NaN and a not puts a first; descending (`a > b`): a NaN.
            let (dir, a, _) = c;
            let lhs_first = a % 2 == 0;
            let ascending = matches!(
                (dir, lhs_first),
                (ComparisonDirection::Lt, true) | (ComparisonDirection::Gt, false)
            );
            let lhs = c.1.min(c.2);
            let want_nan = if ascending { lhs + 1 } else { lhs };
            if nan_side != want_nan || number_side == nan_side {
                return SortPlan::Comparator;
            }
            (c, true)
        }
    };
    let (dir, pa, pb) = strict;
    // Parameters come in pairs: lhs of operand k at 2k, rhs at 2k + 1.
    if pa / 2 != pb / 2 || pa == pb {
        return SortPlan::Comparator;
    }
    let lhs_first = pa % 2 == 0;
    let descending = match (dir, lhs_first) {
        (ComparisonDirection::Lt, true) | (ComparisonDirection::Gt, false) => false,
        (ComparisonDirection::Gt, true) | (ComparisonDirection::Lt, false) => true,
        _ => return SortPlan::Comparator,
    };
    SortPlan::Keys {
        operand: pa / 2,
        descending,
        nan_greatest,
    }
}

/// How many leading elements of each slice along `dimension` the users of `f`'s sort
/// instruction `i` read, when that is all they read: every use of every result is a `slice`
/// that starts at 0 with stride 1 along `dimension` (`Tensor::topk`, a sort then its first
/// `k`), and no result is returned. The rest of each slice is then never read, and a short
/// enough prefix runs as a top-k ([`top_k`]); `None` when a user reads more, or the prefix is
/// the whole slice.
pub fn read_prefix(f: &Func, i: usize) -> Option<usize> {
    let inst = &f.insts[i];
    let Op::Sort { dimension, .. } = inst.op else {
        return None;
    };
    let d = usize::try_from(dimension).ok()?;
    let len = *f.values[inst.results.first()?.index()].shape.get(d)?;
    if inst.results.iter().any(|r| f.outputs.contains(r)) {
        return None;
    }
    let mut prefix = 0;
    for user in &f.insts[i + 1..] {
        if !user.operands.iter().any(|o| inst.results.contains(o)) {
            continue;
        }
        let Op::Slice {
            start_indices,
            limit_indices,
            strides,
        } = &user.op
        else {
            return None;
        };
        if start_indices.get(d) != Some(&0) || strides.get(d) != Some(&1) {
            return None;
        }
        prefix = prefix.max(usize::try_from(*limit_indices.get(d)?).ok()?);
    }
    (prefix < len).then_some(prefix)
}

/// The shortest slice a top-k runs on ([`top_k`]): shorter ones sort whole.
pub const TOP_K_MIN_LEN: usize = 64;

/// A prefix of at most this fraction of its slice runs as a top-k ([`top_k`]). Measured on
/// `[64, 50000]` f32 (docs/performance.md, "topk without a full sort"): the top-k takes a
/// tenth of the whole sort's time at k = 5, half at n / 16 and 0.7 at n / 8.
pub const TOP_K_FRACTION: usize = 8;

/// A `sort` by keys whose users read only the first `k` elements of each slice of `len`
/// (`Tensor::top_k`): the runtime finds each slice's first `k` in one pass over its keys,
/// keeping the candidates under the current `k`-th best key, orders only those and writes
/// only them; the rest of each result slice is never read ([`read_prefix`]) and is left
/// unwritten (zeros).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TopK {
    /// How many leading elements of each slice the users read.
    pub k: usize,
    /// The length of each slice.
    pub len: usize,
}

impl std::fmt::Display for TopK {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "top-k: the first {} of each slice of {} in one pass over the keys (k * {} <= n), \
             then only those ordered and written",
            self.k, self.len, TOP_K_FRACTION
        )
    }
}

/// `f`'s instruction `i` as a top-k, when it is a `sort` by keys ([`SortPlan::Keys`]) whose
/// users read only a prefix of each slice ([`read_prefix`]) of at most a
/// [`TOP_K_FRACTION`]th of slices at least [`TOP_K_MIN_LEN`] long; `None` sorts every slice
/// whole.
pub fn top_k(f: &Func, i: usize) -> Option<TopK> {
    let inst = f.insts.get(i)?;
    key_sort(&inst.op, inst.operands.len())?;
    let k = read_prefix(f, i)?;
    let Op::Sort { dimension, .. } = inst.op else {
        return None;
    };
    let len = *f.values[inst.results.first()?.index()]
        .shape
        .get(usize::try_from(dimension).ok()?)?;
    (len >= TOP_K_MIN_LEN && k.saturating_mul(TOP_K_FRACTION) <= len).then_some(TopK { k, len })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn comparator(body: &str) -> Func {
        let text = format!(
            "func @cmp(%0: f32[], %1: f32[], %2: i32[], %3: i32[]) -> pred[] {{\n{body}\n}}\n"
        );
        kiln_ir::parse_func_text(&text).expect("parses")
    }

    #[test]
    fn a_sort_read_only_through_leading_slices_has_a_prefix() {
        let cmp = "{dimension = 1, is_stable = true, comparator = func @cmp(%0: f32[], %1: f32[]) -> pred[] {\n      %2 = compare %0, %1 {comparison_direction = GT} : pred[]\n      return %2\n    }}";
        let f = |users: &str, ret: &str| {
            kiln_ir::parse_func_text(&format!(
                "func @main(%0: f32[2,100]) -> f32[2,{ret}] {{\n  %1 = sort %0 {cmp} : f32[2,100]\n{users}}}\n"
            ))
            .unwrap_or_else(|e| panic!("{e}"))
        };
        let slice = |v: &str, k: usize| {
            format!(
                "slice {v} {{start_indices = [0, 0], limit_indices = [2, {k}], strides = [1, 1]}} : f32[2,{k}]"
            )
        };
        let two = f(
            &format!(
                "  %2 = {}\n  %3 = {}\n  return %3\n",
                slice("%1", 3),
                slice("%1", 5)
            ),
            "5",
        );
        assert_eq!(read_prefix(&two, 0), Some(5));
        let whole = f(
            &format!("  %2 = {}\n  return %2\n", slice("%1", 100)),
            "100",
        );
        assert_eq!(read_prefix(&whole, 0), None);
        let returned = f("  return %1\n", "100");
        assert_eq!(read_prefix(&returned, 0), None);
        let other = f("  %2 = negate %1 : f32[2,100]\n  return %2\n", "100");
        assert_eq!(read_prefix(&other, 0), None);
        let offset = f(
            "  %2 = slice %1 {start_indices = [0, 1], limit_indices = [2, 4], strides = [1, 1]} : f32[2,3]\n  return %2\n",
            "3",
        );
        assert_eq!(read_prefix(&offset, 0), None);
    }

    #[test]
    fn a_short_prefix_of_a_sort_by_keys_is_a_top_k() {
        let f = |n: usize, k: usize, dir: &str| {
            kiln_ir::parse_func_text(&format!(
                "func @main(%0: f32[2,{n}]) -> f32[2,{k}] {{\n  %1 = sort %0 {{dimension = 1, is_stable = true, comparator = func @cmp(%0: f32[], %1: f32[]) -> pred[] {{\n      %2 = compare %0, %1 {{comparison_direction = {dir}}} : pred[]\n      return %2\n    }}}} : f32[2,{n}]\n  %2 = slice %1 {{start_indices = [0, 0], limit_indices = [2, {k}], strides = [1, 1]}} : f32[2,{k}]\n  return %2\n}}\n"
            ))
            .unwrap_or_else(|e| panic!("{e}"))
        };
        assert_eq!(
            top_k(&f(800, 100, "GT"), 0),
            Some(TopK { k: 100, len: 800 })
        );
        assert_eq!(top_k(&f(800, 1, "LT"), 0), Some(TopK { k: 1, len: 800 }));
        let shown = top_k(&f(800, 5, "GT"), 0).map(|t| t.to_string());
        assert!(
            shown
                .as_deref()
                .is_some_and(|s| s.starts_with("top-k: the first 5 of each slice of 800")),
            "{shown:?}"
        );
        // A prefix over an eighth of the slice, a slice too short, the whole slice, or a
        // comparator the keys do not order by: every slice sorts whole.
        assert_eq!(top_k(&f(800, 101, "GT"), 0), None);
        assert_eq!(top_k(&f(63, 1, "GT"), 0), None);
        assert_eq!(top_k(&f(800, 800, "GT"), 0), None);
        assert_eq!(top_k(&f(800, 5, "LE"), 0), None);
        // Not a sort.
        assert_eq!(top_k(&f(800, 5, "GT"), 1), None);
    }

    #[test]
    fn key_comparators_are_recognized_and_others_are_not() {
        let lt =
            comparator("  %4 = compare %0, %1 {comparison_direction = LT} : pred[]\n  return %4");
        assert_eq!(
            sort_plan(&lt, 2),
            SortPlan::Keys {
                operand: 0,
                descending: false,
                nan_greatest: false
            }
        );
        let gt =
            comparator("  %4 = compare %2, %3 {comparison_direction = GT} : pred[]\n  return %4");
        assert_eq!(
            sort_plan(&gt, 2),
            SortPlan::Keys {
                operand: 1,
                descending: true,
                nan_greatest: false
            }
        );
        let swapped =
            comparator("  %4 = compare %1, %0 {comparison_direction = LT} : pred[]\n  return %4");
        assert_eq!(
            sort_plan(&swapped, 2),
            SortPlan::Keys {
                operand: 0,
                descending: true,
                nan_greatest: false
            }
        );
        // NaN counted greatest, ascending (b is NaN) and descending (a is NaN).
        let asc = comparator(
            "  %4 = compare %0, %1 {comparison_direction = LT} : pred[]\n  %5 = compare %1, %1 {comparison_direction = NE} : pred[]\n  %6 = compare %0, %0 {comparison_direction = EQ} : pred[]\n  %7 = and %5, %6 : pred[]\n  %8 = or %4, %7 : pred[]\n  return %8",
        );
        assert_eq!(
            sort_plan(&asc, 2),
            SortPlan::Keys {
                operand: 0,
                descending: false,
                nan_greatest: true
            }
        );
        let desc = comparator(
            "  %4 = compare %0, %1 {comparison_direction = GT} : pred[]\n  %5 = compare %0, %0 {comparison_direction = NE} : pred[]\n  %6 = compare %1, %1 {comparison_direction = EQ} : pred[]\n  %7 = and %5, %6 : pred[]\n  %8 = or %4, %7 : pred[]\n  return %8",
        );
        assert_eq!(
            sort_plan(&desc, 2),
            SortPlan::Keys {
                operand: 0,
                descending: true,
                nan_greatest: true
            }
        );
        // NaN on the wrong side: NaN least, which the keys do not do.
        let wrong = comparator(
            "  %4 = compare %0, %1 {comparison_direction = LT} : pred[]\n  %5 = compare %0, %0 {comparison_direction = NE} : pred[]\n  %6 = compare %1, %1 {comparison_direction = EQ} : pred[]\n  %7 = and %5, %6 : pred[]\n  %8 = or %4, %7 : pred[]\n  return %8",
        );
        assert_eq!(sort_plan(&wrong, 2), SortPlan::Comparator);
        // Not strict, across operands, or more than one compare: the comparator runs.
        for body in [
            "  %4 = compare %0, %1 {comparison_direction = LE} : pred[]\n  return %4",
            "  %4 = compare %0, %0 {comparison_direction = LT} : pred[]\n  return %4",
            "  %4 = negate %0 : f32[]\n  %5 = compare %4, %1 {comparison_direction = LT} : pred[]\n  return %5",
        ] {
            assert_eq!(
                sort_plan(&comparator(body), 2),
                SortPlan::Comparator,
                "{body}"
            );
        }
    }
}
