//! Donated parameters: results written in place into their buffers (elementwise updates, and
//! GEMMs whose epilogue is an SGD-style update), agreeing with the reference and with the same
//! program compiled without donation; parameters that must stay intact are never overwritten.

mod common;

use common::{close, random_args};
use kiln_codegen_llvm::cpu::{CpuExecutable, describe_memory_donating};
use kiln_ir::{Func, Literal};
use std::borrow::Cow;

/// `w - 0.01 * (x^T d)` and `b - 0.01 * sum_rows(d)`: an SGD step of a linear layer's weights
/// and bias, with a batch (the contraction) of `k` rows.
fn sgd_step(k: usize) -> Func {
    kiln_ir::parse_func_text(&format!(
        "func @main(%0: f32[48,40], %1: f32[40], %2: f32[{k},48], %3: f32[{k},40]) -> (f32[48,40], f32[40]) {{
  %4 = dot_general %2, %3 {{lhs_batching_dimensions = [], rhs_batching_dimensions = [], lhs_contracting_dimensions = [0], rhs_contracting_dimensions = [0]}} : f32[48,40]
  %5 = constant {{value = 0.01}} : f32[]
  %6 = broadcast_in_dim %5 {{broadcast_dimensions = []}} : f32[48,40]
  %7 = multiply %4, %6 : f32[48,40]
  %8 = subtract %0, %7 : f32[48,40]
  %9 = constant {{value = 0.0}} : f32[]
  %10 = reduce %3, %9 {{dimensions = [0], kind = add}} : f32[40]
  %11 = broadcast_in_dim %5 {{broadcast_dimensions = []}} : f32[40]
  %12 = multiply %11, %10 : f32[40]
  %13 = subtract %1, %12 : f32[40]
  return %8, %13
}}
"
    ))
    .unwrap()
}

/// Runs `e` donating the parameters marked in `donated` (the others lent); returns the
/// results and, per output, whether it lives in the buffer of the donated parameter of the
/// same position.
fn run_donating(
    e: &CpuExecutable,
    args: &[Literal],
    donated: &[bool],
) -> (Vec<Literal>, Vec<bool>) {
    let mut owned: Vec<Literal> = args.to_vec();
    let addrs: Vec<*mut u8> = owned.iter_mut().map(|l| l.as_mut_ptr()).collect();
    let mut lent = Vec::new();
    let mut given = Vec::new();
    for (l, &d) in owned.into_iter().zip(donated) {
        if d {
            given.push(Some(l));
            lent.push(None);
        } else {
            given.push(None);
            lent.push(Some(l));
        }
    }
    let cows: Vec<Cow<'_, Literal>> = given
        .into_iter()
        .zip(&lent)
        .map(|(g, l)| match g {
            Some(g) => Cow::Owned(g),
            None => Cow::Borrowed(l.as_ref().unwrap()),
        })
        .collect();
    let mut outs = e.call_donating(cows).unwrap();
    let same = outs
        .iter_mut()
        .enumerate()
        .map(|(i, o)| addrs.get(i) == Some(&o.as_mut_ptr()))
        .collect();
    (outs, same)
}

#[test]
fn sgd_updates_run_in_place_in_donated_buffers() {
    // 200: one contraction block, bit for bit the epilogue's arithmetic; 1100: several blocks,
    // each folded into the weights on its own.
    for (k, exact) in [(200, true), (1100, false)] {
        let f = sgd_step(k);
        let args = random_args(&f, k as u64);
        let want = kiln_reference::eval(&f, &args).unwrap();
        let plain = CpuExecutable::compile_with_cache(&f, None)
            .unwrap()
            .run(&args)
            .unwrap();
        let donated = [true, true, false, false];
        let e = CpuExecutable::compile_donating(&f, &donated, None).unwrap();
        assert_eq!(
            e.memory_plan().in_place.len(),
            2,
            "both updates in place:\n{}",
            e.memory_plan()
        );
        let (got, same) = run_donating(&e, &args, &donated);
        assert_eq!(
            same,
            [true, true],
            "k = {k}: results live in the donated buffers"
        );
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            close(g, w).unwrap_or_else(|m| panic!("k = {k}, output {i}: {m}"));
        }
        if exact {
            assert_eq!(
                got[0], plain[0],
                "k = {k}: in place is the epilogue's arithmetic"
            );
        }
        assert_eq!(
            got[1], plain[1],
            "k = {k}: the bias update is elementwise either way"
        );
        // Lent instead of donated: the program works on copies and the caller's values stay.
        let lent = e.run(&args).unwrap();
        assert_eq!(lent, got, "k = {k}");
        assert_eq!(
            args,
            random_args(&f, k as u64),
            "k = {k}: lent arguments unchanged"
        );
    }
}

