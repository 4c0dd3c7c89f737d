//! The kernels of `cholesky`, `triangular_solve` and `lu` (`MapKind::Linalg`) and of sorts by
//! any comparator (the merge sort, a thread per slice), in every dtype they take (complex
//! solves on their parts too) and every form of a solve, rendered for sm_80 and sm_90 and
//! assembled by ptxas (as `ptx.rs` does the kernels of the spec examples and the random
//! programs).

use kiln_codegen_llvm::ptx::{PtxTarget, mapped_kernels, program_ptx};
use kiln_ir::parse_func_text;
use kiln_kernel::gpu::ir::MapKind;
use kiln_kernel::target::TargetInfo;

mod ptxas;

/// The programs, each with the mapping of its one launch.
fn programs() -> Vec<(String, MapKind)> {
    let mut out = Vec::new();
    for dt in ["f16", "bf16", "f32", "f64"] {
        let t = format!("{dt}[3,5,5]");
        for lower in [true, false] {
            out.push((
                format!(
                    "func @main(%0: {t}) -> {t} {{\n  %1 = cholesky %0 {{lower = {lower}}} : {t}\n  return %1\n}}\n"
                ),
                MapKind::Linalg,
            ));
        }
        out.push((
            format!(
                "func @main(%0: {t}) -> ({t}, i32[3,5], i32[3,5]) {{\n  %1, %2, %3 = lu %0 : {t}, i32[3,5], i32[3,5]\n  return %1, %2, %3\n}}\n"
            ),
            MapKind::Linalg,
        ));
        for left in [true, false] {
            for lower in [true, false] {
                for unit in [true, false] {
                    for tr in ["NO_TRANSPOSE", "TRANSPOSE", "ADJOINT"] {
                        let b = if left {
                            format!("{dt}[3,5,2]")
                        } else {
                            format!("{dt}[3,2,5]")
                        };
                        out.push((
                            format!(
                                "func @main(%0: {t}, %1: {b}) -> {b} {{\n  %2 = triangular_solve %0, %1 {{left_side = {left}, lower = {lower}, unit_diagonal = {unit}, transpose_a = {tr}}} : {b}\n  return %2\n}}\n"
                            ),
                            MapKind::Linalg,
                        ));
                    }
                }
            }
        }
        // A float `LT` (NaN unordered), and an order by absolute value.
        let s = format!("{dt}[4,37]");
        for body in [
            "      %2 = compare %0, %1 {comparison_direction = LT} : pred[]\n      return %2\n"
                .to_string(),
            format!(
                "      %2 = abs %0 : {dt}[]\n      %3 = abs %1 : {dt}[]\n      %4 = compare %2, %3 {{comparison_direction = LT}} : pred[]\n      return %4\n"
            ),
        ] {
            out.push((
                format!(
                    "func @main(%0: {s}) -> {s} {{\n  %1 = sort %0 {{dimension = 1, is_stable = true, comparator = func @c(%0: {dt}[], %1: {dt}[]) -> pred[] {{\n{body}    }}}} : {s}\n  return %1\n}}\n"
                ),
                MapKind::Sort,
            ));
        }
    }
    // Complex solves, on the numbers' parts.
    for dt in ["c64", "c128"] {
        for (left, tr) in [(true, "ADJOINT"), (false, "NO_TRANSPOSE")] {
            let b = if left { "[2,4,3]" } else { "[2,3,4]" };
            out.push((
                format!(
                    "func @main(%0: {dt}[2,4,4], %1: {dt}{b}) -> {dt}{b} {{\n  %2 = triangular_solve %0, %1 {{left_side = {left}, lower = true, unit_diagonal = false, transpose_a = {tr}}} : {dt}{b}\n  return %2\n}}\n"
                ),
                MapKind::Linalg,
            ));
        }
    }
    // Two operands, two keys, along the outer dimension.
    out.push((
        "func @main(%0: f32[30,3], %1: i32[30,3]) -> (f32[30,3], i32[30,3]) {\n  %2, %3 = sort %0, %1 {dimension = 0, is_stable = true, comparator = func @c(%0: f32[], %1: f32[], %2: i32[], %3: i32[]) -> pred[] {\n      %4 = compare %0, %1 {comparison_direction = LT} : pred[]\n      %5 = compare %0, %1 {comparison_direction = EQ} : pred[]\n      %6 = compare %2, %3 {comparison_direction = GT} : pred[]\n      %7 = and %5, %6 : pred[]\n      %8 = or %4, %7 : pred[]\n      return %8\n    }} : f32[30,3], i32[30,3]\n  return %2, %3\n}\n".to_string(),
        MapKind::Sort,
    ));
    out
}

#[test]
fn linalg_and_merge_sort_kernels_assemble_for_sm_80_and_sm_90() {
    let gpu = TargetInfo::h200();
    let dir = std::env::temp_dir().join(format!("kiln-ptx-linalg-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let ptxas = ptxas::ptxas();
    let mut failures = Vec::new();
    let mut assembled = 0;
    for (i, (src, kind)) in programs().iter().enumerate() {
        let f = parse_func_text(src).unwrap_or_else(|e| panic!("program {i}: {e}\n{src}"));
        let ks = mapped_kernels(&f, &kiln_kernel::Options::default(), &gpu).unwrap();
        let [(name, Ok(p))] = &ks[..] else {
            failures.push(format!("program {i}: kernels {ks:?}\n{src}"));
            continue;
        };
        let kinds: Vec<MapKind> = p.launches.iter().map(|l| l.kind).collect();
        if kinds != [*kind] {
            failures.push(format!("program {i} {name}: launches {kinds:?}\n{src}"));
            continue;
        }
        for target in [PtxTarget::sm80(), PtxTarget::sm90()] {
            let text = match program_ptx(p, &target) {
                Ok(t) => t,
                Err(e) => {
                    failures.push(format!("program {i} ({}): {e}\n{src}", target.sm));
                    continue;
                }
            };
            let Some(ptxas) = &ptxas else { continue };
            let stem = format!("{i}-{}", target.sm);
            match ptxas::assemble(ptxas, &dir, &stem, &target.sm, &[], &text) {
                (true, _) => assembled += 1,
                (false, msg) => failures.push(format!(
                    "program {i} ({}): ptxas rejected it: {msg}\n{src}",
                    target.sm
                )),
            }
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    println!("ptxas assembled {assembled} linear algebra and merge sort kernels");
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
