//! The VJP of a `while` loop with a static trip count, scan-style.
//!
//! A loop is differentiable in reverse mode when its trip count is known from the program: a
//! counter carry starts at a constant, the body adds a positive constant to it, and the
//! condition compares it with a constant (`i < n`), as `fori_loop` and `scan` write their
//! loops. The backward pass then
//! 1. runs the loop again, recording the carries at the start of every iteration (a stack
//!    of `n` copies; carries the body passes through unchanged are not recorded, and carries
//!    the body only writes windows into, such as the outputs a scan collects, are not either:
//!    their VJP needs no value);
//! 2. runs a second loop `n` times, iteration `j` taking the carries of forward iteration
//!    `n - 1 - j` from the stack and applying the VJP of the body to the carries' cotangents.
//!
//! Both loops count up from 0 to `n` by 1, so the result is itself a loop with a static trip
//! count and can be differentiated again. A loop whose trip count depends on the data has no
//! reverse mode (as in JAX): the error says so and points to `fori_loop` and `scan`. Its
//! forward mode is [`crate::forward`]'s.

use super::{Error, Result, ty};
use kiln_ir::{ComparisonDirection, DType, Func, Op, TensorType, ValueId};

/// The scalar integer value of `v` in `f`, if a constant defines it.
fn constant_int(f: &Func, v: ValueId) -> Option<i64> {
    f.insts.iter().find_map(|inst| match &inst.op {
        Op::Constant { value }
            if inst.results == [v] && value.numel() == 1 && value.dtype().is_int() =>
        {
            value.to_i64s().first().copied()
        }
        _ => None,
    })
}

/// The instruction of `f` defining `v`.
fn def(f: &Func, v: ValueId) -> Option<&kiln_ir::Inst> {
    f.insts.iter().find(|i| i.results.contains(&v))
}

/// A value of a region that is a known integer: a constant of the region, or a parameter for
/// a carry the body passes through unchanged whose initial value is a constant of `outer`.
fn region_int(outer: &Func, region: &Func, body: &Func, x: &[ValueId], v: ValueId) -> Option<i64> {
    if let Some(c) = constant_int(region, v) {
        return Some(c);
    }
    let k = region.params.iter().position(|&p| p == v)?;
    (body.outputs[k] == body.params[k]).then_some(())?;
    constant_int(outer, x[k])
}

/// The trip count of `while(cond, body)` on operands `x` (values of `outer`), when the
/// program fixes it.
pub(super) fn trip_count(outer: &Func, cond: &Func, body: &Func, x: &[ValueId]) -> Option<usize> {
    let test = def(cond, cond.outputs[0])?;
    let Op::Compare {
        comparison_direction: ComparisonDirection::Lt,
    } = test.op
    else {
        return None;
    };
    let k = cond.params.iter().position(|&p| p == test.operands[0])?;
    let hi = region_int(outer, cond, body, x, test.operands[1])?;
    let step_inst = def(body, body.outputs[k])?;
    let Op::Add {} = step_inst.op else {
        return None;
    };
    let p = body.params[k];
    let other = match step_inst.operands[..] {
        [a, s] if a == p => s,
        [s, a] if a == p => s,
        _ => return None,
    };
    let step = region_int(outer, body, body, x, other)?;
    let lo = constant_int(outer, x[k])?;
    if step <= 0 {
        return None;
    }
    Some(if hi <= lo {
        0
    } else {
        ((hi - lo + step - 1) / step) as usize
    })
}

/// Whether the body only ever writes windows into carry `k` (operand 0 of
/// `dynamic_update_slice`), never reading its value: its VJP does not need the value.
fn write_only(body: &Func, k: usize) -> bool {
    let p = body.params[k];
    !body.outputs.contains(&p)
        && body.insts.iter().all(|inst| {
            inst.operands
                .iter()
                .enumerate()
                .all(|(i, &o)| o != p || (i == 0 && matches!(inst.op, Op::DynamicUpdateSlice {})))
        })
}

