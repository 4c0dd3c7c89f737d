//! Attribute values: numbers, strings, `array<i64: ...>`, `dense<...>`, lists, dictionaries,
//! and the StableHLO dialect attributes (`#stablehlo<precision DEFAULT>`,
//! `#stablehlo.gather<...>`, `#stablehlo.scatter<...>`, `#stablehlo.conv<...>`).

use crate::ast::{AttrVal, ConvDims, Dense, Elem, Part};
use crate::error::{Error, Pos, Result, quote};
use crate::lexer::Tok;
use crate::parser::{Cursor, attr_value};

/// Parses the number token `s` as a dense element.
pub fn parse_elem(s: &str, pos: Pos) -> Result<Elem> {
    let bad = || Error::syntax(pos, format!("bad number {}", quote(s)));
    let (neg, digits) = match s.strip_prefix('-') {
        Some(d) => (true, d),
        None => (false, s),
    };
    if let Some(h) = digits.strip_prefix("0x") {
        if neg {
            return Err(bad());
        }
        return u64::from_str_radix(h, 16).map(Elem::Hex).map_err(|_| bad());
    }
    if digits.bytes().all(|b| b.is_ascii_digit()) {
        return s.parse::<i128>().map(Elem::Int).map_err(|_| bad());
    }
    if digits
        .bytes()
        .all(|b| b.is_ascii_digit() || matches!(b, b'.' | b'e' | b'E' | b'+' | b'-'))
    {
        return s.parse::<f64>().map(Elem::Float).map_err(|_| bad());
    }
    Err(bad())
}

/// An integer attribute token (decimal or hex).
fn parse_int(s: &str, pos: Pos) -> Result<i64> {
    match parse_elem(s, pos)? {
        Elem::Int(i) => i64::try_from(i).map_err(|_| {
            Error::invalid(pos, format!("integer {} does not fit in 64 bits", quote(s)))
        }),
        Elem::Hex(h) => Ok(h as i64),
        _ => Err(Error::syntax(
            pos,
            format!("expected an integer, found {}", quote(s)),
        )),
    }
}

