//! The kernel verifier: malformed kernels (each a real kernel lowered or fused from a small
//! function, then broken) are rejected with a message naming the problem, and every kernel
//! of the random programs verifies.

use kiln_ir::random::{Config, Rng, random_func};
use kiln_ir::{DType, Func, OpKind, TensorType, parse_func_text};
use kiln_kernel::Options;
use kiln_kernel::fuse::Fused;
use kiln_kernel::kernel::{Cond, Ew, Expr, Idx, Kernel, Schedule};
use kiln_kernel::pipeline::{fused_kernels, kernels};
use kiln_kernel::verify::{KernelError, verify_fused, verify_kernel, verify_lowered};

fn func(src: &str) -> Func {
    parse_func_text(src).unwrap_or_else(|e| panic!("{e}\n{src}"))
}

/// The kernel of instruction `i` of `src` as lowered, with its inputs' types; it verifies.
fn lowered(src: &str, i: usize) -> (Kernel, Vec<TensorType>) {
    let f = func(src);
    let k = kernels(&f)[i].clone().expect("a kernel");
    let inputs: Vec<TensorType> = f.insts[i]
        .operands
        .iter()
        .map(|v| f.values[v.index()].clone())
        .collect();
    verify_kernel(&k, &inputs).unwrap_or_else(|e| panic!("the real kernel fails: {e}"));
    (k, inputs)
}

/// The fused kernels of `src`, with the function; they verify.
fn fused(src: &str) -> (Func, Fused) {
    let f = func(src);
    let fz = fused_kernels(
        &f,
        &Options::default(),
        &kiln_kernel::TargetInfo::reference(),
    );
    verify_fused(&f, &fz).unwrap_or_else(|e| panic!("the real kernels fail: {e}"));
    (f, fz)
}

/// The error for `k` (over `inputs`), which must name `problem`.
fn rejects(k: &Kernel, inputs: &[TensorType], problem: &str) -> KernelError {
    let e = verify_kernel(k, inputs).expect_err("a malformed kernel verified");
    assert!(
        e.to_string().contains(problem),
        "expected `{problem}` in: {e}"
    );
    e
}

const ADD: &str = "func @main(%0: f32[2,3], %1: f32[2,3]) -> f32[2,3] {
  %2 = add %0, %1 : f32[2,3]
  return %2
}
";

const REDUCE: &str = "func @main(%0: f32[2,3]) -> f32[2] {
  %1 = constant {value = 0.0} : f32[]
  %2 = reduce %0, %1 {dimensions = [1], kind = add} : f32[2]
  return %2
}
";

const PAD: &str = "func @main(%0: f32[2,3]) -> f32[4,5] {
  %1 = constant {value = 0.0} : f32[]
  %2 = pad %0, %1 {edge_padding_low = [1, 1], edge_padding_high = [1, 1], interior_padding = [0, 0]} : f32[4,5]
  return %2
}
";

const MATMUL_BIAS: &str = "func @main(%0: f32[2,3], %1: f32[3,4], %2: f32[4]) -> f32[2,4] {
  %3 = dot_general %0, %1 {lhs_batching_dimensions = [], rhs_batching_dimensions = [], lhs_contracting_dimensions = [1], rhs_contracting_dimensions = [0]} : f32[2,4]
  %4 = broadcast_in_dim %2 {broadcast_dimensions = [1]} : f32[2,4]
  %5 = add %3, %4 : f32[2,4]
  return %5
}
";

/// The operands of the body's top op.
fn args(k: &mut Kernel) -> &mut Vec<Expr> {
    match &mut k.body {
        Expr::Op { args, .. } => args,
        e => panic!("not an op: {e:?}"),
    }
}

fn reduce_parts(k: &mut Kernel) -> (&mut Expr, &mut Vec<(usize, usize)>, &mut Expr) {
    match &mut k.body {
        Expr::Reduce {
            init, vars, body, ..
        } => (init, vars, body),
        e => panic!("not a reduction: {e:?}"),
    }
}

