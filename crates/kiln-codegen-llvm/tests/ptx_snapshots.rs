//! PTX snapshots of a representative kernel of each GPU mapping (grid-stride elementwise,
//! warp-per-row softmax with its row cached in registers and in shared memory, block-per-row
//! reduction through shared memory and barriers, an argmax by a warp per row (a fold of value
//! and index pairs), a full and a column reduction split over
//! blocks in two launches, matrix product with its epilogue in the launch (one thread per
//! element), matrix product by block tiles (double buffered, with and without `cp.async`), one
//! warp's tensor-core tile (bf16 and TF32), a product on the tensor cores (bf16, and f32 as
//! TF32), attention in one launch (by register tiles, by a warp per row, and bf16 on the
//! tensor cores), a transpose through shared tiles, scatter (by its own dimensions, and by its
//! updates sorted by target), a select-and-scatter, a sort by keys, a long sort by keys in tiles
//! and global passes, a radix sort, a sort by any comparator as the reference's merge sort), a
//! Cholesky factorization (a thread per matrix), a tensor-core product in dynamic shared memory, and with
//! float atomics allowed a sum in one launch and an f16 scatter-add by atomics, for sm_90; one warpgroup's `wgmma` tile, a product on warpgroups and one loaded by TMA in a
//! warp-specialized ring for sm_90a.
//! Rendering is deterministic: each is rendered twice and compared before the snapshot.

use kiln_codegen_llvm::ptx::{PtxTarget, mapped_kernels, program_ptx};
use kiln_ir::parse_func_text;
use kiln_kernel::gpu::ir::MapKind;
use kiln_kernel::target::TargetInfo;

mod mapped;

/// The PTX of the kernels of `src` (all of one mapping `kind`), mapped for an H200.
fn ptx(src: &str, kind: MapKind) -> String {
    ptx_on(src, kind, &TargetInfo::h200())
}

/// An H200 without block tiles for matrix products: one thread per element.
fn untiled() -> TargetInfo {
    let mut t = TargetInfo::h200();
    t.gpu.as_mut().expect("a GPU").gemm_tiles.clear();
    t
}

/// The PTX of the kernels of `src` (all of one mapping `kind`), mapped for `target`.
fn ptx_on(src: &str, kind: MapKind, target: &TargetInfo) -> String {
    ptx_under(src, kind, target, &kiln_kernel::Options::default())
}

/// The PTX of the kernels of `src` (all of one mapping `kind`), lowered under `opts` and
/// mapped for `target`.
fn ptx_under(src: &str, kind: MapKind, target: &TargetInfo, opts: &kiln_kernel::Options) -> String {
    let f = parse_func_text(src).unwrap();
    let ks = mapped_kernels(&f, opts, target).unwrap();
    let mut out = String::new();
    for (name, p) in ks {
        let p = p.unwrap_or_else(|e| panic!("{name}: {e}"));
        assert!(
            p.launches.iter().any(|l| l.kind == kind),
            "{name} is mapped as {:?}",
            p.launches.iter().map(|l| l.kind).collect::<Vec<_>>()
        );
        let text = program_ptx(&p, &PtxTarget::sm90()).unwrap();
        assert_eq!(text, program_ptx(&p, &PtxTarget::sm90()).unwrap());
        out += &text;
    }
    out
}

#[test]
fn elementwise_grid_stride() {
    insta::assert_snapshot!(
        "elementwise",
        ptx(
            "func @main(%0: f32[64,100], %1: f16[64,100]) -> f16[64,100] {\n  %2 = convert %1 : f32[64,100]\n  %3 = multiply %0, %2 : f32[64,100]\n  %4 = tanh %3 : f32[64,100]\n  %5 = convert %4 : f16[64,100]\n  return %5\n}\n",
            MapKind::Elementwise
        )
    );
}

#[test]
fn warp_rows_softmax() {
    insta::assert_snapshot!(
        "warp_rows_softmax",
        ptx(
            "func @main(%0: f32[64,256]) -> f32[64,256] {\n  %1 = constant {value = -inf} : f32[]\n  %2 = reduce %0, %1 {dimensions = [1], kind = max} : f32[64]\n  %3 = broadcast_in_dim %2 {broadcast_dimensions = [0]} : f32[64,256]\n  %4 = subtract %0, %3 : f32[64,256]\n  %5 = exponential %4 : f32[64,256]\n  %6 = constant {value = 0.0} : f32[]\n  %7 = reduce %5, %6 {dimensions = [1], kind = add} : f32[64]\n  %8 = broadcast_in_dim %7 {broadcast_dimensions = [0]} : f32[64,256]\n  %9 = divide %5, %8 : f32[64,256]\n  return %9\n}\n",
            MapKind::WarpRows
        )
    );
}

