//! The XLA check: every spec example, the programs exported from JAX, the random programs XLA
//! refused (shrunk) and 250 random programs (with `Config::with_wide`'s long folds, wide
//! windows and scatters), exported with `kiln_stablehlo::to_text`, run through XLA (CPU, by
//! JAX, in `tests/xla_run.py`) and compared with kiln's reference interpreter under the
//! backends' accuracy bounds (`kiln_reference::accuracy::check_outputs`).
//!
//! It needs a Python with `jax`, named by `KILN_JAX_PYTHON` (`cargo xtask test` installs one
//! into `~/.cache/kiln/jax-venv` and sets it); without it the test says so and checks nothing.

mod common;
mod npy;

use kiln_ir::random::{Config, Rng, random_func, random_literal};
use kiln_ir::{Literal, Module};
use std::path::{Path, PathBuf};
use std::process::Command;

/// How many random programs XLA runs (seeds from 0; `KILN_XLA_PROGRAMS` names a count `N` or a
/// range `A..B` of fresh seeds instead).
const RANDOM_PROGRAMS: u64 = 250;

/// Seeds of random programs with complex parameters (about one in seven holds a complex value
/// and exports).
const RANDOM_COMPLEX_SEEDS: u64 = 700;

/// Programs where XLA is known to differ from kiln, each with the reason. Each must still
/// differ (the test fails when one agrees, so the list cannot go stale).
const KNOWN: &[(&str, &str)] = &[
    (
        "reduce_window example 2",
        "base dilation: XLA leaves the holes out of each window; StableHLO's spec and kiln fill them with the init value (here not the identity)",
    ),
    (
        "reduce_precision example 3",
        "mantissa_bits = 0: a NaN stays NaN on XLA; kiln's spec makes it infinity (no mantissa bit is left to mark a NaN)",
    ),
    (
        "bitcast_convert example 3",
        "a pred is one bit in StableHLO's spec (and its interpreter suite, which kiln passes); XLA's CPU bitcasts pred as its byte (u8[2] to pred[2])",
    ),
    (
        "bitcast_convert example 5",
        "a bitcast between a complex and a real type (the parts as a last dimension of 2) is a kiln extension, which kiln's kernels use to split complex values; StableHLO and XLA bitcast a complex type only to a complex type",
    ),
    (
        "cbrt example 2",
        "cbrt of complex numbers: XLA refuses it (its cbrt wants a float element type); StableHLO's spec and interpreter define it, and kiln computes the principal root their test expects",
    ),
    (
        "maximum example 3",
        "complex numbers with equal real parts (here 0.0 and -0.0): XLA's CPU keeps lhs; StableHLO's spec and interpreter suite (which kiln passes) order (real, imaginary) lexicographically, so the larger imaginary part wins",
    ),
    (
        "minimum example 2",
        "complex numbers with equal real parts: XLA's CPU keeps lhs; StableHLO's spec and interpreter suite (which kiln passes) order (real, imaginary) lexicographically, so the smaller imaginary part wins",
    ),
    (
        "random seed 717, shrunk",
        "a sort of a 2-bit integer operand beside an operand of another width: XLA's CPU refuses it (\"Inputs must have the same shape\", the sorted dimension longer than 1; 2-bit operands alone, or 4-bit ones beside wider ones, compile); StableHLO's spec sorts operands of any element types of one shape, as kiln does",
    ),
    ("select_and_scatter tie, padded", SELECT_TIES),
    (
        "jax program threefry_bits",
        "`uniform` scales by `u * (max - min) + min`: XLA's CPU fuses the multiply and the add (one rounding), kiln rounds each (1 ulp)",
    ),
];

/// Why XLA may pick another element of a padded `select_and_scatter` window.
const SELECT_TIES: &str = "select_and_scatter with padding, in a window holding two elements its select does not order (equal values under GT): XLA's CPU expands the op into a reduce_window over (value, row, column) tuples and a scatter, and with padding that reduce_window visits a window's elements in another order than row-major (column-major where only the last dimension is padded), so it picks another of the tied elements; StableHLO's spec leaves the order to reduce_window's schedule, and kiln's spec scans each window row-major";

