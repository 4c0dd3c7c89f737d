//! The GPU IR: a kernel as one thread of a grid of blocks runs it.
//!
//! A [`GpuProgram`] is what [`super::map()`] makes of one kernel: scratch buffers and the
//! launches ([`GpuKernel`]) that run one after the other. A launch names its geometry (blocks,
//! threads per block, the warp size), the buffers it reads and writes, its shared-memory
//! arrays, and a body of [`Stmt`]s that every thread runs. Element computations are kernel-IR
//! [`Expr`] trees, evaluated at the kernel's loop variables as the thread set them
//! ([`Stmt::SetVar`]); thread-level integer arithmetic (positions, strides, guards) is a
//! [`Sc`]. A future PTX emitter renders each statement as it is; the emulator in
//! `kiln-runtime` runs them on the CPU with the GPU's semantics (lockstep warps, barriers,
//! shuffles, shared memory).

pub use super::desc::{MatrixDesc, WgSwizzle};
pub use super::tma::TensorMap;
use crate::ir::Expr;
use crate::target::{Gpu, SumTree};
use kiln_ir::{Combiner, DType, TensorType};

/// A special register of a thread.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Special {
    /// The thread's index in its block (`threadIdx.x`).
    Thread,
    /// The block's index in the grid (`blockIdx.x`).
    Block,
    /// Threads per block (`blockDim.x`).
    BlockDim,
    /// Blocks in the grid (`gridDim.x`).
    GridDim,
    /// The thread's lane in its warp (`%laneid`).
    Lane,
    /// The thread's warp in its block.
    Warp,
}

/// A thread-level integer (i64) expression.
#[derive(Clone, Debug, PartialEq)]
pub enum Sc {
    /// A constant.
    Const(i64),
    /// A special register.
    Special(Special),
    /// An integer register.
    Reg(usize),
    /// A kernel loop variable as the thread last set it.
    Var(usize),
    /// Sum.
    Add(Box<Sc>, Box<Sc>),
    /// Product.
    Mul(Box<Sc>, Box<Sc>),
    /// Truncating quotient (by a positive divisor).
    Div(Box<Sc>, Box<Sc>),
    /// Remainder (of a non-negative value by a positive divisor).
    Rem(Box<Sc>, Box<Sc>),
    /// `1` when the first is below the second, else `0`.
    Lt(Box<Sc>, Box<Sc>),
    /// `1` when both are equal, else `0`.
    Eq(Box<Sc>, Box<Sc>),
    /// `1` when both are nonzero, else `0`.
    And(Box<Sc>, Box<Sc>),
}

#[allow(missing_docs)]
impl Sc {
    pub fn plus(a: Sc, b: Sc) -> Sc {
        Sc::Add(Box::new(a), Box::new(b))
    }
    pub fn times(a: Sc, b: Sc) -> Sc {
        Sc::Mul(Box::new(a), Box::new(b))
    }
    pub fn quot(a: Sc, b: Sc) -> Sc {
        Sc::Div(Box::new(a), Box::new(b))
    }
    pub fn modulo(a: Sc, b: Sc) -> Sc {
        Sc::Rem(Box::new(a), Box::new(b))
    }
    pub fn lt(a: Sc, b: Sc) -> Sc {
        Sc::Lt(Box::new(a), Box::new(b))
    }
    pub fn eq(a: Sc, b: Sc) -> Sc {
        Sc::Eq(Box::new(a), Box::new(b))
    }
    pub fn and(a: Sc, b: Sc) -> Sc {
        Sc::And(Box::new(a), Box::new(b))
    }
    /// `a - b`.
    pub fn minus(a: Sc, b: Sc) -> Sc {
        Sc::plus(a, Sc::times(b, Sc::Const(-1)))
    }
    /// `1` where `x` is 0, else `0`.
    pub fn is_zero(x: Sc) -> Sc {
        Sc::eq(x, Sc::Const(0))
    }
}

impl Stmt {
    /// A grid-stride loop: thread `block · blockDim + thread` runs `body` with register `r`
    /// at that position, then a grid's worth of threads further on, while below `end`.
    pub fn grid_stride(r: usize, end: Sc, body: Vec<Stmt>) -> Stmt {
        let sp = |s| Sc::Special(s);
        Stmt::For {
            reg: r,
            start: Sc::plus(
                Sc::times(sp(Special::Block), sp(Special::BlockDim)),
                sp(Special::Thread),
            ),
            end,
            step: Sc::times(sp(Special::BlockDim), sp(Special::GridDim)),
            body,
        }
    }

    /// `for (r = start; r < end; r++) body`.
    pub fn count_up(r: usize, start: Sc, end: Sc, body: Vec<Stmt>) -> Stmt {
        Stmt::For {
            reg: r,
            start,
            end,
            step: Sc::Const(1),
            body,
        }
    }
}

