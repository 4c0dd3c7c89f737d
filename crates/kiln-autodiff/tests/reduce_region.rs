//! `reduce_region` under autodiff: its integer results (an argmax's indices) need no
//! derivative, so a gradient that only passes beside them works; a gradient that reaches its
//! float results goes through the body along an order-keeping tree (an argmax's to the
//! element it selects; other bodies checked against central differences, with odd and empty
//! rows, several reduced dimensions and several results); `reduce_window_region`'s goes
//! through the body along the window's fold (against the named `reduce_window`'s and central
//! differences, with padding, strides and dilations); the forward mode reduces
//! values and tangents together (checked against central differences); `vmap` batches it.

use kiln_autodiff::{grad, jvp, vmap};
use kiln_ir::{Func, Literal, parse_func_text};

fn f(text: &str) -> Func {
    parse_func_text(text).unwrap_or_else(|e| panic!("{e}\n{text}"))
}

/// `sum(x) * w + index` or (`use_value`) `value`, where (value, index) is the argmax of `x`.
fn argmax_program(use_value: bool) -> String {
    let out = if use_value {
        "return %5".to_string()
    } else {
        "%10 = constant {value = 0.0} : f64[]\n  %11 = reduce %0, %10 {dimensions = [0], kind = add} : f64[]\n  %12 = convert %6 : f64[]\n  %13 = multiply %11, %1 : f64[]\n  %14 = add %13, %12 : f64[]\n  return %14".to_string()
    };
    format!(
        "func @main(%0: f64[4], %1: f64[]) -> f64[] {{
  %2 = iota {{iota_dimension = 0}} : i32[4]
  %3 = constant {{value = -inf}} : f64[]
  %4 = constant {{value = 0}} : i32[]
  %5, %6 = reduce_region %0, %2, %3, %4 {{dimensions = [0], body = func @argmax(%0: f64[], %1: i32[], %2: f64[], %3: i32[]) -> (f64[], i32[]) {{
      %4 = compare %2, %0 {{comparison_direction = GT}} : pred[]
      %5 = select %4, %2, %0 : f64[]
      %6 = select %4, %3, %1 : i32[]
      return %5, %6
    }}}} : f64[], i32[]
  {out}
}}
"
    )
}

#[test]
fn integer_results_need_no_derivative() {
    let p = f(&argmax_program(false));
    let g = grad(&p, &[0, 1]).unwrap_or_else(|e| panic!("{e}"));
    let x = Literal::f64([4], vec![1.0, 7.0, -2.0, 7.0]).unwrap();
    let w = Literal::f64([], vec![3.0]).unwrap();
    let out = kiln_reference::eval(&g, &[x, w]).unwrap();
    // d/dx (sum(x) * w + argmax) = w everywhere; d/dw = sum(x).
    assert_eq!(out[0].to_f64s(), vec![3.0; 4]);
    assert_eq!(out[1].to_f64s(), vec![13.0]);
}

#[test]
fn a_gradient_through_an_argmax_goes_to_the_element_it_selects() {
    let p = f(&argmax_program(true));
    let g = grad(&p, &[0, 1]).unwrap_or_else(|e| panic!("{e}"));
    let w = Literal::f64([], vec![3.0]).unwrap();
    // The body keeps the first of equal maxima without looking at the indices, so the order
    // of the tree decides which one: the earlier, as a sequential reduction has it.
    for (x, want) in [
        ([1.0, 7.0, -2.0, 7.0], [0.0, 1.0, 0.0, 0.0]),
        ([1.0, 7.0, 7.0, 2.0], [0.0, 1.0, 0.0, 0.0]),
        ([9.0, 7.0, 7.0, 9.0], [1.0, 0.0, 0.0, 0.0]),
        ([-1.0, -3.0, -2.0, 0.5], [0.0, 0.0, 0.0, 1.0]),
    ] {
        let xs = Literal::f64([4], x.to_vec()).unwrap();
        let out = kiln_reference::eval(&g, &[xs, w.clone()]).unwrap();
        assert_eq!(out[0].to_f64s(), want, "{x:?}");
        assert_eq!(out[1].to_f64s(), vec![0.0], "{x:?}");
    }
}

