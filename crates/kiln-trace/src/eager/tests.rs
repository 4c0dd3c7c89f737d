//! Every native loop against the reference interpreter, on inputs with ±0, ±inf, NaN,
//! subnormals and the largest finite values: the results must pass `kiln_reference::accuracy`'s
//! check of the one-op function, and be the reference's bits (NaNs compared as NaN).

use super::native;
use crate::trace::one_op_func;
use kiln_ir::{Combiner, ComparisonDirection, DType, Literal, Op, TensorType};
use kiln_reference::accuracy;

/// A small deterministic generator (xorshift64*).
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    /// Uniform in [0, 1).
    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
}

const FLOATS: [DType; 4] = [DType::F16, DType::BF16, DType::F32, DType::F64];
const INTS: [DType; 5] = [DType::Pred, DType::I8, DType::I32, DType::I64, DType::U32];

/// The special values of float dtype `d`: zeros, infinities, NaN, subnormals, the extremes.
fn specials(d: DType) -> Vec<f64> {
    let (sub, max) = match d {
        DType::F16 => (6e-8, 65504.0),
        DType::BF16 => (1e-40, 3.3e38),
        DType::F32 => (1e-40, f32::MAX as f64),
        _ => (1e-310, f64::MAX),
    };
    vec![
        0.0,
        -0.0,
        f64::INFINITY,
        f64::NEG_INFINITY,
        f64::NAN,
        sub,
        -sub,
        max,
        -max,
        1.0,
        -1.0,
        0.5,
        -2.5,
    ]
}

/// A literal of `d` and `shape`: every fifth element special, the others of random sign and
/// magnitudes from 1e-4 to 1e4 (floats), or random integers (small ones half the time, so
/// shifts and divisions see every case).
fn lit(d: DType, shape: &[usize], seed: u64) -> Literal {
    let ty = TensorType::new(d, shape.to_vec());
    let n = ty.numel();
    let mut r = Rng::new(seed);
    if d.is_float() {
        let sp = specials(d);
        let v: Vec<f64> = (0..n)
            .map(|i| {
                if i % 5 == 0 {
                    sp[(r.next() % sp.len() as u64) as usize]
                } else {
                    let mag = 10f64.powf(r.unit() * 8.0 - 4.0);
                    if r.next() & 1 == 0 { mag } else { -mag }
                }
            })
            .collect();
        Literal::from_f64s(ty, &v).unwrap()
    } else {
        let v: Vec<i64> = (0..n)
            .map(|_| {
                let x = r.next();
                match x % 4 {
                    0 => (x >> 8) as i64,
                    1 => [0, -1, 1, i64::MIN, i64::MAX][(x >> 8) as usize % 5],
                    _ => (x >> 8) as i64 % 80 - 10,
                }
            })
            .collect();
        Literal::from_i64s(ty, &v).unwrap()
    }
}

/// A scalar literal.
fn scalar(d: DType, x: f64) -> Literal {
    Literal::from_f64s(TensorType::new(d, []), &[x]).unwrap()
}

/// The elements as comparable bits: floats as f64 bits (every NaN alike), the others as i64.
fn bits(l: &Literal) -> Vec<u64> {
    if l.dtype().is_float() {
        l.to_f64s()
            .iter()
            .map(|x| {
                if x.is_nan() {
                    0x7FF8 << 48
                } else {
                    x.to_bits()
                }
            })
            .collect()
    } else {
        l.to_i64s().iter().map(|&x| x as u64).collect()
    }
}

