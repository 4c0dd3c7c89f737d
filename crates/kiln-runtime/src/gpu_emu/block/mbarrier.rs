//! mbarriers and TMA tile loads (sm_90a) in the emulator, as `kiln_kernel::gpu::mbarrier`
//! and `kiln_kernel::gpu::tma` define them.
//!
//! - A barrier's state (phase, arrivals and transaction bytes outstanding, the init's
//!   count) is kept per shared word; a generic load or store of that word is an error, as
//!   is a use by another thread before a block barrier has followed its init.
//! - A [`Stmt::TmaLoad`] reads its box at once (zeros outside the tensor) and stays in
//!   flight until a wait on its barrier: the first wait on a barrier lands every load in
//!   flight on it, in the order they started, each writing its elements (where the map's
//!   swizzle puts them) and taking its bytes off the transaction count of the phase then
//!   current. Its elements may not be touched while it is in flight, and may be read (by
//!   a load, an `ldmatrix` or a `wgmma`) only by a thread whose waits have reached the phase
//!   it landed in. Loads still in flight when the block ends are an error. A load that
//!   overwrites what a load wrote must be ordered after its readers: each of them (a
//!   warpgroup's first thread for a `wgmma`) must have arrived on a barrier since its read,
//!   in a phase the issuing thread has waited for (a producer refills a ring slot only after
//!   its consumers released it), though the lockstep order runs the readers first anyway.
//! - A wait whose phase has not completed once the loads in flight have landed cannot
//!   complete (the block's threads run in lockstep: every other thread is at this
//!   statement, or masked) and is an error saying what is outstanding; a wait that returns
//!   on the phase the thread's last wait returned on (a parity not flipped), or past the
//!   next one, is an error too.

use super::{Block, EmuError, V};
use kiln_kernel::gpu::ir::*;
use std::collections::HashMap;

/// A barrier: `(shared array, element)`.
type Key = (usize, usize);

/// One barrier's state.
struct Bar {
    count: i64,
    arrivals: i64,
    tx: i64,
    phase: i64,
}

/// One TMA load in flight.
struct Tma {
    bar: Key,
    /// `(array, element, value)`.
    writes: Vec<(usize, usize, V)>,
    bytes: i64,
}

/// The mbarrier and TMA state of a block.
#[derive(Default)]
pub(super) struct Mb {
    /// Whether the kernel has mbarrier or TMA statements (else nothing is tracked).
    on: bool,
    bars: HashMap<Key, Bar>,
    /// Per thread and barrier: the phase its last wait returned on (-1: the one before
    /// phase 0).
    seen: HashMap<(usize, Key), i64>,
    /// Loads in flight, in the order they started.
    copies: Vec<Tma>,
    /// Per shared element: loads in flight that write it.
    pending: HashMap<Key, u32>,
    /// Per shared element a load wrote: its barrier and the phase it landed in.
    landed: HashMap<Key, (Key, i64)>,
    /// A counter ordering reads and arrivals.
    clock: u64,
    /// Per shared element a load wrote: the threads that read it since (a warpgroup's first
    /// for a `wgmma`), each with when it last did.
    readers: HashMap<Key, HashMap<usize, u64>>,
    /// Per thread: its last arrival on each barrier, when, and in which phase.
    arrived: HashMap<usize, Vec<(Key, u64, i64)>>,
}

impl Mb {
    pub(super) fn new(k: &GpuKernel) -> Mb {
        Mb {
            on: k.uses_tma(),
            ..Mb::default()
        }
    }

    /// Loads still in flight.
    pub(super) fn left(&self) -> usize {
        self.copies.len()
    }

    /// Whether thread `t` may access shared element `i` of `array` through the generic
    /// proxy (`write`: store) or read it as a `wgmma` operand: not a barrier's word, not
    /// written by a load in flight, and, if a load wrote it, in a phase `t` has waited for.
    pub(super) fn check(
        &self,
        t: usize,
        array: usize,
        i: usize,
        write: bool,
    ) -> Result<(), String> {
        if !self.on {
            return Ok(());
        }
        let key = (array, i);
        if self.bars.contains_key(&key) {
            return Err(format!(
                "thread {t} {} shared{array}[{i}], an mbarrier's word (not through mbarrier \
                 statements)",
                if write { "writes" } else { "reads" }
            ));
        }
        if self.pending.get(&key).is_some_and(|&n| n > 0) {
            return Err(format!(
                "thread {t} touches shared{array}[{i}] while a TMA load into it is in flight \
                 (no wait on its mbarrier yet)"
            ));
        }
        if let Some(&(bar, phase)) = self.landed.get(&key) {
            let seen = self.seen.get(&(t, bar)).copied().unwrap_or(-1);
            if seen < phase {
                return Err(format!(
                    "thread {t} touches shared{array}[{i}], which a TMA load landed in phase \
                     {phase} of the mbarrier shared{}[{}], a phase it has not waited for",
                    bar.0, bar.1
                ));
            }
        }
        Ok(())
    }

