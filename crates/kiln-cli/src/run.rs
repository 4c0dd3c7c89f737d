//! `kiln run`: compile a model on the selected backend, run it once, print or write results.

use crate::error::Error;
use crate::model;
use kiln::backend::Executable;
use kiln_ir::{Func, Literal};
use std::path::Path;
use std::sync::Arc;

/// Compiles `f` on the backend the facade selects (the CPU unless `KILN_BACKEND` says other).
pub fn compile(f: &Func) -> Result<Arc<dyn Executable>, Error> {
    let backend = kiln::backend::backend().map_err(|e| Error::Compile(e.to_string()))?;
    backend
        .compile(f)
        .map_err(|e| Error::Compile(format!("@{}: {e}", f.name)))
}

/// Runs `exe` on `args`.
pub fn call(exe: &dyn Executable, args: &[Literal]) -> Result<Vec<Literal>, Error> {
    let refs: Vec<&Literal> = args.iter().collect();
    exe.run(&refs).map_err(|e| Error::Run(e.to_string()))
}

/// `kiln run MODEL [--input NAME=FILE]... [--output DIR]`.
pub fn run(model: &Path, inputs: &[(String, String)], output: Option<&Path>) -> Result<(), Error> {
    let m = model::load(model)?;
    let f = model::entry(&m)?;
    let args = model::inputs(f, inputs)?;
    let exe = compile(f)?;
    let results = call(exe.as_ref(), &args)?;
    match output {
        Some(dir) => {
            std::fs::create_dir_all(dir)
                .map_err(|e| Error::Output(format!("{}: {e}", dir.display())))?;
            for (i, r) in results.iter().enumerate() {
                let path = dir.join(format!("out{i}.npy"));
                kiln_run::npy::write(&path, r).map_err(Error::Output)?;
                println!("{}: {}", path.display(), r.ty());
            }
        }
        None => {
            for r in &results {
                println!("{r}");
            }
        }
    }
    Ok(())
}