/// A buffer a launch reads or writes. In a launch's [`GpuKernel::inputs`] and
/// [`GpuKernel::outputs`] lists it names the kernel's buffers; in a statement
/// ([`Stmt::Load`], [`Stmt::Store`]), `Input(i)` and `Output(k)` name the launch's own input
/// `i` and output `k` (entries of those lists).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Buf {
    /// The kernel's (or the launch's) input `i`.
    Input(usize),
    /// The kernel's output `k` (0: its result, then its extra outputs in order), or the
    /// launch's.
    Output(usize),
    /// The program's scratch buffer `s` (see [`GpuProgram::scratch`]).
    Scratch(usize),
}

/// How a warp shuffle picks the lane it reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Shuffle {
    /// Lane `lane ^ n` (`shfl.sync.bfly`).
    Xor(usize),
    /// Lane `lane + n`, the lane's own value past the warp's end (`shfl.sync.down`).
    Down(usize),
}

/// One statement of a thread's program. Registers are numbered per thread; an integer
/// register holds an i64, a value register a kernel-IR value of the dtype it was computed in.
#[derive(Clone, Debug, PartialEq)]
pub enum Stmt {
    /// `reg = value` (integer).
    Let {
        /// The register.
        reg: usize,
        /// Its value.
        value: Sc,
    },
    /// Sets kernel loop variable `var` for the expressions evaluated after it.
    SetVar {
        /// The variable.
        var: usize,
        /// Its value.
        value: Sc,
    },
    /// `reg = expr` at the thread's loop variables. A load of input `inputs.len() + i` (with
    /// zero coefficients) reads value register `scalars[i]`: a reduction computed before by the
    /// whole warp or block stands for itself so.
    Eval {
        /// The register.
        reg: usize,
        /// The expression.
        expr: Expr,
        /// Value registers read as extra inputs.
        scalars: Vec<usize>,
    },
    /// `reg = identity of kind` in `dtype` (0 for a sum, -inf for a float maximum, ...).
    Identity {
        /// The register.
        reg: usize,
        /// The combiner.
        kind: Combiner,
        /// The dtype.
        dtype: DType,
    },
    /// `acc = kind(acc, value)` in `dtype`.
    Combine {
        /// The accumulator register.
        acc: usize,
        /// The register combined into it.
        value: usize,
        /// The combiner.
        kind: Combiner,
        /// The dtype.
        dtype: DType,
    },
    /// `acc = acc + a · b` in `dtype` (f32 or f64), rounded once: a fused multiply-add, as
    /// the products of matrix products and attention accumulate.
    MulAdd {
        /// The accumulator register.
        acc: usize,
        /// One factor.
        a: usize,
        /// The other factor.
        b: usize,
        /// The dtype.
        dtype: DType,
    },
    /// `for (reg = start; reg < end; reg += step) body`, per thread; a warp runs it while any
    /// of its threads continues (the others wait, masked).
    For {
        /// The loop register.
        reg: usize,
        /// First value.
        start: Sc,
        /// Bound (exclusive).
        end: Sc,
        /// Increment (positive).
        step: Sc,
        /// The loop body.
        body: Vec<Stmt>,
    },
    /// `if (cond != 0) body`: the threads where it fails are masked.
    If {
        /// The condition.
        cond: Sc,
        /// The body.
        body: Vec<Stmt>,
    },
    /// `reg = buf[index]` from global memory.
    Load {
        /// The register.
        reg: usize,
        /// The buffer.
        buf: Buf,
        /// The element index.
        index: Sc,
    },
    /// `buf[index] = value` in global memory (rounded to the buffer's dtype).
    Store {
        /// The buffer.
        buf: Buf,
        /// The element index.
        index: Sc,
        /// The value register.
        value: usize,
    },
    /// `buf[index] += value` in global memory, atomically (`red.global.add.f32`,
    /// `red.global.add.noftz.f16`): the addition rounded to the buffer's dtype (f32 or f16),
    /// one at a time per element, in whatever order the threads reach it. Only where the
    /// options allow float atomics ([`crate::options::Options::float_atomics`]); the result
    /// then depends on that order in its last bits.
    AtomicAdd {
        /// The buffer (a launch output).
        buf: Buf,
        /// The element index.
        index: Sc,
        /// The value register.
        value: usize,
    },
    /// `reg = shared[array][index]`.
    SharedLoad {
        /// The register.
        reg: usize,
        /// The shared array.
        array: usize,
        /// The element index.
        index: Sc,
    },
    /// `shared[array][index] = value`.
    SharedStore {
        /// The shared array.
        array: usize,
        /// The element index.
        index: Sc,
        /// The value register.
        value: usize,
    },
    /// `__syncthreads()`: every thread of the block must reach it together.
    Barrier,
    /// A remark for the printed form (a choice the mapping made, such as where a row is
    /// cached); it runs as nothing.
    Note(String),
    /// `reg = src` of the lane `mode` picks, across the whole warp (`shfl.sync`).
    Shuffle {
        /// The register written.
        reg: usize,
        /// The register read in the other lane.
        src: usize,
        /// Which lane.
        mode: Shuffle,
    },
    /// `ldmatrix.sync.aligned.m8n8.x4.b16`: the whole warp loads four 8 x 8 matrices of 16-bit
    /// elements, each row 16 bytes, from a shared array of 16-bit elements (packed:
    /// [`SharedArray::packed`]) or of 32-bit ones (f32). Lane `l` names, in `row`, the element
    /// where row `l % 8` of matrix `l / 8` starts (16 bytes: 8 packed 16-bit elements, or 4
    /// 32-bit ones). Lane `l` then holds 32-bit word `l % 4` of row `l / 4` of each matrix `j`:
    ///
    /// - of 16-bit elements (8 registers), elements `2 (l % 4)` and `2 (l % 4) + 1` of that row
    ///   in `regs[2j]` and `regs[2j + 1]`: with the four matrices the quarters of a 16 x 16 tile
    ///   (rows 0-7 and 8-15 of columns 0-7, then of columns 8-15), exactly the A fragment of an
    ///   m16n8k16 [`Stmt::Mma`];
    /// - of 32-bit elements (4 registers), element `l % 4` of that row in `regs[j]` (an 8 x 8
    ///   matrix of 16-bit elements is an 8 x 4 matrix of 32-bit ones): with the four matrices
    ///   rows 0-7 and 8-15 of columns 0-3, then of columns 4-7 of a 16 x 8 tile, exactly the A
    ///   fragment of an m16n8k8 TF32 [`Stmt::Mma`]; of B stored by columns (8 x 8 column-major
    ///   tiles, a column's contraction contiguous), matrices over contraction 0-3 and 4-7 of
    ///   one column tile are its B fragment.
    ///
    /// With `trans` (`ldmatrix...x4.trans`, 16-bit elements only) each matrix is transposed as
    /// it loads: lane `l` holds, in `regs[2j]` and `regs[2j + 1]`, elements `l / 4` of rows
    /// `2 (l % 4)` and `2 (l % 4) + 1` of matrix `j`: with rows along the contraction and 8
    /// columns each, the B fragment of an m16n8k16 [`Stmt::Mma`] read from B stored by rows.
    LdMatrix {
        /// The value registers written (f32 registers holding the elements): 8 from 16-bit
        /// elements, 4 from 32-bit ones.
        regs: Vec<usize>,
        /// The shared array.
        array: usize,
        /// This lane's row start (an element index).
        row: Sc,
        /// Each matrix transposed.
        trans: bool,
    },
    /// `reg = cvt.rna.tf32.f32 reg`: f32 value register `reg` rounded to TF32 (10 mantissa
    /// bits, to nearest, ties away from zero; infinities and NaN kept; a value past TF32's
    /// largest rounds to an infinity), as [`crate::gpu::tf32::round`] does. What a TF32
    /// [`Stmt::Mma`] multiplies must have gone through it.
    RoundTf32 {
        /// The register.
        reg: usize,
    },
    /// `cp.async.ca.shared.global`: starts copying `elems` consecutive elements (4, 8 or 16
    /// bytes, as many elements as fit) of global `buf` from element `src` into shared `array`
    /// from element `index`, both multiples of `elems` (aligned); a packed array takes 16-bit
    /// elements as they are. The copy lands when a [`Stmt::CopyWait`] of this thread waits for
    /// the group [`Stmt::CopyCommit`] put it in; until then the shared elements keep their old
    /// values.
    CopyAsync {
        /// The shared array.
        array: usize,
        /// The first shared element.
        index: Sc,
        /// The global buffer.
        buf: Buf,
        /// The first global element.
        src: Sc,
        /// Elements copied.
        elems: usize,
    },
    /// `cp.async.commit_group`: this thread's copies started since the last commit form a
    /// group.
    CopyCommit,
    /// `cp.async.wait_group pending`: this thread waits until at most `pending` of its
    /// committed groups are still in flight (the oldest land first). The other threads see the
    /// copied elements after a barrier.
    CopyWait {
        /// Groups that may stay in flight.
        pending: usize,
    },
    /// `mma.sync.aligned.{shape}.row.col.f32.{operand}.{operand}.f32`: the whole warp computes
    /// `D = A x B + C` for a 16 x k A, a k x 8 B and 16 x 8 C and D, products and sums in f32,
    /// `k` 16 for bf16 and f16 operands (`m16n8k16`) and 8 for TF32 ones (`m16n8k8`). With
    /// `g = lane / 4` and `t = lane % 4`, a lane holds (the PTX ISA's fragment layouts):
    /// - bf16 and f16 (`a` 8 registers, `b` 4): `a[i]` A's row `g + 8 ((i / 2) % 2)`, column
    ///   `2t + i % 2 + 8 (i / 4)`; `b[i]` B's row `2t + i % 2 + 8 (i / 2)`, column `g`;
    /// - TF32 (`a` 4 registers, `b` 2): `a[i]` A's row `g + 8 (i % 2)`, column `t + 4 (i / 2)`;
    ///   `b[i]` B's row `t + 4 i`, column `g`;
    /// - `c[i]` and `d[i]`: row `g + 8 (i / 2)`, column `2t + i % 2`.
    ///
    /// The operand registers hold f32 values; bf16 and f16 ones are rounded to their dtype as
    /// they are packed. TF32 operands must already be TF32 values ([`Stmt::RoundTf32`]): the
    /// tensor cores read a register's sign, exponent and upper 10 mantissa bits only, and the
    /// emulator truncates the rest away, so a missing rounding shows.
    Mma {
        /// The result's registers (f32).
        d: [usize; 4],
        /// A's registers ([`MmaOperand::a_regs`] of them).
        a: Vec<usize>,
        /// B's registers ([`MmaOperand::b_regs`] of them).
        b: Vec<usize>,
        /// The addend's registers (f32; may be `d`'s).
        c: [usize; 4],
        /// The shape `(m, n, k)`: `operand`'s ([`MmaOperand::shape`]).
        shape: (usize, usize, usize),
        /// The operands' type.
        operand: MmaOperand,
    },
    /// `wgmma.fence.sync.aligned`, by a whole warpgroup (128 threads, 4 warps from a
    /// multiple of 4): orders the warpgroup's register accesses before the
    /// [`Stmt::Wgmma`]s after it. A `wgmma` whose accumulators were written by anything but
    /// `wgmma`s since this thread's last fence is an error in the emulator.
    WgmmaFence,
    /// `fence.proxy.async.shared::cta`: this thread's writes to shared memory so far (stores
    /// and landed `cp.async` copies, the generic proxy) become visible to the async proxy a
    /// [`Stmt::Wgmma`] reads through (after a barrier for the other threads). A `wgmma`
    /// reading an element written without one since is an error in the emulator.
    ProxyFence,
    /// `wgmma.mma_async.sync.aligned.m64n{n}k16.f32.{operand}.{operand}` with scale-d 1: the
    /// warpgroup starts `D = A x B + D` for a 64 x 16 A and 16 x `n` B, both read from shared
    /// memory through matrix descriptors (K-major: A by rows, B by columns; see
    /// [`crate::gpu::desc`]), D in f32 registers: thread `t` of the warpgroup (warp `w = t /
    /// 32`, `g = lane / 4`, `q = lane % 4`) holds, in `acc[i]`, row `16w + g + 8 ((i % 4) /
    /// 2)`, column `8 (i / 4) + 2q + i % 2`. It runs asynchronously: its accumulators may not
    /// be read or written (but by further `wgmma`s) until a [`Stmt::WgmmaWait`] retires the
    /// group [`Stmt::WgmmaCommit`] put it in, nor the shared elements it reads be written;
    /// the emulator computes it at once (products exact, the sum rounded once to f32) and
    /// checks those rules.
    Wgmma {
        /// The accumulators (`n / 2` f32 registers).
        acc: Vec<usize>,
        /// A (64 x 16, K-major).
        a: MatrixDesc,
        /// B (16 x `n`, K-major: `n` rows of 16).
        b: MatrixDesc,
        /// Columns (a multiple of 8 from 8 to 256).
        n: usize,
        /// The operands' type (bf16 or f16).
        operand: MmaOperand,
    },
    /// `wgmma.commit_group.sync.aligned`: the warpgroup's `wgmma`s since the last commit form
    /// a group.
    WgmmaCommit,
    /// `wgmma.wait_group.sync.aligned pending`: waits until at most `pending` of the
    /// warpgroup's committed groups are in flight (the oldest retire first).
    WgmmaWait {
        /// Groups that may stay in flight.
        pending: usize,
    },
    /// `mbarrier.init.shared::cta.b64 [bar], count`: the barrier starts its phase 0 expecting
    /// `count` arrivals and no transaction bytes (see [`crate::gpu::mbarrier`] for the
    /// semantics every mbarrier statement follows). Other threads may use it after a
    /// [`Stmt::Barrier`].
    MbarInit {
        /// The barrier.
        bar: Mbar,
        /// Arrivals each phase expects (1 to 2^20 - 1).
        count: usize,
    },
    /// `mbarrier.arrive.shared::cta.b64`, or with `tx` bytes
    /// `mbarrier.arrive.expect_tx.shared::cta.b64`: each active thread arrives once, after
    /// adding `tx` to the bytes the current phase waits for.
    MbarArrive {
        /// The barrier.
        bar: Mbar,
        /// Transaction bytes expected first (0: a plain arrive).
        tx: usize,
    },
    /// `mbarrier.try_wait.parity.shared::cta.b64` in a loop: the thread waits until the
    /// phase of parity `parity` (0 or 1) of the barrier has completed: the current phase when
    /// its parity is `parity`, else the one before it.
    MbarWait {
        /// The barrier.
        bar: Mbar,
        /// The parity of the phase waited for.
        parity: Sc,
    },
    /// `mbarrier.inval.shared::cta.b64`: the barrier's memory may be used for something else.
    MbarInval {
        /// The barrier.
        bar: Mbar,
    },
    /// `cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes`: the
    /// thread starts copying the box of tensor map `map` ([`GpuKernel::tensor_maps`]) at
    /// element coordinates `coords` (innermost first; elements outside the tensor read as
    /// zero) into shared `array` from element `index` (a multiple of 128 bytes), laid out by
    /// the map's swizzle ([`crate::gpu::tma`]); when it lands it completes the box's bytes
    /// on `bar`.
    TmaLoad {
        /// The tensor map.
        map: usize,
        /// The shared array.
        array: usize,
        /// The element the box starts at (an address, not through the array's swizzle).
        index: Sc,
        /// The box's first element: column, then row.
        coords: [Sc; 2],
        /// The barrier whose transaction count the copy completes.
        bar: Mbar,
    },
}

