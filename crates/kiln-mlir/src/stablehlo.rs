//! StableHLO import through MLIR itself: MLIR parses and verifies the text (in the generic
//! op form, since its context knows no StableHLO: unregistered dialects are allowed, `func`
//! is registered), and a walk over MLIR's operations builds kiln-stablehlo's syntax tree,
//! which kiln-stablehlo's own mapping turns into kiln IR. Types and attribute values go from
//! MLIR's printed text of each through kiln-stablehlo's type and attribute parsers, so both
//! importers read them alike.
//!
//! Errors are kiln-stablehlo's located [`Error`]s: MLIR's diagnostics (captured, never
//! printed) for malformed or ill-formed text, and the mapping's errors, located at the
//! line and column of each op's `loc(...)` (by default, where the op is written).

use kiln_ir::{DType, Module, TensorType};
use kiln_stablehlo::ast::{AttrVal, Block, Dense, Elem, FuncAst, ModuleAst, Name, OpAst, Sig};
use kiln_stablehlo::lexer::lex;
use kiln_stablehlo::parser::{Cursor, MAX_NESTING, parse_func_sig};
use kiln_stablehlo::{Error, Pos, Result};
use melior::Context;
use melior::dialect::DialectHandle;
use melior::ir::block::BlockLike;
use melior::ir::operation::OperationLike;
use melior::ir::{BlockRef, Location, Module as MlirModule, OperationRef, RegionLike, ValueLike};
use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;

/// Imports one module of StableHLO text in MLIR's generic op form through MLIR.
pub fn import(text: &str) -> Result<Module> {
    let ast = parse_ast(text)?;
    Ok(kiln_stablehlo::import::import_module(&ast, false)?.0)
}

/// [`import`] of bytes, which must be UTF-8 (the error locates the first bad byte).
pub fn import_bytes(bytes: &[u8]) -> Result<Module> {
    import(kiln_stablehlo::utf8(bytes)?)
}

/// Parses and verifies `text` with MLIR and builds kiln-stablehlo's syntax tree from MLIR's
/// operations.
pub fn parse_ast(text: &str) -> Result<ModuleAst> {
    precheck(text)?;
    let ctx = Context::new();
    ctx.set_allow_unregistered_dialects(true);
    DialectHandle::func().load_dialect(&ctx);
    let messages = Rc::new(RefCell::new(Vec::<(String, String)>::new()));
    let sink = messages.clone();
    let id = ctx.attach_diagnostic_handler(move |d| {
        sink.borrow_mut()
            .push((d.location().to_string(), d.to_string()));
        true
    });
    let result = walk_text(&ctx, text, &messages);
    ctx.detach_diagnostic_handler(id);
    result
}

fn walk_text(
    ctx: &Context,
    text: &str,
    messages: &RefCell<Vec<(String, String)>>,
) -> Result<ModuleAst> {
    let first = |what: &str| {
        let m = messages.borrow();
        match m.first() {
            Some((loc, msg)) => (loc_pos(loc).unwrap_or_default(), format!("{what}: {msg}")),
            None => (Pos::default(), what.to_string()),
        }
    };
    let Some(module) = MlirModule::parse(ctx, text) else {
        let (pos, msg) = first("MLIR cannot parse the module");
        return Err(Error::syntax(pos, msg));
    };
    if !module.as_operation().verify() {
        let (pos, msg) = first("MLIR rejects the module");
        return Err(Error::invalid(pos, msg));
    }
    let mut w = Walker::default();
    let mut funcs = Vec::new();
    let mut op = module.body().first_operation();
    while let Some(o) = op {
        funcs.push(w.func(o)?);
        op = o.next_in_block();
    }
    Ok(ModuleAst {
        pos: Pos { line: 1, column: 1 },
        funcs,
    })
}

/// Rejects what MLIR's parser cannot take safely: a NUL character (the text goes to MLIR as a
/// C string) and nesting deeper than kiln-stablehlo's parser accepts (MLIR's parser
/// recurses).
fn precheck(text: &str) -> Result<()> {
    let (mut line, mut column, mut depth) = (1u32, 1u32, 0usize);
    let mut in_str = false;
    let mut escaped = false;
    for ch in text.chars() {
        let pos = Pos { line, column };
        if ch == '\0' {
            return Err(Error::syntax(pos, "a NUL character in the text"));
        }
        if in_str {
            match ch {
                _ if escaped => escaped = false,
                '\\' => escaped = true,
                '"' => in_str = false,
                _ => {}
            }
        } else {
            match ch {
                '"' => in_str = true,
                '(' | '[' | '{' | '<' => {
                    depth += 1;
                    if depth > MAX_NESTING {
                        return Err(Error::syntax(
                            pos,
                            format!("the input nests more than {MAX_NESTING} deep"),
                        ));
                    }
                }
                ')' | ']' | '}' | '>' => depth = depth.saturating_sub(1),
                _ => {}
            }
        }
        if ch == '\n' {
            line += 1;
            column = 1;
        } else {
            column += 1;
        }
    }
    Ok(())
}