/// XLA's refusal of a live `rng_bit_generator` (a dead one it removes before it looks).
const RNG_REFUSAL: &str = "Binary op add with different element types: u32";

/// Whether a function of `m` holds a `reduce_region` or `reduce_window_region` with an init
/// value that XLA's using more than once can change the result by: not a constant (the random
/// programs' exclusive or and argmax from a random init), or a constant that changes it when
/// folded in twice (see [`init_used_twice_is_once`]; checked for one-input reductions).
fn reduces_from_a_variable_init(m: &Module) -> bool {
    m.funcs.iter().any(|f| {
        let constant = |v: kiln_ir::ValueId| {
            f.insts.iter().find_map(|i| match &i.op {
                kiln_ir::Op::Constant { value } if i.results.contains(&v) => Some(value.clone()),
                _ => None,
            })
        };
        f.insts.iter().any(|i| {
            let body = match &i.op {
                kiln_ir::Op::ReduceRegion { body, .. }
                | kiln_ir::Op::ReduceWindowRegion { body, .. } => body,
                _ => return false,
            };
            let inits = &i.operands[i.operands.len() / 2..];
            inits.iter().any(|&v| match constant(v) {
                None => true,
                Some(c) => inits.len() == 1 && !init_used_twice_is_once(body, &c),
            })
        })
    })
}

/// Whether folding the constant `c` in twice gives what folding it in once does, for the
/// one-input reduction body `body` on a few values `x` (`body(c, body(c, x)) == body(c, x)`),
/// so that XLA's using the init more than once cannot change a result: an identity (an
/// exclusive or from 0) and an idempotent init (a maximum from 0) can; an exclusive or from 14
/// (seeds 1304 and 1827) or a sum from 5 cannot. A value the body does not take, or one it
/// makes NaN, tells nothing.
fn init_used_twice_is_once(body: &kiln_ir::Func, c: &Literal) -> bool {
    let apply = |a: &Literal, b: &Literal| -> Option<Literal> {
        let r = kiln_reference::eval(body, &[a.clone(), b.clone()]).ok()?;
        let r = r.into_iter().next()?;
        (!r.to_f64s().iter().any(|v| v.is_nan())).then_some(r)
    };
    [0.0, 1.0, 3.0, 14.0, -2.5, 100.0].iter().all(|&x| {
        let Ok(x) = Literal::from_f64s(c.ty().clone(), &[x]) else {
            return true;
        };
        match apply(c, &x) {
            Some(once) => apply(c, &once).is_none_or(|twice| twice == once),
            None => true,
        }
    })
}

#[test]
fn inits_that_change_a_result_when_used_twice_are_told() {
    let body = |op: &str| {
        kiln_ir::parse_func_text(&format!(
            "func @combine(%0: i32[], %1: i32[]) -> i32[] {{\n  %2 = {op} %0, %1 : i32[]\n  return %2\n}}\n"
        ))
        .unwrap()
    };
    let c = |v: f64| {
        Literal::from_f64s(
            kiln_ir::TensorType::new(kiln_ir::DType::I32, Vec::<usize>::new()),
            &[v],
        )
        .unwrap()
    };
    assert!(init_used_twice_is_once(&body("xor"), &c(0.0)));
    assert!(init_used_twice_is_once(&body("add"), &c(0.0)));
    assert!(init_used_twice_is_once(&body("maximum"), &c(0.0)));
    assert!(!init_used_twice_is_once(&body("xor"), &c(14.0)));
    assert!(!init_used_twice_is_once(&body("add"), &c(5.0)));
}

/// Whether a function of `m` (or a region in it) sorts a 2-bit integer operand beside an
/// operand of another width.
fn sorts_2_bit_beside_wider(m: &Module) -> bool {
    fn walk(f: &kiln_ir::Func) -> bool {
        f.insts.iter().any(|i| {
            let bits: Vec<u32> = i
                .operands
                .iter()
                .map(|v| f.values[v.index()].dtype.bits())
                .collect();
            let mixed = bits.contains(&2) && bits.iter().any(|&b| b != 2);
            (matches!(i.op, kiln_ir::Op::Sort { .. }) && mixed)
                || i.op.regions().into_iter().any(walk)
        })
    }
    m.funcs.iter().any(walk)
}