fn i64_scalar(b: &mut kiln_ir::Builder, x: i64) -> Result<ValueId> {
    Ok(b.scalar(DType::I64, x as f64)?)
}

/// `j < n` over carries of `types` whose first is an `i64[]` counter `j`.
pub(crate) fn count_to(types: &[TensorType], n: usize, name: &str) -> Result<Func> {
    let mut c = kiln_ir::Builder::new(name);
    let ps: Vec<ValueId> = types.iter().map(|t| c.param(t.clone())).collect();
    let limit = i64_scalar(&mut c, n as i64)?;
    let lt = c.compare(ps[0], limit, ComparisonDirection::Lt)?;
    Ok(c.finish(&[lt])?)
}

/// Row `i` of the stack `s` (of `[n] + t`), as a `t`.
pub(crate) fn row(
    b: &mut kiln_ir::Builder,
    s: ValueId,
    i: ValueId,
    t: &TensorType,
) -> Result<ValueId> {
    let zero = i64_scalar(b, 0)?;
    let mut sizes = vec![1];
    sizes.extend(t.shape.iter().map(|&d| d as i64));
    let mut ops = vec![s, i];
    ops.extend(std::iter::repeat_n(zero, t.rank()));
    let r = b.inst(Op::DynamicSlice { slice_sizes: sizes }, &ops)?;
    Ok(b.reshape(r, &t.shape)?)
}

