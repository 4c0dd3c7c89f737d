//! `reduce_region` on the CPU backend (one fold kernel of coupled accumulators, in vector lanes
//! along rows and in strips of columns; a tree of elementwise kernels for small floats) against
//! the reference interpreter (which folds the body in row-major order), bit for bit: argmax and
//! argmin with NaN and tie rules, integer bodies (exclusive or, wrapping sum, a sum and a count
//! together), over random shapes and reduced dimensions, empty ones included; and a body the
//! expansion does not take, which the host folds with the body's compiled program. The same for
//! `reduce_window_region` (one fold kernel in the reference's order, so that even a body whose
//! result depends on the order agrees; many outputs side by side in vector lanes): argmax
//! pooling over windows with strides, dilations and padding, small and large windows, ragged
//! tails of outputs; and `map`, expanded or run per element.

use kiln_codegen_llvm::cpu::{CpuExecutable, Step};
use kiln_ir::{DType, Literal, TensorType, parse_func_text};

#[path = "../../kiln-runtime/tests/folds/mod.rs"]
mod folds;
use folds::{arg_body, arg_types, kept, values};

/// The argmax or argmin of `%0` over `dims` with a row-major position index as its second input.
fn arg_program(dtype: DType, shape: &[usize], dims: &[usize], dir: &str) -> String {
    let [t, i, rt, ri] = arg_types(dtype, shape, dims);
    let n: usize = shape.iter().product();
    format!(
        "func @main(%0: {t}, %1: {dtype}[]) -> ({rt}, {ri}) {{
  %2 = iota {{iota_dimension = 0}} : i32[{n}]
  %3 = reshape %2 : {i}
  %4 = constant {{value = 0}} : i32[]
  %5, %6 = reduce_region %0, %3, %1, %4 {{dimensions = {dims:?}, body = {}}} : {rt}, {ri}
  return %5, %6
}}
",
        arg_body(dtype, dir)
    )
}

/// Compiles `text`, checks the op became kernels (or, with `hosted`, a control step the host
/// runs), and compares the results with the reference bit for bit.
fn check(text: &str, args: &[Literal], hosted: bool) {
    let f = parse_func_text(text).unwrap_or_else(|e| panic!("{e}\n{text}"));
    let exe = CpuExecutable::compile(&f).unwrap_or_else(|e| panic!("{e}\n{text}"));
    assert_eq!(
        exe.plan().contains(&Step::Control),
        hosted,
        "{:?}\n{text}",
        exe.plan()
    );
    let got = exe.run(args).unwrap();
    let want = kiln_reference::eval(&f, args).unwrap();
    for (g, w) in got.iter().zip(&want) {
        assert_eq!(g.ty(), w.ty(), "{text}");
        assert_eq!(
            g.to_le_bytes(),
            w.to_le_bytes(),
            "{text}\ngot {g:?}\nwant {w:?}"
        );
    }
}

/// Shapes with their reduced dimensions: one, several, none, all, and a dimension of size 0.
fn cases() -> Vec<(Vec<usize>, Vec<usize>)> {
    vec![
        (vec![1], vec![0]),
        (vec![7], vec![0]),
        (vec![64], vec![0]),
        (vec![1000], vec![0]),
        (vec![5, 9], vec![1]),
        (vec![5, 9], vec![0]),
        (vec![3, 4, 5], vec![0, 2]),
        (vec![3, 4, 5], vec![1]),
        (vec![2, 3, 17], vec![0, 1, 2]),
        (vec![4, 6], vec![]),
        (vec![4, 0, 3], vec![1]),
        (vec![33, 31], vec![0, 1]),
        // Rows long enough for the fold's vector lanes (with a remainder), and columns under
        // outputs wide enough for strips (with positions past the last strip).
        (vec![6, 133], vec![1]),
        (vec![70, 45], vec![0]),
        (vec![3, 20, 37], vec![1]),
    ]
}

