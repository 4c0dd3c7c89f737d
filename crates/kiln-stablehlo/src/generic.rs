//! The syntax tree written back as MLIR text in the generic op form
//! (`%0 = "stablehlo.add"(%a, %b) : (tensor<2xf32>, tensor<2xf32>) -> tensor<2xf32>`), which
//! MLIR itself parses without knowing StableHLO (its context allowing unregistered dialects).
//!
//! Pretty forms leave some types implicit (`stablehlo.add %a, %b : tensor<2xf32>`); the
//! printer tracks the type of every value so each op gets its full function type. Attribute
//! values that only the pretty forms have become their generic spelling: slice ranges become
//! `start_indices`/`limit_indices`/`strides`, dot dimension pairs `#stablehlo.dot<...>`,
//! convolution layouts `#stablehlo.conv<raw ...>`, bare keywords `#stablehlo<name VALUE>`.

use crate::ast::{AttrVal, Block, ConvDims, Dense, Elem, FuncAst, ModuleAst, Name, OpAst, Sig};
use crate::error::{Error, Result, quote};
use crate::import::result_types;
use crate::literal::type_name;
use kiln_ir::{DType, TensorType};
use std::collections::HashMap;
use std::fmt::Write;

/// Writes `m` as MLIR text with every op in the generic form (`func.func` keeps its own
/// syntax, which MLIR's `func` dialect reads). Fails, naming the op, where a type the generic
/// form needs cannot be known, and (`unsupported`) at quantized, tuple and token types, which
/// the syntax tree does not keep as written.
pub fn print_generic(m: &ModuleAst) -> Result<String> {
    let mut p = Printer::default();
    for f in &m.funcs {
        p.func(f)?;
    }
    Ok(p.out)
}

#[derive(Default)]
struct Printer {
    out: String,
    types: HashMap<String, TensorType>,
}

/// `%name` for a value (a result-group member `x#1` is MLIR's `%x#1`).
fn value(n: &Name) -> String {
    format!("%{}", n.name)
}

/// The result names of an op: `%x:2` for a group `x#0, x#1`, else the names one by one.
fn result_names(results: &[Name]) -> String {
    let mut parts = Vec::new();
    let mut i = 0;
    while i < results.len() {
        if let Some(base) = results[i].name.strip_suffix("#0") {
            let mut n = 1;
            while i + n < results.len() && results[i + n].name == format!("{base}#{n}") {
                n += 1;
            }
            parts.push(format!("%{base}:{n}"));
            i += n;
        } else {
            parts.push(value(&results[i]));
            i += 1;
        }
    }
    parts.join(", ")
}

fn type_list(ts: &[TensorType]) -> String {
    ts.iter().map(type_name).collect::<Vec<_>>().join(", ")
}

impl Printer {
    fn func(&mut self, f: &FuncAst) -> Result<()> {
        if !f.arg_shapes.is_empty() {
            return Err(Error::unsupported(
                f.pos,
                format!(
                    "the tuple or token parameters of @{} in the generic form (the syntax tree lists their tensors flat)",
                    f.name
                ),
            ));
        }
        for (n, t) in &f.body.args {
            self.types.insert(n.name.clone(), t.clone());
        }
        let args: Vec<String> = f
            .body
            .args
            .iter()
            .map(|(n, t)| format!("{}: {}", value(n), type_name(t)))
            .collect();
        let vis = if f.private { "private " } else { "" };
        let _ = writeln!(
            self.out,
            "func.func {vis}@{}({}) -> ({}) {{",
            f.name,
            args.join(", "),
            type_list(&f.results)
        );
        for op in &f.body.ops {
            self.op(op, 1)?;
        }
        self.out.push_str("}\n");
        Ok(())
    }