impl Cursor<'_> {
    /// Parses `{name = value, name, ...}` into `out` (the current token is `{`).
    pub fn attr_dict(&mut self, out: &mut Vec<(String, AttrVal, Pos)>) -> Result<()> {
        self.expect("{")?;
        if self.eat("}") {
            return Ok(());
        }
        loop {
            let pos = self.pos();
            let name = match self.bump() {
                Tok::Ident(n) => n.to_string(),
                Tok::Str(n) => n,
                _ => {
                    return Err(Error::syntax(pos, "expected an attribute name"));
                }
            };
            if out.iter().any(|(n, _, _)| *n == name) {
                return Err(Error::invalid(
                    pos,
                    format!("attribute {} is given twice", quote(&name)),
                ));
            }
            let v = attr_value(self)?;
            out.push((name, v, pos));
            if self.eat("}") {
                return Ok(());
            }
            self.expect(",")?;
        }
    }

    /// Parses an attribute value, with an optional `: type` after it.
    pub fn attr(&mut self) -> Result<AttrVal> {
        let v = self.attr_bare()?;
        if self.is(":") {
            let ty_pos = self.pos();
            match self.peek2().clone() {
                Tok::Ident("tensor") => {
                    self.bump();
                    let t = self.tensor_type()?;
                    return Ok(match v {
                        AttrVal::Dense(d, _) => AttrVal::Dense(d, Some(t)),
                        other => other,
                    });
                }
                Tok::Ident(_) => {
                    self.bump();
                    self.bump();
                }
                Tok::Bang(_) => {
                    return Err(Error::unsupported(ty_pos, "dialect types in attributes"));
                }
                _ => {}
            }
        }
        Ok(v)
    }

    /// Parses an attribute value without a type suffix.
    pub fn attr_bare(&mut self) -> Result<AttrVal> {
        let pos = self.pos();
        match self.peek().clone() {
            Tok::Number(s) => {
                self.bump();
                Ok(match parse_elem(s, pos)? {
                    Elem::Int(i) => AttrVal::Int(i64::try_from(i).map_err(|_| {
                        Error::invalid(pos, format!("integer {} does not fit in 64 bits", quote(s)))
                    })?),
                    Elem::Hex(h) => AttrVal::Int(h as i64),
                    Elem::Float(f) => AttrVal::Float(f),
                    Elem::Bool(b) => AttrVal::Bool(b),
                    Elem::Complex(..) => {
                        return Err(Error::syntax(pos, "a complex number is not an attribute"));
                    }
                })
            }
            Tok::Ident("true") => {
                self.bump();
                Ok(AttrVal::Bool(true))
            }
            Tok::Ident("false") => {
                self.bump();
                Ok(AttrVal::Bool(false))
            }
            Tok::Ident("dense") => self.dense().map(|d| AttrVal::Dense(d, None)),
            Tok::Ident("array") => self.array(),
            Tok::Ident("tensor") => self.tensor_type().map(AttrVal::Type),
            Tok::Ident(w) => {
                self.bump();
                if self.is("<") {
                    return Err(Error::unsupported(
                        pos,
                        format!("the attribute {}", quote(&format!("{w}<...>"))),
                    ));
                }
                Ok(AttrVal::Ident(w.to_string()))
            }
            Tok::Str(s) => {
                self.bump();
                Ok(AttrVal::Str(s))
            }
            Tok::Symbol(s) => {
                self.bump();
                Ok(AttrVal::Symbol(s.to_string()))
            }
            Tok::Punct("[") => {
                self.enter()?;
                self.bump();
                let mut items = Vec::new();
                if !self.eat("]") {
                    loop {
                        items.push(self.attr()?);
                        if self.eat("]") {
                            break;
                        }
                        self.expect(",")?;
                    }
                }
                self.leave();
                Ok(AttrVal::List(items))
            }
            Tok::Punct("{") => {
                self.enter()?;
                let mut fields = Vec::new();
                self.attr_dict(&mut fields)?;
                self.leave();
                Ok(AttrVal::Struct(
                    String::new(),
                    fields.into_iter().map(|(n, v, _)| (n, v)).collect(),
                ))
            }
            Tok::Hash(h) => self.dialect_attr(h, pos),
            _ => self.expected("an attribute value"),
        }
    }

    /// `array<i64: 1, 2>`, `array<i1: true, false>`, `array<i64>`.
    fn array(&mut self) -> Result<AttrVal> {
        self.bump();
        self.expect("<")?;
        let epos = self.pos();
        let elem = self.ident("an element type")?;
        if !matches!(elem, "i64" | "i32" | "i1") {
            return Err(Error::unsupported(
                epos,
                format!("array<{elem}: ...> attributes"),
            ));
        }
        let mut v = Vec::new();
        if self.eat(":") {
            loop {
                let pos = self.pos();
                match self.bump() {
                    Tok::Number(s) => v.push(parse_int(s, pos)?),
                    Tok::Ident("true") => v.push(1),
                    Tok::Ident("false") => v.push(0),
                    _ => return Err(Error::syntax(pos, "expected an array element")),
                }
                if !self.eat(",") {
                    break;
                }
            }
        }
        self.expect(">")?;
        Ok(AttrVal::Array(v))
    }

    /// `dense<...>`: a splat or nested lists of elements.
    pub fn dense(&mut self) -> Result<Dense> {
        let pos = self.pos();
        self.bump();
        self.expect("<")?;
        let mut elems = Vec::new();
        let shape = if self.is(">") {
            Some(vec![0])
        } else if self.is("[") {
            let mut shape: Vec<Option<usize>> = Vec::new();
            self.dense_list(0, &mut shape, &mut elems)?;
            Some(shape.into_iter().map(|s| s.unwrap_or(0)).collect())
        } else {
            elems.push(self.dense_elem()?);
            None
        };
        self.expect(">")?;
        Ok(Dense { pos, elems, shape })
    }

    /// One nesting level of a dense literal at depth `dim`; `shape[dim]` is the size every
    /// list at that depth must have (set by the first).
    fn dense_list(
        &mut self,
        dim: usize,
        shape: &mut Vec<Option<usize>>,
        out: &mut Vec<Elem>,
    ) -> Result<()> {
        let pos = self.pos();
        self.enter()?;
        self.expect("[")?;
        if shape.len() == dim {
            shape.push(None);
        }
        let mut n = 0usize;
        if !self.eat("]") {
            loop {
                if self.is("[") {
                    if shape.len() > dim + 1 && shape[dim + 1].is_none() && n > 0 {
                        return Err(Error::invalid(self.pos(), "ragged dense literal"));
                    }
                    self.dense_list(dim + 1, shape, out)?;
                } else {
                    if shape.len() > dim + 1 {
                        return Err(Error::invalid(
                            self.pos(),
                            "ragged dense literal: an element where a list was expected",
                        ));
                    }
                    out.push(self.dense_elem()?);
                }
                n += 1;
                if self.eat("]") {
                    break;
                }
                self.expect(",")?;
            }
        }
        match shape[dim] {
            None => shape[dim] = Some(n),
            Some(m) if m != n => {
                return Err(Error::invalid(
                    pos,
                    format!("ragged dense literal: a list of {n} elements where the first had {m}"),
                ));
            }
            _ => {}
        }
        self.leave();
        Ok(())
    }

    /// One part of a complex dense element `(re, im)`: a number, `inf` or `nan`.
    fn complex_part(&mut self) -> Result<Part> {
        let pos = self.pos();
        match self.dense_elem()? {
            Elem::Int(i) => Ok(Part::Int(i)),
            Elem::Float(f) => Ok(Part::Float(f)),
            Elem::Hex(h) => Ok(Part::Hex(h)),
            Elem::Bool(_) | Elem::Complex(..) => Err(Error::syntax(
                pos,
                "a part of a complex number must be a number",
            )),
        }
    }

    /// One dense element.
    fn dense_elem(&mut self) -> Result<Elem> {
        let pos = self.pos();
        match self.peek().clone() {
            Tok::Number(s) => {
                self.bump();
                parse_elem(s, pos)
            }
            Tok::Ident("true") => {
                self.bump();
                Ok(Elem::Bool(true))
            }
            Tok::Ident("false") => {
                self.bump();
                Ok(Elem::Bool(false))
            }
            Tok::Ident("inf") => {
                self.bump();
                Ok(Elem::Float(f64::INFINITY))
            }
            Tok::Ident("nan") => {
                self.bump();
                Ok(Elem::Float(f64::NAN))
            }
            Tok::Punct("(") => {
                self.bump();
                let re = self.complex_part()?;
                self.expect(",")?;
                let im = self.complex_part()?;
                self.expect(")")?;
                Ok(Elem::Complex(re, im))
            }
            Tok::Str(_) => Err(Error::unsupported(
                pos,
                "hex-string dense literals (`dense<\"0x...\">`)",
            )),
            _ => self.expected("a dense literal element"),
        }
    }

    /// `#stablehlo<kind VALUE>`, `#stablehlo.name<field = value, ...>`, `#stablehlo.conv<...>`.
    fn dialect_attr(&mut self, h: &str, pos: Pos) -> Result<AttrVal> {
        self.bump();
        if !self.is("<") {
            return Err(Error::unsupported(
                pos,
                format!("the attribute alias {}", quote(&format!("#{h}"))),
            ));
        }
        match h {
            "stablehlo" | "chlo" => {
                self.bump();
                let kind = self.ident("an enum kind")?.to_string();
                let value = self.ident("an enum value")?.to_string();
                self.expect(">")?;
                Ok(AttrVal::Enum(kind, value))
            }
            "stablehlo.conv" => {
                self.bump();
                let d = if self.eat_ident("raw") {
                    self.conv_raw()?
                } else {
                    self.conv_dims()?
                };
                self.expect(">")?;
                Ok(AttrVal::ConvDims(d))
            }
            _ if h.starts_with("stablehlo.") || h.starts_with("chlo.") => {
                self.enter()?;
                self.bump();
                let mut fields = Vec::new();
                if !self.eat(">") {
                    loop {
                        let name = self.ident("a field name")?.to_string();
                        let v = attr_value(self)?;
                        fields.push((name, v));
                        if self.eat(">") {
                            break;
                        }
                        self.expect(",")?;
                    }
                }
                self.leave();
                Ok(AttrVal::Struct(h.to_string(), fields))
            }
            _ => Err(Error::unsupported(
                pos,
                format!("the attribute {}", quote(&format!("#{h}<...>"))),
            )),
        }
    }

    /// `input_batch_dimension = 0, input_feature_dimension = 1, ...`.
    fn conv_raw(&mut self) -> Result<ConvDims> {
        let mut d = ConvDims::default();
        loop {
            let pos = self.pos();
            let name = self.ident("a dimension field")?;
            self.expect("=")?;
            let v = self.attr_bare()?;
            let int = |v: &AttrVal| match v {
                AttrVal::Int(i) => Ok(*i),
                _ => Err(Error::invalid(pos, format!("`{name}` must be an integer"))),
            };
            let list = |v: &AttrVal| match v {
                AttrVal::List(items) => items
                    .iter()
                    .map(|x| match x {
                        AttrVal::Int(i) => Ok(*i),
                        _ => Err(Error::invalid(
                            pos,
                            format!("`{name}` must be a list of integers"),
                        )),
                    })
                    .collect(),
                _ => Err(Error::invalid(
                    pos,
                    format!("`{name}` must be a list of integers"),
                )),
            };
            match name {
                "input_batch_dimension" => d.input_batch = int(&v)?,
                "input_feature_dimension" => d.input_feature = int(&v)?,
                "input_spatial_dimensions" => d.input_spatial = list(&v)?,
                "kernel_input_feature_dimension" => d.kernel_input_feature = int(&v)?,
                "kernel_output_feature_dimension" => d.kernel_output_feature = int(&v)?,
                "kernel_spatial_dimensions" => d.kernel_spatial = list(&v)?,
                "output_batch_dimension" => d.output_batch = int(&v)?,
                "output_feature_dimension" => d.output_feature = int(&v)?,
                "output_spatial_dimensions" => d.output_spatial = list(&v)?,
                _ => {
                    return Err(Error::syntax(
                        pos,
                        format!("unknown convolution dimension field {}", quote(name)),
                    ));
                }
            }
            if !self.eat(",") {
                return Ok(d);
            }
        }
    }

    /// `[b, 0, 1, f]x[0, 1, i, o]->[b, 0, 1, f]`.
    pub fn conv_dims(&mut self) -> Result<ConvDims> {
        let (ib, ifeat, isp) = self.conv_layout(&["b", "f"])?;
        let xpos = self.pos();
        if !self.eat_ident("x") {
            return Err(Error::syntax(
                xpos,
                "expected `x` between the input and kernel layouts",
            ));
        }
        let (ki, ko, ksp) = self.conv_layout(&["i", "o"])?;
        self.expect("->")?;
        let (ob, of, osp) = self.conv_layout(&["b", "f"])?;
        Ok(ConvDims {
            input_batch: ib,
            input_feature: ifeat,
            input_spatial: isp,
            kernel_input_feature: ki,
            kernel_output_feature: ko,
            kernel_spatial: ksp,
            output_batch: ob,
            output_feature: of,
            output_spatial: osp,
        })
    }

    /// One layout such as `[b, 0, 1, f]`: the positions of the two named dimensions and of
    /// the spatial dimensions 0, 1, ... in order.
    fn conv_layout(&mut self, names: &[&str; 2]) -> Result<(i64, i64, Vec<i64>)> {
        let pos = self.pos();
        self.expect("[")?;
        let mut found = [None, None];
        let mut spatial: Vec<(i64, i64)> = Vec::new();
        let mut i = 0i64;
        // The lexer reads `0x` in `[0, 1]x[...]`-style text as one token; layouts are lists.
        loop {
            let p = self.pos();
            match self.bump() {
                Tok::Ident(w) if w == names[0] && found[0].is_none() => found[0] = Some(i),
                Tok::Ident(w) if w == names[1] && found[1].is_none() => found[1] = Some(i),
                Tok::Number(s) => spatial.push((parse_int(s, p)?, i)),
                _ => {
                    return Err(Error::syntax(
                        p,
                        format!(
                            "expected `{}`, `{}` or a spatial dimension number",
                            names[0], names[1]
                        ),
                    ));
                }
            }
            i += 1;
            if self.eat("]") {
                break;
            }
            self.expect(",")?;
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
}