/// A row too long for the registers (35 slots per lane), cached in shared memory.
#[test]
fn warp_rows_softmax_shared() {
    insta::assert_snapshot!(
        "warp_rows_softmax_shared",
        ptx(
            "func @main(%0: f32[64,1100]) -> f32[64,1100] {\n  %1 = constant {value = -inf} : f32[]\n  %2 = reduce %0, %1 {dimensions = [1], kind = max} : f32[64]\n  %3 = broadcast_in_dim %2 {broadcast_dimensions = [0]} : f32[64,1100]\n  %4 = subtract %0, %3 : f32[64,1100]\n  %5 = exponential %4 : f32[64,1100]\n  %6 = constant {value = 0.0} : f32[]\n  %7 = reduce %5, %6 {dimensions = [1], kind = add} : f32[64]\n  %8 = broadcast_in_dim %7 {broadcast_dimensions = [0]} : f32[64,1100]\n  %9 = divide %5, %8 : f32[64,1100]\n  return %9\n}\n",
            MapKind::WarpRows
        )
    );
}

#[test]
fn block_rows_sum() {
    insta::assert_snapshot!(
        "block_rows_sum",
        ptx(
            "func @main(%0: f32[136,32768]) -> f32[136] {\n  %1 = constant {value = 0.0} : f32[]\n  %2 = reduce %0, %1 {dimensions = [1], kind = add} : f32[136]\n  return %2\n}\n",
            MapKind::BlockRows
        )
    );
}

/// An argmax (`reduce_region` of values and indices, ties to the lower index) over rows as one
/// launch of a warp per row: each lane folds its strided terms, then the lanes' value and
/// index pairs meet by shuffles in lane order (`gpu/map/fold.rs`).
#[test]
fn warp_rows_argmax() {
    insta::assert_snapshot!(
        "warp_rows_argmax",
        ptx(
            "func @main(%0: f32[64,256], %1: f32[]) -> (f32[64], i32[64]) {\n  %2 = iota {iota_dimension = 1} : i32[64,256]\n  %3 = constant {value = 0} : i32[]\n  %4, %5 = reduce_region %0, %2, %1, %3 {dimensions = [1], body = func @arg(%0: f32[], %1: i32[], %2: f32[], %3: i32[]) -> (f32[], i32[]) {\n      %4 = compare %2, %0 {comparison_direction = GT} : pred[]\n      %5 = compare %2, %0 {comparison_direction = EQ} : pred[]\n      %6 = compare %3, %1 {comparison_direction = LT} : pred[]\n      %7 = and %5, %6 : pred[]\n      %8 = or %4, %7 : pred[]\n      %9 = select %8, %2, %0 : f32[]\n      %10 = select %8, %3, %1 : i32[]\n      return %9, %10\n    }} : f32[64], i32[64]\n  return %4, %5\n}\n",
            MapKind::WarpRows
        )
    );
}

/// A sum over a whole tensor in two launches: 64 blocks of 256 threads each reduce a slice
/// into a partial, then one thread reduces the 64 partials in four groups of 16.
#[test]
fn split_partials_sum() {
    insta::assert_snapshot!(
        "split_partials_sum",
        ptx(
            "func @main(%0: f32[300001]) -> f32[] {\n  %1 = constant {value = 0.0} : f32[]\n  %2 = reduce %0, %1 {dimensions = [0], kind = add} : f32[]\n  return %2\n}\n",
            MapKind::SplitPartials
        )
    );
}

/// A bias gradient: the column sums of `f32[1000, 300]`, a thread per column over 8 slices of
/// 125 rows, then a thread per four columns over their 8 partials.
#[test]
fn column_partials_sum() {
    insta::assert_snapshot!(
        "column_partials_sum",
        ptx(
            "func @main(%0: f32[1000,300]) -> f32[300] {\n  %1 = constant {value = 0.0} : f32[]\n  %2 = reduce %0, %1 {dimensions = [0], kind = add} : f32[300]\n  return %2\n}\n",
            MapKind::ColumnPartials
        )
    );
}

