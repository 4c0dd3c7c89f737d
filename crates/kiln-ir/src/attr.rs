//! Attributes: the generic text tree and the typed values ops hold.

use crate::error::{excerpt, quote};
use crate::{Func, Literal, TensorType, literal::Elem};
use std::fmt;

/// The generic text form of an attribute value: a token (number, identifier) or a list.
#[derive(Clone, Debug, PartialEq)]
pub enum Attr {
    /// A number, `true`/`false`, or an identifier such as `EQ` or `add`.
    Token(String),
    /// `[a, b, ...]`.
    List(Vec<Attr>),
    /// A region: a function written in place, `func @body(%0: f32[]) -> f32[] { ... }`.
    Region(Box<Func>),
}

impl fmt::Display for Attr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Attr::Token(t) => f.write_str(t),
            Attr::List(items) => {
                f.write_str("[")?;
                for (i, a) in items.iter().enumerate() {
                    if i > 0 {
                        f.write_str(", ")?;
                    }
                    write!(f, "{a}")?;
                }
                f.write_str("]")
            }
            Attr::Region(func) => f.write_str(crate::print::print_one(func).trim_end()),
        }
    }
}

/// What an attribute parser may need besides the text: the instruction's result types.
pub struct AttrCtx<'a> {
    /// The declared result types of the instruction being parsed.
    pub result_types: &'a [TensorType],
}

/// A typed attribute value with a text form.
pub trait AttrValue: Sized {
    /// The generic text tree of this value.
    fn to_attr(&self) -> Attr;
    /// Parses the generic text tree; the error says what was expected.
    fn from_attr(a: &Attr, ctx: &AttrCtx) -> Result<Self, String>;
}

impl AttrValue for i64 {
    fn to_attr(&self) -> Attr {
        Attr::Token(self.to_string())
    }
    fn from_attr(a: &Attr, _: &AttrCtx) -> Result<Self, String> {
        match a {
            Attr::Token(t) => t
                .parse()
                .map_err(|_| format!("expected an integer, found {}", quote(t))),
            _ => Err(format!("expected an integer, found {}", quote(a))),
        }
    }
}

impl AttrValue for bool {
    fn to_attr(&self) -> Attr {
        Attr::Token(self.to_string())
    }
    fn from_attr(a: &Attr, _: &AttrCtx) -> Result<Self, String> {
        match a {
            Attr::Token(t) if t == "true" => Ok(true),
            Attr::Token(t) if t == "false" => Ok(false),
            _ => Err(format!("expected `true` or `false`, found {}", quote(a))),
        }
    }
}

impl AttrValue for Vec<i64> {
    fn to_attr(&self) -> Attr {
        Attr::List(self.iter().map(|x| x.to_attr()).collect())
    }
    fn from_attr(a: &Attr, ctx: &AttrCtx) -> Result<Self, String> {
        match a {
            Attr::List(items) => items.iter().map(|x| i64::from_attr(x, ctx)).collect(),
            _ => Err(format!("expected a list of integers, found {}", quote(a))),
        }
    }
}

impl AttrValue for Vec<(i64, i64)> {
    fn to_attr(&self) -> Attr {
        Attr::List(
            self.iter()
                .map(|&(a, b)| Attr::List(vec![a.to_attr(), b.to_attr()]))
                .collect(),
        )
    }
    fn from_attr(a: &Attr, ctx: &AttrCtx) -> Result<Self, String> {
        let err = || format!("expected a list of [low, high] pairs, found {}", quote(a));
        match a {
            Attr::List(items) => items
                .iter()
                .map(|p| match p {
                    Attr::List(v) if v.len() == 2 => {
                        Ok((i64::from_attr(&v[0], ctx)?, i64::from_attr(&v[1], ctx)?))
                    }
                    _ => Err(err()),
                })
                .collect(),
            _ => Err(err()),
        }
    }
}

impl AttrValue for Vec<Vec<i64>> {
    fn to_attr(&self) -> Attr {
        Attr::List(self.iter().map(|g| g.to_attr()).collect())
    }
    fn from_attr(a: &Attr, ctx: &AttrCtx) -> Result<Self, String> {
        match a {
            Attr::List(items) => items
                .iter()
                .map(|g| match g {
                    Attr::List(_) => Vec::<i64>::from_attr(g, ctx),
                    _ => Err(format!(
                        "expected a list of integer lists, found {}",
                        quote(a)
                    )),
                })
                .collect(),
            _ => Err(format!(
                "expected a list of integer lists, found {}",
                quote(a)
            )),
        }
    }
}

/// Declares a fieldless enum whose text form is a fixed identifier per variant.
macro_rules! text_enum {
    ($(#[$m:meta])* $name:ident { $($(#[$vm:meta])* $v:ident = $s:literal),* $(,)? }) => {
        $(#[$m])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub enum $name { $($(#[$vm])* $v),* }

        impl $name {
            /// Every variant, in declaration order.
            pub const ALL: &'static [$name] = &[$($name::$v),*];
            /// The text form.
            pub fn name(self) -> &'static str {
                match self { $($name::$v => $s),* }
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.name())
            }
        }

        impl AttrValue for $name {
            fn to_attr(&self) -> Attr {
                Attr::Token(self.name().to_string())
            }
            fn from_attr(a: &Attr, _: &AttrCtx) -> Result<Self, String> {
                let names: Vec<&str> = $name::ALL.iter().map(|v| v.name()).collect();
                match a {
                    Attr::Token(t) => $name::ALL.iter().copied().find(|v| v.name() == t)
                        .ok_or_else(|| format!("expected one of {}, found {}", names.join(", "), quote(t))),
                    _ => Err(format!("expected one of {}, found {}", names.join(", "), quote(a))),
                }
            }
        }
    };
}