/// Checks the native loop of `op` on `args` against the reference; false when the op does
/// not type-check on them (nothing to compare).
fn agrees(op: Op, args: &[Literal]) -> bool {
    let tys: Vec<&TensorType> = args.iter().map(|a| a.ty()).collect();
    let Ok(types) = kiln_ir::type_rule(&op, &tys, None) else {
        return false;
    };
    let f = one_op_func(op.clone(), &tys, types.clone());
    kiln_ir::verify(&f).unwrap();
    let sig = kiln_ir::print_func(&f);
    let lits: Vec<&Literal> = args.iter().collect();
    let got = native(&op, &lits, &types).unwrap_or_else(|| panic!("no native loop for\n{sig}"));
    accuracy::check_outputs(&f, args, std::slice::from_ref(&got))
        .unwrap_or_else(|e| panic!("{e}\n{sig}"));
    // Half-precision results of the functions and products eager mode computes through f32
    // (as the compiled kernels do: `power`, the transcendentals, a reduction's sums and products) are
    // checked by the accuracy bound above only: where the exact value lies within an f32 ulp
    // of a half-precision tie, the f32 result is the tie and rounding to even may pick the
    // other neighbour than the reference's one rounding does (an f16 `exp` of
    // 0.0072975159: exactly 1.0073242076, the tie 1.00732421875).
    let through_f32 = super::compiles_when_reused(&op)
        || matches!(
            op,
            Op::Reduce {
                kind: Combiner::Add | Combiner::Mul,
                ..
            }
        );
    if through_f32 && matches!(got.dtype(), DType::F16 | DType::BF16) {
        return true;
    }
    let want = kiln_reference::eval_op(&op, &lits, &types).remove(0);
    let (g, w) = (bits(&got), bits(&want));
    if let Some(i) = (0..g.len()).find(|&i| g[i] != w[i]) {
        panic!(
            "element {i}: {} where the reference gives {}\n{sig}",
            got.format_elem(i),
            want.format_elem(i)
        );
    }
    true
}

/// A large operand (no multiple of the threads' chunks).
const BIG: usize = (1 << 18) + 5;

#[test]
fn float_functions_are_the_references() {
    let ops = [
        Op::Negate {},
        Op::Abs {},
        Op::Sign {},
        Op::Exponential {},
        Op::Log {},
        Op::LogPlusOne {},
        Op::ExponentialMinusOne {},
        Op::Sqrt {},
        Op::Rsqrt {},
        Op::Tanh {},
        Op::Logistic {},
        Op::Sine {},
        Op::Cosine {},
        Op::Erf {},
        Op::Floor {},
        Op::Ceil {},
        Op::RoundNearestAfz {},
        Op::IsFinite {},
    ];
    for (i, d) in FLOATS.into_iter().enumerate() {
        let x = lit(d, &[(1 << 17) + 3], i as u64);
        for op in &ops {
            assert!(agrees(op.clone(), std::slice::from_ref(&x)), "{d} {op:?}");
        }
    }
}

#[test]
fn float_arithmetic_is_the_references() {
    let ops = [
        Op::Add {},
        Op::Subtract {},
        Op::Multiply {},
        Op::Divide {},
        Op::Remainder {},
        Op::Maximum {},
        Op::Minimum {},
        Op::Power {},
    ];
    for (i, d) in FLOATS.into_iter().enumerate() {
        let n = if d == DType::F32 { BIG } else { 20_000 };
        let (a, b) = (lit(d, &[n], 10 + i as u64), lit(d, &[n], 20 + i as u64));
        for op in &ops {
            assert!(agrees(op.clone(), &[a.clone(), b.clone()]), "{d} {op:?}");
        }
    }
}

/// The native loop of binary `op` on `a` and a single value `s` (both ways round) against the
/// reference's `op` on `a` and `s` broadcast to `a`'s shape: the same bits; false when the op
/// does not type-check (nothing to compare).
fn agrees_with_single_value(op: &Op, a: &Literal, s: &Literal) -> bool {
    let full = Literal::from_f64s(
        a.ty().with_dtype(s.dtype()),
        &vec![s.to_f64s()[0]; a.numel()],
    )
    .or_else(|_| {
        Literal::from_i64s(
            a.ty().with_dtype(s.dtype()),
            &vec![s.to_i64s()[0]; a.numel()],
        )
    })
    .unwrap();
    for (args, wide) in [([a, s], [a, &full]), ([s, a], [&full, a])] {
        let tys: Vec<&TensorType> = wide.iter().map(|l| l.ty()).collect();
        let Ok(types) = kiln_ir::type_rule(op, &tys, None) else {
            return false;
        };
        let got = native(op, &args, &types).unwrap_or_else(|| panic!("no native loop: {op:?}"));
        let want = kiln_reference::eval_op(op, &wide, &types).remove(0);
        let (g, w) = (bits(&got), bits(&want));
        assert_eq!(g.len(), w.len(), "{op:?} {}", a.dtype());
        if let Some(i) = (0..g.len()).find(|&i| g[i] != w[i]) {
            panic!(
                "{op:?} {}: element {i} is {} where the reference gives {}",
                a.dtype(),
                got.format_elem(i),
                want.format_elem(i)
            );
        }
    }
    true
}

