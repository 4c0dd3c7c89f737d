//! Complex values across region boundaries, for [`crate::complex::split_complex`]: a `while`
//! whose carries, a `case` whose operands or results, or a `sort` whose operands are complex
//! becomes the same op on the parts. Each complex carry, operand or result becomes two real ones
//! (its real part, then its imaginary part, side by side where it stood), and each region is
//! rewritten to match: it takes the parts, makes the complex values of its body from them
//! (`complex`), returns the parts of its complex results (`real`, `imag`), and is then split
//! itself, so that its body computes on parts too. A `sort`'s comparator takes each operand's
//! pair of elements (lhs, rhs): a complex operand's pair becomes the pairs of its two parts.

use crate::complex::{V, parts};
use kiln_ir::{Builder, Func, Inst, Op, TensorType, ValueId, VerifyError};

type R<T> = Result<T, VerifyError>;

/// Which of a region's original parameters a parameter of its split form stands for.
#[derive(Clone, Copy)]
enum Param {
    /// The parameter itself (a real one).
    Whole(usize),
    /// The real part of a complex parameter.
    Re(usize),
    /// The imaginary part of a complex parameter.
    Im(usize),
}

/// The parts of `ty`: itself when real, its part type twice when complex.
fn flat_types(ty: &TensorType) -> Vec<TensorType> {
    if ty.dtype.is_complex() {
        let p = ty.with_dtype(ty.dtype.part());
        vec![p.clone(), p]
    } else {
        vec![ty.clone()]
    }
}

/// The parameters of a region that takes `types` as they are (carries, a case's operands).
fn in_place(types: &[TensorType]) -> Vec<Param> {
    let mut out = Vec::new();
    for (k, t) in types.iter().enumerate() {
        if t.dtype.is_complex() {
            out.extend([Param::Re(k), Param::Im(k)]);
        } else {
            out.push(Param::Whole(k));
        }
    }
    out
}

/// The parameters of a comparator over operands of `types` (each operand's lhs and rhs
/// elements, in turn): a complex operand's parts are sorted as two operands, so its lhs and
/// rhs become the real parts' pair, then the imaginary parts'.
fn paired(types: &[TensorType]) -> Vec<Param> {
    let mut out = Vec::new();
    for (k, t) in types.iter().enumerate() {
        let (l, r) = (2 * k, 2 * k + 1);
        if t.dtype.is_complex() {
            out.extend([Param::Re(l), Param::Re(r), Param::Im(l), Param::Im(r)]);
        } else {
            out.extend([Param::Whole(l), Param::Whole(r)]);
        }
    }
    out
}

/// `g` taking the parameters `layout` describes and returning each complex result as its
/// parts, with its complex values computed on parts.
fn split_region(g: &Func, layout: &[Param]) -> R<Func> {
    let mut b = Builder::new(&g.name);
    let types = g.param_types();
    let mut given: Vec<[Option<ValueId>; 2]> = vec![[None; 2]; types.len()];
    for p in layout {
        let (k, slot) = match *p {
            Param::Whole(k) | Param::Re(k) => (k, 0),
            Param::Im(k) => (k, 1),
        };
        let ty = if matches!(p, Param::Whole(_)) {
            types[k].clone()
        } else {
            types[k].with_dtype(types[k].dtype.part())
        };
        given[k][slot] = Some(b.param(ty));
    }
    let mut args = Vec::with_capacity(types.len());
    for (k, t) in types.iter().enumerate() {
        let [Some(a), im] = given[k] else {
            unreachable!("every parameter is laid out")
        };
        args.push(match im {
            Some(im) if t.dtype.is_complex() => b.binary(Op::Complex {}, a, im)?,
            _ => a,
        });
    }
    // The joins and splits around the region's own instructions belong to none of them and
    // have no location; the region's instructions keep theirs (or none).
    b.locate_from(0, None);
    let outs = b.inline_at(g, &args, None)?;
    let first = b.inst_count();
    let mut flat = Vec::new();
    for (o, t) in outs.into_iter().zip(&g.output_types) {
        if t.dtype.is_complex() {
            flat.push(b.unary(Op::Real {}, o)?);
            flat.push(b.unary(Op::Imag {}, o)?);
        } else {
            flat.push(o);
        }
    }
    b.locate_from(first, None);
    crate::complex::split_complex(&b.finish(&flat)?)
}

/// `inst` (a `while`, `case` or `sort` with complex operands or results, whose operands are
/// `ops` of types `xs`, and results of types `tys`) on the parts of its complex values; `None`
/// for the other ops.
pub(crate) fn rewrite_region_op(
    b: &mut Builder,
    inst: &Inst,
    ops: &[V],
    xs: &[TensorType],
    tys: &[TensorType],
) -> R<Option<Vec<V>>> {
    let layout = match &inst.op {
        Op::While { .. } => in_place(xs),
        // The index stays as it is; the branches take the operands after it.
        Op::Case { .. } => in_place(&xs[1..]),
        Op::Sort { .. } => paired(xs),
        _ => return Ok(None),
    };
    let mut op = inst.op.clone();
    for g in op.regions_mut() {
        *g = split_region(g, &layout)?;
    }
    let mut args = Vec::new();
    for &v in ops {
        match v {
            V::Real(x) => args.push(x),
            V::Pair(..) => {
                let (re, im) = parts(b, v)?;
                args.extend([re, im]);
            }
        }
    }
    let flat: Vec<TensorType> = tys.iter().flat_map(flat_types).collect();
    let outs = b.push_at(op, &args, Some(&flat), inst.loc)?;
    let mut it = outs.into_iter();
    let mut results = Vec::with_capacity(tys.len());
    for t in tys {
        let first = it.next().expect("one result per part");
        results.push(if t.dtype.is_complex() {
            V::Pair(first, it.next().expect("an imaginary part"))
        } else {
            V::Real(first)
        });
    }
    Ok(Some(results))
}
