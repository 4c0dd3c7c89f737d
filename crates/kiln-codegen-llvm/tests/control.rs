//! Control flow on the CPU backend: `while` and `case` run on the host, each region as a
//! compiled program of its own (no instruction on the reference interpreter), and agree with
//! the reference.

use kiln_codegen_llvm::cpu::{CpuExecutable, Step};
use kiln_ir::{Literal, parse_func_text};

/// A loop over a vector and a counter whose body holds a few fusable elementwise ops and a
/// reduction, followed by work on its results.
const LOOP: &str = "func @main(%0: i32[], %1: f32[64]) -> (i32[], f32[64], f32[]) {
  %2, %3 = while %0, %1 {cond = func @cond(%0: i32[], %1: f32[64]) -> pred[] {
      %2 = constant {value = 0.0} : f32[]
      %3 = reduce %1, %2 {dimensions = [0], kind = add} : f32[]
      %4 = constant {value = 1000.0} : f32[]
      %5 = compare %3, %4 {comparison_direction = LT} : pred[]
      return %5
    }, body = func @body(%0: i32[], %1: f32[64]) -> (i32[], f32[64]) {
      %2 = constant {value = 1} : i32[]
      %3 = add %0, %2 : i32[]
      %4 = constant {value = 1.5} : f32[]
      %5 = broadcast_in_dim %4 {broadcast_dimensions = []} : f32[64]
      %6 = multiply %1, %5 : f32[64]
      %7 = add %6, %5 : f32[64]
      return %3, %7
    }} : i32[], f32[64]
  %4 = constant {value = 0.0} : f32[]
  %5 = reduce %3, %4 {dimensions = [0], kind = max} : f32[]
  return %2, %3, %5
}
";

fn vector(n: usize) -> Literal {
    Literal::f32([n], (0..n).map(|i| (i % 7) as f32 * 0.25).collect()).unwrap()
}

#[test]
fn a_loop_runs_on_the_host_with_compiled_regions() {
    let f = parse_func_text(LOOP).unwrap();
    let exe = CpuExecutable::compile(&f).unwrap();
    assert!(exe.plan().contains(&Step::Control), "{:?}", exe.plan());
    assert!(!exe.plan().contains(&Step::Reference), "{:?}", exe.plan());
    let args = [Literal::i32([], vec![0]).unwrap(), vector(64)];
    let got = exe.run(&args).unwrap();
    let want = kiln_reference::eval(&f, &args).unwrap();
    assert_eq!(got, want);
    assert!(got[0].to_i64s()[0] > 1, "{:?}", got[0]);
}

#[test]
fn a_case_runs_the_branch_its_index_picks() {
    let src = "func @main(%0: i32[], %1: f32[8]) -> f32[8] {
  %2 = case %0, %1 {branches = [func @branch0(%0: f32[8]) -> f32[8] {
      %1 = exponential %0 : f32[8]
      return %1
    }, func @branch1(%0: f32[8]) -> f32[8] {
      %1 = negate %0 : f32[8]
      %2 = multiply %1, %0 : f32[8]
      return %2
    }]} : f32[8]
  return %2
}
";
    let f = parse_func_text(src).unwrap();
    let exe = CpuExecutable::compile(&f).unwrap();
    assert_eq!(exe.plan(), &[Step::Control]);
    for k in [-3, 0, 1, 2, i32::MAX] {
        let args = [Literal::i32([], vec![k]).unwrap(), vector(8)];
        let got = exe.run(&args).unwrap();
        let want = kiln_reference::eval(&f, &args).unwrap();
        let (g, w) = (got[0].to_f64s(), want[0].to_f64s());
        for (a, b) in g.iter().zip(&w) {
            assert!(
                (a - b).abs() <= 4.0 * f32::EPSILON as f64 * b.abs(),
                "{k}: {g:?} vs {w:?}"
            );
        }
    }
}

/// The host loop's cost per trip on a tiny body (printed; the bound is loose, for a loaded
/// machine): the condition's and the body's programs run once each per trip.
#[test]
fn host_loop_overhead_per_trip() {
    let src = "func @main(%0: i32[], %1: f32[4]) -> (i32[], f32[4]) {
  %2, %3 = while %0, %1 {cond = func @cond(%0: i32[], %1: f32[4]) -> pred[] {
      %2 = constant {value = 100000} : i32[]
      %3 = compare %0, %2 {comparison_direction = LT} : pred[]
      return %3
    }, body = func @body(%0: i32[], %1: f32[4]) -> (i32[], f32[4]) {
      %2 = constant {value = 1} : i32[]
      %3 = add %0, %2 : i32[]
      %4 = add %1, %1 : f32[4]
      return %3, %4
    }} : i32[], f32[4]
  return %2, %3
}
";
    let f = parse_func_text(src).unwrap();
    let exe = CpuExecutable::compile(&f).unwrap();
    let args = [Literal::i32([], vec![0]).unwrap(), vector(4)];
    let start = std::time::Instant::now();
    let got = exe.run(&args).unwrap();
    let per_trip = start.elapsed().as_secs_f64() / 1e5;
    assert_eq!(got[0].to_i64s(), vec![100000]);
    println!(
        "host loop: {:.2} us per trip (cond + body programs)",
        per_trip * 1e6
    );
    assert!(per_trip < 1e-3, "{per_trip} s per trip");
}