/// An mbarrier in shared memory: element `index` of shared `array`, an array of `u64`
/// ([`SharedArray::mbarriers`]).
#[derive(Clone, Debug, PartialEq)]
pub struct Mbar {
    /// The shared array.
    pub array: usize,
    /// The barrier's element.
    pub index: Sc,
}

/// The operand type of a tensor-core [`Stmt::Mma`], which fixes its shape.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MmaOperand {
    /// bf16 (`m16n8k16`).
    Bf16,
    /// f16 (`m16n8k16`).
    F16,
    /// TF32: f32's sign and exponent with 10 mantissa bits, in a 32-bit register (`m16n8k8`).
    Tf32,
}

impl MmaOperand {
    /// The operand type of 16-bit `dtype` (bf16 or f16).
    pub fn of_half(dtype: DType) -> Option<MmaOperand> {
        match dtype {
            DType::BF16 => Some(MmaOperand::Bf16),
            DType::F16 => Some(MmaOperand::F16),
            _ => None,
        }
    }

    /// Its PTX name (`bf16`, `f16`, `tf32`).
    pub fn name(self) -> &'static str {
        match self {
            MmaOperand::Bf16 => "bf16",
            MmaOperand::F16 => "f16",
            MmaOperand::Tf32 => "tf32",
        }
    }

    /// The dtype its elements are staged and held in: bf16 and f16 themselves, f32 for TF32
    /// (rounded to TF32 when loaded into registers).
    pub fn dtype(self) -> DType {
        match self {
            MmaOperand::Bf16 => DType::BF16,
            MmaOperand::F16 => DType::F16,
            MmaOperand::Tf32 => DType::F32,
        }
    }

    /// The contraction of one `mma`: 16 for 16-bit operands, 8 for TF32.
    pub fn k(self) -> usize {
        match self {
            MmaOperand::Bf16 | MmaOperand::F16 => 16,
            MmaOperand::Tf32 => 8,
        }
    }

    /// The `(m, n, k)` shape of its `mma`: `m16n8k16`, or `m16n8k8` for TF32.
    pub fn shape(self) -> (usize, usize, usize) {
        (16, 8, self.k())
    }

    /// A's registers per lane: 16 x k elements over 32 lanes.
    pub fn a_regs(self) -> usize {
        16 * self.k() / 32
    }

    /// B's registers per lane: k x 8 elements over 32 lanes.
    pub fn b_regs(self) -> usize {
        8 * self.k() / 32
    }
}

