//! One block of a launch run in lockstep: every statement is executed by all of the block's
//! active threads before the next, so barriers and shuffles see every thread at the same
//! point. An `if` masks the threads where it fails; a loop runs while any active thread
//! continues. Shared memory is checked for races between barriers: a write by one thread and
//! any access by another in the same phase is an error, as is a barrier reached by part of the
//! block, a shuffle by part of a warp, and any access out of bounds.

use super::value::{Env, Thread, V, combine, eval, identity};
use super::{Buffer, EmuError};
use kiln_ir::literal::round_to;
use kiln_kernel::gpu::ir::*;
use kiln_kernel::gpu::tf32;
use std::collections::{HashMap, VecDeque};

mod mbarrier;
mod wgmma;

/// Who touched one shared element in the current phase.
#[derive(Clone, Copy, Default)]
struct Access {
    writer: Option<usize>,
    reader: Option<usize>,
    /// More than one thread read it.
    readers: bool,
}

/// How a logged write meets its element.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Write {
    /// The value stored ([`Stmt::Store`]).
    Store,
    /// The value added, atomically ([`Stmt::AtomicAdd`]).
    Add,
}

/// A block's stores and atomic additions: `(output, element, value, how)`, in order.
pub(crate) type StoreLog = Vec<(usize, usize, V, Write)>;

/// Where a block's stores go.
pub(crate) enum Outputs<'a> {
    /// Into the launch's output buffers (blocks run one after the other).
    Direct(&'a mut [Buffer]),
    /// Into a log of `(output, element, value, how)`, applied in block order once every block
    /// has run (blocks run side by side; the outputs, by name and size, are then write-only:
    /// an atomic addition reads its element only when the log is applied).
    Log(&'a [(String, usize)], &'a mut StoreLog),
}

pub(crate) struct Block<'a> {
    pub k: &'a GpuKernel,
    pub id: usize,
    /// The launch's inputs.
    pub inputs: &'a [&'a Buffer],
    /// The launch's outputs.
    pub outputs: Outputs<'a>,
    regs: Vec<V>,
    vars: Vec<i64>,
    shared: Vec<Vec<V>>,
    log: HashMap<(usize, usize), Access>,
    /// Per thread: its `cp.async` copies not committed yet, and its committed groups in
    /// flight, oldest first.
    copies: Vec<(Vec<Copy>, VecDeque<Vec<Copy>>)>,
    /// Per shared array and element: the `cp.async` copies into it still in flight. Any other
    /// access to such an element is an error (what it would see is undefined on a GPU).
    inflight: Vec<Vec<u32>>,
    /// Warpgroup products in flight and the rules around them (`block/wgmma.rs`).
    wg: wgmma::Wg,
    /// mbarriers and TMA loads in flight (`block/mbarrier.rs`).
    mb: mbarrier::Mb,
}

/// One `cp.async` in flight: the values read, and where they land.
struct Copy {
    array: usize,
    index: usize,
    values: Vec<V>,
}