#[test]
fn argmax_and_argmin_agree_with_the_reference_bit_for_bit() {
    for dtype in [DType::F32, DType::F64, DType::BF16, DType::I32, DType::U8] {
        for (shape, dims) in cases() {
            for dir in ["GT", "LT"] {
                for nans in [false, true] {
                    let n: usize = shape.iter().product();
                    let seed = (n * 31 + dims.len()) as u64 + nans as u64;
                    let x = Literal::from_f64s(
                        TensorType::new(dtype, shape.clone()),
                        &values(dtype, n, nans, seed),
                    )
                    .unwrap();
                    // An init the elements beat, and one they tie with or lose to.
                    for init in [if dir == "GT" { -1e30 } else { 1e30 }, 0.0] {
                        let init = Literal::from_f64s(TensorType::scalar(dtype), &[init]).unwrap();
                        let text = arg_program(dtype, &shape, &dims, dir);
                        check(&text, &[x.clone(), init], false);
                    }
                }
            }
        }
    }
}

#[test]
fn integer_bodies_agree_with_the_reference() {
    for dtype in [DType::I32, DType::I64, DType::U32, DType::I8] {
        for (shape, dims) in cases() {
            let n: usize = shape.iter().product();
            let t = TensorType::new(dtype, shape.clone());
            let rt = TensorType::new(dtype, kept(&shape, &dims));
            let ri = TensorType::new(DType::I32, kept(&shape, &dims));
            let i = TensorType::new(DType::I32, shape.clone());
            let x = Literal::from_f64s(t.clone(), &values(dtype, n, false, n as u64)).unwrap();
            let c = Literal::from_f64s(i.clone(), &values(DType::I32, n, false, 7)).unwrap();
            let init = Literal::from_f64s(TensorType::scalar(dtype), &[3.0]).unwrap();
            let init_c = Literal::from_f64s(TensorType::scalar(DType::I32), &[1.0]).unwrap();
            for op in ["xor", "add", "multiply"] {
                let text = format!(
                    "func @main(%0: {t}, %1: {dtype}[]) -> {rt} {{
  %2 = reduce_region %0, %1 {{dimensions = {dims:?}, body = func @b(%0: {dtype}[], %1: {dtype}[]) -> {dtype}[] {{
      %2 = {op} %0, %1 : {dtype}[]
      return %2
    }}}} : {rt}
  return %2
}}
"
                );
                check(&text, &[x.clone(), init.clone()], false);
            }
            // A wrapping sum and a sum of another input together.
            let text = format!(
                "func @main(%0: {t}, %1: {i}, %2: {dtype}[], %3: i32[]) -> ({rt}, {ri}) {{
  %4, %5 = reduce_region %0, %1, %2, %3 {{dimensions = {dims:?}, body = func @b(%0: {dtype}[], %1: i32[], %2: {dtype}[], %3: i32[]) -> ({dtype}[], i32[]) {{
      %4 = add %0, %2 : {dtype}[]
      %5 = add %1, %3 : i32[]
      return %4, %5
    }}}} : {rt}, {ri}
  return %4, %5
}}
"
            );
            check(
                &text,
                &[x.clone(), c.clone(), init.clone(), init_c.clone()],
                false,
            );
        }
    }
}

/// The steps of `text`'s plan that run a compiled kernel.
fn kernels(text: &str) -> usize {
    let f = parse_func_text(text).unwrap_or_else(|e| panic!("{e}\n{text}"));
    let exe = CpuExecutable::compile(&f).unwrap_or_else(|e| panic!("{e}\n{text}"));
    exe.plan().iter().filter(|s| **s == Step::Kernel).count()
}

#[test]
fn an_argmax_of_a_computed_value_is_one_kernel_over_rows_and_columns() {
    for (shape, dims) in [(vec![8, 300], vec![1]), (vec![300, 40], vec![0])] {
        let t = TensorType::new(DType::F32, shape.clone());
        let text = arg_program(DType::F32, &shape, &dims, "GT").replace(
            "%5, %6 = reduce_region %0,",
            &format!("%9 = multiply %0, %0 : {t}\n  %5, %6 = reduce_region %9,"),
        );
        // The product, the positions and both results in one loop nest: no temporary.
        assert_eq!(kernels(&text), 1, "{text}");
        let n: usize = shape.iter().product();
        let x = Literal::from_f64s(t, &values(DType::F32, n, true, 5)).unwrap();
        let init = Literal::from_f64s(TensorType::scalar(DType::F32), &[-1e30]).unwrap();
        check(&text, &[x, init], false);
    }
}