#[test]
fn ops_with_a_single_value_are_the_references() {
    use ComparisonDirection::*;
    let arithmetic = [
        Op::Add {},
        Op::Subtract {},
        Op::Multiply {},
        Op::Divide {},
        Op::Remainder {},
        Op::Maximum {},
        Op::Minimum {},
    ];
    let compares = [Eq, Ne, Lt, Le, Gt, Ge].map(|dir| Op::Compare {
        comparison_direction: dir,
    });
    for (i, d) in FLOATS.into_iter().enumerate() {
        let n = if d == DType::F32 { BIG } else { 5000 };
        let a = lit(d, &[n], 100 + i as u64);
        for s in specials(d) {
            for op in arithmetic.iter().chain(&compares) {
                assert!(
                    agrees_with_single_value(op, &a, &scalar(d, s)),
                    "{d} {op:?}"
                );
            }
        }
    }
    for (i, d) in INTS.into_iter().enumerate() {
        let a = lit(d, &[3000], 110 + i as u64);
        let s = Literal::from_i64s(TensorType::new(d, []), &[3]).unwrap();
        let checked = arithmetic
            .iter()
            .chain(&compares)
            .filter(|op| agrees_with_single_value(op, &a, &s))
            .count();
        assert!(checked >= 6, "{d}: only {checked} ops type-check");
    }
    // Single values everywhere (no operand of the result's length), a single value where
    // `select` and `clamp` need the result's length, and a unary op of a single value: no
    // loop of the result's length (the caller broadcasts).
    let s = scalar(DType::F32, 2.0);
    let big = [TensorType::new(DType::F32, [4, 4])];
    let pred = Literal::from_i64s(TensorType::new(DType::Pred, [4, 4]), &[1; 16]).unwrap();
    let x = lit(DType::F32, &[4, 4], 1);
    assert!(native(&Op::Add {}, &[&s, &s], &big).is_none());
    assert!(native(&Op::Negate {}, &[&s], &big).is_none());
    assert!(native(&Op::Select {}, &[&pred, &s, &s], &big).is_none());
    assert!(native(&Op::Select {}, &[&pred, &x, &s], &big).is_none());
    assert!(native(&Op::Clamp {}, &[&x, &s, &x], &big).is_none());
}

#[test]
fn a_scaled_difference_is_the_two_ops() {
    for (i, d) in FLOATS.into_iter().enumerate() {
        let n = if d == DType::F32 { BIG } else { 5000 };
        let (p, g) = (lit(d, &[n], 120 + i as u64), lit(d, &[n], 130 + i as u64));
        for s in specials(d).into_iter().chain([0.01, -3.0e-3]) {
            let s = scalar(d, s);
            let sv = s.to_f64s()[0];
            let got = super::sub_scaled(&p, &g, sv).unwrap();
            let ty = [p.ty().clone()];
            let s = Literal::from_f64s(p.ty().clone(), &vec![sv; n]).unwrap();
            let product = kiln_reference::eval_op(&Op::Multiply {}, &[&g, &s], &ty).remove(0);
            let want = kiln_reference::eval_op(&Op::Subtract {}, &[&p, &product], &ty).remove(0);
            let (a, b) = (bits(&got), bits(&want));
            if let Some(i) = (0..a.len()).find(|&i| a[i] != b[i]) {
                panic!(
                    "{d} s = {sv}: element {i} is {} where the two ops give {}",
                    got.format_elem(i),
                    want.format_elem(i)
                );
            }
        }
    }
    // Operands of another dtype or shape: not fused.
    let p = lit(DType::F32, &[10], 1);
    assert!(super::sub_scaled(&p, &lit(DType::F64, &[10], 2), 0.5).is_none());
    assert!(super::sub_scaled(&p, &lit(DType::F32, &[2, 5], 2), 0.5).is_none());
    assert!(
        super::sub_scaled(&lit(DType::I32, &[10], 3), &lit(DType::I32, &[10], 4), 1.0).is_none()
    );
}

