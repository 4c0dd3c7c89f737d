//! Window geometry of the type rules: the size of a windowed dimension (reduce_window,
//! convolution, select_and_scatter) and a window reduction's result shape.

use super::{Labels, R, size_overflow};
use crate::TensorType;

/// Output size of one windowed dimension (reduce_window, convolution, select_and_scatter),
/// saturating at `usize::MAX` when it exceeds [`crate::MAX_SIZE`].
pub fn window_output_size(
    input: usize,
    base_dil: i64,
    pad: (i64, i64),
    window: i64,
    win_dil: i64,
    stride: i64,
) -> usize {
    checked_window_output_size(input, base_dil, pad, window, win_dil, stride).unwrap_or(usize::MAX)
}

/// [`window_output_size`], or `None` when the size exceeds [`crate::MAX_SIZE`]. The
/// arithmetic is done in i128, where no product of two sizes or attributes overflows.
pub(super) fn checked_window_output_size(
    input: usize,
    base_dil: i64,
    pad: (i64, i64),
    window: i64,
    win_dil: i64,
    stride: i64,
) -> Option<usize> {
    let dilated_in = if input == 0 {
        0
    } else {
        (input as i128 - 1) * base_dil as i128 + 1
    };
    let padded = dilated_in + pad.0 as i128 + pad.1 as i128;
    let dilated_w = if window == 0 {
        0
    } else {
        (window as i128 - 1) * win_dil as i128 + 1
    };
    if padded < dilated_w || stride <= 0 {
        Some(0)
    } else {
        dim_size((padded - dilated_w) / stride as i128 + 1)
    }
}

/// A dimension size computed in i128, if it is at most [`crate::MAX_SIZE`].
pub(super) fn dim_size(size: i128) -> Option<usize> {
    (0..=crate::MAX_SIZE as i128)
        .contains(&size)
        .then_some(size as usize)
}

/// The result shape of a window reduction of `a` (`reduce_window`, `reduce_window_region`)
/// with window dimensions, strides, base and window dilations `w` and `padding`: constraint
/// `labels.0` that each has an entry per dimension, `labels.1` that sizes, strides and
/// dilations are positive.
pub(super) fn window_result_shape(
    l: &Labels,
    labels: (u32, u32),
    a: &TensorType,
    w: [&[i64]; 4],
    padding: &[(i64, i64)],
) -> R<Vec<usize>> {
    let [wd, ws, bd, wdl] = w;
    let r = a.rank();
    l.ensure(labels.0, w.iter().all(|v| v.len() == r) && padding.len() == r, || {
        format!("window_dimensions, window_strides, base_dilations, window_dilations and padding must have {r} entries for {a}")
    })?;
    l.ensure(labels.1, w.iter().all(|v| v.iter().all(|&s| s > 0)), || {
        "window sizes, strides and dilations must be positive".to_string()
    })?;
    (0..r)
        .map(|d| {
            checked_window_output_size(a.shape[d], bd[d], padding[d], wd[d], wdl[d], ws[d])
                .ok_or_else(|| size_overflow(format!("the size of dimension {d} of the result")))
        })
        .collect()
}