#[test]
fn undefined_loop_variable() {
    let (mut k, inputs) = lowered(ADD, 0);
    if let Expr::Load { coef, .. } = &mut args(&mut k)[1] {
        coef.push(5);
    }
    let e = rejects(
        &k,
        &inputs,
        "loop variable v2 is not defined here (in scope: v0 < 2, v1 < 3)",
    );
    assert_eq!(e.at, "body > add f32 > load in1 f32");
}

#[test]
fn reduction_variable_used_outside_its_reduction() {
    // The starting value is outside the reduction: its variable v1 is not bound there.
    let (mut k, inputs) = lowered(REDUCE, 1);
    let (init, _, _) = reduce_parts(&mut k);
    *init = Expr::Load {
        input: 1,
        dtype: DType::F32,
        coef: vec![0, 1],
        off: 0,
    };
    let e = rejects(
        &k,
        &inputs,
        "loop variable v1 is not defined here (in scope: v0 < 2)",
    );
    assert_eq!(e.at, "body > reduce add f32 > init > load in1 f32");
}

#[test]
fn reduction_rebinding_an_output_variable() {
    let (mut k, inputs) = lowered(REDUCE, 1);
    reduce_parts(&mut k).1[0].0 = 0;
    rejects(&k, &inputs, "binds v0 again: it is an output loop variable");
}

#[test]
fn reduction_binding_past_the_variable_count() {
    let (mut k, inputs) = lowered(REDUCE, 1);
    reduce_parts(&mut k).1[0].0 = 7;
    rejects(&k, &inputs, "binds v7, but the kernel has 2 loop variables");
}

#[test]
fn load_past_the_end_of_its_input() {
    let (mut k, inputs) = lowered(ADD, 0);
    if let Expr::Load { off, .. } = &mut args(&mut k)[0] {
        *off = 1;
    }
    rejects(
        &k,
        &inputs,
        "the load reads elements 1..=6 of an input of 6 (f32[2,3]): the index map leaves the buffer",
    );
}

#[test]
fn reduction_reading_past_its_row() {
    // The reduction runs over 4 columns of rows of 3.
    let (mut k, inputs) = lowered(REDUCE, 1);
    reduce_parts(&mut k).1[0].1 = 4;
    let e = rejects(&k, &inputs, "reads elements 0..=6 of an input of 6");
    assert_eq!(e.at, "body > reduce add f32 > load in0 f32");
}

#[test]
fn gather_outside_a_dimension_when_the_guard_is_too_wide() {
    // Padding reads its operand only inside `0 <= v - 1 < 2`; widened to 3 rows, row 2 of a
    // 2-row operand is read.
    let (mut k, inputs) = lowered(PAD, 1);
    let Expr::Guard { conds, .. } = &mut k.body else {
        panic!("padding is a guard")
    };
    let Cond::InRange(_, _, hi) = &mut conds[0] else {
        panic!("a range condition")
    };
    *hi = 3;
    let e = rejects(
        &k,
        &inputs,
        "index 0 (`v0 - 1`) ranges over 0..=2 outside dimension 0 of in0 (f32[2,3])",
    );
    assert_eq!(e.at, "body > guard > then > gather in0 f32");
}

#[test]
fn load_of_the_wrong_dtype() {
    let (mut k, inputs) = lowered(ADD, 0);
    if let Expr::Load { dtype, .. } = &mut args(&mut k)[1] {
        *dtype = DType::F64;
    }
    rejects(&k, &inputs, "reads f64 from in1, which holds f32[2,3]");
}

#[test]
fn operand_dtype_differs_from_the_op() {
    let (mut k, inputs) = lowered(ADD, 0);
    let a = args(&mut k);
    a[1] = Expr::Op {
        op: Ew::Convert,
        dtype: DType::I32,
        args: vec![a[1].clone()],
    };
    rejects(
        &k,
        &inputs,
        "operand 1 of `add` is i32, but the op produces f32",
    );
}

