//! Warpgroup products (sm_90a) in the emulator: [`Stmt::Wgmma`] and its fence, commit and
//! wait, and the async-proxy fence, with the PTX ISA's semantics and its rules checked.
//!
//! - A `wgmma` is executed by whole warpgroups (128 threads from a multiple of 128; a
//!   block's last, partial one, a TMA producer's warp, may not take part), each
//!   with the same descriptors. Each descriptor is encoded as the PTX emitter encodes it (the
//!   array's shared address, aligned as the kernel lays its arrays out, plus `start`
//!   elements) and decoded here from its bits: the start address (bits 0-13, in 16 bytes),
//!   LBO (16-29), SBO (32-45), the base offset (49-51, which must be 0) and the swizzle mode
//!   (62-63). Element `(row, k)` of a K-major operand (`row = 8i + r`, `k = 8j + e`) lies at
//!   `start + i·SBO + j·LBO + 16r + 2e` without swizzle, and with a swizzle of `W` bytes at
//!   `x = start + i·SBO + W·r + 16j + 2e` with `log2(W / 16)` bits of `x` from bit 4 XORed
//!   with as many from bit 7. Of an MN-major one (`imm-trans` 1, the rows contiguous) at
//!   `start + i·SBO + j·LBO + 16e + 2r` without swizzle, and at `x = start + (row / P)·LBO +
//!   j·SBO + W·e + 2 (row % P)` (`P = W / 2`) with one, swizzled as above. An address outside the descriptor's array is an error, as is a
//!   swizzled start past the first row of an atom (where the base offset would matter).
//! - The product runs at once: each element read as its operand type, products exact and
//!   their sum with the accumulator rounded once to f32 (as [`Stmt::Mma`] is emulated), the
//!   accumulator fragments as [`Stmt::Wgmma`] documents them.
//! - Until a `wgmma.wait_group` retires its group, its accumulators are locked (any access
//!   but another `wgmma`'s is an error) and the shared elements it read may not be written
//!   (a store, a landing `cp.async`, or one started into them). Groups still in flight when
//!   the block ends are an error.
//! - A `wgmma` whose accumulator registers a thread wrote (by anything but a `wgmma`) since
//!   its last `wgmma.fence` is an error; so is one reading an element written since the last
//!   barrier, or written by a thread that has not run `fence.proxy.async` since.
//!
//! Accumulators read as integers inside thread-level arithmetic (`Sc::Reg`) are not checked.

use super::{Block, EmuError};
use kiln_ir::literal::round_to;
use kiln_kernel::gpu::desc::descriptor;
use kiln_kernel::gpu::ir::*;
use std::cell::Cell;
use std::collections::{HashMap, VecDeque};

/// Threads of a warpgroup.
const WARPGROUP: usize = 128;

/// Shared elements a `wgmma` reads: `(array, element)`.
type Reads = Vec<(usize, usize)>;

/// One `wgmma` in flight: its accumulator registers and the shared elements it read.
#[derive(Clone, Default)]
struct Op {
    acc: Vec<usize>,
    reads: Reads,
}

/// The warpgroup state of a block.
#[derive(Default)]
pub(super) struct Wg {
    /// Whether the kernel has warpgroup statements (else nothing is tracked).
    on: bool,
    /// Per thread and register: written by a non-`wgmma` statement since the thread's last
    /// `wgmma.fence`.
    dirty: Vec<bool>,
    /// Per thread and register: `wgmma`s in flight that accumulate into it.
    locked: Vec<u32>,
    /// Per shared array and element: `wgmma`s in flight that read it.
    reading: Vec<Vec<u32>>,
    /// Shared elements written through the generic proxy, by the writing thread, not yet
    /// fenced by it.
    unfenced: HashMap<(usize, usize), usize>,
    /// Per warpgroup: its `wgmma`s not committed yet, and its committed groups in flight.
    groups: Vec<(Vec<Op>, VecDeque<Vec<Op>>)>,
    /// The first misuse of a locked register, reported after the statement.
    pub(super) violation: Cell<Option<String>>,
}