    fn block(&mut self, b: &Block, indent: usize) -> Result<()> {
        if let Some((n, _)) = b.arg_shapes.first() {
            return Err(Error::unsupported(
                n.pos,
                "tuple or token block arguments in the generic form (the syntax tree lists their tensors flat)",
            ));
        }
        let pad = "  ".repeat(indent);
        let args: Vec<String> = b
            .args
            .iter()
            .map(|(n, t)| format!("{}: {}", value(n), type_name(t)))
            .collect();
        for (n, t) in &b.args {
            self.types.insert(n.name.clone(), t.clone());
        }
        let _ = writeln!(self.out, "{pad}^bb0({}):", args.join(", "));
        for op in &b.ops {
            self.op(op, indent + 1)?;
        }
        Ok(())
    }

    fn operand_type(&self, n: &Name, op: &OpAst) -> Result<TensorType> {
        let base = n.name.strip_suffix("#0").unwrap_or(&n.name);
        self.types
            .get(&n.name)
            .or_else(|| self.types.get(base))
            .cloned()
            .ok_or_else(|| {
                Error::invalid(
                    n.pos,
                    format!("value %{} of `{}` is not defined", n.name, op.name),
                )
            })
    }

    fn op(&mut self, op: &OpAst, indent: usize) -> Result<()> {
        if !op.quant.is_empty() || !op.tuples.is_empty() {
            return Err(Error::unsupported(
                op.pos,
                format!(
                    "the quantized, tuple or token types of `{}` in the generic form (the syntax tree keeps a quantized tensor's storage type and a tuple's tensors flat)",
                    op.name
                ),
            ));
        }
        let ins = match &op.sig {
            Sig::Func(ins, _) if ins.len() == op.operands.len() => ins.clone(),
            _ => op
                .operands
                .iter()
                .map(|n| self.operand_type(n, op))
                .collect::<Result<_>>()?,
        };
        let outs = if op.results.is_empty() {
            match &op.sig {
                Sig::Func(_, outs) => outs.clone(),
                _ => Vec::new(),
            }
        } else {
            result_types(op).ok_or_else(|| {
                Error::unsupported(
                    op.pos,
                    format!(
                        "`{}`: result types that its signature does not give",
                        op.name
                    ),
                )
            })?
        };
        let attrs = self.attrs(op)?;
        let pad = "  ".repeat(indent);
        let _ = write!(self.out, "{pad}");
        if !op.results.is_empty() {
            let _ = write!(self.out, "{} = ", result_names(&op.results));
        }
        let operands: Vec<String> = op.operands.iter().map(value).collect();
        let _ = write!(self.out, "\"{}\"({})", op.name, operands.join(", "));
        if !op.regions.is_empty() {
            self.out.push_str(" ({\n");
            for (i, r) in op.regions.iter().enumerate() {
                if i > 0 {
                    let _ = writeln!(self.out, "{pad}}}, {{");
                }
                self.block(r, indent + 1)?;
            }
            let _ = write!(self.out, "{pad}}})");
        }
        if !attrs.is_empty() {
            let _ = write!(self.out, " {{{}}}", attrs.join(", "));
        }
        let _ = writeln!(
            self.out,
            " : ({}) -> ({})",
            type_list(&ins),
            type_list(&outs)
        );
        for (n, t) in op.results.iter().zip(&outs) {
            self.types.insert(n.name.clone(), t.clone());
        }
        Ok(())
    }

