//! Warpgroup matrix descriptors: how a [`Stmt::Wgmma`] finds its A and B in shared memory.
//!
//! A `wgmma.mma_async` (sm_90a) reads both operands from shared memory through a 64-bit
//! matrix descriptor each ([`MatrixDesc`]): the operand's start address, two byte strides and
//! a swizzle mode. kiln stores both operands K-major (A by rows, B by columns: a row of the
//! operand holds its contraction), so an operand of `R` rows (64 for A, `N` for B) and 16
//! contraction steps of 16-bit elements is `R` rows of 32 bytes, made of 16-byte chunks of 8
//! elements. The PTX ISA places element `(row, k)` (`row = 8i + r`, `k = 8j + e`) at:
//!
//! - without swizzle, in "core matrices" of 8 rows of one chunk (128 contiguous bytes):
//!   `start + i·SBO + j·LBO + 16r + 2e` (LBO: from one core matrix to the next along the
//!   contraction; SBO: to the next 8 rows);
//! - with a swizzle of `W` bytes (32, 64 or 128), in atoms of 8 rows of `W` bytes (`8W`
//!   contiguous bytes, the 32 bytes of a row's contraction within one atom row): the address
//!   `x = start + i·SBO + W·r + 16j + 2e`, its chunk bits (4 and up, `log2(W / 16)` of them)
//!   then XORed with as many bits from bit 7 up ([`WgSwizzle::apply`]): the same chunk of the 8
//!   rows of an atom falls in different banks. LBO is not used.
//!
//! The swizzle works on the address itself, so a swizzled operand's atoms start at multiples
//! of `8W` bytes; kiln aligns every shared array a descriptor names to 1024 bytes
//! ([`crate::gpu::ir::GpuKernel::shared_offsets`]), and a descriptor's start lies in the first
//! row of an atom (its offset within the row selects the contraction step), so the matrix
//! base offset field stays 0.
//!
//! An operand may also be MN-major (`imm-trans` 1: A by columns, B by rows, a contraction
//! step's rows contiguous): see [`TileLayout`] for the arithmetic; the descriptor says which
//! ([`MatrixDesc::mn_major`]).
//!
//! The descriptor's fields ([`descriptor`]): bits 0-13 the start address's bits 4-17, bits
//! 16-29 LBO / 16, bits 32-45 SBO / 16, bits 49-51 the base offset (0), bits 62-63 the swizzle
//! mode (0 none, 1 128 bytes, 2 64 bytes, 3 32 bytes). This module only encodes; the GPU
//! emulator decodes the bits itself and applies the address arithmetic above, so an encoding
//! and a layout that disagree show there.
//!
//! [`Stmt::Wgmma`]: crate::gpu::ir::Stmt::Wgmma

use super::ir::Sc;

/// The swizzle mode of a [`MatrixDesc`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum WgSwizzle {
    /// Core matrices of 8 rows of 16 bytes, placed by LBO and SBO.
    None,
    /// Atoms of 8 rows of 32 bytes, chunk bit 4 XORed with bit 7.
    B32,
    /// Atoms of 8 rows of 64 bytes, chunk bits 4-5 XORed with bits 7-8.
    B64,
    /// Atoms of 8 rows of 128 bytes, chunk bits 4-6 XORed with bits 7-9.
    B128,
}

impl WgSwizzle {
    /// Every mode.
    pub const ALL: [WgSwizzle; 4] = [
        WgSwizzle::None,
        WgSwizzle::B32,
        WgSwizzle::B64,
        WgSwizzle::B128,
    ];

    /// Bytes of one row of an atom: 16 (one chunk) without swizzle, else the swizzle's width.
    pub fn row_bytes(self) -> usize {
        match self {
            WgSwizzle::None => 16,
            WgSwizzle::B32 => 32,
            WgSwizzle::B64 => 64,
            WgSwizzle::B128 => 128,
        }
    }

    /// Chunk bits the swizzle XORs: 0, 1, 2 or 3.
    pub fn bits(self) -> u32 {
        (self.row_bytes() / 16).trailing_zeros()
    }

    /// The descriptor's bits 62-63 for this mode.
    pub fn code(self) -> u64 {
        match self {
            WgSwizzle::None => 0,
            WgSwizzle::B128 => 1,
            WgSwizzle::B64 => 2,
            WgSwizzle::B32 => 3,
        }
    }

    /// Its name in the printed form.
    pub fn name(self) -> &'static str {
        match self {
            WgSwizzle::None => "none",
            WgSwizzle::B32 => "32B",
            WgSwizzle::B64 => "64B",
            WgSwizzle::B128 => "128B",
        }
    }

    /// The byte address where logical address `x` lies: its chunk bits XORed with the bits
    /// from 7 up.
    pub fn apply(self, x: usize) -> usize {
        let mask = (1usize << self.bits()) - 1;
        x ^ (((x >> 7) & mask) << 4)
    }

    /// [`WgSwizzle::apply`] as thread-level arithmetic on a non-negative byte address `x`
    /// (each XORed bit as `a + b - 2ab`).
    pub fn apply_sc(self, x: Sc) -> Sc {
        let k = Sc::Const;
        let bit = |x: &Sc, b: u32| Sc::modulo(Sc::quot(x.clone(), k(1 << b)), k(2));
        let mut out = x.clone();
        for b in 0..self.bits() {
            let (lo, hi) = (bit(&x, 4 + b), bit(&x, 7 + b));
            // x - lo·2^(4+b) + (lo XOR hi)·2^(4+b), with lo XOR hi = lo + hi - 2·lo·hi, is
            // x + (hi - 2·lo·hi)·2^(4+b).
            let flip = Sc::plus(hi.clone(), Sc::times(k(-2), Sc::times(lo, hi)));
            out = Sc::plus(out, Sc::times(flip, k(1 << (4 + b))));
        }
        out
    }
}

