//! Where the tests find ptxas, shared by the PTX tests (`ptx.rs`, `ptx_tma.rs`) and the pack's
//! GPU test (`tests/gpu_pack.rs`, by path).

use std::path::{Path, PathBuf};

/// Where `cargo xtask test` installs ptxas (or `KILN_PTXAS`); in CI its absence is an error.
pub fn ptxas() -> Option<PathBuf> {
    let found = std::env::var("KILN_PTXAS")
        .ok()
        .map(PathBuf::from)
        .or_else(|| {
            let home = std::env::var("HOME").ok()?;
            let p = Path::new(&home).join(".cache/kiln/ptxas/nvidia/cuda_nvcc/bin/ptxas");
            p.exists().then_some(p)
        });
    if found.is_none() && std::env::var_os("CI").is_some() {
        panic!("ptxas not found in CI (cargo xtask test installs it, or set KILN_PTXAS)");
    }
    found
}
