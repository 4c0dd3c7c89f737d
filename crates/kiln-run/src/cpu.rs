//! CPU artifacts: their programs ([`CpuProgram`]: a lowered program, the shared library of its
//! kernels and its checksum), the check that this machine has the CPU features they were
//! compiled for ([`missing_features`]), and loading them to run ([`open`]).
//!
//! A function with control flow is several programs, its own first, then (depth first) those
//! of its control steps' regions, each with a library of its own. The runtime never trusts
//! what it can derive: it lowers each program again from its text (fusion and the loop
//! schedules only, as `kiln-run` derives a GPU plan), checks that the kernels it derives are
//! those the library was compiled from (the checksum of their description) and that the
//! memory plan prints as the stored one, then runs the steps with
//! [`kiln_runtime::kernel_program`], exactly as the CPU backend runs a function it compiled.
//! A library is loaded only when its bytes match the manifest's checksum, from a private copy
//! ([`kiln_runtime::library::Library::from_bytes`]).

use crate::Error;
use crate::artifact::{Artifact, Kind, relower};
use kiln_ir::Func;
use kiln_runtime::kernel_program::{KernelTable, LoadedProgram, RegionFuncs};
use kiln_runtime::library::{Library, checksum};
use serde_json::{Value, json};
use std::sync::Arc;

/// One program of a CPU artifact.
#[derive(Clone, Debug, PartialEq)]
pub struct CpuProgram {
    /// The program as lowered (optimized, canonicalized, scheduled).
    pub program: Func,
    /// Its donated parameters (a loop body's carries; empty: none).
    pub donated: Vec<bool>,
    /// The shared library of its kernel functions, if it has kernels.
    pub library: Option<Vec<u8>>,
    /// The checksum of [`CpuProgram::library`]'s bytes, as the manifest records it.
    pub checksum: Option<String>,
    /// The checksum of what its kernel functions were compiled from
    /// ([`KernelTable::source_text`]).
    pub kernels: String,
    /// Its memory plan, printed.
    pub memory: String,
    /// For each control step, the indices of its regions' programs (each after this one).
    pub regions: Vec<(usize, Vec<usize>)>,
}

/// The files of program `i`: its text, its memory plan, its library.
pub fn files(i: usize) -> (String, String, String) {
    (
        format!("programs/{i:03}.kiln"),
        format!("programs/{i:03}.plan.txt"),
        format!("kernels/{i:03}.so"),
    )
}

/// Program `i`'s entry in the manifest's `files.programs`.
pub fn program_json(i: usize, p: &CpuProgram) -> Value {
    let (text, plan, lib) = files(i);
    json!({
        "program": text,
        "plan": plan,
        "donated": p.donated,
        "library": p.library.as_ref().map(|_| lib),
        "checksum": p.checksum,
        "kernels": p.kernels,
        "regions": p.regions.iter().map(|(s, ps)| json!({"step": s, "programs": ps})).collect::<Vec<_>>(),
    })
}

