//! The syntax tree of StableHLO text: MLIR's generic operation structure (name, operands,
//! results, attributes, regions, types), whichever syntax (pretty or generic) an op was
//! written in. The mapping onto kiln IR reads this tree; a printer can write it back.

use crate::error::Pos;
use kiln_ir::TensorType;

/// One module: its functions, in text order.
#[derive(Clone, Debug, PartialEq)]
pub struct ModuleAst {
    /// Where the module starts.
    pub pos: Pos,
    /// The functions.
    pub funcs: Vec<FuncAst>,
}

/// A `func.func`.
#[derive(Clone, Debug, PartialEq)]
pub struct FuncAst {
    /// The symbol name (without `@`).
    pub name: String,
    /// Where the `func.func` is.
    pub pos: Pos,
    /// Whether it is declared `private`.
    pub private: bool,
    /// The result types (a tuple's leaves in order, see [`Shape`]).
    pub results: Vec<TensorType>,
    /// The body; its arguments are the function's parameters, a tuple parameter one argument
    /// per leaf, all with the parameter's name (a token parameter none).
    pub body: Block,
    /// Each parameter's name and shape; empty when none is a tuple or a token.
    pub arg_shapes: Vec<(Name, Shape)>,
}

/// The tuple structure of a type whose tensors are listed flat: a tensor, or a tuple of
/// shapes (`tuple<tensor<2xf64>, tuple<tensor<i64>>>` is `Tuple([Leaf, Tuple([Leaf])])`).
#[derive(Clone, Debug, PartialEq)]
pub enum Shape {
    /// One tensor.
    Leaf,
    /// A tuple of its elements' shapes.
    Tuple(Vec<Shape>),
    /// A token (`!stablehlo.token`): no tensor.
    Token,
}

impl Shape {
    /// How many tensors the shape holds.
    pub fn leaves(&self) -> usize {
        match self {
            Shape::Leaf => 1,
            Shape::Tuple(parts) => parts.iter().map(Shape::leaves).sum(),
            Shape::Token => 0,
        }
    }
}

/// A value name and where it is written.
#[derive(Clone, Debug, PartialEq)]
pub struct Name {
    /// The name without `%`; results of a multi-result op are `name#i`.
    pub name: String,
    /// Where it is written.
    pub pos: Pos,
}

/// A block: arguments and operations (regions here have exactly one block).
#[derive(Clone, Debug, PartialEq, Default)]
pub struct Block {
    /// The block arguments and their types (a tuple argument one per leaf, all with the
    /// argument's name; a token argument none).
    pub args: Vec<(Name, TensorType)>,
    /// Each argument's name and shape; empty when none is a tuple or a token.
    pub arg_shapes: Vec<(Name, Shape)>,
    /// The operations, the last one the terminator.
    pub ops: Vec<OpAst>,
}

/// An operation.
#[derive(Clone, Debug, PartialEq)]
pub struct OpAst {
    /// The full name, such as `stablehlo.add` or `func.return`.
    pub name: String,
    /// Where the op's name is.
    pub pos: Pos,
    /// The values it defines.
    pub results: Vec<Name>,
    /// The values it uses.
    pub operands: Vec<Name>,
    /// The attributes, by name (pretty forms are normalized to the generic names where the
    /// mapping needs them).
    pub attrs: Vec<(String, AttrVal, Pos)>,
    /// The regions.
    pub regions: Vec<Block>,
    /// The type signature (a quantized type is its storage type there).
    pub sig: Sig,
    /// The quantized element type of each of the signature's types in order (a function
    /// type's operands, then its results), `None` where a type is not quantized; empty when
    /// none is.
    pub quant: Vec<Option<crate::quant::Quant>>,
    /// The shape of each of the signature's types as written (a tuple's leaves are listed
    /// flat in `sig`); empty when none is a tuple.
    pub tuples: Vec<Shape>,
    /// How many of `tuples` are a function type's operand types (the rest are its results).
    pub tuple_inputs: usize,
}

impl OpAst {
    /// The attribute named `name`, with its position.
    pub fn attr(&self, name: &str) -> Option<(&AttrVal, Pos)> {
        self.attrs
            .iter()
            .find(|(n, _, _)| n == name)
            .map(|(_, a, p)| (a, *p))
    }
}

