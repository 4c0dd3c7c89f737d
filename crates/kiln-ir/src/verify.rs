//! Type rules and the verifier.
//!
//! [`type_rule`] is the single place that knows each op's typing: it checks the operands and
//! attributes and either infers the result types or, for ops whose result type carries
//! information (reshape, convert, iota, ...), checks the declared ones. Every failure cites a
//! constraint label from the op's spec in `ir-specs/ops/`, or one of the generic `ir_*` labels
//! of `ir-specs/README.md` (`ir_size`: a type whose element count or byte size overflows i64).

use crate::attr::{Combiner, ComparisonDirection};
use crate::error::{Diag, VerifyError};
use crate::print::inst_summary;
use crate::{DType, Func, Op, OpKind, TensorType};

mod collective;
mod dtypes;
mod fft;
mod window;

pub use dtypes::widens;
use dtypes::{combiner_ok, elementwise_dtypes};
pub use window::window_output_size;
use window::{checked_window_output_size, dim_size, window_result_shape};

type R<T> = std::result::Result<T, Diag>;

fn diag(label: String, message: String) -> Diag {
    Diag { label, message }
}

/// Builds constraint labels for one op: `c(1)` is `<mnemonic>_c1`.
struct Labels(OpKind);

impl Labels {
    fn c(&self, n: u32) -> String {
        format!("{}_c{n}", self.0.mnemonic())
    }
    fn ensure(&self, n: u32, cond: bool, msg: impl FnOnce() -> String) -> R<()> {
        if cond {
            Ok(())
        } else {
            Err(diag(self.c(n), msg()))
        }
    }
}

/// The result of a type rule: the result types and the label that covers a mismatch between
/// them and the declared types.
struct Inferred {
    types: Vec<TensorType>,
    label: u32,
}

fn one(t: TensorType, label: u32) -> R<Inferred> {
    Ok(Inferred {
        types: vec![t],
        label,
    })
}

