//! One warpgroup's tensor-core tile on sm_90a, `D = A x B + C` for a 64 x `k` A and `k` x `n`
//! B, C and D ([`warpgroup_tile`]): A and B copied with [`Stmt::CopyAsync`] into shared
//! arrays laid out as the descriptors describe them ([`TileLayout`], each 16-byte chunk where
//! its swizzle puts it), the copies waited for and made visible to the async proxy
//! ([`Stmt::ProxyFence`]) before a barrier, C loaded into the accumulators by their fragment
//! layout ([`acc_row`], [`acc_col`]), a [`Stmt::WgmmaFence`], one [`Stmt::Wgmma`] per 16
//! contraction steps (each descriptor starting 16 steps further along the rows), committed
//! and waited for, and D stored by the same layout. It is the building block of a warpgroup
//! product mapping and the kernel the warpgroup statements are tested with: on the emulator
//! against the plain product, and through ptxas for sm_90a.

use super::desc::{MatrixDesc, TileLayout, WgSwizzle};
use super::ir::*;
use crate::target::SumTree;
use kiln_ir::{DType, TensorType};

/// Threads of a warpgroup.
pub const WARPGROUP: usize = 128;

/// The row of the 64 x `n` accumulator tile that accumulator `i` of this thread holds (warp
/// `w` of its warpgroup: rows `16w..16w + 16`; `g = lane / 4`): `16w + g + 8 ((i % 4) / 2)`.
pub fn acc_row(i: usize) -> Sc {
    let (t, k) = (Sc::Special(Special::Thread), Sc::Const);
    let in_group = Sc::modulo(t, k(WARPGROUP as i64));
    Sc::plus(
        Sc::plus(
            Sc::times(Sc::quot(in_group.clone(), k(32)), k(16)),
            Sc::quot(Sc::modulo(in_group, k(32)), k(4)),
        ),
        k(8 * ((i as i64 % 4) / 2)),
    )
}

/// The column accumulator `i` of this thread holds: `8 (i / 4) + 2 (lane % 4) + i % 2`.
pub fn acc_col(i: usize) -> Sc {
    let k = Sc::Const;
    Sc::plus(
        Sc::times(Sc::modulo(Sc::Special(Special::Lane), k(4)), k(2)),
        k(8 * (i as i64 / 4) + i as i64 % 2),
    )
}

/// The statements that copy global input `input` (from element 0) into shared `array` laid
/// out as `tile`, 8 elements (one 16-byte chunk) a `cp.async`, the block's `threads` threads
/// taking chunks in turn; `reg` is the loop register. The input is the tile row-major: `rows
/// x k` when K-major, `k x rows` when MN-major (its contiguous dimension the tile's).
pub fn stage(input: usize, array: usize, tile: &TileLayout, threads: usize, reg: usize) -> Stmt {
    let k = Sc::Const;
    let chunk = Sc::Reg(reg);
    let cols = if tile.mn_major { tile.rows } else { tile.k };
    let per_row = (cols / 8) as i64;
    let row = Sc::quot(chunk.clone(), k(per_row));
    let col = Sc::times(Sc::modulo(chunk.clone(), k(per_row)), k(8));
    let index = if tile.mn_major {
        tile.place_sc(col, row)
    } else {
        tile.place_sc(row, col)
    };
    Stmt::For {
        reg,
        start: Sc::Special(Special::Thread),
        end: k((tile.elems() / 8) as i64),
        step: k(threads as i64),
        body: vec![Stmt::CopyAsync {
            array,
            index,
            buf: Buf::Input(input),
            src: Sc::times(chunk, k(8)),
            elems: 8,
        }],
    }
}

/// The descriptor of rows `row..` of `tile` (shared `array`) at contraction step `k`.
pub fn desc(array: usize, tile: &TileLayout, row: usize, k: usize) -> MatrixDesc {
    let (lbo, sbo) = tile.strides();
    MatrixDesc {
        array,
        start: Sc::Const(tile.desc_start(row, k) as i64),
        lbo,
        sbo,
        swizzle: tile.swizzle,
        mn_major: tile.mn_major,
    }
}