#[test]
fn wrong_number_of_operands() {
    let (mut k, inputs) = lowered(ADD, 0);
    let a = args(&mut k);
    a.push(a[0].clone());
    rejects(&k, &inputs, "`add` takes 2 operand(s), but has 3");
}

#[test]
fn read_of_an_input_the_kernel_does_not_have() {
    let (mut k, inputs) = lowered(ADD, 0);
    if let Expr::Load { input, .. } = &mut args(&mut k)[1] {
        *input = 5;
    }
    rejects(&k, &inputs, "reads input 5, but the kernel has 2 input(s)");
}

#[test]
fn lowered_operand_never_read() {
    let f = func(ADD);
    let mut ks = kernels(&f);
    let a = args(ks[0].as_mut().unwrap());
    a[1] = a[0].clone();
    let e = verify_lowered(&f, &ks).unwrap_err();
    assert_eq!(
        e.to_string(),
        "kernel k0 (#0 add), at inputs: input 1 (f32[2,3]) is never read"
    );
}

#[test]
fn selection_condition_is_not_pred() {
    let (mut k, inputs) = lowered(
        "func @main(%0: pred[4], %1: f32[4], %2: f32[4]) -> f32[4] {
  %3 = select %0, %1, %2 : f32[4]
  return %3
}
",
        0,
    );
    if let Expr::Load { dtype, .. } = &mut args(&mut k)[0] {
        *dtype = DType::I8;
    }
    // An i8 view of the pred buffer is a valid read; as a condition it is not.
    rejects(
        &k,
        &inputs,
        "operand 0 of `select` is i8, but a selection's condition must be pred",
    );
}

#[test]
fn comparison_typed_as_a_float() {
    let (mut k, inputs) = lowered(
        "func @main(%0: f32[4], %1: f32[4]) -> pred[4] {
  %2 = compare %0, %1 {comparison_direction = LT} : pred[4]
  return %2
}
",
        0,
    );
    if let Expr::Op { dtype, .. } = &mut k.body {
        *dtype = DType::F32;
    }
    rejects(&k, &inputs, "`compare LT` produces pred, but is typed f32");
}

#[test]
fn reduction_starting_value_of_another_dtype() {
    let (mut k, inputs) = lowered(REDUCE, 1);
    let (init, _, _) = reduce_parts(&mut k);
    *init = Expr::Const {
        dtype: DType::F64,
        value: 0.0,
    };
    rejects(
        &k,
        &inputs,
        "the starting value is f64, but the reduction produces f32",
    );
}

#[test]
fn guard_branches_of_different_dtypes() {
    let (mut k, inputs) = lowered(PAD, 1);
    let Expr::Guard { otherwise, .. } = &mut k.body else {
        panic!("padding is a guard")
    };
    **otherwise = Expr::Const {
        dtype: DType::F16,
        value: 0.0,
    };
    rejects(&k, &inputs, "the branches differ in dtype: f32 and f16");
}

#[test]
fn body_of_another_dtype_than_the_output() {
    let (mut k, inputs) = lowered(ADD, 0);
    k.out = k.out.with_dtype(DType::F64);
    let e = rejects(&k, &inputs, "produces f32, but is stored as f64");
    assert_eq!(e.at, "body");
}

#[test]
fn float_run_time_index() {
    let (mut k, inputs) = lowered(PAD, 1);
    let Expr::Guard { then, .. } = &mut k.body else {
        panic!("padding is a guard")
    };
    let Expr::Gather { index, .. } = &mut **then else {
        panic!("a gather")
    };
    index[1] = Idx::Add(vec![
        index[1].clone(),
        Idx::Value(Box::new(Expr::Const {
            dtype: DType::F32,
            value: 0.0,
        })),
    ]);
    rejects(&k, &inputs, "a run-time index must be an integer, got f32");
}