/// The program of entry `i` of the manifest's `files.programs`, its files read with `read`
/// (text) and `read_bytes`: the library's bytes checked against the manifest's checksum.
pub fn program_from_json(
    i: usize,
    v: &Value,
    count: usize,
    read: &dyn Fn(&str) -> Result<String, Error>,
    read_bytes: &dyn Fn(&str) -> Result<Vec<u8>, Error>,
) -> Result<CpuProgram, Error> {
    let bad = |m: String| Error::Artifact(format!("manifest.json files.programs[{i}]: {m}"));
    let name = |k: &str| {
        v.get(k)
            .and_then(Value::as_str)
            .filter(|n| !n.contains("..") && !n.starts_with('/'))
            .map(str::to_string)
            .ok_or_else(|| bad(format!("no `{k}` file inside the artifact")))
    };
    let text = name("program")?;
    let program = kiln_ir::parse_func_text(&read(&text)?)
        .map_err(|e| Error::Artifact(format!("{text}: {e}")))?;
    kiln_ir::verify(&program).map_err(|e| Error::Artifact(format!("{text}: {e}")))?;
    let memory = read(&name("plan")?)?;
    let donated = v
        .get("donated")
        .and_then(Value::as_array)
        .and_then(|d| d.iter().map(Value::as_bool).collect::<Option<Vec<_>>>())
        .filter(|d| d.is_empty() || d.len() == program.params.len())
        .ok_or_else(|| {
            bad(format!(
                "`donated` is not a list of booleans, one per parameter of @{} (or none)",
                program.name
            ))
        })?;
    let kernels = v
        .get("kernels")
        .and_then(Value::as_str)
        .ok_or_else(|| bad("no `kernels` checksum".into()))?
        .to_string();
    let (library, sum) = match v.get("library") {
        None | Some(Value::Null) => (None, None),
        Some(_) => {
            let lib = name("library")?;
            let want = v
                .get("checksum")
                .and_then(Value::as_str)
                .ok_or_else(|| bad(format!("no checksum for {lib}")))?;
            let bytes = read_bytes(&lib)?;
            let got = checksum(&bytes);
            if got != want {
                return Err(Error::Artifact(format!(
                    "{lib} is damaged: the checksum of its bytes is {got}, the manifest records \
                     {want} (copy the artifact again, or compile it again)"
                )));
            }
            (Some(bytes), Some(want.to_string()))
        }
    };
    let regions = v
        .get("regions")
        .and_then(Value::as_array)
        .ok_or_else(|| bad("`regions` is not a list".into()))?
        .iter()
        .map(|r| {
            let step = r.get("step").and_then(Value::as_u64);
            let ps = r.get("programs").and_then(Value::as_array).and_then(|ps| {
                ps.iter()
                    .map(|p| p.as_u64().map(|p| p as usize))
                    .collect::<Option<Vec<_>>>()
            });
            match (step, ps) {
                // Regions come after their program: no program runs itself.
                (Some(s), Some(ps)) if ps.iter().all(|&p| p > i && p < count) => {
                    Ok((s as usize, ps))
                }
                _ => Err(bad(format!(
                    "regions entry {r} is not a step and programs after this one"
                ))),
            }
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok(CpuProgram {
        program,
        donated,
        library,
        checksum: sum,
        kernels,
        memory,
        regions,
    })
}

/// Whether this machine has the x86 feature LLVM names `name` (`None`: a feature this check
/// does not know, which is not checked).
pub fn has_feature(name: &str) -> Option<bool> {
    #[cfg(target_arch = "x86_64")]
    {
        macro_rules! table {
            ($($llvm:literal => $rust:tt),* $(,)?) => {
                match name {
                    $($llvm => Some(std::arch::is_x86_feature_detected!($rust)),)*
                    _ => None,
                }
            };
        }
        table! {
            "sse" => "sse", "sse2" => "sse2", "sse3" => "sse3", "ssse3" => "ssse3",
            "sse4.1" => "sse4.1", "sse4.2" => "sse4.2", "sse4a" => "sse4a",
            "avx" => "avx", "avx2" => "avx2", "fma" => "fma", "f16c" => "f16c",
            "bmi" => "bmi1", "bmi2" => "bmi2", "lzcnt" => "lzcnt", "popcnt" => "popcnt",
            "movbe" => "movbe", "aes" => "aes", "pclmul" => "pclmulqdq", "sha" => "sha",
            "adx" => "adx", "rdrnd" => "rdrand", "rdseed" => "rdseed", "cx16" => "cmpxchg16b",
            "xsave" => "xsave", "xsaveopt" => "xsaveopt", "xsavec" => "xsavec",
            "xsaves" => "xsaves", "gfni" => "gfni", "vaes" => "vaes",
            "vpclmulqdq" => "vpclmulqdq", "avx512f" => "avx512f", "avx512cd" => "avx512cd",
            "avx512bw" => "avx512bw", "avx512dq" => "avx512dq", "avx512vl" => "avx512vl",
            "avx512ifma" => "avx512ifma", "avx512vbmi" => "avx512vbmi",
            "avx512vbmi2" => "avx512vbmi2", "avx512vnni" => "avx512vnni",
            "avx512bitalg" => "avx512bitalg", "avx512vpopcntdq" => "avx512vpopcntdq",
            "avx512bf16" => "avx512bf16", "avx512fp16" => "avx512fp16",
            "avxvnni" => "avxvnni",
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = name;
        None
    }
}

/// The features of `features` (LLVM's list: `+avx2,-avx512f,...`) that are required (`+`) and
/// that `has` says this machine lacks, in order.
pub fn missing_features(features: &str, has: &dyn Fn(&str) -> Option<bool>) -> Vec<String> {
    features
        .split(',')
        .filter_map(|f| f.trim().strip_prefix('+'))
        .filter(|f| has(f) == Some(false))
        .map(str::to_string)
        .collect()
}

/// Checks that this machine runs `a`'s code: an x86-64 CPU with every feature it requires.
pub fn check_machine(a: &Artifact) -> Result<(), Error> {
    let Kind::Cpu { cpu } = &a.target.kind else {
        return Err(Error::Device(
            "a GPU artifact runs on `cuda:N` or the `emulator`, not on the CPU".into(),
        ));
    };
    if std::env::consts::ARCH != "x86_64" {
        return Err(Error::Device(format!(
            "this machine is {}; the artifact's code is for an x86-64 CPU ({cpu})",
            std::env::consts::ARCH
        )));
    }
    let missing = missing_features(&a.target.features, &has_feature);
    if !missing.is_empty() {
        return Err(Error::Device(format!(
            "this CPU lacks {} the artifact was compiled for (CPU {cpu}): {}; compile it \
             for this machine (`kiln::aot::Target::host()`) or a CPU without them",
            if missing.len() == 1 {
                "a feature"
            } else {
                "features"
            },
            missing.join(", ")
        )));
    }
    Ok(())
}

/// `a`'s programs loaded to run on this CPU (checked with [`check_machine`] first): each
/// lowered again and checked against what was stored, its library loaded and its kernel
/// functions looked up.
pub fn open(a: &Artifact) -> Result<LoadedProgram, Error> {
    check_machine(a)?;
    if a.programs.is_empty() {
        return Err(Error::Artifact("a CPU artifact without programs".into()));
    }
    open_program(a, 0)
}

fn open_program(a: &Artifact, i: usize) -> Result<LoadedProgram, Error> {
    let p = &a.programs[i];
    let (_, plan_file, lib_file) = files(i);
    let lowered = relower(&p.program, &p.donated, &a.options, &a.target.info)
        .map_err(|e| Error::Artifact(format!("program {i}: {e}")))?;
    let table = KernelTable::new(&lowered);
    if checksum(table.source_text(&lowered.func).as_bytes()) != p.kernels {
        return Err(Error::Artifact(format!(
            "program {i} (@{}): the kernels this kiln-run ({}) derives are not those its \
             library was compiled from (the artifact was written by kiln {}); compile the \
             artifact again with this kiln",
            p.program.name,
            crate::artifact::KILN_VERSION,
            a.kiln_version
        )));
    }
    let library = p
        .library
        .as_ref()
        .map(|bytes| Library::from_bytes(bytes, &lib_file).map(Arc::new))
        .transpose()
        .map_err(Error::Artifact)?;
    let mut regions = |step: usize, want: RegionFuncs| {
        let ids = p
            .regions
            .iter()
            .find(|(s, _)| *s == step)
            .map(|(_, ids)| ids.clone())
            .unwrap_or_default();
        if ids.len() != want.len() {
            return Err(format!(
                "program {i} step #{step}: {} region programs listed for its {} regions",
                ids.len(),
                want.len()
            ));
        }
        ids.into_iter()
            .map(|r| {
                open_program(a, r)
                    .map(|l| Box::new(l) as Box<dyn kiln_runtime::Region>)
                    .map_err(|e| e.to_string())
            })
            .collect()
    };
    // SAFETY: the library's bytes are the ones its manifest's checksum names, compiled (by
    // kiln::aot) from the kernels whose description's checksum was just derived again here,
    // for a CPU whose features this machine has (check_machine).
    let loaded = unsafe {
        kiln_runtime::kernel_program::load(
            lowered,
            library,
            &lib_file,
            &a.target.info,
            &a.options,
            &mut regions,
        )
    }
    .map_err(Error::Artifact)?;
    let memory = loaded.program().memory_plan().to_string();
    if memory != p.memory {
        return Err(Error::Artifact(format!(
            "{plan_file}: the stored memory plan is not the one this kiln-run ({}) derives \
             (the artifact was written by kiln {}); compile the artifact again with this kiln",
            crate::artifact::KILN_VERSION,
            a.kiln_version
        )));
    }
    Ok(loaded)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn required_features_the_machine_lacks_are_named_in_order() {
        let has = |f: &str| match f {
            "avx2" | "fma" => Some(true),
            "avx512f" | "avx512bw" => Some(false),
            _ => None,
        };
        assert_eq!(
            missing_features("+avx2,+avx512f,-avx512vl,+fma,+avx512bw,+unknown", &has),
            vec!["avx512f", "avx512bw"]
        );
        assert!(missing_features("", &has).is_empty());
    }

    #[test]
    fn the_baseline_features_are_known_and_present() {
        assert_eq!(has_feature("sse2"), Some(true));
        assert_eq!(has_feature("no-such-feature"), None);
    }
}
