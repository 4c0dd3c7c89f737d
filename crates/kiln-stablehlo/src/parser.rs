//! The parser: tokens to the syntax tree ([`crate::ast`]): modules, functions, blocks and
//! operations in MLIR's generic form. The pretty forms of ops are in [`crate::pretty`],
//! attribute values in [`crate::attrs`], types in [`crate::types`].

use crate::ast::{AttrVal, Block, FuncAst, ModuleAst, Name, OpAst, Shape, Sig};
use crate::error::{Error, Pos, Result};
use crate::lexer::{Spanned, Tok};
use kiln_ir::TensorType;

/// The deepest nesting of lists, regions and parentheses the parser accepts; deeper input is
/// an error, so no input exhausts the stack.
pub const MAX_NESTING: usize = 200;

/// A position in the token list, with the nesting depth so far.
pub struct Cursor<'a> {
    toks: Vec<Spanned<'a>>,
    at: usize,
    depth: usize,
    regions: usize,
    /// The quantized types of the signature types ([`Cursor::sig_type`]) of the op being
    /// parsed, one entry per type.
    pub(crate) sig_quants: Vec<Option<crate::quant::Quant>>,
    /// The shapes of the signature types of the op being parsed, one per type as written.
    pub(crate) sig_shapes: Vec<crate::ast::Shape>,
    /// How many of `sig_shapes` are a function type's inputs.
    pub(crate) sig_inputs: usize,
}

impl<'a> Cursor<'a> {
    /// A cursor at the first token (the list ends with [`Tok::Eof`]).
    pub fn new(toks: Vec<Spanned<'a>>) -> Cursor<'a> {
        Cursor {
            toks,
            at: 0,
            depth: 0,
            regions: 0,
            sig_quants: Vec::new(),
            sig_shapes: Vec::new(),
            sig_inputs: 0,
        }
    }

    /// The current token.
    pub fn peek(&self) -> &Tok<'a> {
        &self.toks[self.at].tok
    }

    /// The token after the current one.
    pub fn peek2(&self) -> &Tok<'a> {
        &self.toks[(self.at + 1).min(self.toks.len() - 1)].tok
    }

    /// Where the current token starts.
    pub fn pos(&self) -> Pos {
        self.toks[self.at].pos
    }

    /// Takes the current token.
    pub fn bump(&mut self) -> Tok<'a> {
        let t = self.toks[self.at].tok.clone();
        if self.at + 1 < self.toks.len() {
            self.at += 1;
        }
        t
    }

    /// A syntax error at the current token: "expected WHAT, found TOKEN".
    pub fn expected<T>(&self, what: &str) -> Result<T> {
        Err(Error::syntax(
            self.pos(),
            format!("expected {what}, found {}", self.peek().describe()),
        ))
    }

    /// Whether the current token is the punctuation `p`.
    pub fn is(&self, p: &str) -> bool {
        matches!(self.peek(), Tok::Punct(q) if *q == p)
    }

    /// Whether the current token is the identifier `w`.
    pub fn is_ident(&self, w: &str) -> bool {
        matches!(self.peek(), Tok::Ident(q) if *q == w)
    }

    /// Takes the punctuation `p` if it is next.
    pub fn eat(&mut self, p: &str) -> bool {
        let yes = self.is(p);
        if yes {
            self.bump();
        }
        yes
    }

    /// Takes the identifier `w` if it is next.
    pub fn eat_ident(&mut self, w: &str) -> bool {
        let yes = self.is_ident(w);
        if yes {
            self.bump();
        }
        yes
    }

    /// Takes the punctuation `p`, or fails.
    pub fn expect(&mut self, p: &str) -> Result<()> {
        if self.eat(p) {
            Ok(())
        } else {
            self.expected(&format!("`{p}`"))
        }
    }

    /// Takes the identifier `w`, or fails.
    pub fn expect_ident(&mut self, w: &str) -> Result<()> {
        if self.eat_ident(w) {
            Ok(())
        } else {
            self.expected(&format!("`{w}`"))
        }
    }

    /// Takes an identifier.
    pub fn ident(&mut self, what: &str) -> Result<&'a str> {
        match *self.peek() {
            Tok::Ident(w) => {
                self.bump();
                Ok(w)
            }
            _ => self.expected(what),
        }
    }

    /// Takes a `%value` name.
    pub fn value(&mut self) -> Result<Name> {
        let pos = self.pos();
        match *self.peek() {
            Tok::Value(v) => {
                self.bump();
                Ok(Name {
                    name: v.to_string(),
                    pos,
                })
            }
            _ => self.expected("a value such as `%0`"),
        }
    }

    /// Enters one more level of nesting at the current token, failing past [`MAX_NESTING`].
    pub fn enter(&mut self) -> Result<()> {
        if self.depth >= MAX_NESTING {
            return Err(Error::syntax(
                self.pos(),
                format!("the input nests more than {MAX_NESTING} deep"),
            ));
        }
        self.depth += 1;
        Ok(())
    }

    /// Leaves a level of nesting.
    pub fn leave(&mut self) {
        self.depth = self.depth.saturating_sub(1);
    }

    /// Skips a balanced group that starts at the current `open` token (a `loc(...)`, an
    /// ignored attribute dictionary).
    pub fn skip_group(&mut self, open: &str, close: &str) -> Result<()> {
        let start = self.pos();
        self.expect(open)?;
        let mut depth = 1usize;
        while depth > 0 {
            match self.bump() {
                Tok::Eof => {
                    return Err(Error::syntax(start, format!("`{open}` is never closed")));
                }
                Tok::Punct(p) if p == open => depth += 1,
                Tok::Punct(p) if p == close => depth -= 1,
                _ => {}
            }
        }
        Ok(())
    }

    /// Skips a `loc(...)` annotation if one is next.
    pub fn skip_loc(&mut self) -> Result<()> {
        if self.is_ident("loc") && matches!(self.peek2(), Tok::Punct("(")) {
            self.bump();
            self.skip_group("(", ")")?;
        }
        Ok(())
    }
}