/// The gradient of `f` (f64 parameters, one scalar f64 output) at `args` against central
/// differences of the reference interpreter's forward pass.
fn check_gradient(f: &Func, args: &[Literal]) {
    let wrt: Vec<usize> = (0..args.len()).collect();
    let g = grad(f, &wrt).unwrap_or_else(|e| panic!("{e}\n{f}"));
    let got = kiln_reference::eval(&g, args).unwrap();
    let h = 1e-6;
    for (p, arg) in args.iter().enumerate() {
        let base = arg.to_f64s();
        let fd: Vec<f64> = (0..base.len())
            .map(|j| {
                let at = |s: f64| {
                    let mut v = base.clone();
                    v[j] += s;
                    let mut a = args.to_vec();
                    a[p] = Literal::f64(arg.shape().to_vec(), v).unwrap();
                    kiln_reference::eval(f, &a).unwrap()[0].to_f64s()[0]
                };
                (at(h) - at(-h)) / (2.0 * h)
            })
            .collect();
        assert_close(&got[p].to_f64s(), &fd);
    }
}

#[test]
fn the_reverse_mode_of_a_custom_body_matches_central_differences() {
    // log(exp(a) + exp(b)) over two of three dimensions (10 elements a row: odd levels), the
    // init -inf a constant; then a product over rows of 7, 1 and 0 elements, the init a
    // parameter.
    let logaddexp = f("func @main(%0: f64[2, 3, 5]) -> f64[] {
  %1 = constant {value = -inf} : f64[]
  %2 = reduce_region %0, %1 {dimensions = [0, 2], body = func @logaddexp(%0: f64[], %1: f64[]) -> f64[] {
      %2 = exponential %0 : f64[]
      %3 = exponential %1 : f64[]
      %4 = add %2, %3 : f64[]
      %5 = log %4 : f64[]
      return %5
    }} : f64[3]
  %3 = sine %2 : f64[3]
  %4 = constant {value = 0.0} : f64[]
  %5 = reduce %3, %4 {dimensions = [0], kind = add} : f64[]
  return %5
}
");
    let x = Literal::f64(
        [2, 3, 5],
        (0..30)
            .map(|i| ((i * 13) % 17) as f64 * 0.25 - 2.0)
            .collect(),
    )
    .unwrap();
    check_gradient(&logaddexp, &[x]);
    for n in [7, 1, 0] {
        let prod = f(&format!(
            "func @main(%0: f64[3, {n}], %1: f64[]) -> f64[] {{
  %2 = reduce_region %0, %1 {{dimensions = [1], body = func @prod(%0: f64[], %1: f64[]) -> f64[] {{
      %2 = multiply %0, %1 : f64[]
      return %2
    }}}} : f64[3]
  %3 = constant {{value = 0.0}} : f64[]
  %4 = multiply %2, %2 : f64[3]
  %5 = reduce %4, %3 {{dimensions = [0], kind = add}} : f64[]
  return %5
}}
"
        ));
        let x = Literal::f64(
            [3, n],
            (0..3 * n)
                .map(|i| 0.8 + 0.05 * ((i * 5) % 9) as f64)
                .collect(),
        )
        .unwrap();
        check_gradient(&prod, &[x, Literal::f64([], vec![1.25]).unwrap()]);
    }
}

