//! The bound of a `while`'s results: its body unrolled over the trips the reference took
//! (see the module documentation of [`crate::accuracy`]).

use super::{Bound, cone_bound, defining_insts};
use kiln_ir::Func;

/// The most trips each `while` took in one evaluation, by the address of its body region
/// (loops inside regions included): what the bound of a loop's results needs.
#[derive(Clone, Debug, Default)]
pub struct Trips(std::collections::HashMap<usize, usize>);

impl Trips {
    fn key(body: &Func) -> usize {
        body as *const Func as usize
    }

    /// Records a run of the loop of `body` that took `n` trips.
    pub(super) fn record(&mut self, body: &Func, n: usize) {
        let t = self.0.entry(Self::key(body)).or_insert(0);
        *t = (*t).max(n);
    }

    /// The most trips a run of the loop of `body` took (0 if it never ran).
    pub fn of(&self, body: &Func) -> usize {
        self.0.get(&Self::key(body)).copied().unwrap_or(0)
    }
}

/// The parameters (by position) that value `o` of `f` depends on.
fn params_read(f: &Func, def: &[usize], o: kiln_ir::ValueId) -> Vec<usize> {
    let mut seen = vec![false; f.values.len()];
    let mut stack = vec![o];
    let mut out = Vec::new();
    while let Some(v) = stack.pop() {
        if std::mem::replace(&mut seen[v.index()], true) {
            continue;
        }
        match def[v.index()] {
            usize::MAX => out.extend(f.params.iter().position(|&p| p == v)),
            i => stack.extend(f.insts[i].operands.iter().copied()),
        }
    }
    out.sort_unstable();
    out
}

/// The bound a `while` (`inst` of `f`, with regions `cond` and `body`) adds to its results'
/// cones after `trips`: its body's largest bound `trips` times over; `None` where the backend
/// may take other trips than the reference (the condition rounds, or reads a carry that is
/// inexact on entry or computed inexactly by a trip) or where the body's bound is infinite.
pub(super) fn loop_bound(
    f: &Func,
    def: &[usize],
    inst: &kiln_ir::Inst,
    [(cond, cond_bounds), (body, body_bounds)]: [(&Func, &Vec<Bound>); 2],
    trips: &Trips,
) -> Option<Bound> {
    let body_def = defining_insts(body);
    let outs: Vec<(Bound, Vec<usize>)> = body
        .outputs
        .iter()
        .zip(body_bounds)
        .map(|(&o, &b)| (b, params_read(body, &body_def, o)))
        .collect();
    // The carries that stay exact: exact on entry, and computed exactly from exact carries.
    let mut exact: Vec<bool> = inst
        .operands
        .iter()
        .map(|&x| cone_bound(f, def, x, Some(trips)).exact())
        .collect();
    loop {
        let mut changed = false;
        for (i, (b, reads)) in outs.iter().enumerate() {
            if exact[i] && !(b.exact() && reads.iter().all(|&p| exact[p])) {
                exact[i] = false;
                changed = true;
            }
        }
        if !changed {
            break;
        }
    }
    let cond_def = defining_insts(cond);
    let go = *cond.outputs.first()?;
    if !cond_bounds.first()?.exact() || !params_read(cond, &cond_def, go).iter().all(|&p| exact[p])
    {
        return None;
    }
    let mut b = Bound {
        ulps: 0.0,
        sum: 0.0,
        eps: 0.0,
    };
    for (o, _) in &outs {
        b.ulps = b.ulps.max(o.ulps);
        b.sum = b.sum.max(o.sum);
        b.eps = b.eps.max(o.eps);
    }
    b.ulps *= trips.of(body) as f64;
    b.ulps.is_finite().then_some(b)
}