#[test]
fn a_body_of_other_ops_runs_as_a_compiled_region() {
    // A body holding a `reduce` of a scalar (no elementwise op): not expanded, still right.
    let text = "func @main(%0: f32[4,5], %1: f32[]) -> f32[4] {
  %2 = reduce_region %0, %1 {dimensions = [1], body = func @b(%0: f32[], %1: f32[]) -> f32[] {
      %2 = reshape %1 : f32[1]
      %3 = reduce %2, %0 {dimensions = [0], kind = add} : f32[]
      return %3
    }} : f32[4]
  return %2
}
";
    let x = Literal::f32([4, 5], (0..20).map(|i| i as f32 * 0.5).collect()).unwrap();
    let init = Literal::f32([], vec![1.0]).unwrap();
    check(text, &[x, init], true);
}

/// An argmax pooling of `%0` (positions as the second input) over `window`.
fn pool_program(dtype: DType, shape: &[usize], window: &Window) -> String {
    let t = TensorType::new(dtype, shape.to_vec());
    let i = TensorType::new(DType::I32, shape.to_vec());
    let out = window.output(shape);
    let rt = TensorType::new(dtype, out.clone());
    let ri = TensorType::new(DType::I32, out);
    let n: usize = shape.iter().product();
    let pads: Vec<[i64; 2]> = window.padding.iter().map(|p| [p.0, p.1]).collect();
    format!(
        "func @main(%0: {t}, %1: {dtype}[]) -> ({rt}, {ri}) {{
  %2 = iota {{iota_dimension = 0}} : i32[{n}]
  %3 = reshape %2 : {i}
  %4 = constant {{value = 0}} : i32[]
  %5, %6 = reduce_window_region %0, %3, %1, %4 {{window_dimensions = {:?}, window_strides = {:?}, base_dilations = {:?}, window_dilations = {:?}, padding = {pads:?}, body = {}}} : {rt}, {ri}
  return %5, %6
}}
",
        window.dims,
        window.strides,
        window.base,
        window.dil,
        arg_body(dtype, "GT")
    )
}

struct Window {
    dims: Vec<i64>,
    strides: Vec<i64>,
    base: Vec<i64>,
    dil: Vec<i64>,
    padding: Vec<(i64, i64)>,
}

impl Window {
    /// The window of these attributes (one entry a dimension).
    fn new(
        dims: &[i64],
        strides: &[i64],
        base: &[i64],
        dil: &[i64],
        padding: &[(i64, i64)],
    ) -> Self {
        Window {
            dims: dims.to_vec(),
            strides: strides.to_vec(),
            base: base.to_vec(),
            dil: dil.to_vec(),
            padding: padding.to_vec(),
        }
    }

    /// The output shape of this window over an operand of `shape`.
    fn output(&self, shape: &[usize]) -> Vec<usize> {
        (0..shape.len())
            .map(|d| {
                kiln_ir::verify::window_output_size(
                    shape[d],
                    self.base[d],
                    self.padding[d],
                    self.dims[d],
                    self.dil[d],
                    self.strides[d],
                )
            })
            .collect()
    }
}

#[test]
fn argmax_pooling_agrees_with_the_reference_bit_for_bit() {
    let w = Window::new;
    let cases = [
        (
            vec![8, 8],
            w(&[2, 2], &[2, 2], &[1, 1], &[1, 1], &[(0, 0), (0, 0)]),
        ),
        (
            vec![7, 9],
            w(&[3, 3], &[2, 1], &[1, 1], &[1, 1], &[(1, 1), (1, 0)]),
        ),
        (
            vec![5, 6],
            w(&[2, 3], &[1, 2], &[2, 1], &[1, 2], &[(0, 1), (2, 1)]),
        ),
        (
            vec![3, 4, 5],
            w(
                &[1, 2, 2],
                &[1, 1, 2],
                &[1, 1, 1],
                &[1, 1, 1],
                &[(0, 0), (0, 0), (-1, 0)],
            ),
        ),
        (vec![4], w(&[9], &[1], &[1], &[1], &[(0, 0)])),
    ];
    for dtype in [DType::F32, DType::F64, DType::I32] {
        for (shape, window) in &cases {
            for nans in [false, true] {
                let n: usize = shape.iter().product();
                let x = Literal::from_f64s(
                    TensorType::new(dtype, shape.clone()),
                    &values(dtype, n, nans, n as u64 + 3),
                )
                .unwrap();
                let init = Literal::from_f64s(TensorType::scalar(dtype), &[-7.0]).unwrap();
                let text = pool_program(dtype, shape, window);
                check(&text, &[x, init], false);
            }
        }
    }
}