/// A shared-memory array of one block.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SharedArray {
    /// Its elements' dtype (f16 and bf16 are held as f32).
    pub dtype: DType,
    /// Its elements.
    pub len: usize,
    /// f16 and bf16 elements held as 16 bits (rounded on store), as [`Stmt::LdMatrix`] reads
    /// them, rather than as f32.
    pub packed: bool,
    /// A swizzled layout (packed 16-bit arrays, 8 elements a chunk, and 32-bit ones, 4 a
    /// chunk): the array's 16-byte chunk `c` lies at chunk `c ^ ((c >> s) & 7)`, `s` this
    /// value, so that the same chunk of 8 consecutive rows of `2^s` chunks or fewer (what one
    /// `ldmatrix` matrix reads, and what `cp.async` writes) falls in 8 different bank groups
    /// instead of one. Indices stay logical everywhere in
    /// the kernel (the emulator runs them as they are); the PTX emitter renders the layout
    /// at each access. A chunk moves only within its aligned group of 8, so the array's
    /// length is a multiple of 8 chunks.
    pub swizzle: Option<u32>,
}

impl SharedArray {
    /// An array of `n` mbarriers: 64-bit words, not packed, not swizzled.
    pub fn mbarriers(n: usize) -> SharedArray {
        SharedArray {
            dtype: DType::U64,
            len: n,
            packed: false,
            swizzle: None,
        }
    }

