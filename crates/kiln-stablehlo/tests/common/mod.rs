//! The programs the export tests run: every spec example with its arguments, and random
//! programs with random arguments; those holding an op StableHLO does not have (`lu`, a kiln
//! extension, which `to_text` refuses) are left out.

use kiln_ir::random::{Config, Rng, random_func, random_literal};
use kiln_ir::{Literal, Module, Op, parse_literal, parse_module};

/// Whether every instruction of `m` (regions included) has a StableHLO form.
pub fn exportable(m: &Module) -> bool {
    fn walk(f: &kiln_ir::Func) -> bool {
        f.insts
            .iter()
            .all(|i| !matches!(i.op, Op::Lu {}) && i.op.regions().into_iter().all(walk))
    }
    m.funcs.iter().all(walk)
}
use std::path::Path;

/// The `kiln` program and argument texts of each example of one spec file.
fn examples(text: &str) -> Vec<(String, Vec<String>)> {
    let lines: Vec<&str> = text.lines().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        if lines[i] == "```kiln" {
            let mut kiln = String::new();
            i += 1;
            while i < lines.len() && lines[i] != "```" {
                kiln.push_str(lines[i]);
                kiln.push('\n');
                i += 1;
            }
            while i < lines.len() && lines[i] != "```values" {
                i += 1;
            }
            let mut args = Vec::new();
            i += 1;
            while i < lines.len() && lines[i] != "```" {
                if let Some((k, v)) = lines[i].split_once(" = ")
                    && k.starts_with('%')
                {
                    args.push(v.to_string());
                }
                i += 1;
            }
            out.push((kiln, args));
        }
        i += 1;
    }
    out
}

/// Every example of `ir-specs/ops/*.md` that parses, with its arguments: (name, module, args).
pub fn spec_examples() -> Vec<(String, Module, Vec<Literal>)> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../ir-specs/ops");
    let mut paths: Vec<_> = std::fs::read_dir(&dir)
        .expect("ir-specs/ops exists")
        .map(|e| e.expect("readable").path())
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .collect();
    paths.sort();
    let mut out = Vec::new();
    for p in &paths {
        let text = std::fs::read_to_string(p).expect("readable spec");
        let stem = p.file_stem().map(|s| s.to_string_lossy().into_owned());
        for (k, (kiln, arg_texts)) in examples(&text).into_iter().enumerate() {
            let Ok(m) = parse_module(&kiln) else { continue };
            if !exportable(&m) {
                continue;
            }
            let Some(f) = m.entry() else { continue };
            let args: Option<Vec<Literal>> = arg_texts
                .iter()
                .zip(f.param_types())
                .map(|(s, t)| parse_literal(s, &t).ok())
                .collect();
            let Some(args) = args.filter(|a| a.len() == f.params.len()) else {
                continue;
            };
            out.push((
                format!("{} example {k}", stem.clone().unwrap_or_default()),
                m,
                args,
            ));
        }
    }
    out
}

/// The random programs of `seeds` (`Config::profile` of each, with the wide scatters, folds and
/// `select_and_scatter`s of `Config::with_wide`) with random arguments:
/// (name, module, args, whether the profile asked for control flow), the unexportable ones
/// left out.
pub fn random_programs(seeds: std::ops::Range<u64>) -> Vec<(String, Module, Vec<Literal>, bool)> {
    seeds
        .filter_map(|seed| {
            let cfg = Config::profile(seed).with_wide();
            let mut rng = Rng::new(seed);
            let f = random_func(&mut rng, &cfg);
            let args = f
                .param_types()
                .iter()
                .map(|t| random_literal(&mut rng, t))
                .collect();
            let m = Module::from_func(f);
            exportable(&m).then(|| (format!("random seed {seed}"), m, args, cfg.control))
        })
        .collect()
}