#[test]
fn the_reverse_mode_of_a_body_with_two_float_results_matches_central_differences() {
    // A sum and a sum of squares reduced together; the output mixes both.
    let p = f("func @main(%0: f64[4, 3]) -> f64[] {
  %1 = multiply %0, %0 : f64[4, 3]
  %2 = constant {value = 0.0} : f64[]
  %3, %4 = reduce_region %0, %1, %2, %2 {dimensions = [0], body = func @moments(%0: f64[], %1: f64[], %2: f64[], %3: f64[]) -> (f64[], f64[]) {
      %4 = add %0, %2 : f64[]
      %5 = add %1, %3 : f64[]
      return %4, %5
    }} : f64[3], f64[3]
  %5 = multiply %3, %4 : f64[3]
  %6 = reduce %5, %2 {dimensions = [0], kind = add} : f64[]
  return %6
}
");
    let x = Literal::f64([4, 3], (0..12).map(|i| 0.3 * i as f64 - 1.7).collect()).unwrap();
    check_gradient(&p, &[x]);
}

/// `reduce_window_region` over `f64[4, 6]` with `window`, `body` (two f64 scalars to one) and
/// init `init`, summed after a `sine` so that every result position has its own cotangent.
fn window_program(window: &str, body: &str, init: &str, out: &str) -> Func {
    f(&format!(
        "func @main(%0: f64[4, 6]) -> f64[] {{
  %1 = constant {{value = {init}}} : f64[]
  %2 = reduce_window_region %0, %1 {{{window}, body = {body}}} : f64[{out}]
  %3 = sine %2 : f64[{out}]
  %4 = constant {{value = 0.0}} : f64[]
  %5 = reduce %3, %4 {{dimensions = [0, 1], kind = add}} : f64[]
  return %5
}}
"
    ))
}

#[test]
fn the_reverse_mode_of_a_windowed_region_follows_its_fold() {
    let x = Literal::f64(
        [4, 6],
        (0..24)
            .map(|i| ((i * 11) % 19) as f64 * 0.3 - 2.5)
            .collect(),
    )
    .unwrap();
    // A max pooling as a region and as the named op: the same gradient.
    let max = "func @max(%0: f64[], %1: f64[]) -> f64[] {
      %2 = maximum %0, %1 : f64[]
      return %2
    }";
    let window = "window_dimensions = [2, 3], window_strides = [2, 1], base_dilations = [1, 1], window_dilations = [1, 1], padding = [[0, 1], [1, 0]]";
    let region = window_program(window, max, "-inf", "2, 5");
    let named = f(&format!(
        "func @main(%0: f64[4, 6]) -> f64[] {{
  %1 = constant {{value = -inf}} : f64[]
  %2 = reduce_window %0, %1 {{{window}, kind = max}} : f64[2, 5]
  %3 = sine %2 : f64[2, 5]
  %4 = constant {{value = 0.0}} : f64[]
  %5 = reduce %3, %4 {{dimensions = [0, 1], kind = add}} : f64[]
  return %5
}}
"
    ));
    let gr = grad(&region, &[0]).unwrap_or_else(|e| panic!("{e}"));
    let gn = grad(&named, &[0]).unwrap_or_else(|e| panic!("{e}"));
    let got = kiln_reference::eval(&gr, std::slice::from_ref(&x)).unwrap();
    let want = kiln_reference::eval(&gn, std::slice::from_ref(&x)).unwrap();
    assert_eq!(got[0].to_f64s(), want[0].to_f64s());
    check_gradient(&region, std::slice::from_ref(&x));
    // A smooth body (log(exp(a) + exp(b))) with base and window dilations and a cropping
    // (negative) padding.
    let logaddexp = "func @lae(%0: f64[], %1: f64[]) -> f64[] {
      %2 = exponential %0 : f64[]
      %3 = exponential %1 : f64[]
      %4 = add %2, %3 : f64[]
      %5 = log %4 : f64[]
      return %5
    }";
    let window = "window_dimensions = [2, 2], window_strides = [1, 2], base_dilations = [2, 1], window_dilations = [1, 2], padding = [[1, -1], [0, 1]]";
    check_gradient(
        &window_program(window, logaddexp, "-inf", "6, 3"),
        std::slice::from_ref(&x),
    );
}

