//! Rewrites every float `dot_general` into the canonical `[B, M, K] x [B, K, N]` form the GEMM
//! schedule handles, by permuting and reshaping the operands (O(size) copies in front of the
//! O(M N K) product). The result needs only a reshape: its dimensions are already batch, lhs
//! free, rhs free.

use kiln_ir::{Builder, Func, Op, TensorType, ValueId};

fn free_dims(rank: usize, a: &[i64], c: &[i64]) -> Vec<i64> {
    (0..rank as i64)
        .filter(|d| !a.contains(d) && !c.contains(d))
        .collect()
}

fn prod(t: &TensorType, dims: &[i64]) -> usize {
    dims.iter().map(|&d| t.shape[d as usize]).product()
}

/// Permutes `v` to `perm` (skipped when it is the identity), then reshapes it to `shape`.
fn arrange(
    b: &mut Builder,
    v: ValueId,
    perm: &[i64],
    shape: &[usize],
) -> Result<ValueId, kiln_ir::VerifyError> {
    let identity = perm.iter().enumerate().all(|(i, &p)| p == i as i64);
    let t = if identity { v } else { b.transpose(v, perm)? };
    if b.ty(t).map(|t| t.shape.as_slice()) == Some(shape) {
        Ok(t)
    } else {
        b.reshape(t, shape)
    }
}

/// The function with its float dot_generals in canonical form.
pub fn canonicalize_dots(f: &Func) -> Result<Func, kiln_ir::VerifyError> {
    if !f
        .insts
        .iter()
        .any(|i| matches!(i.op, Op::DotGeneral { .. }))
    {
        return Ok(f.clone());
    }
    let mut b = Builder::new(&f.name);
    let mut map: Vec<Option<ValueId>> = vec![None; f.values.len()];
    for &p in &f.params {
        map[p.index()] = Some(b.param(f.values[p.index()].clone()));
    }
    for inst in &f.insts {
        let ops: Vec<ValueId> = inst
            .operands
            .iter()
            .map(|o| map[o.index()].expect("verified SSA"))
            .collect();
        let out_ty = &f.values[inst.results[0].index()];
        let results = match &inst.op {
            Op::DotGeneral {
                lhs_batching_dimensions: lb,
                rhs_batching_dimensions: rb,
                lhs_contracting_dimensions: lc,
                rhs_contracting_dimensions: rc,
            } if out_ty.dtype.is_float() => {
                let (lt, rt) = (
                    &f.values[inst.operands[0].index()],
                    &f.values[inst.operands[1].index()],
                );
                let (lf, rf) = (free_dims(lt.rank(), lb, lc), free_dims(rt.rank(), rb, rc));
                let (bsz, m, k, n) = (prod(lt, lb), prod(lt, &lf), prod(lt, lc), prod(rt, &rf));
                let lperm: Vec<i64> = lb.iter().chain(&lf).chain(lc).copied().collect();
                let rperm: Vec<i64> = rb.iter().chain(rc).chain(&rf).copied().collect();
                let a = arrange(&mut b, ops[0], &lperm, &[bsz, m, k])?;
                let c = arrange(&mut b, ops[1], &rperm, &[bsz, k, n])?;
                let canon = Op::DotGeneral {
                    lhs_batching_dimensions: vec![0],
                    rhs_batching_dimensions: vec![0],
                    lhs_contracting_dimensions: vec![2],
                    rhs_contracting_dimensions: vec![1],
                };
                let d = b.inst(canon, &[a, c])?;
                vec![if b.ty(d).map(|t| &t.shape) == Some(&out_ty.shape) {
                    d
                } else {
                    b.reshape(d, &out_ty.shape)?
                }]
            }
            _ => {
                let tys: Vec<TensorType> = inst
                    .results
                    .iter()
                    .map(|r| f.values[r.index()].clone())
                    .collect();
                b.push_typed(inst.op.clone(), &ops, &tys)?
            }
        };
        for (&r, v) in inst.results.iter().zip(results) {
            map[r.index()] = Some(v);
        }
    }
    let outs: Vec<ValueId> = f
        .outputs
        .iter()
        .map(|o| map[o.index()].expect("verified SSA"))
        .collect();
    b.finish(&outs)
}