/// Parses one module: either `module @name attributes {...} { funcs }` or bare functions.
pub fn parse_module(c: &mut Cursor) -> Result<ModuleAst> {
    let pos = c.pos();
    let mut funcs = Vec::new();
    skip_aliases(c)?;
    if c.eat_ident("module") {
        if let Tok::Symbol(_) = c.peek() {
            c.bump();
        }
        if c.eat_ident("attributes") {
            c.skip_group("{", "}")?;
        }
        c.expect("{")?;
        while !c.eat("}") {
            if skip_mesh(c)? {
                continue;
            }
            funcs.push(parse_func(c)?);
        }
        c.skip_loc()?;
        skip_aliases(c)?;
    } else {
        while !matches!(c.peek(), Tok::Eof) {
            funcs.push(parse_func(c)?);
            skip_aliases(c)?;
        }
    }
    if !matches!(c.peek(), Tok::Eof) {
        return c.expected("the end of the module");
    }
    Ok(ModuleAst { pos, funcs })
}

/// Skips a Shardy device mesh, `sdy.mesh @mesh = <["x"=2]> {...}`, if one is next: it
/// describes how a program is split across devices, which leaves its values as they are on
/// one. Whether one was skipped.
fn skip_mesh(c: &mut Cursor) -> Result<bool> {
    if !c.eat_ident("sdy.mesh") {
        return Ok(false);
    }
    let Tok::Symbol(_) = c.peek() else {
        return c.expected("the mesh's name, such as `@mesh`");
    };
    c.bump();
    c.expect("=")?;
    c.skip_group("<", ">")?;
    if c.is("{") {
        c.skip_group("{", "}")?;
    }
    c.skip_loc()?;
    Ok(true)
}

/// Skips `#name = loc(...)` location aliases (MLIR prints them around a module).
fn skip_aliases(c: &mut Cursor) -> Result<()> {
    while let Tok::Hash(_) = c.peek() {
        if !matches!(c.peek2(), Tok::Punct("=")) {
            return c.expected("a function");
        }
        let pos = c.pos();
        c.bump();
        c.bump();
        if !c.is_ident("loc") {
            return Err(Error::unsupported(
                pos,
                "attribute aliases other than locations (`#name = loc(...)`)",
            ));
        }
        c.skip_loc()?;
    }
    Ok(())
}