/// The cotangents of a `while`'s operands `x` given its results `r` and their cotangents `g`.
pub(super) fn while_vjp(
    b: &mut kiln_ir::Builder,
    cond: &Func,
    body: &Func,
    x: &[ValueId],
    r: &[ValueId],
    g: &[Option<ValueId>],
) -> Result<Vec<Option<ValueId>>> {
    let Some(n) = trip_count(b.func(), cond, body, x) else {
        return Err(Error::Unsupported(
            "`while`: reverse mode through a loop whose trip count depends on the data is not \
             defined (forward mode is: `jvp`); write the loop with a static trip count \
             (`fori_loop` with constant bounds, or `scan`) to differentiate it in reverse"
                .into(),
        ));
    };
    let types: Vec<TensorType> = x.iter().map(|&v| ty(b, v)).collect();
    let float: Vec<usize> = (0..x.len())
        .filter(|&k| types[k].dtype.is_float())
        .collect();
    let mut out = vec![None; x.len()];
    if float.is_empty() {
        return Ok(out);
    }
    // The cotangents of the results (zeros where none flows).
    let mut cts = Vec::with_capacity(float.len());
    for &k in &float {
        cts.push(match g[k] {
            Some(v) => v,
            None => b.full(&types[k], 0.0)?,
        });
    }
    if n == 0 {
        // No iteration: the results are the operands.
        for (&k, ct) in float.iter().zip(cts) {
            out[k] = Some(ct);
        }
        return Ok(out);
    }
    let invariant: Vec<bool> = (0..x.len())
        .map(|k| body.outputs[k] == body.params[k])
        .collect();
    let stored: Vec<usize> = (0..x.len())
        .filter(|&k| !invariant[k] && !write_only(body, k))
        .collect();
    let stack_types: Vec<TensorType> = stored
        .iter()
        .map(|&k| {
            let mut shape = vec![n];
            shape.extend(&types[k].shape);
            TensorType::new(types[k].dtype, shape)
        })
        .collect();

    // 1. The forward loop again, recording the stored carries of every iteration.
    let mut rec_types = types.clone();
    rec_types.extend(stack_types.iter().cloned());
    rec_types.push(TensorType::scalar(DType::I64));
    let record_body = {
        let mut rb = kiln_ir::Builder::new(&format!("{}_record", body.name));
        let ps: Vec<ValueId> = rec_types.iter().map(|t| rb.param(t.clone())).collect();
        let t = ps[ps.len() - 1];
        let zero = i64_scalar(&mut rb, 0)?;
        let mut stacks = Vec::with_capacity(stored.len());
        for (s, &k) in stored.iter().enumerate() {
            let mut shape = vec![1];
            shape.extend(&types[k].shape);
            let one = rb.reshape(ps[k], &shape)?;
            let mut ops = vec![ps[x.len() + s], one, t];
            ops.extend(std::iter::repeat_n(zero, types[k].rank()));
            stacks.push(rb.inst(Op::DynamicUpdateSlice {}, &ops)?);
        }
        let next = rb.inline(body, &ps[..x.len()])?;
        let one = i64_scalar(&mut rb, 1)?;
        let t1 = rb.binary(Op::Add {}, t, one)?;
        let mut outs = next;
        outs.extend(stacks);
        outs.push(t1);
        rb.finish(&outs)?
    };
    let record_cond = {
        let mut cb = kiln_ir::Builder::new(&format!("{}_record", cond.name));
        let ps: Vec<ValueId> = rec_types.iter().map(|t| cb.param(t.clone())).collect();
        let c = cb.inline(cond, &ps[..x.len()])?;
        cb.finish(&c)?
    };
    let mut init = x.to_vec();
    for st in &stack_types {
        init.push(b.full(st, 0.0)?);
    }
    init.push(i64_scalar(b, 0)?);
    let recorded = b.push(
        Op::While {
            cond: Box::new(record_cond),
            body: Box::new(record_body),
        },
        &init,
    )?;
    let stacks: Vec<ValueId> = recorded[x.len()..x.len() + stored.len()].to_vec();

    // 2. The backward loop: carries (j, cotangents..., stacks..., invariant operands...,
    //    final values of the write-only carries...).
    let body_vjp = crate::vjp(body, &float)?;
    let held: Vec<usize> = (0..x.len()).filter(|&k| !stored.contains(&k)).collect();
    let mut back_types = vec![TensorType::scalar(DType::I64)];
    back_types.extend(float.iter().map(|&k| types[k].clone()));
    back_types.extend(stack_types.iter().cloned());
    back_types.extend(held.iter().map(|&k| types[k].clone()));
    let back_body = {
        let mut bb = kiln_ir::Builder::new(&format!("{}_transposed", body.name));
        let ps: Vec<ValueId> = back_types.iter().map(|t| bb.param(t.clone())).collect();
        let j = ps[0];
        let nf = float.len();
        let ns = stored.len();
        let last = i64_scalar(&mut bb, n as i64 - 1)?;
        let i = bb.binary(Op::Subtract {}, last, j)?;
        let mut carries = Vec::with_capacity(x.len());
        for (k, t) in types.iter().enumerate() {
            carries.push(if let Some(s) = stored.iter().position(|&q| q == k) {
                row(&mut bb, ps[1 + nf + s], i, t)?
            } else {
                let h = held.iter().position(|&q| q == k).expect("held");
                ps[1 + nf + ns + h]
            });
        }
        // The body's outputs' cotangents: the float carries', zeros for the others.
        let mut args = carries;
        for (k, t) in types.iter().enumerate() {
            args.push(match float.iter().position(|&q| q == k) {
                Some(f) => ps[1 + f],
                None => bb.full(t, 0.0)?,
            });
        }
        let res = bb.inline(&body_vjp, &args)?;
        let one = i64_scalar(&mut bb, 1)?;
        let mut outs = vec![bb.binary(Op::Add {}, j, one)?];
        outs.extend(&res[x.len()..]);
        outs.extend(&ps[1 + nf..]);
        bb.finish(&outs)?
    };
    let back_cond = count_to(&back_types, n, &format!("{}_transposed", cond.name))?;
    let mut binit = vec![i64_scalar(b, 0)?];
    binit.extend(cts);
    binit.extend(stacks);
    for &k in &held {
        // Invariant carries are their operand; write-only carries any value of their type.
        binit.push(if invariant[k] { x[k] } else { r[k] });
    }
    let back = b.push(
        Op::While {
            cond: Box::new(back_cond),
            body: Box::new(back_body),
        },
        &binit,
    )?;
    for (f, &k) in float.iter().enumerate() {
        out[k] = Some(back[1 + f]);
    }
    Ok(out)
}