#[test]
fn integer_ops_are_the_references() {
    let unary = [Op::Negate {}, Op::Abs {}, Op::Sign {}, Op::Not {}];
    let binary = [
        Op::Add {},
        Op::Subtract {},
        Op::Multiply {},
        Op::Divide {},
        Op::Remainder {},
        Op::Maximum {},
        Op::Minimum {},
        Op::Power {},
        Op::And {},
        Op::Or {},
        Op::Xor {},
        Op::ShiftLeft {},
        Op::ShiftRightLogical {},
    ];
    for (i, d) in INTS.into_iter().enumerate() {
        let (a, b) = (
            lit(d, &[5000], 30 + i as u64),
            lit(d, &[5000], 40 + i as u64),
        );
        let checked = unary
            .iter()
            .filter(|op| agrees((*op).clone(), std::slice::from_ref(&a)))
            .count()
            + binary
                .iter()
                .filter(|op| agrees((*op).clone(), &[a.clone(), b.clone()]))
                .count();
        assert!(checked >= 4, "{d}: only {checked} ops type-check");
    }
    // The u32 arithmetic of random bits, large.
    let (a, b) = (lit(DType::U32, &[BIG], 1), lit(DType::U32, &[BIG], 2));
    for op in [Op::Xor {}, Op::ShiftRightLogical {}, Op::Add {}] {
        assert!(agrees(op, &[a.clone(), b.clone()]));
    }
}

#[test]
fn comparisons_selections_and_conversions_are_the_references() {
    use ComparisonDirection::*;
    let all: Vec<DType> = INTS.into_iter().chain(FLOATS).collect();
    for (i, &d) in all.iter().enumerate() {
        let n = 3000;
        let (a, b) = (lit(d, &[n], 50 + i as u64), lit(d, &[n], 60 + i as u64));
        for dir in [Eq, Ne, Lt, Le, Gt, Ge] {
            assert!(agrees(
                Op::Compare {
                    comparison_direction: dir
                },
                &[a.clone(), b.clone()]
            ));
        }
        let p = lit(DType::Pred, &[n], 70 + i as u64);
        assert!(agrees(Op::Select {}, &[p, a.clone(), b.clone()]));
        for t in [true, false] {
            let p = Literal::from_i64s(TensorType::new(DType::Pred, []), &[t as i64]).unwrap();
            assert!(agrees(Op::Select {}, &[p, a.clone(), b.clone()]));
        }
        if d != DType::Pred {
            let (lo, hi) = (lit(d, &[n], 80 + i as u64), lit(d, &[n], 90 + i as u64));
            assert!(agrees(Op::Clamp {}, &[lo, a.clone(), hi]));
            let (lo, hi) = (scalar(d, -1.0), scalar(d, 2.0));
            assert!(agrees(Op::Clamp {}, &[lo, a.clone(), hi]));
        }
        for &to in &all {
            let op = Op::Convert {};
            let tys = [a.ty()];
            let out = vec![a.ty().with_dtype(to)];
            let f = one_op_func(op.clone(), &tys, out.clone());
            kiln_ir::verify(&f).unwrap();
            let got = native(&op, &[&a], &out).unwrap();
            let want = kiln_reference::eval_op(&op, &[&a], &out).remove(0);
            assert_eq!(bits(&got), bits(&want), "convert {d} to {to}");
            accuracy::check_outputs(&f, std::slice::from_ref(&a), &[got]).unwrap();
        }
        for dim in 0..2 {
            let ty = TensorType::new(d, [70, 40]);
            let op = Op::Iota {
                iota_dimension: dim,
            };
            let got = native(&op, &[], std::slice::from_ref(&ty)).unwrap();
            let want = kiln_reference::eval_op(&op, &[], std::slice::from_ref(&ty)).remove(0);
            assert_eq!(bits(&got), bits(&want), "iota {d}");
        }
    }
    for (from, to) in [
        (DType::F32, DType::U32),
        (DType::U32, DType::F32),
        (DType::F32, DType::I32),
        (DType::F64, DType::I64),
        (DType::I64, DType::F64),
    ] {
        let a = lit(from, &[1000], 7);
        let out = vec![a.ty().with_dtype(to)];
        let op = Op::BitcastConvert {};
        let got = native(&op, &[&a], &out).unwrap();
        let want = kiln_reference::eval_op(&op, &[&a], &out).remove(0);
        assert_eq!(
            got.to_le_bytes(),
            want.to_le_bytes(),
            "bitcast {from} to {to}"
        );
    }
}

