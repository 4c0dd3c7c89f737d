//! Memory planning: where each intermediate buffer lives in one arena.
//!
//! A kernel's result that only kernels read, and that is not returned, is an intermediate: it
//! lives in the arena from the step that writes it to the last step that reads it. Steps are
//! scanned in program order; a buffer is placed in the smallest free block that holds it (or
//! at the arena's end, taking in a free block that ends there), and its block is freed after its last reader, so a later step reuses
//! it. A kernel's result never shares memory with its own inputs: kernels are compiled with
//! their output marked `noalias`. Outputs are separate buffers, since they move out to the
//! caller.
//!
//! The exception is donation: a kernel compiled *in place* writes its result into the buffer
//! of a parameter the caller gave up (its last reader, reading it only at the position it
//! writes, through the output pointer). That result takes no new memory at all.
//!
//! A value passed on by a `Step::Forward` (an `optimization_barrier`) is the same buffer under
//! another name: a kernel's result passed on stays in its arena slot, which lives until the last
//! step that reads it under any of its names, and each name has that slot.

use crate::Step;
use kiln_ir::{Func, ValueId};
use std::fmt;

/// Arena offsets are multiples of this (a cache line; kernels' vector loads stay aligned).
pub const ALIGN: usize = 64;

/// Where one intermediate lives.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Slot {
    /// Byte offset in the arena.
    pub offset: usize,
    /// Bytes.
    pub bytes: usize,
    /// The step (instruction index) that writes it.
    pub def: usize,
    /// The last step that reads it.
    pub last: usize,
}

/// The memory plan of a program.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MemoryPlan {
    /// Per value: its slot in the arena, if it lives there.
    pub slots: Vec<Option<Slot>>,
    /// The arena's size in bytes.
    pub arena_bytes: usize,
    /// Bytes of kernel results outside the arena (outputs, and values read by steps that are
    /// not kernels).
    pub other_bytes: usize,
    /// What the intermediates would take with one buffer each (no reuse).
    pub unplanned_bytes: usize,
    /// The largest scratch area a kernel asks of each thread (GEMM packing buffers), kept
    /// per thread between calls; not part of [`MemoryPlan::peak_bytes`].
    pub scratch_per_thread: usize,
    /// Results written in place into a donated parameter's buffer: (result, parameter).
    pub in_place: Vec<(ValueId, ValueId)>,
    /// Bytes of those results (memory the call does not allocate).
    pub in_place_bytes: usize,
}

impl MemoryPlan {
    /// Peak bytes of buffers a call writes: the arena plus the results outside it.
    pub fn peak_bytes(&self) -> usize {
        self.arena_bytes + self.other_bytes
    }
}

/// Per value of `func` run by `steps`, the last step that reads it (a `Step::Kernel`
/// instruction `i` reads `operands[i]`; fused and merged ones read nothing).
pub fn last_reads(func: &Func, steps: &[Step], operands: &[Vec<ValueId>]) -> Vec<Option<usize>> {
    let mut last = vec![None; func.values.len()];
    for (i, inst) in func.insts.iter().enumerate() {
        let reads: &[ValueId] = match steps[i] {
            Step::Fused | Step::Merged => continue,
            Step::Kernel => &operands[i],
            _ => &inst.operands,
        };
        for v in reads {
            last[v.index()] = Some(i);
        }
    }
    last
}

fn aligned(bytes: usize) -> usize {
    bytes.div_ceil(ALIGN) * ALIGN
}

/// Per value of `func` run by `steps`, the value whose buffer it is: itself, or for a result of
/// a `Step::Forward` (which passes its operands on), that of the operand it passes on.
pub fn buffer_roots(func: &Func, steps: &[Step]) -> Vec<ValueId> {
    let mut root: Vec<ValueId> = (0..func.values.len() as u32).map(ValueId).collect();
    for (i, inst) in func.insts.iter().enumerate() {
        if steps[i] == Step::Forward {
            for (r, o) in inst.results.iter().zip(&inst.operands) {
                root[r.index()] = root[o.index()];
            }
        }
    }
    root
}

