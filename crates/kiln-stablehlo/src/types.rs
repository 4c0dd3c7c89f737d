//! Types: `tensor<2x3xf32>`, `tensor<i1>`, and the element types kiln has.
//!
//! | StableHLO | kiln |
//! |---|---|
//! | `i1` | `pred` |
//! | `i2`, `i4`, `i8`, `i16`, `i32`, `i64` | the same |
//! | `ui2`, `ui4`, `ui8`, `ui16`, `ui32`, `ui64` | `u2`, `u4`, `u8`, `u16`, `u32`, `u64` |
//! | `f16`, `bf16`, `f32`, `f64` | the same |
//! | `f8E4M3FN`, `f8E5M2`, `f8E4M3`, `f8E3M4`, `f8E4M3FNUZ`, `f8E5M2FNUZ`, `f8E4M3B11FNUZ`, `f8E8M0FNU`, `f6E2M3FN`, `f6E3M2FN`, `f4E2M1FN` | the same in lowercase (`f8e4m3fn`, ...) |
//! | `complex<f32>`, `complex<f64>` | `c64`, `c128` |
//!
//! (`i2`, `i4`, `ui2`, `ui4` and the 6- and 4-bit floats are kept one element per byte in
//! kiln's buffers.) Every other element type (other widths such as `i3`, `tf32`,
//! `complex<f16>`), tuples inside a tensor
//! and dynamic (`?`) dimensions are located `unsupported` errors. A tuple type in a
//! function's or an op's signature is the list of its tensors (its shape, [`Shape`], kept
//! for the importer, which flattens tuple values), a token type (`!stablehlo.token`) there
//! the empty list; anywhere else either is `unsupported`. A quantized tensor
//! (`tensor<2x!quant.uniform<i8:f32, 0.1>>`) in an op's signature is its storage type, its
//! quantization kept for the op ([`crate::quant`]); in a function's signature or a block's
//! arguments it is its storage type; anywhere else it is `unsupported`.

use crate::ast::Shape;
use crate::error::{Error, Pos, Result, quote};
use crate::lexer::Tok;
use crate::parser::Cursor;
use crate::quant::Quant;
use kiln_ir::{DType, TensorType};

/// The kiln dtype of a StableHLO element type name; `Err` says why there is none.
pub fn dtype(name: &str, pos: Pos) -> Result<DType> {
    if let Some(d) = DType::ALL.into_iter().find(|&d| element_name(d) == name) {
        return Ok(d);
    }
    if is_known_element(name) {
        let names: Vec<&str> = DType::ALL.into_iter().map(element_name).collect();
        return Err(Error::unsupported(
            pos,
            format!(
                "element type {} (kiln has {})",
                quote(name),
                names.join(", ")
            ),
        ));
    }
    Err(Error::syntax(
        pos,
        format!("unknown element type {}", quote(name)),
    ))
}

/// The StableHLO element type name of a kiln dtype (the inverse of [`dtype`]).
pub fn element_name(d: DType) -> &'static str {
    match d {
        DType::Pred => "i1",
        DType::I2 => "i2",
        DType::I4 => "i4",
        DType::U2 => "ui2",
        DType::U4 => "ui4",
        DType::I8 => "i8",
        DType::I16 => "i16",
        DType::I32 => "i32",
        DType::I64 => "i64",
        DType::U8 => "ui8",
        DType::U16 => "ui16",
        DType::U32 => "ui32",
        DType::U64 => "ui64",
        DType::F16 => "f16",
        DType::BF16 => "bf16",
        DType::F32 => "f32",
        DType::F64 => "f64",
        DType::Mini(m) => m.stablehlo_name(),
        DType::C64 => "complex<f32>",
        DType::C128 => "complex<f64>",
    }
}

/// Element types MLIR has and kiln does not.
fn is_known_element(name: &str) -> bool {
    let int = |p: &str| {
        name.strip_prefix(p)
            .is_some_and(|w| !w.is_empty() && w.bytes().all(|b| b.is_ascii_digit()))
    };
    int("i")
        || int("ui")
        || int("si")
        || name.starts_with("f8E")
        || name.starts_with("f6E")
        || name.starts_with("f4E")
        || matches!(name, "tf32" | "index" | "complex" | "none")
}

