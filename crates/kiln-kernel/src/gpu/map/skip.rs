//! Block tiles of a product that no reader uses, left uncomputed on the GPU.
//!
//! A GEMM kernel carrying an [`Unread`] (a causal mask's scores `S = Q Kᵀ`, which every reader
//! selects away above the diagonal: `fuse/unread_blocks.rs`) need not compute the elements in
//! its region. The block-tile mappings (`tiled.rs`, `tensor.rs`, `warpgroup.rs`,
//! `warpgroup_tma.rs`) decide once per block, from its tile's first row and column alone, whether
//! the whole tile lies in the region ([`Skip::tile_unread`]); such a block runs no step of
//! its contraction (no loads, no products, no barriers: the condition is the same for every
//! thread of the block, so none waits alone), and its accumulators, set to zero before the
//! loop, are stored as they are, through the epilogue where the launch has one (which, for an
//! epilogue that leaves the product unread there, selects them away). The elements the tiles
//! store stay defined, as the CPU's tiles store zeros in the rows they leave out.
//!
//! The thread-per-element mapping decides per element: an element in the region skips its
//! contraction and stores zero.
//!
//! Each launch that leaves tiles out says so in a [`Stmt::Note`], with how many of each
//! matrix's tiles it leaves out, so that the plan shows the work saved.

use super::*;
use crate::ir::Unread;
use crate::target::GemmTile;

/// The unread region of one product launch and the tiling it is checked against.
pub(super) struct Skip<'u> {
    /// The region.
    pub unread: &'u Unread,
    /// The product's rows and columns per matrix.
    pub mn: (usize, usize),
}

impl Skip<'_> {
    /// `1` when the element at `(row, col)` of its matrix lies in the region.
    pub(super) fn element_unread(&self, row: Sc, col: Sc) -> Sc {
        let (a, b, cc) = self.unread.at;
        let at = Sc::plus(
            Sc::plus(Sc::times(col, Sc::Const(a)), Sc::times(row, Sc::Const(b))),
            Sc::Const(cc),
        );
        Sc::lt(c(0), at)
    }

    /// `1` when the whole `bm x bn` tile whose first row and column are `m0` and `n0` (of a
    /// matrix of `self.mn`, clipped at its edges) lies in the region: the region's affine form
    /// is smallest at the tile's corner its signs pick, and positive there.
    pub(super) fn tile_unread(&self, (m0, n0): (Sc, Sc), (bm, bn): (usize, usize)) -> Sc {
        let (a, b, _) = self.unread.at;
        let (m, n) = self.mn;
        // The tile's last row or column: `x0 + min(extent - 1, len - 1 - x0)`.
        let last = |x0: Sc, extent: usize, len: usize| {
            let room = Sc::minus(c(len - 1), x0.clone());
            Sc::plus(x0, min(c(extent - 1), room))
        };
        let col = if a > 0 { n0.clone() } else { last(n0, bn, n) };
        let row = if b > 0 { m0.clone() } else { last(m0, bm, m) };
        self.element_unread(row, col)
    }

    /// How many of a matrix's `bm x bn` tiles lie wholly in the region, and how many there
    /// are: what [`Skip::tile_unread`] decides at run time, counted here.
    pub(super) fn tiles_unread(&self, (bm, bn): (usize, usize)) -> (usize, usize) {
        let (a, b, cc) = self.unread.at;
        let (m, n) = self.mn;
        let (gm, gn) = (m.div_ceil(bm), n.div_ceil(bn));
        let mut left_out = 0;
        for i in 0..gm {
            for j in 0..gn {
                let (r0, c0) = (i * bm, j * bn);
                let (r1, c1) = ((r0 + bm).min(m) - 1, (c0 + bn).min(n) - 1);
                let col = if a > 0 { c0 } else { c1 } as i64;
                let row = if b > 0 { r0 } else { r1 } as i64;
                left_out += usize::from(col * a + row * b + cc > 0);
            }
        }
        (left_out, gm * gn)
    }

    /// The region as the plan prints it: `col - row > 0`.
    fn region(&self) -> String {
        let (a, b, cc) = self.unread.at;
        let term = |first: bool, k: i64, x: &str| match (first, k) {
            (true, 1) => x.to_string(),
            (true, -1) => format!("-{x}"),
            (_, 1) => format!(" + {x}"),
            (_, -1) => format!(" - {x}"),
            (true, k) => format!("{k} {x}"),
            (_, k) if k < 0 => format!(" - {} {x}", -k),
            (_, k) => format!(" + {k} {x}"),
        };
        let mut s = term(true, a, "col") + &term(false, b, "row");
        match cc {
            0 => {}
            k if k < 0 => s += &format!(" - {}", -k),
            k => s += &format!(" + {k}"),
        }
        s
    }

    /// The block's contraction `steps` (every statement from its first staging to its last
    /// product) run only where its `tile` at `(m0, n0)` is not wholly unread, after a note of
    /// the tiles left out.
    pub(super) fn around(
        &self,
        (m0, n0): (Sc, Sc),
        tile: (usize, usize),
        steps: Vec<Stmt>,
    ) -> Vec<Stmt> {
        let (left_out, tiles) = self.tiles_unread(tile);
        vec![
            Stmt::Note(format!(
                "product unread where {} > 0: {left_out} of {tiles} tiles a matrix skip their contraction, zeros stored",
                self.region()
            )),
            Stmt::If {
                cond: Sc::is_zero(self.tile_unread((m0, n0), tile)),
                body: steps,
            },
        ]
    }

    /// The thread-per-element mapping's `eval` of the element at variables 1 (row) and 2
    /// (column), run only where it is not unread; `value` is zero there.
    pub(super) fn around_element(&self, value: usize, dtype: DType, eval: Stmt) -> Vec<Stmt> {
        vec![
            Stmt::Note(format!(
                "product unread where {} > 0: those elements skip their contraction, zeros stored",
                self.region()
            )),
            super::staging::zero(value, dtype),
            Stmt::If {
                cond: Sc::is_zero(self.element_unread(Sc::Var(1), Sc::Var(2))),
                body: vec![eval],
            },
        ]
    }
}

