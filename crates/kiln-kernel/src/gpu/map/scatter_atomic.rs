//! A scatter-add by atomic additions ([`Mapper::scatter_atomic`]): where the options allow
//! float atomics ([`crate::options::Options::float_atomics`]), the form of an f32 or f16
//! scatter-add that would otherwise sort its updates by target (`scatter_sorted.rs`).
//!
//! 1. A launch of a thread per output element (grid-stride) copies the operand into the
//!    result.
//! 2. A launch of a thread per update (grid-stride) computes its target and, where it is in
//!    bounds, adds the update into it by [`Stmt::AtomicAdd`] (`red.global.add.f32`, or
//!    `red.global.add.noftz.f16`), each addition rounded to the result's dtype as the
//!    sequential scatter rounds each combination.
//!
//! Two launches and no scratch, against the sorted form's targets launch, the sort's launches
//! and its combining launch; but the updates of one element meet in the order the hardware
//! runs the threads, so the result's last bits vary from run to run. Other combiners
//! (multiply, maximum, ...) and other dtypes keep the deterministic forms; so does bf16,
//! whose `red.add.noftz.bf16` PTX offers on sm_90 only, while every kernel also assembles for
//! sm_80.

use super::scatter::copy_element;
use super::scatter_sorted::Targets;
use super::*;

impl Mapper<'_> {
    /// The scatter `k` (combining by `kind`, its updates' targets `t`, `r` the registers
    /// they use) by atomic additions (see the module's doc); `None` unless float atomics are
    /// allowed, `kind` adds and the result is f32 or f16.
    pub(super) fn scatter_atomic(
        &self,
        name: &str,
        k: &Kernel,
        inputs: &[(Buf, TensorType)],
        kind: Combiner,
        t: &Targets,
        mut r: Regs,
    ) -> Option<GpuProgram> {
        let dtype = k.out.dtype;
        if !self.float_atomics || kind != Combiner::Add || !matches!(dtype, DType::F32 | DType::F16)
        {
            return None;
        }
        let total = k.out.numel();
        let n: usize = t.shape.iter().product();
        let result = vec![(Buf::Output(0), k.out.clone())];

        // 1. The operand copied.
        let mut cr = Regs::default();
        let [p, old] = cr.array();
        let copy = self.grid_stride(
            (&format!("{name}_copy"), MapKind::ScatterAtomic),
            (inputs.to_vec(), result.clone()),
            (cr.0, 0),
            (p, total, copy_element(old, Sc::Reg(p))),
        );

        // 2. Each update added into its target.
        let x = r.next();
        let mut each = t.target.clone();
        each.push(Stmt::If {
            cond: Sc::Reg(t.inb),
            body: vec![
                Stmt::Eval {
                    reg: x,
                    expr: k.body.clone(),
                    scalars: Vec::new(),
                },
                Stmt::AtomicAdd {
                    buf: Buf::Output(0),
                    index: t.flat.clone(),
                    value: x,
                },
            ],
        });
        let add = self.grid_stride(
            (name, MapKind::ScatterAtomic),
            (inputs.to_vec(), result),
            (r.0, k.vars.max(t.shape.len())),
            (t.update, n, each),
        );
        Some(GpuProgram::new(Vec::new(), vec![copy, add]))
    }
}