/// Parses `func.func [public|private] @name(%a: T {attrs}, ...) -> (T {attrs}, ...) attributes
/// {...} { body }`.
fn parse_func(c: &mut Cursor) -> Result<FuncAst> {
    let pos = c.pos();
    if !c.eat_ident("func.func") {
        if let Tok::Ident(w) = *c.peek()
            && w.contains('.')
        {
            return Err(Error::unsupported(
                pos,
                format!("the top-level op `{w}` (kiln reads functions only)"),
            ));
        }
        return c.expected("`func.func`");
    }
    let mut private = false;
    if c.eat_ident("private") {
        private = true;
    } else {
        c.eat_ident("public");
    }
    let name = match *c.peek() {
        Tok::Symbol(s) => {
            c.bump();
            s.to_string()
        }
        _ => return c.expected("a function name such as `@main`"),
    };
    c.expect("(")?;
    let mut args = Vec::new();
    let mut arg_shapes = Vec::new();
    if !c.eat(")") {
        loop {
            let v = c.value()?;
            c.expect(":")?;
            let mut leaves = Vec::new();
            // A quantized parameter is its storage tensor (see `crate::quant`).
            arg_shapes.push((v.clone(), c.type_leaves(&mut leaves, true)?));
            c.sig_quants.clear();
            if c.is("{") {
                c.skip_group("{", "}")?;
            }
            c.skip_loc()?;
            args.extend(leaves.into_iter().map(|t| (v.clone(), t)));
            if c.eat(")") {
                break;
            }
            c.expect(",")?;
        }
    }
    let mut results = Vec::new();
    if c.eat("->") {
        if c.eat("(") {
            if !c.eat(")") {
                loop {
                    c.type_leaves(&mut results, true)?;
                    if c.is("{") {
                        c.skip_group("{", "}")?;
                    }
                    if c.eat(")") {
                        break;
                    }
                    c.expect(",")?;
                }
            }
        } else {
            c.type_leaves(&mut results, true)?;
        }
        c.sig_quants.clear();
    }
    if arg_shapes.iter().all(|(_, s)| *s == Shape::Leaf) {
        arg_shapes.clear();
    }
    if c.eat_ident("attributes") {
        c.skip_group("{", "}")?;
    }
    if !c.is("{") {
        return Err(Error::unsupported(
            pos,
            format!("the declaration of @{name} without a body"),
        ));
    }
    c.expect("{")?;
    let mut body = parse_block_body(c)?;
    if !body.args.is_empty() {
        return Err(Error::syntax(pos, "a function body has no block label"));
    }
    body.args = args;
    c.skip_loc()?;
    Ok(FuncAst {
        name,
        pos,
        private,
        results,
        body,
        arg_shapes,
    })
}

/// Parses the inside of a region after its `{`, through the closing `}`: an optional block
/// label with arguments (`^bb0(%a: T, ...):`), then operations.
pub fn parse_block_body(c: &mut Cursor) -> Result<Block> {
    // A function body and, inside it, at most as many nested regions as kiln's own text
    // form allows (the passes that walk regions recurse).
    if c.regions > kiln_ir::parse::MAX_REGION_NESTING {
        return Err(Error::unsupported(
            c.pos(),
            format!(
                "regions nested more than {} deep",
                kiln_ir::parse::MAX_REGION_NESTING
            ),
        ));
    }
    c.regions += 1;
    c.enter()?;
    let mut block = Block::default();
    if let Tok::Caret(_) = c.peek() {
        c.bump();
        if c.eat("(") && !c.eat(")") {
            loop {
                let v = c.value()?;
                c.expect(":")?;
                // A quantized block argument is its storage tensor (see `crate::quant`), a
                // tuple its tensors (see `crate::tuple`).
                let mark = c.sig_quants.len();
                let mut leaves = Vec::new();
                let shape = c.type_leaves(&mut leaves, true)?;
                c.sig_quants.truncate(mark);
                c.skip_loc()?;
                block
                    .args
                    .extend(leaves.into_iter().map(|t| (v.clone(), t)));
                block.arg_shapes.push((v, shape));
                if c.eat(")") {
                    break;
                }
                c.expect(",")?;
            }
        }
        c.expect(":")?;
        if block.arg_shapes.iter().all(|(_, s)| *s == Shape::Leaf) {
            block.arg_shapes.clear();
        }
    }
    while !c.eat("}") {
        if let Tok::Caret(_) = c.peek() {
            return Err(Error::unsupported(
                c.pos(),
                "regions of more than one block",
            ));
        }
        if matches!(c.peek(), Tok::Eof) {
            return c.expected("`}`");
        }
        block.ops.push(parse_op(c)?);
    }
    c.leave();
    c.regions -= 1;
    Ok(block)
}

/// Parses `%a, %b:2 = ` result names (or nothing) and returns the expanded names.
fn parse_results(c: &mut Cursor) -> Result<Vec<Name>> {
    let mut results = Vec::new();
    if !matches!(c.peek(), Tok::Value(_)) {
        return Ok(results);
    }
    loop {
        let v = c.value()?;
        if c.eat(":") {
            let pos = c.pos();
            let n = match *c.peek() {
                Tok::Number(n) => n.parse::<usize>().ok().filter(|&n| n <= 1 << 16),
                _ => None,
            };
            let Some(n) = n else {
                return c.expected("a result count");
            };
            c.bump();
            if n == 0 {
                return Err(Error::syntax(pos, "a result group of 0 values"));
            }
            for i in 0..n {
                results.push(Name {
                    name: format!("{}#{i}", v.name),
                    pos: v.pos,
                });
            }
        } else {
            results.push(v);
        }
        if c.eat("=") {
            return Ok(results);
        }
        c.expect(",")?;
    }
}