/// The first `file:line:column` of a printed location, such as `loc("-":3:5)`.
fn loc_pos(loc: &str) -> Option<Pos> {
    let b = loc.as_bytes();
    let mut i = 0;
    while let Some(q) = loc[i..].find("\":") {
        let at = i + q + 2;
        let digits = |from: usize| {
            let n = b[from..].iter().take_while(|c| c.is_ascii_digit()).count();
            loc[from..from + n]
                .parse::<u32>()
                .ok()
                .map(|v| (v, from + n))
        };
        if let Some((line, end)) = digits(at)
            && b.get(end) == Some(&b':')
            && let Some((column, _)) = digits(end + 1)
        {
            return Some(Pos { line, column });
        }
        i = at;
    }
    None
}

fn location_pos(l: Location) -> Pos {
    loc_pos(&l.to_string()).unwrap_or_default()
}

/// Parses MLIR's printed text of a type as a kiln tensor type.
fn tensor_type(text: &str, pos: Pos) -> Result<TensorType> {
    let toks = lex(text, 1).map_err(|e| relocate(e, pos, text))?;
    let mut c = Cursor::new(toks);
    let t = c.tensor_type().map_err(|e| relocate(e, pos, text))?;
    end(&c, pos, text)?;
    Ok(t)
}

/// An error inside a printed type or attribute, moved to the op it belongs to.
fn relocate(e: Error, pos: Pos, text: &str) -> Error {
    let shown: String = text.chars().take(80).collect();
    Error {
        pos,
        kind: e.kind,
        message: format!("{} (in `{shown}`)", e.message),
    }
}

fn end(c: &Cursor, pos: Pos, text: &str) -> Result<()> {
    if matches!(c.peek(), kiln_stablehlo::lexer::Tok::Eof) {
        Ok(())
    } else {
        Err(Error::unsupported(
            pos,
            format!("the type or attribute `{text}`"),
        ))
    }
}

/// Parses MLIR's printed text of an attribute value.
fn attr_value(text: &str, pos: Pos) -> Result<AttrVal> {
    if text == "unit" {
        return Ok(AttrVal::Unit);
    }
    if let Some(rest) = text.strip_prefix("dense<\"0x") {
        return hex_dense(rest, pos, text);
    }
    let toks = lex(text, 1).map_err(|e| relocate(e, pos, text))?;
    let mut c = Cursor::new(toks);
    let v = c.attr().map_err(|e| relocate(e, pos, text))?;
    end(&c, pos, text)?;
    Ok(v)
}

/// `dense<"0x...">  : tensor<...>`, MLIR's form of a large literal: the elements' bytes,
/// little-endian, each element in whole bytes but booleans in bits (one value for a splat).
fn hex_dense(rest: &str, pos: Pos, text: &str) -> Result<AttrVal> {
    let bad = || {
        Error::unsupported(
            pos,
            format!("the dense literal `{}…`", &text[..text.len().min(40)]),
        )
    };
    let (hex, ty) = rest.split_once("\">").ok_or_else(bad)?;
    let ty = ty.trim_start().strip_prefix(':').ok_or_else(bad)?.trim();
    let t = tensor_type(ty, pos)?;
    let width = t.dtype.bytes().max(1);
    if !hex.len().is_multiple_of(2) || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(bad());
    }
    let bytes: Vec<u8> = (0..hex.len() / 2)
        .map(|i| u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).unwrap_or(0))
        .collect();
    let count: usize = t.shape.iter().product();
    if t.dtype == DType::Pred && bytes.len() == count.div_ceil(8) && count > 1 {
        // Booleans are packed eight to a byte, the first in the lowest bit.
        let elems = (0..count)
            .map(|i| Elem::Bool(bytes[i / 8] >> (i % 8) & 1 == 1))
            .collect();
        let shape = Some(t.shape.clone());
        return Ok(AttrVal::Dense(Dense { pos, elems, shape }, Some(t)));
    }
    if !bytes.len().is_multiple_of(width) {
        return Err(bad());
    }
    let elems: Vec<Elem> = bytes
        .chunks(width)
        .map(|c| {
            let mut b = [0u8; 8];
            b[..c.len().min(8)].copy_from_slice(&c[..c.len().min(8)]);
            Elem::Hex(u64::from_le_bytes(b))
        })
        .collect();
    let shape = if elems.len() == 1 {
        None
    } else {
        Some(t.shape.clone())
    };
    Ok(AttrVal::Dense(Dense { pos, elems, shape }, Some(t)))
}