/// The statements `steps` under `skip` where there is one ([`Skip::around`]), else as they
/// are.
pub(super) fn maybe_around(
    skip: Option<&Skip>,
    origin: (Sc, Sc),
    tile: (usize, usize),
    steps: Vec<Stmt>,
) -> Vec<Stmt> {
    match skip {
        Some(s) => s.around(origin, tile, steps),
        None => steps,
    }
}

/// The tile of `tiles` (those that fit the GPU, largest first) a product of `m x n` per batch
/// runs with: the first the product fills at least half of in both directions; but where the
/// product may leave work out (`leaves_out`: an unread region or zero steps, see
/// `Product::leaves_out`) and that tile leaves none out (a causal mask's `[128, 128]` scores
/// by tiles of `128 x 64`, none of which lies above the diagonal), the first such smaller tile
/// that leaves some out (`64 x 64`: one tile of four), if any.
pub(super) fn choose(
    tiles: impl Iterator<Item = GemmTile>,
    (m, n): (usize, usize),
    leaves_out: Option<&dyn Fn(&GemmTile) -> bool>,
) -> Option<GemmTile> {
    let mut filled = tiles.filter(|t| 2 * m >= t.m && 2 * n >= t.n);
    let first = filled.next()?;
    let Some(leaves_out) = leaves_out else {
        return Some(first);
    };
    if leaves_out(&first) {
        return Some(first);
    }
    Some(filled.find(|t| leaves_out(t)).unwrap_or(first))
}

/// `min(x, y)`: `y + (x < y) · (x - y)`.
fn min(x: Sc, y: Sc) -> Sc {
    Sc::plus(
        y.clone(),
        Sc::times(Sc::lt(x.clone(), y.clone()), Sc::minus(x, y)),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tiles_wholly_above_the_diagonal_are_counted_and_clipped_at_the_edges() {
        // Causal scores: unread where col - row > 0.
        let u = Unread { at: (1, -1, 0) };
        let s = Skip {
            unread: &u,
            mn: (128, 128),
        };
        // 2 x 2 tiles of 64: only the top right one lies wholly above the diagonal.
        assert_eq!(s.tiles_unread((64, 64)), (1, 4));
        // 4 x 4 tiles of 32: the six above the diagonal's tiles.
        assert_eq!(s.tiles_unread((32, 32)), (6, 16));
        assert_eq!(s.region(), "col - row");
        // A partial last row of tiles: rows 96..100 of 100; its tiles end at row 99.
        let s = Skip {
            unread: &u,
            mn: (100, 100),
        };
        assert_eq!(s.tiles_unread((32, 32)), (6, 16));
        let other = Unread { at: (-1, 1, -2) };
        let s = Skip {
            unread: &other,
            mn: (100, 100),
        };
        assert_eq!(s.region(), "-col + row - 2");
        // Below the diagonal by more than 2: the tiles (i, j) with 32 j + 31 + 2 < 32 i.
        assert_eq!(s.tiles_unread((32, 32)), (3, 16));
    }
}
