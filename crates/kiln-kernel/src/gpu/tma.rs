//! TMA tile loads (sm_90a): [`Stmt::TmaLoad`] copies a box of a 2-D tensor from global into
//! shared memory as the tensor map describes it ([`TensorMap`]), completing its bytes on an
//! mbarrier ([`crate::gpu::mbarrier`]).
//!
//! A tensor map is a kernel parameter (`.param .align 64 .b8 [128]`, `__grid_constant__`):
//! the runtime encodes the description below with `cuTensorMapEncodeTiled` (the launch
//! input's address, its dtype, dimensions, row stride, the box and the swizzle; no
//! interleave, element strides 1, out-of-bounds elements filled with zeros) and the GPU
//! emulator reads the same description. The box lands densely: its element `(r, c)` (row
//! `r`, column `c`) at byte `r·B + c·e` from the destination (`B` the box's row bytes, `e`
//! the element's), that address then swizzled as [`WgSwizzle::apply`] says (the 16-byte
//! chunk bits XORed with the bits from 7 up): the layout a `wgmma` descriptor of the same
//! swizzle reads, a row of the box being a row of a swizzle atom when `B` is the swizzle's
//! width (which a swizzled map requires). The destination is a multiple of 128 bytes, and
//! the arrays a TMA writes are aligned to 1024 bytes
//! ([`crate::gpu::ir::GpuKernel::shared_alignment`]), so the swizzle can be computed from
//! the offset within the array.
//!
//! Every byte of the box counts toward the transaction, those past the tensor's edges (read
//! as zeros) too, so the `expect_tx` of a ragged box is the whole box's bytes.
//!
//! [`tma_tile`] is the kernel the loads are tested with (a box read back through the
//! swizzle), and [`tma_warpgroup_tile`] one warpgroup's product
//! ([`crate::gpu::wgmma::warpgroup_tile`]) with its operands loaded by TMA: the swizzles
//! agree with what the descriptors read.
//!
//! [`Stmt::TmaLoad`]: crate::gpu::ir::Stmt::TmaLoad

use super::desc::{TileLayout, WgSwizzle};
use super::ir::*;
use super::wgmma::{WARPGROUP, warpgroup_tile};
use crate::target::SumTree;
use kiln_ir::{DType, TensorType};

/// A 2-D tensor as a TMA reads it: the launch's input `input` of `dtype`, `dims` elements
/// (columns, then rows), rows `row_stride` bytes apart, copied in boxes of `box_dims`
/// (columns, then rows) laid out with `swizzle`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorMap {
    /// The launch input whose elements it addresses (`Buf::Input(input)`).
    pub input: usize,
    /// Its elements' dtype: bf16, f16, f32 (the input's).
    pub dtype: DType,
    /// Elements per dimension, innermost first: columns, rows.
    pub dims: [usize; 2],
    /// Bytes from one row to the next (a multiple of 16).
    pub row_stride: usize,
    /// The box, innermost first: columns (its row, a multiple of 16 bytes; the swizzle's
    /// width when swizzled), rows (each at most 256).
    pub box_dims: [usize; 2],
    /// How the box is laid out in shared memory.
    pub swizzle: WgSwizzle,
}

impl TensorMap {
    /// Bytes of one element.
    pub fn elem_bytes(&self) -> usize {
        self.dtype.bits().div_ceil(8) as usize
    }

    /// Bytes of one box (what a load completes on its barrier).
    pub fn box_bytes(&self) -> usize {
        self.box_dims[0] * self.box_dims[1] * self.elem_bytes()
    }