    /// Bytes of one element as the array holds it: 16-bit elements take 2 when packed, every
    /// element at least 4 otherwise.
    pub fn elem_bytes(&self) -> usize {
        let bytes = self.dtype.bits().div_ceil(8) as usize;
        if self.packed { bytes } else { bytes.max(4) }
    }

    /// Elements of one 16-byte chunk (what [`SharedArray::swizzle`] moves, and one row of an
    /// `ldmatrix` matrix): 8 packed 16-bit elements, 4 of 32 bits.
    pub fn chunk_elems(&self) -> usize {
        16 / self.elem_bytes().clamp(1, 16)
    }

    /// Where element `i` of a swizzled array lies, `elems` elements a 16-byte chunk (the
    /// layout [`SharedArray::swizzle`] describes; `i` itself when not swizzled).
    pub fn physical(&self, i: usize, elems: usize) -> usize {
        match self.swizzle {
            None => i,
            Some(s) => {
                let (chunk, within) = (i / elems, i % elems);
                (chunk ^ ((chunk >> s) & 7)) * elems + within
            }
        }
    }
}

/// How a kernel was mapped (reports and the printed form).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum MapKind {
    /// Grid-stride loops over the output, one element per thread per iteration.
    Elementwise,
    /// One warp per row of the output: the row's reductions by lane-strided partial sums and
    /// a shuffle tree, then its elements lane-strided.
    WarpRows,
    /// One block per row: as [`MapKind::WarpRows`], with the warps' partial sums combined
    /// through shared memory between barriers.
    BlockRows,
    /// The first of two launches of a few long reductions (a sum over a whole tensor): each
    /// row's terms in slices, a block per slice writing its partial result to scratch; the
    /// second launch reduces each row's partials in order (`map/split.rs`).
    SplitPartials,
    /// The first of two launches of a column reduction (the reduced dimension outer, the kept
    /// one inner and contiguous): a thread per column, coalesced, blocks over slices of the
    /// rows, each slice's partial to scratch; the second launch sums the slices in order.
    ColumnPartials,
    /// A matrix product, one thread per output element over the contraction.
    Gemm,
    /// A matrix product by block tiles: A's and B's tiles staged through shared memory, each
    /// thread accumulating a register tile of the result.
    GemmTiled,
    /// A matrix product on the tensor cores: bf16 or f16 tiles staged through shared memory,
    /// `ldmatrix` and `mma.m16n8k16` per warp, f32 accumulators; or f32 tiles whose elements
    /// are rounded to TF32 as they are loaded, `mma.m16n8k8` (when the options allow TF32).
    GemmMma,
    /// Attention in one launch (a product, its online softmax and the chained product): a
    /// warp per query row, keys and values staged through shared memory 32 at a time, the
    /// row's running maximum and sum kept in registers.
    Attention,
    /// Attention in one launch by register tiles (`Gpu::attention_tiles`): a block of query
    /// rows steps through the keys, each thread computing a tile of rows x keys of the scores
    /// and the same rows of the output from shared memory, the rows' running maxima and sums
    /// combined by shuffles among the lanes that share them.
    AttentionTiled,
    /// Attention in one launch on the tensor cores (bf16 or f16 Q, K and V): a block of 16-row
    /// warps steps through the keys, the scores and the output by `mma.m16n8k16`, the online
    /// softmax in f32 on the accumulator fragments, the probabilities reused in registers as
    /// the second product's A (`attention_mma.rs`).
    AttentionMma,
    /// A transpose (or a gather that is one) through shared-memory tiles: each block stages
    /// a tile of warp-size x warp-size elements of the output dimension its inputs are
    /// contiguous along and the innermost one, computing them with the warp along the first
    /// (coalesced reads) and writing them with the warp along the second (coalesced writes),
    /// the tile's rows padded by one element so neither phase has bank conflicts
    /// (`transpose.rs`).
    TransposeTiles,
    /// A scatter, its updates combined in order: a thread per position of the update
    /// dimensions that address whole output dimensions alone, else a thread per output
    /// element scanning few updates, else the updates sorted by target (a launch of their
    /// targets, the sort's launches, a thread per element combining its run), else one
    /// thread.
    Scatter,
    /// With float atomics allowed: a full reduction's blocks (as [`MapKind::SplitPartials`]
    /// has them) each adding its partial sum into the result (zeroed first) by
    /// [`Stmt::AtomicAdd`], in one launch (`map/split.rs`).
    SplitAtomic,
    /// With float atomics allowed: a column reduction's threads (as
    /// [`MapKind::ColumnPartials`] has them) each adding its slice's sum into its column of
    /// the result (zeroed first) by [`Stmt::AtomicAdd`], in one launch.
    ColumnAtomic,
    /// With float atomics allowed: a scatter-add's operand copied (a launch of its own), then
    /// a thread per update adding it into its target by [`Stmt::AtomicAdd`], instead of
    /// sorting the updates (`map/scatter_atomic.rs`).
    ScatterAtomic,
    /// A select-and-scatter: a thread per output element, visiting the windows that cover it
    /// in order (`select_scatter.rs`).
    SelectScatter,
    /// A sort by keys: a block per slice, a bitonic network over the keys and their
    /// positions in shared memory (`sort.rs`); a slice of two blocks' tiles, the network's
    /// stages split between tiles in shared memory and a pass in global memory
    /// (`sort/long.rs`); a longer slice, a radix sort on the keys' order-preserving bits, a
    /// count, a scan and a stable scatter per digit (`sort/radix.rs`).
    Sort,
    /// `cholesky`, `triangular_solve` or `lu`: a thread per matrix (or per right-hand side of
    /// a solve) running the reference's unblocked algorithm on scratch copies (`linalg.rs`).
    Linalg,
}