    /// The attributes of `op` as `name = value` texts, pretty-only forms made generic.
    fn attrs(&self, op: &OpAst) -> Result<Vec<String>> {
        // The type a dense literal without one takes: the constant's result, or the checked
        // value's type.
        let dense_type = match &op.sig {
            Sig::Func(ins, outs) => outs.first().or(ins.first()).cloned(),
            Sig::List(ts) => ts.last().cloned(),
            Sig::None => None,
        };
        let mut out = Vec::new();
        let mut pairs = Vec::new();
        for (name, v, pos) in &op.attrs {
            match (name.as_str(), v) {
                (_, AttrVal::Ranges(r)) => {
                    let col = |k: usize| {
                        let v: Vec<String> =
                            r.iter().map(|t| [t.0, t.1, t.2][k].to_string()).collect();
                        format!("array<i64: {}>", v.join(", "))
                    };
                    out.push(format!("start_indices = {}", col(0)));
                    out.push(format!("limit_indices = {}", col(1)));
                    out.push(format!("strides = {}", col(2)));
                }
                (n @ ("batching_dims" | "contracting_dims"), AttrVal::Pair(a, b)) => {
                    let kind = if n == "batching_dims" {
                        "batching"
                    } else {
                        "contracting"
                    };
                    pairs.push(format!(
                        "lhs_{kind}_dimensions = {}",
                        attr_text(a, None, *pos)?
                    ));
                    pairs.push(format!(
                        "rhs_{kind}_dimensions = {}",
                        attr_text(b, None, *pos)?
                    ));
                }
                (n, AttrVal::Ident(w)) => {
                    out.push(format!("{} = #stablehlo<{n} {w}>", attr_name(n)))
                }
                (n, AttrVal::Dense(d, None)) => out.push(format!(
                    "{} = {}",
                    attr_name(n),
                    dense_text(d, dense_type.as_ref(), op)?
                )),
                (n, v) => out.push(format!("{} = {}", attr_name(n), attr_text(v, None, *pos)?)),
            }
        }
        if !pairs.is_empty() {
            out.push(format!(
                "dot_dimension_numbers = #stablehlo.dot<{}>",
                pairs.join(", ")
            ));
        }
        Ok(out)
    }
}

/// An attribute name, quoted when it is not a bare identifier.
fn attr_name(n: &str) -> String {
    if n.chars()
        .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '.' || c == '$')
        && n.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_')
    {
        n.to_string()
    } else {
        format!("\"{}\"", escape(n))
    }
}

/// A string's MLIR escapes.
fn escape(s: &str) -> String {
    let mut out = String::new();
    for b in s.bytes() {
        match b {
            b'"' | b'\\' => {
                out.push('\\');
                out.push(b as char);
            }
            0x20..=0x7e => out.push(b as char),
            _ => {
                let _ = write!(out, "\\{b:02X}");
            }
        }
    }
    out
}

/// The generic text of an attribute value (`ty` types a dense literal that has none).
fn attr_text(v: &AttrVal, ty: Option<&TensorType>, pos: crate::Pos) -> Result<String> {
    Ok(match v {
        AttrVal::Int(i) => format!("{i} : i64"),
        AttrVal::Float(f) => format!("{} : f64", float_text(*f, DType::F64)),
        AttrVal::Bool(b) => b.to_string(),
        AttrVal::Str(s) => format!("\"{}\"", escape(s)),
        AttrVal::Ident(w) => format!("#stablehlo<keyword {w}>"),
        AttrVal::Symbol(s) => format!("@{s}"),
        AttrVal::Array(a) => {
            let items: Vec<String> = a.iter().map(|x| x.to_string()).collect();
            if items.is_empty() {
                "array<i64>".into()
            } else {
                format!("array<i64: {}>", items.join(", "))
            }
        }
        AttrVal::Dense(d, t) => {
            let t = t.as_ref().or(ty).ok_or_else(|| {
                Error::unsupported(pos, "a dense literal whose type is not known")
            })?;
            format!("{} : {}", dense_body(d, t), type_name(t))
        }
        AttrVal::List(items) => {
            let items: Vec<String> = items
                .iter()
                .map(|x| attr_text(x, None, pos))
                .collect::<Result<_>>()?;
            format!("[{}]", items.join(", "))
        }
        AttrVal::Pair(_, _) => {
            return Err(Error::unsupported(
                pos,
                "a `[..] x [..]` pair outside `dot_general`'s dimensions",
            ));
        }
        AttrVal::ConvDims(c) => conv_text(c),
        AttrVal::Struct(name, fields) => {
            let fs: Vec<String> = fields
                .iter()
                .map(|(n, v)| match v {
                    AttrVal::Unit => Ok(n.clone()),
                    v => Ok(format!("{n} = {}", attr_text(v, None, pos)?)),
                })
                .collect::<Result<_>>()?;
            if name.is_empty() {
                format!("{{{}}}", fs.join(", "))
            } else {
                format!("#{name}<{}>", fs.join(", "))
            }
        }
        AttrVal::Enum(kind, value) => format!("#stablehlo<{kind} {value}>"),
        AttrVal::Type(t) => type_name(t),
        AttrVal::Ranges(_) => {
            return Err(Error::unsupported(pos, "slice ranges outside a slice"));
        }
        AttrVal::Unit => "unit".into(),
    })
}