/// Whether an instruction of `m` (regions included) satisfies `pred`, given its function.
fn any_inst(m: &Module, pred: &dyn Fn(&kiln_ir::Func, &kiln_ir::Inst) -> bool) -> bool {
    fn walk(f: &kiln_ir::Func, pred: &dyn Fn(&kiln_ir::Func, &kiln_ir::Inst) -> bool) -> bool {
        f.insts
            .iter()
            .any(|i| pred(f, i) || i.op.regions().into_iter().any(|r| walk(r, pred)))
    }
    m.funcs.iter().any(|f| walk(f, pred))
}

/// Whether `m` bitcasts to or from `pred` (one bit an element in StableHLO's spec, a byte on
/// XLA's CPU).
fn bitcasts_pred(m: &Module) -> bool {
    any_inst(m, &|f, i| {
        matches!(i.op, kiln_ir::Op::BitcastConvert { .. })
            && i.operands
                .iter()
                .chain(&i.results)
                .any(|v| f.values[v.index()].dtype == kiln_ir::DType::Pred)
    })
}

/// Whether `m` has a matrix product or convolution of values narrower than a byte (2- or
/// 4-bit integers, 4- or 6-bit floats such as seed 3022's `f4e2m1fn`) into another type.
fn widens_sub_byte_products(m: &Module) -> bool {
    any_inst(m, &|f, i| {
        let ty = |v: &kiln_ir::ValueId| f.values[v.index()].dtype;
        matches!(
            i.op,
            kiln_ir::Op::DotGeneral { .. } | kiln_ir::Op::Convolution { .. }
        ) && i.operands.iter().any(|v| ty(v).bits() < 8)
            && i.results.iter().any(|r| ty(r) != ty(&i.operands[0]))
    })
}

/// A padded `select_and_scatter` whose first window holds a tie (see [`SELECT_TIES`]).
const SELECT_TIE_PROGRAM: &str = "func @main(%0: f32[2,2], %1: f32[1,2], %2: f32[]) -> f32[2,2] {\n  %3 = select_and_scatter %0, %1, %2 {window_dimensions = [2, 2], window_strides = [1, 1], padding = [[0, 0], [0, 1]], select = GT, kind = add} : f32[2,2]\n  return %3\n}\n";

/// Random programs XLA refused or disagreed with, shrunk (each a known difference, listed in `KNOWN`, so the
/// check notices when XLA runs it), with their arguments.
fn shrunk_programs() -> Vec<(String, Module, Vec<Literal>)> {
    [
        (
            "random seed 717, shrunk",
            "func @main(%0: u2[4], %1: f16[4]) -> (u2[4], f16[4]) {\n  %2, %3 = sort %0, %1 {dimension = 0, is_stable = true, comparator = func @comparator(%0: u2[], %1: u2[], %2: f16[], %3: f16[]) -> pred[] {\n      %4 = compare %0, %1 {comparison_direction = LT} : pred[]\n      return %4\n    }} : u2[4], f16[4]\n  return %2, %3\n}\n",
            &["[3, 0, 2, 0]", "[1.5, -2.0, 0.25, 4.0]"][..],
        ),
        // Random seed 1612's difference, shrunk: the first window holds both 1s; kiln picks
        // the later in row-major order (GT keeps the current only while it is greater), XLA
        // the earlier.
        (
            "select_and_scatter tie, padded",
            SELECT_TIE_PROGRAM,
            &["[[0.0, 1.0], [1.0, 0.0]]", "[[1.0, 2.0]]", "0.0"][..],
        ),
    ]
    .into_iter()
    .map(|(name, text, args)| {
        let m = kiln_ir::parse_module(text).unwrap_or_else(|e| panic!("{name}: {e}"));
        let f = m.entry().expect("an entry function");
        let args = args
            .iter()
            .zip(f.param_types())
            .map(|(a, t)| kiln_ir::parse_literal(a, &t).unwrap_or_else(|e| panic!("{name}: {e}")))
            .collect();
        (name.to_string(), m, args)
    })
    .collect()
}

