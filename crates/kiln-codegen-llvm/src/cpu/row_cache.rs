//! Row caches: costly per-position values a reduction keeps for the loops after it, as the
//! kernel's loop schedule decides them ([`KernelSchedule::row_caches`]).

use super::*;

pub(super) use kiln_kernel::loop_schedule::{RowCache, costly_op};

/// What the emitter keeps in row caches in kernel `k` under its loop schedule `schedule` (see
/// [`kiln_kernel::loop_schedule::row_caches`]), one line per cached reduction, for the fusion
/// dump.
pub(super) fn row_cache_notes(k: &Kernel, schedule: Option<&KernelSchedule>) -> Vec<String> {
    let Some(schedule) = schedule else {
        return Vec::new();
    };
    let bodies: Vec<&Expr> = std::iter::once(&k.body)
        .chain(k.extra.iter().map(|x| &x.body))
        .collect();
    let reduces: Vec<&Expr> = bodies.iter().flat_map(|b| hoistable_reduces(b)).collect();
    let mut notes = Vec::new();
    for plan in &schedule.row_caches {
        let kind = reduces.iter().find_map(|r| match r {
            Expr::Reduce { kind, .. } if value_key(r) == plan.reduce => Some(kind),
            _ => None,
        });
        let Some(kind) = kind else { continue };
        let op = match &plan.part {
            Expr::Op {
                op: Ew::Kind(op), ..
            } => op.to_string(),
            _ => "costly part".to_string(),
        };
        notes.push(format!(
            "row cache: the {kind} reduction over {} positions keeps its {op} of each for the outputs along dimension {}",
            plan.len, plan.var
        ));
    }
    notes
}
