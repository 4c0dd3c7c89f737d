//! A lowered program run on the emulator: each kernel step mapped to the GPU
//! ([`kiln_kernel::gpu::map`]) and emulated, constants and pass-throughs as the CPU runtime
//! runs them, and the instructions without a kernel by the reference interpreter. Every value
//! gets a buffer of its own (no arena): a kernel the memory plan runs in place of a donated
//! operand writes a fresh buffer instead, which computes the same values.

use super::{Buffer, EmuError, run_program};
use kiln_ir::{Literal, Op, TensorType};
use kiln_kernel::Step;
use kiln_kernel::gpu::{MapKind, map};
use kiln_kernel::pipeline::Lowered;
use kiln_kernel::target::TargetInfo;
use std::collections::BTreeMap;

/// What a run emulated.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct EmuReport {
    /// Kernel steps mapped and emulated.
    pub kernels: usize,
    /// Launches emulated, per mapping.
    pub launches: BTreeMap<MapKind, usize>,
    /// Kernel steps the mapping refused, run by the reference interpreter instead, with why.
    pub fallbacks: Vec<String>,
    /// Steps without a kernel, run by the reference interpreter.
    pub interpreted: usize,
}

impl std::ops::AddAssign for EmuReport {
    fn add_assign(&mut self, o: EmuReport) {
        self.kernels += o.kernels;
        for (k, n) in o.launches {
            *self.launches.entry(k).or_default() += n;
        }
        self.fallbacks.extend(o.fallbacks);
        self.interpreted += o.interpreted;
    }
}