fn list(xs: &[TensorType]) -> String {
    xs.iter()
        .map(|t| t.to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

fn in_range(d: i64, rank: usize) -> bool {
    d >= 0 && (d as usize) < rank
}

fn unique(xs: &[i64]) -> bool {
    let mut v = xs.to_vec();
    v.sort_unstable();
    v.windows(2).all(|w| w[0] != w[1])
}

/// Whether the batching dimensions of a `gather` or `scatter` are well formed: as many of the
/// operand's (`od`: sorted, unique, in range, not among `excluded`, each of slice size at most
/// 1) as of the indices' (`id`: unique, in range, not `ivd`), paired dimensions of equal size.
fn batching_ok(
    a: &TensorType,
    idx: &TensorType,
    ivd: usize,
    od: &[i64],
    id: &[i64],
    excluded: &[i64],
    slice_sizes: &[i64],
) -> bool {
    od.len() == id.len()
        && sorted_unique(od)
        && unique(id)
        && od.iter().all(|&d| {
            in_range(d, a.rank()) && !excluded.contains(&d) && slice_sizes[d as usize] <= 1
        })
        && id
            .iter()
            .all(|&d| in_range(d, idx.rank()) && d as usize != ivd)
        && od
            .iter()
            .zip(id)
            .all(|(&o, &i)| a.shape[o as usize] == idx.shape[i as usize])
}

fn sorted_unique(xs: &[i64]) -> bool {
    xs.windows(2).all(|w| w[0] < w[1])
}

fn is_permutation(xs: &[i64], n: usize) -> bool {
    xs.len() == n && unique(xs) && xs.iter().all(|&d| in_range(d, n))
}

/// Labels 1-3 of a factorization's operand (`cholesky`, `lu`): a batch of square float
/// matrices; its rank.
fn square_float_matrices(l: &Labels, a: &TensorType) -> R<usize> {
    let r = a.rank();
    l.ensure(1, r >= 2, || {
        format!("the operand must have rank at least 2 (a batch of matrices), got {a}")
    })?;
    l.ensure(2, a.shape[r - 2] == a.shape[r - 1], || {
        format!("the matrices must be square, got {a}")
    })?;
    l.ensure(3, a.dtype.is_float(), || {
        format!("the operand must have a float element type, got {a}")
    })?;
    Ok(r)
}

/// The `ir_size` error of a dimension whose computed size overflows i64.
fn size_overflow(what: String) -> Diag {
    diag("ir_size".into(), format!("{what} overflows i64"))
}

/// Checks that every type of `tys` is one kiln can address ([`TensorType::check_size`]).
fn check_sizes<'a>(what: &str, tys: impl IntoIterator<Item = &'a TensorType>) -> R<()> {
    for t in tys {
        t.check_size()
            .map_err(|m| diag("ir_size".into(), format!("{what}: {m}")))?;
    }
    Ok(())
}

/// The type rule of one instruction.
///
/// With `declared` = `None`, infers the result types (ops that need a declared result type
/// say so). With `declared` = `Some`, also checks them. Errors cite the op's spec labels.
pub fn type_rule(
    op: &Op,
    operands: &[&TensorType],
    declared: Option<&[TensorType]>,
) -> R<Vec<TensorType>> {
    let k = op.kind();
    if !k.arity().accepts(operands.len()) {
        return Err(diag(
            "ir_operands".into(),
            format!(
                "`{k}` takes {} operand(s), got {}",
                k.arity(),
                operands.len()
            ),
        ));
    }
    if let Op::Case { branches } = op {
        // How many results a case has comes from its branches: check there are some first.
        let l = Labels(k);
        let Some(first) = branches.first() else {
            return Err(diag(l.c(2), "a case needs at least one branch".into()));
        };
        l.ensure(5, !first.output_types.is_empty(), || {
            format!(
                "branch @{} returns nothing; a case returns at least one value",
                first.name
            )
        })?;
    }
    if let Op::Call { callee } = op
        && callee.func.is_none()
    {
        // How many results a call has comes from its callee: it must be known first.
        return Err(diag(
            Labels(k).c(1),
            format!("callee @{} is not a function of the module", callee.name),
        ));
    }
    let n_results = op.result_count(operands.len());
    if let Some(d) = declared
        && d.len() != n_results
    {
        return Err(diag(
            "ir_results".into(),
            format!("`{k}` has {n_results} result(s), {} declared", d.len()),
        ));
    }
    check_sizes("operand", operands.iter().copied())?;
    if let Some(d) = declared {
        check_sizes("result", d)?;
    }
    let inferred = rule(op, operands, declared)?;
    check_sizes("inferred result", &inferred.types)?;
    if let Some(d) = declared
        && d != inferred.types.as_slice()
    {
        return Err(diag(
            Labels(k).c(inferred.label),
            format!(
                "result type {} does not match the inferred {}",
                list(d),
                list(&inferred.types)
            ),
        ));
    }
    Ok(inferred.types)
}

fn need_declared(k: OpKind, declared: Option<&[TensorType]>) -> R<&TensorType> {
    declared.and_then(|d| d.first()).ok_or_else(|| {
        diag(
            "ir_results".into(),
            format!("`{k}` needs an explicit result type"),
        )
    })
}

fn rule(op: &Op, x: &[&TensorType], declared: Option<&[TensorType]>) -> R<Inferred> {
    let k = op.kind();
    let l = Labels(k);
    use Op::*;
    match op {
        Add {}
        | Subtract {}
        | Multiply {}
        | Divide {}
        | Remainder {}
        | Maximum {}
        | Minimum {}
        | Power {}
        | And {}
        | Or {}
        | Xor {}
        | ShiftLeft {}
        | ShiftRightLogical {}
        | ShiftRightArithmetic {}
        | Atan2 {} => {
            l.ensure(1, x[0] == x[1], || {
                format!(
                    "operands must have the same type, got {} and {}",
                    x[0], x[1]
                )
            })?;
            let (what, ok) = elementwise_dtypes(k);
            l.ensure(2, ok(x[0].dtype), || {
                format!("element type must be {what}, got {}", x[0].dtype)
            })?;
            one(x[0].clone(), 1)
        }
        Negate {}
        | Abs {}
        | Sign {}
        | Exponential {}
        | Log {}
        | LogPlusOne {}
        | ExponentialMinusOne {}
        | Sqrt {}
        | Rsqrt {}
        | Tanh {}
        | Logistic {}
        | Sine {}
        | Cosine {}
        | Erf {}
        | Floor {}
        | Ceil {}
        | RoundNearestAfz {}
        | RoundNearestEven {}
        | Tan {}
        | Cbrt {}
        | Popcnt {}
        | CountLeadingZeros {}
        | Not {} => {
            let (what, ok) = elementwise_dtypes(k);
            l.ensure(2, ok(x[0].dtype), || {
                format!("element type must be {what}, got {}", x[0].dtype)
            })?;
            // The absolute value of a complex number is real.
            let d = if k == OpKind::Abs {
                x[0].dtype.part()
            } else {
                x[0].dtype
            };
            one(x[0].with_dtype(d), 1)
        }
        Real {} | Imag {} => {
            let (what, ok) = elementwise_dtypes(k);
            l.ensure(1, ok(x[0].dtype), || {
                format!("operand must have a {what} element type, got {}", x[0])
            })?;
            one(x[0].with_dtype(x[0].dtype.part()), 2)
        }
        Complex {} => {
            let (a, b) = (x[0], x[1]);
            l.ensure(1, a == b, || {
                format!("lhs and rhs must have the same type, got {a} and {b}")
            })?;
            let c = a.dtype.complex_of();
            l.ensure(2, c.is_some(), || {
                format!("lhs and rhs must have element type f32 or f64, got {a}")
            })?;
            one(a.with_dtype(c.expect("checked")), 3)
        }
        ReducePrecision {
            exponent_bits,
            mantissa_bits,
        } => {
            l.ensure(2, x[0].dtype.is_float(), || {
                format!("element type must be float, got {}", x[0].dtype)
            })?;
            l.ensure(3, *exponent_bits >= 1, || {
                format!("exponent_bits must be at least 1, got {exponent_bits}")
            })?;
            l.ensure(4, *mantissa_bits >= 0, || {
                format!("mantissa_bits must not be negative, got {mantissa_bits}")
            })?;
            one(x[0].clone(), 1)
        }
        IsFinite {} => {
            l.ensure(1, x[0].dtype.is_float(), || {
                format!("operand must be float, got {}", x[0])
            })?;
            one(x[0].with_dtype(DType::Pred), 2)
        }
        Compare {
            comparison_direction: dir,
        } => {
            l.ensure(1, x[0] == x[1], || {
                format!(
                    "operands must have the same type, got {} and {}",
                    x[0], x[1]
                )
            })?;
            l.ensure(
                3,
                !x[0].dtype.is_complex()
                    || matches!(dir, ComparisonDirection::Eq | ComparisonDirection::Ne),
                || {
                    format!(
                        "complex numbers have no order: {} compares them only with EQ or NE, got {dir}",
                        x[0].dtype
                    )
                },
            )?;
            one(x[0].with_dtype(DType::Pred), 2)
        }
        Select {} => {
            let (p, t, f) = (x[0], x[1], x[2]);
            l.ensure(1, p.dtype == DType::Pred, || {
                format!("pred must have element type pred, got {p}")
            })?;
            l.ensure(2, p.rank() == 0 || p.shape == t.shape, || {
                format!("pred must be a scalar or have the shape of on_true, got {p} and {t}")
            })?;
            l.ensure(3, t == f, || {
                format!("on_true and on_false must have the same type, got {t} and {f}")
            })?;
            one(t.clone(), 3)
        }
        Clamp {} => {
            let (mn, v, mx) = (x[0], x[1], x[2]);
            l.ensure(1, (mn.rank() == 0 || mn.shape == v.shape) && (mx.rank() == 0 || mx.shape == v.shape), || {
                format!("min and max must be scalars or have the operand's shape, got {mn}, {v}, {mx}")
            })?;
            l.ensure(2, mn.dtype == v.dtype && mx.dtype == v.dtype && !v.dtype.is_pred() && !v.dtype.is_complex(), || {
                format!("min, operand and max must share an integer or float element type, got {mn}, {v}, {mx}")
            })?;
            one(v.clone(), 3)
        }
        Convert {} => {
            let r = need_declared(k, declared)?;
            l.ensure(1, r.shape == x[0].shape, || {
                format!(
                    "result shape must equal operand shape, got {} and {r}",
                    x[0]
                )
            })?;
            one(r.clone(), 1)
        }
        BitcastConvert {} => {
            let r = need_declared(k, declared)?;
            let (a, b) = (x[0], r);
            // A pred is one bit (StableHLO's i1), whatever its storage.
            let width = |d: DType| if d.is_pred() { 1 } else { d.bits() as usize };
            if a.dtype.is_pred() != b.dtype.is_pred() {
                let (p, w) = if a.dtype.is_pred() { (a, b) } else { (b, a) };
                l.ensure(1, !w.dtype.is_complex(), || {
                    format!(
                        "a complex number does not bitcast to or from pred bits, got {a} to {b}"
                    )
                })?;
                let n = width(w.dtype);
                let fits = p.rank() == w.rank() + 1
                    && p.shape[..w.rank()] == w.shape[..]
                    && p.shape[w.rank()] == n;
                l.ensure(1, fits, || {
                    format!("a pred is one bit: {w} bitcasts to or from {n} preds per element in a last dimension, got {a} to {b}")
                })?;
            }
            let (wa, wb) = (width(a.dtype), width(b.dtype));
            // The sub-byte integers and floats take a byte each: they bitcast only to their own
            // width.
            l.ensure(3, wa == wb || !(a.dtype.bits() < 8 || b.dtype.bits() < 8), || {
                format!("{} and {} differ in bit width: a sub-byte integer or float bitcasts only to a type of its width, got {a} to {b}", a.dtype, b.dtype)
            })?;
            let ok = if wa == wb {
                a.shape == b.shape
            } else if wa > wb {
                b.shape.len() == a.shape.len() + 1
                    && b.shape[..a.rank()] == a.shape[..]
                    && b.shape[a.rank()] == wa / wb
            } else {
                a.shape.len() == b.shape.len() + 1
                    && a.shape[..b.rank()] == b.shape[..]
                    && a.shape[b.rank()] == wb / wa
            };
            l.ensure(2, ok, || {
                format!("shapes do not fit the bit widths: {a} to {b}")
            })?;
            one(r.clone(), 2)
        }
        Constant { value } => one(value.ty().clone(), 1),
        Iota { iota_dimension } => {
            let r = need_declared(k, declared)?;
            l.ensure(1, in_range(*iota_dimension, r.rank()), || {
                format!("iota_dimension {iota_dimension} is out of range for {r}")
            })?;
            l.ensure(2, !r.dtype.is_pred(), || {
                format!("element type must be integer or float, got {r}")
            })?;
            one(r.clone(), 1)
        }
        BroadcastInDim {
            broadcast_dimensions: dims,
        } => {
            let r = need_declared(k, declared)?;
            let a = x[0];
            l.ensure(1, r.dtype == a.dtype, || {
                format!("element types differ: {a} and {r}")
            })?;
            l.ensure(2, dims.len() == a.rank(), || {
                format!(
                    "broadcast_dimensions {dims:?} must have one entry per operand dimension of {a}"
                )
            })?;
            l.ensure(3, dims.iter().all(|&d| in_range(d, r.rank())), || {
                format!("broadcast_dimensions {dims:?} out of range for {r}")
            })?;
            l.ensure(4, unique(dims), || {
                format!("broadcast_dimensions {dims:?} must be unique")
            })?;
            for (i, &d) in dims.iter().enumerate() {
                let (s, t) = (a.shape[i], r.shape[d as usize]);
                l.ensure(5, s == 1 || s == t, || format!("operand dimension {i} of {a} (size {s}) cannot broadcast to dimension {d} of {r} (size {t})"))?;
            }
            one(r.clone(), 1)
        }
        Reshape {} => {
            let r = need_declared(k, declared)?;
            let a = x[0];
            l.ensure(1, r.dtype == a.dtype, || {
                format!("element types differ: {a} and {r}")
            })?;
            l.ensure(2, r.numel() == a.numel(), || {
                format!(
                    "element counts differ: {a} has {}, {r} has {}",
                    a.numel(),
                    r.numel()
                )
            })?;
            one(r.clone(), 1)
        }
        Transpose { permutation: p } => {
            let a = x[0];
            l.ensure(1, is_permutation(p, a.rank()), || {
                format!(
                    "permutation {p:?} is not a permutation of the {} dimensions of {a}",
                    a.rank()
                )
            })?;
            one(
                TensorType::new(
                    a.dtype,
                    p.iter().map(|&d| a.shape[d as usize]).collect::<Vec<_>>(),
                ),
                2,
            )
        }
        Slice {
            start_indices: s,
            limit_indices: lim,
            strides: st,
        } => {
            let a = x[0];
            l.ensure(
                1,
                s.len() == a.rank() && lim.len() == a.rank() && st.len() == a.rank(),
                || {
                    format!(
                        "start_indices, limit_indices and strides must have {} entries for {a}",
                        a.rank()
                    )
                },
            )?;
            for d in 0..a.rank() {
                l.ensure(
                    2,
                    0 <= s[d] && s[d] <= lim[d] && lim[d] <= a.shape[d] as i64,
                    || {
                        format!(
                            "dimension {d}: need 0 <= start {} <= limit {} <= size {} of {a}",
                            s[d], lim[d], a.shape[d]
                        )
                    },
                )?;
                l.ensure(3, st[d] > 0, || {
                    format!("dimension {d}: stride {} must be positive", st[d])
                })?;
            }
            let shape: Vec<usize> = (0..a.rank())
                .map(|d| {
                    let n = lim[d] - s[d];
                    (n / st[d] + i64::from(n % st[d] != 0)) as usize
                })
                .collect();
            one(TensorType::new(a.dtype, shape), 4)
        }
        DynamicSlice { slice_sizes } => {
            let a = x[0];
            let idx = &x[1..];
            l.ensure(1, idx.len() == a.rank(), || {
                format!("{} start indices given for {a}", idx.len())
            })?;
            l.ensure(
                2,
                idx.iter()
                    .all(|t| t.rank() == 0 && t.dtype.is_int() && t.dtype == idx[0].dtype),
                || {
                    format!(
                        "start indices must be integer scalars of one type, got {}",
                        list(&idx.iter().map(|t| (*t).clone()).collect::<Vec<_>>())
                    )
                },
            )?;
            l.ensure(3, slice_sizes.len() == a.rank() && slice_sizes.iter().zip(&a.shape).all(|(&s, &d)| 0 <= s && s <= d as i64), || {
                format!("slice_sizes {slice_sizes:?} must have one entry per dimension of {a}, each within the dimension")
            })?;
            one(
                TensorType::new(
                    a.dtype,
                    slice_sizes.iter().map(|&s| s as usize).collect::<Vec<_>>(),
                ),
                4,
            )
        }
        DynamicUpdateSlice {} => {
            let (a, u) = (x[0], x[1]);
            let idx = &x[2..];
            l.ensure(1, u.dtype == a.dtype, || {
                format!("update element type must match the operand: {u} and {a}")
            })?;
            l.ensure(
                2,
                u.rank() == a.rank() && u.shape.iter().zip(&a.shape).all(|(s, d)| s <= d),
                || format!("update {u} must have the operand's rank and fit inside {a}"),
            )?;
            l.ensure(3, idx.len() == a.rank(), || {
                format!("{} start indices given for {a}", idx.len())
            })?;
            l.ensure(
                4,
                idx.iter()
                    .all(|t| t.rank() == 0 && t.dtype.is_int() && t.dtype == idx[0].dtype),
                || "start indices must be integer scalars of one type".to_string(),
            )?;
            one(a.clone(), 1)
        }
        Pad {
            edge_padding_low: lo,
            edge_padding_high: hi,
            interior_padding: int,
        } => {
            let (a, pv) = (x[0], x[1]);
            l.ensure(1, pv.rank() == 0 && pv.dtype == a.dtype, || {
                format!(
                    "padding_value must be a scalar of the operand's element type, got {pv} for {a}"
                )
            })?;
            l.ensure(2, lo.len() == a.rank() && hi.len() == a.rank() && int.len() == a.rank(), || {
                format!("edge_padding_low, edge_padding_high and interior_padding must have {} entries for {a}", a.rank())
            })?;
            l.ensure(3, int.iter().all(|&i| i >= 0), || {
                format!("interior_padding {int:?} must be non-negative")
            })?;
            let mut shape = Vec::new();
            for d in 0..a.rank() {
                let n = a.shape[d] as i128;
                let size = lo[d] as i128 + hi[d] as i128 + n + (n - 1).max(0) * int[d] as i128;
                l.ensure(4, size >= 0, || {
                    format!("dimension {d} of {a} would have negative size {size}")
                })?;
                shape.push(dim_size(size).ok_or_else(|| {
                    size_overflow(format!("the padded size {size} of dimension {d} of {a}"))
                })?);
            }
            one(TensorType::new(a.dtype, shape), 4)
        }
        Concatenate { dimension } => {
            let a = x[0];
            l.ensure(
                1,
                x.iter().all(|t| t.dtype == a.dtype && t.rank() == a.rank()),
                || {
                    format!(
                        "operands must share element type and rank, got {}",
                        list(&x.iter().map(|t| (*t).clone()).collect::<Vec<_>>())
                    )
                },
            )?;
            l.ensure(2, in_range(*dimension, a.rank()), || {
                format!("dimension {dimension} is out of range for {a}")
            })?;
            let d = *dimension as usize;
            l.ensure(
                3,
                x.iter()
                    .all(|t| (0..a.rank()).all(|i| i == d || t.shape[i] == a.shape[i])),
                || {
                    format!(
                        "operands must agree except in dimension {d}, got {}",
                        list(&x.iter().map(|t| (*t).clone()).collect::<Vec<_>>())
                    )
                },
            )?;
            let mut shape = a.shape.clone();
            shape[d] = x
                .iter()
                .try_fold(0usize, |n, t| n.checked_add(t.shape[d]))
                .and_then(|n| dim_size(n as i128))
                .ok_or_else(|| size_overflow(format!("the concatenated size of dimension {d}")))?;
            one(TensorType::new(a.dtype, shape), 4)
        }
        Reverse { dimensions } => {
            let a = x[0];
            l.ensure(
                1,
                unique(dimensions) && dimensions.iter().all(|&d| in_range(d, a.rank())),
                || format!("dimensions {dimensions:?} must be unique and in range for {a}"),
            )?;
            one(a.clone(), 2)
        }
        Reduce { dimensions, kind } => {
            let (a, init) = (x[0], x[1]);
            l.ensure(1, init.rank() == 0 && init.dtype == a.dtype, || {
                format!(
                    "init_value must be a scalar of the operand's element type, got {init} for {a}"
                )
            })?;
            l.ensure(
                2,
                unique(dimensions) && dimensions.iter().all(|&d| in_range(d, a.rank())),
                || format!("dimensions {dimensions:?} must be unique and in range for {a}"),
            )?;
            l.ensure(
                3,
                *kind != Combiner::Replace && combiner_ok(*kind, a.dtype),
                || format!("kind `{kind}` cannot reduce {}", a.dtype),
            )?;
            let shape: Vec<usize> = (0..a.rank())
                .filter(|d| !dimensions.contains(&(*d as i64)))
                .map(|d| a.shape[d])
                .collect();
            one(TensorType::new(a.dtype, shape), 4)
        }
        ReduceRegion { dimensions, body } => {
            let (inputs, inits) = variadic_operands(&l, x)?;
            let a = inputs[0];
            l.ensure(
                4,
                unique(dimensions) && dimensions.iter().all(|&d| in_range(d, a.rank())),
                || format!("dimensions {dimensions:?} must be unique and in range for {a}"),
            )?;
            reducer_body(&l, body, inits, 5)?;
            let shape: Vec<usize> = (0..a.rank())
                .filter(|d| !dimensions.contains(&(*d as i64)))
                .map(|d| a.shape[d])
                .collect();
            Ok(Inferred {
                types: inputs
                    .iter()
                    .map(|t| TensorType::new(t.dtype, shape.clone()))
                    .collect(),
                label: 7,
            })
        }
        ReduceWindowRegion {
            window_dimensions: wd,
            window_strides: ws,
            base_dilations: bd,
            window_dilations: wdl,
            padding,
            body,
        } => {
            let (inputs, inits) = variadic_operands(&l, x)?;
            let a = inputs[0];
            let shape = window_result_shape(&l, (4, 5), a, [wd, ws, bd, wdl], padding)?;
            reducer_body(&l, body, inits, 6)?;
            Ok(Inferred {
                types: inputs
                    .iter()
                    .map(|t| TensorType::new(t.dtype, shape.clone()))
                    .collect(),
                label: 8,
            })
        }
        Map {
            dimensions,
            computation,
        } => {
            let a = x[0];
            for t in &x[1..] {
                l.ensure(1, t.shape == a.shape, || {
                    format!("the operands must have one shape, got {a} and {t}")
                })?;
            }
            let all: Vec<i64> = (0..a.rank() as i64).collect();
            l.ensure(2, *dimensions == all, || {
                format!("dimensions {dimensions:?} must be every dimension of {a}, {all:?}")
            })?;
            region(computation)?;
            let expected: Vec<TensorType> = x.iter().map(|t| TensorType::scalar(t.dtype)).collect();
            let params = computation.param_types();
            l.ensure(3, params == expected, || {
                format!(
                    "computation @{} takes ({}) but the operands need ({})",
                    computation.name,
                    list(&params),
                    list(&expected)
                )
            })?;
            let [out] = &computation.output_types[..] else {
                return Err(diag(
                    l.c(4),
                    format!(
                        "computation @{} must return one scalar, returns ({})",
                        computation.name,
                        list(&computation.output_types)
                    ),
                ));
            };
            l.ensure(4, out.rank() == 0, || {
                format!(
                    "computation @{} must return one scalar, returns ({out})",
                    computation.name
                )
            })?;
            one(TensorType::new(out.dtype, a.shape.clone()), 5)
        }
        DotGeneral {
            lhs_batching_dimensions: lb,
            rhs_batching_dimensions: rb,
            lhs_contracting_dimensions: lc,
            rhs_contracting_dimensions: rc,
        } => {
            let (a, b) = (x[0], x[1]);
            l.ensure(1, lb.len() == rb.len(), || format!("lhs_batching_dimensions {lb:?} and rhs_batching_dimensions {rb:?} differ in length"))?;
            l.ensure(2, lc.len() == rc.len(), || format!("lhs_contracting_dimensions {lc:?} and rhs_contracting_dimensions {rc:?} differ in length"))?;
            let all_l: Vec<i64> = lb.iter().chain(lc).copied().collect();
            let all_r: Vec<i64> = rb.iter().chain(rc).copied().collect();
            l.ensure(3, unique(&all_l) && all_l.iter().all(|&d| in_range(d, a.rank())), || format!("lhs batching and contracting dimensions {all_l:?} must be unique and in range for {a}"))?;
            l.ensure(4, unique(&all_r) && all_r.iter().all(|&d| in_range(d, b.rank())), || format!("rhs batching and contracting dimensions {all_r:?} must be unique and in range for {b}"))?;
            for (&i, &j) in lb.iter().zip(rb) {
                l.ensure(5, a.shape[i as usize] == b.shape[j as usize], || {
                    format!("batch dimension {i} of {a} and {j} of {b} differ")
                })?;
            }
            for (&i, &j) in lc.iter().zip(rc) {
                l.ensure(6, a.shape[i as usize] == b.shape[j as usize], || {
                    format!("contracting dimension {i} of {a} and {j} of {b} differ")
                })?;
            }
            l.ensure(7, a.dtype == b.dtype && !a.dtype.is_pred(), || {
                format!(
                    "operands must share an integer, float or complex element type, got {a} and {b}"
                )
            })?;
            let mut shape: Vec<usize> = lb.iter().map(|&d| a.shape[d as usize]).collect();
            shape.extend(
                (0..a.rank())
                    .filter(|d| !all_l.contains(&(*d as i64)))
                    .map(|d| a.shape[d]),
            );
            shape.extend(
                (0..b.rank())
                    .filter(|d| !all_r.contains(&(*d as i64)))
                    .map(|d| b.shape[d]),
            );
            // A declared result type may widen the element type (`preferred_element_type`):
            // products and sums are then computed in it.
            let dtype = match declared.and_then(|d| d.first()) {
                Some(r) if widens(a.dtype, r.dtype) => r.dtype,
                _ => a.dtype,
            };
            one(TensorType::new(dtype, shape), 8)
        }
        Convolution {
            window_strides,
            padding,
            lhs_dilation,
            rhs_dilation,
            feature_group_count,
            input_dims,
            kernel_dims,
            output_dims,
            batch_group_count,
        } => {
            let (a, w) = (x[0], x[1]);
            let n = a.rank();
            l.ensure(1, n >= 2 && w.rank() == n && a.dtype == w.dtype && !a.dtype.is_pred() && !a.dtype.is_complex(), || {
                format!("lhs and rhs must have one rank of at least 2 and one integer or float element type, got {a} and {w}")
            })?;
            l.ensure(2, is_permutation(input_dims, n) && is_permutation(kernel_dims, n) && is_permutation(output_dims, n), || {
                format!("input_dims {input_dims:?}, kernel_dims {kernel_dims:?} and output_dims {output_dims:?} must each be a permutation of 0..{n}")
            })?;
            let sp = n - 2;
            l.ensure(3, [window_strides, lhs_dilation, rhs_dilation].iter().all(|v| v.len() == sp && v.iter().all(|&s| s > 0)), || {
                format!("window_strides, lhs_dilation and rhs_dilation must have {sp} positive entries")
            })?;
            l.ensure(4, padding.len() == sp, || {
                format!(
                    "padding must have {sp} [low, high] pairs, got {}",
                    padding.len()
                )
            })?;
            let g = *feature_group_count;
            let in_f = a.shape[input_dims[1] as usize];
            let k_in = w.shape[kernel_dims[1] as usize];
            let k_out = w.shape[kernel_dims[0] as usize];
            l.ensure(5, g > 0 && k_in.checked_mul(g as usize) == Some(in_f), || {
                format!("input features ({in_f}) must equal kernel input features ({k_in}) times feature_group_count ({g})")
            })?;
            l.ensure(6, k_out % g as usize == 0, || format!("kernel output features ({k_out}) must be divisible by feature_group_count ({g})"))?;
            let bg = *batch_group_count;
            let batch = a.shape[input_dims[0] as usize];
            l.ensure(8, bg > 0 && (bg == 1 || g == 1) && batch % bg as usize == 0 && k_out % bg as usize == 0, || {
                format!("batch_group_count ({bg}) must be positive, 1 when feature_group_count ({g}) is not, and divide the input batch ({batch}) and the kernel output features ({k_out})")
            })?;
            let mut shape = vec![0; n];
            shape[output_dims[0] as usize] = batch / bg as usize;
            shape[output_dims[1] as usize] = k_out;
            for i in 0..sp {
                let size = a.shape[input_dims[2 + i] as usize];
                let win = w.shape[kernel_dims[2 + i] as usize] as i64;
                shape[output_dims[2 + i] as usize] = checked_window_output_size(
                    size,
                    lhs_dilation[i],
                    padding[i],
                    win,
                    rhs_dilation[i],
                    window_strides[i],
                )
                .ok_or_else(|| {
                    size_overflow(format!("the size of spatial dimension {i} of the result"))
                })?;
            }
            // As `dot_general`'s, a declared result type may widen the element type.
            let dtype = match declared.and_then(|d| d.first()) {
                Some(r) if widens(a.dtype, r.dtype) => r.dtype,
                _ => a.dtype,
            };
            one(TensorType::new(dtype, shape), 7)
        }
        Gather {
            offset_dims,
            collapsed_slice_dims,
            start_index_map,
            index_vector_dim,
            slice_sizes,
            operand_batching_dims: obd,
            start_indices_batching_dims: sibd,
        } => {
            let (a, idx) = (x[0], x[1]);
            l.ensure(1, idx.dtype.is_int(), || {
                format!("start_indices must be integers, got {idx}")
            })?;
            let ivd = *index_vector_dim;
            l.ensure(2, ivd >= 0 && ivd as usize <= idx.rank(), || {
                format!("index_vector_dim {ivd} out of range for {idx}")
            })?;
            let ivd = ivd as usize;
            l.ensure(3, sorted_unique(offset_dims) && offset_dims.len() + collapsed_slice_dims.len() + obd.len() == a.rank(), || {
                format!("offset_dims {offset_dims:?} must be sorted, unique, and name every operand dimension that is neither collapsed nor a batching dimension")
            })?;
            l.ensure(6, slice_sizes.len() == a.rank() && slice_sizes.iter().zip(&a.shape).all(|(&s, &d)| 0 <= s && s <= d as i64), || {
                format!("slice_sizes {slice_sizes:?} must have one entry per dimension of {a}, each within the dimension")
            })?;
            l.ensure(4, sorted_unique(collapsed_slice_dims) && collapsed_slice_dims.iter().all(|&d| in_range(d, a.rank()) && slice_sizes[d as usize] <= 1), || {
                format!("collapsed_slice_dims {collapsed_slice_dims:?} must be sorted, unique, in range, with slice size at most 1")
            })?;
            let ivec = if ivd == idx.rank() { 1 } else { idx.shape[ivd] };
            l.ensure(5, start_index_map.len() == ivec && unique(start_index_map) && start_index_map.iter().all(|&d| in_range(d, a.rank()) && !obd.contains(&d)), || {
                format!("start_index_map {start_index_map:?} must have {ivec} unique in-range entries, none of them an operand batching dimension")
            })?;
            l.ensure(8, batching_ok(a, idx, ivd, obd, sibd, collapsed_slice_dims, slice_sizes), || {
                format!("operand_batching_dims {obd:?} and start_indices_batching_dims {sibd:?} must pair dimensions of equal size: the operand's sorted, unique, in range, not collapsed, with slice size at most 1; the indices' unique, in range, not index_vector_dim {ivd}")
            })?;
            let batch: Vec<usize> = (0..idx.rank())
                .filter(|&d| d != ivd)
                .map(|d| idx.shape[d])
                .collect();
            let offsets: Vec<usize> = (0..a.rank())
                .filter(|d| {
                    !collapsed_slice_dims.contains(&(*d as i64)) && !obd.contains(&(*d as i64))
                })
                .map(|d| slice_sizes[d] as usize)
                .collect();
            let rank = batch.len() + offsets.len();
            l.ensure(3, offset_dims.iter().all(|&d| in_range(d, rank)), || {
                format!("offset_dims {offset_dims:?} out of range for a result of rank {rank}")
            })?;
            let (mut bi, mut oi) = (0, 0);
            let shape: Vec<usize> = (0..rank)
                .map(|d| {
                    if offset_dims.contains(&(d as i64)) {
                        oi += 1;
                        offsets[oi - 1]
                    } else {
                        bi += 1;
                        batch[bi - 1]
                    }
                })
                .collect();
            one(TensorType::new(a.dtype, shape), 7)
        }
        Scatter {
            update_window_dims: uwd,
            inserted_window_dims: iwd,
            scatter_dims_to_operand_dims: sdod,
            index_vector_dim,
            kind,
            input_batching_dims: ibd,
            scatter_indices_batching_dims: sibd,
        } => {
            let (a, idx, u) = (x[0], x[1], x[2]);
            l.ensure(1, u.dtype == a.dtype, || {
                format!("updates element type must match the operand: {u} and {a}")
            })?;
            l.ensure(2, idx.dtype.is_int(), || {
                format!("scatter_indices must be integers, got {idx}")
            })?;
            let ivd = *index_vector_dim;
            l.ensure(3, ivd >= 0 && ivd as usize <= idx.rank(), || {
                format!("index_vector_dim {ivd} out of range for {idx}")
            })?;
            let ivd = ivd as usize;
            l.ensure(4, sorted_unique(uwd) && uwd.iter().all(|&d| in_range(d, u.rank())) && sorted_unique(iwd)
                && iwd.iter().all(|&d| in_range(d, a.rank())) && uwd.len() + iwd.len() + ibd.len() == a.rank(), || {
                format!("update_window_dims {uwd:?}, inserted_window_dims {iwd:?} and input_batching_dims {ibd:?} must be sorted, unique, in range, and together cover the {} operand dimensions", a.rank())
            })?;
            let ivec = if ivd == idx.rank() { 1 } else { idx.shape[ivd] };
            l.ensure(5, sdod.len() == ivec && unique(sdod) && sdod.iter().all(|&d| in_range(d, a.rank()) && !ibd.contains(&d)), || {
                format!("scatter_dims_to_operand_dims {sdod:?} must have {ivec} unique in-range entries, none of them an input batching dimension")
            })?;
            let ones = vec![1; a.rank()];
            l.ensure(8, batching_ok(a, idx, ivd, ibd, sibd, iwd, &ones), || {
                format!("input_batching_dims {ibd:?} and scatter_indices_batching_dims {sibd:?} must pair dimensions of equal size: the operand's sorted, unique, in range, not inserted; the indices' unique, in range, not index_vector_dim {ivd}")
            })?;
            let batch: Vec<usize> = (0..idx.rank())
                .filter(|&d| d != ivd)
                .map(|d| idx.shape[d])
                .collect();
            let scatter_dims: Vec<usize> = (0..u.rank())
                .filter(|d| !uwd.contains(&(*d as i64)))
                .map(|d| u.shape[d])
                .collect();
            let window_operand_dims: Vec<usize> = (0..a.rank())
                .filter(|d| !iwd.contains(&(*d as i64)) && !ibd.contains(&(*d as i64)))
                .collect();
            let fits = scatter_dims == batch
                && uwd
                    .iter()
                    .zip(&window_operand_dims)
                    .all(|(&ud, &od)| u.shape[ud as usize] <= a.shape[od]);
            l.ensure(6, fits, || format!("updates {u} do not fit: scatter dimensions must equal the index batch shape {batch:?} and window sizes must fit {a}"))?;
            l.ensure(7, combiner_ok(*kind, a.dtype), || {
                format!("kind `{kind}` cannot combine {}", a.dtype)
            })?;
            one(a.clone(), 1)
        }
        ReduceWindow {
            window_dimensions: wd,
            window_strides: ws,
            base_dilations: bd,
            window_dilations: wdl,
            padding,
            kind,
        } => {
            let (a, init) = (x[0], x[1]);
            l.ensure(1, init.rank() == 0 && init.dtype == a.dtype, || {
                format!(
                    "init_value must be a scalar of the operand's element type, got {init} for {a}"
                )
            })?;
            let shape = window_result_shape(&l, (2, 3), a, [wd, ws, bd, wdl], padding)?;
            l.ensure(
                4,
                *kind != Combiner::Replace && combiner_ok(*kind, a.dtype),
                || format!("kind `{kind}` cannot reduce {}", a.dtype),
            )?;
            one(TensorType::new(a.dtype, shape), 5)
        }
        SelectAndScatter {
            window_dimensions: wd,
            window_strides: ws,
            padding,
            select: _,
            kind,
        } => {
            let (a, src, init) = (x[0], x[1], x[2]);
            l.ensure(1, init.rank() == 0 && init.dtype == a.dtype && src.dtype == a.dtype, || {
                format!("source and init_value must have the operand's element type and init_value must be a scalar, got {src}, {init} for {a}")
            })?;
            let r = a.rank();
            l.ensure(2, wd.len() == r && ws.len() == r && padding.len() == r && wd.iter().chain(ws).all(|&s| s > 0), || {
                format!("window_dimensions, window_strides and padding must have {r} entries, sizes and strides positive")
            })?;
            let expect: Vec<usize> = (0..r)
                .map(|d| window_output_size(a.shape[d], 1, padding[d], wd[d], 1, ws[d]))
                .collect();
            l.ensure(3, src.shape == expect, || {
                format!("source shape {src} must be the window grid shape {expect:?}")
            })?;
            l.ensure(
                4,
                *kind != Combiner::Replace && combiner_ok(*kind, a.dtype),
                || format!("kind `{kind}` cannot combine {}", a.dtype),
            )?;
            l.ensure(4, !a.dtype.is_complex(), || {
                format!("select compares by an order, which complex numbers lack, got {a}")
            })?;
            one(a.clone(), 5)
        }
        RngBitGenerator { .. } => {
            let s = x[0];
            let (u32s, u64s) = (
                TensorType::new(DType::U32, [4]),
                TensorType::new(DType::U64, [2]),
            );
            l.ensure(1, *s == u32s || *s == u64s, || {
                format!("initial_state must be u32[4] or u64[2], got {s}")
            })?;
            let state = s.clone();
            let out = match declared {
                Some(d) => d[1].clone(),
                None => {
                    return Err(diag(
                        "ir_results".into(),
                        "`rng_bit_generator` needs an explicit output type".into(),
                    ));
                }
            };
            l.ensure(3, matches!(out.dtype, DType::U32 | DType::U64), || {
                format!("output must have element type u32 or u64, got {out}")
            })?;
            Ok(Inferred {
                types: vec![state, out],
                label: 2,
            })
        }
        OptimizationBarrier {} => Ok(Inferred {
            types: x.iter().map(|t| (*t).clone()).collect(),
            label: 1,
        }),
        While { cond, body } => {
            let carries: Vec<TensorType> = x.iter().map(|t| (*t).clone()).collect();
            region(cond)?;
            region(body)?;
            let cond_params = cond.param_types();
            l.ensure(1, cond_params == carries, || {
                format!(
                    "cond @{} takes ({}) but the carries are ({})",
                    cond.name,
                    list(&cond_params),
                    list(&carries)
                )
            })?;
            let pred = TensorType::new(DType::Pred, []);
            l.ensure(2, cond.output_types == [pred], || {
                format!(
                    "cond @{} must return one pred[], returns ({})",
                    cond.name,
                    list(&cond.output_types)
                )
            })?;
            let body_params = body.param_types();
            l.ensure(3, body_params == carries, || {
                format!(
                    "body @{} takes ({}) but the carries are ({})",
                    body.name,
                    list(&body_params),
                    list(&carries)
                )
            })?;
            l.ensure(4, body.output_types == carries, || {
                format!(
                    "body @{} returns ({}) but the carries are ({})",
                    body.name,
                    list(&body.output_types),
                    list(&carries)
                )
            })?;
            Ok(Inferred {
                types: carries,
                label: 4,
            })
        }
        Case { branches } => {
            let index = TensorType::new(DType::I32, []);
            l.ensure(1, *x[0] == index, || {
                format!("index must be i32[], got {}", x[0])
            })?;
            let Some(first) = branches.first() else {
                return Err(diag(l.c(2), "a case needs at least one branch".into()));
            };
            let args: Vec<TensorType> = x[1..].iter().map(|t| (*t).clone()).collect();
            for b in branches {
                region(b)?;
                let params = b.param_types();
                l.ensure(3, params == args, || {
                    format!(
                        "branch @{} takes ({}) but the operands after the index are ({})",
                        b.name,
                        list(&params),
                        list(&args)
                    )
                })?;
                l.ensure(4, b.output_types == first.output_types, || {
                    format!(
                        "branch @{} returns ({}) but branch @{} returns ({})",
                        b.name,
                        list(&b.output_types),
                        first.name,
                        list(&first.output_types)
                    )
                })?;
            }
            Ok(Inferred {
                types: first.output_types.clone(),
                label: 4,
            })
        }
        Call { callee } => {
            let Some(g) = &callee.func else {
                return Err(diag(
                    l.c(1),
                    format!("callee @{} is not a function of the module", callee.name),
                ));
            };
            region(g)?;
            let args: Vec<TensorType> = x.iter().map(|t| (*t).clone()).collect();
            let params = g.param_types();
            l.ensure(2, params == args, || {
                format!(
                    "callee @{} takes ({}) but the operands are ({})",
                    g.name,
                    list(&params),
                    list(&args)
                )
            })?;
            Ok(Inferred {
                types: g.output_types.clone(),
                label: 3,
            })
        }
        Sort {
            dimension,
            comparator,
            ..
        } => {
            let shape = &x[0].shape;
            for t in &x[1..] {
                l.ensure(1, t.shape == *shape, || {
                    format!("the operands must have one shape, got {} and {}", x[0], t)
                })?;
            }
            let rank = shape.len() as i64;
            l.ensure(2, (0..rank).contains(dimension), || {
                format!("dimension {dimension} is out of range for rank {rank}")
            })?;
            region(comparator)?;
            let expected: Vec<TensorType> = x
                .iter()
                .flat_map(|t| {
                    let s = TensorType::new(t.dtype, []);
                    [s.clone(), s]
                })
                .collect();
            let params = comparator.param_types();
            l.ensure(3, params == expected, || {
                format!(
                    "comparator @{} takes ({}) but the operands need ({}): lhs and rhs scalars of each, in order",
                    comparator.name,
                    list(&params),
                    list(&expected)
                )
            })?;
            let pred = TensorType::new(DType::Pred, []);
            l.ensure(4, comparator.output_types == [pred], || {
                format!(
                    "comparator @{} must return one pred[], returns ({})",
                    comparator.name,
                    list(&comparator.output_types)
                )
            })?;
            Ok(Inferred {
                types: x.iter().map(|t| (*t).clone()).collect(),
                label: 5,
            })
        }
        Cholesky { .. } => {
            let a = x[0];
            square_float_matrices(&l, a)?;
            one(a.clone(), 4)
        }
        Lu {} => {
            let a = x[0];
            let r = square_float_matrices(&l, a)?;
            let rows = TensorType::new(DType::I32, a.shape[..r - 1].to_vec());
            Ok(Inferred {
                types: vec![a.clone(), rows.clone(), rows],
                label: 4,
            })
        }
        Fft {
            fft_type,
            fft_length,
        } => fft::fft_rule(&l, *fft_type, fft_length, x[0]),
        ReplicaId {}
        | PartitionId {}
        | AllGather { .. }
        | AllReduce { .. }
        | AllToAll { .. }
        | ReduceScatter { .. }
        | CollectivePermute { .. }
        | CollectiveBroadcast { .. }
        | CollectiveReduce { .. } => collective::collective_rule(&l, op, x, declared),
        TriangularSolve { left_side, .. } => {
            let (a, b) = (x[0], x[1]);
            l.ensure(
                1,
                a.dtype == b.dtype && (a.dtype.is_float() || a.dtype.is_complex()),
                || format!("a and b must share a float or complex element type, got {a} and {b}"),
            )?;
            let r = a.rank();
            l.ensure(2, r >= 2 && b.rank() == r, || {
                format!("a and b must have one rank of at least 2, got {a} and {b}")
            })?;
            l.ensure(3, a.shape[..r - 2] == b.shape[..r - 2], || {
                format!("a and b must have the same batch dimensions, got {a} and {b}")
            })?;
            l.ensure(4, a.shape[r - 2] == a.shape[r - 1], || {
                format!("the matrices of a must be square, got {a}")
            })?;
            let side = if *left_side { r - 2 } else { r - 1 };
            l.ensure(5, a.shape[r - 1] == b.shape[side], || {
                format!(
                    "a's matrices are {n}x{n} but b's dimension {side} (left_side = {left_side}) is {m}",
                    n = a.shape[r - 1],
                    m = b.shape[side]
                )
            })?;
            one(b.clone(), 6)
        }
    }
}

/// Labels 1-3 of a reduction with a body (`reduce_region`, `reduce_window_region`): k inputs
/// of one shape and k init values, each a scalar of its input's element type.
fn variadic_operands<'a>(
    l: &Labels,
    x: &'a [&'a TensorType],
) -> R<(&'a [&'a TensorType], &'a [&'a TensorType])> {
    let k = x.len() / 2;
    l.ensure(1, x.len() == 2 * k, || {
        format!(
            "the operands must be k inputs and k init values, got {} operands",
            x.len()
        )
    })?;
    let (inputs, inits) = x.split_at(k);
    let a = inputs[0];
    for t in &inputs[1..] {
        l.ensure(2, t.shape == a.shape, || {
            format!("the inputs must have one shape, got {a} and {t}")
        })?;
    }
    for (t, i) in inputs.iter().zip(inits) {
        l.ensure(3, i.rank() == 0 && i.dtype == t.dtype, || {
            format!("each init value must be a scalar of its input's element type, got {i} for {t}")
        })?;
    }
    Ok((inputs, inits))
}