/// A one-result `reduce_window_region` of `%0: f32[shape]` over `window` whose body is `ops`
/// on `%0` (the accumulator) and `%1` (the element), its result the last value.
fn window_program(shape: &[usize], window: &Window, ops: &str) -> String {
    let out = window.output(shape);
    let t = TensorType::new(DType::F32, shape.to_vec());
    let rt = TensorType::new(DType::F32, out);
    let pads: Vec<[i64; 2]> = window.padding.iter().map(|p| [p.0, p.1]).collect();
    format!(
        "func @main(%0: {t}, %1: f32[]) -> {rt} {{
  %2 = reduce_window_region %0, %1 {{window_dimensions = {:?}, window_strides = {:?}, base_dilations = {:?}, window_dilations = {:?}, padding = {pads:?}, body = func @b(%0: f32[], %1: f32[]) -> f32[] {{
{ops}
    }}}} : {rt}
  return %2
}}
",
        window.dims, window.strides, window.base, window.dil
    )
}

/// Windows of more than 256 elements (which the expansion would not take either) are one fold
/// kernel each, folding every window in the reference's order: argmax pooling, and a body whose
/// result depends on the order (`acc / 2 + x`, rounded at every step) over a 1 x 1024 window
/// with strides and padding, a 1024-element window along one dimension (the loop vector
/// lanes would take) and a global 64 x 64 window, bit for bit.
#[test]
fn windows_too_large_to_expand_are_one_kernel_in_order() {
    let w = Window::new;
    // 20 x 20 = 400 elements a window.
    let pool = w(&[20, 20], &[5, 5], &[1, 1], &[1, 1], &[(0, 0), (0, 0)]);
    let x = Literal::from_f64s(
        TensorType::new(DType::F32, vec![30, 25]),
        &values(DType::F32, 750, true, 5),
    )
    .unwrap();
    let init = Literal::f32([], vec![f32::NEG_INFINITY]).unwrap();
    let text = pool_program(DType::F32, &[30, 25], &pool);
    check(&text, &[x, init], false);
    assert_eq!(kernels(&text), 1, "{text}");
    let halve = "      %2 = constant {value = 0.5} : f32[]
      %3 = multiply %0, %2 : f32[]
      %4 = add %3, %1 : f32[]
      return %4";
    let cases = [
        (
            vec![3, 2000],
            w(&[1, 1024], &[1, 97], &[1, 1], &[1, 1], &[(0, 0), (3, 5)]),
        ),
        (vec![1500], w(&[1024], &[7], &[1], &[1], &[(0, 0)])),
        (
            vec![64, 64],
            w(&[64, 64], &[1, 1], &[1, 1], &[1, 1], &[(0, 0), (0, 0)]),
        ),
        (
            vec![40, 30],
            w(&[17, 16], &[9, 4], &[2, 1], &[1, 2], &[(2, 1), (0, 3)]),
        ),
    ];
    for (i, (shape, window)) in cases.iter().enumerate() {
        let n: usize = shape.iter().product();
        // Finite values of many magnitudes, so that the order of the roundings shows.
        let xs: Vec<f64> = values(DType::I32, n, false, i as u64)
            .iter()
            .enumerate()
            .map(|(k, v)| v * (1.0 + (k % 13) as f64 / 7.0))
            .collect();
        let x = Literal::from_f64s(TensorType::new(DType::F32, shape.clone()), &xs).unwrap();
        let init = Literal::f32([], vec![0.3]).unwrap();
        let text = window_program(shape, window, halve);
        check(&text, &[x, init], false);
        assert_eq!(kernels(&text), 1, "{text}");
    }
}