impl<'a> Block<'a> {
    pub(crate) fn new(
        k: &'a GpuKernel,
        id: usize,
        inputs: &'a [&'a Buffer],
        outputs: Outputs<'a>,
    ) -> Block<'a> {
        Block {
            k,
            id,
            inputs,
            outputs,
            regs: vec![V::I(0); k.block * k.regs],
            vars: vec![0; k.block * k.vars],
            shared: k.shared.iter().map(|a| vec![V::I(0); a.len]).collect(),
            log: HashMap::new(),
            copies: (0..k.block).map(|_| Default::default()).collect(),
            inflight: k.shared.iter().map(|a| vec![0; a.len]).collect(),
            wg: wgmma::Wg::new(k),
            mb: mbarrier::Mb::new(k),
        }
    }

    /// Runs the launch's body on every thread of the block.
    pub(crate) fn run(&mut self) -> Result<(), EmuError> {
        let all = vec![true; self.k.block];
        self.stmts(&self.k.body, &all)?;
        for (t, (open, groups)) in self.copies.iter().enumerate() {
            let left = open.len() + groups.iter().map(Vec::len).sum::<usize>();
            if left > 0 {
                return self.err(format!(
                    "thread {t} ends with {left} cp.async copies never waited for"
                ));
            }
        }
        let left = self.mb.left();
        if left > 0 {
            return self.err(format!(
                "the block ends with {left} TMA loads never waited for on their mbarriers"
            ));
        }
        let left = self.wg.left();
        if left > 0 {
            return self.err(format!(
                "the block ends with {left} wgmmas never retired by a wgmma.wait_group"
            ));
        }
        Ok(())
    }

    fn err<T>(&self, m: String) -> Result<T, EmuError> {
        Err(EmuError(format!(
            "kernel {} (block {}): {m}",
            self.k.name, self.id
        )))
    }

    fn sc(&self, t: usize, s: &Sc) -> i64 {
        let (nr, nv) = (self.k.regs, self.k.vars);
        Thread {
            t,
            block: self.id,
            k: self.k,
            regs: &self.regs[t * nr..(t + 1) * nr],
            vars: &self.vars[t * nv..(t + 1) * nv],
        }
        .sc(s)
    }

    fn reg(&self, t: usize, r: usize) -> V {
        let at = t * self.k.regs + r;
        self.wg.touched(t, r, at, "reads");
        self.regs[at]
    }

    fn set(&mut self, t: usize, r: usize, v: V) {
        let at = t * self.k.regs + r;
        self.wg.wrote(t, r, at);
        self.regs[at] = v;
    }

    fn touch(
        &mut self,
        t: usize,
        array: usize,
        index: i64,
        write: bool,
    ) -> Result<usize, EmuError> {
        let len = self.shared[array].len();
        if index < 0 || index as usize >= len {
            let what = if write { "write" } else { "read" };
            return self.err(format!(
                "out-of-bounds shared {what}: shared{array} index {index} of {len} elements (thread {t})"
            ));
        }
        let i = index as usize;
        if write {
            self.wg.shared_write(t, array, i).or_else(|m| self.err(m))?;
        }
        if let Err(m) = self.mb.access(t, array, i, write) {
            return self.err(m);
        }
        if self.inflight[array][i] > 0 {
            let what = if write { "writes" } else { "reads" };
            return self.err(format!(
                "thread {t} {what} shared{array}[{i}] while a cp.async into it is in flight \
                 (no cp.async.wait_group for it yet)"
            ));
        }
        let a = self.log.entry((array, i)).or_default();
        let other = match (write, a.writer) {
            (_, Some(w)) if w != t => Some(("written", w)),
            (true, _) => match a.reader {
                Some(r) if r != t || a.readers => Some(("read", r)),
                _ => None,
            },
            _ => None,
        };
        if write {
            a.writer = Some(t);
        } else if a.reader.is_some_and(|r| r != t) {
            a.readers = true;
        } else {
            a.reader = Some(t);
        }
        if let Some((how, o)) = other {
            let verb = if write { "writes" } else { "reads" };
            return self.err(format!(
                "shared-memory race: thread {t} {verb} shared{array}[{i}], {how} by thread {o} \
                 since the last barrier"
            ));
        }
        Ok(i)
    }

    fn global(&self, buf: Buf) -> Result<&Buffer, EmuError> {
        match buf {
            Buf::Input(i) => self.inputs.get(i).copied(),
            Buf::Output(k) => match &self.outputs {
                Outputs::Direct(o) => o.get(k),
                Outputs::Log(..) => None,
            },
            Buf::Scratch(_) => None,
        }
        .map_or_else(|| self.err(format!("no buffer {buf}")), Ok)
    }

    /// The first threads of the warps of 32 with an active thread, each of which must be
    /// active as a whole (`what` names the warp-wide statement in the error).
    fn warps(&self, mask: &[bool], what: &str) -> Result<Vec<usize>, EmuError> {
        let n = self.k.block;
        if self.k.warp != 32 {
            return self.err(format!("{what} in warps of {} threads", self.k.warp));
        }
        let mut out = Vec::new();
        for first in (0..n).step_by(32) {
            let lanes = first..(first + 32).min(n);
            let on = lanes.clone().filter(|&t| mask[t]).count();
            if on == 0 {
                continue;
            }
            if on != 32 {
                return self.err(format!(
                    "{what} by {on} of the 32 lanes of warp {}",
                    first / 32
                ));
            }
            out.push(first);
        }
        Ok(out)
    }

    /// Each active thread's `value` stored into, or added atomically to, element `index` of
    /// output `buf`: in thread order, so the atomic additions of a block meet an element in
    /// the order of its threads (and the blocks' in block order, as they run or as their logs
    /// are applied).
    fn write(
        &mut self,
        buf: Buf,
        index: &Sc,
        value: usize,
        mask: &[bool],
        how: Write,
    ) -> Result<(), EmuError> {
        let Buf::Output(k) = buf else {
            return self.err(format!("a store to {buf}"));
        };
        let (name, len, dtype) = match &self.outputs {
            Outputs::Direct(o) => o.get(k).map(|b| (b.name.clone(), b.data.len(), b.dtype)),
            Outputs::Log(sizes, _) => (sizes.get(k).zip(self.k.outputs.get(k)))
                .map(|(s, o)| (s.0.clone(), s.1, o.1.dtype)),
        }
        .map_or_else(|| self.err(format!("no output {k}")), Ok)?;
        if how == Write::Add && !matches!(dtype, kiln_ir::DType::F32 | kiln_ir::DType::F16) {
            return self.err(format!("an atomic addition into {name}, of {dtype}"));
        }
        for t in (0..self.k.block).filter(|&t| mask[t]) {
            let i = self.sc(t, index);
            let v = self.reg(t, value);
            if i < 0 || i as usize >= len {
                return self.err(format!(
                    "out-of-bounds write: {name} index {i} of {len} elements (thread {t})"
                ));
            }
            match &mut self.outputs {
                Outputs::Direct(o) => o[k].write(i as usize, v, how),
                Outputs::Log(_, log) => log.push((k, i as usize, v, how)),
            }
        }
        Ok(())
    }

    fn stmts(&mut self, body: &[Stmt], mask: &[bool]) -> Result<(), EmuError> {
        for s in body {
            self.stmt(s, mask)?;
            if let Some(m) = self.wg.violation.take() {
                return self.err(m);
            }
        }
        Ok(())
    }

    fn stmt(&mut self, s: &Stmt, mask: &[bool]) -> Result<(), EmuError> {
        let n = self.k.block;
        let active = || (0..n).filter(|&t| mask[t]);
        match s {
            Stmt::Let { reg, value } => {
                for t in active() {
                    let v = self.sc(t, value);
                    self.set(t, *reg, V::I(v));
                }
            }
            Stmt::SetVar { var, value } => {
                for t in active() {
                    let v = self.sc(t, value);
                    self.vars[t * self.k.vars + var] = v;
                }
            }
            Stmt::Eval { reg, expr, scalars } => {
                let nv = self.k.vars;
                for t in active() {
                    let sc: Vec<V> = scalars.iter().map(|&r| self.reg(t, r)).collect();
                    let env = Env {
                        kernel: &self.k.name,
                        inputs: self.inputs,
                        scalars: &sc,
                        sums: self.k.sums,
                        args: &[],
                    };
                    let v = eval(expr, &env, &mut self.vars[t * nv..(t + 1) * nv])?;
                    self.set(t, *reg, v);
                }
            }
            Stmt::Identity { reg, kind, dtype } => {
                for t in active() {
                    self.set(t, *reg, identity(*kind, *dtype));
                }
            }
            Stmt::Combine {
                acc,
                value,
                kind,
                dtype,
            } => {
                for t in active() {
                    let v = combine(*kind, *dtype, self.reg(t, *acc), self.reg(t, *value));
                    self.set(t, *acc, v);
                }
            }
            Stmt::MulAdd { acc, a, b, dtype } => {
                for t in active() {
                    let (x, y, z) = (
                        self.reg(t, *a).f(),
                        self.reg(t, *b).f(),
                        self.reg(t, *acc).f(),
                    );
                    // Rounded once, in the dtype (registers hold values of their dtype, so
                    // the conversions to f32 are exact).
                    let v = if *dtype == kiln_ir::DType::F32 {
                        f64::from((x as f32).mul_add(y as f32, z as f32))
                    } else {
                        x.mul_add(y, z)
                    };
                    self.set(t, *acc, V::F(v));
                }
            }
            Stmt::For {
                reg,
                start,
                end,
                step,
                body,
            } => {
                for t in active() {
                    let v = self.sc(t, start);
                    self.set(t, *reg, V::I(v));
                }
                loop {
                    let m: Vec<bool> = (0..n)
                        .map(|t| mask[t] && self.reg(t, *reg).i() < self.sc(t, end))
                        .collect();
                    if !m.contains(&true) {
                        break;
                    }
                    self.stmts(body, &m)?;
                    for t in (0..n).filter(|&t| m[t]) {
                        let v = self.reg(t, *reg).i() + self.sc(t, step).max(1);
                        self.set(t, *reg, V::I(v));
                    }
                }
            }
            Stmt::If { cond, body } => {
                let m: Vec<bool> = (0..n).map(|t| mask[t] && self.sc(t, cond) != 0).collect();
                if m.contains(&true) {
                    self.stmts(body, &m)?;
                }
            }
            Stmt::Load { reg, buf, index } => {
                for t in active() {
                    let i = self.sc(t, index);
                    let b = self.global(*buf)?;
                    if i < 0 || i as usize >= b.data.len() {
                        return self.err(format!(
                            "out-of-bounds read: {} index {i} of {} elements (thread {t})",
                            b.name,
                            b.data.len()
                        ));
                    }
                    let v = b.data[i as usize];
                    self.set(t, *reg, v);
                }
            }
            Stmt::Store { buf, index, value } => {
                self.write(*buf, index, *value, mask, Write::Store)?
            }
            Stmt::AtomicAdd { buf, index, value } => {
                self.write(*buf, index, *value, mask, Write::Add)?
            }
            Stmt::SharedLoad { reg, array, index } => {
                for t in active() {
                    let i = self.sc(t, index);
                    let i = self.touch(t, *array, i, false)?;
                    let v = self.shared[*array][i];
                    self.set(t, *reg, v);
                }
            }
            Stmt::SharedStore {
                array,
                index,
                value,
            } => {
                let packed = self.k.shared[*array].packed;
                let dtype = self.k.shared[*array].dtype;
                for t in active() {
                    let i = self.sc(t, index);
                    let i = self.touch(t, *array, i, true)?;
                    let v = self.reg(t, *value);
                    self.shared[*array][i] = if packed && dtype.is_float() {
                        V::F(round_to(dtype, v.f()))
                    } else {
                        v
                    };
                }
            }
            Stmt::Note(_) => {}
            Stmt::Barrier => {
                let reached = active().count();
                if reached != n {
                    return self.err(format!(
                        "a barrier reached by {reached} of the block's {n} threads"
                    ));
                }
                self.log.clear();
            }
            Stmt::CopyAsync {
                array,
                index,
                buf,
                src,
                elems,
            } => {
                let len = self.shared[*array].len() as i64;
                for t in active() {
                    let (at, from) = (self.sc(t, index), self.sc(t, src));
                    let e = *elems as i64;
                    if at % e != 0 || from % e != 0 {
                        return self.err(format!(
                            "a misaligned cp.async of {e} elements: shared{array}[{at}] <- \
                             {buf}[{from}] (thread {t})"
                        ));
                    }
                    let b = self.global(*buf)?;
                    if at < 0 || at + e > len || from < 0 || (from + e) as usize > b.data.len() {
                        return self.err(format!(
                            "an out-of-bounds cp.async: shared{array}[{at}..{}] of {len} <- {}[{from}..{}] of {} (thread {t})",
                            at + e,
                            b.name,
                            from + e,
                            b.data.len()
                        ));
                    }
                    if let Some(x) = (at..at + e).find(|&x| self.wg.is_read(*array, x as usize)) {
                        return self.err(format!(
                            "a cp.async into shared{array}[{x}], which a wgmma still in flight \
                             reads (thread {t})"
                        ));
                    }
                    let values = b.data[from as usize..(from + e) as usize].to_vec();
                    for x in at..at + e {
                        self.inflight[*array][x as usize] += 1;
                    }
                    self.copies[t].0.push(Copy {
                        array: *array,
                        index: at as usize,
                        values,
                    });
                }
            }
            Stmt::CopyCommit => {
                for t in active() {
                    let group = std::mem::take(&mut self.copies[t].0);
                    self.copies[t].1.push_back(group);
                }
            }
            Stmt::CopyWait { pending } => {
                for t in active() {
                    while self.copies[t].1.len() > *pending {
                        let group = self.copies[t].1.pop_front().unwrap_or_default();
                        for c in group {
                            for (e, v) in c.values.into_iter().enumerate() {
                                self.inflight[c.array][c.index + e] -= 1;
                                let i = self.touch(t, c.array, (c.index + e) as i64, true)?;
                                self.shared[c.array][i] = v;
                            }
                        }
                    }
                }
            }
            Stmt::LdMatrix {
                regs,
                array,
                row,
                trans,
            } => {
                // A row is 16 bytes: 8 packed 16-bit elements (two a 32-bit word, two
                // registers), or 4 of 32 bits (one register each).
                let a = &self.k.shared[*array];
                let per_word = match (a.packed, a.dtype.bits()) {
                    (true, 16) => 2,
                    (false, 32) => 1,
                    _ => 0,
                };
                if per_word == 0 || regs.len() != 4 * per_word || (*trans && per_word != 2) {
                    return self.err(format!(
                        "an ldmatrix{} of {} registers from shared{array} ({}[{}]{})",
                        if *trans { ".trans" } else { "" },
                        regs.len(),
                        a.dtype,
                        a.len,
                        if a.packed { " packed" } else { "" }
                    ));
                }
                let row_len = 4 * per_word;
                for first in self.warps(mask, "an ldmatrix")? {
                    let mut rows = [0usize; 32];
                    for (l, r) in rows.iter_mut().enumerate() {
                        let t = first + l;
                        let at = self.sc(t, row);
                        for e in 0..row_len as i64 {
                            self.touch(t, *array, at + e, false)?;
                        }
                        *r = at as usize;
                    }
                    for l in 0..32 {
                        for (i, &reg) in regs.iter().enumerate() {
                            // Matrix `j = i / per_word`: word `l % 4` of row `l / 4`, its
                            // element `i % per_word`; or transposed (16-bit), row
                            // `2 (l % 4) + i % 2`, element `l / 4`.
                            let (j, h) = (i / per_word, i % per_word);
                            let at = if *trans {
                                rows[j * 8 + 2 * (l % 4) + h] + l / 4
                            } else {
                                rows[j * 8 + l / 4] + per_word * (l % 4) + h
                            };
                            let v = self.shared[*array][at];
                            self.set(first + l, reg, v);
                        }
                    }
                }
            }
            Stmt::RoundTf32 { reg } => {
                for t in active() {
                    let x = self.reg(t, *reg).f() as f32;
                    self.set(t, *reg, V::F(f64::from(tf32::round(x))));
                }
            }
            Stmt::Mma {
                d,
                a,
                b,
                c,
                shape,
                operand,
            } => {
                let kk = operand.k();
                if *shape != operand.shape()
                    || a.len() != operand.a_regs()
                    || b.len() != operand.b_regs()
                {
                    return self.err(format!(
                        "an mma {shape:?} of {} with {} A and {} B registers",
                        operand.name(),
                        a.len(),
                        b.len()
                    ));
                }
                for first in self.warps(mask, "an mma")? {
                    let mut am = [[0.0f64; 16]; 16];
                    let mut bm = [[0.0f64; 8]; 16];
                    let mut cm = [[0.0f64; 8]; 16];
                    // 16-bit operands are rounded to their dtype as they are packed; the tensor
                    // cores read a TF32 operand's upper 19 bits (one that was not rounded
                    // loses the rest).
                    let op = |v: V| match operand {
                        MmaOperand::Bf16 | MmaOperand::F16 => round_to(operand.dtype(), v.f()),
                        MmaOperand::Tf32 => f64::from(tf32::truncate(v.f() as f32)),
                    };
                    for l in 0..32 {
                        let (g, q) = (l / 4, l % 4);
                        let t = first + l;
                        for (i, &r) in a.iter().enumerate() {
                            let (row, col) = if *operand == MmaOperand::Tf32 {
                                (g + 8 * (i % 2), q + 4 * (i / 2))
                            } else {
                                (g + 8 * ((i / 2) % 2), 2 * q + i % 2 + 8 * (i / 4))
                            };
                            am[row][col] = op(self.reg(t, r));
                        }
                        for (i, &r) in b.iter().enumerate() {
                            let row = if *operand == MmaOperand::Tf32 {
                                q + 4 * i
                            } else {
                                2 * q + i % 2 + 8 * (i / 2)
                            };
                            bm[row][g] = op(self.reg(t, r));
                        }
                        for (i, &r) in c.iter().enumerate() {
                            cm[g + 8 * (i / 2)][2 * q + i % 2] = self.reg(t, r).f() as f32 as f64;
                        }
                    }
                    for l in 0..32 {
                        let (g, q) = (l / 4, l % 4);
                        for (i, &r) in d.iter().enumerate() {
                            let (row, col) = (g + 8 * (i / 2), 2 * q + i % 2);
                            // The products of 16-bit and TF32 values are exact in f64 and
                            // their sum nearly so; rounded once to f32 (the hardware's order
                            // and rounding inside one mma are not specified).
                            let sum: f64 = (0..kk).map(|k| am[row][k] * bm[k][col]).sum();
                            self.set(first + l, r, V::F((sum + cm[row][col]) as f32 as f64));
                        }
                    }
                }
            }
            Stmt::MbarInit { bar, count } => self.mbar_init(mask, bar, *count)?,
            Stmt::MbarArrive { bar, tx } => self.mbar_arrive(mask, bar, *tx)?,
            Stmt::MbarWait { bar, parity } => self.mbar_wait(mask, bar, parity)?,
            Stmt::MbarInval { bar } => self.mbar_inval(mask, bar)?,
            Stmt::TmaLoad {
                map,
                array,
                index,
                coords,
                bar,
            } => self.tma_load(mask, (*map, *array, index), coords, bar)?,
            Stmt::WgmmaFence => self.wgmma_fence(mask)?,
            Stmt::ProxyFence => self.proxy_fence(mask),
            Stmt::WgmmaCommit => self.wgmma_commit(mask)?,
            Stmt::WgmmaWait { pending } => self.wgmma_wait(mask, *pending)?,
            Stmt::Wgmma {
                acc,
                a,
                b,
                n,
                operand,
            } => self.wgmma(mask, acc, (a, b), *n, *operand)?,
            Stmt::Shuffle { reg, src, mode } => {
                let w = self.k.warp;
                for first in (0..n).step_by(w) {
                    let lanes = first..(first + w).min(n);
                    let on = lanes.clone().filter(|&t| mask[t]).count();
                    if on == 0 {
                        continue;
                    }
                    if on != lanes.len() {
                        return self.err(format!(
                            "a shuffle by {on} of the {} lanes of warp {}",
                            lanes.len(),
                            first / w
                        ));
                    }
                    let got: Vec<V> = lanes
                        .clone()
                        .map(|t| {
                            let lane = t - first;
                            let from = match mode {
                                Shuffle::Xor(m) => lane ^ m,
                                Shuffle::Down(d) => lane + d,
                            };
                            let from = if from < lanes.len() { from } else { lane };
                            self.reg(first + from, *src)
                        })
                        .collect();
                    for (t, v) in lanes.zip(got) {
                        self.set(t, *reg, v);
                    }
                }
            }
        }
        Ok(())
    }
}