/// Plans the buffers of `func` run by `steps`, where a `Step::Kernel` instruction `i` reads
/// `operands[i]`, uses `scratch[i]` bytes of per-thread scratch, and writes its result into the
/// buffer of `operands[i][q]` for each `(q, k)` of `in_place[i]` (output `k`: 0 its result,
/// then `extra[i]`, the results it also writes in multi-output fusion).
pub fn plan(
    func: &Func,
    steps: &[Step],
    operands: &[Vec<ValueId>],
    scratch: &[usize],
    in_place: &[Vec<(usize, usize)>],
    extra: &[Vec<ValueId>],
) -> MemoryPlan {
    let nv = func.values.len();
    // Per buffer (the value a chain of `Step::Forward`s starts from): the last step reading it
    // under any name, and whether every reader is a kernel (or passes it on).
    let root = buffer_roots(func, steps);
    let mut last = vec![None; nv];
    for (v, l) in last_reads(func, steps, operands).into_iter().enumerate() {
        let r = root[v].index();
        last[r] = last[r].max(l);
    }
    let mut kernel_only = vec![true; nv];
    for (i, inst) in func.insts.iter().enumerate() {
        if !matches!(
            steps[i],
            Step::Fused | Step::Merged | Step::Kernel | Step::Forward
        ) {
            for v in &inst.operands {
                kernel_only[root[v.index()].index()] = false;
            }
        }
    }
    for o in &func.outputs {
        kernel_only[root[o.index()].index()] = false;
    }
    // The names each buffer has, in program order.
    let mut names: Vec<Vec<ValueId>> = vec![Vec::new(); nv];
    for (v, r) in root.iter().enumerate() {
        if r.index() != v {
            names[r.index()].push(ValueId(v as u32));
        }
    }
    // Per step, the buffers whose last reader it is.
    let mut dies: Vec<Vec<ValueId>> = vec![Vec::new(); func.insts.len()];
    for (v, l) in last.iter().enumerate() {
        if let Some(l) = *l {
            dies[l].push(ValueId(v as u32));
        }
    }
    let mut out = MemoryPlan {
        slots: vec![None; nv],
        scratch_per_thread: (0..steps.len())
            .filter(|&i| steps[i] == Step::Kernel)
            .map(|i| scratch[i])
            .max()
            .unwrap_or(0),
        ..MemoryPlan::default()
    };
    // Free blocks (offset, bytes), sorted by offset, and the arena's end.
    let mut free: Vec<(usize, usize)> = Vec::new();
    let mut end = 0usize;
    for (i, inst) in func.insts.iter().enumerate() {
        if steps[i] != Step::Kernel {
            release_dying(&mut free, &out.slots, &dies[i]);
            continue;
        }
        let results: Vec<ValueId> = std::iter::once(inst.results[0])
            .chain(extra.get(i).into_iter().flatten().copied())
            .collect();
        for (k, &v) in results.iter().enumerate() {
            let t = &func.values[v.index()];
            let bytes = t.numel() * t.dtype.bytes();
            if let Some(&(q, _)) = in_place.get(i).into_iter().flatten().find(|p| p.1 == k) {
                out.in_place.push((v, operands[i][q]));
                out.in_place_bytes += bytes;
                continue;
            }
            if !kernel_only[v.index()] || bytes == 0 {
                out.other_bytes += bytes;
                continue;
            }
            out.unplanned_bytes += bytes;
            let size = aligned(bytes);
            // Best fit among the free blocks, else the arena's end.
            let best = free
                .iter()
                .enumerate()
                .filter(|(_, b)| b.1 >= size)
                .min_by_key(|(_, b)| b.1)
                .map(|(k, _)| k);
            let offset = match best {
                Some(k) => {
                    let (off, len) = free[k];
                    if len == size {
                        free.remove(k);
                    } else {
                        free[k] = (off + size, len - size);
                    }
                    off
                }
                // A free block at the arena's end grows into the new buffer.
                None => match free.last() {
                    Some(&(off, len)) if off + len == end => {
                        free.pop();
                        end = off + size;
                        off
                    }
                    _ => {
                        end += size;
                        end - size
                    }
                },
            };
            let slot = Slot {
                offset,
                bytes,
                def: i,
                last: last[v.index()].unwrap_or(i),
            };
            for &n in &names[v.index()] {
                out.slots[n.index()] = Some(slot.clone());
            }
            out.slots[v.index()] = Some(slot);
        }
        // Free the blocks of the buffers read for the last time here, and of a result nobody
        // reads.
        let unread: Vec<ValueId> = results
            .iter()
            .copied()
            .filter(|u| last[u.index()].is_none())
            .collect();
        release_dying(&mut free, &out.slots, &dies[i]);
        release_dying(&mut free, &out.slots, &unread);
    }
    out.arena_bytes = end;
    out
}

/// Returns the blocks of the buffers `dying` (those with a slot) to the free list.
fn release_dying(free: &mut Vec<(usize, usize)>, slots: &[Option<Slot>], dying: &[ValueId]) {
    for u in dying {
        if let Some(s) = &slots[u.index()] {
            release(free, s.offset, aligned(s.bytes));
        }
    }
}

/// Returns block `(off, len)` to the sorted free list, merging neighbours.
fn release(free: &mut Vec<(usize, usize)>, off: usize, len: usize) {
    let k = free.partition_point(|b| b.0 < off);
    free.insert(k, (off, len));
    if k + 1 < free.len() && free[k].0 + free[k].1 == free[k + 1].0 {
        free[k].1 += free[k + 1].1;
        free.remove(k + 1);
    }
    if k > 0 && free[k - 1].0 + free[k - 1].1 == free[k].0 {
        free[k - 1].1 += free[k].1;
        free.remove(k);
    }
}

impl fmt::Display for MemoryPlan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "value      offset        bytes  live steps")?;
        for (v, s) in self.slots.iter().enumerate() {
            if let Some(s) = s {
                writeln!(
                    f,
                    "{:<6} {:>10} {:>12}  {:>4}..{}",
                    format!("%{v}"),
                    s.offset,
                    s.bytes,
                    s.def,
                    s.last
                )?;
            }
        }
        writeln!(
            f,
            "arena {} bytes (one buffer per intermediate: {}); outside the arena {} bytes; peak {} bytes",
            self.arena_bytes,
            self.unplanned_bytes,
            self.other_bytes,
            self.peak_bytes()
        )?;
        for (r, p) in &self.in_place {
            writeln!(f, "%{} in place of donated %{}", r.index(), p.index())?;
        }
        if !self.in_place.is_empty() {
            writeln!(f, "in place (not allocated): {} bytes", self.in_place_bytes)?;
        }
        writeln!(
            f,
            "scratch (GEMM packing) {} bytes per thread",
            self.scratch_per_thread
        )
    }
}