#[test]
fn division_by_zero_in_an_index() {
    let (mut k, inputs) = lowered(PAD, 1);
    let Expr::Guard { then, .. } = &mut k.body else {
        panic!("padding is a guard")
    };
    let Expr::Gather { index, .. } = &mut **then else {
        panic!("a gather")
    };
    index[0] = Idx::Div(Box::new(index[0].clone()), 0);
    rejects(&k, &inputs, "divides by 0 (divisors are positive)");
}

#[test]
fn integer_constant_with_a_fraction() {
    let (mut k, inputs) = lowered(
        "func @main(%0: i32[4]) -> i32[4] {
  %1 = negate %0 : i32[4]
  return %1
}
",
        0,
    );
    let load = args(&mut k)[0].clone();
    args(&mut k)[0] = Expr::Op {
        op: Ew::Kind(OpKind::Add),
        dtype: DType::I32,
        args: vec![
            load,
            Expr::Const {
                dtype: DType::I32,
                value: 0.5,
            },
        ],
    };
    rejects(&k, &inputs, "0.5 is not a value of i32");
}

#[test]
fn gemm_sizes_disagree_with_the_output() {
    let (mut k, inputs) = lowered(MATMUL_BIAS, 0);
    let Schedule::Gemm { m, .. } = &mut k.schedule else {
        panic!("a GEMM")
    };
    *m = 5;
    let e = rejects(
        &k,
        &inputs,
        "batch 1 x m 5 x n 4 is not the 8 elements of the product f32[2,4]",
    );
    assert_eq!(e.at, "schedule");
}

#[test]
fn gemm_contraction_disagrees_with_a() {
    let (mut k, inputs) = lowered(MATMUL_BIAS, 0);
    let Schedule::Gemm { k: kk, .. } = &mut k.schedule else {
        panic!("a GEMM")
    };
    *kk = 4;
    rejects(&k, &inputs, "A (in0, f32[2,3]) is not batch 1 x m 2 x k 4");
}

/// Two heads' product `[1, 2, 3, 2]` merged back into `[1, 3, 4]`: stored through strides.
const HEADS_MERGED: &str = "func @main(%0: f32[1,2,3,3], %1: f32[1,2,3,2]) -> f32[1,3,4] {
  %2 = dot_general %0, %1 {lhs_batching_dimensions = [0, 1], rhs_batching_dimensions = [0, 1], lhs_contracting_dimensions = [3], rhs_contracting_dimensions = [2]} : f32[1,2,3,2]
  %3 = transpose %2 {permutation = [0, 2, 1, 3]} : f32[1,3,2,2]
  %4 = reshape %3 : f32[1,3,4]
  return %4
}
";

#[test]
fn stored_products_write_each_element_once() {
    let (f, fz) = fused(HEADS_MERGED);
    let i = fz.kernels.iter().position(Option::is_some).unwrap();
    let k = fz.kernels[i].clone().unwrap();
    let inputs: Vec<TensorType> = (fz.operands[i].iter())
        .map(|v| f.values[v.index()].clone())
        .collect();
    let Schedule::Gemm {
        store: Some(st), ..
    } = &k.schedule
    else {
        panic!("a product stored through strides: {:?}", k.schedule)
    };
    // Heads 2 apart, rows 4 apart.
    assert_eq!((st.strides.batch.clone(), st.strides.ld), (vec![(2, 2)], 4));
    // Heads 1 apart: a head's second column is the next head's first.
    let mut overlapping = k.clone();
    if let Schedule::Gemm {
        store: Some(st), ..
    } = &mut overlapping.schedule
    {
        st.strides.batch[0].1 = 1;
    }
    rejects(
        &overlapping,
        &inputs,
        "does not write each of f32[1,3,4] once",
    );
    // Rows past the buffer's end.
    let mut past = k.clone();
    if let Schedule::Gemm {
        store: Some(st), ..
    } = &mut past.schedule
    {
        st.strides.ld = 5;
    }
    rejects(&past, &inputs, "does not write each of f32[1,3,4] once");
}

