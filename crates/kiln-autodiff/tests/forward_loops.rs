//! The forward mode through `while` loops: loops whose trip count depends on the data (which
//! have no reverse mode), carries a tangent reaches only through the body, loops in branches
//! and loops in loops; and a loop with a static trip count, differentiated forward, still has a
//! reverse mode (Hessian-vector products).

use kiln_autodiff::{jvp, vjp};
use kiln_ir::{Func, Literal, parse_func_text};

fn f(text: &str) -> Func {
    parse_func_text(text).unwrap_or_else(|e| panic!("{e}\n{text}"))
}

fn s(x: f64) -> Literal {
    Literal::f64([], vec![x]).unwrap()
}

fn i(x: i32) -> Literal {
    Literal::i32([], vec![x]).unwrap()
}

fn run(f: &Func, args: &[Literal]) -> Vec<f64> {
    kiln_reference::eval(f, args)
        .unwrap_or_else(|e| panic!("{e}\n{f}"))
        .iter()
        .flat_map(|l| l.to_f64s())
        .collect()
}

fn close(got: f64, want: f64) {
    assert!(
        (got - want).abs() <= 1e-12 * (1.0 + want.abs()),
        "{got} vs {want}"
    );
}

/// x halved until it is at most 1: x / 2^k for the trip count k the data decides.
const HALVING: &str = "func @main(%0: f64[]) -> f64[] {
  %1 = while %0 {cond = func @cond(%0: f64[]) -> pred[] {
      %1 = constant {value = 1.0} : f64[]
      %2 = compare %0, %1 {comparison_direction = GT} : pred[]
      return %2
    }, body = func @body(%0: f64[]) -> f64[] {
      %1 = constant {value = 0.5} : f64[]
      %2 = multiply %0, %1 : f64[]
      %3 = multiply %2, %2 : f64[]
      %4 = sqrt %3 : f64[]
      return %4
    }} : f64[]
  return %1
}
";

#[test]
fn a_loop_whose_trip_count_depends_on_the_data_differentiates_forward() {
    let g = f(HALVING);
    let j = jvp(&g, &[0]).unwrap();
    kiln_ir::verify(&j).unwrap();
    for (x, k) in [(10.0, 4), (0.5, 0), (3.0, 2), (1000.0, 10)] {
        let out = run(&j, &[s(x), s(1.0)]);
        close(out[0], x / f64::powi(2.0, k));
        close(out[1], 1.0 / f64::powi(2.0, k));
    }
    // Its reverse mode stays an error that says how to write the loop.
    let e = vjp(&j, &[0]).unwrap_err().to_string();
    assert!(e.contains("fori_loop"), "{e}");
    let e = vjp(&g, &[0]).unwrap_err().to_string();
    assert!(e.contains("fori_loop"), "{e}");
}

/// acc starts at 0 (no tangent) and gains x each of 3 iterations; y is never touched by x.
const ACCUMULATE: &str = "func @main(%0: f64[], %1: f64[]) -> (f64[], f64[]) {
  %2 = constant {value = 0} : i32[]
  %3 = constant {value = 0.0} : f64[]
  %4, %5, %6, %7 = while %2, %3, %0, %1 {cond = func @cond(%0: i32[], %1: f64[], %2: f64[], %3: f64[]) -> pred[] {
      %4 = constant {value = 3} : i32[]
      %5 = compare %0, %4 {comparison_direction = LT} : pred[]
      return %5
    }, body = func @body(%0: i32[], %1: f64[], %2: f64[], %3: f64[]) -> (i32[], f64[], f64[], f64[]) {
      %4 = constant {value = 1} : i32[]
      %5 = add %0, %4 : i32[]
      %6 = multiply %2, %2 : f64[]
      %7 = add %1, %6 : f64[]
      %8 = sine %3 : f64[]
      return %5, %7, %2, %8
    }} : i32[], f64[], f64[], f64[]
  return %5, %7
}
";

