//! One warp's tensor-core tile, `D = A x B + C` for a 16 x 16 A and 16 x 8 B, C and D
//! ([`warp_tile`]; a 16 x 8 A and 8 x 8 B of TF32 with [`warp_tile_tf32`]): A and B copied
//! into shared arrays with [`Stmt::CopyAsync`] (then committed, waited for, and a barrier),
//! their fragments loaded with [`Stmt::LdMatrix`] (and rounded with [`Stmt::RoundTf32`] for
//! TF32), one [`Stmt::Mma`], C read and D stored by the accumulator fragment's layout. It is
//! the building block a tensor-core product mapping is made of, and the kernel the
//! tensor-core statements are tested with: on the emulator against the plain product, and
//! through ptxas for sm_80 and sm_90.

use super::ir::*;
use crate::target::SumTree;
use kiln_ir::{DType, TensorType};

/// The launch of one warp computing `D = A x B + C`: input 0 is A (`dtype[16,16]`, row-major),
/// input 1 is B stored by columns (`dtype[8,16]`: B's column `n` is row `n`), input 2 is C
/// (`f32[16,8]`), output 0 is D (`f32[16,8]`); `dtype` is bf16 or f16 (another is taken as
/// bf16).
pub fn warp_tile(dtype: DType, sums: SumTree) -> GpuKernel {
    let t = |dtype, shape: &[usize]| TensorType {
        dtype,
        shape: shape.to_vec(),
    };
    let a: [usize; 8] = std::array::from_fn(|i| 2 + i);
    let b: [usize; 8] = std::array::from_fn(|i| 10 + i);
    let c: [usize; 4] = std::array::from_fn(|i| 18 + i);
    let d: [usize; 4] = std::array::from_fn(|i| 22 + i);
    let lane = || Sc::Special(Special::Lane);
    let k = |x: i64| Sc::Const(x);
    // Each lane copies 8 of A's elements (16 bytes) and 4 of B's (8 bytes), asynchronously.
    let stage = |input: usize, array: usize, elems: usize| Stmt::CopyAsync {
        array,
        index: Sc::times(lane(), k(elems as i64)),
        buf: Buf::Input(input),
        src: Sc::times(lane(), k(elems as i64)),
        elems,
    };
    let mut body = vec![
        stage(0, 0, 8),
        stage(1, 1, 4),
        Stmt::CopyCommit,
        Stmt::CopyWait { pending: 0 },
        Stmt::Barrier,
        // A's matrices, then B's columns 0-7 over contraction 0-7 and 8-15.
        a_fragments(a.to_vec(), 16),
        b_fragments(b.to_vec(), 16),
    ];
    for (i, &r) in c.iter().enumerate() {
        body.push(Stmt::Load {
            reg: r,
            buf: Buf::Input(2),
            index: acc_at(i),
        });
    }
    let operand = MmaOperand::of_half(dtype).unwrap_or(MmaOperand::Bf16);
    body.push(Stmt::Mma {
        d,
        a: a.to_vec(),
        b: b[..4].to_vec(),
        c,
        shape: operand.shape(),
        operand,
    });
    for (i, &r) in d.iter().enumerate() {
        body.push(Stmt::Store {
            buf: Buf::Output(0),
            index: acc_at(i),
            value: r,
        });
    }
    GpuKernel {
        tensor_maps: Vec::new(),
        dynamic_shared: 0,
        name: format!("warp_tile_{dtype}"),
        kind: MapKind::GemmMma,
        grid: 1,
        block: 32,
        warp: 32,
        inputs: vec![
            (Buf::Input(0), t(dtype, &[16, 16])),
            (Buf::Input(1), t(dtype, &[8, 16])),
            (Buf::Input(2), t(DType::F32, &[16, 8])),
        ],
        outputs: vec![(Buf::Output(0), t(DType::F32, &[16, 8]))],
        shared: vec![
            SharedArray {
                dtype,
                len: 256,
                packed: true,
                swizzle: None,
            },
            SharedArray {
                dtype,
                len: 128,
                packed: true,
                swizzle: None,
            },
        ],
        regs: 26,
        vars: 0,
        sums,
        body,
    }
}