#[test]
fn gemm_with_an_epilogue() {
    insta::assert_snapshot!(
        "gemm",
        ptx_on(
            "func @main(%0: f32[16,32], %1: f32[32,8], %2: f32[16,8]) -> f32[16,8] {\n  %3 = dot_general %0, %1 {lhs_batching_dimensions = [], rhs_batching_dimensions = [], lhs_contracting_dimensions = [1], rhs_contracting_dimensions = [0]} : f32[16,8]\n  %4 = add %3, %2 : f32[16,8]\n  return %4\n}\n",
            MapKind::Gemm,
            &untiled()
        )
    );
}

#[test]
fn gemm_by_block_tiles() {
    insta::assert_snapshot!(
        "gemm_tiled",
        ptx(
            "func @main(%0: f32[200,300], %1: f32[300,130]) -> f32[200,130] {\n  %2 = dot_general %0, %1 {lhs_batching_dimensions = [], rhs_batching_dimensions = [], lhs_contracting_dimensions = [1], rhs_contracting_dimensions = [0]} : f32[200,130]\n  return %2\n}\n",
            MapKind::GemmTiled
        )
    );
}

/// A product by block tiles whose B tile (rows of 128 f32) is staged with `cp.async`, double
/// buffered; A's rows go through registers.
#[test]
fn gemm_by_block_tiles_with_async_copies() {
    insta::assert_snapshot!(
        "gemm_tiled_async",
        ptx(
            "func @main(%0: f32[128,64], %1: f32[64,128]) -> f32[128,128] {\n  %2 = dot_general %0, %1 {lhs_batching_dimensions = [], rhs_batching_dimensions = [], lhs_contracting_dimensions = [1], rhs_contracting_dimensions = [0]} : f32[128,128]\n  return %2\n}\n",
            MapKind::GemmTiled
        )
    );
}

/// Attention as one launch by register tiles: `softmax(Q Kᵀ / 8) V`, the softmax online.
#[test]
fn attention_in_one_launch() {
    insta::assert_snapshot!(
        "attention",
        ptx(
            "func @main(%0: f32[1,9,8], %1: f32[1,40,8], %2: f32[1,40,12]) -> f32[1,9,12] {\n  %3 = dot_general %0, %1 {lhs_batching_dimensions = [0], rhs_batching_dimensions = [0], lhs_contracting_dimensions = [2], rhs_contracting_dimensions = [2]} : f32[1,9,40]\n  %4 = constant {value = 0.125} : f32[]\n  %5 = broadcast_in_dim %4 {broadcast_dimensions = []} : f32[1,9,40]\n  %6 = multiply %3, %5 : f32[1,9,40]\n  %7 = constant {value = -inf} : f32[]\n  %8 = reduce %6, %7 {dimensions = [2], kind = max} : f32[1,9]\n  %9 = broadcast_in_dim %8 {broadcast_dimensions = [0, 1]} : f32[1,9,40]\n  %10 = subtract %6, %9 : f32[1,9,40]\n  %11 = exponential %10 : f32[1,9,40]\n  %12 = constant {value = 0.0} : f32[]\n  %13 = reduce %11, %12 {dimensions = [2], kind = add} : f32[1,9]\n  %14 = broadcast_in_dim %13 {broadcast_dimensions = [0, 1]} : f32[1,9,40]\n  %15 = divide %11, %14 : f32[1,9,40]\n  %16 = dot_general %15, %2 {lhs_batching_dimensions = [0], rhs_batching_dimensions = [0], lhs_contracting_dimensions = [2], rhs_contracting_dimensions = [1]} : f32[1,9,12]\n  return %16\n}\n",
            MapKind::AttentionTiled
        )
    );
}

