//! Tensor maps on the device (feature `cuda`): a launch's [`TensorMap`] descriptions (data
//! of its launch plan, as the GPU emulator reads them) encoded with the driver's
//! `cuTensorMapEncodeTiled` into the 128-byte `CUtensorMap` each TMA load reads, passed as
//! the kernel's grid-constant parameters after its buffers.
//!
//! [`encoding`] turns a description and the input's device address into the call's
//! arguments (checked, no driver needed): rank 2, the element type, the dimensions
//! innermost first, the row stride in bytes, the box, element strides 1, no interleave, the
//! swizzle, L2 promotion of 128 bytes, and out-of-bounds elements filled with zeros (the fill
//! mode `NONE`, which is what the emulator does). [`encode`] makes the call; without a
//! driver library, or with a driver older than CUDA 12 (which lacks the call), it returns
//! a [`GpuError`] and calls nothing.

use crate::cuda::{GpuError, driver_candidates, driver_present};
use cudarc::driver::DeviceRepr;
use cudarc::driver::sys::{
    CUresult, CUtensorMap, CUtensorMapDataType, CUtensorMapFloatOOBfill, CUtensorMapInterleave,
    CUtensorMapL2promotion, CUtensorMapSwizzle,
};
use kiln_ir::DType;
use kiln_kernel::gpu::desc::WgSwizzle;
use kiln_kernel::gpu::tma::TensorMap;

/// An encoded tensor map: the 128 bytes, aligned to 64, a kernel takes as a parameter.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(C, align(64))]
pub struct EncodedTensorMap(pub [u64; 16]);

// SAFETY: plain bytes, laid out as the kernel's `.param .align 64 .b8 [128]` expects them.
unsafe impl DeviceRepr for EncodedTensorMap {}

/// The arguments of one `cuTensorMapEncodeTiled` call.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Encoding {
    /// The element type.
    pub dtype: CUtensorMapDataType,
    /// The tensor's first element.
    pub address: u64,
    /// Elements per dimension, innermost first.
    pub dims: [u64; 2],
    /// Bytes between consecutive indices of the outer dimension.
    pub strides: [u64; 1],
    /// The box, innermost first.
    pub box_dims: [u32; 2],
    /// Element strides (1: every element).
    pub element_strides: [u32; 2],
    /// The shared-memory swizzle.
    pub swizzle: CUtensorMapSwizzle,
}

/// The encoding of `m` for a tensor at device address `address` (16-byte aligned, as TMA
/// requires), or why the driver would refuse it.
pub fn encoding(m: &TensorMap, address: u64) -> Result<Encoding, GpuError> {
    let fail = |message: String| GpuError::Run { message };
    m.check().map_err(fail)?;
    if !address.is_multiple_of(16) {
        return Err(fail(format!(
            "a tensor map of a tensor at {address:#x}, not 16-byte aligned"
        )));
    }
    let dtype = match m.dtype {
        DType::BF16 => CUtensorMapDataType::CU_TENSOR_MAP_DATA_TYPE_BFLOAT16,
        DType::F16 => CUtensorMapDataType::CU_TENSOR_MAP_DATA_TYPE_FLOAT16,
        DType::F32 => CUtensorMapDataType::CU_TENSOR_MAP_DATA_TYPE_FLOAT32,
        d => return Err(fail(format!("a tensor map of {d} elements"))),
    };
    let swizzle = match m.swizzle {
        WgSwizzle::None => CUtensorMapSwizzle::CU_TENSOR_MAP_SWIZZLE_NONE,
        WgSwizzle::B32 => CUtensorMapSwizzle::CU_TENSOR_MAP_SWIZZLE_32B,
        WgSwizzle::B64 => CUtensorMapSwizzle::CU_TENSOR_MAP_SWIZZLE_64B,
        WgSwizzle::B128 => CUtensorMapSwizzle::CU_TENSOR_MAP_SWIZZLE_128B,
    };
    Ok(Encoding {
        dtype,
        address,
        dims: m.dims.map(|d| d as u64),
        strides: [m.row_stride as u64],
        box_dims: m.box_dims.map(|b| b as u32),
        element_strides: [1, 1],
        swizzle,
    })
}