/// The launch of one warpgroup computing `D = A x B + C`: input 0 is A (`dtype[64,k]`,
/// row-major), input 1 is B stored by columns (`dtype[n,k]`: B's column `j` is row `j`,
/// K-major), or by rows with `b_mn_major` (`dtype[k,n]`, staged MN-major), input 2 is C
/// (`f32[64,n]`), output 0 is D (`f32[64,n]`); `dtype` is bf16 or f16 (another is taken as
/// bf16), `n` a multiple of 8 up to 256 (of a swizzled row's elements, `W / 2`, for B
/// MN-major), `k` a multiple of 16 and of `W / 2`. `None` when the shape does not fit.
pub fn warpgroup_tile(
    dtype: DType,
    (n, k): (usize, usize),
    swizzle: WgSwizzle,
    b_mn_major: bool,
    sums: SumTree,
) -> Option<GpuKernel> {
    let operand = MmaOperand::of_half(dtype).unwrap_or(MmaOperand::Bf16);
    let dtype = operand.dtype();
    let ta = TileLayout {
        rows: 64,
        k,
        swizzle,
        mn_major: false,
    };
    let tb = TileLayout {
        rows: n,
        k,
        swizzle,
        mn_major: b_mn_major,
    };
    if !ta.valid() || !tb.valid() || n > 256 {
        return None;
    }
    let t = |dtype, shape: &[usize]| TensorType {
        dtype,
        shape: shape.to_vec(),
    };
    let acc: Vec<usize> = (0..n / 2).collect();
    let looping = n / 2;
    let c = Sc::Const;
    let at = |i: usize| Sc::plus(Sc::times(acc_row(i), c(n as i64)), acc_col(i));
    let mut body = vec![
        stage(0, 0, &ta, WARPGROUP, looping),
        stage(1, 1, &tb, WARPGROUP, looping),
        Stmt::CopyCommit,
        Stmt::CopyWait { pending: 0 },
        Stmt::ProxyFence,
        Stmt::Barrier,
    ];
    for (i, &r) in acc.iter().enumerate() {
        body.push(Stmt::Load {
            reg: r,
            buf: Buf::Input(2),
            index: at(i),
        });
    }
    body.push(Stmt::WgmmaFence);
    for s in 0..k / 16 {
        body.push(Stmt::Wgmma {
            acc: acc.clone(),
            a: desc(0, &ta, 0, 16 * s),
            b: desc(1, &tb, 0, 16 * s),
            n,
            operand,
        });
    }
    body.push(Stmt::WgmmaCommit);
    body.push(Stmt::WgmmaWait { pending: 0 });
    for (i, &r) in acc.iter().enumerate() {
        body.push(Stmt::Store {
            buf: Buf::Output(0),
            index: at(i),
            value: r,
        });
    }
    let shared = |len: usize| SharedArray {
        dtype,
        len,
        packed: true,
        swizzle: None,
    };
    Some(GpuKernel {
        tensor_maps: Vec::new(),
        dynamic_shared: 0,
        name: format!(
            "warpgroup_tile_{dtype}_n{n}_k{k}_{}{}",
            swizzle.name(),
            if b_mn_major { "_b_mn" } else { "" }
        ),
        kind: MapKind::GemmMma,
        grid: 1,
        block: WARPGROUP,
        warp: 32,
        inputs: vec![
            (Buf::Input(0), t(dtype, &[64, k])),
            (
                Buf::Input(1),
                t(dtype, &if b_mn_major { [k, n] } else { [n, k] }),
            ),
            (Buf::Input(2), t(DType::F32, &[64, n])),
        ],
        outputs: vec![(Buf::Output(0), t(DType::F32, &[64, n]))],
        shared: vec![shared(ta.elems()), shared(tb.elems())],
        regs: n / 2 + 1,
        vars: 0,
        sums,
        body,
    })
}