/// Attention as one launch by a warp per query row (a target without attention tiles).
#[test]
fn attention_by_warp_rows() {
    let mut target = TargetInfo::h200();
    target.gpu.as_mut().expect("a GPU").attention_tiles.clear();
    insta::assert_snapshot!(
        "attention_rows",
        ptx_on(
            "func @main(%0: f32[1,9,8], %1: f32[1,40,8], %2: f32[1,40,12]) -> f32[1,9,12] {\n  %3 = dot_general %0, %1 {lhs_batching_dimensions = [0], rhs_batching_dimensions = [0], lhs_contracting_dimensions = [2], rhs_contracting_dimensions = [2]} : f32[1,9,40]\n  %4 = constant {value = 0.125} : f32[]\n  %5 = broadcast_in_dim %4 {broadcast_dimensions = []} : f32[1,9,40]\n  %6 = multiply %3, %5 : f32[1,9,40]\n  %7 = constant {value = -inf} : f32[]\n  %8 = reduce %6, %7 {dimensions = [2], kind = max} : f32[1,9]\n  %9 = broadcast_in_dim %8 {broadcast_dimensions = [0, 1]} : f32[1,9,40]\n  %10 = subtract %6, %9 : f32[1,9,40]\n  %11 = exponential %10 : f32[1,9,40]\n  %12 = constant {value = 0.0} : f32[]\n  %13 = reduce %11, %12 {dimensions = [2], kind = add} : f32[1,9]\n  %14 = broadcast_in_dim %13 {broadcast_dimensions = [0, 1]} : f32[1,9,40]\n  %15 = divide %11, %14 : f32[1,9,40]\n  %16 = dot_general %15, %2 {lhs_batching_dimensions = [0], rhs_batching_dimensions = [0], lhs_contracting_dimensions = [2], rhs_contracting_dimensions = [1]} : f32[1,9,12]\n  return %16\n}\n",
            MapKind::Attention,
            &target
        )
    );
}

/// bf16 attention as one launch on the tensor cores: `ldmatrix` (and `.trans` for V),
/// `mma.m16n8k16` for both products, the online softmax on the accumulator fragments with
/// the quads' shuffles, keys and values staged by `cp.async`.
#[test]
fn attention_on_tensor_cores() {
    let (dt, s) = ("bf16", "bf16[1,64,128]");
    let src = format!(
        "func @main(%0: {dt}[1,64,64], %1: {dt}[1,128,64], %2: {dt}[1,128,64]) -> {dt}[1,64,64] {{\n  %3 = dot_general %0, %1 {{lhs_batching_dimensions = [0], rhs_batching_dimensions = [0], lhs_contracting_dimensions = [2], rhs_contracting_dimensions = [2]}} : {s}\n  %4 = constant {{value = 0.125}} : {dt}[]\n  %5 = broadcast_in_dim %4 {{broadcast_dimensions = []}} : {s}\n  %6 = multiply %3, %5 : {s}\n  %7 = constant {{value = -inf}} : {dt}[]\n  %8 = reduce %6, %7 {{dimensions = [2], kind = max}} : {dt}[1,64]\n  %9 = broadcast_in_dim %8 {{broadcast_dimensions = [0, 1]}} : {s}\n  %10 = subtract %6, %9 : {s}\n  %11 = exponential %10 : {s}\n  %12 = constant {{value = 0.0}} : {dt}[]\n  %13 = reduce %11, %12 {{dimensions = [2], kind = add}} : {dt}[1,64]\n  %14 = broadcast_in_dim %13 {{broadcast_dimensions = [0, 1]}} : {s}\n  %15 = divide %11, %14 : {s}\n  %16 = dot_general %15, %2 {{lhs_batching_dimensions = [0], rhs_batching_dimensions = [0], lhs_contracting_dimensions = [2], rhs_contracting_dimensions = [1]}} : {dt}[1,64,64]\n  return %16\n}}\n"
    );
    insta::assert_snapshot!("attention_mma_bf16", ptx(&src, MapKind::AttentionMma));
}

/// The gradient of 3x3/2 max pooling with padding, as the mapping runs it: a thread per
/// output element (a grid-stride loop) visits the windows that cover its element in order,
/// selects each one's first greatest operand (GE) as the sequential walk would, and adds the
/// window's source value to its accumulator where that is its element (from the initial
/// value, in window order: deterministic, without atomics), then stores it once.
#[test]
fn select_and_scatter_max_pool_gradient() {
    insta::assert_snapshot!(
        "select_and_scatter",
        ptx(
            "func @main(%0: f32[1,2,9,9], %1: f32[1,2,5,5], %2: f32[]) -> f32[1,2,9,9] {\n  %3 = select_and_scatter %0, %1, %2 {window_dimensions = [1, 1, 3, 3], window_strides = [1, 1, 2, 2], padding = [[0, 0], [0, 0], [1, 1], [1, 1]], select = GE, kind = add} : f32[1,2,9,9]\n  return %3\n}\n",
            MapKind::SelectScatter
        )
    );
}

/// A transpose through a shared-memory tile of 32 x 33 (padded): reads along the input's
/// rows into the tile's rows, a barrier, writes along the output's rows from its columns.
#[test]
fn transpose_by_shared_tiles() {
    insta::assert_snapshot!(
        "transpose_tiles",
        ptx(
            "func @main(%0: f32[64,96]) -> f32[96,64] {\n  %1 = transpose %0 {permutation = [1, 0]} : f32[96,64]\n  return %1\n}\n",
            MapKind::TransposeTiles
        )
    );
}

