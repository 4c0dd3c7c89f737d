//! StableHLO text in: a hand-written lexer and parser for MLIR text in both op syntaxes
//! (the pretty form JAX's `lowered.as_text()` prints and the generic
//! `"stablehlo.add"(%a, %b) : (...) -> ...`), and the mapping of StableHLO ops onto kiln IR.
//!
//! ```
//! let m = kiln_stablehlo::parse(r#"
//! func.func @main(%x: tensor<2xf32>) -> tensor<2xf32> {
//!   %0 = stablehlo.add %x, %x : tensor<2xf32>
//!   func.return %0 : tensor<2xf32>
//! }"#).unwrap();
//! assert_eq!(m.funcs[0].insts[0].op.mnemonic(), "add");
//! ```
//!
//! Every unsupported op, attribute or type is an [`Error`] that names it with its line and
//! column; malformed text never panics. The stages, one file each: [`lexer`] (tokens),
//! [`parser`] and [`pretty`] (the syntax tree of [`ast`], which a printer can write back),
//! [`attrs`], [`types`] and [`literal`] (attribute values, types, dense literals), [`ops`]
//! and [`import`] (kiln IR; [`decompose`] for ops kiln lacks; [`chlo`],
//! [`special`], [`next_after`] and [`top_k`] for `chlo` functions; [`quant`] for quantized
//! types, which become their storage types and decomposed ops; [`tuple`](mod@tuple) for tuples, which
//! become lists of tensors), [`checks`] (the `check`
//! dialect of StableHLO's tests), [`probe`] (its interpreter's `probe` and `print`),
//! [`channel`] (`send` and `recv` between the programs of its `run_parallel`) and [`args`]
//! (an entry function's `--args`), [`generic`] (the tree written back in MLIR's generic op
//! form, which MLIR parses without knowing StableHLO).
//!
//! Programs JAX exports (`jax.jit(f).lower(...).as_text()`, with or without debug
//! locations, Shardy or GSPMD sharding annotations on one device) import whole:
//! `tests/jax_programs.rs` runs a training step, two gradients and threefry random bits
//! against JAX's outputs (`scripts/export_jax.py` writes them).
//!
//! Text out: [`to_text`] writes a kiln module as StableHLO ([`export`], with [`dense`] for
//! constants) that [`parse`] reads back to the same module and XLA compiles.
#![warn(missing_docs)]

pub mod args;
pub mod ast;
pub mod attrs;
pub mod channel;
pub mod checks;
pub mod chlo;
pub mod collective;
pub mod decompose;
pub mod dense;
pub mod error;
pub mod export;
pub mod generic;
pub mod import;
pub mod lexer;
pub mod literal;
pub mod next_after;
pub mod ops;
pub mod parallel;
pub mod parser;
pub mod pretty;
pub mod probe;
pub mod quant;
pub mod ragged;
pub mod special;
pub mod top_k;
pub mod tuple;
pub mod types;

pub use checks::{Check, CheckKind, FuncChecks};
pub use error::{Error, ErrorKind, Pos, Result};
pub use export::{ExportError, to_text};
use kiln_ir::Module;
pub use parallel::Parallel;

/// One piece of a `// -----`-split file: its text and the line it starts on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Piece<'a> {
    /// The text.
    pub text: &'a str,
    /// The line of the whole input its first line is.
    pub first_line: u32,
}

/// Splits text on lines that are exactly `// -----` (MLIR's `-split-input-file`).
pub fn split(text: &str) -> Vec<Piece<'_>> {
    let mut out = Vec::new();
    let (mut start, mut first_line, mut line) = (0usize, 1u32, 1u32);
    let mut at = 0usize;
    for l in text.split_inclusive('\n') {
        if l.trim_end() == "// -----" {
            out.push(Piece {
                text: &text[start..at],
                first_line,
            });
            start = at + l.len();
            first_line = line + 1;
        }
        at += l.len();
        line += 1;
    }
    out.push(Piece {
        text: &text[start..],
        first_line,
    });
    out
}

/// A module imported with its checks.
#[derive(Clone, Debug, PartialEq)]
pub struct Imported {
    /// The kiln module; a function with checks returns the checked values after its own.
    pub module: Module,
    /// The checks of each function, in the module's order.
    pub checks: Vec<FuncChecks>,
}

/// Parses the syntax tree of one module.
pub fn parse_ast(piece: Piece) -> Result<ast::ModuleAst> {
    let toks = lexer::lex(piece.text, piece.first_line)?;
    let mut c = parser::Cursor::new(toks);
    parser::parse_module(&mut c)
}

/// Imports one module of StableHLO text.
pub fn parse(text: &str) -> Result<Module> {
    let ast = parse_ast(Piece {
        text,
        first_line: 1,
    })?;
    Ok(import::import_module(&ast, false)?.0)
}

/// Imports one module from bytes, which must be UTF-8 (the error locates the first bad byte).
pub fn parse_bytes(bytes: &[u8]) -> Result<Module> {
    parse(utf8(bytes)?)
}

/// Imports a module from a file.
pub fn parse_file(path: impl AsRef<std::path::Path>) -> Result<Module> {
    let path = path.as_ref();
    let bytes = std::fs::read(path).map_err(|e| {
        Error::invalid(
            Pos { line: 0, column: 0 },
            format!("cannot read {}: {e}", path.display()),
        )
    })?;
    parse_bytes(&bytes)
}

/// Imports one module, keeping `check.*` ops as checks on extra outputs.
pub fn parse_with_checks(piece: Piece) -> Result<Imported> {
    let ast = parse_ast(piece)?;
    let (module, checks) = import::import_module(&ast, true)?;
    Ok(Imported { module, checks })
}

/// Imports every `// -----`-separated module of `text`, each on its own.
pub fn parse_split(text: &str) -> Vec<Result<Module>> {
    split(text)
        .into_iter()
        .map(|p| parse_ast(p).and_then(|a| Ok(import::import_module(&a, false)?.0)))
        .collect()
}

/// The text of `bytes`, or an error at the first byte that is not UTF-8.
pub fn utf8(bytes: &[u8]) -> Result<&str> {
    std::str::from_utf8(bytes).map_err(|e| {
        Error::syntax(
            lexer::utf8_error_pos(bytes, e.valid_up_to()),
            "the input is not valid UTF-8",
        )
    })
}