    /// [`Mb::check`], and a store makes the element the thread's own again; a read of an
    /// element a load wrote is recorded ([`Mb::read_by`]).
    pub(super) fn access(
        &mut self,
        t: usize,
        array: usize,
        i: usize,
        write: bool,
    ) -> Result<(), String> {
        self.check(t, array, i, write)?;
        if self.on && write {
            self.landed.remove(&(array, i));
            self.readers.remove(&(array, i));
        } else {
            self.read_by(t, array, i);
        }
        Ok(())
    }

    /// Records that thread `t` (for a `wgmma`, its warpgroup's first) read shared element
    /// `i` of `array`, if a TMA load wrote it: a load that overwrites it must be ordered
    /// after an arrival of `t`'s since ([`Mb::overwrite`]).
    pub(super) fn read_by(&mut self, t: usize, array: usize, i: usize) {
        if !self.on || !self.landed.contains_key(&(array, i)) {
            return;
        }
        self.clock += 1;
        self.readers
            .entry((array, i))
            .or_default()
            .insert(t, self.clock);
    }

    /// Records thread `t`'s arrival on barrier `bar` in `phase`.
    fn arrive(&mut self, t: usize, bar: Key, phase: i64) {
        self.clock += 1;
        let clock = self.clock;
        let mine = self.arrived.entry(t).or_default();
        match mine.iter_mut().find(|a| a.0 == bar) {
            Some(a) => *a = (bar, clock, phase),
            None => mine.push((bar, clock, phase)),
        }
    }

    /// Whether a TMA load issued by thread `t` may write shared element `i` of `array`: not
    /// a barrier's word, not written by another load in flight, and every thread that read
    /// what a load wrote there has since arrived on a barrier whose phase of that arrival
    /// `t` has waited for (a producer refills a ring slot only once its consumers released
    /// it).
    fn overwrite(&mut self, t: usize, array: usize, i: usize) -> Result<(), String> {
        let key = (array, i);
        for (&r, &read) in self.readers.get(&key).into_iter().flatten() {
            let released = self
                .arrived
                .get(&r)
                .into_iter()
                .flatten()
                .any(|&(bar, at, phase)| {
                    at > read && self.seen.get(&(t, bar)).is_some_and(|&s| s >= phase)
                });
            if !released {
                return Err(format!(
                    "a TMA load by thread {t} overwrites shared{array}[{i}], which thread {r} \
                     read with no mbarrier arrival since whose phase thread {t} waited for (a \
                     slot refilled before its readers released it)"
                ));
            }
        }
        self.readers.remove(&key);
        if self.bars.contains_key(&key) {
            return Err(format!(
                "a TMA load writes shared{array}[{i}], an mbarrier's word"
            ));
        }
        if self.pending.get(&key).is_some_and(|&n| n > 0) {
            return Err(format!(
                "a TMA load writes shared{array}[{i}] while another into it is in flight"
            ));
        }
        self.landed.remove(&key);
        Ok(())
    }

    /// Completes the phase of `b` if nothing is outstanding.
    fn advance(b: &mut Bar) {
        if b.arrivals == 0 && b.tx == 0 {
            b.phase += 1;
            b.arrivals = b.count;
        }
    }
}