#[test]
fn data_movement_is_the_references() {
    for (i, d) in [DType::F32, DType::BF16, DType::I8, DType::Pred, DType::F64]
        .into_iter()
        .enumerate()
    {
        let s = i as u64 * 100;
        let bcast = |shape: &[usize], dims: Vec<i64>, out: &[usize]| {
            let op = Op::BroadcastInDim {
                broadcast_dimensions: dims,
            };
            let a = lit(d, shape, s + 1);
            let ty = TensorType::new(d, out.to_vec());
            let got = native(&op, &[&a], std::slice::from_ref(&ty)).unwrap();
            let want = kiln_reference::eval_op(&op, &[&a], std::slice::from_ref(&ty)).remove(0);
            assert_eq!(
                bits(&got),
                bits(&want),
                "{d} broadcast {shape:?} to {out:?}"
            );
        };
        bcast(&[], vec![], &[300, 7]);
        bcast(&[7], vec![1], &[300, 7]);
        bcast(&[300], vec![0], &[300, 7]);
        bcast(&[3, 1, 5], vec![1, 2, 3], &[4, 3, 6, 5]);
        bcast(&[1, 1], vec![0, 2], &[2, 3, 4]);
        let a = lit(d, &[6, 70, 30], s + 2);
        for perm in [
            [0, 1, 2],
            [2, 1, 0],
            [1, 0, 2],
            [0, 2, 1],
            [2, 0, 1],
            [1, 2, 0],
        ] {
            let op = Op::Transpose {
                permutation: perm.to_vec(),
            };
            assert!(agrees(op, std::slice::from_ref(&a)), "{d} {perm:?}");
        }
        let big = lit(d, &[700, 600], s + 3);
        assert!(agrees(
            Op::Transpose {
                permutation: vec![1, 0]
            },
            std::slice::from_ref(&big)
        ));
        for (start, limit, step) in [
            ([0, 0, 0], [6, 70, 30], [1, 1, 1]),
            ([1, 3, 2], [5, 70, 29], [2, 3, 4]),
            ([0, 69, 0], [6, 70, 30], [1, 1, 7]),
        ] {
            let op = Op::Slice {
                start_indices: start.to_vec(),
                limit_indices: limit.to_vec(),
                strides: step.to_vec(),
            };
            assert!(agrees(op, std::slice::from_ref(&a)));
        }
        for dims in [vec![], vec![0], vec![2], vec![0, 1, 2], vec![1]] {
            assert!(agrees(
                Op::Reverse { dimensions: dims },
                std::slice::from_ref(&a)
            ));
        }
        // One row, strided.
        let v = lit(d, &[1000], s + 4);
        assert!(agrees(
            Op::Reverse {
                dimensions: vec![0]
            },
            std::slice::from_ref(&v)
        ));
        assert!(agrees(
            Op::Slice {
                start_indices: vec![3],
                limit_indices: vec![990],
                strides: vec![7],
            },
            std::slice::from_ref(&v)
        ));
        for dim in 0..3 {
            let mut shape = [6, 70, 30];
            let mut parts = Vec::new();
            for (k, len) in [2, 1, 5].into_iter().enumerate() {
                shape[dim] = len;
                parts.push(lit(d, &shape, s + 10 + k as u64));
            }
            assert!(agrees(
                Op::Concatenate {
                    dimension: dim as i64
                },
                &parts
            ));
        }
        let ty = TensorType::new(d, [70, 6, 30]);
        let got = native(&Op::Reshape {}, &[&a], std::slice::from_ref(&ty)).unwrap();
        assert_eq!(bits(&got), bits(&a));
        assert_eq!(got.ty(), &ty);
    }
}