/// Why XLA refusing or disagreeing with this program is known: a listed program, XLA
/// refusing kiln's `rng_bit_generator` state, a product of sub-byte integers (into their own
/// type or a wider one), a bitcast to or from `pred`, a variadic
/// reduce or a sort of a 2-bit integer beside a wider operand or a bitcast between complex and
/// real types, JAX refusing an
/// argument of a 6- or 4-bit float (or XLA any such value), XLA aborting on a concatenate of
/// sub-byte integers, `popcnt` of a signed sub-byte integer, `reduce_window` of a rank-0
/// operand, a region reduction from an init value that is not its body's identity, or a
/// padded `select_and_scatter` window with a tie in it.
fn known(name: &str, problem: &str, m: &Module, args: &[Literal]) -> Option<&'static str> {
    if ["S2", "U2", "S4", "U4"]
        .iter()
        .any(|t| problem.contains(&format!("unsupported operand type {t} in op dot")))
    {
        return Some("XLA's CPU has no matrix product of 2- or 4-bit integers");
    }
    if problem.contains("custom element sizes on non-sub-byte types") && widens_sub_byte_products(m)
    {
        return Some(
            "XLA's CPU has no matrix product of values narrower than a byte (2- or 4-bit integers, 4- or 6-bit floats); into a wider type, its operand upcaster converts them keeping their element size, and its own verifier refuses the result (\"custom element sizes on non-sub-byte types\")",
        );
    }
    if bitcasts_pred(m) {
        return KNOWN
            .iter()
            .find(|(n, _)| *n == "bitcast_convert example 3")
            .map(|(_, why)| *why);
    }
    if problem.contains("XLA aborted") && problem.contains("Check failed: bit_offset") {
        return Some(
            "XLA's CPU aborts (a failed check on a bit offset in its concatenate kernel) on a concatenate of 2- or 4-bit integers",
        );
    }
    if problem.contains("cannot convert between real and complex types") {
        return Some(
            "a bitcast between a complex and a real type is a kiln extension (`bitcast_convert`'s spec); StableHLO and XLA bitcast a complex type only to a complex type",
        );
    }
    if ["float6_e2m3fn", "float6_e3m2fn", "float4_e2m1fn"]
        .iter()
        .any(|t| problem.contains(&format!("Unknown NumPy dtype dtype({t})")))
    {
        return Some(
            "JAX's device_put takes no 6- or 4-bit float arrays, so XLA cannot be given them",
        );
    }
    if problem.contains("Invalid XLA PrimitiveType")
        && ["F6E2M3FN", "F6E3M2FN", "F4E2M1FN"]
            .iter()
            .any(|t| problem.contains(&format!("({t})")))
    {
        return Some(
            "XLA compiles no 6- or 4-bit float values, results included (`Invalid XLA PrimitiveType`)",
        );
    }
    let text = kiln_ir::print_module(m);
    let signed_popcnt = text
        .lines()
        .any(|l| l.contains("= popcnt ") && (l.contains(": i4[") || l.contains(": i2[")));
    if problem.starts_with("XLA disagrees") && signed_popcnt {
        return Some(
            "popcnt of a negative i4 or i2: XLA's CPU counts the bits of the byte it keeps the value in, sign-extended (8 for -1, wrapped to -8); StableHLO's spec and interpreter, and kiln, count the value's 4 or 2 bits",
        );
    }
    let scalar_window = text
        .lines()
        .any(|l| l.contains("= reduce_window") && l.contains("window_dimensions = []"));
    if problem.starts_with("XLA disagrees") && scalar_window {
        return Some(
            "reduce_window of a rank-0 operand: XLA's CPU returns the operand and leaves the init value out (with a 1x1 window over a rank-2 operand it applies the body to both); StableHLO's spec and kiln apply the body to the init value and the element",
        );
    }
    if problem.starts_with("XLA disagrees") && reduces_from_a_variable_init(m) {
        return Some(
            "a region reduction from an init value that is not its body's identity (an exclusive or from a random value, an argmax from a random best): StableHLO's spec lets an implementation use the init values any number of times, and XLA's CPU uses them once per part of a long row or window (an even number of times over 3,418 elements); kiln's spec uses them once, as the reference does",
        );
    }
    if problem.starts_with("XLA disagrees") && padded_select_ties(m, args) {
        return Some(SELECT_TIES);
    }
    if problem.contains("reduce_decomposer.cc") && problem.contains("layout()") {
        return Some(
            "XLA's CPU refuses a variadic reduce of a 2-bit integer input beside a wider one (a failed layout check in its reduce decomposer, at any length)",
        );
    }
    if problem.contains("Inputs must have the same shape") && sorts_2_bit_beside_wider(m) {
        return KNOWN
            .iter()
            .find(|(n, _)| *n == "random seed 717, shrunk")
            .map(|(_, why)| *why);
    }
    if problem.contains(RNG_REFUSAL) && problem.contains("u64") {
        return Some(
            "rng_bit_generator: XLA's THREE_FRY takes only the u64[2] state; kiln also has the u32[4] form of the same bits",
        );
    }
    KNOWN.iter().find(|(n, _)| *n == name).map(|(_, why)| *why)
}

