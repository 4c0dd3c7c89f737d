//! The crate's contents under its feature `mlir`.

use melior::Context;
use melior::dialect::DialectRegistry;
use melior::ir::Module;
use melior::ir::operation::OperationLike;
use melior::utility::{register_all_dialects, register_all_llvm_translations};
use std::cell::RefCell;
use std::fmt;
use std::rc::Rc;

/// An error of this crate, with MLIR's diagnostics.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Error {
    /// The text is not a valid MLIR module.
    Parse(String),
    /// The module parsed but failed verification.
    Verify(String),
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Parse(m) => write!(f, "MLIR parse error: {m}"),
            Error::Verify(m) => write!(f, "MLIR verification failed: {m}"),
        }
    }
}

impl std::error::Error for Error {}

/// The result type of this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// An MLIR context with every upstream dialect and the LLVM translations registered.
pub fn context() -> Context {
    let registry = DialectRegistry::new();
    register_all_dialects(&registry);
    let ctx = Context::new();
    ctx.append_dialect_registry(&registry);
    ctx.load_all_available_dialects();
    register_all_llvm_translations(&ctx);
    ctx
}

/// Parses and verifies an MLIR module, returning its canonical printed form. Errors carry
/// MLIR's diagnostics (with locations) rather than printing them.
pub fn parse_and_verify(text: &str) -> Result<String> {
    let ctx = context();
    let messages = Rc::new(RefCell::new(Vec::<String>::new()));
    let sink = messages.clone();
    let id = ctx.attach_diagnostic_handler(move |d| {
        sink.borrow_mut().push(format!("{} {d}", d.location()));
        true
    });
    let result = match Module::parse(&ctx, text) {
        None => Err(Error::Parse(messages.borrow().join("; "))),
        Some(m) if !m.as_operation().verify() => Err(Error::Verify(messages.borrow().join("; "))),
        Some(m) => Ok(m.as_operation().to_string()),
    };
    ctx.detach_diagnostic_handler(id);
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    const ADD: &str = r#"
func.func @add(%a: tensor<4xf32>, %b: tensor<4xf32>) -> tensor<4xf32> {
  %0 = arith.addf %a, %b : tensor<4xf32>
  return %0 : tensor<4xf32>
}
"#;

    #[test]
    fn parses_and_verifies_a_module() {
        let printed = parse_and_verify(ADD).unwrap();
        assert!(printed.contains("arith.addf"), "{printed}");
        assert_eq!(
            printed,
            parse_and_verify(&printed).unwrap(),
            "printing is a fixed point"
        );
    }

    #[test]
    fn malformed_text_is_an_error_with_a_location() {
        let e = parse_and_verify("func.func @f( {").unwrap_err();
        assert!(
            matches!(e, Error::Parse(ref m) if m.contains("loc(")),
            "{e}"
        );
    }

    #[test]
    fn ill_typed_module_fails_verification() {
        let bad = ADD.replace(
            "return %0 : tensor<4xf32>",
            "return %a, %b : tensor<4xf32>, tensor<4xf32>",
        );
        assert!(parse_and_verify(&bad).is_err());
    }
}