    /// Why the description is not one `cuTensorMapEncodeTiled` takes (or kiln lays out), if
    /// it is not.
    pub fn check(&self) -> Result<(), String> {
        let e = self.elem_bytes();
        let row = self.box_dims[0] * e;
        let fail = |why: &str| Err(format!("a tensor map {self:?}: {why}"));
        if !matches!(self.dtype, DType::BF16 | DType::F16 | DType::F32) {
            return fail("elements of bf16, f16 or f32");
        }
        if self.dims.iter().any(|&d| d == 0 || d > 1 << 32) {
            return fail("dimensions from 1 to 2^32");
        }
        if !self.row_stride.is_multiple_of(16)
            || self.row_stride < self.dims[0] * e
            || self.row_stride >= 1 << 40
        {
            return fail("a row stride, a multiple of 16 bytes below 2^40, of a whole row");
        }
        if self.box_dims.iter().any(|&b| b == 0 || b > 256) {
            return fail("box dimensions from 1 to 256");
        }
        if !row.is_multiple_of(16) {
            return fail("a box row of a multiple of 16 bytes");
        }
        if self.swizzle != WgSwizzle::None && row != self.swizzle.row_bytes() {
            return fail("a swizzled box row as wide as the swizzle");
        }
        Ok(())
    }

    /// The byte offset, from a destination aligned to the swizzle's pattern, where element
    /// `(r, c)` of the box lands.
    pub fn place(&self, r: usize, c: usize) -> usize {
        let e = self.elem_bytes();
        self.swizzle.apply(r * self.box_dims[0] * e + c * e)
    }

    /// [`TensorMap::place`] in elements, as thread-level arithmetic.
    pub fn place_sc(&self, r: Sc, c: Sc) -> Sc {
        let e = self.elem_bytes() as i64;
        let k = Sc::Const;
        let bytes = Sc::plus(
            Sc::times(r, k(self.box_dims[0] as i64 * e)),
            Sc::times(c, k(e)),
        );
        Sc::quot(self.swizzle.apply_sc(bytes), k(e))
    }
}

/// The launch that loads one box of a `rows x cols` tensor of `dtype` (input 0, row-major)
/// at `coords` (column, row; either may be negative or run past the edge) with `swizzle`,
/// `box_dims` (columns, rows), and writes it, read back through the swizzle, to output 0
/// (`dtype[box rows, box columns]`): thread 0 initializes an mbarrier, arrives expecting
/// the box's bytes and starts the load; every thread waits on phase 0 and copies elements
/// out. `None` when the map does not check.
pub fn tma_tile(
    dtype: DType,
    (rows, cols): (usize, usize),
    box_dims: [usize; 2],
    coords: [i64; 2],
    swizzle: WgSwizzle,
    sums: SumTree,
) -> Option<GpuKernel> {
    let map = TensorMap {
        input: 0,
        dtype,
        dims: [cols, rows],
        row_stride: (cols * (dtype.bits() as usize / 8)).next_multiple_of(16),
        box_dims,
        swizzle,
    };
    map.check().ok()?;
    let c = Sc::Const;
    let tid = Sc::Special(Special::Thread);
    let bar = Mbar {
        array: 1,
        index: c(0),
    };
    let [bc, br] = box_dims;
    let (i, v) = (0, 1);
    let at = Sc::Reg(i);
    let body = vec![
        Stmt::If {
            cond: Sc::eq(tid.clone(), c(0)),
            body: vec![Stmt::MbarInit {
                bar: bar.clone(),
                count: 1,
            }],
        },
        Stmt::Barrier,
        Stmt::If {
            cond: Sc::eq(tid.clone(), c(0)),
            body: vec![
                Stmt::MbarArrive {
                    bar: bar.clone(),
                    tx: map.box_bytes(),
                },
                Stmt::TmaLoad {
                    map: 0,
                    array: 0,
                    index: c(0),
                    coords: coords.map(c),
                    bar: bar.clone(),
                },
            ],
        },
        Stmt::MbarWait {
            bar: bar.clone(),
            parity: c(0),
        },
        Stmt::For {
            reg: i,
            start: tid.clone(),
            end: c((bc * br) as i64),
            step: c(WARPGROUP as i64),
            body: vec![
                Stmt::SharedLoad {
                    reg: v,
                    array: 0,
                    index: map.place_sc(
                        Sc::quot(at.clone(), c(bc as i64)),
                        Sc::modulo(at.clone(), c(bc as i64)),
                    ),
                },
                Stmt::Store {
                    buf: Buf::Output(0),
                    index: at,
                    value: v,
                },
            ],
        },
        Stmt::Barrier,
        Stmt::If {
            cond: Sc::eq(tid, c(0)),
            body: vec![Stmt::MbarInval { bar }],
        },
    ];
    let t = |shape: &[usize]| TensorType {
        dtype,
        shape: shape.to_vec(),
    };
    Some(GpuKernel {
        name: format!(
            "tma_tile_{dtype}_{rows}x{cols}_box{bc}x{br}_at{}_{}_{}",
            coords[0],
            coords[1],
            swizzle.name()
        )
        .replace('-', "m"),
        kind: MapKind::Elementwise,
        grid: 1,
        block: WARPGROUP,
        warp: 32,
        inputs: vec![(Buf::Input(0), t(&[rows, cols]))],
        outputs: vec![(Buf::Output(0), t(&[br, bc]))],
        shared: vec![
            SharedArray {
                dtype,
                len: (bc * br).next_multiple_of(64),
                packed: true,
                swizzle: None,
            },
            SharedArray::mbarriers(1),
        ],
        dynamic_shared: 0,
        regs: 2,
        vars: 0,
        sums,
        tensor_maps: vec![map],
        body,
    })
}

