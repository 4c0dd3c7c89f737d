//! Batching checks generated from the op list: every op's spec examples, batched by `vmap`
//! over random per-example inputs, against the loop that runs the original function on each
//! example and stacks the results. Every pattern of batched parameters is tried (all of them,
//! and each one alone with the others shared), on the reference interpreter.

use kiln_ir::random::{Config, Rng, random_func, random_literal};
use kiln_ir::{DType, Func, Literal, TensorType};
use kiln_reference::compare::{Tolerance, check_close};
use kiln_tests::{load_example, load_specs};

/// A random value like `example`: floats uniform and integers uniform over the range the
/// example's own elements span (so domains such as "positive" or "a valid index" carry over),
/// `pred` random.
fn like(rng: &mut Rng, example: &Literal) -> Literal {
    let t = example.ty().clone();
    if t.dtype == DType::Pred {
        let v: Vec<i64> = (0..t.numel()).map(|_| rng.below(2) as i64).collect();
        return Literal::from_i64s(t, &v).unwrap();
    }
    if t.dtype.is_float() {
        let xs = example.to_f64s();
        let finite: Vec<f64> = xs.iter().copied().filter(|x| x.is_finite()).collect();
        let lo = finite.iter().copied().fold(f64::INFINITY, f64::min);
        let hi = finite.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let v: Vec<f64> = xs
            .iter()
            .map(|&x| {
                if !x.is_finite() || lo >= hi {
                    x
                } else {
                    rng.uniform(lo, hi)
                }
            })
            .collect();
        return Literal::from_f64s(t, &v).unwrap();
    }
    let xs = example.to_i64s();
    // (A u64's bits past 2^63 are negative here: the span is taken in i128.)
    let lo = xs.iter().copied().min().unwrap_or(0);
    let hi = xs.iter().copied().max().unwrap_or(0);
    let span = (hi as i128 - lo as i128 + 1).min(usize::MAX as i128) as usize;
    let v: Vec<i64> = xs
        .iter()
        .map(|_| lo.wrapping_add(rng.below(span) as i64))
        .collect();
    Literal::from_i64s(t, &v).unwrap()
}

/// `xs` stacked along a new leading dimension.
fn stack(t: &TensorType, xs: &[Literal]) -> Literal {
    let mut shape = vec![xs.len()];
    shape.extend(&t.shape);
    let bytes: Vec<u8> = xs.iter().flat_map(|x| x.to_le_bytes()).collect();
    Literal::from_le_bytes(TensorType::new(t.dtype, shape), &bytes).unwrap()
}

fn eval(f: &Func, args: &[Literal]) -> Vec<Literal> {
    kiln_reference::eval(f, args).unwrap_or_else(|e| panic!("{e}\n{f}"))
}

/// Checks `vmap(f)` with parameters batched as `flags` against the loop, `size` examples.
fn check(name: &str, f: &Func, example: &[Literal], flags: &[bool], size: usize, rng: &mut Rng) {
    let batched = kiln_autodiff::vmap(f, flags, size)
        .unwrap_or_else(|e| panic!("{name}: vmap {flags:?}: {e}\n{f}"));
    kiln_ir::verify(&batched).unwrap_or_else(|e| panic!("{name}: {e}\n{batched}"));
    // An op said to batch as a whole never falls back to the per-example loop.
    let kind = kiln_ir::OpKind::from_mnemonic(name).unwrap();
    if kiln_autodiff::vmap::batching(kind) == kiln_autodiff::vmap::Batching::Whole {
        assert!(
            !kiln_ir::print_func(&batched).contains("vmap_body"),
            "{name}: batched by a loop although its rule is whole-batch\n{batched}"
        );
    }
    let per_example: Vec<Vec<Literal>> = (0..size)
        .map(|_| example.iter().map(|a| like(rng, a)).collect())
        .collect();
    let shared: Vec<Literal> = example.iter().map(|a| like(rng, a)).collect();
    against_loop(name, f, &batched, flags, &per_example, &shared);
}

/// Runs the batched function `batched` of `f` on the stacked `per_example` arguments (the
/// `shared` ones where a parameter is not batched) and compares each output with `f` run on
/// each example, stacked.
fn against_loop(
    label: &str,
    f: &Func,
    batched: &Func,
    flags: &[bool],
    per_example: &[Vec<Literal>],
    shared: &[Literal],
) {
    let arg = |k: usize, p: usize| {
        if flags[p] {
            per_example[k][p].clone()
        } else {
            shared[p].clone()
        }
    };
    let size = per_example.len();
    let expected: Vec<Vec<Literal>> = (0..size)
        .map(|k| eval(f, &(0..flags.len()).map(|p| arg(k, p)).collect::<Vec<_>>()))
        .collect();
    let bargs: Vec<Literal> = (0..flags.len())
        .map(|p| {
            if flags[p] {
                let xs: Vec<Literal> = (0..size).map(|k| arg(k, p)).collect();
                stack(&f.param_types()[p], &xs)
            } else {
                shared[p].clone()
            }
        })
        .collect();
    let got = eval(batched, &bargs);
    for (o, t) in f.output_types.iter().enumerate() {
        let want = stack(
            t,
            &expected.iter().map(|e| e[o].clone()).collect::<Vec<_>>(),
        );
        check_close(&got[o], &want, Tolerance::ulps(t.dtype, 4.0)).unwrap_or_else(|e| {
            panic!("{label}: output {o} with parameters batched as {flags:?}: {e}\n{f}\nbatched:\n{batched}")
        });
    }
}

