//! The forward mode instruction by instruction, for functions with `while` loops or
//! reductions with a region.
//!
//! [`crate::jvp`] obtains the forward mode as the reverse mode of the reverse mode, which needs
//! a reverse mode for every instruction. A `while` loop whose trip count depends on the data
//! has none, nor has a reduction with any body, yet their forward modes are simple: the loop
//! carries each float carry's tangent alongside it, and its body is the forward mode of the
//! original body. So a function with either (at any depth) is differentiated forward here, one
//! instruction at a time:
//!
//! - `while`: a loop over the carries and the tangents of the carries a tangent reaches (a
//!   fixed point over the body); its condition reads the carries alone, its body is the
//!   body's forward mode (recursively, so loops nest);
//! - `case`: each branch replaced by its forward mode, the operands' tangents passed along;
//! - `reduce_region` and `reduce_window_region` (any body; their reverse mode recomputes them
//!   as `map`s of the body, which this avoids): one
//!   reduction of the values and their tangents together, whose body is the body's forward
//!   mode, so the tangents combine along the same tree as the values (an argmax's body selects
//!   the tangent with the value it selects, a product's applies the product rule);
//! - any other instruction: the forward mode of the one-instruction function it forms, as
//!   [`crate::jvp`] computes it (the reverse mode transposed), inlined.
//!
//! A loop with a static trip count differentiated forward this way stores nothing, and its
//! result is again a loop with a static trip count, so it can still be differentiated in
//! reverse (a Hessian-vector product through `fori_loop` or `scan`).

use crate::locations::UserLines;
use crate::{Result, eliminate_dead_code, select_outputs};
use kiln_ir::{Builder, Func, Loc, Op, TensorType, ValueId};

/// Whether `f` has an instruction the forward mode differentiates here rather than as the
/// reverse mode transposed (a `while` loop, a reduction with a region), at any depth of regions.
pub(crate) fn differentiated_forward(f: &Func) -> bool {
    f.insts.iter().any(|inst| {
        matches!(
            inst.op,
            Op::While { .. } | Op::ReduceRegion { .. } | Op::ReduceWindowRegion { .. }
        ) || inst.op.regions().into_iter().any(differentiated_forward)
    })
}

/// `f`'s forward mode (see [`crate::jvp`] for its signature), instruction by instruction.
/// Instructions whose results nothing reads are left out first: the reverse mode never sees
/// them, and a rule failing on one (a dilated window of maxima) failed the forward mode alone.
pub(crate) fn jvp(f: &Func, wrt: &[usize]) -> Result<Func> {
    let f = &eliminate_dead_code(f);
    let float_outs: Vec<usize> = (0..f.outputs.len())
        .filter(|&i| f.output_types[i].dtype.is_float())
        .collect();
    let mut g = forward_func(f, wrt, &float_outs)?;
    g.name = format!("{}_jvp", f.name);
    Ok(UserLines::of(f).keep_only(g))
}

/// A function of `f`'s parameters followed by the tangents of the parameters `with` that
/// returns `f`'s outputs followed by the tangents of its outputs `want` (zeros where no tangent
/// reaches one). Every index in `with` and `want` is a float parameter or output.
fn forward_func(f: &Func, with: &[usize], want: &[usize]) -> Result<Func> {
    if !with.is_empty() && !differentiated_forward(f) {
        return transposed(f, with, want);
    }
    let mut b = Builder::new(&f.name);
    let args: Vec<ValueId> = f.param_types().into_iter().map(|t| b.param(t)).collect();
    let mut tangents = vec![None; f.params.len()];
    for &i in with {
        tangents[i] = Some(b.param(f.values[f.params[i].index()].clone()));
    }
    let (outs, dots) = forward_into(&mut b, f, &args, &tangents)?;
    let mut all = outs;
    for &k in want {
        all.push(match dots[k] {
            Some(d) => d,
            None => b.full(&f.output_types[k], 0.0)?,
        });
    }
    Ok(eliminate_dead_code(&b.finish(&all)?))
}