#[test]
fn a_gradient_through_a_windowed_argmax_goes_to_the_element_it_selects() {
    // Windows of 3 along a vector, stride 2: each window's first maximum gets the cotangent.
    let p = f("func @main(%0: f64[7]) -> f64[3] {
  %1 = iota {iota_dimension = 0} : i32[7]
  %2 = constant {value = -inf} : f64[]
  %3 = constant {value = 0} : i32[]
  %4, %5 = reduce_window_region %0, %1, %2, %3 {window_dimensions = [3], window_strides = [2], base_dilations = [1], window_dilations = [1], padding = [[0, 0]], body = func @argmax(%0: f64[], %1: i32[], %2: f64[], %3: i32[]) -> (f64[], i32[]) {
      %4 = compare %2, %0 {comparison_direction = GT} : pred[]
      %5 = select %4, %2, %0 : f64[]
      %6 = select %4, %3, %1 : i32[]
      return %5, %6
    }} : f64[3], i32[3]
  return %4
}
");
    let back = kiln_autodiff::vjp(&p, &[0]).unwrap_or_else(|e| panic!("{e}"));
    let x = Literal::f64([7], vec![1.0, 5.0, 5.0, 2.0, 5.0, -1.0, 6.0]).unwrap();
    let ct = Literal::f64([3], vec![10.0, 100.0, 1000.0]).unwrap();
    let out = kiln_reference::eval(&back, &[x, ct]).unwrap();
    // Windows [1, 5, 5] -> element 1; [5, 2, 5] -> element 2; [5, -1, 6] -> element 6.
    assert_eq!(
        out.last().unwrap().to_f64s(),
        vec![0.0, 10.0, 100.0, 0.0, 0.0, 0.0, 1000.0]
    );
}

/// `f`'s forward mode at `x` along `t` (one f64 parameter, one f64 output), and the central
/// difference of `f` there.
fn jvp_and_difference(f: &Func, x: &Literal, t: &Literal) -> (Vec<f64>, Vec<f64>) {
    let j = jvp(f, &[0]).unwrap_or_else(|e| panic!("{e}\n{f}"));
    let out = kiln_reference::eval(&j, &[x.clone(), t.clone()]).unwrap();
    assert_eq!(out.len(), 2, "{j}");
    let h = 1e-6;
    let at = |s: f64| {
        let v: Vec<f64> = x
            .to_f64s()
            .iter()
            .zip(t.to_f64s())
            .map(|(a, b)| a + s * b)
            .collect();
        let xs = Literal::f64(x.shape().to_vec(), v).unwrap();
        kiln_reference::eval(f, &[xs]).unwrap()[0].to_f64s()
    };
    let (p, m) = (at(h), at(-h));
    let fd = p.iter().zip(&m).map(|(a, b)| (a - b) / (2.0 * h)).collect();
    (out[1].to_f64s(), fd)
}

fn assert_close(got: &[f64], want: &[f64]) {
    assert_eq!(got.len(), want.len());
    for (g, w) in got.iter().zip(want) {
        assert!(
            (g - w).abs() <= 1e-6 * (1.0 + w.abs()),
            "{got:?} vs {want:?}"
        );
    }
}

#[test]
fn the_forward_mode_of_an_argmax_follows_the_selected_element() {
    let p = f(&argmax_program(true).replace("(%0: f64[4], %1: f64[])", "(%0: f64[4])"));
    let x = Literal::f64([4], vec![1.0, 7.0, -2.0, 7.0]).unwrap();
    let t = Literal::f64([4], vec![0.1, 0.2, 0.3, 0.4]).unwrap();
    let j = jvp(&p, &[0]).unwrap_or_else(|e| panic!("{e}"));
    let out = kiln_reference::eval(&j, &[x, t]).unwrap();
    // The body keeps the first of equal maxima: element 1, whose tangent is 0.2.
    assert_eq!(out[0].to_f64s(), vec![7.0]);
    assert_eq!(out[1].to_f64s(), vec![0.2]);
}