text_enum! {
    /// The comparison of `compare` and the selection of `select_and_scatter`.
    ComparisonDirection {
        /// Equal.
        Eq = "EQ",
        /// Not equal.
        Ne = "NE",
        /// Less than.
        Lt = "LT",
        /// Less than or equal.
        Le = "LE",
        /// Greater than.
        Gt = "GT",
        /// Greater than or equal.
        Ge = "GE",
    }
}

text_enum! {
    /// How `reduce`, `reduce_window`, `scatter` and `select_and_scatter` combine two values.
    ///
    /// A named combiner stands for the reduction body a StableHLO function would hold;
    /// `replace` (take the new value) is only meaningful for `scatter`.
    Combiner {
        /// The update replaces the old value.
        Replace = "replace",
        /// Sum (`or` on `pred`).
        Add = "add",
        /// Product (`and` on `pred`).
        Mul = "mul",
        /// Maximum (NaN-propagating).
        Max = "max",
        /// Minimum (NaN-propagating).
        Min = "min",
        /// Bitwise or logical and.
        And = "and",
        /// Bitwise or logical or.
        Or = "or",
    }
}

text_enum! {
    /// How `triangular_solve` uses its matrix `a`: as it is, transposed, or transposed and
    /// conjugated (the same as transposed for real element types).
    TransposeA {
        /// `op(a) = a`.
        NoTranspose = "NO_TRANSPOSE",
        /// `op(a) = aᵀ`.
        Transpose = "TRANSPOSE",
        /// `op(a) = aᴴ`, which is `aᵀ` for real elements.
        Adjoint = "ADJOINT",
    }
}

text_enum! {
    /// The transform of `fft`.
    FftType {
        /// Forward complex-to-complex transform.
        Fft = "FFT",
        /// Inverse complex-to-complex transform (scaled by `1/n`).
        Ifft = "IFFT",
        /// Forward real-to-complex transform (the last dimension keeps `n/2 + 1` elements).
        Rfft = "RFFT",
        /// Inverse complex-to-real transform of a half spectrum (scaled by `1/n`).
        Irfft = "IRFFT",
    }
}

text_enum! {
    /// The bit generator of `rng_bit_generator`.
    RngAlgorithm {
        /// Threefry-2x32 with 20 rounds.
        ThreeFry = "THREE_FRY",
    }
}

impl AttrValue for Literal {
    fn to_attr(&self) -> Attr {
        fn rec(l: &Literal, dim: usize, offset: usize, strides: &[usize]) -> Attr {
            if dim == l.shape().len() {
                return Attr::Token(l.format_elem(offset));
            }
            Attr::List(
                (0..l.shape()[dim])
                    .map(|i| rec(l, dim + 1, offset + i * strides[dim], strides))
                    .collect(),
            )
        }
        rec(self, 0, 0, &self.ty().strides())
    }

    fn from_attr(a: &Attr, ctx: &AttrCtx) -> Result<Self, String> {
        let dtype = ctx
            .result_types
            .first()
            .ok_or("a constant needs a result type")?
            .dtype;
        // The nesting gives the shape: the first element at each level sets the size.
        let mut shape = Vec::new();
        let mut cur = a;
        while let Attr::List(items) = cur {
            shape.push(items.len());
            match items.first() {
                Some(first) => cur = first,
                None => break,
            }
        }
        // An empty list hides the sizes of the dimensions inside it (`[]` is `i32[0]` as much
        // as `i32[0,3]`, `[[], []]` any `[2,0,...]`): the declared type's, where it fits.
        if let Some(t) = ctx.result_types.first()
            && shape.last() == Some(&0)
            && t.shape.len() > shape.len()
            && t.shape.starts_with(&shape)
        {
            shape = t.shape.clone();
        }
        let mut elems = Vec::new();
        fn walk(
            a: &Attr,
            dim: usize,
            shape: &[usize],
            dtype: crate::DType,
            out: &mut Vec<Elem>,
        ) -> Result<(), String> {
            match a {
                Attr::Token(t) if dim == shape.len() => {
                    out.push(Literal::parse_elem(dtype, t).map_err(|e| e.0)?);
                    Ok(())
                }
                Attr::List(items) if dim < shape.len() && items.len() == shape[dim] => items
                    .iter()
                    .try_for_each(|x| walk(x, dim + 1, shape, dtype, out)),
                _ => Err(format!(
                    "ragged constant: {} does not fit the shape {} of the first elements",
                    quote(a),
                    excerpt(format_args!("{shape:?}"))
                )),
            }
        }
        walk(a, 0, &shape, dtype, &mut elems)?;
        Literal::from_elems(TensorType::new(dtype, shape), &elems).map_err(|e| e.0)
    }
}

impl AttrValue for Box<Func> {
    fn to_attr(&self) -> Attr {
        Attr::Region(self.clone())
    }
    fn from_attr(a: &Attr, _: &AttrCtx) -> Result<Self, String> {
        match a {
            Attr::Region(f) => Ok(f.clone()),
            _ => Err(format!(
                "expected a region such as `func @body(%0: f32[]) -> f32[] {{ ... }}`, found {}",
                quote(a)
            )),
        }
    }
}

impl AttrValue for Vec<Func> {
    fn to_attr(&self) -> Attr {
        Attr::List(
            self.iter()
                .map(|f| Attr::Region(Box::new(f.clone())))
                .collect(),
        )
    }
    fn from_attr(a: &Attr, ctx: &AttrCtx) -> Result<Self, String> {
        match a {
            Attr::List(items) => items
                .iter()
                .map(|x| Box::<Func>::from_attr(x, ctx).map(|f| *f))
                .collect(),
            _ => Err(format!("expected a list of regions, found {}", quote(a))),
        }
    }
}