#[test]
fn every_op_batches_like_a_loop() {
    let mut rng = Rng::new(7);
    let mut ops = 0;
    let mut checks = 0;
    for spec in load_specs() {
        for ex in &spec.examples {
            let (m, args, _) = load_example(ex).unwrap();
            let f = m.entry().unwrap();
            let n = f.params.len();
            let mut patterns = vec![vec![true; n]];
            if n > 1 {
                patterns.extend((0..n).map(|p| (0..n).map(|q| q == p).collect()));
            }
            if n == 0 {
                patterns = vec![vec![]];
            }
            for flags in &patterns {
                for size in [3, 1] {
                    check(&spec.name, f, &args, flags, size, &mut rng);
                    checks += 1;
                }
            }
        }
        ops += 1;
    }
    println!("{ops} ops, {checks} batched programs checked against loops");
}

#[test]
fn nested_vmap_batches_twice() {
    let mut rng = Rng::new(11);
    for spec in load_specs() {
        for ex in spec.examples.iter().take(1) {
            let (m, args, _) = load_example(ex).unwrap();
            let f = m.entry().unwrap();
            let flags = vec![true; f.params.len()];
            let inner = kiln_autodiff::vmap(f, &flags, 2).unwrap();
            let outer_args: Vec<Literal> = args
                .iter()
                .zip(f.param_types())
                .map(|(a, t)| stack(&t, &[a.clone(), like(&mut rng, a)]))
                .collect();
            check(&spec.name, &inner, &outer_args, &flags, 3, &mut rng);
        }
    }
}

#[test]
fn an_empty_batch_gives_empty_results() {
    let mut rng = Rng::new(3);
    for spec in load_specs() {
        let Some(ex) = spec.examples.first() else {
            continue;
        };
        let (m, args, _) = load_example(ex).unwrap();
        let f = m.entry().unwrap();
        let flags = vec![true; f.params.len()];
        check(&spec.name, f, &args, &flags, 0, &mut rng);
    }
}

/// Random programs (seeds 0 to 299, or those `KILN_VMAP_PROGRAMS` names: a count `N` or a
/// range `A..B` of fresh seeds) batched along some parameters agree with a loop over them.
#[test]
fn random_programs_batch_like_a_loop() {
    let knob = std::env::var("KILN_VMAP_PROGRAMS").ok();
    let seeds =
        kiln_ir::random::seeds::seed_range("KILN_VMAP_PROGRAMS", knob.as_deref(), 0..300).unwrap();
    let mut checked = 0;
    for seed in seeds {
        let cfg = Config::profile(seed).with_wide();
        if cfg.elements.is_some() {
            continue;
        }
        let f = random_func(&mut Rng::new(seed), &cfg);
        let mut rng = Rng::new(seed ^ 0x5a);
        let args: Vec<Literal> = f
            .param_types()
            .iter()
            .map(|t| random_literal(&mut rng, t))
            .collect();
        let flags: Vec<bool> = (0..f.params.len())
            .map(|p| (seed >> p) & 1 == 1 || p == 0)
            .collect();
        check_random(seed, &f, &args, &flags, 1 + (seed as usize % 3), &mut rng);
        checked += 1;
    }
    println!("{checked} random programs batched and checked against loops");
}

/// [`check`] for a random program: the first example's values are `args`, the others random
/// like them.
fn check_random(seed: u64, f: &Func, args: &[Literal], flags: &[bool], size: usize, rng: &mut Rng) {
    let batched = kiln_autodiff::vmap(f, flags, size)
        .unwrap_or_else(|e| panic!("seed {seed}: vmap {flags:?}: {e}\n{f}"));
    let per_example: Vec<Vec<Literal>> = (0..size)
        .map(|k| {
            if k == 0 {
                args.to_vec()
            } else {
                f.param_types()
                    .iter()
                    .map(|t| random_literal(rng, t))
                    .collect()
            }
        })
        .collect();
    against_loop(
        &format!("seed {seed}"),
        f,
        &batched,
        flags,
        &per_example,
        args,
    );
}
