//! Control flow on the GPU: a `while`'s condition and body and a `case`'s branches run as
//! device plans of their own (`kiln_kernel::gpu::plan::ControlStep`), the host only reading
//! the condition or the index back; run on the emulator against the reference interpreter.

use kiln_ir::random::{Rng, random_literal_with_specials};
use kiln_ir::{Literal, parse_func_text};
use kiln_kernel::gpu::plan::{DeviceStep, device_plan};
use kiln_kernel::target::TargetInfo;
use kiln_reference::compare::{Tolerance, check_close};
use kiln_runtime::gpu_emu::compile_and_run;

/// Runs `src` on the emulated H200 on `args` (random ones from `seed` when `None`), checks it
/// against the reference, and returns how many control steps ran their regions on the device
/// (each counted once, nested ones included).
fn run(src: &str, args: Option<Vec<Literal>>, seed: u64) -> usize {
    let f = parse_func_text(src).unwrap_or_else(|e| panic!("{e}\n{src}"));
    let args = args.unwrap_or_else(|| {
        let mut rng = Rng::new(seed);
        f.param_types()
            .iter()
            .map(|t| random_literal_with_specials(&mut rng, t, 0.0))
            .collect()
    });
    let opts = kiln_kernel::Options::default();
    let (got, rep) = compile_and_run(&f, &[], &opts, &TargetInfo::h200(), &args)
        .unwrap_or_else(|e| panic!("{e}\n{src}"));
    assert!(rep.fallbacks.is_empty(), "{:?}\n{src}", rep.fallbacks);
    kiln_reference::accuracy::check_outputs(&f, &args, &got)
        .unwrap_or_else(|e| panic!("{e}\n{src}"));
    // A loop's results have no bound of their own there (checked by class): within a few
    // hundred ulps here, where the reference rounds each trip's sums once and the GPU sums in
    // f32 by its tree.
    let want = kiln_reference::eval(&f, &args).unwrap();
    for (g, w) in got.iter().zip(&want) {
        check_close(g, w, Tolerance::ulps(w.dtype(), 256.0))
            .unwrap_or_else(|e| panic!("{e}\n{src}"));
    }
    rep.controls
}

/// A loop of a data-dependent trip count: doubles `x` (and counts) until its sum passes
/// `limit`; a softmax of the result after it.
const DOUBLING: &str = "func @main(%0: f32[4,8], %1: f32[]) -> (i32[], f32[4,8]) {
  %2 = constant {value = 0} : i32[]
  %3, %4 = while %2, %0 {cond = func @cond(%0: i32[], %1: f32[4,8]) -> pred[] {
      %2 = multiply %1, %1 : f32[4,8]
      %3 = constant {value = 0.0} : f32[]
      %4 = reduce %2, %3 {dimensions = [0, 1], kind = add} : f32[]
      %5 = constant {value = 1000.0} : f32[]
      %6 = compare %4, %5 {comparison_direction = LT} : pred[]
      %7 = constant {value = 20} : i32[]
      %8 = compare %0, %7 {comparison_direction = LT} : pred[]
      %9 = and %6, %8 : pred[]
      return %9
    }, body = func @body(%0: i32[], %1: f32[4,8]) -> (i32[], f32[4,8]) {
      %2 = constant {value = 1} : i32[]
      %3 = add %0, %2 : i32[]
      %4 = add %1, %1 : f32[4,8]
      %5 = tanh %4 : f32[4,8]
      %6 = add %4, %5 : f32[4,8]
      return %3, %6
    }} : i32[], f32[4,8]
  %5 = constant {value = -inf} : f32[]
  %6 = reduce %4, %5 {dimensions = [1], kind = max} : f32[4]
  %7 = broadcast_in_dim %6 {broadcast_dimensions = [0]} : f32[4,8]
  %8 = subtract %4, %7 : f32[4,8]
  %9 = exponential %8 : f32[4,8]
  return %3, %9
}
";

/// Branches with products and reductions, chosen by an index (out of range: the last).
const BRANCHES: &str = "func @main(%0: i32[], %1: f32[6,5], %2: f32[5,3]) -> (f32[6,3], f32[]) {
  %3, %4 = case %0, %1, %2 {branches = [func @b0(%0: f32[6,5], %1: f32[5,3]) -> (f32[6,3], f32[]) {
      %2 = dot_general %0, %1 {lhs_batching_dimensions = [], rhs_batching_dimensions = [], lhs_contracting_dimensions = [1], rhs_contracting_dimensions = [0]} : f32[6,3]
      %3 = constant {value = 0.0} : f32[]
      %4 = reduce %0, %3 {dimensions = [0, 1], kind = add} : f32[]
      return %2, %4
    }, func @b1(%0: f32[6,5], %1: f32[5,3]) -> (f32[6,3], f32[]) {
      %2 = constant {value = 1.5} : f32[]
      %3 = broadcast_in_dim %2 {broadcast_dimensions = []} : f32[6,3]
      %4 = constant {value = -inf} : f32[]
      %5 = reduce %1, %4 {dimensions = [0, 1], kind = max} : f32[]
      return %3, %5
    }]} : f32[6,3], f32[]
  return %3, %4
}
";