#[test]
fn scatter_add() {
    insta::assert_snapshot!(
        "scatter",
        ptx(
            "func @main(%0: f32[3,2], %1: i32[3,1], %2: f32[3,2]) -> f32[3,2] {\n  %3 = scatter %0, %1, %2 {update_window_dims = [1], inserted_window_dims = [0], scatter_dims_to_operand_dims = [0], index_vector_dim = 1, kind = add} : f32[3,2]\n  return %3\n}\n",
            MapKind::Scatter
        )
    );
}

/// A scatter-add of 300 updates into 37 elements, too many for a scan per element: the
/// updates' targets and positions (a launch), sorted by a block's bitonic network (a launch),
/// then a thread per element finding its run by two binary searches and adding it in order.
#[test]
fn scatter_add_sorted_by_target() {
    insta::assert_snapshot!(
        "scatter_sorted",
        ptx(
            "func @main(%0: f32[37], %1: i32[300,1], %2: f32[300]) -> f32[37] {\n  %3 = scatter %0, %1, %2 {update_window_dims = [], inserted_window_dims = [0], scatter_dims_to_operand_dims = [0], index_vector_dim = 1, kind = add} : f32[37]\n  return %3\n}\n",
            MapKind::Sort
        )
    );
}

/// The options with float atomics allowed.
fn atomics() -> kiln_kernel::Options {
    kiln_kernel::Options {
        float_atomics: true,
        ..kiln_kernel::Options::default()
    }
}

/// With float atomics allowed, a sum over a whole tensor in one launch: each block's partial
/// added into the (zeroed) result by `red.global.add.f32`, the first slice's with the start
/// value.
#[test]
fn split_atomic_sum() {
    insta::assert_snapshot!(
        "split_atomic_sum",
        ptx_under(
            "func @main(%0: f32[100003]) -> f32[] {\n  %1 = constant {value = 0.0} : f32[]\n  %2 = reduce %0, %1 {dimensions = [0], kind = add} : f32[]\n  return %2\n}\n",
            MapKind::SplitAtomic,
            &TargetInfo::h200(),
            &atomics()
        )
    );
}

/// With float atomics allowed, the sorted scatter-add above as the operand copied and a
/// thread per update adding it into its target by `red.global.add.noftz.f16`.
#[test]
fn scatter_atomic_f16() {
    insta::assert_snapshot!(
        "scatter_atomic_f16",
        ptx_under(
            "func @main(%0: f16[37], %1: i32[300,1], %2: f16[300]) -> f16[37] {\n  %3 = scatter %0, %1, %2 {update_window_dims = [], inserted_window_dims = [0], scatter_dims_to_operand_dims = [0], index_vector_dim = 1, kind = add} : f16[37]\n  return %3\n}\n",
            MapKind::ScatterAtomic,
            &TargetInfo::h200(),
            &atomics()
        )
    );
}

#[test]
fn warp_tile_on_tensor_cores() {
    let k = kiln_kernel::gpu::mma::warp_tile(kiln_ir::DType::BF16, TargetInfo::h200().sums);
    let p = kiln_kernel::gpu::ir::GpuProgram {
        scratch: Vec::new(),
        zeroed: Vec::new(),
        launches: vec![k],
    };
    let text = program_ptx(&p, &PtxTarget::sm90()).unwrap();
    assert_eq!(text, program_ptx(&p, &PtxTarget::sm90()).unwrap());
    insta::assert_snapshot!("warp_tile_mma_bf16", text);
}

/// One warpgroup's tile for sm_90a (bf16, 64 columns, a contraction of 64 in four `wgmma`
/// steps, 128-byte swizzle): the descriptors, the inline `wgmma.mma_async` and its fences.
#[test]
fn warpgroup_tile_on_tensor_cores() {
    let k = kiln_kernel::gpu::wgmma::warpgroup_tile(
        kiln_ir::DType::BF16,
        (64, 64),
        kiln_kernel::gpu::desc::WgSwizzle::B128,
        false,
        TargetInfo::h200().sums,
    )
    .unwrap();
    let p = kiln_kernel::gpu::ir::GpuProgram {
        scratch: Vec::new(),
        zeroed: Vec::new(),
        launches: vec![k],
    };
    let text = program_ptx(&p, &PtxTarget::sm90a()).unwrap();
    assert_eq!(text, program_ptx(&p, &PtxTarget::sm90a()).unwrap());
    insta::assert_snapshot!("warpgroup_tile_wgmma_bf16", text);
}