/// Whether a `select_and_scatter` of `m`'s entry function with padding, run on `args`, has a
/// window (any of its windows: XLA scans them all in another order) whose element kiln's
/// row-major scan picks, `s`, ties with another, `y`: the
/// select does not order them (`select(s, y) == select(y, s)`: equal values under GT or GE, any
/// two under EQ or NE), so that scanning the window in another order can pick `y` (see
/// [`SELECT_TIES`]). Like the other classifiers, it excuses the program's whole disagreement.
fn padded_select_ties(m: &Module, args: &[Literal]) -> bool {
    let Some(f) = m.entry() else { return false };
    f.insts.iter().any(|i| {
        let kiln_ir::Op::SelectAndScatter {
            window_dimensions: wd,
            window_strides: ws,
            padding,
            select,
            ..
        } = &i.op
        else {
            return false;
        };
        if padding.iter().all(|&p| p == (0, 0)) {
            return false;
        }
        // The operand's value: the function up to here, returning it.
        let mut g = f.clone();
        g.outputs = vec![i.operands[0]];
        g.output_types = vec![f.values[i.operands[0].index()].clone()];
        let Ok(Some(a)) = kiln_reference::eval(&g, args).map(|r| r.into_iter().next()) else {
            return false;
        };
        let shape = a.shape().to_vec();
        let (fs, is) = (a.to_f64s(), a.to_i64s());
        let sel = |x: usize, y: usize| {
            if a.dtype().is_float() {
                kiln_reference::scalar::compare_f(*select, fs[x], fs[y])
            } else {
                kiln_reference::scalar::compare_i(*select, a.dtype(), is[x], is[y])
            }
        };
        let strides = a.ty().strides();
        let grid: Vec<usize> = (0..shape.len())
            .map(|d| kiln_ir::verify::window_output_size(shape[d], 1, padding[d], wd[d], 1, ws[d]))
            .collect();
        let wshape: Vec<usize> = wd.iter().map(|&w| w as usize).collect();
        let mut tied = false;
        kiln_reference::for_each_index(&grid, |o| {
            // The window's elements in row-major order, the padding left out.
            let mut window = Vec::new();
            kiln_reference::for_each_index(&wshape, |w| {
                let pos = (0..o.len()).try_fold(0, |pos, d| {
                    let p = o[d] as i64 * ws[d] - padding[d].0 + w[d] as i64;
                    (0..shape[d] as i64)
                        .contains(&p)
                        .then(|| pos + p as usize * strides[d])
                });
                window.extend(pos);
            });
            let picked = window
                .iter()
                .copied()
                .reduce(|s, y| if sel(s, y) { s } else { y });
            tied |=
                picked.is_some_and(|s| window.iter().any(|&y| y != s && sel(s, y) == sel(y, s)));
        });
        tied
    })
}

