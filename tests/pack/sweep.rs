//! The sweep of a GPU pack: each workload again under other values of the target's mapping
//! choices ([`kiln_kernel::target::Gpu`]: block tiles of products, rows per attention block,
//! threads and blocks of memory-bound kernels), so that one run on a GPU measures which
//! values are fastest there. `check.py` times each variant as it times the workload, checks its
//! results against PyTorch's, and prints the variants side by side; the defaults in
//! `Gpu::h200` are chosen from such tables (`docs/performance.md`).

use kiln_kernel::target::{GemmTile, Gpu};

/// One variant: the workload it reruns, its label, and the change to the H200's target.
pub struct Variant {
    /// The workload's name ([`super::workloads::Workload::name`]).
    pub workload: &'static str,
    /// What differs from the default, for the table (also the folder's name).
    pub label: String,
    /// The change.
    pub change: Box<dyn Fn(&mut Gpu)>,
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

/// The variants, in the order they are timed.
pub fn variants() -> Vec<Variant> {
    let mut out = Vec::new();
    // Tensor-core tiles of the bf16 product: block m x n, a warp's tile tm x tn (the 16 x 16
    // tile stays as the fallback of small products).
    for (m, n, tm, tn) in [
        (128, 64, 32, 32),
        (64, 128, 32, 32),
        (128, 128, 32, 32),
        (128, 128, 64, 32),
        (128, 128, 32, 64),
        (128, 128, 64, 64),
        (256, 128, 64, 32),
    ] {
        out.push(Variant {
            workload: "matmul_bf16_8192",
            label: format!("mma_{m}x{n}_warp_{tm}x{tn}"),
            change: Box::new(move |g| g.mma_tiles.insert(0, tile(m, n, 16, tm, tn))),
        });
    }
    // CUDA-core tiles of the f32 product with its epilogue.
    for (m, n, k, tm, tn) in [
        (128, 128, 16, 8, 8),
        (128, 64, 8, 8, 8),
        (64, 128, 8, 4, 8),
        (128, 128, 8, 8, 4),
        (64, 64, 8, 4, 4),
        (64, 64, 16, 4, 4),
    ] {
        out.push(Variant {
            workload: "linear_bias_gelu_4096",
            label: format!("tile_{m}x{n}x{k}_thread_{tm}x{tn}"),
            change: Box::new(move |g| g.gemm_tiles.insert(0, tile(m, n, k, tm, tn))),
        });
    }
    // Query rows per attention block.
    for workload in ["attention_16x16x1024x64", "attention_causal_16x16x1024x64"] {
        for w in [1, 2, 8, 16, 32] {
            out.push(Variant {
                workload,
                label: format!("rows_{w}"),
                change: Box::new(move |g| g.attention_warps = vec![w, 4, 2, 1]),
            });
        }
    }
    // Memory-bound kernels: threads per block (warps per block of a row reduction), blocks
    // per multiprocessor, and where a row gets a whole block.
    for workload in [
        "gelu_chain_64M",
        "softmax_8192x8192",
        "layernorm_32768x1024",
    ] {
        for threads in [128, 512, 1024] {
            out.push(Variant {
                workload,
                label: format!("block_{threads}"),
                change: Box::new(move |g| g.elementwise_block = threads),
            });
        }
        for blocks in [4, 16, 32] {
            out.push(Variant {
                workload,
                label: format!("blocks_per_sm_{blocks}"),
                change: Box::new(move |g| g.blocks_per_sm = blocks),
            });
        }
    }
    for (workload, min) in [("softmax_8192x8192", 4096), ("layernorm_32768x1024", 1024)] {
        out.push(Variant {
            workload,
            label: format!("block_rows_from_{min}"),
            change: Box::new(move |g| g.block_reduce_min = min),
        });
    }
    out
}
