//! Where `rng_bit_generator`'s Threefry blocks go in a u32 result, as XLA's THREE_FRY lays
//! them out (see `ir-specs/ops/rng_bit_generator.md`), shared by the reference and the
//! backends' expansion into kernels.

/// The dimension of a u32 result of shape `shape` that its blocks split (the first of even
/// size, else the first of the largest size) and the shape of the grid of blocks: `shape` with
/// that dimension halved, rounded up. The block at `(.., j, ..)` of the grid puts its first word
/// at `(.., 2j, ..)` of the result and its second at `(.., 2j + 1, ..)` where that lies inside
/// the dimension (an odd size drops the last blocks' second words); the blocks are numbered in
/// the grid's row-major order. A scalar is one block (dimension 0 of an empty grid), whose first
/// word it takes.
pub fn block_grid(shape: &[usize]) -> (usize, Vec<usize>) {
    let Some(&largest) = shape.iter().max() else {
        return (0, Vec::new());
    };
    let split = shape
        .iter()
        .position(|d| d % 2 == 0)
        .or_else(|| shape.iter().position(|&d| d == largest))
        .unwrap_or(0);
    let mut grid = shape.to_vec();
    grid[split] = shape[split].div_ceil(2);
    (split, grid)
}

/// A u32 result of shape `shape` (a scalar as `[1]`) around the dimension its blocks split,
/// `[pre, half, d, post]`: the dimensions before it multiplied, the blocks along it, its size,
/// and the dimensions after it multiplied. Block `(p, j, q)` (number `(p * half + j) * post + q`)
/// puts its words at `(p, 2j, q)` and `(p, 2j + 1, q)` of the result as `[pre, d, post]`, where
/// they fall inside `d`; there are `pre * half * post` blocks.
pub fn grid_dims(shape: &[usize]) -> [usize; 4] {
    let shape = if shape.is_empty() { &[1][..] } else { shape };
    let (split, grid) = block_grid(shape);
    let pre = shape[..split].iter().product();
    let post = shape[split + 1..].iter().product();
    [pre, grid[split], shape[split], post]
}

#[cfg(test)]
mod tests {
    use super::block_grid;

    #[test]
    fn the_first_even_dimension_splits_else_the_first_largest() {
        assert_eq!(block_grid(&[]), (0, vec![]));
        assert_eq!(block_grid(&[5]), (0, vec![3]));
        assert_eq!(block_grid(&[4, 4]), (0, vec![2, 4]));
        assert_eq!(block_grid(&[3, 4, 5]), (1, vec![3, 2, 5]));
        assert_eq!(block_grid(&[3, 5]), (1, vec![3, 3]));
        assert_eq!(block_grid(&[3, 3]), (0, vec![2, 3]));
        assert_eq!(block_grid(&[0, 3]), (0, vec![0, 3]));
        assert_eq!(block_grid(&[3, 0]), (1, vec![3, 0]));
    }
}
