//! The text parser: the inverse of [`crate::print`].
//!
//! Value names in the text may be any `%identifier`; they are renumbered densely in definition
//! order, so printed text round-trips byte for byte. Parsing checks syntax, attribute forms and
//! name resolution only: types are checked by the verifier, so ill-typed programs parse.
//!
//! Lists (attributes, constant values, argument values) may nest at most [`MAX_NESTING`]
//! deep; deeper text is a parse error, so no input can exhaust the parser's stack.

use crate::attr::{Attr, AttrCtx};
use crate::error::{ParseError, excerpt, quote};
use crate::{DType, Func, Inst, Module, Op, OpKind, TensorType, ValueId};
use std::collections::HashMap;

#[derive(Clone, Debug, PartialEq)]
enum Tok {
    Value(String),
    Global(String),
    Word(String),
    Punct(&'static str),
    Eof,
}

impl std::fmt::Display for Tok {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Tok::Value(s) => f.write_str(&quote(format_args!("%{s}"))),
            Tok::Global(s) => f.write_str(&quote(format_args!("@{s}"))),
            Tok::Word(s) => f.write_str(&quote(s)),
            Tok::Punct(p) => write!(f, "`{p}`"),
            Tok::Eof => f.write_str("end of input"),
        }
    }
}

struct Lexer {
    toks: Vec<(Tok, usize, usize)>,
    pos: usize,
    /// How many regions enclose the function being parsed.
    regions: usize,
}

fn is_word(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-' | '+')
}

fn lex(src: &str) -> Result<Vec<(Tok, usize, usize)>, ParseError> {
    let chars: Vec<char> = src.chars().collect();
    let (mut i, mut line, mut col) = (0, 1, 1);
    let mut out = Vec::new();
    let advance = |i: &mut usize, line: &mut usize, col: &mut usize, c: char| {
        *i += 1;
        if c == '\n' {
            *line += 1;
            *col = 1;
        } else {
            *col += 1;
        }
    };
    while i < chars.len() {
        let c = chars[i];
        let (l0, c0) = (line, col);
        if c.is_whitespace() {
            advance(&mut i, &mut line, &mut col, c);
        } else if c == '/' && chars.get(i + 1) == Some(&'/') {
            while i < chars.len() && chars[i] != '\n' {
                let ch = chars[i];
                advance(&mut i, &mut line, &mut col, ch);
            }
        } else if c == '-' && chars.get(i + 1) == Some(&'>') {
            out.push((Tok::Punct("->"), l0, c0));
            i += 2;
            col += 2;
        } else if let Some(p) = ["(", ")", "[", "]", "{", "}", ",", ":", "="]
            .iter()
            .find(|p| p.starts_with(c))
        {
            out.push((Tok::Punct(p), l0, c0));
            advance(&mut i, &mut line, &mut col, c);
        } else if c == '%' || c == '@' || is_word(c) {
            let sigil = !is_word(c);
            if sigil {
                advance(&mut i, &mut line, &mut col, c);
            }
            let start = i;
            while i < chars.len()
                && is_word(chars[i])
                && !(chars[i] == '-' && chars.get(i + 1) == Some(&'>'))
            {
                let ch = chars[i];
                advance(&mut i, &mut line, &mut col, ch);
            }
            let w: String = chars[start..i].iter().collect();
            if sigil && w.is_empty() {
                return Err(ParseError {
                    line: l0,
                    column: c0,
                    message: format!("expected a name after `{c}`"),
                });
            }
            out.push((
                match c {
                    '%' => Tok::Value(w),
                    '@' => Tok::Global(w),
                    _ => Tok::Word(w),
                },
                l0,
                c0,
            ));
        } else {
            return Err(ParseError {
                line: l0,
                column: c0,
                message: format!("unexpected character `{c}`"),
            });
        }
    }
    out.push((Tok::Eof, line, col));
    Ok(out)
}

type PResult<T> = Result<T, ParseError>;

/// The deepest nesting of `[...]` lists the parser accepts, in attributes, constant values and
/// [`parse_literal`]'s values alike (a constant of rank r nests r deep). A list opened deeper
/// is a parse error at its `[`.
pub const MAX_NESTING: usize = 256;

/// The deepest nesting of regions (a `while` in a `case` branch in a `while` body ...) the
/// parser accepts; a region opened deeper is a parse error at its `func`.
pub const MAX_REGION_NESTING: usize = 64;