#[test]
fn a_carry_reached_only_through_the_body_gets_its_tangent() {
    let g = f(ACCUMULATE);
    // With respect to x alone: acc = 3 x^2, so acc' = 6 x t; y's tangent is zero.
    let j = jvp(&g, &[0]).unwrap();
    let out = run(&j, &[s(1.5), s(0.3), s(2.0)]);
    close(out[0], 3.0 * 1.5 * 1.5);
    close(out[2], 6.0 * 1.5 * 2.0);
    close(out[3], 0.0);
    // With respect to y alone: y = sin(sin(sin(y))).
    let j = jvp(&g, &[1]).unwrap();
    let out = run(&j, &[s(1.5), s(0.3), s(1.0)]);
    let (y1, y2) = (0.3f64.sin(), 0.3f64.sin().sin());
    close(out[1], y2.sin());
    close(out[2], 0.0);
    close(out[3], y2.cos() * y1.cos() * 0.3f64.cos());
}

#[test]
fn a_loop_with_a_static_trip_count_differentiated_forward_still_has_a_reverse_mode() {
    // x^8 by three squarings; the JVP is 8 x^7 t, and its gradient with respect to x is
    // 56 x^6 t: a Hessian-vector product through the loop.
    let g = f("func @main(%0: f64[]) -> f64[] {
  %1 = constant {value = 0} : i32[]
  %2, %3 = while %1, %0 {cond = func @cond(%0: i32[], %1: f64[]) -> pred[] {
      %2 = constant {value = 3} : i32[]
      %3 = compare %0, %2 {comparison_direction = LT} : pred[]
      return %3
    }, body = func @body(%0: i32[], %1: f64[]) -> (i32[], f64[]) {
      %2 = constant {value = 1} : i32[]
      %3 = add %0, %2 : i32[]
      %4 = multiply %1, %1 : f64[]
      return %3, %4
    }} : i32[], f64[]
  return %3
}
");
    let j = jvp(&g, &[0]).unwrap();
    let x = 1.1;
    let out = run(&j, &[s(x), s(0.5)]);
    close(out[0], x.powi(8));
    close(out[1], 8.0 * x.powi(7) * 0.5);
    // The tangent output alone, differentiated in reverse with respect to x.
    let dot = kiln_autodiff::select_outputs(&j, &[1], "dot");
    let h = vjp(&dot, &[0]).unwrap();
    let out = run(&h, &[s(x), s(0.5), s(1.0)]);
    close(out[0], 8.0 * x.powi(7) * 0.5);
    close(out[1], 56.0 * x.powi(6) * 0.5);
}

#[test]
fn loops_in_branches_and_in_loops_differentiate_forward() {
    // case 0: the halving loop, nested in a loop that runs it on x + i for i = 0, 1;
    // case 1: x * x.
    let g = f("func @main(%0: i32[], %1: f64[]) -> f64[] {
  %2 = case %0, %1 {branches = [func @outer(%0: f64[]) -> f64[] {
      %1 = constant {value = 0} : i32[]
      %2 = constant {value = 0.0} : f64[]
      %3, %4, %5 = while %1, %2, %0 {cond = func @cond(%0: i32[], %1: f64[], %2: f64[]) -> pred[] {
          %3 = constant {value = 2} : i32[]
          %4 = compare %0, %3 {comparison_direction = LT} : pred[]
          return %4
        }, body = func @body(%0: i32[], %1: f64[], %2: f64[]) -> (i32[], f64[], f64[]) {
          %3 = constant {value = 1} : i32[]
          %4 = add %0, %3 : i32[]
          %5 = convert %0 : f64[]
          %6 = add %2, %5 : f64[]
          %7 = while %6 {cond = func @cond(%0: f64[]) -> pred[] {
              %1 = constant {value = 1.0} : f64[]
              %2 = compare %0, %1 {comparison_direction = GT} : pred[]
              return %2
            }, body = func @body(%0: f64[]) -> f64[] {
              %1 = constant {value = 0.5} : f64[]
              %2 = multiply %0, %1 : f64[]
              return %2
            }} : f64[]
          %8 = add %1, %7 : f64[]
          return %4, %8, %2
        }} : i32[], f64[], f64[]
      return %4
    }, func @square(%0: f64[]) -> f64[] {
      %1 = multiply %0, %0 : f64[]
      return %1
    }]} : f64[]
  return %2
}
");
    let j = jvp(&g, &[1]).unwrap();
    kiln_ir::verify(&j).unwrap();
    // x = 6: 6 / 8 (three halvings) + 7 / 8 (three halvings); the tangent 1/8 + 1/8.
    let out = run(&j, &[i(0), s(6.0), s(1.0)]);
    close(out[0], 6.0 / 8.0 + 7.0 / 8.0);
    close(out[1], 0.25);
    // x = 7.5: 7.5 / 8 + 8.5 / 16.
    let out = run(&j, &[i(0), s(7.5), s(2.0)]);
    close(out[0], 7.5 / 8.0 + 8.5 / 16.0);
    close(out[1], 2.0 / 8.0 + 2.0 / 16.0);
    let out = run(&j, &[i(1), s(3.0), s(0.5)]);
    close(out[0], 9.0);
    close(out[1], 3.0);
}