/// Parses one operation, in either syntax.
pub fn parse_op(c: &mut Cursor) -> Result<OpAst> {
    let results = parse_results(c)?;
    let pos = c.pos();
    // The ops of nested regions record their own signature's quantized types.
    let outer = std::mem::take(&mut c.sig_quants);
    let outer_shapes = std::mem::take(&mut c.sig_shapes);
    let outer_inputs = std::mem::take(&mut c.sig_inputs);
    let parsed = match c.peek().clone() {
        Tok::Str(name) => {
            c.bump();
            parse_generic(c, name, pos)
        }
        Tok::Ident(name) => {
            c.bump();
            crate::pretty::parse_pretty(c, name, pos)
        }
        _ => c.expected("an operation"),
    };
    let quant = std::mem::replace(&mut c.sig_quants, outer);
    let shapes = std::mem::replace(&mut c.sig_shapes, outer_shapes);
    let inputs = std::mem::replace(&mut c.sig_inputs, outer_inputs);
    let mut op = parsed?;
    if quant.iter().any(Option::is_some) {
        op.quant = quant;
    }
    if shapes.iter().any(|s| *s != Shape::Leaf) {
        op.tuples = shapes;
        op.tuple_inputs = inputs;
    }
    op.results = results;
    c.skip_loc()?;
    Ok(op)
}

/// Parses the rest of a generic op after its quoted name: `(operands) <{props}>? (regions)?
/// {attrs}? : (types) -> types`.
fn parse_generic(c: &mut Cursor, name: String, pos: Pos) -> Result<OpAst> {
    let mut op = OpAst {
        name,
        pos,
        results: Vec::new(),
        operands: Vec::new(),
        attrs: Vec::new(),
        regions: Vec::new(),
        sig: Sig::None,
        quant: Vec::new(),
        tuples: Vec::new(),
        tuple_inputs: 0,
    };
    c.expect("(")?;
    if !c.eat(")") {
        loop {
            op.operands.push(c.value()?);
            if c.eat(")") {
                break;
            }
            c.expect(",")?;
        }
    }
    if c.is("[") {
        return Err(Error::unsupported(c.pos(), "successor blocks"));
    }
    if c.eat("<") {
        c.attr_dict(&mut op.attrs)?;
        c.expect(">")?;
    }
    if c.is("(") && matches!(c.peek2(), Tok::Punct("{")) {
        c.bump();
        loop {
            c.expect("{")?;
            op.regions.push(parse_block_body(c)?);
            if c.eat(")") {
                break;
            }
            c.expect(",")?;
        }
    }
    if c.is("{") {
        c.attr_dict(&mut op.attrs)?;
    }
    c.expect(":")?;
    op.sig = parse_func_sig(c)?;
    Ok(op)
}

/// Parses `(T, ...) -> T` or `(T, ...) -> (T, ...)`.
pub fn parse_func_sig(c: &mut Cursor) -> Result<Sig> {
    c.expect("(")?;
    let ins = parse_type_list_until(c, ")")?;
    c.sig_inputs = c.sig_shapes.len();
    c.expect("->")?;
    let outs = if c.eat("(") {
        parse_type_list_until(c, ")")?
    } else {
        let mut outs = Vec::new();
        c.sig_type(&mut outs)?;
        outs
    };
    Ok(Sig::Func(ins, outs))
}

/// Types separated by commas up to the closing `close` (taken).
fn parse_type_list_until(c: &mut Cursor, close: &str) -> Result<Vec<TensorType>> {
    let mut out = Vec::new();
    if c.eat(close) {
        return Ok(out);
    }
    loop {
        c.sig_type(&mut out)?;
        if c.eat(close) {
            return Ok(out);
        }
        c.expect(",")?;
    }
}

/// Parses the signature after a pretty op's `:`: a function type or a list of types.
pub fn parse_pretty_sig(c: &mut Cursor) -> Result<Sig> {
    if c.is("(") {
        return parse_func_sig(c);
    }
    let mut list = Vec::new();
    c.sig_type(&mut list)?;
    while c.is(",") && starts_type(c.peek2()) {
        c.bump();
        c.sig_type(&mut list)?;
    }
    // `T -> U`: a function type without parentheses (`chlo` ops print this way).
    if c.eat("->") {
        c.sig_inputs = c.sig_shapes.len();
        let outs = if c.eat("(") {
            parse_type_list_until(c, ")")?
        } else {
            let mut outs = Vec::new();
            c.sig_type(&mut outs)?;
            outs
        };
        return Ok(Sig::Func(list, outs));
    }
    Ok(Sig::List(list))
}

/// Whether a token can start a type.
fn starts_type(t: &Tok) -> bool {
    matches!(t, Tok::Ident(_) | Tok::Bang(_))
}

/// The value of an attribute written as `name = value`, or [`AttrVal::Unit`] for `name` alone.
pub fn attr_value(c: &mut Cursor) -> Result<AttrVal> {
    if c.eat("=") {
        c.attr()
    } else {
        Ok(AttrVal::Unit)
    }
}
