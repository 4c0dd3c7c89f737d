//! The geometry of window ops (convolution, `reduce_window`), in one place for lowering, the
//! kernel verifier and canonicalization: where an output position's window element lies in
//! the input, which positions are padding or dilation holes, and whether a window fits.
//!
//! Along one spatial dimension, output position `o` and window position `k` read the input,
//! dilated by `base_dilation` and padded by `pad_lo` in front, at
//! `o * stride - pad_lo + k * window_dilation`; that position holds an input element when it
//! lies inside the dilated input (`(size - 1) * base_dilation + 1` positions) and is a multiple
//! of `base_dilation`, element `position / base_dilation`. (The reference interpreter computes
//! the same independently: it is the oracle.)

use crate::ir::{Cond, Idx};

/// One spatial dimension of a window op.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WindowDim {
    /// Input elements along the dimension (before dilation and padding).
    pub size: i64,
    /// Output step between windows.
    pub stride: i64,
    /// Padding in front of the (dilated) input.
    pub pad_lo: i64,
    /// Dilation of the input: `base_dilation - 1` holes between elements.
    pub base_dilation: i64,
    /// Dilation of the window: its positions are this far apart.
    pub window_dilation: i64,
}

impl WindowDim {
    /// The position in the padded, dilated input read by output position `out` and window
    /// position `win`.
    pub fn position(&self, out: Idx, win: Idx) -> Idx {
        Idx::Add(vec![
            Idx::Mul(Box::new(out), self.stride),
            Idx::Const(-self.pad_lo),
            Idx::Mul(Box::new(win), self.window_dilation),
        ])
    }

    /// Positions the dilated input spans (before padding).
    pub fn dilated_size(&self) -> i64 {
        if self.size == 0 {
            0
        } else {
            (self.size - 1) * self.base_dilation + 1
        }
    }

    /// The conditions under which `pos` (see [`WindowDim::position`]) holds an input element
    /// rather than padding or a dilation hole.
    pub fn holds_element(&self, pos: &Idx) -> Vec<Cond> {
        let mut conds = vec![Cond::InRange(pos.clone(), 0, self.dilated_size())];
        if self.base_dilation > 1 {
            conds.push(Cond::Divisible(pos.clone(), self.base_dilation));
        }
        conds
    }

    /// The input element at `pos`, where [`WindowDim::holds_element`] holds.
    pub fn element(&self, pos: Idx) -> Idx {
        if self.base_dilation > 1 {
            Idx::Div(Box::new(pos), self.base_dilation)
        } else {
            pos
        }
    }
}

/// Where a `reduce_window`'s terms lie in an operand of `shape` along its first `rank`
/// dimensions, output position variable `d` and window position variable `rank + d` along
/// dimension `d` (`strides`, `base_dilations`, `window_dilations` and `padding` its
/// attributes): the conditions under which a term is an element (rather than padding or a
/// dilation hole), and the element's index.
pub fn window_terms(
    rank: usize,
    shape: &[usize],
    strides: &[i64],
    base_dilations: &[i64],
    window_dilations: &[i64],
    padding: &[(i64, i64)],
) -> (Vec<Cond>, Vec<Idx>) {
    let (mut conds, mut index) = (Vec::new(), Vec::new());
    for d in 0..rank {
        let dim = WindowDim {
            size: shape[d] as i64,
            stride: strides[d],
            pad_lo: padding[d].0,
            base_dilation: base_dilations[d],
            window_dilation: window_dilations[d],
        };
        let pos = dim.position(Idx::Var(d), Idx::Var(rank + d));
        conds.extend(dim.holds_element(&pos));
        index.push(dim.element(pos));
    }
    (conds, index)
}

/// Whether `outputs` windows of `window` positions, `stride` apart and dilated by `dilation`,
/// fit an unpadded, undilated input of `input` elements (every window wholly inside it): what
/// a GEMM reading convolution patches in place needs.
pub fn windows_fit(
    outputs: usize,
    stride: usize,
    window: usize,
    dilation: usize,
    input: usize,
) -> bool {
    outputs == 0 || window == 0 || (outputs - 1) * stride + (window - 1) * dilation < input
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn padding_and_holes_are_told_from_elements() {
        // 3 elements, dilated by 2 (positions 0, 2, 4), padded by 1 in front.
        let d = WindowDim {
            size: 3,
            stride: 1,
            pad_lo: 1,
            base_dilation: 2,
            window_dilation: 1,
        };
        assert_eq!(d.dilated_size(), 5);
        let conds = d.holds_element(&Idx::Var(0));
        assert_eq!(conds.len(), 2);
        assert!(windows_fit(4, 1, 3, 1, 6));
        assert!(!windows_fit(4, 1, 3, 2, 6));
        assert!(windows_fit(0, 1, 9, 1, 1));
    }
}
