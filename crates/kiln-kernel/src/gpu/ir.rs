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

use crate::ir::Expr;
use crate::target::SumTree;
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
    /// elements from a packed shared array ([`SharedArray::packed`]). Lane `l` names, in
    /// `row`, the element where row `l % 8` of matrix `l / 8` starts (8 consecutive
    /// elements). Lane `l` then holds, in `regs[2j]` and `regs[2j + 1]`, elements
    /// `2 (l % 4)` and `2 (l % 4) + 1` of row `l / 4` of matrix `j`: with the four matrices
    /// the quarters of a 16 x 16 tile (rows 0-7 and 8-15 of columns 0-7, then of columns
    /// 8-15), exactly the A fragment of [`Stmt::Mma`].
    ///
    /// With `trans` (`ldmatrix...x4.trans`) each matrix is transposed as it loads: lane `l`
    /// holds, in `regs[2j]` and `regs[2j + 1]`, elements `l / 4` of rows `2 (l % 4)` and
    /// `2 (l % 4) + 1` of matrix `j`: with rows along the contraction and 8 columns each, the
    /// B fragment of [`Stmt::Mma`] read from B stored by rows.
    LdMatrix {
        /// The eight value registers written (f32 registers holding the 16-bit values).
        regs: [usize; 8],
        /// The packed shared array.
        array: usize,
        /// This lane's row start (an element index).
        row: Sc,
        /// Each matrix transposed.
        trans: bool,
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
    /// `mma.sync.aligned.m16n8k16.row.col.f32.{bf16,f16}.{bf16,f16}.f32`: the whole warp
    /// computes `D = A x B + C` for a 16 x 16 A, a 16 x 8 B and 16 x 8 C and D, products and
    /// sums in f32, operands rounded to `dtype` (bf16 or f16). With `g = lane / 4` and
    /// `t = lane % 4`, a lane holds (the PTX ISA's fragment layouts):
    /// - `a[i]`: A's row `g + 8 ((i / 2) % 2)`, column `2t + i % 2 + 8 (i / 4)`;
    /// - `b[i]`: B's row `2t + i % 2 + 8 (i / 2)`, column `g`;
    /// - `c[i]` and `d[i]`: row `g + 8 (i / 2)`, column `2t + i % 2`.
    Mma {
        /// The result's registers (f32).
        d: [usize; 4],
        /// A's registers.
        a: [usize; 8],
        /// B's registers.
        b: [usize; 4],
        /// The addend's registers (f32; may be `d`'s).
        c: [usize; 4],
        /// The operands' dtype: bf16 or f16.
        dtype: DType,
    },
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
    /// A swizzled layout (packed arrays only): the array's 16-byte chunk `c` lies at chunk
    /// `c ^ ((c >> s) & 7)`, `s` this value, so that the same chunk of 8 consecutive rows of
    /// `2^s` chunks or fewer (what one `ldmatrix` matrix reads, and what `cp.async` writes)
    /// falls in 8 different bank groups instead of one. Indices stay logical everywhere in
    /// the kernel (the emulator runs them as they are); the PTX emitter renders the layout
    /// at each access. A chunk moves only within its aligned group of 8, so the array's
    /// length is a multiple of 8 chunks.
    pub swizzle: Option<u32>,
}

impl SharedArray {
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
    /// A matrix product, one thread per output element over the contraction.
    Gemm,
    /// A matrix product by block tiles: A's and B's tiles staged through shared memory, each
    /// thread accumulating a register tile of the result.
    GemmTiled,
    /// A matrix product on the tensor cores: bf16 or f16 tiles staged through shared memory,
    /// `ldmatrix` and `mma.m16n8k16` per warp, f32 accumulators.
    GemmMma,
    /// Attention in one launch (a product, its online softmax and the chained product): a
    /// warp per query row, keys and values staged through shared memory 32 at a time, the
    /// row's running maximum and sum kept in registers.
    Attention,
    /// A scatter, on one thread, in order.
    Scatter,
    /// A select-and-scatter, on one thread, in order.
    SelectScatter,
    /// A sort by keys: a block per slice, a bitonic network over the keys and their
    /// positions in shared memory (`sort.rs`); a slice of two blocks' tiles, the network's
    /// stages split between tiles in shared memory and a pass in global memory
    /// (`sort/long.rs`); a longer slice, a radix sort on the keys' order-preserving bits, a
    /// count, a scan and a stable scatter per digit (`sort/radix.rs`).
    Sort,
}

impl MapKind {
    /// Its name in reports and the printed form.
    pub fn name(self) -> &'static str {
        match self {
            MapKind::Elementwise => "elementwise",
            MapKind::WarpRows => "warp-rows",
            MapKind::BlockRows => "block-rows",
            MapKind::Gemm => "gemm",
            MapKind::GemmTiled => "gemm-tiled",
            MapKind::GemmMma => "gemm-mma",
            MapKind::Attention => "attention",
            MapKind::Scatter => "scatter",
            MapKind::SelectScatter => "select-and-scatter",
            MapKind::Sort => "sort",
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
    /// Registers per thread.
    pub regs: usize,
    /// Kernel loop variables per thread.
    pub vars: usize,
    /// The order float sums inside its expressions run in (a tree of `leaf`-long chains).
    pub sums: SumTree,
    /// The thread's program.
    pub body: Vec<Stmt>,
}

/// A kernel mapped to the GPU: launches run in order, sharing scratch buffers.
#[derive(Clone, Debug, PartialEq)]
pub struct GpuProgram {
    /// Scratch buffers in global memory (a GEMM's product before its epilogue).
    pub scratch: Vec<TensorType>,
    /// The launches, in order.
    pub launches: Vec<GpuKernel>,
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
        self.shared
            .iter()
            .map(|a| {
                let bytes = a.dtype.bits().div_ceil(8) as usize;
                a.len * if a.packed { bytes } else { bytes.max(4) }
            })
            .sum()
    }
}
