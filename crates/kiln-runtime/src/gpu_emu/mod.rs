//! The GPU emulator: runs the GPU IR ([`kiln_kernel::gpu`]) on the CPU with the GPU's
//! semantics, so the mapping is tested where there is no GPU.
//!
//! Blocks run side by side on rayon (their stores and atomic additions logged and applied in
//! block order, so the result is that of blocks run one after the other, as a launch that
//! reads its own outputs runs; an atomic addition reads its element as it is applied, one at
//! a time per element, in the order of the blocks and of their threads); the threads of a block run in lockstep, statement by
//! statement (`block.rs`: masks for `if`s and loops, barriers that must be reached by the
//! whole block, shuffles that read the other lanes' registers, shared memory checked for
//! races). Elements are computed as the compiled CPU path computes them ([`value`]). Any
//! global or shared access out of bounds is an error naming the buffer, the index and its
//! size. [`run_lowered`] runs a whole lowered program through its device plan, as the CUDA
//! executor runs it: one byte arena (filled with `0xff` bytes first, so a launch that leaves
//! an element unwritten shows), kernel steps emulated launch by launch, host steps on the
//! reference interpreter.

mod block;
mod device;
mod lowered;
pub mod value;

pub use device::{EmuDevice, Traffic};
pub use lowered::{EmuReport, compile_and_run, run_lowered, run_plan, run_plan_bytes};
pub use value::V;

use kiln_ir::literal::round_to;
use kiln_ir::literal::wrap_to;
use kiln_ir::{DType, Literal, TensorType};
use kiln_kernel::gpu::ir::*;
use std::fmt;

/// Why an emulated launch failed: a race, a divergent barrier or shuffle, an access out of
/// bounds, or an op the emulator does not know.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EmuError(pub String);

impl fmt::Display for EmuError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for EmuError {}

/// A buffer in the emulator's global memory: one value per element, as registers hold it.
#[derive(Clone, Debug)]
pub struct Buffer {
    /// Its name in errors.
    pub name: String,
    /// Its dtype (stores round to it).
    pub dtype: DType,
    /// Its elements.
    pub data: Vec<V>,
}

impl Buffer {
    /// A buffer of `ty` filled with zeros.
    pub fn zeros(name: &str, ty: &TensorType) -> Buffer {
        let zero = if held_as_float(ty.dtype) {
            V::F(0.0)
        } else {
            V::I(0)
        };
        Buffer {
            name: name.to_string(),
            dtype: ty.dtype,
            data: vec![zero; ty.numel()],
        }
    }

    /// The elements of `l`.
    pub fn from_literal(name: &str, l: &Literal) -> Buffer {
        let data = if held_as_float(l.dtype()) {
            l.to_f64s().into_iter().map(V::F).collect()
        } else if l.dtype().mini().is_some() {
            l.to_le_bytes()
                .into_iter()
                .map(|b| V::I(b as i64))
                .collect()
        } else {
            l.to_i64s().into_iter().map(V::I).collect()
        };
        Buffer {
            name: name.to_string(),
            dtype: l.dtype(),
            data,
        }
    }

    /// The little-endian bytes of `l`, one `i8` element each.
    pub fn bytes_of(name: &str, l: &Literal) -> Buffer {
        Buffer {
            name: name.to_string(),
            dtype: DType::I8,
            data: l
                .to_le_bytes()
                .into_iter()
                .map(|b| V::I(b as i8 as i64))
                .collect(),
        }
    }

    /// The buffer's `i8` elements as the little-endian bytes of a literal of `ty`.
    pub fn to_bytes_literal(&self, ty: &TensorType) -> Result<Literal, EmuError> {
        let bytes: Vec<u8> = self.data.iter().map(|v| v.i() as u8).collect();
        Literal::from_le_bytes(ty.clone(), &bytes)
            .map_err(|e| EmuError(format!("{}: {e}", self.name)))
    }

    /// The buffer as a literal of `ty`.
    pub fn to_literal(&self, ty: &TensorType) -> Result<Literal, EmuError> {
        let r = if held_as_float(ty.dtype) {
            let xs: Vec<f64> = self.data.iter().map(|v| v.f()).collect();
            Literal::from_f64s(ty.clone(), &xs)
        } else if ty.dtype.mini().is_some() {
            let bytes: Vec<u8> = self.data.iter().map(|v| v.i() as u8).collect();
            Literal::from_le_bytes(ty.clone(), &bytes)
        } else {
            let xs: Vec<i64> = self.data.iter().map(|v| v.i()).collect();
            Literal::from_i64s(ty.clone(), &xs)
        };
        r.map_err(|e| EmuError(format!("{}: {e}", self.name)))
    }

    /// Adds `v` (rounded to the dtype first, as a register is converted for an atomic
    /// addition) to the float element `i`, the sum rounded once to the dtype: what one
    /// `red.global.add` does to its element (a sum of two f32 or f16 values computed in f64 and
    /// rounded once is correctly rounded).
    pub fn add(&mut self, i: usize, v: V) {
        let x = round_to(self.dtype, v.f());
        self.data[i] = V::F(round_to(self.dtype, self.data[i].f() + x));
    }