#[test]
fn padded_select_ties_are_told() {
    let padded = kiln_ir::parse_module(SELECT_TIE_PROGRAM).unwrap();
    let args = |a: &str| {
        let f32s = |s: &str, shape: Vec<usize>| {
            kiln_ir::parse_literal(s, &kiln_ir::TensorType::new(kiln_ir::DType::F32, shape))
                .unwrap()
        };
        vec![
            f32s(a, vec![2, 2]),
            f32s("[[1.0, 2.0]]", vec![1, 2]),
            f32s("0.0", vec![]),
        ]
    };
    let (tie, distinct) = ("[[0.0, 1.0], [1.0, 0.0]]", "[[0.0, 1.0], [2.0, 3.0]]");
    assert!(padded_select_ties(&padded, &args(tie)));
    // Distinct values: every window orders its elements.
    assert!(!padded_select_ties(&padded, &args(distinct)));
    // Equal values that the scan does not pick (the 2 is every order's): no tie.
    assert!(!padded_select_ties(
        &padded,
        &args("[[0.0, 0.0], [1.0, 2.0]]")
    ));
    // Unpadded, XLA scans row-major as kiln does.
    let unpadded = SELECT_TIE_PROGRAM
        .replace("[[0, 0], [0, 1]]", "[[0, 0], [0, 0]]")
        .replace("f32[1,2]", "f32[1,1]");
    let unpadded = kiln_ir::parse_module(&unpadded).unwrap();
    let mut a = args(tie);
    a[1] = kiln_ir::parse_literal(
        "[[1.0]]",
        &kiln_ir::TensorType::new(kiln_ir::DType::F32, vec![1, 1]),
    )
    .unwrap();
    assert!(!padded_select_ties(&unpadded, &a));
}

/// XLA's outputs with each zero that stands for a subnormal value of the reference's (`want`)
/// put back to that value: XLA's CPU runs with subnormal results flushed to zero (a logistic
/// of -100, 3.8e-44 in f32, is 0 there), where kiln and the reference keep them. Nothing else
/// moves: a flushed operand that changes a normal result still disagrees.
fn unflushed(got: Vec<Literal>, want: &[Literal]) -> Vec<Literal> {
    got.into_iter()
        .zip(want)
        .map(|(g, w)| {
            let least_normal = match g.dtype() {
                kiln_ir::DType::F32 | kiln_ir::DType::BF16 => f64::from(f32::MIN_POSITIVE),
                kiln_ir::DType::F16 => 2f64.powi(-14),
                kiln_ir::DType::F64 => f64::MIN_POSITIVE,
                _ => return g,
            };
            if g.ty() != w.ty() {
                return g;
            }
            let (a, e) = (g.to_f64s(), w.to_f64s());
            if !a
                .iter()
                .zip(&e)
                .any(|(&a, &e)| a == 0.0 && e != 0.0 && e.abs() < least_normal)
            {
                return g;
            }
            let v: Vec<f64> = a
                .iter()
                .zip(&e)
                .map(|(&a, &e)| {
                    if a == 0.0 && e != 0.0 && e.abs() < least_normal {
                        e
                    } else {
                        a
                    }
                })
                .collect();
            Literal::from_f64s(g.ty().clone(), &v).unwrap_or(g)
        })
        .collect()
}