/// [`forward_func`] as the reverse of the reverse mode (which keeps the transposed rules'
/// simplifications), for a nonempty `with`.
fn transposed(f: &Func, with: &[usize], want: &[usize]) -> Result<Func> {
    let n = f.outputs.len();
    let j = crate::jvp_transposed(f, with)?;
    let float_pos = |k: usize| {
        (0..k)
            .filter(|&i| f.output_types[i].dtype.is_float())
            .count()
    };
    let pick: Vec<usize> = (0..n)
        .chain(want.iter().map(|&k| n + float_pos(k)))
        .collect();
    Ok(select_outputs(&j, &pick, &f.name))
}

/// Adds `f`'s computation and its forward mode to `b`, `args` standing for its parameters and
/// `tangents` for their tangents (`None`: zero). Returns the outputs and their tangents.
fn forward_into(
    b: &mut Builder,
    f: &Func,
    args: &[ValueId],
    tangents: &[Option<ValueId>],
) -> Result<(Vec<ValueId>, Vec<Option<ValueId>>)> {
    let user = UserLines::of(f);
    let mut val: Vec<Option<ValueId>> = vec![None; f.values.len()];
    let mut dot: Vec<Option<ValueId>> = vec![None; f.values.len()];
    for (k, &p) in f.params.iter().enumerate() {
        val[p.index()] = Some(args[k]);
        dot[p.index()] = tangents[k];
    }
    for inst in &f.insts {
        let xs: Vec<ValueId> = inst
            .operands
            .iter()
            .map(|v| val[v.index()].expect("operands are defined earlier"))
            .collect();
        let ts: Vec<Option<ValueId>> = inst.operands.iter().map(|v| dot[v.index()]).collect();
        let types: Vec<TensorType> = inst
            .results
            .iter()
            .map(|r| f.values[r.index()].clone())
            .collect();
        let loc = inst.loc;
        let first = b.inst_count();
        let carries_tangent = types.iter().any(|t| t.dtype.is_float());
        // Tangents are real: one reaching an op with a complex result (`complex`, a conversion
        // to a complex type, an `fft`) has nowhere to go, and dropping it would make the
        // derivative silently wrong. (A region's complex results get their tangents from its
        // complex operands, which have none: its body is checked when it is differentiated.)
        if ts.iter().any(Option::is_some)
            && types.iter().any(|t| t.dtype.is_complex())
            && inst.op.regions().is_empty()
        {
            return Err(crate::complex_path(&inst.op, inst.loc, "forward"));
        }
        let (rs, rdots) = if ts.iter().all(Option::is_none) || !carries_tangent {
            let rs = b.push_at(inst.op.clone(), &xs, Some(&types), loc)?;
            (rs, vec![None; types.len()])
        } else {
            match &inst.op {
                Op::While { cond, body } => while_jvp(b, cond, body, &xs, &ts, loc)?,
                Op::Case { branches } => case_jvp(b, branches, &xs, &ts, loc)?,
                Op::ReduceRegion { body, .. } | Op::ReduceWindowRegion { body, .. } => {
                    reduce_jvp(b, &inst.op, body, &xs, &ts, loc)?
                }
                op => inst_jvp(b, op, &xs, &ts, &types, inst.loc)?,
            }
        };
        // The instruction and its tangent are at the user's line.
        user.locate_from(b, first, loc);
        for ((r, v), d) in inst.results.iter().zip(rs).zip(rdots) {
            val[r.index()] = Some(v);
            dot[r.index()] = d;
        }
    }
    let outs = f
        .outputs
        .iter()
        .map(|o| val[o.index()].expect("outputs are defined"))
        .collect();
    let dots = f.outputs.iter().map(|o| dot[o.index()]).collect();
    Ok((outs, dots))
}

/// Which of `f`'s outputs a tangent can reach when the parameters marked in `with` carry one:
/// a float result of an instruction with an operand that carries one (conservative for
/// regions: every float result of such an instruction).
fn reach(f: &Func, with: &[bool]) -> Vec<bool> {
    let mut has = vec![false; f.values.len()];
    for (&p, &w) in f.params.iter().zip(with) {
        has[p.index()] = w && f.values[p.index()].dtype.is_float();
    }
    for inst in &f.insts {
        if inst.operands.iter().any(|o| has[o.index()]) {
            for r in &inst.results {
                has[r.index()] = f.values[r.index()].dtype.is_float();
            }
        }
    }
    f.outputs.iter().map(|o| has[o.index()]).collect()
}