    /// Stores `v` at `i` or adds it there ([`Buffer::store`], [`Buffer::add`]).
    pub(crate) fn write(&mut self, i: usize, v: V, how: block::Write) {
        match how {
            block::Write::Store => self.store(i, v),
            block::Write::Add => self.add(i, v),
        }
    }

    /// Stores `v` at `i`, rounded or wrapped to the dtype.
    pub fn store(&mut self, i: usize, v: V) {
        self.data[i] = if held_as_float(self.dtype) {
            V::F(round_to(self.dtype, v.f()))
        } else if let Some(m) = self.dtype.mini() {
            V::I(v.i() & ((1 << m.bits()) - 1))
        } else {
            V::I(wrap_to(self.dtype, v.i()))
        };
    }
}

/// Whether a buffer of `d` holds floats: every float dtype but the small floats, whose
/// elements kernels move as their bit patterns (`kiln_kernel::minifloat`).
fn held_as_float(d: DType) -> bool {
    d.is_float() && d.mini().is_none()
}

/// Runs the mapped kernel `p` on `inputs` (the kernel's inputs, by index), writing `outputs`
/// (its result, then its extra outputs): the buffers it zeroes set to negative zero, then
/// launch after launch.
pub fn run_program(
    p: &GpuProgram,
    inputs: &[&Buffer],
    outputs: &mut [Buffer],
) -> Result<(), EmuError> {
    let mut scratch: Vec<Buffer> = p
        .scratch
        .iter()
        .enumerate()
        .map(|(i, t)| Buffer::zeros(&format!("scratch{i}"), t))
        .collect();
    for (b, _) in &p.zeroed {
        let buf = match *b {
            Buf::Output(i) => outputs.get_mut(i),
            Buf::Scratch(s) => scratch.get_mut(s),
            Buf::Input(_) => None,
        }
        .ok_or_else(|| EmuError(format!("zeroes {b}, not an output or scratch buffer")))?;
        buf.data.fill(V::F(-0.0));
    }
    for k in &p.launches {
        // The launch's outputs are moved out of where they live while it runs (a buffer both
        // read and written by one launch reads as empty: out of bounds).
        let mut outs: Vec<Buffer> = Vec::with_capacity(k.outputs.len());
        for (b, _) in &k.outputs {
            outs.push(match *b {
                Buf::Output(i) => std::mem::replace(&mut outputs[i], empty()),
                Buf::Scratch(s) => std::mem::replace(&mut scratch[s], empty()),
                Buf::Input(_) => return Err(EmuError(format!("{}: writes an input", k.name))),
            });
        }
        let ins: Vec<&Buffer> = k
            .inputs
            .iter()
            .map(|(b, _)| match *b {
                Buf::Input(i) => inputs[i],
                Buf::Output(i) => &outputs[i],
                Buf::Scratch(s) => &scratch[s],
            })
            .collect();
        let run = run_kernel(k, &ins, &mut outs);
        for ((b, _), buf) in k.outputs.iter().zip(outs) {
            match *b {
                Buf::Output(i) => outputs[i] = buf,
                Buf::Scratch(s) => scratch[s] = buf,
                Buf::Input(_) => {}
            }
        }
        run?;
    }
    Ok(())
}

fn empty() -> Buffer {
    Buffer {
        name: "(in use)".into(),
        dtype: DType::F32,
        data: Vec::new(),
    }
}

/// Runs one launch over its grid. Blocks run side by side (rayon) when the launch only
/// writes its outputs: each block's stores are logged and applied in block order afterwards,
/// so the result (and the first error, by block) is the same as block after block, which is
/// how a launch that also reads its outputs (a scatter) runs.
pub fn run_kernel(
    k: &GpuKernel,
    inputs: &[&Buffer],
    outputs: &mut [Buffer],
) -> Result<(), EmuError> {
    use rayon::prelude::*;
    if k.grid <= 1 || reads_outputs(&k.body) {
        for b in 0..k.grid {
            block::Block::new(k, b, inputs, block::Outputs::Direct(outputs)).run()?;
        }
        return Ok(());
    }
    let sizes: Vec<(String, usize)> = outputs
        .iter()
        .map(|b| (b.name.clone(), b.data.len()))
        .collect();
    let logs: Vec<Result<block::StoreLog, EmuError>> = (0..k.grid)
        .into_par_iter()
        .map(|b| {
            let mut log = Vec::new();
            block::Block::new(k, b, inputs, block::Outputs::Log(&sizes, &mut log)).run()?;
            Ok(log)
        })
        .collect();
    for log in logs {
        for (o, i, v, how) in log? {
            outputs[o].write(i, v, how);
        }
    }
    Ok(())
}

/// Whether a statement of `body` loads from one of the launch's outputs.
fn reads_outputs(body: &[Stmt]) -> bool {
    body.iter().any(|s| match s {
        Stmt::Load {
            buf: Buf::Output(_),
            ..
        } => true,
        Stmt::For { body, .. } | Stmt::If { body, .. } => reads_outputs(body),
        _ => false,
    })
}
