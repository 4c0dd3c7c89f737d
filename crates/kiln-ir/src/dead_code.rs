//! Dead code elimination: a function without the instructions whose results nothing reads.

use crate::{Builder, Func, TensorType, ValueId};

/// Removes instructions none of whose results are used, keeping the function's canonical
/// numbering. Ops with the BARRIER property are kept.
pub fn eliminate_dead_code(f: &Func) -> Func {
    let mut live = vec![false; f.values.len()];
    for &o in &f.outputs {
        live[o.index()] = true;
    }
    let mut keep = vec![false; f.insts.len()];
    for (i, inst) in f.insts.iter().enumerate().rev() {
        if inst.results.iter().any(|r| live[r.index()])
            || inst.op.props().contains(crate::Props::BARRIER)
        {
            keep[i] = true;
            for o in &inst.operands {
                live[o.index()] = true;
            }
        }
    }
    let mut b = Builder::new(&f.name);
    let mut map: Vec<Option<ValueId>> = vec![None; f.values.len()];
    for &p in &f.params {
        map[p.index()] = Some(b.param(f.values[p.index()].clone()));
    }
    for (inst, _) in f.insts.iter().zip(&keep).filter(|(_, k)| **k) {
        let ops: Vec<ValueId> = inst
            .operands
            .iter()
            .map(|o| map[o.index()].expect("kept operands are live"))
            .collect();
        let tys: Vec<TensorType> = inst
            .results
            .iter()
            .map(|r| f.values[r.index()].clone())
            .collect();
        let rs = b
            .push_typed(inst.op.clone(), &ops, &tys)
            .expect("a verified function stays verified");
        for (&r, v) in inst.results.iter().zip(rs) {
            map[r.index()] = Some(v);
        }
    }
    let outs: Vec<ValueId> = f
        .outputs
        .iter()
        .map(|o| map[o.index()].expect("outputs are live"))
        .collect();
    let mut g = b.finish(&outs).expect("outputs are defined");
    for (new, old) in g.insts.iter_mut().zip(
        f.insts
            .iter()
            .zip(&keep)
            .filter(|(_, k)| **k)
            .map(|(i, _)| i),
    ) {
        new.loc = old.loc;
    }
    g
}
