//! Programs and arguments shared by the tests of `reduce_region` folds: the GPU emulator's
//! (`gpu_fold.rs`) and the CPU backend's (kiln-codegen-llvm's `tests/reduce_region.rs`, which
//! includes this file by its path).

use kiln_ir::{DType, TensorType};

/// An argmax (`GT`) or argmin (`LT`) body over `(acc_value, acc_index, value, index)`: NaN
/// beats every number, ties (NaN with NaN included) go to the smaller index.
pub fn arg_body(dtype: DType, dir: &str) -> String {
    format!(
        "func @arg(%0: {dtype}[], %1: i32[], %2: {dtype}[], %3: i32[]) -> ({dtype}[], i32[]) {{
      %4 = compare %2, %0 {{comparison_direction = {dir}}} : pred[]
      %5 = compare %2, %2 {{comparison_direction = NE}} : pred[]
      %6 = compare %0, %0 {{comparison_direction = NE}} : pred[]
      %7 = not %6 : pred[]
      %8 = and %5, %7 : pred[]
      %9 = or %4, %8 : pred[]
      %10 = compare %2, %0 {{comparison_direction = EQ}} : pred[]
      %11 = and %5, %6 : pred[]
      %12 = or %10, %11 : pred[]
      %13 = compare %3, %1 {{comparison_direction = LT}} : pred[]
      %14 = and %12, %13 : pred[]
      %15 = or %9, %14 : pred[]
      %16 = select %15, %2, %0 : {dtype}[]
      %17 = select %15, %3, %1 : i32[]
      return %16, %17
    }}"
    )
}

/// `shape` without the dimensions `dims`.
pub fn kept(shape: &[usize], dims: &[usize]) -> Vec<usize> {
    (0..shape.len())
        .filter(|d| !dims.contains(d))
        .map(|d| shape[d])
        .collect()
}

/// The types of an argmax or argmin of `dtype[shape]` over `dims`: the operand's, its
/// positions' (i32), the values' and the positions' results.
pub fn arg_types(dtype: DType, shape: &[usize], dims: &[usize]) -> [TensorType; 4] {
    let kept = kept(shape, dims);
    [
        TensorType::new(dtype, shape.to_vec()),
        TensorType::new(DType::I32, shape.to_vec()),
        TensorType::new(dtype, kept.clone()),
        TensorType::new(DType::I32, kept),
    ]
}

/// Small pseudo-random numbers with many ties, both zeros, infinities and (`nans`) NaNs.
pub fn values(dtype: DType, n: usize, nans: bool, seed: u64) -> Vec<f64> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15).wrapping_add(1);
    (0..n)
        .map(|_| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let r = (s >> 33) as i64;
            if dtype.is_float() {
                match r % 29 {
                    0 if nans => f64::NAN,
                    1 => -0.0,
                    2 => 0.0,
                    3 => f64::INFINITY,
                    4 => f64::NEG_INFINITY,
                    _ => ((r % 23) - 11) as f64 * 0.5,
                }
            } else {
                ((r % 2001) - 1000) as f64
            }
        })
        .collect()
}