#[test]
fn only_parameters_read_last_at_their_own_positions_are_overwritten() {
    // %1 is returned as it is, and %2 is read at mirrored positions by the kernel that reads it
    // last (%5): neither may be overwritten. %0's last reader is the one kernel computing %9
    // (%3, %6 and %7 fused into it), which reads it only where it writes: in place.
    let f = kiln_ir::parse_func_text(
        "func @main(%0: f32[64], %1: f32[64], %2: f32[64]) -> (f32[64], f32[64], f32[64], f32[64]) {
  %3 = exponential %0 : f32[64]
  %4 = reverse %2 {dimensions = [0]} : f32[64]
  %5 = add %4, %2 : f32[64]
  %6 = subtract %0, %1 : f32[64]
  %7 = multiply %6, %3 : f32[64]
  %8 = add %1, %1 : f32[64]
  %9 = add %7, %0 : f32[64]
  return %9, %1, %5, %8
}
",
    )
    .unwrap();
    let args = random_args(&f, 3);
    let want = kiln_reference::eval(&f, &args).unwrap();
    let donated = [true, true, true];
    let e = CpuExecutable::compile_donating(&f, &donated, None).unwrap();
    let plan = describe_memory_donating(&f, &donated, &common::env_options()).unwrap();
    let params: Vec<usize> = e
        .memory_plan()
        .in_place
        .iter()
        .map(|(_, p)| p.index())
        .collect();
    assert_eq!(params, [0], "only %0 is overwritten:\n{plan}");
    let (got, same) = run_donating(&e, &args, &donated);
    // %9 is written into %0's buffer; %1, returned unchanged, moves out in its own.
    assert_eq!(same, [true, true, false, false]);
    for (g, w) in got.iter().zip(&want) {
        close(g, w).unwrap();
    }
}

#[test]
fn a_multi_output_kernel_updates_several_donated_parameters() {
    // Two bias updates over the same index space run as one loop nest; each result goes into
    // its own parameter's buffer (one the kernel's result, one an extra output).
    let f = kiln_ir::parse_func_text(
        "func @main(%0: f32[96], %1: f32[96], %2: f32[50,96], %3: f32[50,96]) -> (f32[96], f32[96]) {
  %4 = constant {value = 0.0} : f32[]
  %5 = constant {value = 0.01} : f32[]
  %6 = broadcast_in_dim %5 {broadcast_dimensions = []} : f32[96]
  %7 = reduce %2, %4 {dimensions = [0], kind = add} : f32[96]
  %8 = multiply %6, %7 : f32[96]
  %9 = subtract %0, %8 : f32[96]
  %10 = reduce %3, %4 {dimensions = [0], kind = add} : f32[96]
  %11 = multiply %6, %10 : f32[96]
  %12 = subtract %1, %11 : f32[96]
  return %9, %12
}
",
    )
    .unwrap();
    let args = random_args(&f, 9);
    let want = kiln_reference::eval(&f, &args).unwrap();
    let fusion = kiln_codegen_llvm::cpu::describe_fusion(&f, &common::env_options()).unwrap();
    assert!(fusion.contains("// 1 kernels"), "{fusion}");
    let donated = [true, true, false, false];
    let e = CpuExecutable::compile_donating(&f, &donated, None).unwrap();
    assert_eq!(e.memory_plan().in_place.len(), 2, "{}", e.memory_plan());
    let (got, same) = run_donating(&e, &args, &donated);
    assert_eq!(same, [true, true]);
    for (g, w) in got.iter().zip(&want) {
        close(g, w).unwrap();
    }
}