/// Runs `l`, lowered for `target` (which must describe a GPU), on `args`.
pub fn run_lowered(
    l: &Lowered,
    target: &TargetInfo,
    args: &[Literal],
) -> Result<(Vec<Literal>, EmuReport), EmuError> {
    let f = &l.func;
    kiln_reference::check_args(f, args).map_err(|e| EmuError(e.to_string()))?;
    let mut env: Vec<Option<Literal>> = vec![None; f.values.len()];
    for (p, a) in f.params.iter().zip(args) {
        env[p.index()] = Some(a.clone());
    }
    let mut rep = EmuReport::default();
    let ty = |v: kiln_ir::ValueId| f.values[v.index()].clone();
    for (i, inst) in f.insts.iter().enumerate() {
        let value = |env: &Vec<Option<Literal>>, v: kiln_ir::ValueId| {
            env[v.index()]
                .clone()
                .ok_or_else(|| EmuError(format!("#{i} reads %{} before it is computed", v.index())))
        };
        match (&l.steps[i], &inst.op) {
            (Step::Fused | Step::Merged, _) => {}
            (Step::Constant, Op::Constant { value }) => {
                env[inst.results[0].index()] = Some(value.clone());
            }
            (Step::Forward, _) => {
                for (r, o) in inst.results.iter().zip(&inst.operands) {
                    env[r.index()] = Some(value(&env, *o)?);
                }
            }
            (Step::Kernel, _) => {
                let k = l.fused.kernels[i]
                    .as_ref()
                    .ok_or_else(|| EmuError(format!("#{i}: a kernel step without a kernel")))?;
                let operands = &l.fused.operands[i];
                let results: Vec<kiln_ir::ValueId> = std::iter::once(inst.results[0])
                    .chain(l.fused.extra[i].iter().copied())
                    .collect();
                let in_types: Vec<TensorType> = operands.iter().map(|&o| ty(o)).collect();
                let name = format!("k{i}_{}", inst.op.mnemonic());
                match map(k, &in_types, target, &name) {
                    Ok(prog) => {
                        if let Some(gpu) = &target.gpu {
                            for launch in &prog.launches {
                                kiln_kernel::gpu::print::verify(launch, gpu).map_err(EmuError)?;
                            }
                        }
                        // A kernel whose output type is not its value's copies bytes (a
                        // bitcast between widths): its buffers are then seen as bytes.
                        let bytes =
                            matches!(inst.op, Op::BitcastConvert {}) && k.out != ty(results[0]);
                        let ins: Vec<Buffer> = operands
                            .iter()
                            .map(|&o| {
                                let l = value(&env, o)?;
                                let name = format!("%{}", o.index());
                                Ok(if bytes {
                                    Buffer::bytes_of(&name, &l)
                                } else {
                                    Buffer::from_literal(&name, &l)
                                })
                            })
                            .collect::<Result<_, EmuError>>()?;
                        let in_refs: Vec<&Buffer> = ins.iter().collect();
                        let mut outs: Vec<Buffer> = results
                            .iter()
                            .enumerate()
                            .map(|(n, &r)| {
                                let t = if n == 0 && bytes {
                                    k.out.clone()
                                } else {
                                    ty(r)
                                };
                                Buffer::zeros(&format!("%{}", r.index()), &t)
                            })
                            .collect();
                        run_program(&prog, &in_refs, &mut outs)?;
                        for (n, (r, b)) in results.iter().zip(&outs).enumerate() {
                            env[r.index()] = Some(if bytes && n == 0 {
                                b.to_bytes_literal(&ty(*r))?
                            } else {
                                b.to_literal(&ty(*r))?
                            });
                        }
                        rep.kernels += 1;
                        for launch in &prog.launches {
                            *rep.launches.entry(launch.kind).or_default() += 1;
                        }
                    }
                    Err(why) => {
                        rep.fallbacks.push(why);
                        // The kernel's members, in order, on the reference interpreter.
                        let mut local = env.clone();
                        for &m in &l.fused.members[i] {
                            let mi = &f.insts[m];
                            let xs: Vec<Literal> = mi
                                .operands
                                .iter()
                                .map(|&o| value(&local, o))
                                .collect::<Result<_, _>>()?;
                            let refs: Vec<&Literal> = xs.iter().collect();
                            let tys: Vec<TensorType> = mi.results.iter().map(|&r| ty(r)).collect();
                            let outs = kiln_reference::eval_op(&mi.op, &refs, &tys);
                            for (r, o) in mi.results.iter().zip(outs) {
                                local[r.index()] = Some(o);
                            }
                        }
                        for r in &results {
                            env[r.index()] = local[r.index()].take();
                        }
                    }
                }
            }
            // Control flow runs its regions on the reference interpreter here (the emulator
            // maps kernels, not host loops).
            (Step::Reference | Step::Control, _) | (Step::Constant, _) => {
                let xs: Vec<Literal> = inst
                    .operands
                    .iter()
                    .map(|&o| value(&env, o))
                    .collect::<Result<_, _>>()?;
                let refs: Vec<&Literal> = xs.iter().collect();
                let tys: Vec<TensorType> = inst.results.iter().map(|&r| ty(r)).collect();
                let outs = kiln_reference::eval_op(&inst.op, &refs, &tys);
                for (r, o) in inst.results.iter().zip(outs) {
                    env[r.index()] = Some(o);
                }
                rep.interpreted += 1;
            }
        }
    }
    let outs = f
        .outputs
        .iter()
        .map(|&o| {
            env[o.index()]
                .clone()
                .ok_or_else(|| EmuError(format!("output %{} was never computed", o.index())))
        })
        .collect::<Result<_, _>>()?;
    Ok((outs, rep))
}

/// `f` compiled for the GPU `target` describes (an H200 by default, see
/// [`TargetInfo::h200`]) and run on the emulator: the backend `KILN_BACKEND=ptx-emulator`
/// selects.
pub fn compile_and_run(
    f: &kiln_ir::Func,
    donated: &[bool],
    opts: &kiln_kernel::Options,
    target: &TargetInfo,
    args: &[Literal],
) -> Result<(Vec<Literal>, EmuReport), EmuError> {
    let l = kiln_kernel::pipeline::lower_program(f, donated, opts, target, None, &mut |_| {})
        .map_err(|e| EmuError(e.to_string()))?;
    run_lowered(&l, target, args)
}