/// The tangent of `t` where there is one, else zeros of `x`'s type.
fn or_zeros(b: &mut Builder, t: Option<ValueId>, x: ValueId) -> Result<ValueId> {
    match t {
        Some(t) => Ok(t),
        None => {
            let ty = b.ty(x).expect("operands are defined").clone();
            Ok(b.full(&ty, 0.0)?)
        }
    }
}

/// `while(cond, body)` on carries `xs` with tangents `ts`: the loop extended by the tangents
/// of the carries they reach.
fn while_jvp(
    b: &mut Builder,
    cond: &Func,
    body: &Func,
    xs: &[ValueId],
    ts: &[Option<ValueId>],
    loc: Option<Loc>,
) -> Result<(Vec<ValueId>, Vec<Option<ValueId>>)> {
    let n = xs.len();
    // The carries a tangent reaches in some iteration: grow the set until the body adds none.
    let mut with: Vec<bool> = ts.iter().map(Option::is_some).collect();
    loop {
        let out = reach(body, &with);
        let next: Vec<bool> = with.iter().zip(&out).map(|(a, b)| *a || *b).collect();
        if next == with {
            break;
        }
        with = next;
    }
    let s: Vec<usize> = (0..n).filter(|&k| with[k]).collect();
    let body2 = forward_func(body, &s, &s)?;
    let mut c = Builder::new(&cond.name);
    let carries: Vec<ValueId> = cond.param_types().into_iter().map(|t| c.param(t)).collect();
    for &k in &s {
        c.param(cond.values[cond.params[k].index()].clone());
    }
    let test = c.inline(cond, &carries)?;
    let cond2 = c.finish(&test)?;
    let mut operands = xs.to_vec();
    for &k in &s {
        operands.push(or_zeros(b, ts[k], xs[k])?);
    }
    let rs = b.push_at(
        Op::While {
            cond: Box::new(cond2),
            body: Box::new(body2),
        },
        &operands,
        None,
        loc,
    )?;
    let mut dots = vec![None; n];
    for (j, &k) in s.iter().enumerate() {
        dots[k] = Some(rs[n + j]);
    }
    Ok((rs[..n].to_vec(), dots))
}

/// `case(index, args...)` with the args' tangents: each branch replaced by its forward mode.
fn case_jvp(
    b: &mut Builder,
    branches: &[Func],
    xs: &[ValueId],
    ts: &[Option<ValueId>],
    loc: Option<Loc>,
) -> Result<(Vec<ValueId>, Vec<Option<ValueId>>)> {
    let args = &xs[1..];
    let with: Vec<bool> = ts[1..].iter().map(Option::is_some).collect();
    let s: Vec<usize> = (0..args.len()).filter(|&k| with[k]).collect();
    let n = branches.first().map_or(0, |br| br.outputs.len());
    let mut reached = vec![false; n];
    for br in branches {
        for (r, x) in reached.iter_mut().zip(reach(br, &with)) {
            *r |= x;
        }
    }
    let want: Vec<usize> = (0..n).filter(|&k| reached[k]).collect();
    let forwards: Vec<Func> = branches
        .iter()
        .map(|br| forward_func(br, &s, &want))
        .collect::<Result<_>>()?;
    let mut operands = xs.to_vec();
    operands.extend(
        s.iter()
            .map(|&k| ts[1 + k].expect("chosen for its tangent")),
    );
    let rs = b.push_at(Op::Case { branches: forwards }, &operands, None, loc)?;
    let mut dots = vec![None; n];
    for (j, &k) in want.iter().enumerate() {
        dots[k] = Some(rs[n + j]);
    }
    Ok((rs[..n].to_vec(), dots))
}