impl MapKind {
    /// Its name in reports and the printed form.
    pub fn name(self) -> &'static str {
        match self {
            MapKind::Elementwise => "elementwise",
            MapKind::WarpRows => "warp-rows",
            MapKind::BlockRows => "block-rows",
            MapKind::SplitPartials => "split-partials",
            MapKind::ColumnPartials => "column-partials",
            MapKind::Gemm => "gemm",
            MapKind::GemmTiled => "gemm-tiled",
            MapKind::GemmMma => "gemm-mma",
            MapKind::Attention => "attention",
            MapKind::AttentionTiled => "attention-tiles",
            MapKind::AttentionMma => "attention-mma",
            MapKind::TransposeTiles => "transpose-tiles",
            MapKind::Scatter => "scatter",
            MapKind::SplitAtomic => "split-atomic",
            MapKind::ColumnAtomic => "column-atomic",
            MapKind::ScatterAtomic => "scatter-atomic",
            MapKind::SelectScatter => "select-and-scatter",
            MapKind::Sort => "sort",
            MapKind::Linalg => "linalg",
        }
    }
}

/// One launch: a grid of `grid` blocks of `block` threads, each running `body`.
#[derive(Clone, Debug, PartialEq)]
pub struct GpuKernel {
    /// Its name in errors and the printed form.
    pub name: String,
    /// How it was mapped.
    pub kind: MapKind,
    /// Blocks in the grid.
    pub grid: usize,
    /// Threads per block (a multiple of the warp size).
    pub block: usize,
    /// Threads per warp.
    pub warp: usize,
    /// The buffers its expressions load from, by input index, with their types.
    pub inputs: Vec<(Buf, TensorType)>,
    /// The buffers it stores into, by [`Stmt::Store`]'s buffer, with their types.
    pub outputs: Vec<(Buf, TensorType)>,
    /// Its shared-memory arrays, per block.
    pub shared: Vec<SharedArray>,
    /// 0 when its shared arrays are declared statically; else the bytes of the one dynamic
    /// shared array they lie in, at [`GpuKernel::shared_offsets`] (what the launch asks for,
    /// and what the CUDA runtime lets the kernel opt into): their arrays take more than a
    /// kernel may declare statically ([`GpuKernel::place_shared`]).
    pub dynamic_shared: usize,
    /// Registers per thread.
    pub regs: usize,
    /// Kernel loop variables per thread.
    pub vars: usize,
    /// The order float sums inside its expressions run in (a tree of `leaf`-long chains).
    pub sums: SumTree,
    /// The tensor maps its [`Stmt::TmaLoad`]s read: kernel parameters after its buffers,
    /// each the 128-byte descriptor the runtime encodes from this description.
    pub tensor_maps: Vec<TensorMap>,
    /// The thread's program.
    pub body: Vec<Stmt>,
}

