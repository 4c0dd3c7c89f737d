//! Inlining: a function with every `call` replaced by its callee's instructions.
//!
//! The backends, automatic differentiation and vectorization run on call-free functions: the
//! kernel pipeline, `vjp`, `jvp` and `vmap` inline first. Calls inside regions (a `while`
//! body, a `case` branch) are inlined into the region. An instruction of a callee keeps its
//! own source location, or takes the call's when it has none, so errors in inlined code name
//! the user's line.

use crate::error::{Diag, VerifyError};
use crate::print::inst_summary;
use crate::{Func, Inst, Loc, Op, ValueId};

/// `f` with every call inlined, recursively (a callee's own calls first); `f` itself when it
/// has none. A call whose callee is not resolved is an error (label `call_c1`) naming it.
pub fn inline_calls(f: &Func) -> Result<Func, VerifyError> {
    if !has_calls(f) {
        return Ok(f.clone());
    }
    let mut out = Func {
        name: f.name.clone(),
        params: Vec::new(),
        insts: Vec::new(),
        outputs: Vec::new(),
        output_types: f.output_types.clone(),
        values: Vec::new(),
    };
    let mut map: Vec<Option<ValueId>> = vec![None; f.values.len()];
    for &p in &f.params {
        let v = fresh(&mut out, f.values[p.index()].clone());
        out.params.push(v);
        map[p.index()] = Some(v);
    }
    emit(f, &mut out, &mut map, None)?;
    out.outputs = f.outputs.iter().map(|o| get(&map, *o)).collect();
    Ok(out)
}

/// Whether `f` has a call, in its instructions or regions.
pub fn has_calls(f: &Func) -> bool {
    f.insts
        .iter()
        .any(|i| matches!(i.op, Op::Call { .. }) || i.op.regions().into_iter().any(has_calls))
}

fn fresh(out: &mut Func, ty: crate::TensorType) -> ValueId {
    out.values.push(ty);
    ValueId(out.values.len() as u32 - 1)
}

fn get(map: &[Option<ValueId>], v: ValueId) -> ValueId {
    map[v.index()].expect("operands are defined before use (the function is verified)")
}

/// Appends `f`'s instructions to `out`, `f`'s values mapped by `map` (its parameters already
/// mapped); `loc` is the location of the call being inlined, if any.
fn emit(
    f: &Func,
    out: &mut Func,
    map: &mut [Option<ValueId>],
    loc: Option<Loc>,
) -> Result<(), VerifyError> {
    for inst in &f.insts {
        let operands: Vec<ValueId> = inst.operands.iter().map(|o| get(map, *o)).collect();
        let here = inst.loc.or(loc);
        if let Op::Call { callee } = &inst.op {
            let Some(g) = &callee.func else {
                return Err(VerifyError {
                    func: f.name.clone(),
                    inst: Some(inst_summary(inst)),
                    loc: here,
                    diag: Diag {
                        label: "call_c1".into(),
                        message: format!("callee @{} is not a function of the module", callee.name),
                    },
                });
            };
            let mut inner: Vec<Option<ValueId>> = vec![None; g.values.len()];
            for (p, &a) in g.params.iter().zip(&operands) {
                inner[p.index()] = Some(a);
            }
            emit(g, out, &mut inner, here)?;
            for (&r, &o) in inst.results.iter().zip(&g.outputs) {
                map[r.index()] = Some(get(&inner, o));
            }
            continue;
        }
        let mut op = inst.op.clone();
        for r in op.regions_mut() {
            *r = inline_calls(r)?;
        }
        let results: Vec<ValueId> = inst
            .results
            .iter()
            .map(|r| {
                let v = fresh(out, f.values[r.index()].clone());
                map[r.index()] = Some(v);
                v
            })
            .collect();
        out.insts.push(Inst {
            op,
            operands,
            results,
            loc: here,
        });
    }
    Ok(())
}
