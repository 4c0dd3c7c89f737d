//! `kiln export`: a model as StableHLO text.

use crate::error::Error;
use crate::model;
use std::path::Path;

/// `kiln export MODEL [-o OUT.mlir]`: the text, written to `out` or returned for printing.
pub fn export(model: &Path, out: Option<&Path>) -> Result<Option<String>, Error> {
    let m = model::load(model)?;
    let text = kiln::stablehlo::to_text(&m).map_err(|e| Error::Compile(e.to_string()))?;
    match out {
        Some(p) => {
            std::fs::write(p, text).map_err(|e| Error::Output(format!("{}: {e}", p.display())))?;
            Ok(None)
        }
        None => Ok(Some(text)),
    }
}