/// One warpgroup's `D = A x B + C` ([`warpgroup_tile`], B K-major) with A and B loaded by
/// TMA instead of `cp.async`: each operand's columns of swizzle atoms (`W / 2` contraction
/// steps each) one box, landing where [`TileLayout`] puts them; thread 0 initializes the
/// barrier and arrives expecting every box's bytes, all threads wait on phase 0. `swizzle`
/// is 32, 64 or 128 bytes (`None` otherwise, or when the tile does not fit).
pub fn tma_warpgroup_tile(
    dtype: DType,
    (n, k): (usize, usize),
    swizzle: WgSwizzle,
    sums: SumTree,
) -> Option<GpuKernel> {
    if swizzle == WgSwizzle::None {
        return None;
    }
    let mut kernel = warpgroup_tile(dtype, (n, k), swizzle, false, sums)?;
    // The cp.async staging: two loops, the commit, the wait, the proxy fence, the barrier.
    let staged = kernel
        .body
        .iter()
        .position(|s| matches!(s, Stmt::Barrier))?;
    let dtype = kernel.inputs[0].1.dtype;
    let c = Sc::Const;
    let tid = Sc::Special(Special::Thread);
    let bar_array = kernel.shared.len();
    kernel.shared.push(SharedArray::mbarriers(1));
    let bar = Mbar {
        array: bar_array,
        index: c(0),
    };
    let p = swizzle.row_bytes() / 2;
    let mut loads = Vec::new();
    for (operand, rows) in [(0, 64), (1, n)] {
        let tile = TileLayout {
            rows,
            k,
            swizzle,
            mn_major: false,
        };
        kernel.tensor_maps.push(TensorMap {
            input: operand,
            dtype,
            dims: [k, rows],
            row_stride: 2 * k,
            box_dims: [p, rows],
            swizzle,
        });
        for col in 0..k / p {
            loads.push(Stmt::TmaLoad {
                map: operand,
                array: operand,
                index: c(tile.place(0, col * p) as i64),
                coords: [c((col * p) as i64), c(0)],
                bar: bar.clone(),
            });
        }
    }
    let tx: usize = kernel
        .tensor_maps
        .iter()
        .map(|m| m.box_bytes() * (k / p))
        .sum();
    let mut prefix = vec![
        Stmt::If {
            cond: Sc::eq(tid.clone(), c(0)),
            body: vec![Stmt::MbarInit {
                bar: bar.clone(),
                count: 1,
            }],
        },
        Stmt::Barrier,
        Stmt::If {
            cond: Sc::eq(tid, c(0)),
            body: std::iter::once(Stmt::MbarArrive {
                bar: bar.clone(),
                tx,
            })
            .chain(loads)
            .collect(),
        },
        Stmt::MbarWait { bar, parity: c(0) },
    ];
    prefix.extend(kernel.body.drain(staged + 1..));
    kernel.body = prefix;
    kernel.name = kernel
        .name
        .replacen("warpgroup_tile", "tma_warpgroup_tile", 1);
    Some(kernel)
}