/// The programs exported from JAX (`tests/data/jax/*`) as kiln imports them, with their
/// inputs: XLA runs kiln's decompositions (the `chlo` special functions, `top_k`, threefry
/// on `ui64` bits) as kiln writes them back out.
fn jax_programs() -> Vec<(String, Module, Vec<Literal>)> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/jax");
    let mut names: Vec<String> = std::fs::read_dir(&root)
        .expect("tests/data/jax exists")
        .map(|e| {
            e.expect("readable")
                .file_name()
                .to_string_lossy()
                .into_owned()
        })
        .filter(|n| root.join(n).join("module.mlir").exists())
        .collect();
    names.sort();
    names
        .into_iter()
        .map(|name| {
            let d = root.join(&name);
            let m = kiln_stablehlo::parse_file(d.join("module.mlir"))
                .unwrap_or_else(|e| panic!("{name}: {e}"));
            let f = m.funcs.iter().find(|f| f.name == "main").expect("@main");
            let args = f
                .param_types()
                .iter()
                .enumerate()
                .map(|(i, t)| {
                    let bytes = std::fs::read(d.join(format!("in{i}.npy"))).expect("an input");
                    npy::read(&bytes, t).unwrap_or_else(|e| panic!("{name} input {i}: {e}"))
                })
                .collect();
            let m = Module::from_func(f.clone());
            (format!("jax program {name}"), m, args)
        })
        .collect()
}

/// One program as written for `xla_run.py`.
struct Written {
    name: String,
    dir: PathBuf,
    module: Module,
    args: Vec<Literal>,
}

/// Writes `model.mlir`, `in*.npy` and `dtypes.txt` of one program under `dir`.
fn write_program(dir: &Path, m: &Module, args: &[Literal]) -> Result<(), String> {
    let text = kiln_stablehlo::to_text(m).map_err(|e| e.to_string())?;
    std::fs::create_dir_all(dir).map_err(|e| e.to_string())?;
    std::fs::write(dir.join("model.mlir"), text).map_err(|e| e.to_string())?;
    let mut dtypes = String::new();
    for (i, a) in args.iter().enumerate() {
        std::fs::write(dir.join(format!("in{i}.npy")), npy::write(a)).map_err(|e| e.to_string())?;
        dtypes += &format!("{}\n", a.dtype());
    }
    std::fs::write(dir.join("dtypes.txt"), dtypes).map_err(|e| e.to_string())
}

/// XLA's outputs of one program, or why there are none.
fn read_outputs(p: &Written) -> Result<Vec<Literal>, String> {
    if let Ok(e) = std::fs::read_to_string(p.dir.join("error.txt")) {
        return Err(format!("XLA failed:\n{e}"));
    }
    let f = p.module.entry().ok_or("no function")?;
    f.output_types
        .iter()
        .enumerate()
        .map(|(i, t)| {
            let path = p.dir.join(format!("out{i}.npy"));
            let bytes = std::fs::read(&path).map_err(|e| format!("{}: {e}", path.display()))?;
            npy::read(&bytes, t).map_err(|e| format!("output {i}: {e}"))
        })
        .collect()
}

/// Whether a function of `m` (or a region in it) holds a collective or reads its process.
fn has_collective(m: &Module) -> bool {
    fn walk(f: &kiln_ir::Func) -> bool {
        f.insts.iter().any(|i| {
            kiln_reference::collective::is_collective(&i.op) || i.op.regions().into_iter().any(walk)
        })
    }
    m.funcs.iter().any(walk)
}

