//! Calls under the transformations: the reverse mode, the forward mode and `vmap` of a program
//! with calls compute what they compute on the program with its calls inlined.

use kiln_autodiff::{jvp, vjp, vmap};
use kiln_ir::{Func, Literal, inline_calls, parse_module};

/// `@main` calls `@layer` twice (different arguments), `@layer` calls `@act` (nested), and a
/// result is used several times; a loop's body calls `@act` too.
const PROGRAM: &str = "func @main(%0: f64[3], %1: f64[3]) -> (f64[3], f64[]) {
  %2, %3 = call %0, %1 {callee = @layer} : f64[3], f64[]
  %4, %5 = call %2, %0 {callee = @layer} : f64[3], f64[]
  %6 = multiply %4, %2 : f64[3]
  %7 = add %3, %5 : f64[]
  %8 = constant {value = 0} : i32[]
  %9, %10 = while %8, %6 {cond = func @cond(%0: i32[], %1: f64[3]) -> pred[] {
      %2 = constant {value = 2} : i32[]
      %3 = compare %0, %2 {comparison_direction = LT} : pred[]
      return %3
    }, body = func @body(%0: i32[], %1: f64[3]) -> (i32[], f64[3]) {
      %2 = constant {value = 1} : i32[]
      %3 = add %0, %2 : i32[]
      %4 = call %1 {callee = @act} : f64[3]
      return %3, %4
    }} : i32[], f64[3]
  return %10, %7
}

func @layer(%0: f64[3], %1: f64[3]) -> (f64[3], f64[]) {
  %2 = multiply %0, %1 : f64[3]
  %3 = call %2 {callee = @act} : f64[3]
  %4 = constant {value = 0.0} : f64[]
  %5 = reduce %3, %4 {dimensions = [0], kind = add} : f64[]
  return %3, %5
}

func @act(%0: f64[3]) -> f64[3] {
  %1 = tanh %0 : f64[3]
  %2 = add %1, %0 : f64[3]
  return %2
}
";

fn program() -> Func {
    let m = parse_module(PROGRAM).unwrap_or_else(|e| panic!("{e}"));
    kiln_ir::verify_module(&m).unwrap_or_else(|e| panic!("{e}"));
    m.entry().unwrap().clone()
}

fn v(xs: &[f64]) -> Literal {
    Literal::f64([xs.len()], xs.to_vec()).unwrap()
}

fn run(f: &Func, args: &[Literal]) -> Vec<Vec<f64>> {
    kiln_reference::eval(f, args)
        .unwrap_or_else(|e| panic!("{e}\n{f}"))
        .iter()
        .map(|l| l.to_f64s())
        .collect()
}

fn close(got: &[Vec<f64>], want: &[Vec<f64>]) {
    assert_eq!(got.len(), want.len());
    for (g, w) in got.iter().zip(want) {
        assert_eq!(g.len(), w.len());
        for (a, b) in g.iter().zip(w) {
            assert!((a - b).abs() <= 1e-12 * (1.0 + b.abs()), "{g:?} vs {w:?}");
        }
    }
}

#[test]
fn the_reverse_mode_of_calls_is_that_of_the_inlined_program() {
    let p = program();
    let inlined = inline_calls(&p).unwrap();
    let (g, gi) = (vjp(&p, &[0, 1]).unwrap(), vjp(&inlined, &[0, 1]).unwrap());
    let args = [
        v(&[0.5, -1.0, 2.0]),
        v(&[1.5, 0.25, -0.75]),
        v(&[1.0, 2.0, -1.0]),
        Literal::f64([], vec![0.5]).unwrap(),
    ];
    let got = run(&g, &args);
    close(&got, &run(&gi, &args));
    // The gradients are not zero: the cotangents reached both parameters through the calls.
    assert!(got[2].iter().chain(&got[3]).all(|&x| x != 0.0), "{got:?}");
}

#[test]
fn the_forward_mode_of_calls_is_that_of_the_inlined_program() {
    let p = program();
    let inlined = inline_calls(&p).unwrap();
    let (t, ti) = (jvp(&p, &[1]).unwrap(), jvp(&inlined, &[1]).unwrap());
    let args = [
        v(&[0.5, -1.0, 2.0]),
        v(&[1.5, 0.25, -0.75]),
        v(&[1.0, 0.0, -2.0]),
    ];
    close(&run(&t, &args), &run(&ti, &args));
}

#[test]
fn vmap_of_calls_runs_each_example_as_the_program_does() {
    let p = program();
    let b = vmap(&p, &[true, false], 2).unwrap_or_else(|e| panic!("{e}"));
    let rows = [[0.5, -1.0, 2.0], [3.0, 0.0, -0.5]];
    let y = v(&[1.5, 0.25, -0.75]);
    let xs = Literal::f64([2, 3], rows.concat()).unwrap();
    let got = run(&b, &[xs, y.clone()]);
    let mut want = vec![Vec::new(), Vec::new()];
    for r in &rows {
        for (k, o) in run(&p, &[v(r), y.clone()]).into_iter().enumerate() {
            want[k].extend(o);
        }
    }
    close(&got, &want);
}
