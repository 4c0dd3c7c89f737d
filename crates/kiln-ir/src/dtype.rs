//! Element types.

use crate::minifloat::MiniFloat;
use std::fmt;

/// The element type of a tensor.
///
/// The text form is the lowercase name (`f32`, `pred`, ...), used by both the printer and the parser.
///
/// The sub-byte integers `i4`, `u4`, `i2` and `u2` are stored one element per byte, their value
/// sign-extended (`i4`, `i2`) or zero-extended (`u4`, `u2`) in it: buffers, literals and files
/// hold only values in the type's range, and every operation wraps its result back into it.
///
/// The small floats ([`DType::Mini`]: `f8e4m3fn`, `f8e5m2`, `f8e4m3`, `f8e3m4`, `f8e4m3fnuz`,
/// `f8e5m2fnuz`, `f8e4m3b11fnuz`, `f8e8m0fnu`, `f6e2m3fn`, `f6e3m2fn`, `f4e2m1fn`: StableHLO's
/// `f8E4M3FN` ... `f4E2M1FN` in lowercase) are stored as their bit pattern, one per byte (the
/// 6- and 4-bit ones in the low bits); arithmetic on them computes in f32 or wider (the
/// reference in f64, the compiled backends in f32, `f8e8m0fnu` in f64) and rounds the result
/// once to the type, by the rules of [`crate::minifloat`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DType {
    /// Boolean, printed as `true`/`false`.
    Pred,
    /// Signed 2-bit integer (-2..=1), one per byte, sign-extended.
    I2,
    /// Signed 4-bit integer (-8..=7), one per byte, sign-extended.
    I4,
    /// Signed 8-bit integer.
    I8,
    /// Signed 16-bit integer.
    I16,
    /// Signed 32-bit integer.
    I32,
    /// Signed 64-bit integer.
    I64,
    /// Unsigned 2-bit integer (0..=3), one per byte, zero-extended.
    U2,
    /// Unsigned 4-bit integer (0..=15), one per byte, zero-extended.
    U4,
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
    /// A small float format, stored as its bit pattern in a byte (see [`MiniFloat`]).
    Mini(MiniFloat),
    /// A complex number of two f32 parts (StableHLO's `complex<f32>`), stored as the real part
    /// then the imaginary part (8 bytes, as NumPy's `complex64`).
    C64,
    /// A complex number of two f64 parts (StableHLO's `complex<f64>`), stored as the real part
    /// then the imaginary part (16 bytes, as NumPy's `complex128`).
    C128,
}

/// A coarse class of element types, used by op type rules.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DTypeClass {
    /// `pred`.
    Pred,
    /// `i2`, `i4`, `i8`, `i16`, `i32`, `i64`.
    Signed,
    /// `u2`, `u4`, `u8`, `u16`, `u32`, `u64`.
    Unsigned,
    /// `f16`, `bf16`, `f32`, `f64` and the small floats.
    Float,
    /// `c64`, `c128`.
    Complex,
}

impl DType {
    /// `f8e4m3fn` (StableHLO's `f8E4M3FN`).
    pub const F8E4M3FN: DType = DType::Mini(MiniFloat::F8E4M3FN);
    /// `f8e5m2` (StableHLO's `f8E5M2`).
    pub const F8E5M2: DType = DType::Mini(MiniFloat::F8E5M2);
    /// `f8e4m3` (StableHLO's `f8E4M3`).
    pub const F8E4M3: DType = DType::Mini(MiniFloat::F8E4M3);
    /// `f8e3m4` (StableHLO's `f8E3M4`).
    pub const F8E3M4: DType = DType::Mini(MiniFloat::F8E3M4);
    /// `f8e4m3fnuz` (StableHLO's `f8E4M3FNUZ`).
    pub const F8E4M3FNUZ: DType = DType::Mini(MiniFloat::F8E4M3FNUZ);
    /// `f8e5m2fnuz` (StableHLO's `f8E5M2FNUZ`).
    pub const F8E5M2FNUZ: DType = DType::Mini(MiniFloat::F8E5M2FNUZ);
    /// `f8e4m3b11fnuz` (StableHLO's `f8E4M3B11FNUZ`).
    pub const F8E4M3B11FNUZ: DType = DType::Mini(MiniFloat::F8E4M3B11FNUZ);
    /// `f8e8m0fnu` (StableHLO's `f8E8M0FNU`).
    pub const F8E8M0FNU: DType = DType::Mini(MiniFloat::F8E8M0FNU);
    /// `f6e2m3fn` (StableHLO's `f6E2M3FN`).
    pub const F6E2M3FN: DType = DType::Mini(MiniFloat::F6E2M3FN);
    /// `f6e3m2fn` (StableHLO's `f6E3M2FN`).
    pub const F6E3M2FN: DType = DType::Mini(MiniFloat::F6E3M2FN);
    /// `f4e2m1fn` (StableHLO's `f4E2M1FN`).
    pub const F4E2M1FN: DType = DType::Mini(MiniFloat::F4E2M1FN);

