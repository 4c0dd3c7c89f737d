//! Reading a model: StableHLO text (`.mlir`) or kiln IR text (`.kir`), and its inputs.

use crate::error::Error;
use kiln_ir::{Func, Literal, Module};
use std::path::Path;

/// The module in `path`: StableHLO for `.mlir`, kiln IR for `.kir` (and anything else that
/// starts like kiln IR, `func @`).
pub fn load(path: &Path) -> Result<Module, Error> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| Error::Model(format!("cannot read {}: {e}", path.display())))?;
    let kir = path.extension().is_some_and(|e| e == "kir")
        || (path.extension().is_none_or(|e| e != "mlir")
            && text.trim_start().starts_with("func @"));
    let m = if kir {
        kiln_ir::parse_module(&text).map_err(|e| Error::Model(format!("{}:{e}", path.display())))?
    } else {
        kiln::stablehlo::parse(&text)
            .map_err(|e| Error::Model(format!("{}:{e}", path.display())))?
    };
    kiln_ir::verify_module(&m).map_err(|e| Error::Model(format!("{}: {e}", path.display())))?;
    Ok(m)
}

/// The entry function of `m`.
pub fn entry(m: &Module) -> Result<&Func, Error> {
    m.entry()
        .ok_or_else(|| Error::Model("the module has no function".into()))
}

/// The position of the parameter an input name names: `0`, `arg0` or `%arg0`.
fn position(name: &str) -> Option<usize> {
    name.trim_start_matches('%')
        .trim_start_matches("arg")
        .parse()
        .ok()
}

/// The arguments of `f` from `NAME=FILE.npy` pairs: a name that is a position (`0`, `arg0`,
/// `%arg0`) sets that parameter, other names take the free parameters in the order given.
pub fn inputs(f: &Func, given: &[(String, String)]) -> Result<Vec<Literal>, Error> {
    let types = f.param_types();
    let mut slots: Vec<Option<Literal>> = vec![None; types.len()];
    let mut named = Vec::new();
    for (name, file) in given {
        let lit = kiln_run::npy::read(Path::new(file))
            .map_err(|e| Error::Input(format!("{name}={file}: {e}")))?;
        match position(name) {
            Some(i) if i < slots.len() => {
                if slots[i].replace(lit).is_some() {
                    return Err(Error::Input(format!("parameter {i} is given twice")));
                }
            }
            Some(i) => {
                return Err(Error::Input(format!(
                    "@{} has no parameter {i} (it takes {})",
                    f.name,
                    types.len()
                )));
            }
            None => named.push((name, lit)),
        }
    }
    let mut named = named.into_iter();
    for slot in slots.iter_mut().filter(|s| s.is_none()) {
        *slot = named.next().map(|(_, l)| l);
    }
    if let Some((name, _)) = named.next() {
        return Err(Error::Input(format!(
            "input `{name}` is one too many: @{} takes {}",
            f.name,
            types.len()
        )));
    }
    slots
        .into_iter()
        .zip(&types)
        .enumerate()
        .map(|(i, (l, t))| match l {
            None => Err(Error::Input(format!(
                "parameter {i} ({t}) of @{} is not given",
                f.name
            ))),
            Some(l) if l.ty() != t => Err(Error::Input(format!(
                "parameter {i} of @{} is {t}, the file holds {}",
                f.name,
                l.ty()
            ))),
            Some(l) => Ok(l),
        })
        .collect()
}

/// Random arguments for `f` from `seed`.
pub fn random_inputs(f: &Func, seed: u64) -> Vec<Literal> {
    let mut rng = kiln_ir::random::Rng::new(seed);
    f.param_types()
        .iter()
        .map(|t| kiln_ir::random::random_literal(&mut rng, t))
        .collect()
}