impl Lexer {
    fn peek(&self) -> &Tok {
        &self.toks[self.pos].0
    }

    fn err<T>(&self, message: String) -> PResult<T> {
        let (_, line, column) = self.toks[self.pos];
        Err(ParseError {
            line,
            column,
            message,
        })
    }

    fn expected<T>(&self, what: &str) -> PResult<T> {
        self.err(format!("expected {what}, found {}", self.peek()))
    }

    fn next(&mut self) -> Tok {
        let t = self.toks[self.pos].0.clone();
        if t != Tok::Eof {
            self.pos += 1;
        }
        t
    }

    fn eat(&mut self, p: &str) -> bool {
        if matches!(self.peek(), Tok::Punct(q) if *q == p) {
            self.pos += 1;
            true
        } else {
            false
        }
    }

    fn expect(&mut self, p: &str) -> PResult<()> {
        if self.eat(p) {
            Ok(())
        } else {
            self.expected(&format!("`{p}`"))
        }
    }

    fn word(&mut self, what: &str) -> PResult<String> {
        match self.peek().clone() {
            Tok::Word(w) => {
                self.pos += 1;
                Ok(w)
            }
            _ => self.expected(what),
        }
    }

    fn keyword(&mut self, k: &str) -> PResult<()> {
        match self.peek() {
            Tok::Word(w) if w == k => {
                self.pos += 1;
                Ok(())
            }
            _ => self.expected(&format!("`{k}`")),
        }
    }

    fn ty(&mut self) -> PResult<TensorType> {
        let w = match self.peek().clone() {
            Tok::Word(w) => w,
            _ => return self.expected("a type such as `f32[2,3]`"),
        };
        let Some(dtype) = DType::from_name(&w) else {
            // The small floats, named as a range: the list stays short.
            let names: Vec<&str> = DType::ALL
                .iter()
                .filter(|d| d.mini().is_none())
                .map(|d| d.name())
                .collect();
            return self.err(format!(
                "unknown element type {} (expected one of {}, or a small float f8e4m3fn ... f4e2m1fn)",
                quote(&w),
                names.join(", ")
            ));
        };
        self.pos += 1;
        self.expect("[")?;
        let mut shape = Vec::new();
        if !self.eat("]") {
            loop {
                let d = self.word("a dimension size")?;
                match d.parse::<usize>() {
                    Ok(n) => shape.push(n),
                    Err(_) => {
                        self.pos -= 1;
                        return self.err(format!("expected a dimension size, found {}", quote(&d)));
                    }
                }
                if self.eat("]") {
                    break;
                }
                self.expect(",")?;
            }
        }
        Ok(TensorType { dtype, shape })
    }

    fn attr(&mut self) -> PResult<Attr> {
        self.attr_at(0)
    }

    /// An attribute inside `depth` enclosing lists (recursion is bounded by [`MAX_NESTING`]).
    fn attr_at(&mut self, depth: usize) -> PResult<Attr> {
        if matches!(self.peek(), Tok::Punct("[")) && depth == MAX_NESTING {
            return self.err(format!("lists are nested more than {MAX_NESTING} deep"));
        }
        if self.eat("[") {
            let mut items = Vec::new();
            if !self.eat("]") {
                loop {
                    items.push(self.attr_at(depth + 1)?);
                    if self.eat("]") {
                        break;
                    }
                    self.expect(",")?;
                }
            }
            Ok(Attr::List(items))
        } else if self.eat("(") {
            // A complex element, `(re, im)`: one token for the literal's reader.
            let re = self.word("the real part of a complex value")?;
            self.expect(",")?;
            let im = self.word("the imaginary part of a complex value")?;
            self.expect(")")?;
            Ok(Attr::Token(format!("({re}, {im})")))
        } else if matches!(self.peek(), Tok::Word(w) if w == "func") {
            if self.regions == MAX_REGION_NESTING {
                return self.err(format!(
                    "regions are nested more than {MAX_REGION_NESTING} deep"
                ));
            }
            self.regions += 1;
            let f = parse_func(self);
            self.regions -= 1;
            Ok(Attr::Region(Box::new(f?)))
        } else if let Tok::Global(name) = self.peek().clone() {
            self.pos += 1;
            Ok(Attr::Token(format!("@{name}")))
        } else {
            Ok(Attr::Token(self.word("an attribute value")?))
        }
    }
}