/// Whether `text` compiles to a kernel whose loop runs in strips (see
/// `kiln_kernel::loop_schedule::column_strips`), and whether a fold there gathers its
/// elements across the positions (`Strips::gathered`).
fn strips_of(text: &str) -> (bool, bool) {
    let f = parse_func_text(text).unwrap_or_else(|e| panic!("{e}\n{text}"));
    let exe = CpuExecutable::compile(&f).unwrap_or_else(|e| panic!("{e}\n{text}"));
    let paths = exe.kernel_paths();
    (
        paths.iter().any(|p| p.strips),
        paths.iter().any(|p| p.strip_gathers),
    )
}

/// Whether `text` compiles to a kernel whose loop runs in strips with a window's fold, its
/// elements gathered across the positions.
fn in_strips(text: &str) -> bool {
    strips_of(text) == (true, true)
}

/// An argmax down the columns runs in strips, its elements read contiguously along the
/// positions: not a gathered fold (its accumulators are copied out of the fold's arrays).
#[test]
fn column_argmax_strips_are_not_gathered() {
    let bench = include_str!("../../../benches/kir/argmax_columns.kir");
    let text = bench
        .replace("4096,4096", "64,512")
        .replace("[4096]", "[512]");
    assert_eq!(strips_of(&text), (true, false), "{text}");
}

/// Windows too large to expand over many outputs run in strips across the outputs, each
/// position folding its own window in the reference's order, bit for bit: argmax pooling with
/// NaN and ties (f32, f64, i32) where the positions are strided and padded, with base and
/// window dilations, along a global pooling's `[n, 1, 1]` output (strips along its first
/// dimension), an order-dependent body and an exclusive or; the output extents leave ragged
/// tails (positions past the wide strips, in narrow strips and one by one).
#[test]
fn large_windows_over_many_outputs_fold_across_outputs_in_order() {
    let w = Window::new;
    let pools = [
        (
            vec![3, 700],
            w(&[1, 300], &[1, 2], &[1, 1], &[1, 1], &[(0, 0), (299, 0)]),
        ),
        (
            vec![2, 400],
            w(&[2, 150], &[1, 3], &[1, 2], &[1, 2], &[(1, 0), (5, 7)]),
        ),
        (
            vec![40, 30, 30],
            w(
                &[1, 30, 30],
                &[1, 1, 1],
                &[1, 1, 1],
                &[1, 1, 1],
                &[(0, 0); 3],
            ),
        ),
    ];
    for dtype in [DType::F32, DType::F64, DType::I32] {
        for (i, (shape, window)) in pools.iter().enumerate() {
            let text = pool_program(dtype, shape, window);
            assert!(in_strips(&text), "{text}");
            let n: usize = shape.iter().product();
            for nans in [false, true] {
                let x = Literal::from_f64s(
                    TensorType::new(dtype, shape.clone()),
                    &values(dtype, n, nans, (n + i) as u64),
                )
                .unwrap();
                // An init the elements beat, and one they tie with or lose to (the padding's).
                for init in [-1e30, 0.0] {
                    let init = Literal::from_f64s(TensorType::scalar(dtype), &[init]).unwrap();
                    check(&text, &[x.clone(), init], false);
                }
            }
        }
    }
    let halve = "      %2 = constant {value = 0.5} : f32[]
      %3 = multiply %0, %2 : f32[]
      %4 = add %3, %1 : f32[]
      return %4";
    let orders = [
        (
            vec![2, 3000],
            w(&[1, 1024], &[1, 5], &[1, 1], &[1, 1], &[(0, 0), (100, 50)]),
        ),
        (
            vec![37, 20, 20],
            w(
                &[1, 20, 20],
                &[1, 1, 1],
                &[1, 1, 1],
                &[1, 1, 1],
                &[(0, 0); 3],
            ),
        ),
    ];
    for (i, (shape, window)) in orders.iter().enumerate() {
        let n: usize = shape.iter().product();
        let xs: Vec<f64> = values(DType::I32, n, false, i as u64 + 40)
            .iter()
            .enumerate()
            .map(|(k, v)| v * (1.0 + (k % 13) as f64 / 7.0))
            .collect();
        let x = Literal::from_f64s(TensorType::new(DType::F32, shape.clone()), &xs).unwrap();
        let init = Literal::f32([], vec![0.3]).unwrap();
        let text = window_program(shape, window, halve);
        assert!(in_strips(&text), "{text}");
        check(&text, &[x, init], false);
    }
    // An exclusive or of i32 over 1 x 512 windows, padded with the init.
    let shape = [4usize, 900];
    let window = w(&[1, 512], &[1, 3], &[1, 1], &[1, 1], &[(0, 0), (200, 100)]);
    let rt = TensorType::new(DType::I32, window.output(&shape));
    let text = format!(
        "func @main(%0: i32[4,900], %1: i32[]) -> {rt} {{
  %2 = reduce_window_region %0, %1 {{window_dimensions = {:?}, window_strides = {:?}, base_dilations = [1, 1], window_dilations = [1, 1], padding = [[0, 0], [200, 100]], body = func @b(%0: i32[], %1: i32[]) -> i32[] {{
      %2 = xor %0, %1 : i32[]
      return %2
    }}}} : {rt}
  return %2
}}
",
        window.dims, window.strides
    );
    assert!(in_strips(&text), "{text}");
    let x = Literal::from_f64s(
        TensorType::new(DType::I32, shape.to_vec()),
        &values(DType::I32, 3600, false, 11),
    )
    .unwrap();
    let init = Literal::from_f64s(TensorType::scalar(DType::I32), &[77.0]).unwrap();
    check(&text, &[x, init], false);
}