/// A dense literal typed by `ty`.
fn dense_text(d: &Dense, ty: Option<&TensorType>, op: &OpAst) -> Result<String> {
    let t = ty.ok_or_else(|| {
        Error::unsupported(
            d.pos,
            format!(
                "{}: a dense literal whose type is not known",
                quote(&op.name)
            ),
        )
    })?;
    Ok(format!("{} : {}", dense_body(d, t), type_name(t)))
}

/// `dense<...>` with the elements nested as written.
fn dense_body(d: &Dense, t: &TensorType) -> String {
    let elems: Vec<String> = d.elems.iter().map(|e| elem_text(e, t.dtype)).collect();
    match &d.shape {
        None => format!("dense<{}>", elems.first().cloned().unwrap_or_default()),
        // An empty literal of any shape (`[]` would say one dimension).
        Some(_) if elems.is_empty() => "dense<>".into(),
        Some(shape) => {
            let mut it = elems.into_iter();
            let mut s = String::new();
            nest(&mut s, shape, &mut it);
            format!("dense<{s}>")
        }
    }
}

fn nest(s: &mut String, shape: &[usize], it: &mut impl Iterator<Item = String>) {
    s.push('[');
    for i in 0..shape[0] {
        if i > 0 {
            s.push_str(", ");
        }
        if shape.len() > 1 {
            nest(s, &shape[1..], it);
        } else if let Some(e) = it.next() {
            s.push_str(&e);
        }
    }
    s.push(']');
}

fn elem_text(e: &Elem, d: DType) -> String {
    match *e {
        Elem::Int(i) if d.is_float() => float_text(i as f64, d),
        Elem::Int(i) => i.to_string(),
        Elem::Float(f) => float_text(f, d),
        Elem::Bool(b) => b.to_string(),
        Elem::Hex(h) => format!("0x{h:X}"),
        Elem::Complex(re, im) => format!(
            "({}, {})",
            elem_text(&re.into(), d.part()),
            elem_text(&im.into(), d.part())
        ),
    }
}

/// A float in MLIR's literal syntax: decimal with a point, or the bits in hex for infinities
/// and NaN.
fn float_text(f: f64, d: DType) -> String {
    if !f.is_finite() {
        return match d {
            DType::F32 => format!("0x{:08X}", (f as f32).to_bits()),
            DType::F16 => format!("0x{:04X}", kiln_ir::half_round::f16_from_f64(f).to_bits()),
            DType::BF16 => format!("0x{:04X}", kiln_ir::half_round::bf16_from_f64(f).to_bits()),
            DType::Mini(m) => format!("0x{:02X}", m.from_f64(f)),
            _ => format!("0x{:016X}", f.to_bits()),
        };
    }
    let s = format!("{f:e}");
    let (m, e) = s.split_once('e').unwrap_or((&s, "0"));
    if m.contains('.') {
        format!("{m}e{e}")
    } else {
        format!("{m}.0e{e}")
    }
}

/// `#stablehlo.conv<raw ...>`.
fn conv_text(c: &ConvDims) -> String {
    let l = |v: &[i64]| {
        format!(
            "[{}]",
            v.iter()
                .map(|x| x.to_string())
                .collect::<Vec<_>>()
                .join(", ")
        )
    };
    format!(
        "#stablehlo.conv<raw input_batch_dimension = {}, input_feature_dimension = {}, \
         input_spatial_dimensions = {}, kernel_input_feature_dimension = {}, \
         kernel_output_feature_dimension = {}, kernel_spatial_dimensions = {}, \
         output_batch_dimension = {}, output_feature_dimension = {}, \
         output_spatial_dimensions = {}>",
        c.input_batch,
        c.input_feature,
        l(&c.input_spatial),
        c.kernel_input_feature,
        c.kernel_output_feature,
        l(&c.kernel_spatial),
        c.output_batch,
        c.output_feature,
        l(&c.output_spatial)
    )
}