#[test]
fn an_update_written_before_a_later_reader_is_scheduled_after_it_and_runs_in_place() {
    // The update of %0 comes first in program order and the loss (a reduction over %0) after
    // it, so in program order the update is not %0's last reader and cannot overwrite it. The
    // schedule runs the loss first; the update then writes into %0's buffer.
    let f = kiln_ir::parse_func_text(
        "func @main(%0: f32[64], %1: f32[64]) -> (f32[64], f32[]) {
  %2 = constant {value = 0.1} : f32[]
  %3 = broadcast_in_dim %2 {broadcast_dimensions = []} : f32[64]
  %4 = multiply %1, %3 : f32[64]
  %5 = subtract %0, %4 : f32[64]
  %6 = constant {value = 0.0} : f32[]
  %7 = multiply %0, %0 : f32[64]
  %8 = reduce %7, %6 {dimensions = [0], kind = add} : f32[]
  return %5, %8
}
",
    )
    .unwrap();
    let args = random_args(&f, 11);
    let want = kiln_reference::eval(&f, &args).unwrap();
    let donated = [true, false];
    let plan = describe_memory_donating(&f, &donated, &common::env_options()).unwrap();
    assert!(
        plan.contains("schedule: 1 step(s) moved earlier"),
        "the loss moves before the update:\n{plan}"
    );
    let e = CpuExecutable::compile_donating(&f, &donated, None).unwrap();
    assert_eq!(e.memory_plan().in_place.len(), 1, "{plan}");
    let (got, same) = run_donating(&e, &args, &donated);
    assert_eq!(same, [true, false], "the update lives in %0's buffer");
    for (g, w) in got.iter().zip(&want) {
        close(g, w).unwrap();
    }
    // Without donation there is nothing to gain: program order stays.
    let plain = describe_memory_donating(&f, &[false, false], &common::env_options()).unwrap();
    assert!(plain.contains("schedule: program order"), "{plain}");
}

/// A product stored fresh (`x w`) and products folded into donated parameters (`w - s xᵀ d`,
/// `v + s xᵀ e`, and a classifier's narrow `u - s xᵀ g` on the compact tile) in one program,
/// all of one tile shape: the tile routines take the update mode as an argument, so these
/// share them. Every result agrees with the reference and, over one contraction block, bit
/// for bit with the program compiled without donation (`C + (-s) P` rounds as `C - s P`).
#[test]
fn products_stored_and_folded_in_place_share_their_tile_routines() {
    let dot = |a: &str, b: &str, ca: usize, cb: usize, ty: &str| {
        format!(
            "dot_general {a}, {b} {{lhs_batching_dimensions = [], rhs_batching_dimensions = [], lhs_contracting_dimensions = [{ca}], rhs_contracting_dimensions = [{cb}]}} : {ty}"
        )
    };
    for k in [64, 700] {
        let src = format!(
            "func @main(%0: f32[48,300], %1: f32[48,300], %2: f32[48,10], %3: f32[{k},48], %4: f32[{k},300], %5: f32[{k},300], %6: f32[{k},10]) -> (f32[48,300], f32[48,300], f32[48,10], f32[{k},300]) {{
  %7 = {}
  %8 = constant {{value = 0.01}} : f32[]
  %9 = broadcast_in_dim %8 {{broadcast_dimensions = []}} : f32[48,300]
  %10 = multiply %7, %9 : f32[48,300]
  %11 = subtract %0, %10 : f32[48,300]
  %12 = {}
  %13 = multiply %12, %9 : f32[48,300]
  %14 = add %1, %13 : f32[48,300]
  %15 = {}
  %16 = broadcast_in_dim %8 {{broadcast_dimensions = []}} : f32[48,10]
  %17 = multiply %16, %15 : f32[48,10]
  %18 = subtract %2, %17 : f32[48,10]
  %19 = {}
  return %11, %14, %18, %19
}}
",
            dot("%3", "%4", 0, 0, "f32[48,300]"),
            dot("%3", "%5", 0, 0, "f32[48,300]"),
            dot("%3", "%6", 0, 0, "f32[48,10]"),
            dot("%3", "%0", 1, 0, &format!("f32[{k},300]")),
        );
        let f = kiln_ir::parse_func_text(&src).unwrap_or_else(|e| panic!("{src}: {e}"));
        let args = random_args(&f, k as u64 + 7);
        let want = kiln_reference::eval(&f, &args).unwrap();
        let plain = CpuExecutable::compile_with_cache(&f, None)
            .unwrap()
            .run(&args)
            .unwrap();
        let donated = [true, true, true, false, false, false, false];
        let e = CpuExecutable::compile_donating(&f, &donated, None).unwrap();
        assert_eq!(
            e.memory_plan().in_place.len(),
            3,
            "k = {k}: the three updates in place:\n{}",
            e.memory_plan()
        );
        let (got, same) = run_donating(&e, &args, &donated);
        assert_eq!(same, [true, true, true, false], "k = {k}");
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            close(g, w).unwrap_or_else(|m| panic!("k = {k}, output {i}: {m}"));
        }
        // The forward product reads %0 before its update overwrites it.
        assert_eq!(got[3], plain[3], "k = {k}: the fresh product");
        if k == 64 {
            assert_eq!(
                got[..3],
                plain[..3],
                "k = {k}: in place is the epilogue's arithmetic"
            );
        }
    }
}