/// Labels `n` and `n + 1` of a reduction's body: it verifies, takes the init values' types
/// twice (accumulators, then elements) and returns them once.
fn reducer_body(l: &Labels, body: &Func, inits: &[&TensorType], n: u32) -> R<()> {
    region(body)?;
    let scalars: Vec<TensorType> = inits.iter().map(|t| (*t).clone()).collect();
    let expected: Vec<TensorType> = scalars.iter().chain(&scalars).cloned().collect();
    let params = body.param_types();
    l.ensure(n, params == expected, || {
        format!(
            "body @{} takes ({}) but the inputs need ({}): the accumulators, then the elements",
            body.name,
            list(&params),
            list(&expected)
        )
    })?;
    l.ensure(n + 1, body.output_types == scalars, || {
        format!(
            "body @{} returns ({}) but the accumulators are ({})",
            body.name,
            list(&body.output_types),
            list(&scalars)
        )
    })
}

/// Verifies a region of an instruction; its errors keep their label and say where they are.
fn region(f: &Func) -> R<()> {
    verify(f).map_err(|e| diag(e.diag.label.clone(), format!("region {e}")))
}

/// Checks a function: that every type's sizes fit in i64 (`ir_size`), SSA order, operand and
/// result counts, every op's type rule, and the returned values against the declared output
/// types.
pub fn verify(f: &Func) -> Result<(), VerifyError> {
    let err = |inst: Option<String>, loc, label: &str, message: String| VerifyError {
        func: f.name.clone(),
        inst,
        loc,
        diag: Diag {
            label: label.into(),
            message,
        },
    };
    let mut defined = vec![false; f.values.len()];
    for &p in &f.params {
        if let Some(Err(m)) = f.values.get(p.index()).map(TensorType::check_size) {
            return Err(err(None, None, "ir_size", format!("parameter {p}: {m}")));
        }
        match defined.get_mut(p.index()) {
            Some(d) if !*d => *d = true,
            _ => {
                return Err(err(
                    None,
                    None,
                    "ir_ssa",
                    format!("parameter {p} is not a fresh value"),
                ));
            }
        }
    }
    if let Some(m) = f.output_types.iter().find_map(|t| t.check_size().err()) {
        return Err(err(None, None, "ir_size", format!("return type: {m}")));
    }
    for inst in &f.insts {
        let head = inst_summary(inst);
        let mut tys = Vec::with_capacity(inst.operands.len());
        for &o in &inst.operands {
            if !defined.get(o.index()).copied().unwrap_or(false) {
                return Err(err(
                    Some(head),
                    inst.loc,
                    "ir_ssa",
                    format!("operand {o} is used before it is defined"),
                ));
            }
            tys.push(&f.values[o.index()]);
        }
        let mut declared = Vec::with_capacity(inst.results.len());
        for &r in &inst.results {
            match defined.get_mut(r.index()) {
                Some(d) if !*d => *d = true,
                _ => {
                    return Err(err(
                        Some(head),
                        inst.loc,
                        "ir_ssa",
                        format!("result {r} is not a fresh value"),
                    ));
                }
            }
            declared.push(f.values[r.index()].clone());
        }
        type_rule(&inst.op, &tys, Some(&declared)).map_err(|d| VerifyError {
            func: f.name.clone(),
            inst: Some(head),
            loc: inst.loc,
            diag: d,
        })?;
    }
    let out_tys: Vec<TensorType> = f
        .outputs
        .iter()
        .map(|&o| match defined.get(o.index()) {
            Some(true) => Ok(f.values[o.index()].clone()),
            _ => Err(err(
                None,
                None,
                "ir_ssa",
                format!("returned value {o} is not defined"),
            )),
        })
        .collect::<Result<_, _>>()?;
    if out_tys != f.output_types {
        return Err(err(
            None,
            None,
            "ir_return",
            format!(
                "returns {} but is declared to return {}",
                list(&out_tys),
                list(&f.output_types)
            ),
        ));
    }
    Ok(())
}

/// Verifies every function of a module, and its calls: each holds the module's function it
/// names (`call_c1`), and none recurses (`call_c4`).
pub fn verify_module(m: &crate::Module) -> Result<(), VerifyError> {
    crate::call::verify_calls(m)?;
    let mut names: Vec<&str> = Vec::new();
    for f in &m.funcs {
        if names.contains(&f.name.as_str()) {
            return Err(VerifyError {
                func: f.name.clone(),
                inst: None,
                loc: None,
                diag: Diag {
                    label: "ir_names".into(),
                    message: format!("function @{} is defined twice", f.name),
                },
            });
        }
        names.push(&f.name);
        verify(f)?;
    }
    Ok(())
}