#[test]
fn the_forward_mode_of_a_product_body_is_the_product_rule() {
    let p = f("func @main(%0: f64[2, 3]) -> f64[2] {
  %1 = constant {value = 1.0} : f64[]
  %2 = reduce_region %0, %1 {dimensions = [1], body = func @prod(%0: f64[], %1: f64[]) -> f64[] {
      %2 = multiply %0, %1 : f64[]
      %3 = sine %2 : f64[]
      %4 = add %2, %3 : f64[]
      return %4
    }} : f64[2]
  return %2
}
");
    let x = Literal::f64([2, 3], vec![0.5, -1.25, 2.0, 0.75, 1.5, -0.5]).unwrap();
    let t = Literal::f64([2, 3], vec![1.0, 0.5, -0.25, 2.0, -1.0, 0.125]).unwrap();
    let (got, fd) = jvp_and_difference(&p, &x, &t);
    assert_close(&got, &fd);
}

#[test]
fn the_forward_mode_of_a_windowed_maximum_matches_the_named_one() {
    let body = "func @max(%0: f64[], %1: f64[]) -> f64[] {
      %2 = maximum %0, %1 : f64[]
      return %2
    }";
    let window = "window_dimensions = [2, 2], window_strides = [1, 2], base_dilations = [1, 1], window_dilations = [1, 1], padding = [[1, 0], [0, 1]]";
    let region = f(&format!(
        "func @main(%0: f64[3, 4]) -> f64[3, 2] {{
  %1 = constant {{value = -inf}} : f64[]
  %2 = reduce_window_region %0, %1 {{{window}, body = {body}}} : f64[3, 2]
  return %2
}}
"
    ));
    let named = f(&format!(
        "func @main(%0: f64[3, 4]) -> f64[3, 2] {{
  %1 = constant {{value = -inf}} : f64[]
  %2 = reduce_window %0, %1 {{{window}, kind = max}} : f64[3, 2]
  return %2
}}
"
    ));
    let x = Literal::f64(
        [3, 4],
        (0..12).map(|i| ((i * 7) % 12) as f64 - 5.5).collect(),
    )
    .unwrap();
    let t = Literal::f64([3, 4], (0..12).map(|i| 0.25 * i as f64 - 1.0).collect()).unwrap();
    let (got, fd) = jvp_and_difference(&region, &x, &t);
    assert_close(&got, &fd);
    let (want, _) = jvp_and_difference(&named, &x, &t);
    assert_eq!(got, want);
}

#[test]
fn vmap_batches_the_kept_dimensions_like_a_loop() {
    let p = f(&argmax_program(true));
    let b = vmap(&p, &[true, false], 3).unwrap_or_else(|e| panic!("{e}"));
    let rows = [
        vec![1.0, 7.0, -2.0, 7.0],
        vec![f64::NEG_INFINITY, -1.0, -3.0, 0.5],
        vec![4.0, 4.0, 4.0, 4.0],
    ];
    let w = Literal::f64([], vec![3.0]).unwrap();
    let xs = Literal::f64([3, 4], rows.concat()).unwrap();
    let got = kiln_reference::eval(&b, &[xs, w.clone()]).unwrap();
    let want: Vec<f64> = rows
        .iter()
        .flat_map(|r| {
            let x = Literal::f64([4], r.clone()).unwrap();
            kiln_reference::eval(&p, &[x, w.clone()]).unwrap()[0].to_f64s()
        })
        .collect();
    assert_eq!(got[0].to_f64s(), want);
    assert!(
        b.insts.iter().any(
            |i| matches!(&i.op, kiln_ir::Op::ReduceRegion { dimensions, .. } if dimensions == &[1])
        ),
        "{b}"
    );
}