/// The driver's CUDA version (`cuDriverGetVersion`: 12000 for 12.0), the driver present.
fn driver_version() -> Result<i32, GpuError> {
    let mut v = 0i32;
    // SAFETY: the driver library is present (checked by the caller); writes one integer.
    let r = unsafe { cudarc::driver::sys::cuDriverGetVersion(&mut v) };
    if r != CUresult::CUDA_SUCCESS {
        return Err(GpuError::Driver {
            call: "cuDriverGetVersion",
            message: format!("{r:?}"),
        });
    }
    Ok(v)
}

/// `m` encoded for a tensor at device address `address` by `cuTensorMapEncodeTiled`.
pub fn encode(m: &TensorMap, address: u64) -> Result<EncodedTensorMap, GpuError> {
    let e = encoding(m, address)?;
    if !driver_present() {
        return Err(GpuError::NoDriver {
            looked_for: driver_candidates(),
        });
    }
    let version = driver_version()?;
    if version < 12000 {
        return Err(GpuError::Run {
            message: format!(
                "TMA tensor maps need a CUDA 12 driver; this one is {}.{}",
                version / 1000,
                version % 1000 / 10
            ),
        });
    }
    let mut out = CUtensorMap { opaque: [0; 16] };
    // SAFETY: every pointer names a live array of the rank's length (2 dimensions, 1
    // stride, 2 box and element-stride entries); the driver only writes `out`.
    let r = unsafe {
        cudarc::driver::sys::cuTensorMapEncodeTiled(
            &mut out,
            e.dtype,
            2,
            e.address as *mut std::ffi::c_void,
            e.dims.as_ptr(),
            e.strides.as_ptr(),
            e.box_dims.as_ptr(),
            e.element_strides.as_ptr(),
            CUtensorMapInterleave::CU_TENSOR_MAP_INTERLEAVE_NONE,
            e.swizzle,
            CUtensorMapL2promotion::CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
            CUtensorMapFloatOOBfill::CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE,
        )
    };
    if r != CUresult::CUDA_SUCCESS {
        return Err(GpuError::Driver {
            call: "cuTensorMapEncodeTiled",
            message: format!("{r:?} for {m:?}"),
        });
    }
    Ok(EncodedTensorMap(out.opaque))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(swizzle: WgSwizzle) -> TensorMap {
        TensorMap {
            input: 0,
            dtype: DType::BF16,
            dims: [72, 40],
            row_stride: 144,
            box_dims: [swizzle.row_bytes() / 2, 32],
            swizzle,
        }
    }

    #[test]
    fn encodings_carry_the_description() {
        let e = encoding(&map(WgSwizzle::B128), 0x1000).unwrap();
        assert_eq!(e.dims, [72, 40]);
        assert_eq!(e.strides, [144]);
        assert_eq!(e.box_dims, [64, 32]);
        assert_eq!(e.swizzle, CUtensorMapSwizzle::CU_TENSOR_MAP_SWIZZLE_128B);
        assert_eq!(
            e.dtype,
            CUtensorMapDataType::CU_TENSOR_MAP_DATA_TYPE_BFLOAT16
        );
        assert_eq!(
            encoding(&map(WgSwizzle::B32), 0).unwrap().swizzle,
            CUtensorMapSwizzle::CU_TENSOR_MAP_SWIZZLE_32B
        );
        assert_eq!(std::mem::size_of::<EncodedTensorMap>(), 128);
        assert_eq!(std::mem::align_of::<EncodedTensorMap>(), 64);
    }

    #[test]
    fn bad_descriptions_are_errors_without_a_driver_call() {
        let e = encoding(&map(WgSwizzle::B64), 0x1008).unwrap_err();
        assert!(e.to_string().contains("not 16-byte aligned"), "{e}");
        let mut m = map(WgSwizzle::B128);
        m.box_dims[0] = 32;
        let e = encoding(&m, 0).unwrap_err();
        assert!(e.to_string().contains("as wide as the swizzle"), "{e}");
        let mut m = map(WgSwizzle::None);
        m.row_stride = 100;
        assert!(encoding(&m, 0).is_err());
    }

    #[test]
    fn encoding_without_a_driver_says_so() {
        if driver_present() {
            return;
        }
        let e = encode(&map(WgSwizzle::B128), 0x1000).unwrap_err();
        assert!(matches!(e, GpuError::NoDriver { .. }), "{e}");
    }
}