/// A product of bf16 operands with an f32 result on the tensor cores (one warp's 16 x 16
/// tile): the f32 product lowered for an H200, mapped with bf16 operands; its contraction of
/// 96 runs the H200's whole pipeline (3 stages of 32, two `mma` k-steps each).
#[test]
fn gemm_on_tensor_cores() {
    let src = "func @main(%0: f32[16,96], %1: f32[96,16]) -> f32[16,16] {\n  %2 = dot_general %0, %1 {lhs_batching_dimensions = [], rhs_batching_dimensions = [], lhs_contracting_dimensions = [1], rhs_contracting_dimensions = [0]} : f32[16,16]\n  return %2\n}\n";
    let target = TargetInfo::h200();
    let p =
        mapped::product_with_operands(src, kiln_ir::DType::BF16, &target, "k0_dot_general.product");
    assert_eq!(p.launches[0].kind, MapKind::GemmMma);
    let text = program_ptx(&p, &PtxTarget::sm90()).unwrap();
    assert_eq!(text, program_ptx(&p, &PtxTarget::sm90()).unwrap());
    insta::assert_snapshot!("gemm_mma_bf16", text);
}

/// A product of bf16 operands with an f32 result on sm_90a's warpgroups (one 64 x 64 block,
/// `Gpu::wgmma_tiles`): A K-major and B by rows MN-major, both copied with `cp.async`; its
/// contraction of 192 runs a ring of 3 stages of 64, one `wgmma` group kept in flight.
#[test]
fn gemm_on_warpgroups() {
    let src = "func @main(%0: f32[64,192], %1: f32[192,64]) -> f32[64,64] {\n  %2 = dot_general %0, %1 {lhs_batching_dimensions = [], rhs_batching_dimensions = [], lhs_contracting_dimensions = [1], rhs_contracting_dimensions = [0]} : f32[64,64]\n  return %2\n}\n";
    let mut target = TargetInfo::h200();
    let gpu = target.gpu.as_mut().unwrap();
    gpu.mma_stages = 3;
    gpu.wgmma_tiles = vec![kiln_kernel::target::GemmTile {
        m: 64,
        n: 64,
        k: 64,
        thread_m: 64,
        thread_n: 64,
    }];
    let p =
        mapped::product_with_operands(src, kiln_ir::DType::BF16, &target, "k0_dot_general.product");
    assert!(p.launches[0].uses_wgmma());
    let text = program_ptx(&p, &PtxTarget::sm90a()).unwrap();
    assert_eq!(text, program_ptx(&p, &PtxTarget::sm90a()).unwrap());
    insta::assert_snapshot!("gemm_wgmma_bf16", text);
}

/// The same product warp-specialized (`Gpu::wgmma_tma`): a producer warp loading A's box
/// and B's 64-column panel by TMA into a ring of 3 stages guarded by full and empty
/// mbarriers, the consumer warpgroup waiting, multiplying and releasing; the two tensor maps
/// as grid-constant parameters.
#[test]
fn gemm_on_warpgroups_loaded_by_tma() {
    let src = "func @main(%0: f32[64,192], %1: f32[192,64]) -> f32[64,64] {\n  %2 = dot_general %0, %1 {lhs_batching_dimensions = [], rhs_batching_dimensions = [], lhs_contracting_dimensions = [1], rhs_contracting_dimensions = [0]} : f32[64,64]\n  return %2\n}\n";
    let mut target = TargetInfo::h200();
    let gpu = target.gpu.as_mut().unwrap();
    gpu.mma_stages = 3;
    gpu.tile_dynamic_bytes = gpu.dynamic_shared_bytes;
    gpu.wgmma_tma = true;
    gpu.wgmma_tiles = vec![kiln_kernel::target::GemmTile {
        m: 64,
        n: 64,
        k: 64,
        thread_m: 64,
        thread_n: 64,
    }];
    let p =
        mapped::product_with_operands(src, kiln_ir::DType::BF16, &target, "k0_dot_general.product");
    assert!(p.launches[0].uses_wgmma() && p.launches[0].uses_tma());
    let text = program_ptx(&p, &PtxTarget::sm90a()).unwrap();
    assert_eq!(text, program_ptx(&p, &PtxTarget::sm90a()).unwrap());
    insta::assert_snapshot!("gemm_wgmma_tma_bf16", text);
}

