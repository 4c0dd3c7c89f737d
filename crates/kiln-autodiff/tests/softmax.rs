//! The softmax's VJP in terms of its result: a division of exponentials by their broadcast sum
//! is differentiated as `p·(ḡ − Σ ḡ·p)`, so the backward pass reads the softmax's result and
//! not its exponentials. Each form below is checked against central differences of the
//! reference, and the exponentials' readers are counted.

use kiln_ir::{DType, Func, Literal, Op, TensorType, parse_func_text};

/// A softmax over the last axis of `f64[3,5]` with `keepdims` (the sum reshaped to `[3,1]`),
/// its input shifted by its detached row maximum as `Tensor::softmax` traces it.
const KEEPDIMS: &str = "func @main(%0: f64[3,5]) -> f64[3,5] {
  %1 = constant {value = -inf} : f64[]
  %2 = reduce %0, %1 {dimensions = [1], kind = max} : f64[3]
  %3 = reshape %2 : f64[3,1]
  %4 = bitcast_convert %3 : i64[3,1]
  %5 = bitcast_convert %4 : f64[3,1]
  %6 = broadcast_in_dim %5 {broadcast_dimensions = [0, 1]} : f64[3,5]
  %7 = subtract %0, %6 : f64[3,5]
  %8 = exponential %7 : f64[3,5]
  %9 = constant {value = 0.0} : f64[]
  %10 = reduce %8, %9 {dimensions = [1], kind = add} : f64[3]
  %11 = reshape %10 : f64[3,1]
  %12 = broadcast_in_dim %11 {broadcast_dimensions = [0, 1]} : f64[3,5]
  %13 = divide %8, %12 : f64[3,5]
  return %13
}";

/// Over the first two axes of `f64[2,3,4]`, the sum broadcast back without a reshape.
const TWO_AXES: &str = "func @main(%0: f64[2,3,4]) -> f64[2,3,4] {
  %1 = exponential %0 : f64[2,3,4]
  %2 = constant {value = 0.0} : f64[]
  %3 = reduce %1, %2 {dimensions = [0, 1], kind = add} : f64[4]
  %4 = broadcast_in_dim %3 {broadcast_dimensions = [2]} : f64[2,3,4]
  %5 = divide %1, %4 : f64[2,3,4]
  return %5
}";

/// The exponentials read again after the softmax (a second output): their cotangent from that
/// reader takes the ordinary rule and adds to the softmax's.
const SHARED: &str = "func @main(%0: f64[3,4]) -> (f64[3,4], f64[3]) {
  %1 = exponential %0 : f64[3,4]
  %2 = constant {value = 0.0} : f64[]
  %3 = reduce %1, %2 {dimensions = [1], kind = add} : f64[3]
  %4 = broadcast_in_dim %3 {broadcast_dimensions = [0]} : f64[3,4]
  %5 = divide %1, %4 : f64[3,4]
  %6 = multiply %1, %1 : f64[3,4]
  %7 = reduce %6, %2 {dimensions = [1], kind = add} : f64[3]
  %8 = add %7, %3 : f64[3]
  return %5, %8
}";

/// A sum starting from one: not a softmax, differentiated op by op.
const OFFSET: &str = "func @main(%0: f64[3,4]) -> f64[3,4] {
  %1 = exponential %0 : f64[3,4]
  %2 = constant {value = 1.0} : f64[]
  %3 = reduce %1, %2 {dimensions = [1], kind = add} : f64[3]
  %4 = broadcast_in_dim %3 {broadcast_dimensions = [0]} : f64[3,4]
  %5 = divide %1, %4 : f64[3,4]
  return %5
}";

fn lit(t: &TensorType, seed: u64) -> Literal {
    let n: usize = t.shape.iter().product();
    let xs: Vec<f64> = (0..n)
        .map(|i| (((i as u64 * 7919 + seed * 104_729) % 1000) as f64 / 250.0) - 2.0)
        .collect();
    Literal::from_f64s(t.clone(), &xs).unwrap()
}

fn dot(a: &[Literal], b: &[Literal]) -> f64 {
    a.iter()
        .zip(b)
        .map(|(x, y)| {
            x.to_f64s()
                .iter()
                .zip(y.to_f64s())
                .map(|(p, q)| p * q)
                .sum::<f64>()
        })
        .sum()
}

/// `<vjp(x, c), t>` against the central difference of `<c, f(x + s t)>`.
fn check(f: &Func) {
    let v = kiln_autodiff::vjp(f, &[0]).unwrap();
    kiln_ir::verify(&v).unwrap();
    let pt = f.param_types()[0].clone();
    let x = lit(&pt, 1);
    let t = lit(&pt, 2);
    let cs: Vec<Literal> = f
        .output_types
        .iter()
        .enumerate()
        .map(|(k, ty)| lit(ty, 3 + k as u64))
        .collect();
    let mut args = vec![x.clone()];
    args.extend(cs.iter().cloned());
    let out = kiln_reference::eval(&v, &args).unwrap();
    let want = kiln_reference::eval(f, std::slice::from_ref(&x)).unwrap();
    assert_eq!(&out[..want.len()], &want[..], "the forward outputs");
    let analytic = dot(&out[want.len()..], std::slice::from_ref(&t));
    let h = 1e-6;
    let at = |s: f64| {
        let xs: Vec<f64> = x
            .to_f64s()
            .iter()
            .zip(t.to_f64s())
            .map(|(a, b)| a + s * b)
            .collect();
        let y = kiln_reference::eval(f, &[Literal::from_f64s(pt.clone(), &xs).unwrap()]).unwrap();
        dot(&y, &cs)
    };
    let numeric = (at(h) - at(-h)) / (2.0 * h);
    assert!(
        (analytic - numeric).abs() <= 1e-7 * (1.0 + numeric.abs()),
        "vjp {analytic} against central differences {numeric}\n{v}"
    );
}

/// How many instructions of the VJP read the function's exponentials.
fn exponential_readers(f: &Func) -> usize {
    let v = kiln_autodiff::vjp(f, &[0]).unwrap();
    let e = v
        .insts
        .iter()
        .find(|i| matches!(i.op, Op::Exponential {}))
        .expect("the forward pass")
        .results[0];
    v.insts.iter().filter(|i| i.operands.contains(&e)).count()
}

#[test]
fn softmax_gradients_agree_with_central_differences() {
    for text in [KEEPDIMS, TWO_AXES, SHARED, OFFSET] {
        check(&parse_func_text(text).unwrap());
    }
}

#[test]
fn the_softmax_backward_reads_its_result_not_its_exponentials() {
    // The forward pass's sum and division read the exponentials; the backward pass does not.
    for text in [KEEPDIMS, TWO_AXES] {
        assert_eq!(exponential_readers(&parse_func_text(text).unwrap()), 2);
    }
    // The exponentials' own reader adds its one (`multiply %1, %1` read once) and its
    // derivative's (`2 e ē`, read by the exponential's rule and the square's).
    assert!(exponential_readers(&parse_func_text(SHARED).unwrap()) > 3);
    // A sum with an offset is no softmax: the division's rule reads the exponentials.
    assert!(exponential_readers(&parse_func_text(OFFSET).unwrap()) > 2);
}

#[test]
fn a_traced_softmax_in_f32_is_recognized() {
    let f = parse_func_text(&KEEPDIMS.replace("f64", "f32").replace("i64", "u32")).unwrap();
    assert_eq!(exponential_readers(&f), 2);
    let v = kiln_autodiff::vjp(&f, &[0]).unwrap();
    assert_eq!(v.values[v.params[0].index()].dtype, DType::F32);
}