/// A kernel mapped to the GPU: launches run in order, sharing scratch buffers.
#[derive(Clone, Debug, PartialEq)]
pub struct GpuProgram {
    /// Scratch buffers in global memory (a GEMM's product before its epilogue).
    pub scratch: Vec<TensorType>,
    /// Buffers (of the types given) set to negative zero, the identity of a float sum, before
    /// the first launch: the results its launches add into by [`Stmt::AtomicAdd`]. Empty
    /// unless the options allow float atomics.
    pub zeroed: Vec<(Buf, TensorType)>,
    /// The launches, in order.
    pub launches: Vec<GpuKernel>,
}

impl GpuProgram {
    /// A program of `launches` over `scratch`, nothing zeroed.
    pub fn new(scratch: Vec<TensorType>, launches: Vec<GpuKernel>) -> GpuProgram {
        GpuProgram {
            scratch,
            zeroed: Vec::new(),
            launches,
        }
    }
}

impl GpuKernel {
    /// Its PTX `.entry` name: its name with every character but letters, digits and `_` as
    /// `_` (what the PTX emitter declares and the CUDA executor looks up).
    pub fn entry_name(&self) -> String {
        self.name
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
            .collect()
    }

    /// Bytes of shared memory per block.
    pub fn shared_bytes(&self) -> usize {
        self.shared.iter().map(|a| a.len * a.elem_bytes()).sum()
    }