#[test]
fn reductions_are_the_references() {
    let dims: [&[i64]; 8] = [&[0], &[1], &[2], &[0, 2], &[1, 2], &[0, 1], &[0, 1, 2], &[]];
    let all: Vec<DType> = FLOATS.into_iter().chain(INTS).collect();
    for (i, &d) in all.iter().enumerate() {
        let x = lit(d, &[7, 90, 33], 200 + i as u64);
        let kinds: Vec<(Combiner, f64)> = if d.is_float() {
            vec![
                (Combiner::Add, 0.0),
                (Combiner::Add, -0.0),
                (Combiner::Mul, 1.0),
                (Combiner::Max, f64::NEG_INFINITY),
                (Combiner::Min, f64::INFINITY),
            ]
        } else {
            vec![
                (Combiner::Add, 0.0),
                (Combiner::Mul, 1.0),
                (Combiner::Max, -5.0),
                (Combiner::Min, 3.0),
                (Combiner::And, -1.0),
                (Combiner::Or, 0.0),
            ]
        };
        let mut checked = 0;
        for (kind, init) in kinds {
            for ds in dims {
                let op = Op::Reduce {
                    dimensions: ds.to_vec(),
                    kind,
                };
                checked += agrees(op, &[x.clone(), scalar(d, init)]) as usize;
            }
        }
        assert!(checked >= 24, "{d}: only {checked} reductions type-check");
    }
    // Sums of finite values only (the check is exact, so sums of many terms are checked
    // for their order), over rows and over columns.
    let mut r = Rng::new(9);
    let v: Vec<f64> = (0..(1 << 19)).map(|_| r.unit() * 2.0 - 1.0).collect();
    for d in [DType::F32, DType::F64] {
        let x = Literal::from_f64s(TensorType::new(d, [512, 1024]), &v).unwrap();
        for ds in [vec![0], vec![1], vec![0, 1]] {
            let op = Op::Reduce {
                dimensions: ds,
                kind: Combiner::Add,
            };
            assert!(agrees(op, &[x.clone(), scalar(d, 0.0)]));
        }
    }
}

/// `dot_general` with the given dimensions on operands of the given shapes.
fn dot(d: DType, shapes: [&[usize]; 2], batch: [&[i64]; 2], contract: [&[i64]; 2], seed: u64) {
    let op = Op::DotGeneral {
        lhs_batching_dimensions: batch[0].to_vec(),
        rhs_batching_dimensions: batch[1].to_vec(),
        lhs_contracting_dimensions: contract[0].to_vec(),
        rhs_contracting_dimensions: contract[1].to_vec(),
    };
    let args = [lit(d, shapes[0], seed), lit(d, shapes[1], seed + 1)];
    assert!(agrees(op, &args), "{d} {shapes:?}");
}

