//! The pretty (custom assembly) forms of ops, as `mlir-opt`, `stablehlo-opt` and JAX's
//! `lowered.as_text()` print them.
//!
//! Most pretty forms are a run of operands, keywords (`EQ`, `SIGNED`), `name = value` pairs,
//! an optional attribute dictionary and a type signature after `:`; one scanner reads them
//! all into the generic structure, keeping the pretty attribute names (`dims`, `dim`, `low`,
//! ...) which the op mapping accepts next to the generic ones. Ops whose syntax is their own
//! (`func.return`, `func.call`, `while`, `reduce`) have their own parsers here.

use crate::ast::{AttrVal, Block, Name, OpAst, Shape, Sig};
use crate::error::{Error, Pos, Result, quote};
use crate::lexer::Tok;
use crate::parser::{Cursor, parse_block_body, parse_func_sig, parse_pretty_sig};
use kiln_ir::TensorType;

/// The attribute names of positional keywords, by op: `compare EQ, %a, %b, FLOAT`.
fn keyword_names(op: &str) -> &'static [&'static str] {
    match op {
        "stablehlo.compare" => &["comparison_direction", "compare_type"],
        _ => &["keyword", "keyword2"],
    }
}

/// Parses a pretty op after its name.
pub fn parse_pretty(c: &mut Cursor, name: &str, pos: Pos) -> Result<OpAst> {
    // Inside `func.func`, MLIR's default dialect lets `return` and `call` stand for
    // `func.return` and `func.call`.
    let name = match name {
        "return" => "func.return",
        "call" => "func.call",
        _ => name,
    };
    let mut op = OpAst {
        name: name.to_string(),
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
    match name {
        "func.return" | "stablehlo.return" => {
            // Values follow unless the next token starts the next op (`%x = ...`).
            if matches!(c.peek(), Tok::Value(_)) && !matches!(c.peek2(), Tok::Punct("=")) {
                loop {
                    op.operands.push(c.value()?);
                    if !c.eat(",") {
                        break;
                    }
                }
                c.expect(":")?;
                op.sig = parse_pretty_sig(c)?;
            }
            Ok(op)
        }
        "func.call" => {
            let spos = c.pos();
            let Tok::Symbol(callee) = *c.peek() else {
                return c.expected("a function name such as `@f`");
            };
            c.bump();
            op.attrs
                .push(("callee".into(), AttrVal::Symbol(callee.into()), spos));
            op.operands = value_group(c)?;
            if c.is("{") {
                c.attr_dict(&mut op.attrs)?;
            }
            c.expect(":")?;
            op.sig = parse_func_sig(c)?;
            Ok(op)
        }
        "stablehlo.while" => parse_while(c, op),
        // `sdy.sharding_constraint %x <@mesh, [{"x"}]> : T`: the sharding is skipped (one
        // device computes the value as it is).
        "sdy.sharding_constraint" | "sdy.reshard" => {
            op.operands.push(c.value()?);
            c.skip_group("<", ">")?;
            if c.is("{") {
                c.attr_dict(&mut op.attrs)?;
            }
            c.expect(":")?;
            op.sig = parse_pretty_sig(c)?;
            Ok(op)
        }
        n if n.starts_with("sdy.") => Err(Error::unsupported(
            pos,
            format!(
                "the Shardy op {} (kiln runs a program on one device)",
                quote(n)
            ),
        )),
        "stablehlo.reduce" if c.is("(") => parse_reduce(c, op),
        _ => {
            scan(c, &mut op)?;
            Ok(op)
        }
    }
}

/// `(%a, %b)`.
fn value_group(c: &mut Cursor) -> Result<Vec<Name>> {
    c.expect("(")?;
    let mut out = Vec::new();
    if c.eat(")") {
        return Ok(out);
    }
    loop {
        out.push(c.value()?);
        if c.eat(")") {
            return Ok(out);
        }
        c.expect(",")?;
    }
}

/// `(%a, %b, name = value)`: operands, and attributes among them (`chlo.top_k(%x, k = 2)`).
fn operand_group(c: &mut Cursor, op: &mut OpAst) -> Result<()> {
    c.expect("(")?;
    if c.eat(")") {
        return Ok(());
    }
    loop {
        let pos = c.pos();
        match c.peek().clone() {
            Tok::Ident(w) if matches!(c.peek2(), Tok::Punct("=")) => {
                c.bump();
                c.bump();
                let v = pretty_value(c)?;
                op.attrs.push((w.to_string(), v, pos));
            }
            _ => op.operands.push(c.value()?),
        }
        if c.eat(")") {
            return Ok(());
        }
        c.expect(",")?;
    }
}

/// The generic pretty scanner: operands, keywords, `name = value`, `{attrs}`, `: signature`.
fn scan(c: &mut Cursor, op: &mut OpAst) -> Result<()> {
    let mut keywords = 0usize;
    loop {
        let pos = c.pos();
        match c.peek().clone() {
            Tok::Value(_) => op.operands.push(c.value()?),
            Tok::Punct(",") => {
                c.bump();
            }
            Tok::Punct("(") => operand_group(c, op)?,
            Tok::Punct(":") => {
                c.bump();
                op.sig = parse_pretty_sig(c)?;
                if c.is("{") && !matches!(c.peek2(), Tok::Caret(_)) {
                    c.attr_dict(&mut op.attrs)?;
                }
                return Ok(());
            }
            Tok::Punct("{") if matches!(c.peek2(), Tok::Caret(_)) => {
                c.bump();
                op.regions.push(parse_block_body(c)?);
            }
            Tok::Punct("{") => c.attr_dict(&mut op.attrs)?,
            Tok::Punct("[") if op.name == "stablehlo.get_tuple_element" => {
                // `get_tuple_element %t[1]`: the element's index.
                c.bump();
                let index = c.attr_bare()?;
                c.expect("]")?;
                op.attrs.push(("index".into(), index, pos));
            }
            Tok::Punct("[") => {
                let r = ranges(c)?;
                op.attrs.push(("ranges".into(), r, pos));
            }
            Tok::Ident("dense") => {
                let d = c.dense()?;
                op.attrs
                    .push(("value".into(), AttrVal::Dense(d, None), pos));
            }
            Tok::Str(s) => {
                c.bump();
                op.attrs.push(("name".into(), AttrVal::Str(s), pos));
            }
            Tok::Symbol(s) => {
                c.bump();
                op.attrs
                    .push(("callee".into(), AttrVal::Symbol(s.into()), pos));
            }
            Tok::Ident(w) if matches!(c.peek2(), Tok::Punct("=")) => {
                c.bump();
                c.bump();
                let v = pretty_value(c)?;
                op.attrs.push((w.to_string(), v, pos));
            }
            Tok::Ident(w) if matches!(c.peek2(), Tok::Punct("(")) => {
                // A named operand group, such as `inits(%a, %b)`; `inits_start` records
                // where it starts among the operands.
                c.bump();
                let start = AttrVal::Int(op.operands.len() as i64);
                op.attrs.push((format!("{w}_start"), start, pos));
                op.operands.extend(value_group(c)?);
            }
            Tok::Ident(w) => {
                c.bump();
                let names = keyword_names(&op.name);
                let Some(n) = names.get(keywords) else {
                    return Err(Error::syntax(
                        pos,
                        format!("unexpected {} in `{}`", quote(w), op.name),
                    ));
                };
                keywords += 1;
                op.attrs
                    .push((n.to_string(), AttrVal::Ident(w.to_string()), pos));
            }
            Tok::Punct("}") | Tok::Eof => return Ok(()),
            other => {
                return Err(Error::syntax(
                    pos,
                    format!("unexpected {} in `{}`", other.describe(), op.name),
                ));
            }
        }
    }
}

/// The value after `name =` in a pretty form: an attribute, or `[..] x [..]` (dot_general's
/// dimensions), or `[b, 0, f]x[0, i, o]->[b, 0, f]` (convolution's dimension numbers).
fn pretty_value(c: &mut Cursor) -> Result<AttrVal> {
    if c.is("<") {
        // `algorithm = <lhs_precision_type = tf32, ...>`: named fields.
        c.enter()?;
        c.bump();
        let mut fields = Vec::new();
        if !c.eat(">") {
            loop {
                let name = c.ident("a field name")?.to_string();
                let v = crate::parser::attr_value(c)?;
                fields.push((name, v));
                if c.eat(">") {
                    break;
                }
                c.expect(",")?;
            }
        }
        c.leave();
        return Ok(AttrVal::Struct(String::new(), fields));
    }
    if !c.is("[") {
        return c.attr_bare();
    }
    let pos = c.pos();
    let first = c.attr_bare()?;
    if !c.eat_ident("x") {
        return Ok(first);
    }
    let second = c.attr_bare()?;
    if !c.eat("->") {
        return Ok(AttrVal::Pair(Box::new(first), Box::new(second)));
    }
    let third = c.attr_bare()?;
    conv_dims_from_lists(&first, &second, &third, pos)
}

/// Convolution dimension numbers from the three layout lists of the pretty form.
fn conv_dims_from_lists(i: &AttrVal, k: &AttrVal, o: &AttrVal, pos: Pos) -> Result<AttrVal> {
    fn layout(v: &AttrVal, names: [&str; 2], pos: Pos) -> Result<(i64, i64, Vec<i64>)> {
        let AttrVal::List(items) = v else {
            return Err(Error::syntax(
                pos,
                "expected a convolution layout such as `[b, 0, 1, f]`",
            ));
        };
        let mut found = [None, None];
        let mut spatial = Vec::new();
        for (at, it) in items.iter().enumerate() {
            match it {
                AttrVal::Ident(w) if w == names[0] => found[0] = Some(at as i64),
                AttrVal::Ident(w) if w == names[1] => found[1] = Some(at as i64),
                AttrVal::Int(s) => spatial.push((*s, at as i64)),
                _ => {
                    return Err(Error::syntax(
                        pos,
                        format!(
                            "a convolution layout holds `{}`, `{}` and spatial numbers",
                            names[0], names[1]
                        ),
                    ));
                }
            }
        }
        let (Some(a), Some(b)) = (found[0], found[1]) else {
            return Err(Error::invalid(
                pos,
                format!(
                    "a convolution layout needs `{}` and `{}`",
                    names[0], names[1]
                ),
            ));
        };
        spatial.sort();
        if spatial.iter().enumerate().any(|(k, &(s, _))| s != k as i64) {
            return Err(Error::invalid(
                pos,
                "the spatial dimensions of a convolution layout must be 0, 1, ...",
            ));
        }
        Ok((a, b, spatial.into_iter().map(|(_, at)| at).collect()))
    }
    let (ib, ifeat, isp) = layout(i, ["b", "f"], pos)?;
    let (ki, ko, ksp) = layout(k, ["i", "o"], pos)?;
    let (ob, of, osp) = layout(o, ["b", "f"], pos)?;
    Ok(AttrVal::ConvDims(crate::ast::ConvDims {
        input_batch: ib,
        input_feature: ifeat,
        input_spatial: isp,
        kernel_input_feature: ki,
        kernel_output_feature: ko,
        kernel_spatial: ksp,
        output_batch: ob,
        output_feature: of,
        output_spatial: osp,
    }))
}

/// `[0:2, 1:4:2]`: slice bounds.
fn ranges(c: &mut Cursor) -> Result<AttrVal> {
    c.expect("[")?;
    let mut out = Vec::new();
    if c.eat("]") {
        return Ok(AttrVal::Ranges(out));
    }
    loop {
        let mut parts = Vec::new();
        loop {
            let pos = c.pos();
            match c.bump() {
                Tok::Number(s) => parts
                    .push(s.parse::<i64>().map_err(|_| {
                        Error::syntax(pos, format!("bad slice bound {}", quote(s)))
                    })?),
                _ => return Err(Error::syntax(pos, "expected a slice bound")),
            }
            if !c.eat(":") {
                break;
            }
        }
        let pos = c.pos();
        match parts[..] {
            [a, b] => out.push((a, b, 1)),
            [a, b, s] => out.push((a, b, s)),
            _ => {
                return Err(Error::syntax(
                    pos,
                    "a slice range is `start:limit` or `start:limit:stride`",
                ));
            }
        }
        if c.eat("]") {
            return Ok(AttrVal::Ranges(out));
        }
        c.expect(",")?;
    }
}

/// `stablehlo.while(%a = %x, ...) : T, ... cond { ... } do { ... }`.
fn parse_while(c: &mut Cursor, mut op: OpAst) -> Result<OpAst> {
    c.expect("(")?;
    let mut args = Vec::new();
    if !c.eat(")") {
        loop {
            let a = c.value()?;
            c.expect("=")?;
            op.operands.push(c.value()?);
            args.push(a);
            if c.eat(")") {
                break;
            }
            c.expect(",")?;
        }
    }
    if c.is("{") {
        c.attr_dict(&mut op.attrs)?;
    }
    let mut types = Vec::new();
    if c.eat(":") {
        match parse_pretty_sig(c)? {
            Sig::List(t) => types = t,
            _ => return Err(Error::syntax(c.pos(), "a while's types are a list")),
        }
    }
    // Tuple or token carries: each carry's tensors, all with its name.
    let shapes = c.sig_shapes.clone();
    let mut arg_shapes = Vec::new();
    if shapes.len() == args.len() && shapes.iter().any(|s| *s != Shape::Leaf) {
        let mut leaves = types.iter();
        let mut block_args = Vec::new();
        for (a, s) in args.iter().zip(&shapes) {
            for t in leaves.by_ref().take(s.leaves()) {
                block_args.push((a.clone(), t.clone()));
            }
            arg_shapes.push((a.clone(), s.clone()));
        }
        return while_regions(c, op, block_args, arg_shapes, types);
    }
    if types.len() != args.len() {
        return Err(Error::invalid(
            op.pos,
            format!(
                "`stablehlo.while` has {} carries and {} types",
                args.len(),
                types.len()
            ),
        ));
    }
    let block_args: Vec<_> = args.into_iter().zip(types.iter().cloned()).collect();
    while_regions(c, op, block_args, arg_shapes, types)
}

/// The `cond { ... } do { ... }` regions of a pretty `while`, each taking `block_args`.
fn while_regions(
    c: &mut Cursor,
    mut op: OpAst,
    block_args: Vec<(Name, TensorType)>,
    arg_shapes: Vec<(Name, Shape)>,
    types: Vec<TensorType>,
) -> Result<OpAst> {
    for kw in ["cond", "do"] {
        c.expect_ident(kw)?;
        c.expect("{")?;
        let mut b = parse_block_body(c)?;
        if !b.args.is_empty() {
            return Err(Error::syntax(
                op.pos,
                "a pretty `while` region has no block label",
            ));
        }
        b.args = block_args.clone();
        b.arg_shapes = arg_shapes.clone();
        op.regions.push(b);
    }
    op.sig = Sig::List(types);
    Ok(op)
}

/// `stablehlo.reduce(%x init: %i), ... applies OP across dimensions = [..] : sig` or
/// `... across dimensions = [..] : sig reducer(%a: T, %b: T) ... { ... }`.
fn parse_reduce(c: &mut Cursor, mut op: OpAst) -> Result<OpAst> {
    let mut inputs = Vec::new();
    let mut inits = Vec::new();
    loop {
        c.expect("(")?;
        inputs.push(c.value()?);
        c.expect_ident("init")?;
        c.expect(":")?;
        inits.push(c.value()?);
        c.expect(")")?;
        if !c.eat(",") {
            break;
        }
    }
    op.operands = inputs.into_iter().chain(inits).collect();
    if c.is_ident("applies") {
        let pos = c.pos();
        c.bump();
        let body = c.ident("an op name")?;
        op.attrs
            .push(("applies".into(), AttrVal::Ident(body.into()), pos));
    }
    c.expect_ident("across")?;
    let pos = c.pos();
    c.expect_ident("dimensions")?;
    c.expect("=")?;
    let dims = c.attr_bare()?;
    op.attrs.push(("dimensions".into(), dims, pos));
    if c.is("{") {
        c.attr_dict(&mut op.attrs)?;
    }
    c.expect(":")?;
    op.sig = parse_func_sig(c)?;
    if c.eat_ident("reducer") {
        let mut lhs = Vec::new();
        let mut rhs = Vec::new();
        while c.eat("(") {
            let a = c.value()?;
            c.expect(":")?;
            let at = c.tensor_type()?;
            c.expect(",")?;
            let b = c.value()?;
            c.expect(":")?;
            let bt = c.tensor_type()?;
            c.expect(")")?;
            lhs.push((a, at));
            rhs.push((b, bt));
        }
        c.expect("{")?;
        let mut body: Block = parse_block_body(c)?;
        body.args = lhs.into_iter().chain(rhs).collect();
        op.regions.push(body);
    }
    Ok(op)
}