impl Cursor<'_> {
    /// Parses a tensor type that is not quantized.
    pub fn tensor_type(&mut self) -> Result<TensorType> {
        let (t, q) = self.any_tensor_type()?;
        if let Some(q) = q {
            return Err(Error::unsupported(
                q.pos,
                "the quantized type `!quant.uniform` here (kiln reads quantized types in op signatures only)",
            ));
        }
        Ok(t)
    }

    /// Parses a type of an op's signature into `out`: a tensor type, quantized or not (a
    /// quantized one is its storage type here; its quantization is recorded for the op, see
    /// [`crate::quant`]), or a tuple, whose tensors are added in order (its shape is recorded
    /// for the op).
    pub fn sig_type(&mut self, out: &mut Vec<TensorType>) -> Result<()> {
        let shape = self.type_leaves(out, true)?;
        self.sig_shapes.push(shape);
        Ok(())
    }

    /// Parses a tensor type, a tuple type (`tuple<T, ...>`, nested) or `!stablehlo.token`
    /// (no tensor) and adds its tensors to `out`; with `quant_ok`, a quantized tensor's
    /// quantization is recorded for the op.
    pub fn type_leaves(&mut self, out: &mut Vec<TensorType>, quant_ok: bool) -> Result<Shape> {
        if let Tok::Bang("stablehlo.token" | "mhlo.token") = self.peek() {
            self.bump();
            return Ok(Shape::Token);
        }
        if !self.is_ident("tuple") {
            if quant_ok {
                let (t, q) = self.any_tensor_type()?;
                self.sig_quants.push(q);
                out.push(t);
            } else {
                out.push(self.tensor_type()?);
            }
            return Ok(Shape::Leaf);
        }
        let pos = self.pos();
        self.bump();
        self.expect("<")?;
        self.enter()?;
        let mut parts = Vec::new();
        if !self.eat(">") {
            loop {
                parts.push(self.type_leaves(out, quant_ok)?);
                if self.eat(">") {
                    break;
                }
                self.expect(",")?;
            }
        }
        self.leave();
        if parts.is_empty() {
            return Err(Error::unsupported(pos, "the empty tuple type `tuple<>`"));
        }
        Ok(Shape::Tuple(parts))
    }

    /// Parses a tensor type: the kiln type (a quantized tensor's storage) and the quantized
    /// element type, if it is one.
    pub fn any_tensor_type(&mut self) -> Result<(TensorType, Option<Quant>)> {
        let pos = self.pos();
        match *self.peek() {
            Tok::Ident("tensor") => {}
            Tok::Ident("tuple") => {
                return Err(Error::unsupported(
                    pos,
                    "a tuple type here (kiln flattens tuple types in function and op signatures)",
                ));
            }
            Tok::Ident(w @ "complex") => {
                return Err(Error::unsupported(
                    pos,
                    format!("{w} types outside a tensor"),
                ));
            }
            Tok::Bang(w) => {
                return Err(Error::unsupported(
                    pos,
                    format!("the type {}", quote(&format!("!{w}"))),
                ));
            }
            Tok::Ident(w) => {
                // A scalar written without `tensor<>` (kiln values are tensors).
                dtype(w, pos)?;
                return Err(Error::unsupported(
                    pos,
                    format!(
                        "the non-tensor type {} (StableHLO values are tensors)",
                        quote(w)
                    ),
                ));
            }
            _ => return self.expected("a type such as `tensor<2x3xf32>`"),
        }
        self.bump();
        self.expect("<")?;
        let mut shape = Vec::new();
        let epos = self.pos();
        let elem = match *self.peek() {
            Tok::Ident(w) => w,
            Tok::Number(s) => {
                // `2x3xf32`: leading `<digits>x` groups are dimensions, the rest the element
                // type (which may itself hold an `x`, as in `complex`).
                let mut rest = s;
                while let Some(i) = rest.find('x') {
                    let d = &rest[..i];
                    if d.is_empty() || !d.bytes().all(|b| b.is_ascii_digit()) {
                        break;
                    }
                    match d.parse::<usize>() {
                        Ok(n) if n as u64 <= kiln_ir::MAX_SIZE => shape.push(n),
                        _ => {
                            return Err(Error::invalid(
                                epos,
                                format!("bad dimension size {} in {}", quote(d), quote(s)),
                            ));
                        }
                    }
                    rest = &rest[i + 1..];
                }
                let elem = rest;
                if elem.bytes().next().is_some_and(|b| b.is_ascii_digit()) {
                    return Err(Error::invalid(epos, format!("bad shape {}", quote(s))));
                }
                if elem.is_empty() {
                    self.bump();
                    return match self.peek() {
                        Tok::Punct("?") => {
                            Err(Error::unsupported(self.pos(), "dynamic dimensions (`?`)"))
                        }
                        Tok::Ident("complex") => {
                            let d = self.complex_element()?;
                            Ok((self.finish_tensor_type(pos, d, shape)?, None))
                        }
                        Tok::Bang(w) if w.starts_with("quant.") => {
                            let q = self.quant_element()?;
                            self.finish_quant_type(pos, q, shape)
                        }
                        Tok::Ident(w @ "tuple") => Err(Error::unsupported(
                            self.pos(),
                            format!("element type {w}<...>"),
                        )),
                        Tok::Bang(w) => Err(Error::unsupported(
                            self.pos(),
                            format!("element type {}", quote(&format!("!{w}"))),
                        )),
                        _ => self.expected("an element type"),
                    };
                }
                elem
            }
            Tok::Punct("?") => return Err(Error::unsupported(epos, "dynamic dimensions (`?`)")),
            Tok::Punct("*") => return Err(Error::unsupported(epos, "unranked tensors")),
            Tok::Bang(w) if w.starts_with("quant.") => {
                let q = self.quant_element()?;
                return self.finish_quant_type(pos, q, shape);
            }
            Tok::Bang(w) => {
                return Err(Error::unsupported(
                    epos,
                    format!("element type {}", quote(&format!("!{w}"))),
                ));
            }
            _ => return self.expected("a shape and element type"),
        };
        if elem == "complex" {
            let d = self.complex_element()?;
            return Ok((self.finish_tensor_type(pos, d, shape)?, None));
        }
        if elem == "tuple" {
            return Err(Error::unsupported(
                epos,
                "element type tuple<...> (a tensor of tuples)",
            ));
        }
        let dt = dtype(elem, epos)?;
        self.bump();
        Ok((self.finish_tensor_type(pos, dt, shape)?, None))
    }

    /// The end of a quantized tensor type after its element type `q`: its storage type and
    /// `q`, checked against the shape.
    fn finish_quant_type(
        &mut self,
        pos: Pos,
        q: Quant,
        shape: Vec<usize>,
    ) -> Result<(TensorType, Option<Quant>)> {
        q.check_shape(&shape, q.pos)?;
        let t = self.finish_tensor_type(pos, q.storage, shape)?;
        Ok((t, Some(q)))
    }

    /// `complex<f32>` or `complex<f64>`, its `complex` the current token (alone, or the tail
    /// of a shape token such as `2xcomplex`): `c64` or `c128`.
    fn complex_element(&mut self) -> Result<DType> {
        self.bump();
        self.expect("<")?;
        let pos = self.pos();
        let part = match *self.peek() {
            Tok::Ident(w) => dtype(w, pos)?,
            _ => return self.expected("the part type of a complex type (`f32` or `f64`)"),
        };
        let Some(d) = part.complex_of() else {
            return Err(Error::unsupported(
                pos,
                format!(
                    "element type complex<{}> (kiln has complex<f32> and complex<f64>)",
                    element_name(part)
                ),
            ));
        };
        self.bump();
        self.expect(">")?;
        Ok(d)
    }

    /// The end of a tensor type after its element type `dt`: the closing `>`.
    fn finish_tensor_type(&mut self, pos: Pos, dt: DType, shape: Vec<usize>) -> Result<TensorType> {
        if self.is(",") {
            return Err(Error::unsupported(
                self.pos(),
                "tensor encodings (bounds, sparsity)",
            ));
        }
        self.expect(">")?;
        let ty = TensorType::new(dt, shape);
        ty.check_size().map_err(|e| Error::invalid(pos, e))?;
        Ok(ty)
    }
}