#[test]
fn xla_agrees_with_the_reference() {
    let Some(python) = std::env::var_os("KILN_JAX_PYTHON") else {
        println!(
            "skipped: KILN_JAX_PYTHON is not set (a Python with jax; `cargo xtask test` installs one and sets it)"
        );
        return;
    };
    let root = Path::new(env!("CARGO_TARGET_TMPDIR")).join("xla-check");
    let _ = std::fs::remove_dir_all(&root);
    let mut programs: Vec<(String, Module, Vec<Literal>)> = common::spec_examples();
    programs.extend(jax_programs());
    programs.extend(shrunk_programs());
    programs.extend(random_complex_programs(RANDOM_COMPLEX_SEEDS));
    let knob = std::env::var("KILN_XLA_PROGRAMS").ok();
    let seeds = kiln_ir::random::seeds::seed_range(
        "KILN_XLA_PROGRAMS",
        knob.as_deref(),
        0..RANDOM_PROGRAMS,
    )
    .unwrap();
    programs.extend(
        common::random_programs(seeds)
            .into_iter()
            .map(|(n, m, a, _)| (n, m, a)),
    );
    // XLA runs these on one device, without kiln's process grid: programs with collectives
    // are checked on the grid by the interpreter suite (`peer_suite.rs`) instead.
    programs.retain(|(_, m, _)| !has_collective(m));
    let mut written = Vec::new();
    let mut failures = Vec::new();
    for (k, (name, module, args)) in programs.into_iter().enumerate() {
        let dir = root.join(format!("p{k}"));
        match write_program(&dir, &module, &args) {
            Ok(()) => written.push(Written {
                name,
                dir,
                module,
                args,
            }),
            Err(e) => failures.push(format!("{name}: export: {e}")),
        }
    }
    let list: String = written
        .iter()
        .map(|w| {
            format!(
                "{}\n",
                w.dir
                    .file_name()
                    .map(|n| n.to_string_lossy())
                    .unwrap_or_default()
            )
        })
        .collect();
    std::fs::write(root.join("programs.txt"), list).expect("writable target dir");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/xla_run.py");
    let out = Command::new(&python)
        .arg(&script)
        .arg(&root)
        .output()
        .expect("KILN_JAX_PYTHON runs");
    print!("{}", String::from_utf8_lossy(&out.stdout));
    assert!(
        out.status.success(),
        "{} failed:\n{}",
        script.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    let (mut ran, mut agreed, mut known_count) = (0, 0, 0);
    for w in &written {
        let f = w.module.entry().expect("an entry function");
        let outcome = read_outputs(w).map(|got| {
            ran += 1;
            match kiln_reference::eval(f, &w.args) {
                Ok(want) => kiln_reference::accuracy::check_outputs_against(
                    f,
                    &w.args,
                    &unflushed(got, &want),
                    &want,
                ),
                Err(_) => kiln_reference::accuracy::check_outputs(f, &w.args, &got),
            }
        });
        let problem = match outcome {
            Ok(Ok(_)) => None,
            Ok(Err(e)) => Some(format!("XLA disagrees: {e}")),
            Err(e) => Some(e),
        };
        let listed = KNOWN.iter().find(|(n, _)| *n == w.name);
        let why = problem
            .as_deref()
            .and_then(|p| known(&w.name, p, &w.module, &w.args));
        match (problem, why) {
            (None, _) if listed.is_none() => agreed += 1,
            (None, _) => failures.push(format!(
                "{}: XLA now agrees; remove it from the known differences ({})",
                w.name,
                listed.map_or("", |l| l.1)
            )),
            (Some(_), Some(why)) => {
                known_count += 1;
                println!("known difference, {}: {why}", w.name);
            }
            (Some(p), None) => failures.push(format!(
                "{}: {p}\n{}",
                w.name,
                kiln_ir::print_module(&w.module)
            )),
        }
    }
    println!(
        "XLA ran {ran} of {} programs and agreed with the reference on {agreed}; {known_count} known differences",
        written.len()
    );
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
    assert!(ran >= 200, "XLA ran only {ran} programs");
}

/// `n` random programs with complex parameters (`Config::with_complex`, seeds `0..n`, 1 to 8
/// ops) that hold a complex value, with random arguments, the unexportable ones left out.
pub fn random_complex_programs(n: u64) -> Vec<(String, Module, Vec<Literal>)> {
    (0..n)
        .filter_map(|seed| {
            let cfg = Config {
                ops: 1 + (seed as usize % 8),
                ..Config::default()
            }
            .with_complex();
            let mut rng = Rng::new(seed);
            let f = random_func(&mut rng, &cfg);
            if !f.values.iter().any(|t| t.dtype.is_complex()) {
                return None;
            }
            let args = f
                .param_types()
                .iter()
                .map(|t| random_literal(&mut rng, t))
                .collect();
            let m = Module::from_func(f);
            common::exportable(&m).then(|| (format!("random complex seed {seed}"), m, args))
        })
        .collect()
}