/// One warp's TF32 tile: `cp.async` into f32 shared arrays, `ldmatrix` of f32 words,
/// `cvt.rna.tf32.f32` of every fragment register, one `mma.m16n8k8...tf32`.
#[test]
fn warp_tile_on_tf32_tensor_cores() {
    let k = kiln_kernel::gpu::mma::warp_tile_tf32(TargetInfo::h200().sums);
    let p = kiln_kernel::gpu::ir::GpuProgram {
        scratch: Vec::new(),
        zeroed: Vec::new(),
        launches: vec![k],
    };
    let text = program_ptx(&p, &PtxTarget::sm90()).unwrap();
    assert_eq!(text, program_ptx(&p, &PtxTarget::sm90()).unwrap());
    for needle in [
        "ldmatrix.sync.aligned.m8n8.x4.shared.b16",
        "cvt.rna.tf32.f32",
        "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32",
    ] {
        assert!(text.contains(needle), "no {needle} in\n{text}");
    }
    insta::assert_snapshot!("warp_tile_mma_tf32", text);
}

/// An f32 product on the TF32 tensor cores, as the options allow it (one warp's 16 x 16
/// tile, B stored by rows: its fragments by one shared load per element, A's by `ldmatrix`,
/// every fragment rounded with `cvt.rna.tf32.f32`); its contraction of 96 runs the H200's
/// pipeline for f32 tiles.
#[test]
fn gemm_on_tf32_tensor_cores() {
    let src = "func @main(%0: f32[16,96], %1: f32[96,16]) -> f32[16,16] {\n  %2 = dot_general %0, %1 {lhs_batching_dimensions = [], rhs_batching_dimensions = [], lhs_contracting_dimensions = [1], rhs_contracting_dimensions = [0]} : f32[16,16]\n  return %2\n}\n";
    let f = parse_func_text(src).unwrap();
    let opts = kiln_kernel::Options {
        matmul_precision: kiln_kernel::options::MatmulPrecision::Tf32,
        ..kiln_kernel::Options::default()
    };
    let ks = mapped_kernels(&f, &opts, &TargetInfo::h200()).unwrap();
    assert_eq!(ks.len(), 1);
    let p = ks[0].1.clone().unwrap();
    assert_eq!(p.launches[0].kind, MapKind::GemmMma);
    let text = program_ptx(&p, &PtxTarget::sm90()).unwrap();
    assert_eq!(text, program_ptx(&p, &PtxTarget::sm90()).unwrap());
    for needle in [
        "cp.async.ca.shared.global",
        "ldmatrix.sync.aligned.m8n8.x4.shared.b16",
        "cvt.rna.tf32.f32",
        "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32",
    ] {
        assert!(text.contains(needle), "no {needle} in\n{text}");
    }
    insta::assert_snapshot!("gemm_mma_tf32", text);
}

/// A bf16 product on the tensor cores whose ring (blocks of 128 x 64, 4 stages of 64: 96 KiB)
/// lies in dynamic shared memory, as an H200 that lets rings opt in maps it: one
/// `.extern .shared` array, A's and B's stages at their offsets in it.
#[test]
fn gemm_on_tensor_cores_in_dynamic_shared_memory() {
    let mut target = TargetInfo::h200();
    let g = target.gpu.as_mut().expect("a GPU");
    g.tile_dynamic_bytes = g.dynamic_shared_bytes;
    g.mma_stages = 4;
    let text = ptx_on(
        "func @main(%0: bf16[64,256], %1: bf16[256,32]) -> f32[64,32] {\n  %2 = dot_general %0, %1 {lhs_batching_dimensions = [], rhs_batching_dimensions = [], lhs_contracting_dimensions = [1], rhs_contracting_dimensions = [0]} : f32[64,32]\n  return %2\n}\n",
        MapKind::GemmMma,
        &target,
    );
    assert!(
        text.contains(".extern .shared .align 16 .b8 k0_dot_general_product_dynamic_shared[];"),
        "{text}"
    );
    insta::assert_snapshot!("gemm_mma_bf16_dynamic_shared", text);
}

