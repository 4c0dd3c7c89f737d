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

/// Assembles `text` with `ptxas` for `sm` (`-arch=sm`, then `extra` arguments such as `-v`)
/// as `dir/stem.ptx`, removing its files after: whether ptxas accepted it, and what it printed
/// on its standard error (its messages, and with `-v` its report of registers and spills).
pub fn assemble(
    ptxas: &Path,
    dir: &Path,
    stem: &str,
    sm: &str,
    extra: &[&str],
    text: &str,
) -> (bool, String) {
    std::fs::create_dir_all(dir).unwrap();
    let src = dir.join(format!("{stem}.ptx"));
    let cubin = dir.join(format!("{stem}.cubin"));
    std::fs::write(&src, text).unwrap();
    let out = std::process::Command::new(ptxas)
        .arg(format!("-arch={sm}"))
        .args(extra)
        .arg(&src)
        .arg("-o")
        .arg(&cubin)
        .output()
        .unwrap();
    let _ = std::fs::remove_file(&src);
    let _ = std::fs::remove_file(&cubin);
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}
