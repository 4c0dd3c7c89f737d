//! Element types.

use std::fmt;

/// The element type of a tensor.
///
/// The text form is the lowercase name (`f32`, `pred`, ...), used by both the printer and the parser.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DType {
    /// Boolean, printed as `true`/`false`.
    Pred,
    /// Signed 8-bit integer.
    I8,
    /// Signed 16-bit integer.
    I16,
    /// Signed 32-bit integer.
    I32,
    /// Signed 64-bit integer.
    I64,
    /// Unsigned 8-bit integer.
    U8,
    /// Unsigned 16-bit integer.
    U16,
    /// Unsigned 32-bit integer.
    U32,
    /// Unsigned 64-bit integer.
    U64,
    /// IEEE binary16.
    F16,
    /// bfloat16: the top half of an f32.
    BF16,
    /// IEEE binary32.
    F32,
    /// IEEE binary64.
    F64,
}

/// A coarse class of element types, used by op type rules.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DTypeClass {
    /// `pred`.
    Pred,
    /// `i8`, `i16`, `i32`, `i64`.
    Signed,
    /// `u8`, `u16`, `u32`, `u64`.
    Unsigned,
    /// `f16`, `bf16`, `f32`, `f64`.
    Float,
}

impl DType {
    /// Every dtype, in declaration order.
    pub const ALL: [DType; 13] = [
        DType::Pred,
        DType::I8,
        DType::I16,
        DType::I32,
        DType::I64,
        DType::U8,
        DType::U16,
        DType::U32,
        DType::U64,
        DType::F16,
        DType::BF16,
        DType::F32,
        DType::F64,
    ];

    /// The text form of this dtype.
    pub fn name(self) -> &'static str {
        match self {
            DType::Pred => "pred",
            DType::I8 => "i8",
            DType::I32 => "i32",
            DType::I64 => "i64",
            DType::U32 => "u32",
            DType::U8 => "u8",
            DType::I16 => "i16",
            DType::U16 => "u16",
            DType::U64 => "u64",
            DType::F16 => "f16",
            DType::BF16 => "bf16",
            DType::F32 => "f32",
            DType::F64 => "f64",
        }
    }

    /// Parses the text form of a dtype.
    pub fn from_name(s: &str) -> Option<DType> {
        DType::ALL.into_iter().find(|d| d.name() == s)
    }

    /// The class of this dtype.
    pub fn class(self) -> DTypeClass {
        match self {
            DType::Pred => DTypeClass::Pred,
            DType::I8 | DType::I16 | DType::I32 | DType::I64 => DTypeClass::Signed,
            DType::U8 | DType::U16 | DType::U32 | DType::U64 => DTypeClass::Unsigned,
            DType::F16 | DType::BF16 | DType::F32 | DType::F64 => DTypeClass::Float,
        }
    }

    /// True for the floating-point dtypes.
    pub fn is_float(self) -> bool {
        self.class() == DTypeClass::Float
    }

    /// True for the signed and unsigned integer dtypes (not `pred`).
    pub fn is_int(self) -> bool {
        matches!(self.class(), DTypeClass::Signed | DTypeClass::Unsigned)
    }

    /// True for `pred`.
    pub fn is_pred(self) -> bool {
        self == DType::Pred
    }

    /// True for signed integers and floats: the types with a negation.
    pub fn is_signed(self) -> bool {
        matches!(self.class(), DTypeClass::Signed | DTypeClass::Float)
    }

    /// Storage width in bits (`pred` is stored in 8 bits).
    pub fn bits(self) -> u32 {
        match self {
            DType::Pred | DType::I8 | DType::U8 => 8,
            DType::I16 | DType::U16 | DType::F16 | DType::BF16 => 16,
            DType::I32 | DType::U32 | DType::F32 => 32,
            DType::I64 | DType::U64 | DType::F64 => 64,
        }
    }

    /// The smallest and largest values of an integer dtype (`pred`: 0 and 1); `None` for floats.
    pub fn int_bounds(self) -> Option<(i128, i128)> {
        Some(match self {
            DType::Pred => (0, 1),
            DType::I8 => (i8::MIN.into(), i8::MAX.into()),
            DType::I16 => (i16::MIN.into(), i16::MAX.into()),
            DType::I32 => (i32::MIN.into(), i32::MAX.into()),
            DType::I64 => (i64::MIN.into(), i64::MAX.into()),
            DType::U8 => (0, u8::MAX.into()),
            DType::U16 => (0, u16::MAX.into()),
            DType::U32 => (0, u32::MAX.into()),
            DType::U64 => (0, u64::MAX.into()),
            DType::F16 | DType::BF16 | DType::F32 | DType::F64 => return None,
        })
    }

    /// Storage width in bytes.
    pub fn bytes(self) -> usize {
        self.bits() as usize / 8
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}
