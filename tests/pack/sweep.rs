//! The sweep of a GPU pack: each workload again under other values of the target's mapping
//! choices ([`kiln_kernel::target::Gpu`]: block tiles of products, the tensor-core pipeline's
//! stages and stage length, attention's register tiles and rows per block, rings and tiles in
//! dynamic shared memory, threads and blocks of memory-bound kernels, where rows are cached), so that one run on a GPU measures which values are fastest
//! there. `check.py` times each variant as it times the workload, checks its results against
//! PyTorch's, and prints the variants side by side; the defaults in `Gpu::h200` are chosen from
//! such tables (`docs/performance.md`).

use kiln_kernel::target::{AttentionTile, GemmTile, Gpu, TargetInfo};

/// One variant: the workload it reruns, its label, the SM its PTX is rendered for, and the
/// change to the H200's target.
pub struct Variant {
    /// The SM (`sm_90`; `sm_90a` for warpgroup products, whose target
    /// ([`kiln::aot::Target::ptx`]) has `Gpu::wgmma` set).
    pub sm: &'static str,
    /// The workload's name ([`super::workloads::Workload::name`]).
    pub workload: &'static str,
    /// What differs from the default, for the table (also the folder's name).
    pub label: String,
    /// The change.
    pub change: Box<dyn Fn(&mut TargetInfo)>,
}

/// A change of the GPU's description alone.
fn gpu(f: impl Fn(&mut Gpu) + 'static) -> Box<dyn Fn(&mut TargetInfo)> {
    Box::new(move |t: &mut TargetInfo| {
        if let Some(g) = t.gpu.as_mut() {
            f(g)
        }
    })
}

fn tile(m: usize, n: usize, k: usize, thread_m: usize, thread_n: usize) -> GemmTile {
    GemmTile {
        m,
        n,
        k,
        thread_m,
        thread_n,
    }
}