/// A [`crate::gpu::ir::Stmt::Wgmma`] operand in shared memory: the matrix descriptor the
/// emitter builds from the address of `array`'s element `start` and the layout fields.
#[derive(Clone, Debug, PartialEq)]
pub struct MatrixDesc {
    /// The shared array (packed 16-bit elements).
    pub array: usize,
    /// The element the matrix starts at, as an address: the array's start plus this many
    /// elements (a position in the array's memory, not through [`SharedArray::swizzle`]), the
    /// same in every thread of the warpgroup.
    ///
    /// [`SharedArray::swizzle`]: crate::gpu::ir::SharedArray::swizzle
    pub start: Sc,
    /// The leading dimension byte offset (a multiple of 16 below 2^18).
    pub lbo: usize,
    /// The stride dimension byte offset (a multiple of 16 below 2^18).
    pub sbo: usize,
    /// The swizzle mode.
    pub swizzle: WgSwizzle,
    /// MN-major (`imm-trans` 1 for this operand: A by columns, B by rows) rather than
    /// K-major.
    pub mn_major: bool,
}

/// The 64-bit descriptor of a matrix at shared byte address `addr` with `lbo`, `sbo` and
/// `swizzle` (fields as the module docs list them; the base offset 0).
pub fn descriptor(addr: u64, lbo: usize, sbo: usize, swizzle: WgSwizzle) -> u64 {
    let field = |v: u64| (v & 0x3ffff) >> 4;
    field(addr) | field(lbo as u64) << 16 | field(sbo as u64) << 32 | swizzle.code() << 62
}

/// An operand tile in shared memory as kiln lays it out for descriptors of `swizzle`: `rows`
/// rows (M or N) of `k` contraction steps of 16-bit elements, K-major (a row's contraction
/// contiguous) or MN-major (a contraction step's rows contiguous, `imm-trans` 1).
///
/// K-major: without swizzle the core matrices of a row group follow each other along the
/// contraction (LBO 128 bytes) and the groups each other (SBO `16 k` bytes); with a swizzle
/// of `W` bytes, `k` is a multiple of `W / 2` and the tile is columns of atoms `W / 2` steps
/// wide, each column its `rows / 8` atoms one after the other (SBO `8W` bytes).
///
/// MN-major: panels of `P` rows (8 without swizzle, `W / 2` with one), each panel's `k`
/// contraction steps one after the other, `2P` bytes each: element `(row, k)` at `(row / P)
/// 2Pk + 2Pk' + 2 (row % P)` bytes. The PTX ISA reads an MN-major operand's element `(mn,
/// k)` (`k = 8g + r`) at `start + (mn / 8)·SBO + g·LBO + 16r + 2 (mn % 8)` without swizzle
/// (LBO 128, SBO `16 k`), and with one at `start + (mn / P)·LBO + g·SBO + W·r + 2 (mn % P)`,
/// swizzled (LBO `W k`, the panels' stride; SBO `8W`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TileLayout {
    /// Rows (M or N).
    pub rows: usize,
    /// Contraction steps of a row.
    pub k: usize,
    /// The descriptors' swizzle mode.
    pub swizzle: WgSwizzle,
    /// MN-major rather than K-major.
    pub mn_major: bool,
}

impl TileLayout {
    /// Elements the tile takes.
    pub fn elems(&self) -> usize {
        self.rows * self.k
    }

    /// Whether the tile can be laid out so: `k` a multiple of 16 (one `wgmma` step);
    /// K-major, whole row groups and for a swizzle a contraction of whole atom rows;
    /// MN-major, whole panels.
    pub fn valid(&self) -> bool {
        let (atom, fits) = if self.mn_major {
            (self.atom(), self.rows.is_multiple_of(self.atom()))
        } else {
            (8, self.k.is_multiple_of(self.atom()))
        };
        self.rows > 0
            && self.k > 0
            && self.rows.is_multiple_of(8)
            && self.k.is_multiple_of(16)
            && atom > 0
            && fits
    }

    /// Elements of one atom row: 8 without swizzle, `W / 2` with one.
    fn atom(&self) -> usize {
        self.swizzle.row_bytes() / 2
    }