struct FuncParser<'a> {
    lx: &'a mut Lexer,
    names: HashMap<String, ValueId>,
    values: Vec<TensorType>,
}

impl FuncParser<'_> {
    fn define(&mut self, name: String, ty: TensorType) -> PResult<ValueId> {
        if self.names.contains_key(&name) {
            self.lx.pos -= 1;
            return self.lx.err(format!(
                "value {} is defined twice",
                quote(format_args!("%{name}"))
            ));
        }
        let id = ValueId(self.values.len() as u32);
        self.values.push(ty);
        self.names.insert(name, id);
        Ok(id)
    }

    fn use_value(&mut self) -> PResult<ValueId> {
        match self.lx.peek().clone() {
            Tok::Value(n) => match self.names.get(&n) {
                Some(&v) => {
                    self.lx.pos += 1;
                    Ok(v)
                }
                None => self.lx.err(format!(
                    "use of undefined value {}",
                    quote(format_args!("%{n}"))
                )),
            },
            _ => self.lx.expected("a value such as `%0`"),
        }
    }
}

fn parse_func(lx: &mut Lexer) -> PResult<Func> {
    lx.keyword("func")?;
    let name = match lx.next() {
        Tok::Global(n) => n,
        _ => {
            lx.pos -= 1;
            return lx.expected("a function name such as `@main`");
        }
    };
    let mut p = FuncParser {
        lx,
        names: HashMap::new(),
        values: Vec::new(),
    };
    p.lx.expect("(")?;
    let mut params = Vec::new();
    if !p.lx.eat(")") {
        loop {
            let n = match p.lx.next() {
                Tok::Value(n) => n,
                _ => {
                    p.lx.pos -= 1;
                    return p.lx.expected("a parameter such as `%0: f32[2]`");
                }
            };
            p.lx.expect(":")?;
            let ty = p.lx.ty()?;
            params.push(p.define(n, ty)?);
            if p.lx.eat(")") {
                break;
            }
            p.lx.expect(",")?;
        }
    }
    p.lx.expect("->")?;
    let mut output_types = Vec::new();
    if p.lx.eat("(") {
        if !p.lx.eat(")") {
            loop {
                output_types.push(p.lx.ty()?);
                if p.lx.eat(")") {
                    break;
                }
                p.lx.expect(",")?;
            }
        }
    } else {
        output_types.push(p.lx.ty()?);
    }
    p.lx.expect("{")?;
    let mut insts = Vec::new();
    loop {
        match p.lx.peek().clone() {
            Tok::Word(w) if w == "return" => {
                p.lx.pos += 1;
                break;
            }
            Tok::Value(_) => insts.push(parse_inst(&mut p)?),
            _ => {
                return p
                    .lx
                    .expected("an instruction such as `%2 = add %0, %1 : f32[2]` or `return`");
            }
        }
    }
    let mut outputs = Vec::new();
    if !p.lx.eat("}") {
        loop {
            outputs.push(p.use_value()?);
            if p.lx.eat("}") {
                break;
            }
            p.lx.expect(",")?;
        }
    }
    Ok(Func {
        name,
        params,
        insts,
        outputs,
        output_types,
        values: p.values,
    })
}

