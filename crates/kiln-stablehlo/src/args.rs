//! The arguments of an entry function as StableHLO's interpreter takes them
//! (`--args="[dense<1> : tensor<2xi32>, ...]"`): an array of typed dense literals, one per
//! parameter, in order. A malformed list is a located error (line and column in the text of
//! the arguments), never a panic.
//!
//! ```
//! let args = kiln_stablehlo::args::parse_args("[dense<1> : tensor<2xi32>, dense<[2, 3]> : tensor<2xi32>]").unwrap();
//! assert_eq!(args[1].to_i64s(), [2, 3]);
//! ```

use crate::ast::AttrVal;
use crate::error::{Error, Result};
use crate::lexer::{Tok, lex};
use crate::literal::to_literal;
use crate::parser::Cursor;
use kiln_ir::Literal;

/// What an argument list looks like, for messages.
const FORM: &str = "[dense<1> : tensor<2xi32>, ...]";

/// Parses an argument list: `[` typed `dense<...>` literals separated by commas `]`.
pub fn parse_args(text: &str) -> Result<Vec<Literal>> {
    let toks = lex(text, 1)?;
    let mut c = Cursor::new(toks);
    if !c.is("[") {
        return Err(Error::syntax(
            c.pos(),
            format!(
                "expected the arguments as an array of dense literals, such as {FORM}, found {}",
                c.peek().describe()
            ),
        ));
    }
    c.enter()?;
    c.bump();
    let mut out = Vec::new();
    if !c.eat("]") {
        loop {
            let pos = c.pos();
            match c.attr()? {
                AttrVal::Dense(d, Some(ty)) => out.push(to_literal(&d, &ty)?),
                AttrVal::Dense(_, None) => {
                    return Err(Error::syntax(
                        pos,
                        format!("argument #{} needs its type, as in {FORM}", out.len()),
                    ));
                }
                _ => {
                    return Err(Error::syntax(
                        pos,
                        format!(
                            "expected a dense literal for argument #{}, such as {FORM}",
                            out.len()
                        ),
                    ));
                }
            }
            if c.eat("]") {
                break;
            }
            if !c.is(",") {
                return c.expected("`,` or `]` in the arguments");
            }
            c.bump();
        }
    }
    c.leave();
    if *c.peek() != Tok::Eof {
        return c.expected("the end of the arguments");
    }
    Ok(out)
}