/// `w - 0.01 (x · d)` with `w` `[m, 300]`, `x` of shape `x` and `d` of shape `d` contracted
/// along dimensions `ca` and `cb`, compiled with `w` donated: asserts that the update runs in
/// place, that a kernel takes the path `took`, and that the result agrees with the reference
/// and, bit for bit, with the program compiled without donation (the product folded into
/// `w` once, as the epilogue computes it). `what` names the case in failures.
fn folds_in_place(
    what: &str,
    m: usize,
    (x, d, ca, cb): (&str, &str, usize, usize),
    seed: u64,
    took: impl Fn(&kiln_codegen_llvm::cpu::KernelPath) -> bool,
) {
    let src = format!(
        "func @main(%0: f32[{m},300], %1: f32[{x}], %2: f32[{d}]) -> f32[{m},300] {{
  %3 = dot_general %1, %2 {{lhs_batching_dimensions = [], rhs_batching_dimensions = [], lhs_contracting_dimensions = [{ca}], rhs_contracting_dimensions = [{cb}]}} : f32[{m},300]
  %4 = constant {{value = 0.01}} : f32[]
  %5 = broadcast_in_dim %4 {{broadcast_dimensions = []}} : f32[{m},300]
  %6 = multiply %3, %5 : f32[{m},300]
  %7 = subtract %0, %6 : f32[{m},300]
  return %7
}}
"
    );
    let f = kiln_ir::parse_func_text(&src).unwrap_or_else(|e| panic!("{src}: {e}"));
    let args = random_args(&f, seed);
    let want = kiln_reference::eval(&f, &args).unwrap();
    let plain = CpuExecutable::compile_with_cache(&f, None)
        .unwrap()
        .run(&args)
        .unwrap();
    let donated = [true, false, false];
    let e = CpuExecutable::compile_donating(&f, &donated, None).unwrap();
    assert_eq!(e.memory_plan().in_place.len(), 1, "{what}");
    assert!(
        e.kernel_paths().iter().any(took),
        "{what}: {:?}",
        e.kernel_paths()
    );
    let (got, same) = run_donating(&e, &args, &donated);
    assert_eq!(same, [true], "{what}");
    close(&got[0], &want[0]).unwrap_or_else(|m| panic!("{what}: {m}"));
    assert_eq!(
        got[0], plain[0],
        "{what}: in place is the epilogue's arithmetic"
    );
}

/// An SGD step of a layer with a few inputs, `w - s xᵀ d` with `w` `[4, 300]` (and `w - s x
/// dᵀ`, B stored transposed): the product streams B (four rows), accumulates its whole
/// contraction and folds it into the donated `w` once, so in place it agrees with the
/// reference and, bit for bit, with the program compiled without donation, over one pass of
/// contraction steps or many.
#[test]
fn a_streamed_product_folds_into_its_donated_parameter() {
    // B by rows (A stored transposed), then B stored transposed (by dot products).
    for k in [5, 64, 700] {
        for (x, d, ca, cb) in [
            (format!("{k},4"), format!("{k},300"), 0, 0),
            (format!("4,{k}"), format!("300,{k}"), 1, 1),
        ] {
            folds_in_place(
                &format!("k = {k}, contracting {ca}"),
                4,
                (&x, &d, ca, cb),
                k as u64 + 11,
                |p| p.gemm == Some(kiln_codegen_llvm::cpu::GemmBlocking::Streamed),
            );
        }
    }
}

#[test]
fn a_products_tail_tiles_fold_into_its_donated_parameter() {
    // A weight update whose rows leave a block's last tile short (37 to 47 rows past whole
    // tiles of 14, 8 or 6): the tail tiles fold their rows in place as the whole tiles do, bit
    // for bit the epilogue's `W - 0.01 P` (one contraction block), A stored transposed (a
    // weight gradient's `xᵀ d`) and by rows.
    for (m, a_trans) in [(37, true), (41, true), (45, false), (47, false)] {
        let (x, ca) = if a_trans {
            (format!("260,{m}"), 0)
        } else {
            (format!("{m},260"), 1)
        };
        folds_in_place(
            &format!("{m} rows"),
            m,
            (&x, "260,300", ca, 0),
            m as u64,
            |p| p.gemm.is_some() && p.tail_tiles,
        );
    }
}