fn parse_inst(p: &mut FuncParser) -> PResult<Inst> {
    let mut result_names = Vec::new();
    loop {
        let start = p.lx.pos;
        match p.lx.next() {
            Tok::Value(n) => result_names.push((n, start)),
            _ => {
                p.lx.pos -= 1;
                return p.lx.expected("a result such as `%2`");
            }
        }
        if !p.lx.eat(",") {
            break;
        }
    }
    p.lx.expect("=")?;
    let op_pos = p.lx.pos;
    let mnemonic = p.lx.word("an op name")?;
    let Some(kind) = OpKind::from_mnemonic(&mnemonic) else {
        p.lx.pos = op_pos;
        return p.lx.err(format!("unknown op {}", quote(&mnemonic)));
    };
    let mut operands = Vec::new();
    if matches!(p.lx.peek(), Tok::Value(_)) {
        loop {
            operands.push(p.use_value()?);
            if !p.lx.eat(",") {
                break;
            }
        }
    }
    let mut attrs = Vec::new();
    let attr_pos = p.lx.pos;
    if p.lx.eat("{") {
        loop {
            let name = p.lx.word("an attribute name")?;
            p.lx.expect("=")?;
            attrs.push((name, p.lx.attr()?));
            if p.lx.eat("}") {
                break;
            }
            p.lx.expect(",")?;
        }
    }
    p.lx.expect(":")?;
    let mut types = vec![p.lx.ty()?];
    while p.lx.eat(",") {
        types.push(p.lx.ty()?);
    }
    if types.len() != result_names.len() {
        return p.lx.err(format!(
            "{} result(s) named but {} type(s) given",
            result_names.len(),
            types.len()
        ));
    }
    let op = match Op::from_attrs(
        kind,
        &attrs,
        &AttrCtx {
            result_types: &types,
        },
    ) {
        Ok(op) => op,
        Err(e) => {
            let end = p.lx.pos;
            p.lx.pos = attr_pos;
            let r = p.lx.err(e);
            p.lx.pos = end;
            return r;
        }
    };
    let mut results = Vec::new();
    for ((n, pos), ty) in result_names.into_iter().zip(types) {
        if p.names.contains_key(&n) {
            p.lx.pos = pos;
            return p.lx.err(format!(
                "value {} is defined twice",
                quote(format_args!("%{n}"))
            ));
        }
        let id = ValueId(p.values.len() as u32);
        p.values.push(ty);
        p.names.insert(n, id);
        results.push(id);
    }
    Ok(Inst {
        op,
        operands,
        results,
        loc: None,
    })
}

/// Parses a module: one or more functions, each `call` resolved to the module's function it
/// names ([`crate::call::resolve_calls`]).
pub fn parse_module(src: &str) -> PResult<Module> {
    let mut lx = Lexer {
        toks: lex(src)?,
        pos: 0,
        regions: 0,
    };
    let mut funcs = Vec::new();
    while *lx.peek() != Tok::Eof {
        funcs.push(parse_func(&mut lx)?);
    }
    if funcs.is_empty() {
        return lx.expected("`func`");
    }
    let mut m = Module { funcs };
    crate::call::resolve_calls(&mut m);
    Ok(m)
}

/// Parses exactly one function, followed by the functions its calls run (as
/// [`crate::print_func`] writes them), its calls resolved to them.
pub fn parse_func_text(src: &str) -> PResult<Func> {
    let mut lx = Lexer {
        toks: lex(src)?,
        pos: 0,
        regions: 0,
    };
    let mut funcs = vec![parse_func(&mut lx)?];
    let mut starts = Vec::new();
    while *lx.peek() != Tok::Eof {
        if !matches!(lx.peek(), Tok::Word(w) if w == "func") {
            return lx.expected("end of input");
        }
        starts.push(lx.pos);
        funcs.push(parse_func(&mut lx)?);
    }
    let mut m = Module { funcs };
    crate::call::resolve_calls(&mut m);
    let f = m.funcs.remove(0);
    let called: Vec<String> = crate::call::callees(&f)
        .into_iter()
        .map(|g| g.name)
        .collect();
    // Every function after the first must be one the first calls.
    if let Some((g, &pos)) = m
        .funcs
        .iter()
        .zip(&starts)
        .find(|(g, _)| !called.contains(&g.name))
    {
        lx.pos = pos;
        return lx.err(format!(
            "expected end of input, found function @{} that @{} does not call",
            g.name, f.name
        ));
    }
    Ok(f)
}

/// Parses a nested-list value of the given type (the form the printer writes for constants
/// and `cargo xtask dump --stage eval` takes for inputs), e.g. `[[1.0, 2.0], [3.0, 4.0]]`.
pub fn parse_literal(src: &str, ty: &TensorType) -> PResult<crate::Literal> {
    let mut lx = Lexer {
        toks: lex(src)?,
        pos: 0,
        regions: 0,
    };
    let a = lx.attr()?;
    if *lx.peek() != Tok::Eof {
        return lx.expected("end of the value");
    }
    let lit = <crate::Literal as crate::attr::AttrValue>::from_attr(
        &a,
        &AttrCtx {
            result_types: std::slice::from_ref(ty),
        },
    )
    .map_err(|message| ParseError {
        line: 1,
        column: 1,
        message,
    })?;
    if lit.ty() != ty {
        return Err(ParseError {
            line: 1,
            column: 1,
            message: format!(
                "value has type {}, expected {}",
                excerpt(lit.ty()),
                excerpt(ty)
            ),
        });
    }
    Ok(lit)
}