#[test]
fn epilogue_reading_the_product_at_the_wrong_slot() {
    let (f, fz) = fused(MATMUL_BIAS);
    let i = fz.kernels.iter().position(Option::is_some).unwrap();
    let mut k = fz.kernels[i].clone().unwrap();
    let inputs: Vec<TensorType> = fz.operands[i]
        .iter()
        .map(|v| f.values[v.index()].clone())
        .collect();
    let Schedule::Gemm { epilogue, .. } = &mut k.schedule else {
        panic!("the product with its bias is one GEMM: {k:?}")
    };
    *epilogue = Some(inputs.len() + 1);
    rejects(
        &k,
        &inputs,
        "the epilogue reads the product as in4, but it follows the 3 inputs (in3)",
    );
}

const SIBLINGS: &str = "func @main(%0: f32[8,5]) -> (f32[8,5], f32[8,5]) {
  %1 = exponential %0 : f32[8,5]
  %2 = log %0 : f32[8,5]
  return %1, %2
}
";

#[test]
fn extra_output_in_the_wrong_slot() {
    let (f, fz) = fused(SIBLINGS);
    let i = fz.kernels.iter().position(Option::is_some).unwrap();
    let mut k = fz.kernels[i].clone().unwrap();
    assert_eq!(k.extra.len(), 1, "one multi-output kernel: {k:?}");
    let inputs: Vec<TensorType> = fz.operands[i]
        .iter()
        .map(|v| f.values[v.index()].clone())
        .collect();
    k.extra[0].slot = 0;
    let e = rejects(
        &k,
        &inputs,
        "its pointer is in slot 0, but extra output 0 of a kernel with 1 inputs is in slot 1",
    );
    assert_eq!(e.at, "extra output 0");
}

#[test]
fn extra_output_of_another_shape() {
    let (f, mut fz) = fused(SIBLINGS);
    let i = fz.kernels.iter().position(Option::is_some).unwrap();
    let k = fz.kernels[i].as_mut().unwrap();
    k.extra[0].out = TensorType::new(DType::F32, [40]);
    let e = verify_fused(&f, &fz).unwrap_err();
    assert_eq!(
        e.to_string(),
        "kernel k1 (#1 log), at extra output 0: writes f32[40], not the kernel's shape [8, 5]"
    );
}

#[test]
fn errors_name_the_kernel_and_its_instruction() {
    let f = func(REDUCE);
    let mut ks = kernels(&f);
    verify_lowered(&f, &ks).unwrap();
    if let Some(Expr::Reduce { body, .. }) = ks[1].as_mut().map(|k| &mut k.body)
        && let Expr::Load { off, .. } = &mut **body
    {
        *off = -1;
    }
    let e = verify_lowered(&f, &ks).unwrap_err();
    assert_eq!(
        e.to_string(),
        "kernel k1 (#1 reduce), at body > reduce add f32 > load in0 f32: the load reads \
         elements -1..=4 of an input of 6 (f32[2,3]): the index map leaves the buffer (loops: \
         v0 < 2, v1 < 3)"
    );
}

#[test]
fn lowered_kernel_of_the_wrong_result_type() {
    let mut f = func(ADD);
    let ks = kernels(&f);
    let result = f.insts[0].results[0];
    f.values[result.index()] = TensorType::new(DType::F32, [3, 2]);
    let e = verify_lowered(&f, &ks).unwrap_err();
    assert_eq!(
        e.to_string(),
        "kernel k0 (#0 add), at output: computes f32[2,3], but the instruction's result is f32[3,2]"
    );
}

#[test]
fn inlined_instruction_with_a_kernel() {
    let (f, mut fz) = fused(
        "func @main(%0: f32[4]) -> f32[4] {
  %1 = exponential %0 : f32[4]
  %2 = negate %1 : f32[4]
  return %2
}
",
    );
    assert!(fz.inlined[0]);
    fz.kernels[0] = kernels(&f)[0].clone();
    let e = verify_fused(&f, &fz).unwrap_err();
    assert!(
        e.to_string()
            .contains("the instruction is inlined into its users, yet has a kernel"),
        "{e}"
    );
}