/// The variants, in the order they are timed: the neighbours of the H200's defaults (the
/// fastest of the previous sweep, docs/performance.md).
pub fn variants() -> Vec<Variant> {
    let mut out = Vec::new();
    // The tensor-core product (the default: blocks of 128x64, warps of 64x32, 2 stages of 64,
    // swizzled; the fastest of the fourth GPU run's sweep). Its tiles and pipelines: block
    // m x n, a warp's tile tm x tn, stages of k. Under the 48 KiB of shared memory the PTX
    // declares statically, a 128x128 block holds 3 stages of 32 at most, a 128x64 one 2 of 64
    // or 4 of 32.
    for (m, n, tm, tn, stages, k) in [
        (128, 128, 64, 32, 4, 16),
        (128, 128, 64, 32, 3, 32),
        (128, 64, 64, 32, 4, 32),
        (128, 64, 64, 32, 3, 32),
        (128, 64, 32, 32, 2, 64),
        (128, 64, 64, 64, 2, 64),
        (64, 128, 32, 64, 2, 64),
        (64, 64, 32, 32, 3, 64),
        (64, 64, 32, 32, 4, 32),
    ] {
        out.push(Variant {
            sm: "sm_90",
            workload: "matmul_bf16_8192",
            label: format!("mma_{m}x{n}_warp_{tm}x{tn}_stages_{stages}_k_{k}"),
            change: gpu(move |g| {
                g.mma_stages = stages;
                g.mma_tiles.insert(0, tile(m, n, k, tm, tn));
            }),
        });
    }
    // Deeper rings of longer stages than 48 KiB holds, in dynamic shared memory (up to the
    // 227 KiB an H200 block may opt into; not measured yet): 128x128 in 3 or 4 stages of 64
    // (96 or 128 KiB), 128x64 in 4 of 64 (96 KiB), 128x256 (warps of 64x64) in 3 of 64 or 4
    // of 32 (144 or 96 KiB).
    for (m, n, tm, tn, stages, k) in [
        (128, 128, 64, 32, 3, 64),
        (128, 128, 64, 32, 4, 64),
        (128, 64, 64, 32, 4, 64),
        (128, 256, 64, 64, 3, 64),
        (128, 256, 64, 64, 4, 32),
    ] {
        out.push(Variant {
            sm: "sm_90",
            workload: "matmul_bf16_8192",
            label: format!("mma_dynamic_{m}x{n}_warp_{tm}x{tn}_stages_{stages}_k_{k}"),
            change: gpu(move |g| {
                g.tile_dynamic_bytes = g.dynamic_shared_bytes;
                g.mma_stages = stages;
                g.mma_tiles.insert(0, tile(m, n, k, tm, tn));
            }),
        });
    }
    // Warpgroup products (sm_90a `wgmma`, not measured yet; `Gpu::wgmma_tiles`, none by
    // default): blocks of one or two warpgroups of 64 rows, up to 256 columns, stages of 64;
    // 64x64 in 3 stages within the 48 KiB declared statically, the others in dynamic shared
    // memory. B stored by rows (this workload's) is staged MN-major in 64-column panels by
    // `cp.async` and read with `imm-trans` 1.
    for (m, n, stages) in [
        (64, 64, 3),
        (128, 64, 4),
        (128, 128, 3),
        (128, 128, 4),
        (128, 256, 3),
        (64, 256, 4),
    ] {
        let dynamic = 2 * (m + n) * 64 * stages > 48 << 10;
        out.push(Variant {
            sm: "sm_90a",
            workload: "matmul_bf16_8192",
            label: format!(
                "wgmma_{}{m}x{n}_stages_{stages}_k_64",
                if dynamic { "dynamic_" } else { "" }
            ),
            change: gpu(move |g| {
                if dynamic {
                    g.tile_dynamic_bytes = g.dynamic_shared_bytes;
                }
                g.mma_stages = stages;
                g.wgmma_tiles.insert(0, tile(m, n, 64, 64, n));
            }),
        });
    }
    // Warp-specialized warpgroup products (`Gpu::wgmma_tma`, not measured yet): a producer
    // warp loading A and B by TMA into a ring of `ring` stages guarded by mbarriers, one or
    // two consumer warpgroups; all in dynamic shared memory.
    for (m, n, ring) in [
        (64, 64, 4),
        (128, 64, 4),
        (128, 128, 4),
        (128, 256, 3),
        (128, 256, 4),
        (64, 256, 4),
    ] {
        out.push(Variant {
            sm: "sm_90a",
            workload: "matmul_bf16_8192",
            label: format!("wgmma_dynamic_tma_{m}x{n}_ring_{ring}"),
            change: gpu(move |g| {
                g.tile_dynamic_bytes = g.dynamic_shared_bytes;
                g.mma_stages = ring;
                g.wgmma_tma = true;
                g.wgmma_tiles.insert(0, tile(m, n, 64, 64, n));
            }),
        });
    }
    // The TMA ring with the consumers' first thread issuing the loads (`Gpu::wgmma_tma_inline`):
    // no producer warp, so ptxas does not cap the consumers' registers at 168 (128x128
    // holds its accumulators without spilling).
    for (m, n, ring) in [(64, 64, 4), (128, 128, 4), (128, 256, 3)] {
        out.push(Variant {
            sm: "sm_90a",
            workload: "matmul_bf16_8192",
            label: format!("wgmma_dynamic_tma_inline_{m}x{n}_ring_{ring}"),
            change: gpu(move |g| {
                g.tile_dynamic_bytes = g.dynamic_shared_bytes;
                g.mma_stages = ring;
                g.wgmma_tma = true;
                g.wgmma_tma_inline = true;
                g.wgmma_tiles.insert(0, tile(m, n, 64, 64, n));
            }),
        });
    }
    // Warpgroup products with longer chunks of the sum tree: one level of accumulators (a
    // 128x256 block's warpgroup holds 128 per level and thread).
    for (m, n, stages) in [(128, 128, 4), (128, 256, 3)] {
        out.push(Variant {
            sm: "sm_90a",
            workload: "matmul_bf16_8192",
            label: format!("wgmma_dynamic_{m}x{n}_sum_leaf_8192"),
            change: Box::new(move |t: &mut TargetInfo| {
                t.sums.leaf = 8192;
                if let Some(g) = t.gpu.as_mut() {
                    g.tile_dynamic_bytes = g.dynamic_shared_bytes;
                    g.mma_stages = stages;
                    g.wgmma_tiles.insert(0, tile(m, n, 64, 64, n));
                }
            }),
        });
    }
    // The tiles staged without the swizzle (the layout the third GPU run timed).
    out.push(Variant {
        sm: "sm_90",
        workload: "matmul_bf16_8192",
        label: "mma_swizzle_off".into(),
        change: gpu(|g| g.mma_swizzle = false),
    });
    // Longer chunks of the products' sum trees: fewer levels of accumulators (registers) per
    // thread, a looser error bound (what this costs in time is what the table shows).
    for (workload, leaf) in [
        ("matmul_bf16_8192", 1024),
        ("matmul_bf16_8192", 8192),
        ("linear_bias_gelu_4096", 4096),
    ] {
        out.push(Variant {
            sm: "sm_90",
            workload,
            label: format!("sum_leaf_{leaf}"),
            change: Box::new(move |t: &mut TargetInfo| t.sums.leaf = leaf),
        });
    }
    // CUDA-core tiles of the f32 product with its epilogue.
    for (m, n, k, tm, tn) in [(128, 64, 16, 8, 8), (128, 32, 8, 8, 4), (64, 64, 16, 4, 4)] {
        out.push(Variant {
            sm: "sm_90",
            workload: "linear_bias_gelu_4096",
            label: format!("tile_{m}x{n}x{k}_thread_{tm}x{tn}"),
            change: gpu(move |g| g.gemm_tiles.insert(0, tile(m, n, k, tm, tn))),
        });
    }
    // Stages of the CUDA-core product's ring (2, double buffering, is the default).
    for stages in [3, 4] {
        out.push(Variant {
            sm: "sm_90",
            workload: "linear_bias_gelu_4096",
            label: format!("gemm_stages_{stages}"),
            change: gpu(move |g| g.gemm_stages = stages),
        });
    }
    // Attention by register tiles (`Gpu::attention_tiles`, not yet measured; the default:
    // 64 query rows, steps of 32 keys, a thread 4 rows x 4 keys, up to 8 output columns): a
    // tile in front, block rows x keys a step, a thread's rows x keys and its most output
    // columns. All fit the 48 KiB of static shared memory with heads and outputs of 64.
    for (rows, keys, tr, tk, tc) in [
        (64, 32, 8, 4, 8),
        (64, 32, 2, 4, 8),
        (32, 32, 4, 4, 8),
        (32, 32, 2, 4, 8),
        (64, 32, 4, 8, 16),
        (16, 64, 2, 8, 8),
    ] {
        for workload in ["attention_16x16x1024x64", "attention_causal_16x16x1024x64"] {
            out.push(Variant {
                sm: "sm_90",
                workload,
                label: format!("tile_{rows}x{keys}_thread_{tr}x{tk}_cols_{tc}"),
                change: gpu(move |g| {
                    g.attention_tiles.insert(
                        0,
                        AttentionTile {
                            rows,
                            keys,
                            thread_rows: tr,
                            thread_keys: tk,
                            thread_cols: tc,
                        },
                    )
                }),
            });
        }
    }
    // Larger attention tiles in dynamic shared memory (not measured yet): 128 query rows a
    // block with steps of 32 keys (66 KiB with heads and outputs of 64) or 64 (97 KiB).
    for (rows, keys, tr, tk, tc) in [(128, 32, 8, 4, 8), (128, 64, 8, 8, 8)] {
        for workload in ["attention_16x16x1024x64", "attention_causal_16x16x1024x64"] {
            out.push(Variant {
                sm: "sm_90",
                workload,
                label: format!("tile_dynamic_{rows}x{keys}_thread_{tr}x{tk}_cols_{tc}"),
                change: gpu(move |g| {
                    g.tile_dynamic_bytes = g.dynamic_shared_bytes;
                    g.attention_tiles.insert(
                        0,
                        AttentionTile {
                            rows,
                            keys,
                            thread_rows: tr,
                            thread_keys: tk,
                            thread_cols: tc,
                        },
                    )
                }),
            });
        }
    }
    // Without tiles: a warp per query row (the fifth and sixth runs' mapping), its query rows
    // per block.
    for w in [4, 16, 32] {
        for workload in ["attention_16x16x1024x64", "attention_causal_16x16x1024x64"] {
            out.push(Variant {
                sm: "sm_90",
                workload,
                label: format!("warp_rows_{w}"),
                change: gpu(move |g| {
                    g.attention_tiles.clear();
                    g.attention_warps = vec![w, 4, 2, 1];
                }),
            });
        }
    }
    // bf16 attention on the tensor cores (the default: 4 warps of 16 query rows, steps of 64
    // keys double buffered, 40 KiB with heads of 64): steps of 32 and 128 keys, 8 warps (48
    // KiB), and deeper rings in dynamic shared memory (not measured yet).
    for (keys, warps, stages, dynamic) in [
        (32, 4, 2, false),
        (128, 4, 2, true),
        (64, 8, 2, false),
        (64, 4, 3, true),
        (64, 4, 4, true),
    ] {
        for workload in [
            "attention_bf16_16x16x1024x64",
            "attention_causal_bf16_16x16x1024x64",
        ] {
            let room = if dynamic { "dynamic_" } else { "" };
            out.push(Variant {
                workload,
                label: format!("mma_{room}keys_{keys}_warps_{warps}_stages_{stages}"),
                sm: "sm_90",
                change: gpu(move |g| {
                    if dynamic {
                        g.tile_dynamic_bytes = g.dynamic_shared_bytes;
                    }
                    g.mma_attention_keys = keys;
                    g.mma_attention_warps = warps;
                    g.mma_attention_stages = stages;
                }),
            });
        }
    }
    // A thread's accesses of an elementwise kernel: one element (4 bytes) or two.
    for bytes in [4, 8] {
        out.push(Variant {
            sm: "sm_90",
            workload: "gelu_chain_64M",
            label: format!("vector_bytes_{bytes}"),
            change: gpu(move |g| g.vector_bytes = bytes),
        });
    }
    // Row caches (a row that several passes read loaded once): the default caches rows in
    // registers (then shared memory); against them, shared memory only, and none (every pass
    // reads global memory).
    for workload in ["softmax_8192x8192", "layernorm_32768x1024"] {
        out.push(Variant {
            sm: "sm_90",
            workload,
            label: "row_cache_shared".into(),
            change: gpu(|g| g.row_registers = 0),
        });
        out.push(Variant {
            sm: "sm_90",
            workload,
            label: "row_cache_off".into(),
            change: gpu(|g| {
                g.row_registers = 0;
                g.row_shared_bytes = 0;
            }),
        });
    }
    // Warps per block of a warp-per-row reduction.
    out.push(Variant {
        sm: "sm_90",
        workload: "layernorm_32768x1024",
        label: "block_128".into(),
        change: gpu(|g| g.elementwise_block = 128),
    });
    out
}