/// The launch of one warp computing `D = A x B + C` on TF32 tensor cores (`mma.m16n8k8`):
/// input 0 is A (`f32[16,8]`, row-major), input 1 is B stored by columns (`f32[8,8]`: B's
/// column `n` is row `n`), input 2 is C (`f32[16,8]`), output 0 is D (`f32[16,8]`). A and B
/// are copied into f32 shared arrays, their fragments loaded with `ldmatrix.x4` (8 x 4
/// matrices of f32: A's four quarters, B's contraction 0-3 and 4-7, twice) and rounded to TF32
/// in their registers, so D is the product of the rounded operands.
pub fn warp_tile_tf32(sums: SumTree) -> GpuKernel {
    let t = |shape: &[usize]| TensorType {
        dtype: DType::F32,
        shape: shape.to_vec(),
    };
    let a: [usize; 4] = std::array::from_fn(|i| i);
    let b: [usize; 4] = std::array::from_fn(|i| 4 + i);
    let c: [usize; 4] = std::array::from_fn(|i| 8 + i);
    let d: [usize; 4] = std::array::from_fn(|i| 12 + i);
    let lane = || Sc::Special(Special::Lane);
    let k = |x: i64| Sc::Const(x);
    // Each lane copies 4 of A's elements (16 bytes); lanes 0-15 copy B's 64.
    let stage = |input: usize, array: usize| Stmt::CopyAsync {
        array,
        index: Sc::times(lane(), k(4)),
        buf: Buf::Input(input),
        src: Sc::times(lane(), k(4)),
        elems: 4,
    };
    let mut body = vec![
        stage(0, 0),
        Stmt::If {
            cond: Sc::lt(lane(), k(16)),
            body: vec![stage(1, 1)],
        },
        Stmt::CopyCommit,
        Stmt::CopyWait { pending: 0 },
        Stmt::Barrier,
        // A's matrices, then B's columns 0-7 over contraction 0-3 and 4-7.
        a_fragments(a.to_vec(), 8),
        b_fragments(b.to_vec(), 8),
    ];
    for &r in a.iter().chain(&b[..2]) {
        body.push(Stmt::RoundTf32 { reg: r });
    }
    for (i, &r) in c.iter().enumerate() {
        body.push(Stmt::Load {
            reg: r,
            buf: Buf::Input(2),
            index: acc_at(i),
        });
    }
    body.push(Stmt::Mma {
        d,
        a: a.to_vec(),
        b: b[..2].to_vec(),
        c,
        shape: MmaOperand::Tf32.shape(),
        operand: MmaOperand::Tf32,
    });
    for (i, &r) in d.iter().enumerate() {
        body.push(Stmt::Store {
            buf: Buf::Output(0),
            index: acc_at(i),
            value: r,
        });
    }
    let shared = |len: usize| SharedArray {
        dtype: DType::F32,
        len,
        packed: false,
        swizzle: None,
    };
    GpuKernel {
        tensor_maps: Vec::new(),
        dynamic_shared: 0,
        name: "warp_tile_tf32".into(),
        kind: MapKind::GemmMma,
        grid: 1,
        block: 32,
        warp: 32,
        inputs: vec![
            (Buf::Input(0), t(&[16, 8])),
            (Buf::Input(1), t(&[8, 8])),
            (Buf::Input(2), t(&[16, 8])),
        ],
        outputs: vec![(Buf::Output(0), t(&[16, 8]))],
        shared: vec![shared(128), shared(64)],
        regs: 16,
        vars: 0,
        sums,
        body,
    }
}

/// This lane's accumulator element `i`: row `g + 8 (i / 2)`, column `2t + i % 2` (`g = lane /
/// 4`, `t = lane % 4`), row-major in an 8-column matrix.
fn acc_at(i: usize) -> Sc {
    let (lane, k) = (|| Sc::Special(Special::Lane), Sc::Const);
    let row = Sc::plus(Sc::quot(lane(), k(4)), k(8 * (i as i64 / 2)));
    let col = Sc::plus(Sc::times(Sc::modulo(lane(), k(4)), k(2)), k(i as i64 % 2));
    Sc::plus(Sc::times(row, k(8)), col)
}

/// A's fragments from shared array 0 (16 rows of `width` elements): matrix `j = lane / 8`
/// covers rows `8 (j % 2)..` and columns `(width / 2) (j / 2)..`.
fn a_fragments(regs: Vec<usize>, width: i64) -> Stmt {
    let (lane, k) = (|| Sc::Special(Special::Lane), Sc::Const);
    Stmt::LdMatrix {
        regs,
        array: 0,
        trans: false,
        row: Sc::plus(
            Sc::times(
                Sc::plus(
                    Sc::modulo(lane(), k(8)),
                    Sc::times(Sc::modulo(Sc::quot(lane(), k(8)), k(2)), k(8)),
                ),
                k(width),
            ),
            Sc::times(Sc::quot(lane(), k(16)), k(width / 2)),
        ),
    }
}

/// B's fragments from shared array 1 (B's 8 columns as rows of `width` elements): its
/// columns over the two halves of the contraction (matrices 0 and 1; 2 and 3 repeat them).
fn b_fragments(regs: Vec<usize>, width: i64) -> Stmt {
    let (lane, k) = (|| Sc::Special(Special::Lane), Sc::Const);
    Stmt::LdMatrix {
        regs,
        array: 1,
        trans: false,
        row: Sc::plus(
            Sc::times(Sc::modulo(lane(), k(8)), k(width)),
            Sc::times(Sc::modulo(Sc::quot(lane(), k(8)), k(2)), k(width / 2)),
        ),
    }
}