/// Names MLIR's values as the walk meets them.
#[derive(Default)]
struct Walker {
    names: HashMap<usize, String>,
    next: usize,
}

fn key<'c>(v: impl ValueLike<'c>) -> usize {
    v.to_raw().ptr as usize
}

impl Walker {
    fn func(&mut self, f: OperationRef) -> Result<FuncAst> {
        let pos = location_pos(f.location());
        let name = f.name().as_string_ref().as_str().unwrap_or("").to_string();
        if name != "func.func" {
            return Err(Error::unsupported(
                pos,
                format!("the top-level op `{name}` (kiln reads functions only)"),
            ));
        }
        let sym = match f
            .attribute("sym_name")
            .map(|a| attr_value(&a.to_string(), pos))
        {
            Ok(Ok(AttrVal::Str(s))) => s,
            _ => return Err(Error::invalid(pos, "a `func.func` without a name")),
        };
        let private = matches!(
            f.attribute("sym_visibility").map(|a| attr_value(&a.to_string(), pos)),
            Ok(Ok(AttrVal::Str(ref s))) if s == "private"
        );
        let fty = f
            .attribute("function_type")
            .map_err(|_| Error::invalid(pos, format!("@{sym} has no function type")))?
            .to_string();
        let toks = lex(&fty, 1).map_err(|e| relocate(e, pos, &fty))?;
        let mut c = Cursor::new(toks);
        let results = match parse_func_sig(&mut c).map_err(|e| relocate(e, pos, &fty))? {
            Sig::Func(_, outs) => outs,
            _ => Vec::new(),
        };
        let body = match f.region(0).ok().and_then(|r| r.first_block()) {
            Some(b) => self.block(b, pos)?,
            None => {
                return Err(Error::unsupported(
                    pos,
                    format!("the declaration of @{sym} without a body"),
                ));
            }
        };
        Ok(FuncAst {
            name: sym,
            pos,
            private,
            results,
            body,
            arg_shapes: Vec::new(),
        })
    }

    fn block(&mut self, b: BlockRef, pos: Pos) -> Result<Block> {
        if b.next_in_region().is_some() {
            return Err(Error::unsupported(pos, "regions of more than one block"));
        }
        let mut out = Block::default();
        for i in 0..b.argument_count() {
            let a = b
                .argument(i)
                .map_err(|e| Error::invalid(pos, e.to_string()))?;
            let name = format!("arg{}", self.next);
            self.next += 1;
            self.names.insert(key(a), name.clone());
            let t = tensor_type(&a.r#type().to_string(), pos)?;
            out.args.push((Name { name, pos }, t));
        }
        let mut op = b.first_operation();
        while let Some(o) = op {
            out.ops.push(self.op(o)?);
            op = o.next_in_block();
        }
        Ok(out)
    }

    fn op(&mut self, o: OperationRef) -> Result<OpAst> {
        let pos = location_pos(o.location());
        let name = o.name().as_string_ref().as_str().unwrap_or("").to_string();
        if o.successor_count() > 0 {
            return Err(Error::unsupported(pos, "successor blocks"));
        }
        let mut operands = Vec::new();
        let mut ins = Vec::new();
        for v in o.operands() {
            let n = self.names.get(&key(v)).cloned().ok_or_else(|| {
                Error::invalid(pos, format!("`{name}` uses a value defined outside it"))
            })?;
            operands.push(Name { name: n, pos });
            ins.push(tensor_type(&v.r#type().to_string(), pos)?);
        }
        let mut attrs = Vec::new();
        for (id, a) in o.attributes() {
            let an = id.as_string_ref().as_str().unwrap_or("").to_string();
            let v = attr_value(&a.to_string(), pos)?;
            attrs.push((an, v, pos));
        }
        let mut regions = Vec::new();
        for r in o.regions() {
            regions.push(match r.first_block() {
                Some(b) => self.block(b, pos)?,
                None => Block::default(),
            });
        }
        let id = self.next;
        self.next += 1;
        let count = o.result_count();
        let mut results = Vec::new();
        let mut outs = Vec::new();
        for r in o.results() {
            let n = if count == 1 {
                format!("{id}")
            } else {
                format!("{id}#{}", r.result_number())
            };
            self.names.insert(key(r), n.clone());
            outs.push(tensor_type(&r.r#type().to_string(), pos)?);
            results.push(Name { name: n, pos });
        }
        Ok(OpAst {
            name,
            pos,
            results,
            operands,
            attrs,
            regions,
            sig: Sig::Func(ins, outs),
            quant: Vec::new(),
            tuples: Vec::new(),
            tuple_inputs: 0,
        })
    }
}