/// A window fold whose body is not elementwise ops still runs, as a region the host calls.
#[test]
fn a_window_body_of_other_ops_runs_as_a_compiled_region() {
    let window = Window {
        dims: vec![20, 20],
        strides: vec![5, 5],
        base: vec![1, 1],
        dil: vec![1, 1],
        padding: vec![(0, 0), (0, 0)],
    };
    let text = window_program(
        &[30, 25],
        &window,
        "      %2 = reshape %1 : f32[1]
      %3 = reduce %2, %0 {dimensions = [0], kind = add} : f32[]
      return %3",
    );
    let x = Literal::from_f64s(
        TensorType::new(DType::F32, vec![30, 25]),
        &values(DType::F32, 750, false, 5),
    )
    .unwrap();
    let init = Literal::f32([], vec![1.0]).unwrap();
    check(&text, &[x, init], true);
}

#[test]
fn maps_agree_with_the_reference_expanded_or_as_a_region() {
    // An elementwise computation (expanded) and one holding a `reduce` (run per element).
    let bodies = [
        (
            "%2 = multiply %0, %1 : f32[]\n      %3 = constant {value = 1.5} : f32[]\n      %4 = subtract %2, %3 : f32[]\n      %5 = tanh %4 : f32[]\n      return %5",
            false,
        ),
        (
            "%2 = reshape %0 : f32[1]\n      %3 = reduce %2, %1 {dimensions = [0], kind = max} : f32[]\n      return %3",
            true,
        ),
    ];
    for shape in [vec![7], vec![3, 40], vec![0, 5]] {
        let t = TensorType::new(DType::F32, shape.clone());
        let n: usize = shape.iter().product();
        let x = Literal::from_f64s(t.clone(), &values(DType::F32, n, true, 1)).unwrap();
        let y = Literal::from_f64s(t.clone(), &values(DType::F32, n, false, 2)).unwrap();
        let dims: Vec<usize> = (0..shape.len()).collect();
        for (body, hosted) in bodies {
            let text = format!(
                "func @main(%0: {t}, %1: {t}) -> {t} {{
  %2 = map %0, %1 {{dimensions = {dims:?}, computation = func @c(%0: f32[], %1: f32[]) -> f32[] {{
      {body}
    }}}} : {t}
  return %2
}}
"
            );
            check(&text, &[x.clone(), y.clone()], hosted);
        }
    }
}
