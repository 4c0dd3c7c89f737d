//! The kernel layer's rewrites keep source locations: what a rewrite builds for an instruction
//! has that instruction's location (the user's line), and none when it has none, never a line
//! of the rewrite's own code or of Rust's library, so a later error names the user's operation
//! and, where there is one, the user's line. Each family of rewrites: the canonicalizations
//! that rebuild a function instruction by instruction (`canon::rebuild`), the expansion of
//! elementwise regions (`reduce_tree`), the split of complex values (`complex`, and its
//! region ops), and small floats held in wider ones (`minifloat`).

use kiln_ir::{Func, Loc, parse_func_text};
use kiln_kernel::TargetInfo;

/// Where the test's "user" wrote every instruction of a located function.
const USER: Loc = Loc {
    file: "model.rs",
    line: 7,
    column: 5,
};

/// The location of every instruction of `f` and of its regions, region instructions after
/// their op's.
fn locations(f: &Func) -> Vec<Option<Loc>> {
    let mut out = Vec::new();
    for inst in &f.insts {
        out.push(inst.loc);
        for r in inst.op.regions() {
            out.extend(locations(r));
        }
    }
    out
}

/// Runs `rewrite` on `src` as parsed (no locations), then with every top-level instruction at
/// [`USER`]: the first result has no location anywhere; in the second each top-level
/// instruction has the user's location or none (what belongs to no instruction: a parameter's
/// or result's conversion), some have it, and the rewrite changed the function.
fn check(name: &str, src: &str, rewrite: impl Fn(&Func) -> Func) {
    let f = parse_func_text(src).unwrap_or_else(|e| panic!("{name}: {e}"));
    let g = rewrite(&f);
    assert_ne!(g, f, "{name}: the rewrite changed nothing");
    let wrong: Vec<Loc> = locations(&g).into_iter().flatten().collect();
    assert!(
        wrong.is_empty(),
        "{name}: a rewrite of instructions without a location gave its own code's: {wrong:?}\n{g}"
    );
    let mut located = f.clone();
    for inst in &mut located.insts {
        inst.loc = Some(USER);
    }
    let g = rewrite(&located);
    let top: Vec<Option<Loc>> = g.insts.iter().map(|i| i.loc).collect();
    assert!(
        top.iter().all(|l| l.is_none() || *l == Some(USER)),
        "{name}: {top:?}\n{g}"
    );
    assert!(top.contains(&Some(USER)), "{name}: {top:?}\n{g}");
}

#[test]
fn canonicalizations_keep_the_instructions_locations() {
    // An f16 product into f32 (its operands converted, by the builder's helpers) and an
    // instruction kept as it is.
    check(
        "canonicalize_dots",
        "func @main(%0: f16[4,3], %1: f16[3,2]) -> f32[4,2] {\n  %2 = dot_general %0, %1 {lhs_batching_dimensions = [], rhs_batching_dimensions = [], lhs_contracting_dimensions = [1], rhs_contracting_dimensions = [0]} : f32[4,2]\n  %3 = negate %2 : f32[4,2]\n  return %3\n}\n",
        |f| kiln_kernel::canon::widen_dots(f, false).unwrap(),
    );
}

#[test]
fn expanded_regions_keep_the_instructions_locations() {
    check(
        "expand_region_reduces",
        "func @main(%0: f32[5], %1: f32[5]) -> f32[5] {\n  %2 = map %0, %1 {dimensions = [0], computation = func @g(%0: f32[], %1: f32[]) -> f32[] {\n      %2 = multiply %0, %1 : f32[]\n      %3 = add %2, %0 : f32[]\n      return %3\n    }} : f32[5]\n  %3 = negate %2 : f32[5]\n  return %3\n}\n",
        |f| kiln_kernel::reduce_tree::expand_region_reduces(f, &TargetInfo::reference()).unwrap(),
    );
}

#[test]
fn split_complex_values_keep_the_instructions_locations() {
    // Products on parts (the builder's helpers), an op kept on complex values (joined and
    // split again), and a sort whose regions take the parts.
    check(
        "split_complex",
        "func @main(%0: c64[3], %1: c64[3]) -> c64[3] {\n  %2 = multiply %0, %1 : c64[3]\n  %3 = sqrt %2 : c64[3]\n  return %3\n}\n",
        |f| kiln_kernel::complex::split_complex(f).unwrap(),
    );
    check(
        "split_complex (sort)",
        "func @main(%0: c64[6], %1: i32[6]) -> (c64[6], i32[6]) {\n  %2, %3 = sort %0, %1 {dimension = 0, is_stable = true, comparator = func @lt(%0: c64[], %1: c64[], %2: i32[], %3: i32[]) -> pred[] {\n      %4 = real %0 : f32[]\n      %5 = real %1 : f32[]\n      %6 = compare %4, %5 {comparison_direction = LT} : pred[]\n      return %6\n    }} : c64[6], i32[6]\n  return %2, %3\n}\n",
        |f| kiln_kernel::complex::split_complex(f).unwrap(),
    );
}

#[test]
fn small_floats_keep_the_instructions_locations() {
    check(
        "expand_minifloats",
        "func @main(%0: f8e4m3fn[4], %1: f32[4]) -> f8e4m3fn[4] {\n  %2 = convert %1 : f8e4m3fn[4]\n  %3 = add %0, %2 : f8e4m3fn[4]\n  return %3\n}\n",
        |f| kiln_kernel::minifloat::expand_minifloats(f).unwrap(),
    );
}
