//! GPU programs of products mapped with 16-bit operands, shared by the PTX tests (`ptx.rs`)
//! and the PTX snapshots (`ptx_snapshots.rs`).

use kiln_kernel::gpu::ir::GpuProgram;
use kiln_kernel::target::TargetInfo;

/// The GPU program `name` of the product of `src` (lowered in f32 for `target`), mapped with
/// operands of `dtype`: a product of bf16 or f16 operands with an f32 result, as the tensor
/// cores run it.
pub fn product_with_operands(
    src: &str,
    dtype: kiln_ir::DType,
    target: &TargetInfo,
    name: &str,
) -> GpuProgram {
    let f = kiln_ir::parse_func_text(src).unwrap();
    let opts = kiln_kernel::Options::default();
    let l =
        kiln_kernel::pipeline::lower_program(&f, &[], &opts, target, None, &mut |_| {}).unwrap();
    let i = (0..l.func.insts.len())
        .find(|&i| l.fused.kernels[i].is_some())
        .unwrap();
    let ins: Vec<kiln_ir::TensorType> = l.fused.operands[i]
        .iter()
        .map(|v| {
            let mut t = l.func.values[v.index()].clone();
            t.dtype = dtype;
            t
        })
        .collect();
    let k = l.fused.kernels[i].as_ref().unwrap();
    kiln_kernel::gpu::map(k, &ins, target, &opts, name).unwrap()
}