impl Wg {
    pub(super) fn new(k: &GpuKernel) -> Wg {
        let on = k.uses_wgmma();
        let per = |n: usize| if on { n } else { 0 };
        Wg {
            on,
            dirty: vec![false; per(k.block * k.regs)],
            locked: vec![0; per(k.block * k.regs)],
            reading: k.shared.iter().map(|a| vec![0; per(a.len)]).collect(),
            unfenced: HashMap::new(),
            groups: vec![Default::default(); k.block.div_ceil(WARPGROUP)],
            violation: Cell::new(None),
        }
    }

    /// Records that a statement other than a `wgmma` wrote register `at` (thread-major) of
    /// thread `t`.
    pub(super) fn wrote(&mut self, t: usize, r: usize, at: usize) {
        if !self.on {
            return;
        }
        self.dirty[at] = true;
        self.touched(t, r, at, "writes");
    }

    /// Records an access (`how`: reads, writes) of register `r` (at `at`, thread-major) of
    /// thread `t`.
    pub(super) fn touched(&self, t: usize, r: usize, at: usize, how: &str) {
        if self.on && self.locked[at] > 0 {
            let first = self.violation.take().unwrap_or_else(|| {
                format!(
                    "thread {t} {how} r{r}, an accumulator of a wgmma still in flight (no \
                     wgmma.wait_group retired it)"
                )
            });
            self.violation.set(Some(first));
        }
    }

    /// Records a generic-proxy write of a shared element by thread `t`; an element a `wgmma`
    /// in flight reads is an error.
    pub(super) fn shared_write(&mut self, t: usize, array: usize, i: usize) -> Result<(), String> {
        if !self.on {
            return Ok(());
        }
        if self.reading[array][i] > 0 {
            return Err(format!(
                "thread {t} writes shared{array}[{i}], which a wgmma still in flight reads"
            ));
        }
        self.unfenced.insert((array, i), t);
        Ok(())
    }

    /// Whether a `wgmma` in flight reads shared element `i` of `array`.
    pub(super) fn is_read(&self, array: usize, i: usize) -> bool {
        self.on && self.reading[array][i] > 0
    }

    /// `wgmma`s in flight when the block ends.
    pub(super) fn left(&self) -> usize {
        self.groups
            .iter()
            .map(|(open, done)| open.len() + done.iter().map(Vec::len).sum::<usize>())
            .sum()
    }
}

/// The decoded fields of a matrix descriptor.
struct Fields {
    start: usize,
    lbo: usize,
    sbo: usize,
    base: u64,
    /// Chunk bits the swizzle XORs (0 without one).
    bits: u32,
}

fn decode(d: u64) -> Fields {
    let field = |at: u32| (((d >> at) & 0x3fff) << 4) as usize;
    Fields {
        start: field(0),
        lbo: field(16),
        sbo: field(32),
        base: (d >> 49) & 7,
        bits: match d >> 62 {
            1 => 3,
            2 => 2,
            3 => 1,
            _ => 0,
        },
    }
}