/// A reduction `op` with region `body` (`reduce_region` or `reduce_window_region`) of
/// `inputs..., inits...` (`xs`, k of each) with tangents `ts`: the same reduction of the
/// values and the tangents of the float values a tangent reaches (the inputs' tangents, then
/// the inits'), whose body takes `acc..., dacc..., x..., dx...` and is the body's forward mode.
fn reduce_jvp(
    b: &mut Builder,
    op: &Op,
    body: &Func,
    xs: &[ValueId],
    ts: &[Option<ValueId>],
    loc: Option<Loc>,
) -> Result<(Vec<ValueId>, Vec<Option<ValueId>>)> {
    let k = xs.len() / 2;
    // The positions a tangent reaches: through an input or an init, then through the body
    // (which couples the positions) until it adds none.
    let mut with: Vec<bool> = (0..k)
        .map(|j| ts[j].is_some() || ts[k + j].is_some())
        .collect();
    loop {
        let params: Vec<bool> = with.iter().chain(&with).copied().collect();
        let out = reach(body, &params);
        let next: Vec<bool> = with.iter().zip(&out).map(|(a, b)| *a || *b).collect();
        if next == with {
            break;
        }
        with = next;
    }
    let s: Vec<usize> = (0..k).filter(|&j| with[j]).collect();
    // The body's forward mode: parameters `acc..., x..., dacc_s..., dx_s...`, results
    // `next..., dnext_s...`; reordered into the reduction's `acc..., dacc..., x..., dx...`.
    let wrt: Vec<usize> = s.iter().copied().chain(s.iter().map(|&j| k + j)).collect();
    let fwd = forward_func(body, &wrt, &s)?;
    let mut c = Builder::new(&format!("{}_jvp", body.name));
    let ptys = body.param_types();
    let acc: Vec<ValueId> = ptys[..k].iter().map(|t| c.param(t.clone())).collect();
    let dacc: Vec<ValueId> = s.iter().map(|&j| c.param(ptys[j].clone())).collect();
    let x: Vec<ValueId> = ptys[k..].iter().map(|t| c.param(t.clone())).collect();
    let dx: Vec<ValueId> = s.iter().map(|&j| c.param(ptys[k + j].clone())).collect();
    let args: Vec<ValueId> = [acc, x, dacc, dx].concat();
    let outs = c.inline(&fwd, &args)?;
    let body2 = c.finish(&outs)?;
    let mut operands: Vec<ValueId> = xs[..k].to_vec();
    for &j in &s {
        operands.push(or_zeros(b, ts[j], xs[j])?);
    }
    operands.extend_from_slice(&xs[k..]);
    for &j in &s {
        operands.push(or_zeros(b, ts[k + j], xs[k + j])?);
    }
    let mut op2 = op.clone();
    if let Op::ReduceRegion { body, .. } | Op::ReduceWindowRegion { body, .. } = &mut op2 {
        **body = body2;
    }
    let rs = b.push_at(op2, &operands, None, loc)?;
    let mut dots = vec![None; k];
    for (i, &j) in s.iter().enumerate() {
        dots[j] = Some(rs[k + i]);
    }
    Ok((rs[..k].to_vec(), dots))
}

/// Any other instruction: the forward mode of the one-instruction function `op` forms.
fn inst_jvp(
    b: &mut Builder,
    op: &Op,
    xs: &[ValueId],
    ts: &[Option<ValueId>],
    types: &[TensorType],
    loc: Option<Loc>,
) -> Result<(Vec<ValueId>, Vec<Option<ValueId>>)> {
    let mut g = Builder::new(op.mnemonic());
    let ps: Vec<ValueId> = xs
        .iter()
        .map(|&x| g.param(b.ty(x).expect("operands are defined").clone()))
        .collect();
    // The instruction keeps the user's location, or none: an error about it (an op without
    // a derivative rule) names where the user wrote it, never a line of kiln or of Rust's
    // library.
    let rs = g.push_at(op.clone(), &ps, Some(types), loc)?;
    let one = g.finish(&rs)?;
    let with: Vec<usize> = (0..xs.len()).filter(|&k| ts[k].is_some()).collect();
    let want: Vec<usize> = (0..types.len())
        .filter(|&k| types[k].dtype.is_float())
        .collect();
    let j = transposed(&one, &with, &want)?;
    let mut a = xs.to_vec();
    a.extend(with.iter().map(|&k| ts[k].expect("chosen for its tangent")));
    let outs = b.inline(&j, &a)?;
    let (prim, tans) = outs.split_at(types.len());
    let mut dots = vec![None; types.len()];
    for (&k, &t) in want.iter().zip(tans) {
        dots[k] = Some(t);
    }
    Ok((prim.to_vec(), dots))
}