/// Programs covering every kind of kernel: guards (padding, concatenation, windows,
/// convolutions), gathers, scatters, dynamic slices, matrix products with epilogues, and
/// multi-output fusion; lowered and fused, every kernel verifies.
#[test]
fn real_kernels_verify() {
    for src in [
        ADD,
        REDUCE,
        PAD,
        MATMUL_BIAS,
        SIBLINGS,
        "func @main(%0: f32[2,3], %1: f32[2,2]) -> f32[2,5] {
  %2 = exponential %0 : f32[2,3]
  %3 = concatenate %2, %1 {dimension = 1} : f32[2,5]
  return %3
}
",
        "func @main(%0: f32[1,2,5,5], %1: f32[3,2,3,3]) -> f32[1,3,3,3] {
  %2 = convolution %0, %1 {window_strides = [2, 2], padding = [[1, 1], [1, 1]], lhs_dilation = [1, 1], rhs_dilation = [1, 1], feature_group_count = 1, input_dims = [0, 1, 2, 3], kernel_dims = [0, 1, 2, 3], output_dims = [0, 1, 2, 3]} : f32[1,3,3,3]
  return %2
}
",
        "func @main(%0: f32[6,4], %1: i32[], %2: i32[]) -> f32[2,4] {
  %3 = dynamic_slice %0, %1, %2 {slice_sizes = [2, 4]} : f32[2,4]
  return %3
}
",
        // One start index for two dimensions: the concatenation's guard bounds a read whose
        // index holds its form in another proportion (4 c + 3 v1 under 0 <= c + v1 < 3).
        "func @main(%0: u32[1,3,3], %1: u32[1,3,3], %2: i32[], %3: i32[]) -> u32[1,5,2] {
  %4 = clamp %0, %0, %1 : u32[1,3,3]
  %5 = concatenate %4, %1 {dimension = 1} : u32[1,6,3]
  %6 = dynamic_slice %5, %2, %3, %3 {slice_sizes = [1, 5, 2]} : u32[1,5,2]
  return %6
}
",
        // One start index for three dimensions of an update: each guard bounds one term
        // (2 (v0 - c) + 2 (v1 - c) under 0 <= v0 - c < 1 and 0 <= v1 - c < 1).
        "func @main(%0: i64[2,2,1], %1: i32[], %2: i32[]) -> i64[2,2,1] {
  %3 = slice %0 {start_indices = [0, 1, 0], limit_indices = [1, 2, 1], strides = [1, 2, 1]} : i64[1,1,1]
  %4 = dynamic_update_slice %0, %3, %1, %1, %2 : i64[2,2,1]
  return %4
}
",
        // An update read by a window under two guards on the same start index, one of them
        // the index's own form (the other must not hide it).
        "func @main(%0: bf16[3,2], %1: bf16[2,1], %2: bf16[], %3: i32[]) -> bf16[2,1] {
  %4 = dynamic_update_slice %0, %1, %3, %3 : bf16[3,2]
  %5 = reduce_window %4, %2 {window_dimensions = [2, 2], window_strides = [2, 2], base_dilations = [1, 2], window_dilations = [1, 1], padding = [[0, 1], [0, 0]], kind = add} : bf16[2,1]
  return %5
}
",
        "func @main(%0: f32[1,4,4,1]) -> f32[1,2,2,1] {
  %1 = constant {value = -inf} : f32[]
  %2 = reduce_window %0, %1 {window_dimensions = [1, 2, 2, 1], window_strides = [1, 2, 2, 1], base_dilations = [1, 1, 1, 1], window_dilations = [1, 1, 1, 1], padding = [[0, 0], [0, 0], [0, 0], [0, 0]], kind = max} : f32[1,2,2,1]
  return %2
}
",
        "func @main(%0: f32[3,4]) -> f32[4,3] {
  %1 = transpose %0 {permutation = [1, 0]} : f32[4,3]
  %2 = reshape %1 : f32[12]
  %3 = exponential %2 : f32[12]
  %4 = reshape %3 : f32[4,3]
  return %4
}
",
    ] {
        let f = func(src);
        verify_lowered(&f, &kernels(&f)).unwrap_or_else(|e| panic!("{e}\n{src}"));
        verify_fused(&f, &fused_kernels(&f, &Options::default(), &kiln_kernel::TargetInfo::reference())).unwrap_or_else(|e| panic!("{e}\n{src}"));
        let (g, fz) = kiln_kernel::pipeline::lowered_for_printing(&f, &Options::default())
            .unwrap_or_else(|e| panic!("{e}\n{src}"));
        verify_fused(&g, &fz).unwrap_or_else(|e| panic!("{e}\n{g}"));
    }
}