/// The type signature after an op's `:`.
#[derive(Clone, Debug, PartialEq, Default)]
pub enum Sig {
    /// None was written.
    #[default]
    None,
    /// `(operand types) -> result types`.
    Func(Vec<TensorType>, Vec<TensorType>),
    /// A list of types (pretty forms: one type for all, or one per operand or result).
    List(Vec<TensorType>),
}

/// An attribute value.
#[derive(Clone, Debug, PartialEq)]
pub enum AttrVal {
    /// An integer (its type suffix dropped).
    Int(i64),
    /// A float.
    Float(f64),
    /// `true` or `false`.
    Bool(bool),
    /// A string.
    Str(String),
    /// A keyword such as `EQ`, `SIGNED`, `DEFAULT` or `stablehlo.add`.
    Ident(String),
    /// `@name`.
    Symbol(String),
    /// `array<i64: ...>` (booleans as 0 and 1).
    Array(Vec<i64>),
    /// `dense<...>`, with the type written after it when there is one.
    Dense(Dense, Option<TensorType>),
    /// `[a, b, ...]`.
    List(Vec<AttrVal>),
    /// `[a, ...] x [b, ...]`: the lhs and rhs lists of `dot_general`'s pretty form.
    Pair(Box<AttrVal>, Box<AttrVal>),
    /// `[b, 0, 1, f]x[0, 1, i, o]->[b, 0, 1, f]`: convolution dimension numbers.
    ConvDims(ConvDims),
    /// `#dialect.name<key = value, ...>` or `{key = value, ...}`: named fields.
    Struct(String, Vec<(String, AttrVal)>),
    /// `#dialect<kind VALUE>`: an enum such as `#stablehlo<comparison_direction EQ>`.
    Enum(String, String),
    /// A type written as an attribute.
    Type(TensorType),
    /// `[0:2, 1:4:2]`: the pretty form of slice bounds (start, limit, stride).
    Ranges(Vec<(i64, i64, i64)>),
    /// An attribute given only by its name.
    Unit,
}

/// A dense literal before its type is known: nested lists of elements, or a splat.
#[derive(Clone, Debug, PartialEq)]
pub struct Dense {
    /// Where the `dense` keyword is.
    pub pos: Pos,
    /// The elements, row-major.
    pub elems: Vec<Elem>,
    /// The nesting: `None` for a single element (a splat or a scalar), else the sizes at each
    /// level, outermost first.
    pub shape: Option<Vec<usize>>,
}

/// One element of a dense literal, as written.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Elem {
    /// A decimal integer.
    Int(i128),
    /// A decimal float.
    Float(f64),
    /// `true` / `false`.
    Bool(bool),
    /// A hexadecimal bit pattern.
    Hex(u64),
    /// A complex number `(re, im)`, each part written as a real element.
    Complex(Part, Part),
}

/// One part of a complex element, as written.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Part {
    /// A decimal integer.
    Int(i128),
    /// A decimal float (or `inf`, `nan`).
    Float(f64),
    /// A hexadecimal bit pattern of the part type.
    Hex(u64),
}

impl From<Part> for Elem {
    fn from(p: Part) -> Elem {
        match p {
            Part::Int(i) => Elem::Int(i),
            Part::Float(f) => Elem::Float(f),
            Part::Hex(h) => Elem::Hex(h),
        }
    }
}

/// A convolution's dimension numbers, from the pretty or the `#stablehlo.conv<raw ...>` form.
#[derive(Clone, Debug, PartialEq, Default)]
pub struct ConvDims {
    /// Input batch dimension.
    pub input_batch: i64,
    /// Input feature dimension.
    pub input_feature: i64,
    /// Input spatial dimensions, in order.
    pub input_spatial: Vec<i64>,
    /// Kernel input feature dimension.
    pub kernel_input_feature: i64,
    /// Kernel output feature dimension.
    pub kernel_output_feature: i64,
    /// Kernel spatial dimensions, in order.
    pub kernel_spatial: Vec<i64>,
    /// Output batch dimension.
    pub output_batch: i64,
    /// Output feature dimension.
    pub output_feature: i64,
    /// Output spatial dimensions, in order.
    pub output_spatial: Vec<i64>,
}