    /// Where each shared array starts in one dynamic shared array, in bytes (each at a
    /// multiple of 16, as `cp.async` and `ldmatrix` need, or of 1024 for an array a
    /// [`Stmt::Wgmma`] descriptor names: [`GpuKernel::shared_alignment`]), and the bytes they
    /// take together.
    pub fn shared_offsets(&self) -> (Vec<usize>, usize) {
        let align = self.shared_alignment();
        let mut at = 0usize;
        let offsets = self
            .shared
            .iter()
            .zip(&align)
            .map(|(a, &al)| {
                let start = at.next_multiple_of(al);
                at = (start + a.len * a.elem_bytes()).next_multiple_of(16);
                start
            })
            .collect();
        (offsets, at)
    }

    /// The alignment in bytes of each shared array: 1024 for one a [`Stmt::Wgmma`]'s
    /// descriptor names or a [`Stmt::TmaLoad`] writes (a swizzle pattern repeats every 1024
    /// bytes at most, and works on the address itself), 16 for the others.
    pub fn shared_alignment(&self) -> Vec<usize> {
        fn mark(body: &[Stmt], out: &mut [usize]) {
            for s in body {
                match s {
                    Stmt::Wgmma { a, b, .. } => {
                        for d in [a, b] {
                            if let Some(x) = out.get_mut(d.array) {
                                *x = 1024;
                            }
                        }
                    }
                    Stmt::TmaLoad { array, .. } => {
                        if let Some(x) = out.get_mut(*array) {
                            *x = 1024;
                        }
                    }
                    Stmt::For { body, .. } | Stmt::If { body, .. } => mark(body, out),
                    _ => {}
                }
            }
        }
        let mut out = vec![16; self.shared.len()];
        mark(&self.body, &mut out);
        out
    }

    /// Whether its body has a warpgroup statement ([`Stmt::Wgmma`], its fence, commit or
    /// wait): a kernel for sm_90a.
    pub fn uses_wgmma(&self) -> bool {
        fn any(body: &[Stmt]) -> bool {
            body.iter().any(|s| match s {
                Stmt::Wgmma { .. }
                | Stmt::WgmmaFence
                | Stmt::WgmmaCommit
                | Stmt::WgmmaWait { .. } => true,
                Stmt::For { body, .. } | Stmt::If { body, .. } => any(body),
                _ => false,
            })
        }
        any(&self.body)
    }

    /// Whether its body has an mbarrier or TMA statement: a kernel for sm_90a.
    pub fn uses_tma(&self) -> bool {
        fn any(body: &[Stmt]) -> bool {
            body.iter().any(|s| match s {
                Stmt::MbarInit { .. }
                | Stmt::MbarArrive { .. }
                | Stmt::MbarWait { .. }
                | Stmt::MbarInval { .. }
                | Stmt::TmaLoad { .. } => true,
                Stmt::For { body, .. } | Stmt::If { body, .. } => any(body),
                _ => false,
            })
        }
        any(&self.body)
    }

    /// Decides how its shared arrays are declared on `gpu`: in one dynamic array
    /// ([`GpuKernel::dynamic_shared`]) when they take more than [`Gpu::shared_limit`] and, laid
    /// out, fit what the mappings may take with dynamic shared memory ([`Gpu::tile_limit`]);
    /// else statically (so a kernel too large for both stays too large for the static limit,
    /// which `gpu::print::verify` refuses).
    pub fn place_shared(&mut self, gpu: &Gpu) {
        let laid = self.shared_offsets().1;
        self.dynamic_shared =
            if self.shared_bytes() > gpu.shared_limit() && laid <= gpu.tile_limit() {
                laid
            } else {
                0
            };
    }
}
