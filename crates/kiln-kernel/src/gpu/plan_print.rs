//! The text form of a device plan ([`DevicePlan`]): its arena, where every value lives, its
//! constants and its steps, each kernel step with its buffers' regions and its launches as
//! [`super::print::program_text`] prints them, each control step with its regions' plans. People read it (an AOT artifact keeps it beside
//! its PTX), and a runtime compares it with the plan it derives itself: two kiln versions that
//! decide differently print differently.

use super::plan::{DevicePlan, DeviceStep, Region};
use super::print::program_text;
use std::fmt::Write;

fn region(r: Region) -> String {
    format!("[{}, +{})", r.offset, r.bytes)
}

/// The text form of `plan` (deterministic: the same plan prints the same bytes).
pub fn plan_text(plan: &DevicePlan) -> String {
    let f = &plan.func;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "device plan of @{}: arena {} bytes (intermediates {} bytes, {} without sharing), scratch {}",
        f.name,
        plan.arena_bytes,
        plan.intermediate_bytes,
        plan.unplanned_bytes,
        region(plan.scratch)
    );
    let _ = writeln!(out, "values:");
    for (v, place) in plan.places.iter().enumerate() {
        if let Some(r) = place {
            let role = if f.params.iter().any(|p| p.index() == v) {
                " parameter"
            } else if f.outputs.iter().any(|o| o.index() == v) {
                " result"
            } else {
                ""
            };
            let _ = writeln!(out, "  %{v} : {} at {}{role}", f.values[v], region(*r));
        }
    }
    for (v, l) in &plan.constants {
        let _ = writeln!(out, "constant %{} : {}", v.index(), l.ty());
    }
    for (n, step) in plan.steps.iter().enumerate() {
        match step {
            DeviceStep::Kernel(k) => {
                let _ = writeln!(
                    out,
                    "step {n}: kernel #{} ({} launches){}",
                    k.inst,
                    k.program.launches.len(),
                    if k.bytes {
                        ", reads its input as bytes"
                    } else {
                        ""
                    }
                );
                for (i, (v, r)) in k.inputs.iter().enumerate() {
                    let _ = writeln!(out, "  in{i} = %{} at {}", v.index(), region(*r));
                }
                for (i, (v, r)) in k.outputs.iter().enumerate() {
                    let _ = writeln!(out, "  out{i} = %{} at {}", v.index(), region(*r));
                }
                for (i, r) in k.scratch.iter().enumerate() {
                    let _ = writeln!(out, "  scratch{i} at {}", region(*r));
                }
                for line in program_text(&k.program).lines() {
                    let _ = writeln!(out, "  | {line}");
                }
            }
            DeviceStep::Host(h) => {
                let insts: Vec<String> = h
                    .insts
                    .iter()
                    .map(|&i| format!("#{i} {}", f.insts[i].op.mnemonic()))
                    .collect();
                let ids = |vs: &[kiln_ir::ValueId]| {
                    vs.iter()
                        .map(|v| format!("%{}", v.index()))
                        .collect::<Vec<_>>()
                        .join(", ")
                };
                let _ = writeln!(
                    out,
                    "step {n}: host {} (reads {}; writes {}){}",
                    insts.join(", "),
                    ids(&h.reads),
                    ids(&h.writes),
                    h.refused
                        .as_ref()
                        .map(|w| format!(", the mapping refused it: {w}"))
                        .unwrap_or_default()
                );
            }
            DeviceStep::Control(c) => {
                let inst = &f.insts[c.inst];
                let _ = writeln!(
                    out,
                    "step {n}: control #{} {} on the host, its {} regions on the device:",
                    c.inst,
                    inst.op.mnemonic(),
                    c.regions.len()
                );
                for r in &c.regions {
                    for line in plan_text(r).lines() {
                        let _ = writeln!(out, "  : {line}");
                    }
                }
            }
        }
    }
    out
}