/// An op without a forward rule in a program differentiated instruction by instruction (it
/// has a loop): the error names the op, and, for a program read from text (no source
/// locations), no location at all, never a line of kiln or of Rust's library.
#[test]
fn an_op_without_a_rule_is_named_without_a_borrowed_location() {
    let f = kiln_ir::parse_func_text(
        "func @main(%0: f64[4], %1: f64[]) -> (f64[2], f64[]) {
  %2 = reduce_window %0, %1 {window_dimensions = [2], window_strides = [1], base_dilations = [1], window_dilations = [2], padding = [[0, 0]], kind = max} : f64[2]
  %3 = constant {value = 0} : i32[]
  %4, %5 = while %3, %1 {cond = func @cond(%0: i32[], %1: f64[]) -> pred[] {
      %2 = constant {value = 2} : i32[]
      %3 = compare %0, %2 {comparison_direction = LT} : pred[]
      return %3
    }, body = func @body(%0: i32[], %1: f64[]) -> (i32[], f64[]) {
      %2 = constant {value = 1} : i32[]
      %3 = add %0, %2 : i32[]
      %4 = multiply %1, %1 : f64[]
      return %3, %4
    }} : i32[], f64[]
  return %2, %5
}",
    )
    .unwrap();
    let e = kiln_autodiff::jvp(&f, &[0, 1]).unwrap_err().to_string();
    println!("{e}");
    assert!(e.contains("reduce_window"), "{e}");
    assert!(!e.contains(".rs:"), "{e}");
}

/// A loop and a branch without source locations (read from text) keep none in their forward
/// derivatives: the `while` and `case` built for them carry no line of kiln's code.
#[test]
fn loops_and_branches_without_locations_keep_none_forward() {
    let f = f("func @main(%0: f64[], %1: i32[]) -> (f64[], f64[]) {
  %2 = constant {value = 0} : i32[]
  %3, %4 = while %2, %0 {cond = func @cond(%0: i32[], %1: f64[]) -> pred[] {
      %2 = constant {value = 2} : i32[]
      %3 = compare %0, %2 {comparison_direction = LT} : pred[]
      return %3
    }, body = func @body(%0: i32[], %1: f64[]) -> (i32[], f64[]) {
      %2 = constant {value = 1} : i32[]
      %3 = add %0, %2 : i32[]
      %4 = multiply %1, %1 : f64[]
      return %3, %4
    }} : i32[], f64[]
  %5 = case %1, %0 {branches = [func @b0(%0: f64[]) -> f64[] {
      %1 = sine %0 : f64[]
      return %1
    }, func @b1(%0: f64[]) -> f64[] {
      %1 = cosine %0 : f64[]
      return %1
    }]} : f64[]
  return %4, %5
}");
    let j = jvp(&f, &[0]).unwrap();
    let located: Vec<String> = j
        .insts
        .iter()
        .enumerate()
        .filter_map(|(k, inst)| inst.loc.map(|l| format!("instruction {k} at {l:?}")))
        .collect();
    assert!(located.is_empty(), "{located:?}");
}
