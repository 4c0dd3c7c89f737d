"""Writes src/common/tables64.rs: the constants of kiln's f64 sine, cosine, tan, atan2 and
power for the GPU (src/common/circular64.rs, atan64.rs, pow64.rs), computed with Python's
integers and 80-digit decimals. Run from the crate's directory: python3 scripts/f64_tables.py
"""

from decimal import Decimal, getcontext
from fractions import Fraction

getcontext().prec = 80


def pi_fraction(bits):
    """pi to within 2^-bits, as a Fraction, by Machin's formula in integers."""
    one = 1 << (bits + 20)

    def arctan_inv(n):
        total, term, k, sign = 0, one // n, 1, 1
        while term:
            total += sign * (term // k)
            term //= n * n
            k += 2
            sign = -sign
        return total

    return Fraction(4 * (4 * arctan_inv(5) - arctan_inv(239)), one)


PI = pi_fraction(1400)


def dec(f):
    return Decimal(f.numerator) / Decimal(f.denominator)


def split(v):
    """v (a Decimal or Fraction) as hi + lo, two doubles."""
    v = dec(v) if isinstance(v, Fraction) else v
    hi = float(v)
    lo = float(v - Decimal(hi))
    return hi, lo


def atan(x):
    """atan of a Decimal in [0, 1] by halving the argument, then its series."""
    halvings = 0
    while x > Decimal("0.1"):
        x = x / (1 + (1 + x * x).sqrt())
        halvings += 1
    total, term, k, x2 = Decimal(0), x, 1, x * x
    while abs(term) > Decimal(10) ** -75:
        total += term / k
        term = -term * x2
        k += 2
    return total * (1 << halvings)


def f64(v):
    return repr(float(v))


out = []
w = out.append
w("// Constants of kiln's f64 sine, cosine, tan, atan2 and power (`circular64.rs`, `atan64.rs`,")
w("// `pow64.rs`), written by `scripts/f64_tables.py` (Python's integers and 80-digit decimals):")
w("// a pair `(hi, lo)` is a value as the sum of two doubles, hi rounded to nearest.")
w("")
w("// Digit for digit as written (some are the nearest doubles to π/2, π/4, √2).")
w("#![allow(clippy::approx_constant)]")
w("")

# 2/pi's bits after the binary point, after a word of zeros.
words = 21
scaled = (2 / PI) * (1 << (64 * (words - 1)))
bits = scaled.numerator // scaled.denominator
w("/// 2/π in 64-bit words, most significant first, after a word of zeros: bit j after the")
w("/// binary point is bit 63 + j of the whole, counted from the first word's top bit.")
w(f"pub(crate) const TWO_OVER_PI_WORDS: [u64; {words}] = [")
w("    0,")
for i in range(words - 1):
    word = (bits >> (64 * (words - 2 - i))) & ((1 << 64) - 1)
    w(f"    0x{word >> 48:04X}_{(word >> 32) & 0xFFFF:04X}_{(word >> 16) & 0xFFFF:04X}_{word & 0xFFFF:04X},")
w("];")
w("")


def pair(name, doc, v):
    hi, lo = split(v)
    w(f"/// {doc}")
    w(f"pub(crate) const {name}: (f64, f64) = ({hi!r}, {lo!r});")


pair("PI", "π.", PI)
pair("FRAC_PI_2", "π/2.", PI / 2)
ln2 = Decimal(2).ln()
# ln 2 with its high part's low 12 bits zero (so n ln2_hi is exact for |n| < 2^12).
hi = float(ln2)
hi = float.fromhex(hi.hex()[: 2 + 1 + 10] + "p" + hi.hex().split("p")[1])
w("/// ln 2 as hi + lo, hi with its last 12 bits zero (n hi is exact for |n| < 2^12).")
w(f"pub(crate) const LN2: (f64, f64) = ({hi!r}, {float(ln2 - Decimal(hi))!r});")
c = ln2 / 32
hi = float(c)
hi = float.fromhex(hi.hex()[: 2 + 1 + 8] + "p" + hi.hex().split("p")[1])
w("/// ln 2 / 32 as hi + lo, hi with its last 20 bits zero (n hi is exact for |n| < 2^20).")
w(f"pub(crate) const LN2_32: (f64, f64) = ({hi!r}, {float(c - Decimal(hi))!r});")
w("")

w("/// atan(j/16) for j = 0..=16, high parts.")
w("pub(crate) const ATAN_HI: [f64; 17] = [")
los = []
for j in range(17):
    v = atan(Decimal(j) / 16) if j < 16 else dec(PI / 4)
    hi, lo = split(v)
    w(f"    {hi!r},")
    los.append(lo)
w("];")
w("/// atan(j/16) for j = 0..=16, low parts.")
w("pub(crate) const ATAN_LO: [f64; 17] = [")
for lo in los:
    w(f"    {lo!r},")
w("];")
w("")

w("/// 2^(j/32) for j = 0..32, high parts.")
w("pub(crate) const EXP2_HI: [f64; 32] = [")
los = []
for j in range(32):
    hi, lo = split((Decimal(j) / 32 * ln2).exp())
    w(f"    {hi!r},")
    los.append(lo)
w("];")
w("/// 2^(j/32) for j = 0..32, low parts.")
w("pub(crate) const EXP2_LO: [f64; 32] = [")
for lo in los:
    w(f"    {lo!r},")
w("];")
w("")

# log: m in [1, 2) in 256 buckets by its top 8 mantissa bits; inv_i = k_i / 256 near 1 / m.
ks = []
for i in range(256):
    n, d = 2 * 131072, 513 + 2 * i
    ks.append((n + d) // (2 * d))
fold = next(i for i in range(256) if ks[i] * ks[i] * 2 <= 256 * 256)
w("/// log's buckets: m in [1, 2) by its top 8 mantissa bits i, and k_i / 256 near 1 / m (the")
w("/// bucket's middle, rounded to 8 bits, so m k_i / 256 - 1 is exact).")
w("pub(crate) const LOG_INV: [u16; 256] = [")
for i in range(0, 256, 16):
    w("    " + " ".join(f"{k}," for k in ks[i : i + 16]))
w("];")
w("/// From this bucket on, k_i / 256 is below 1/√2: log m = ln 2 + LOG_C[i], not LOG_C[i].")
w(f"pub(crate) const LOG_FOLD: u64 = {fold};")
w("/// -ln(k_i / 256) (from [`LOG_FOLD`] on, -ln(2 k_i / 256)), high parts.")
w("pub(crate) const LOG_C_HI: [f64; 256] = [")
los = []
for i in range(256):
    inv = Decimal(ks[i]) / 256
    if i >= fold:
        inv *= 2
    hi, lo = split(-inv.ln())
    w(f"    {hi!r},")
    los.append(lo)
w("];")
w("/// The low parts of [`LOG_C_HI`].")
w("pub(crate) const LOG_C_LO: [f64; 256] = [")
for lo in los:
    w(f"    {lo!r},")
w("];")

open("src/common/tables64.rs", "w").write("\n".join(out) + "\n")