impl Block<'_> {
    /// The first threads of the warpgroups with an active thread, each of which must be
    /// active as a whole (a block may end with a part of one, a producer warp, which then
    /// must not take part).
    fn warpgroups(&self, mask: &[bool], what: &str) -> Result<Vec<usize>, EmuError> {
        let n = self.k.block;
        if self.k.warp != 32 || n < WARPGROUP {
            return self.err(format!(
                "{what} in a block of {n} threads (warps of {}): not whole warpgroups of 128",
                self.k.warp
            ));
        }
        let mut out = Vec::new();
        for first in (0..n).step_by(WARPGROUP) {
            let on = (first..(first + WARPGROUP).min(n))
                .filter(|&t| mask[t])
                .count();
            if on == 0 {
                continue;
            }
            if on != WARPGROUP {
                return self.err(format!(
                    "{what} by {on} of the 128 threads of warpgroup {}",
                    first / WARPGROUP
                ));
            }
            out.push(first);
        }
        Ok(out)
    }

    /// `wgmma.fence`: the active warpgroups' register writes so far are ordered before their
    /// next `wgmma`s.
    pub(super) fn wgmma_fence(&mut self, mask: &[bool]) -> Result<(), EmuError> {
        let nr = self.k.regs;
        for first in self.warpgroups(mask, "a wgmma.fence")? {
            self.wg.dirty[first * nr..(first + WARPGROUP) * nr].fill(false);
        }
        Ok(())
    }

    /// `fence.proxy.async`: each active thread's shared writes become visible to `wgmma`s.
    pub(super) fn proxy_fence(&mut self, mask: &[bool]) {
        self.wg.unfenced.retain(|_, w| !mask[*w]);
    }

    /// `wgmma.commit_group`.
    pub(super) fn wgmma_commit(&mut self, mask: &[bool]) -> Result<(), EmuError> {
        for first in self.warpgroups(mask, "a wgmma.commit_group")? {
            let g = &mut self.wg.groups[first / WARPGROUP];
            let ops = std::mem::take(&mut g.0);
            g.1.push_back(ops);
        }
        Ok(())
    }

    /// `wgmma.wait_group pending`: the oldest groups retire until `pending` are in flight.
    pub(super) fn wgmma_wait(&mut self, mask: &[bool], pending: usize) -> Result<(), EmuError> {
        let nr = self.k.regs;
        for first in self.warpgroups(mask, "a wgmma.wait_group")? {
            while self.wg.groups[first / WARPGROUP].1.len() > pending {
                let ops = self.wg.groups[first / WARPGROUP]
                    .1
                    .pop_front()
                    .unwrap_or_default();
                for op in ops {
                    for t in first..first + WARPGROUP {
                        for &r in &op.acc {
                            self.wg.locked[t * nr + r] -= 1;
                        }
                    }
                    for (a, i) in op.reads {
                        self.wg.reading[a][i] -= 1;
                    }
                }
            }
        }
        Ok(())
    }

    /// Reads the `rows x 16` K-major operand `d` describes for the warpgroup from `first`:
    /// its elements by row, and where each lies.
    fn operand(
        &self,
        first: usize,
        d: &MatrixDesc,
        rows: usize,
        operand: MmaOperand,
    ) -> Result<(Vec<[f64; 16]>, Reads), EmuError> {
        let start = self.sc(first, &d.start);
        if let Some(t) = (first..first + WARPGROUP).find(|&t| self.sc(t, &d.start) != start) {
            return self.err(format!(
                "a wgmma descriptor of shared{} starts at {start} in thread {first} but at {} in \
                 thread {t}",
                d.array,
                self.sc(t, &d.start)
            ));
        }
        let Some(array) = self.k.shared.get(d.array) else {
            return self.err(format!("a wgmma descriptor of shared array {}", d.array));
        };
        let base = self.k.shared_offsets().0[d.array];
        let addr = base as i64 + 2 * start;
        if addr < 0 {
            return self.err(format!(
                "a wgmma descriptor before shared{} (element {start})",
                d.array
            ));
        }
        let f = decode(descriptor(addr as u64, d.lbo, d.sbo, d.swizzle));
        if f.base != 0 {
            return self.err(format!("a wgmma descriptor with base offset {}", f.base));
        }
        let mask = (1usize << f.bits) - 1;
        if f.bits > 0 && (f.start >> 7) & mask != 0 {
            return self.err(format!(
                "a swizzled wgmma descriptor of shared{} starts at byte {} of its swizzle \
                 pattern, past the first row of an atom",
                d.array,
                f.start % (1 << (7 + f.bits))
            ));
        }
        let w = 16 << f.bits;
        let mut values = vec![[0.0; 16]; rows];
        let mut at = Vec::with_capacity(rows * 16);
        for (row, out) in values.iter_mut().enumerate() {
            let (i, r) = (row / 8, row % 8);
            for (k, x) in out.iter_mut().enumerate() {
                let (j, e) = (k / 8, k % 8);
                let addr = match (d.mn_major, f.bits) {
                    (false, 0) => f.start + i * f.sbo + j * f.lbo + 16 * r + 2 * e,
                    (false, _) => f.start + i * f.sbo + w * r + 16 * j + 2 * e,
                    // MN-major: `row` along the contiguous dimension, `k = 8j + e` across it.
                    (true, 0) => f.start + i * f.sbo + j * f.lbo + 16 * e + 2 * r,
                    (true, _) => {
                        let p = w / 2;
                        f.start + (row / p) * f.lbo + j * f.sbo + w * e + 2 * (row % p)
                    }
                };
                let byte = addr ^ (((addr >> 7) & mask) << 4);
                let end = base + array.len * 2;
                if byte < base || byte >= end {
                    return self.err(format!(
                        "a wgmma reads byte {byte} of shared memory for element ({row}, {k}) \
                         of its operand in shared{}, which spans bytes {base}..{end}",
                        d.array
                    ));
                }
                let p = (byte - base) / 2;
                // A swizzled array (by chunks >> 3, as verified) holds logical element `q` at
                // `physical(q)`, which is its own inverse.
                let q = array.physical(p, 8);
                self.check_read(first, d.array, q)?;
                *x = round_to(operand.dtype(), self.shared[d.array][q].f());
                at.push((d.array, q));
            }
        }
        Ok((values, at))
    }

    /// Whether the warpgroup from `first` may read shared element `i` of `array` now.
    fn check_read(&self, first: usize, array: usize, i: usize) -> Result<(), EmuError> {
        if let Err(m) = self.mb.check(first, array, i, false) {
            return self.err(format!("a wgmma (warpgroup {}): {m}", first / WARPGROUP));
        }
        if self.inflight[array][i] > 0 {
            return self.err(format!(
                "a wgmma (warpgroup {}) reads shared{array}[{i}] while a cp.async into it is in \
                 flight",
                first / WARPGROUP
            ));
        }
        if let Some(w) = self.log.get(&(array, i)).and_then(|a| a.writer) {
            return self.err(format!(
                "a wgmma (warpgroup {}) reads shared{array}[{i}], written by thread {w} since \
                 the last barrier",
                first / WARPGROUP
            ));
        }
        if let Some(w) = self.wg.unfenced.get(&(array, i)) {
            return self.err(format!(
                "a wgmma (warpgroup {}) reads shared{array}[{i}], written by thread {w} without \
                 a fence.proxy.async since",
                first / WARPGROUP
            ));
        }
        Ok(())
    }

    /// `acc += A x B` for `m64n{n}k16`.
    pub(super) fn wgmma(
        &mut self,
        mask: &[bool],
        acc: &[usize],
        (a, b): (&MatrixDesc, &MatrixDesc),
        n: usize,
        operand: MmaOperand,
    ) -> Result<(), EmuError> {
        if operand == MmaOperand::Tf32 || acc.len() != n / 2 || !n.is_multiple_of(8) || n > 256 {
            return self.err(format!(
                "a wgmma m64n{n}k16 of {} with {} accumulators",
                operand.name(),
                acc.len()
            ));
        }
        let nr = self.k.regs;
        for first in self.warpgroups(mask, "a wgmma")? {
            for t in first..first + WARPGROUP {
                if let Some(r) = acc.iter().find(|&&r| self.wg.dirty[t * nr + r]) {
                    return self.err(format!(
                        "a wgmma accumulates into r{r}, which thread {t} wrote since its last \
                         wgmma.fence"
                    ));
                }
            }
            let (am, mut reads) = self.operand(first, a, 64, operand)?;
            let (bm, more) = self.operand(first, b, n, operand)?;
            reads.extend(more);
            for &(a, i) in &reads {
                self.mb.read_by(first, a, i);
            }
            for t in first..first + WARPGROUP {
                let local = t - first;
                let (w, lane) = (local / 32, local % 32);
                let (g, q) = (lane / 4, lane % 4);
                for (i, &r) in acc.iter().enumerate() {
                    let row = 16 * w + g + 8 * ((i % 4) / 2);
                    let col = 8 * (i / 4) + 2 * q + i % 2;
                    // Products of 16-bit values are exact in f64 and their sum nearly so;
                    // rounded once to f32.
                    let sum: f64 = (0..16).map(|k| am[row][k] * bm[col][k]).sum();
                    let c = self.regs[t * nr + r].f() as f32 as f64;
                    self.regs[t * nr + r] = super::V::F((sum + c) as f32 as f64);
                    self.wg.locked[t * nr + r] += 1;
                }
            }
            for &(arr, i) in &reads {
                self.wg.reading[arr][i] += 1;
            }
            self.wg.groups[first / WARPGROUP].0.push(Op {
                acc: acc.to_vec(),
                reads,
            });
        }
        Ok(())
    }
}