/// Every kernel of 2,000 random programs (the differential test's generator: 1 to 12 ops,
/// every dtype; one in ten with dimensions around vector widths), lowered and fused as given
/// and after the optimizer and canonicalization, verifies. `KILN_SEED=N` runs one seed,
/// `KILN_VERIFY_PROGRAMS` a count `N` or a range `A..B` of fresh seeds.
#[test]
fn random_program_kernels_verify() {
    let knob = std::env::var("KILN_VERIFY_PROGRAMS").ok();
    let seeds: Vec<u64> = match std::env::var("KILN_SEED") {
        Ok(s) => vec![s.parse().expect("KILN_SEED is a number")],
        Err(_) => {
            kiln_ir::random::seeds::seed_range("KILN_VERIFY_PROGRAMS", knob.as_deref(), 0..2000)
                .unwrap()
                .collect()
        }
    };
    let opts = Options::default();
    let mut count = 0;
    for seed in seeds {
        let mut cfg = Config {
            ops: 1 + (seed as usize % 12),
            ..Config::default()
        }
        .with_wide();
        if seed % 10 == 5 {
            cfg.dims = vec![1, 7, 8, 9, 15, 16, 17, 31, 32, 33, 63, 64, 65];
            cfg.max_rank = 2;
        }
        let f = random_func(&mut Rng::new(seed), &cfg);
        let fail = |e: &dyn std::fmt::Display, g: &Func| -> ! {
            panic!(
                "seed {seed}: {e}\n{g}reproduce: KILN_SEED={seed} cargo test -p kiln-kernel --test verify random_program_kernels_verify"
            )
        };
        let ks = kernels(&f);
        count += ks.iter().flatten().count();
        verify_lowered(&f, &ks).unwrap_or_else(|e| fail(&e, &f));
        let fz = fused_kernels(
            &f,
            &Options::default(),
            &kiln_kernel::TargetInfo::reference(),
        );
        verify_fused(&f, &fz).unwrap_or_else(|e| {
            fail(
                &format!("{e}\n{}", kiln_kernel::print::fused_text(&f, &fz)),
                &f,
            )
        });
        // Through the optimizer for a quarter of them (it takes most of the time).
        if seed % 4 == 0 {
            let g =
                kiln_kernel::pipeline::prepare(&f, &opts, &kiln_kernel::TargetInfo::reference())
                    .unwrap_or_else(|e| fail(&e, &f));
            verify_lowered(&g, &kernels(&g)).unwrap_or_else(|e| fail(&e, &g));
            let fz = fused_kernels(
                &g,
                &Options::default(),
                &kiln_kernel::TargetInfo::reference(),
            );
            verify_fused(&g, &fz).unwrap_or_else(|e| {
                fail(
                    &format!("{e}\n{}", kiln_kernel::print::fused_text(&g, &fz)),
                    &g,
                )
            });
        }
    }
    println!("{count} kernels verified");
}