#[test]
fn dot_products_are_the_references() {
    for (i, d) in [
        DType::F32,
        DType::F64,
        DType::F16,
        DType::BF16,
        DType::I32,
        DType::I8,
    ]
    .into_iter()
    .enumerate()
    {
        let s = 300 + 10 * i as u64;
        // Rows and columns that are no multiple of the tile, k over one block.
        dot(d, [&[37, 300], &[300, 29]], [&[], &[]], [&[1], &[0]], s);
        // Batched.
        dot(
            d,
            [&[3, 17, 40], &[3, 40, 9]],
            [&[0], &[0]],
            [&[2], &[1]],
            s + 1,
        );
        // Transposed operands: lhs [k, m], rhs [n, k].
        dot(d, [&[40, 13], &[11, 40]], [&[], &[]], [&[0], &[1]], s + 2);
        // Two contracting dimensions, in either order.
        dot(
            d,
            [&[5, 6, 7], &[6, 7, 4]],
            [&[], &[]],
            [&[1, 2], &[0, 1]],
            s + 3,
        );
        dot(
            d,
            [&[5, 6, 7], &[6, 7, 4]],
            [&[], &[]],
            [&[2, 1], &[1, 0]],
            s + 4,
        );
        // A vector product and an outer product.
        dot(d, [&[50], &[50]], [&[], &[]], [&[0], &[0]], s + 5);
        dot(d, [&[9], &[8]], [&[], &[]], [&[], &[]], s + 6);
        // Nothing to contract: every sum is empty.
        dot(d, [&[4, 0], &[0, 3]], [&[], &[]], [&[1], &[0]], s + 7);
    }
    // Finite values: the sums' order shows in the bits.
    let mut r = Rng::new(5);
    let mut vals = |n: usize| -> Vec<f64> { (0..n).map(|_| r.unit() * 2.0 - 1.0).collect() };
    let (va, vb) = (vals(96 * 300), vals(300 * 40));
    for d in [DType::F32, DType::F64] {
        let a = Literal::from_f64s(TensorType::new(d, [96, 300]), &va).unwrap();
        let b = Literal::from_f64s(TensorType::new(d, [300, 40]), &vb).unwrap();
        let op = Op::DotGeneral {
            lhs_batching_dimensions: vec![],
            rhs_batching_dimensions: vec![],
            lhs_contracting_dimensions: vec![1],
            rhs_contracting_dimensions: vec![0],
        };
        assert!(agrees(op, &[a, b]));
    }
    // Products that are all -0: the sum's sign is the reference's.
    let a = Literal::from_f64s(TensorType::new(DType::F32, [3, 5]), &[-0.0; 15]).unwrap();
    let b = Literal::from_f64s(TensorType::new(DType::F32, [5, 2]), &[1.0; 10]).unwrap();
    let op = Op::DotGeneral {
        lhs_batching_dimensions: vec![],
        rhs_batching_dimensions: vec![],
        lhs_contracting_dimensions: vec![1],
        rhs_contracting_dimensions: vec![0],
    };
    assert!(agrees(op, &[a, b]));
}

/// A split loop covers its output exactly once, in chunks of whole units, on the calling
/// thread and threads already running (the thread team's, or the thread pool's where the
/// team is busy with another test's launch: no thread is started per loop); an unsplit one
/// runs on the caller alone.
#[test]
fn split_loops_run_on_the_caller_and_running_threads() {
    use std::sync::Mutex;
    let caller = std::thread::current().id();
    let n = 10_007 * 3;
    let ran = Mutex::new(Vec::new());
    let mut out = vec![0u32; n];
    super::par_chunks(&mut out, 3, n * 64, |start, chunk| {
        assert_eq!((start % 3, chunk.len() % 3), (0, 0), "whole units");
        for (i, x) in chunk.iter_mut().enumerate() {
            *x += (start + i) as u32 + 1;
        }
        let t = std::thread::current();
        let running = t.id() == caller
            || rayon::current_thread_index().is_some()
            || t.name().is_some_and(|n| n.starts_with("kiln-team-"));
        ran.lock().unwrap().push((start, running));
    });
    assert!(out.iter().enumerate().all(|(i, &x)| x == i as u32 + 1));
    let mut ran = ran.into_inner().unwrap();
    ran.sort_by_key(|r| r.0);
    assert_eq!(ran.len(), super::threads().min(n / 3), "{ran:?}");
    assert!(ran.iter().all(|r| r.1), "on running threads: {ran:?}");
    // Too little work: one chunk, on the caller.
    let ran = Mutex::new(Vec::new());
    super::par_chunks(&mut out, 3, 100, |start, _| {
        ran.lock()
            .unwrap()
            .push((start, std::thread::current().id()))
    });
    assert_eq!(ran.into_inner().unwrap(), [(0, caller)]);
}
