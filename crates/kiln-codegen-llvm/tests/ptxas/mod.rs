//! Where the tests find ptxas and how they assemble kernels with it, shared by the PTX tests
//! (`ptx.rs`, `ptx_tma.rs`, `ptx_strided.rs`, ...) and the pack's GPU test
//! (`tests/gpu_pack.rs`, by path).

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

/// Assembles every job `(name, PTX text, sm)` with ptxas (in a scratch directory named after
/// `label`), prints how many it took, and fails with each rejected kernel's name and ptxas's
/// message; without ptxas (outside CI) only says so.
#[allow(dead_code)]
pub fn assemble_jobs(label: &str, jobs: &[(String, String, String)]) {
    let Some(ptxas) = ptxas() else {
        println!("ptxas not found (cargo xtask test installs it): PTX text only");
        return;
    };
    let dir = std::env::temp_dir().join(format!("kiln-ptx-{label}-{}", std::process::id()));
    let mut rejected = Vec::new();
    for (j, (name, text, sm)) in jobs.iter().enumerate() {
        let (ok, msg) = assemble(&ptxas, &dir, &j.to_string(), sm, &[], text);
        if !ok {
            rejected.push(format!("{name} ({sm}): ptxas rejected it: {msg}"));
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    println!(
        "ptxas assembled {} of {}",
        jobs.len() - rejected.len(),
        jobs.len()
    );
    assert!(rejected.is_empty(), "{}", rejected.join("\n"));
}

/// The PTX of every kernel step of each `(program text, target)` (mapped with the default
/// options; sm_90a for launches on warpgroups, else sm_80 and sm_90) as jobs for
/// [`assemble_jobs`], and how many steps' programs mention `note`.
#[allow(dead_code)]
pub fn ptx_jobs(
    programs: &[(String, &kiln_kernel::target::TargetInfo)],
    note: &str,
) -> (Vec<(String, String, String)>, usize) {
    use kiln_codegen_llvm::ptx::{PtxTarget, mapped_kernels, program_ptx};
    let opts = kiln_kernel::Options::default();
    let (mut jobs, mut noted) = (Vec::new(), 0);
    for (i, (src, target)) in programs.iter().enumerate() {
        let f = kiln_ir::parse_func_text(src).unwrap_or_else(|e| panic!("{e}\n{src}"));
        for (name, p) in mapped_kernels(&f, &opts, target).unwrap() {
            let p = p.unwrap_or_else(|e| panic!("program {i} {name}: not mapped: {e}"));
            noted += usize::from(format!("{p:?}").contains(note));
            let sms = if p.launches.iter().any(|l| l.uses_wgmma()) {
                vec![PtxTarget::sm90a()]
            } else {
                vec![PtxTarget::sm80(), PtxTarget::sm90()]
            };
            for sm in sms {
                let text = program_ptx(&p, &sm)
                    .unwrap_or_else(|e| panic!("program {i} {name} ({}): {e}", sm.sm));
                jobs.push((format!("program {i} {name}"), text, sm.sm.clone()));
            }
        }
    }
    (jobs, noted)
}