#[test]
fn sort_by_keys() {
    insta::assert_snapshot!(
        "sort_by_keys",
        ptx(
            "func @main(%0: f32[2,8], %1: i32[2,8]) -> (f32[2,8], i32[2,8]) {\n  %2, %3 = sort %0, %1 {dimension = 1, is_stable = true, comparator = func @cmp(%0: f32[], %1: f32[], %2: i32[], %3: i32[]) -> pred[] {\n      %4 = compare %0, %1 {comparison_direction = LT} : pred[]\n      %5 = compare %1, %1 {comparison_direction = NE} : pred[]\n      %6 = compare %0, %0 {comparison_direction = EQ} : pred[]\n      %7 = and %5, %6 : pred[]\n      %8 = or %4, %7 : pred[]\n      return %8\n    }} : f32[2,8], i32[2,8]\n  return %2, %3\n}\n",
            MapKind::Sort
        )
    );
}

/// A long sort (slices past what a block holds) on an H200 whose blocks declare 192 bytes of
/// shared memory, so tiles are 16 f32 keys and a slice of 20 pads to 32: the tiles sorted in
/// shared memory into scratch, the one global stage between the two tiles (scratch to
/// scratch), and the last stages within tiles writing both operands in the sorted order.
#[test]
fn sort_by_keys_long() {
    let mut target = TargetInfo::h200();
    target.gpu.as_mut().expect("a GPU").static_shared_bytes = 192;
    insta::assert_snapshot!(
        "sort_by_keys_long",
        ptx_on(
            "func @main(%0: f32[20], %1: i32[20]) -> (f32[20], i32[20]) {\n  %2, %3 = sort %0, %1 {dimension = 0, is_stable = true, comparator = func @cmp(%0: f32[], %1: f32[], %2: i32[], %3: i32[]) -> pred[] {\n      %4 = compare %0, %1 {comparison_direction = LT} : pred[]\n      %5 = compare %1, %1 {comparison_direction = NE} : pred[]\n      %6 = compare %0, %0 {comparison_direction = EQ} : pred[]\n      %7 = and %5, %6 : pred[]\n      %8 = or %4, %7 : pred[]\n      return %8\n    }} : f32[20], i32[20]\n  return %2, %3\n}\n",
            MapKind::Sort,
            &target
        )
    );
}

/// A radix sort (slices past two blocks' tiles) on an H200 whose blocks declare 4,096 bytes of
/// shared memory, so the count and scatter blocks have 32 threads and 4-bit digits, and u8 keys
/// take two passes: the first pass's count (reading the key operand and mapping it), scan and
/// scatter (into scratch), the second's count, scan and scatter (writing both operands in the
/// sorted order).
#[test]
fn sort_by_keys_radix() {
    let mut target = TargetInfo::h200();
    target.gpu.as_mut().expect("a GPU").static_shared_bytes = 4096;
    insta::assert_snapshot!(
        "sort_by_keys_radix",
        ptx_on(
            "func @main(%0: u8[600], %1: i32[600]) -> (u8[600], i32[600]) {\n  %2, %3 = sort %0, %1 {dimension = 0, is_stable = true, comparator = func @cmp(%0: u8[], %1: u8[], %2: i32[], %3: i32[]) -> pred[] {\n      %4 = compare %0, %1 {comparison_direction = LT} : pred[]\n      return %4\n    }} : u8[600], i32[600]\n  return %2, %3\n}\n",
            MapKind::Sort,
            &target
        )
    );
}

/// A Cholesky factorization, a thread per matrix of the batch: the factor built column by
/// column in an f32 scratch matrix, then written with zeros above it (or NaN everywhere when
/// a pivot is not positive).
#[test]
fn linalg_cholesky() {
    insta::assert_snapshot!(
        "linalg_cholesky",
        ptx(
            "func @main(%0: f32[2,3,3]) -> f32[2,3,3] {\n  %1 = cholesky %0 {lower = true} : f32[2,3,3]\n  return %1\n}\n",
            MapKind::Linalg
        )
    );
}

/// A sort by absolute value (a comparator that is not one key's order), a thread per slice:
/// the reference's merge sort over the slice's positions in scratch, segments of 12 split in
/// two of 6 sorted by insertion, then merged.
#[test]
fn sort_by_comparator_merge() {
    insta::assert_snapshot!(
        "sort_by_comparator_merge",
        ptx(
            "func @main(%0: f32[2,12]) -> f32[2,12] {\n  %1 = sort %0 {dimension = 1, is_stable = true, comparator = func @c(%0: f32[], %1: f32[]) -> pred[] {\n      %2 = abs %0 : f32[]\n      %3 = abs %1 : f32[]\n      %4 = compare %2, %3 {comparison_direction = LT} : pred[]\n      return %4\n    }} : f32[2,12]\n  return %1\n}\n",
            MapKind::Sort
        )
    );
}