/// A loop whose body holds a branch, one of whose branches sorts (on the GPU): regions inside
/// regions.
const NESTED: &str = "func @main(%0: f32[16], %1: i32[]) -> (i32[], f32[16]) {
  %2 = constant {value = 0} : i32[]
  %3, %4, %5 = while %2, %0, %1 {cond = func @cond(%0: i32[], %1: f32[16], %2: i32[]) -> pred[] {
      %3 = constant {value = 3} : i32[]
      %4 = compare %0, %3 {comparison_direction = LT} : pred[]
      return %4
    }, body = func @body(%0: i32[], %1: f32[16], %2: i32[]) -> (i32[], f32[16], i32[]) {
      %3 = constant {value = 1} : i32[]
      %4 = add %0, %3 : i32[]
      %5 = case %2, %1 {branches = [func @up(%0: f32[16]) -> f32[16] {
          %1 = sort %0 {dimension = 0, is_stable = true, comparator = func @lt(%0: f32[], %1: f32[]) -> pred[] {
              %2 = compare %0, %1 {comparison_direction = LT} : pred[]
              %3 = compare %1, %1 {comparison_direction = NE} : pred[]
              %4 = compare %0, %0 {comparison_direction = EQ} : pred[]
              %5 = and %3, %4 : pred[]
              %6 = or %2, %5 : pred[]
              return %6
            }} : f32[16]
          return %1
        }, func @neg(%0: f32[16]) -> f32[16] {
          %1 = negate %0 : f32[16]
          return %1
        }]} : f32[16]
      %6 = constant {value = 1} : i32[]
      %7 = subtract %6, %2 : i32[]
      return %4, %5, %7
    }} : i32[], f32[16], i32[]
  return %3, %4
}
";

#[test]
fn loops_run_their_condition_and_body_on_the_device() {
    for seed in 0..3 {
        let f = parse_func_text(DOUBLING).unwrap();
        let mut rng = Rng::new(seed);
        let x = random_literal_with_specials(&mut rng, &f.param_types()[0], 0.0);
        let limit = Literal::f32([], vec![1000.0]).unwrap();
        assert_eq!(run(DOUBLING, Some(vec![x, limit]), seed), 1);
    }
}

#[test]
fn branches_run_on_the_device_and_an_index_out_of_range_takes_the_last() {
    let f = parse_func_text(BRANCHES).unwrap();
    for index in [0, 1, 7, -2] {
        let mut rng = Rng::new((index + 20) as u64);
        let mut args = vec![Literal::i32([], vec![index]).unwrap()];
        for t in &f.param_types()[1..] {
            args.push(random_literal_with_specials(&mut rng, t, 0.0));
        }
        assert_eq!(run(BRANCHES, Some(args), 0), 1, "index {index}");
    }
}

#[test]
fn regions_inside_regions_run_on_the_device() {
    for seed in 0..2 {
        let f = parse_func_text(NESTED).unwrap();
        let mut rng = Rng::new(seed);
        let x = random_literal_with_specials(&mut rng, &f.param_types()[0], 0.0);
        let which = Literal::i32([], vec![seed as i32]).unwrap();
        assert_eq!(run(NESTED, Some(vec![x, which]), seed), 2);
    }
    // The plan: the loop's regions in an area of the arena after the program's, the branch's
    // after the body's.
    let f = parse_func_text(NESTED).unwrap();
    let t = TargetInfo::h200();
    let l = kiln_kernel::pipeline::lower_program(
        &f,
        &[],
        &kiln_kernel::Options::default(),
        &t,
        None,
        &mut |_| {},
    )
    .unwrap();
    let plan = device_plan(&l, &t).unwrap();
    let control = plan
        .steps
        .iter()
        .find_map(|s| match s {
            DeviceStep::Control(c) => Some(c),
            _ => None,
        })
        .expect("the loop is a control step");
    let mut end = 0;
    for r in &control.regions {
        let lo = r
            .params()
            .iter()
            .map(|p| p.offset)
            .min()
            .unwrap_or(usize::MAX);
        assert!(lo >= end, "a region's values start at {lo}, before {end}");
        end = lo;
        assert!(r.arena_bytes > 0);
    }
    assert!(plan.arena_bytes >= end);
    let text = kiln_kernel::gpu::plan_print::plan_text(&plan);
    assert!(text.contains("control #"), "{text}");
}