    /// Every dtype, in declaration order.
    pub const ALL: [DType; 30] = [
        DType::Pred,
        DType::I2,
        DType::I4,
        DType::I8,
        DType::I16,
        DType::I32,
        DType::I64,
        DType::U2,
        DType::U4,
        DType::U8,
        DType::U16,
        DType::U32,
        DType::U64,
        DType::F16,
        DType::BF16,
        DType::F32,
        DType::F64,
        DType::F8E4M3FN,
        DType::F8E5M2,
        DType::F8E4M3,
        DType::F8E3M4,
        DType::F8E4M3FNUZ,
        DType::F8E5M2FNUZ,
        DType::F8E4M3B11FNUZ,
        DType::F8E8M0FNU,
        DType::F6E2M3FN,
        DType::F6E3M2FN,
        DType::F4E2M1FN,
        DType::C64,
        DType::C128,
    ];

    /// The text form of this dtype.
    pub fn name(self) -> &'static str {
        match self {
            DType::Pred => "pred",
            DType::I2 => "i2",
            DType::I4 => "i4",
            DType::U2 => "u2",
            DType::U4 => "u4",
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
            DType::Mini(m) => m.name(),
            DType::C64 => "c64",
            DType::C128 => "c128",
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
            DType::I2 | DType::I4 | DType::I8 | DType::I16 | DType::I32 | DType::I64 => {
                DTypeClass::Signed
            }
            DType::U2 | DType::U4 | DType::U8 | DType::U16 | DType::U32 | DType::U64 => {
                DTypeClass::Unsigned
            }
            DType::F16 | DType::BF16 | DType::F32 | DType::F64 | DType::Mini(_) => {
                DTypeClass::Float
            }
            DType::C64 | DType::C128 => DTypeClass::Complex,
        }
    }

    /// True for the complex dtypes (`c64`, `c128`).
    pub fn is_complex(self) -> bool {
        self.class() == DTypeClass::Complex
    }

    /// The dtype of a complex dtype's real and imaginary parts (`f32` for `c64`, `f64` for
    /// `c128`); any other dtype itself.
    pub fn part(self) -> DType {
        match self {
            DType::C64 => DType::F32,
            DType::C128 => DType::F64,
            d => d,
        }
    }

    /// The complex dtype whose parts are `self` (`c64` for `f32`, `c128` for `f64`); `None`
    /// for the other dtypes.
    pub fn complex_of(self) -> Option<DType> {
        match self {
            DType::F32 => Some(DType::C64),
            DType::F64 => Some(DType::C128),
            _ => None,
        }
    }

    /// True for the (real) floating-point dtypes; the complex ones are not.
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

    /// The small float format of a [`DType::Mini`]; `None` for the other dtypes.
    pub fn mini(self) -> Option<MiniFloat> {
        match self {
            DType::Mini(m) => Some(m),
            _ => None,
        }
    }

    /// Width in bits: of the value for the sub-byte integers and floats (`i4` and `f4e2m1fn`
    /// are 4, though stored in a byte), of the storage for the others (`pred` is stored in 8
    /// bits).
    pub fn bits(self) -> u32 {
        match self {
            DType::Mini(m) => m.bits(),
            DType::I2 | DType::U2 => 2,
            DType::I4 | DType::U4 => 4,
            DType::Pred | DType::I8 | DType::U8 => 8,
            DType::I16 | DType::U16 | DType::F16 | DType::BF16 => 16,
            DType::I32 | DType::U32 | DType::F32 => 32,
            DType::I64 | DType::U64 | DType::F64 | DType::C64 => 64,
            DType::C128 => 128,
        }
    }

    /// The smallest and largest values of an integer dtype (`pred`: 0 and 1); `None` for floats.
    pub fn int_bounds(self) -> Option<(i128, i128)> {
        Some(match self {
            DType::Pred => (0, 1),
            DType::I2 => (-2, 1),
            DType::I4 => (-8, 7),
            DType::U2 => (0, 3),
            DType::U4 => (0, 15),
            DType::I8 => (i8::MIN.into(), i8::MAX.into()),
            DType::I16 => (i16::MIN.into(), i16::MAX.into()),
            DType::I32 => (i32::MIN.into(), i32::MAX.into()),
            DType::I64 => (i64::MIN.into(), i64::MAX.into()),
            DType::U8 => (0, u8::MAX.into()),
            DType::U16 => (0, u16::MAX.into()),
            DType::U32 => (0, u32::MAX.into()),
            DType::U64 => (0, u64::MAX.into()),
            DType::F16
            | DType::BF16
            | DType::F32
            | DType::F64
            | DType::Mini(_)
            | DType::C64
            | DType::C128 => {
                return None;
            }
        })
    }

    /// Storage width in bytes (one for the sub-byte integers, which take a byte each).
    pub fn bytes(self) -> usize {
        self.bits().div_ceil(8) as usize
    }

    /// The dtype of this one's storage: `i8` for `i4` and `i2`, `u8` for `u4` and `u2` and the
    /// small floats (their bit patterns), the dtype itself for the others.
    pub fn storage(self) -> DType {
        match self {
            DType::I4 | DType::I2 => DType::I8,
            DType::U4 | DType::U2 | DType::Mini(_) => DType::U8,
            d => d,
        }
    }

    /// True for the integers narrower than a byte (`i2`, `i4`, `u2`, `u4`), stored one per byte.
    pub fn is_sub_byte(self) -> bool {
        self.bits() < 8 && self.is_int()
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}