    /// The leading and stride dimension byte offsets of its descriptors.
    pub fn strides(&self) -> (usize, usize) {
        let w = self.swizzle.row_bytes();
        match (self.mn_major, self.swizzle) {
            (false, WgSwizzle::None) => (128, 16 * self.k),
            // Not used by swizzled K-major operands: the PTX ISA takes it as 1 (16 bytes).
            (false, _) => (16, 8 * w),
            (true, WgSwizzle::None) => (128, 16 * self.k),
            (true, _) => (w * self.k, 8 * w),
        }
    }

    /// The logical byte offset (before the swizzle) of element `(row, k)` from the tile's
    /// start.
    fn logical(&self, row: usize, k: usize) -> usize {
        let p = self.atom();
        if self.mn_major {
            return (row / p) * 2 * p * self.k + k * 2 * p + 2 * (row % p);
        }
        let (i, r) = (row / 8, row % 8);
        match self.swizzle {
            WgSwizzle::None => i * 16 * self.k + (k / 8) * 128 + 16 * r + 2 * (k % 8),
            s => {
                let w = s.row_bytes();
                let (col, within) = (k / p, k % p);
                col * self.rows * w + i * 8 * w + r * w + 2 * within
            }
        }
    }

    /// Where element `(row, k)` lies: its element offset from the tile's start (which is
    /// aligned to 1024 bytes).
    pub fn place(&self, row: usize, k: usize) -> usize {
        self.swizzle.apply(self.logical(row, k)) / 2
    }

    /// [`TileLayout::place`] as thread-level arithmetic, for a non-negative `row` and `k`.
    pub fn place_sc(&self, row: Sc, k: Sc) -> Sc {
        let c = Sc::Const;
        let p = self.atom() as i64;
        let bytes = if self.mn_major {
            Sc::plus(
                Sc::plus(
                    Sc::times(Sc::quot(row.clone(), c(p)), c(2 * p * self.k as i64)),
                    Sc::times(k, c(2 * p)),
                ),
                Sc::times(Sc::modulo(row, c(p)), c(2)),
            )
        } else {
            let (i, r) = (Sc::quot(row.clone(), c(8)), Sc::modulo(row, c(8)));
            match self.swizzle {
                WgSwizzle::None => Sc::plus(
                    Sc::plus(
                        Sc::times(i, c(16 * self.k as i64)),
                        Sc::times(Sc::quot(k.clone(), c(8)), c(128)),
                    ),
                    Sc::plus(Sc::times(r, c(16)), Sc::times(Sc::modulo(k, c(8)), c(2))),
                ),
                s => {
                    let w = s.row_bytes() as i64;
                    Sc::plus(
                        Sc::plus(
                            Sc::times(Sc::quot(k.clone(), c(p)), c(self.rows as i64 * w)),
                            Sc::times(i, c(8 * w)),
                        ),
                        Sc::plus(Sc::times(r, c(w)), Sc::times(Sc::modulo(k, c(p)), c(2))),
                    )
                }
            }
        };
        Sc::quot(self.swizzle.apply_sc(bytes), c(2))
    }

    /// The element offset, from the tile's start, where the descriptor of rows `row..` (a
    /// multiple of 8, of a panel when MN-major) at contraction step `k` (a multiple of 16)
    /// starts.
    pub fn desc_start(&self, row: usize, k: usize) -> usize {
        // The first row of an atom (or core matrix): the swizzle leaves it in place.
        self.logical(row, k) / 2
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn descriptor_fields_sit_where_the_isa_puts_them() {
        let d = descriptor(0x1_2340, 128, 1024, WgSwizzle::B128);
        assert_eq!(d & 0x3fff, 0x1234);
        assert_eq!((d >> 16) & 0x3fff, 8);
        assert_eq!((d >> 32) & 0x3fff, 64);
        assert_eq!((d >> 49) & 7, 0);
        assert_eq!(d >> 62, 1);
        assert_eq!(descriptor(0, 16, 16, WgSwizzle::B32) >> 62, 3);
        assert_eq!(descriptor(0, 16, 16, WgSwizzle::B64) >> 62, 2);
    }

    #[test]
    fn layouts_are_permutations_and_agree_with_their_arithmetic() {
        fn fold(s: &Sc) -> i64 {
            match s {
                Sc::Const(c) => *c,
                Sc::Add(a, b) => fold(a) + fold(b),
                Sc::Mul(a, b) => fold(a) * fold(b),
                Sc::Div(a, b) => fold(a) / fold(b),
                Sc::Rem(a, b) => fold(a) % fold(b),
                other => panic!("{other:?}"),
            }
        }
        for (swizzle, mn_major) in WgSwizzle::ALL
            .into_iter()
            .flat_map(|s| [(s, false), (s, true)])
        {
            let t = TileLayout {
                rows: 64,
                k: 64,
                swizzle,
                mn_major,
            };
            assert!(t.valid());
            let mut seen = vec![false; t.elems()];
            for row in 0..t.rows {
                for k in 0..t.k {
                    let p = t.place(row, k);
                    assert!(!seen[p], "{swizzle:?}: ({row}, {k}) at {p} twice");
                    seen[p] = true;
                    let q = fold(&t.place_sc(Sc::Const(row as i64), Sc::Const(k as i64)));
                    assert_eq!(q, p as i64, "{swizzle:?} ({row}, {k})");
                }
            }
        }
    }
}