impl Block<'_> {
    /// The barrier `bar` names for thread `t`: its key, checked to lie in its array.
    fn bar_key(&self, t: usize, bar: &Mbar) -> Result<Key, EmuError> {
        let i = self.sc(t, &bar.index);
        let len = self.shared.get(bar.array).map_or(0, Vec::len);
        if i < 0 || i as usize >= len {
            return self.err(format!(
                "an mbarrier at shared{}[{i}], out of its {len} elements (thread {t})",
                bar.array
            ));
        }
        Ok((bar.array, i as usize))
    }

    /// The barrier `bar` names for thread `t`, which must be initialized and published to
    /// it (`what` names the statement in errors).
    fn bar_of(&self, t: usize, bar: &Mbar, what: &str) -> Result<Key, EmuError> {
        let key = self.bar_key(t, bar)?;
        if !self.mb.bars.contains_key(&key) {
            return self.err(format!(
                "thread {t} {what} the mbarrier shared{}[{}], which was never initialized (or \
                 was invalidated)",
                key.0, key.1
            ));
        }
        if let Some(w) = self.log.get(&key).and_then(|a| a.writer)
            && w != t
        {
            return self.err(format!(
                "thread {t} {what} the mbarrier shared{}[{}], initialized by thread {w} with \
                 no block barrier since",
                key.0, key.1
            ));
        }
        Ok(key)
    }

    /// `mbarrier.init`.
    pub(super) fn mbar_init(
        &mut self,
        mask: &[bool],
        bar: &Mbar,
        count: usize,
    ) -> Result<(), EmuError> {
        for t in (0..self.k.block).filter(|&t| mask[t]) {
            let key = self.bar_key(t, bar)?;
            if self.mb.bars.contains_key(&key) {
                return self.err(format!(
                    "thread {t} initializes the mbarrier shared{}[{}], already initialized \
                     (no mbarrier.inval since)",
                    key.0, key.1
                ));
            }
            self.touch(t, key.0, key.1 as i64, true)?;
            self.mb.bars.insert(
                key,
                Bar {
                    count: count as i64,
                    arrivals: count as i64,
                    tx: 0,
                    phase: 0,
                },
            );
            self.mb.seen.retain(|(_, b), _| *b != key);
        }
        Ok(())
    }

    /// `mbarrier.inval`.
    pub(super) fn mbar_inval(&mut self, mask: &[bool], bar: &Mbar) -> Result<(), EmuError> {
        for t in (0..self.k.block).filter(|&t| mask[t]) {
            let key = self.bar_of(t, bar, "invalidates")?;
            if self.mb.copies.iter().any(|c| c.bar == key) {
                return self.err(format!(
                    "thread {t} invalidates the mbarrier shared{}[{}] while a TMA load on it \
                     is in flight",
                    key.0, key.1
                ));
            }
            self.mb.bars.remove(&key);
            self.touch(t, key.0, key.1 as i64, true)?;
        }
        Ok(())
    }

    /// `mbarrier.arrive` (expecting `tx` bytes first).
    pub(super) fn mbar_arrive(
        &mut self,
        mask: &[bool],
        bar: &Mbar,
        tx: usize,
    ) -> Result<(), EmuError> {
        for t in (0..self.k.block).filter(|&t| mask[t]) {
            let key = self.bar_of(t, bar, "arrives on")?;
            let Some(b) = self.mb.bars.get_mut(&key) else {
                continue;
            };
            b.tx += tx as i64;
            let over = (b.arrivals == 0).then_some((b.phase, b.tx));
            if over.is_none() {
                let phase = b.phase;
                b.arrivals -= 1;
                Mb::advance(b);
                self.mb.arrive(t, key, phase);
            }
            if let Some((phase, left)) = over {
                return self.err(format!(
                    "thread {t} arrives on the mbarrier shared{}[{}] in phase {phase}, which \
                     expects no more arrivals ({left} bytes outstanding)",
                    key.0, key.1
                ));
            }
        }
        Ok(())
    }

    /// Lands every TMA load in flight on barrier `key`, in order.
    fn land(&mut self, key: Key) {
        let (mine, rest): (Vec<Tma>, Vec<Tma>) = std::mem::take(&mut self.mb.copies)
            .into_iter()
            .partition(|c| c.bar == key);
        self.mb.copies = rest;
        for c in mine {
            let Some(b) = self.mb.bars.get_mut(&key) else {
                continue;
            };
            let phase = b.phase;
            b.tx -= c.bytes;
            Mb::advance(b);
            for (a, i, v) in c.writes {
                self.shared[a][i] = v;
                if let Some(n) = self.mb.pending.get_mut(&(a, i)) {
                    *n -= 1;
                }
                self.mb.landed.insert((a, i), (key, phase));
            }
        }
    }

    /// `mbarrier.try_wait.parity` until it succeeds.
    pub(super) fn mbar_wait(
        &mut self,
        mask: &[bool],
        bar: &Mbar,
        parity: &Sc,
    ) -> Result<(), EmuError> {
        let active: Vec<usize> = (0..self.k.block).filter(|&t| mask[t]).collect();
        let mut keys = Vec::new();
        for &t in &active {
            let key = self.bar_of(t, bar, "waits on")?;
            if !keys.contains(&key) {
                keys.push(key);
            }
        }
        for key in keys {
            self.land(key);
        }
        for t in active {
            let key = self.bar_of(t, bar, "waits on")?;
            let p = self.sc(t, parity) & 1;
            let Some(b) = self.mb.bars.get(&key) else {
                continue;
            };
            if b.phase & 1 == p {
                return self.err(format!(
                    "thread {t} waits on phase {} of the mbarrier shared{}[{}] (parity {p}), \
                     which cannot complete: {} arrivals and {} transaction bytes outstanding, \
                     no TMA load in flight on it",
                    b.phase, key.0, key.1, b.arrivals, b.tx
                ));
            }
            let q = b.phase - 1;
            let last = self.mb.seen.get(&(t, key)).copied();
            let wrong = match last {
                Some(l) if q <= l => Some(format!(
                    "returns on phase {q} again (its last wait returned on phase {l}): the \
                     parity was not flipped"
                )),
                Some(l) if q > l + 1 => Some(format!(
                    "returns on phase {q}, past phase {} its last wait was followed by",
                    l + 1
                )),
                None if q > 0 => Some(format!(
                    "returns on phase {q} though the thread never waited for phase 0"
                )),
                _ => None,
            };
            if let Some(why) = wrong {
                return self.err(format!(
                    "thread {t}'s wait on the mbarrier shared{}[{}] with parity {p} {why}",
                    key.0, key.1
                ));
            }
            self.mb.seen.insert((t, key), q);
        }
        Ok(())
    }

    /// Starts a TMA load of tensor map `map`'s box at `coords` into `array` from element
    /// `index`, on barrier `bar`.
    pub(super) fn tma_load(
        &mut self,
        mask: &[bool],
        (map, array, index): (usize, usize, &Sc),
        coords: &[Sc; 2],
        bar: &Mbar,
    ) -> Result<(), EmuError> {
        let (k, inputs) = (self.k, self.inputs);
        let Some(m) = k.tensor_maps.get(map) else {
            return self.err(format!(
                "a TMA load of tensor map {map}, which the launch lacks"
            ));
        };
        let Some(a) = k.shared.get(array) else {
            return self.err(format!(
                "a TMA load into shared{array}, which the launch lacks"
            ));
        };
        let Some(input) = inputs.get(m.input) else {
            return self.err(format!(
                "tensor map {map} reads input {}, which the launch lacks",
                m.input
            ));
        };
        let (e, held) = (m.elem_bytes(), a.elem_bytes());
        if e != held {
            return self.err(format!(
                "a TMA load of {e}-byte elements into shared{array}, of {held}-byte ones"
            ));
        }
        let [bc, br] = m.box_dims;
        let zero = if m.dtype.is_float() {
            V::F(0.0)
        } else {
            V::I(0)
        };
        for t in (0..k.block).filter(|&t| mask[t]) {
            let key = self.bar_of(t, bar, "loads by TMA on")?;
            let dst = self.sc(t, index) * e as i64;
            if dst < 0 || dst % 128 != 0 {
                return self.err(format!(
                    "a TMA load into shared{array} at byte {dst}, not a multiple of 128 (thread {t})"
                ));
            }
            let (x, y) = (self.sc(t, &coords[0]), self.sc(t, &coords[1]));
            let pitch = (m.row_stride / e) as i64;
            let mut writes = Vec::with_capacity(bc * br);
            for r in 0..br {
                for c in 0..bc {
                    let (gx, gy) = (x + c as i64, y + r as i64);
                    let inside =
                        (0..m.dims[0] as i64).contains(&gx) && (0..m.dims[1] as i64).contains(&gy);
                    let v = if inside {
                        let at = (gy * pitch + gx) as usize;
                        match input.data.get(at) {
                            Some(&v) => v,
                            None => {
                                return self.err(format!(
                                    "a TMA load reads {}[{at}] of {} elements (map {map})",
                                    input.name,
                                    input.data.len()
                                ));
                            }
                        }
                    } else {
                        zero
                    };
                    let byte = m.swizzle.apply(dst as usize + (r * bc + c) * e);
                    let p = byte / e;
                    if p >= a.len {
                        return self.err(format!(
                            "a TMA load writes shared{array}[{p}] of {} elements (box element \
                             ({r}, {c}), thread {t})",
                            a.len
                        ));
                    }
                    if self.wg.is_read(array, p) {
                        return self.err(format!(
                            "a TMA load into shared{array}[{p}], which a wgmma still in flight \
                             reads (thread {t})"
                        ));
                    }
                    if let Err(m) = self.mb.overwrite(t, array, p) {
                        return self.err(format!("{m} (thread {t})"));
                    }
                    writes.push((array, p, v));
                }
            }
            for &(a, p, _) in &writes {
                *self.mb.pending.entry((a, p)).or_default() += 1;
            }
            self.mb.copies.push(Tma {
                bar: key,
                writes,
                bytes: m.box_bytes() as i64,
            });
        }
        Ok(())
    }
}
