//! StableHLO text out: a kiln [`Module`] as MLIR text that XLA and [`crate::parse`] read.
//!
//! Functions are `func.func` (the entry, `@main` or the first, is `public`; the others, which
//! `call`s run as `func.call`, `private`); every op is
//! written in MLIR's generic form (`%v3 = "stablehlo.add"(%v1, %v2) : (...) -> ...`), which
//! every MLIR parser reads. Named combiners (`reduce`, `reduce_window`, `scatter`,
//! `select_and_scatter`) become one-op regions; `while`, `case`, `sort`, `reduce_region`
//! (`stablehlo.reduce` with its body), `reduce_window_region` and `map` regions are written
//! from their kiln functions (a `case` branch reads the case's operands from the enclosing
//! function, as StableHLO branches take no arguments). Constants are dense literals that read
//! back to the same bits ([`crate::dense`]).

use crate::dense::dense_text;
use crate::literal::type_name;
use kiln_ir::{Combiner, ComparisonDirection, DType, Func, Inst, Module, Op, TensorType};
use std::fmt::{self, Write};

/// Why a module cannot be written as StableHLO: the op, its function and the reason.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExportError {
    /// The op's mnemonic (empty when the problem is not one op's).
    pub op: String,
    /// The function it is in.
    pub func: String,
    /// What cannot be expressed.
    pub message: String,
}

impl fmt::Display for ExportError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.op.is_empty() {
            write!(f, "cannot export @{}: {}", self.func, self.message)
        } else {
            write!(
                f,
                "cannot export `{}` in @{}: {}",
                self.op, self.func, self.message
            )
        }
    }
}

impl std::error::Error for ExportError {}

/// The StableHLO text of `m`.
pub fn to_text(m: &Module) -> Result<String, ExportError> {
    let entry = m.entry().map(|f| f.name.clone());
    let mut p = Printer {
        out: String::from("module {\n"),
        next: 0,
    };
    for f in &m.funcs {
        p.func(f, entry.as_deref() == Some(f.name.as_str()))?;
    }
    // A callee the module does not list (a function built with its calls, not a parsed
    // module) is written after the module's functions, as a private function.
    let mut written: Vec<String> = m.funcs.iter().map(|f| f.name.clone()).collect();
    for f in &m.funcs {
        for g in kiln_ir::call::callees(f) {
            if !written.contains(&g.name) {
                p.func(&g, false)?;
                written.push(g.name);
            }
        }
    }
    p.out.push_str("}\n");
    Ok(p.out)
}

/// The text being written and the next fresh value number.
struct Printer {
    out: String,
    next: u32,
}

/// `array<i64: 1, 2>`.
fn arr(xs: &[i64]) -> String {
    if xs.is_empty() {
        return "array<i64>".into();
    }
    format!("array<i64: {}>", join(xs))
}

/// `1, 2, 3`.
fn join(xs: &[i64]) -> String {
    xs.iter().map(i64::to_string).collect::<Vec<_>>().join(", ")
}

/// `[1, 2]`.
fn list(xs: &[i64]) -> String {
    format!("[{}]", join(xs))
}

/// `[low, high]` pairs as a dense `Nx2` literal, or `None` when all are zero (the default).
fn pairs(name: &str, p: &[(i64, i64)]) -> Option<String> {
    if p.iter().all(|&x| x == (0, 0)) {
        return None;
    }
    let rows: Vec<String> = p.iter().map(|(l, h)| format!("[{l}, {h}]")).collect();
    Some(format!(
        "{name} = dense<[{}]> : tensor<{}x2xi64>",
        rows.join(", "),
        p.len()
    ))
}

/// The list of types `(a, b)`.
fn types(ts: &[&TensorType]) -> String {
    ts.iter()
        .map(|t| type_name(t))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The StableHLO op of a combiner, or `None` for `replace`.
fn combiner_op(c: Combiner) -> Option<&'static str> {
    Some(match c {
        Combiner::Replace => return None,
        Combiner::Add => "stablehlo.add",
        Combiner::Mul => "stablehlo.multiply",
        Combiner::Max => "stablehlo.maximum",
        Combiner::Min => "stablehlo.minimum",
        Combiner::And => "stablehlo.and",
        Combiner::Or => "stablehlo.or",
    })
}

/// `#stablehlo<comparison_direction LT>`.
fn direction(d: ComparisonDirection) -> String {
    format!("#stablehlo<comparison_direction {}>", d.name())
}

/// A dimension-number struct field list, leaving out empty lists.
fn fields(fs: &[(&str, &[i64])]) -> Vec<String> {
    fs.iter()
        .filter(|(_, v)| !v.is_empty())
        .map(|(n, v)| format!("{n} = {}", list(v)))
        .collect()
}

/// One convolution layout, `[b, f, 0, 1]`: `dims` = [batch-like, feature-like, spatial...].
fn layout(dims: &[i64], names: [&str; 2]) -> Option<String> {
    let mut slots = vec![None; dims.len()];
    for (k, &d) in dims.iter().enumerate() {
        let slot = slots.get_mut(usize::try_from(d).ok()?)?;
        if slot.is_some() {
            return None;
        }
        *slot = Some(match k {
            0 | 1 => names[k].to_string(),
            _ => (k - 2).to_string(),
        });
    }
    let items: Option<Vec<String>> = slots.into_iter().collect();
    Some(format!("[{}]", items?.join(", ")))
}

/// Fails unless every value `f` names has a type (so the printer can index them); a module
/// that does not verify may still fail later, in `parse` or XLA, but never panics here.
fn check_ids(f: &Func) -> Result<(), ExportError> {
    let n = f.values.len();
    let bad = f
        .params
        .iter()
        .chain(&f.outputs)
        .chain(
            f.insts
                .iter()
                .flat_map(|i| i.operands.iter().chain(&i.results)),
        )
        .find(|v| v.index() >= n);
    match bad {
        Some(v) => Err(ExportError {
            op: String::new(),
            func: f.name.clone(),
            message: format!("value {v} has no type (the function has {n} values)"),
        }),
        None => Ok(()),
    }
}

impl Printer {
    /// A fresh value name.
    fn fresh(&mut self) -> String {
        self.next += 1;
        format!("%v{}", self.next)
    }

    /// A top-level function.
    fn func(&mut self, f: &Func, public: bool) -> Result<(), ExportError> {
        check_ids(f)?;
        let mut names = vec![String::new(); f.values.len()];
        let mut params = Vec::new();
        for (i, &p) in f.params.iter().enumerate() {
            names[p.index()] = format!("%arg{i}");
            params.push(format!("%arg{i}: {}", type_name(&f.values[p.index()])));
        }
        let outs: Vec<&TensorType> = f.output_types.iter().collect();
        let _ = writeln!(
            self.out,
            "  func.func {} @{}({}) -> ({}) {{",
            if public { "public" } else { "private" },
            f.name,
            params.join(", "),
            types(&outs)
        );
        self.body(f, &mut names, 4)?;
        self.terminator(f, &names, "func.return", 4);
        self.out.push_str("  }\n");
        Ok(())
    }

    /// The instructions of `f`.
    fn body(&mut self, f: &Func, names: &mut [String], indent: usize) -> Result<(), ExportError> {
        for inst in &f.insts {
            self.inst(f, inst, names, indent)?;
        }
        Ok(())
    }

    /// `"func.return"(...)` or `"stablehlo.return"(...)` of `f`'s outputs.
    fn terminator(&mut self, f: &Func, names: &[String], op: &str, indent: usize) {
        let ops: Vec<&str> = f
            .outputs
            .iter()
            .map(|v| names[v.index()].as_str())
            .collect();
        let tys: Vec<&TensorType> = f.outputs.iter().map(|v| &f.values[v.index()]).collect();
        let _ = writeln!(
            self.out,
            "{:indent$}\"{op}\"({}) : ({}) -> ()",
            "",
            ops.join(", "),
            types(&tys)
        );
    }

    /// A region from a kiln function: its parameters are block arguments, or, with `bound`,
    /// the enclosing function's values of those names.
    fn region(
        &mut self,
        g: &Func,
        bound: Option<&[String]>,
        indent: usize,
    ) -> Result<String, ExportError> {
        check_ids(g)?;
        let saved = std::mem::take(&mut self.out);
        let mut names = vec![String::new(); g.values.len()];
        let mut args = Vec::new();
        for (i, &p) in g.params.iter().enumerate() {
            names[p.index()] = match bound {
                Some(b) => b[i].clone(),
                None => {
                    let n = self.fresh();
                    args.push(format!("{n}: {}", type_name(&g.values[p.index()])));
                    n
                }
            };
        }
        self.out.push_str("{\n");
        if bound.is_none() {
            let _ = writeln!(self.out, "{:indent$}^bb0({}):", "", args.join(", "));
        }
        let r = self.body(g, &mut names, indent + 2);
        self.terminator(g, &names, "stablehlo.return", indent + 2);
        let _ = write!(self.out, "{:indent$}}}", "");
        let text = std::mem::replace(&mut self.out, saved);
        r.map(|()| text)
    }

    /// A region of two scalars of `dtype` combined by `c` (`replace`: the second, for
    /// `scatter` only).
    fn combiner_region(
        &mut self,
        c: Combiner,
        dtype: DType,
        allow_replace: bool,
        indent: usize,
        err: &dyn Fn(String) -> ExportError,
    ) -> Result<String, ExportError> {
        let t = type_name(&TensorType::scalar(dtype));
        let (a, b) = (self.fresh(), self.fresh());
        let pad = indent + 2;
        let mut s = format!("{{\n{:indent$}^bb0({a}: {t}, {b}: {t}):\n", "");
        match combiner_op(c) {
            Some(op) => {
                let r = self.fresh();
                let _ = writeln!(s, "{:pad$}{r} = \"{op}\"({a}, {b}) : ({t}, {t}) -> {t}", "");
                let _ = writeln!(s, "{:pad$}\"stablehlo.return\"({r}) : ({t}) -> ()", "");
            }
            None if allow_replace => {
                let _ = writeln!(s, "{:pad$}\"stablehlo.return\"({b}) : ({t}) -> ()", "");
            }
            None => {
                return Err(err(format!("the combiner `{}` is no reduction", c.name())));
            }
        }
        let _ = write!(s, "{:indent$}}}", "");
        Ok(s)
    }

    /// The `select` region of `select_and_scatter`: one compare of the two scalars.
    fn select_region(&mut self, d: ComparisonDirection, dtype: DType, indent: usize) -> String {
        let t = type_name(&TensorType::scalar(dtype));
        let (a, b, r) = (self.fresh(), self.fresh(), self.fresh());
        let pad = indent + 2;
        format!(
            "{{\n{:indent$}^bb0({a}: {t}, {b}: {t}):\n{:pad$}{r} = \"stablehlo.compare\"({a}, {b}) {{comparison_direction = {}}} : ({t}, {t}) -> tensor<i1>\n{:pad$}\"stablehlo.return\"({r}) : (tensor<i1>) -> ()\n{:indent$}}}",
            "",
            "",
            direction(d),
            "",
            ""
        )
    }

    /// One instruction.
    fn inst(
        &mut self,
        f: &Func,
        inst: &Inst,
        names: &mut [String],
        indent: usize,
    ) -> Result<(), ExportError> {
        let mnemonic = inst.op.mnemonic();
        let err = |message: String| ExportError {
            op: mnemonic.to_string(),
            func: f.name.clone(),
            message,
        };
        let operand_names: Vec<String> = inst
            .operands
            .iter()
            .map(|v| names[v.index()].clone())
            .collect();
        let operand_types: Vec<&TensorType> =
            inst.operands.iter().map(|v| &f.values[v.index()]).collect();
        let result_types: Vec<&TensorType> =
            inst.results.iter().map(|v| &f.values[v.index()]).collect();
        let out_dtype = result_types.first().map(|t| t.dtype);
        let in_dtype = operand_types.first().map(|t| t.dtype);
        let need =
            |d: Option<DType>| d.ok_or_else(|| err("an op without operands or results".into()));
        let ri = indent + 2;
        let mut name = format!("stablehlo.{mnemonic}");
        let mut attrs: Vec<String> = Vec::new();
        let mut regions: Vec<String> = Vec::new();
        let mut operands_shown = operand_names.clone();
        let mut operand_types_shown = operand_types.clone();
        match &inst.op {
            Op::Constant { value } => attrs.push(format!("value = {}", dense_text(value))),
            Op::Iota { iota_dimension } => {
                attrs.push(format!("iota_dimension = {iota_dimension} : i64"))
            }
            Op::Compare {
                comparison_direction,
            } => attrs.push(format!(
                "comparison_direction = {}",
                direction(*comparison_direction)
            )),
            Op::ReducePrecision {
                exponent_bits,
                mantissa_bits,
            } => {
                attrs.push(format!("exponent_bits = {exponent_bits} : i32"));
                attrs.push(format!("mantissa_bits = {mantissa_bits} : i32"));
            }
            Op::BroadcastInDim {
                broadcast_dimensions,
            } => attrs.push(format!(
                "broadcast_dimensions = {}",
                arr(broadcast_dimensions)
            )),
            Op::Transpose { permutation } => {
                attrs.push(format!("permutation = {}", arr(permutation)))
            }
            Op::Slice {
                start_indices,
                limit_indices,
                strides,
            } => {
                attrs.push(format!("start_indices = {}", arr(start_indices)));
                attrs.push(format!("limit_indices = {}", arr(limit_indices)));
                attrs.push(format!("strides = {}", arr(strides)));
            }
            Op::DynamicSlice { slice_sizes } => {
                attrs.push(format!("slice_sizes = {}", arr(slice_sizes)))
            }
            Op::Pad {
                edge_padding_low,
                edge_padding_high,
                interior_padding,
            } => {
                attrs.push(format!("edge_padding_low = {}", arr(edge_padding_low)));
                attrs.push(format!("edge_padding_high = {}", arr(edge_padding_high)));
                attrs.push(format!("interior_padding = {}", arr(interior_padding)));
            }
            Op::Concatenate { dimension } => attrs.push(format!("dimension = {dimension} : i64")),
            Op::Reverse { dimensions } => attrs.push(format!("dimensions = {}", arr(dimensions))),
            Op::Reduce { dimensions, kind } => {
                attrs.push(format!("dimensions = {}", arr(dimensions)));
                regions.push(self.combiner_region(*kind, need(out_dtype)?, false, ri, &err)?);
            }
            Op::DotGeneral {
                lhs_batching_dimensions,
                rhs_batching_dimensions,
                lhs_contracting_dimensions,
                rhs_contracting_dimensions,
            } => {
                let fs = fields(&[
                    ("lhs_batching_dimensions", lhs_batching_dimensions),
                    ("rhs_batching_dimensions", rhs_batching_dimensions),
                    ("lhs_contracting_dimensions", lhs_contracting_dimensions),
                    ("rhs_contracting_dimensions", rhs_contracting_dimensions),
                ]);
                attrs.push(format!(
                    "dot_dimension_numbers = #stablehlo.dot<{}>",
                    fs.join(", ")
                ));
            }
            Op::Convolution {
                window_strides,
                padding,
                lhs_dilation,
                rhs_dilation,
                feature_group_count,
                input_dims,
                kernel_dims,
                output_dims,
                batch_group_count,
            } => {
                let bad = || err("a convolution layout that is not a permutation".into());
                let i = layout(input_dims, ["b", "f"]).ok_or_else(bad)?;
                let k = layout(kernel_dims, ["o", "i"]).ok_or_else(bad)?;
                let o = layout(output_dims, ["b", "f"]).ok_or_else(bad)?;
                attrs.push(format!("dimension_numbers = #stablehlo.conv<{i}x{k}->{o}>"));
                attrs.push(format!("window_strides = {}", arr(window_strides)));
                attrs.extend(pairs("padding", padding));
                attrs.push(format!("lhs_dilation = {}", arr(lhs_dilation)));
                attrs.push(format!("rhs_dilation = {}", arr(rhs_dilation)));
                attrs.push(format!("feature_group_count = {feature_group_count} : i64"));
                attrs.push(format!("batch_group_count = {batch_group_count} : i64"));
            }
            Op::Gather {
                offset_dims,
                collapsed_slice_dims,
                start_index_map,
                index_vector_dim,
                slice_sizes,
                operand_batching_dims,
                start_indices_batching_dims,
            } => {
                let mut fs = fields(&[
                    ("offset_dims", offset_dims),
                    ("collapsed_slice_dims", collapsed_slice_dims),
                    ("operand_batching_dims", operand_batching_dims),
                    ("start_indices_batching_dims", start_indices_batching_dims),
                    ("start_index_map", start_index_map),
                ]);
                fs.push(format!("index_vector_dim = {index_vector_dim}"));
                attrs.push(format!(
                    "dimension_numbers = #stablehlo.gather<{}>",
                    fs.join(", ")
                ));
                attrs.push(format!("slice_sizes = {}", arr(slice_sizes)));
                attrs.push("indices_are_sorted = false".into());
            }
            Op::Scatter {
                update_window_dims,
                inserted_window_dims,
                scatter_dims_to_operand_dims,
                index_vector_dim,
                kind,
                input_batching_dims,
                scatter_indices_batching_dims,
            } => {
                let mut fs = fields(&[
                    ("update_window_dims", update_window_dims),
                    ("inserted_window_dims", inserted_window_dims),
                    ("input_batching_dims", input_batching_dims),
                    (
                        "scatter_indices_batching_dims",
                        scatter_indices_batching_dims,
                    ),
                    ("scatter_dims_to_operand_dims", scatter_dims_to_operand_dims),
                ]);
                fs.push(format!("index_vector_dim = {index_vector_dim}"));
                attrs.push(format!(
                    "scatter_dimension_numbers = #stablehlo.scatter<{}>",
                    fs.join(", ")
                ));
                attrs.push("indices_are_sorted = false".into());
                attrs.push("unique_indices = false".into());
                regions.push(self.combiner_region(*kind, need(out_dtype)?, true, ri, &err)?);
            }
            Op::ReduceWindow {
                window_dimensions,
                window_strides,
                base_dilations,
                window_dilations,
                padding,
                kind,
            } => {
                attrs.push(format!("window_dimensions = {}", arr(window_dimensions)));
                attrs.push(format!("window_strides = {}", arr(window_strides)));
                attrs.push(format!("base_dilations = {}", arr(base_dilations)));
                attrs.push(format!("window_dilations = {}", arr(window_dilations)));
                attrs.extend(pairs("padding", padding));
                regions.push(self.combiner_region(*kind, need(out_dtype)?, false, ri, &err)?);
            }
            Op::SelectAndScatter {
                window_dimensions,
                window_strides,
                padding,
                select,
                kind,
            } => {
                attrs.push(format!("window_dimensions = {}", arr(window_dimensions)));
                attrs.push(format!("window_strides = {}", arr(window_strides)));
                attrs.extend(pairs("padding", padding));
                regions.push(self.select_region(*select, need(in_dtype)?, ri));
                regions.push(self.combiner_region(*kind, need(out_dtype)?, false, ri, &err)?);
            }
            Op::RngBitGenerator { algorithm } => attrs.push(format!(
                "rng_algorithm = #stablehlo<rng_algorithm {}>",
                algorithm.name()
            )),
            Op::Call { callee } => {
                name = "func.call".into();
                attrs.push(format!("callee = @{}", callee.name));
            }
            Op::While { cond, body } => {
                regions.push(self.region(cond, None, ri)?);
                regions.push(self.region(body, None, ri)?);
            }
            Op::Case { branches } => {
                let bound = operand_names
                    .get(1..)
                    .ok_or_else(|| err("a case without its index operand".into()))?;
                for b in branches {
                    if b.params.len() != bound.len() {
                        return Err(err(format!(
                            "branch @{} takes {} values for {} operands",
                            b.name,
                            b.params.len(),
                            bound.len()
                        )));
                    }
                    regions.push(self.region(b, Some(bound), ri)?);
                }
                operands_shown.truncate(1);
                operand_types_shown.truncate(1);
            }
            Op::ReduceWindowRegion {
                window_dimensions,
                window_strides,
                base_dilations,
                window_dilations,
                padding,
                body,
            } => {
                name = "stablehlo.reduce_window".into();
                attrs.push(format!("window_dimensions = {}", arr(window_dimensions)));
                attrs.push(format!("window_strides = {}", arr(window_strides)));
                attrs.push(format!("base_dilations = {}", arr(base_dilations)));
                attrs.push(format!("window_dilations = {}", arr(window_dilations)));
                attrs.extend(pairs("padding", padding));
                regions.push(self.region(body, None, ri)?);
            }
            Op::Map {
                dimensions,
                computation,
            } => {
                attrs.push(format!("dimensions = {}", arr(dimensions)));
                regions.push(self.region(computation, None, ri)?);
            }
            Op::ReduceRegion { dimensions, body } => {
                name = "stablehlo.reduce".into();
                attrs.push(format!("dimensions = {}", arr(dimensions)));
                regions.push(self.region(body, None, ri)?);
            }
            Op::Sort {
                dimension,
                is_stable,
                comparator,
            } => {
                attrs.push(format!("dimension = {dimension} : i64"));
                attrs.push(format!("is_stable = {is_stable}"));
                regions.push(self.region(comparator, None, ri)?);
            }
            Op::Cholesky { lower } => attrs.push(format!("lower = {lower}")),
            Op::Fft {
                fft_type,
                fft_length,
            } => {
                attrs.push(format!(
                    "fft_type = #stablehlo<fft_type {}>",
                    fft_type.name()
                ));
                attrs.push(format!("fft_length = {}", arr(fft_length)));
            }
            Op::Lu {} => {
                return Err(err("`lu` is a kiln extension with no StableHLO form".into()));
            }
            Op::TriangularSolve {
                left_side,
                lower,
                unit_diagonal,
                transpose_a,
            } => {
                attrs.push(format!("left_side = {left_side}"));
                attrs.push(format!("lower = {lower}"));
                attrs.push(format!("unit_diagonal = {unit_diagonal}"));
                attrs.push(format!(
                    "transpose_a = #stablehlo<transpose {}>",
                    transpose_a.name()
                ));
            }
            Op::Erf {} => name = "chlo.erf".into(),
            Op::AllGather {
                all_gather_dim,
                replica_groups,
                channel_id,
                use_global_device_ids,
            } => {
                attrs.push(format!("all_gather_dim = {all_gather_dim} : i64"));
                attrs.extend(crate::collective::export_attrs(
                    replica_groups,
                    *channel_id,
                    *use_global_device_ids,
                ));
            }
            Op::AllReduce {
                replica_groups,
                channel_id,
                use_global_device_ids,
                computation,
            } => {
                attrs.extend(crate::collective::export_attrs(
                    replica_groups,
                    *channel_id,
                    *use_global_device_ids,
                ));
                regions.push(self.region(computation, None, ri)?);
            }
            Op::AllToAll {
                split_dimension,
                concat_dimension,
                split_count,
                replica_groups,
                channel_id,
            } => {
                attrs.push(format!("split_dimension = {split_dimension} : i64"));
                attrs.push(format!("concat_dimension = {concat_dimension} : i64"));
                attrs.push(format!("split_count = {split_count} : i64"));
                attrs.extend(crate::collective::export_attrs(
                    replica_groups,
                    *channel_id,
                    false,
                ));
            }
            Op::ReduceScatter {
                scatter_dimension,
                replica_groups,
                channel_id,
                use_global_device_ids,
                computation,
            } => {
                attrs.push(format!("scatter_dimension = {scatter_dimension} : i64"));
                attrs.extend(crate::collective::export_attrs(
                    replica_groups,
                    *channel_id,
                    *use_global_device_ids,
                ));
                regions.push(self.region(computation, None, ri)?);
            }
            Op::CollectivePermute {
                source_target_pairs,
                channel_id,
            } => {
                let rows: Vec<Vec<i64>> = source_target_pairs
                    .iter()
                    .map(|&(a, b)| vec![a, b])
                    .collect();
                attrs.push(format!(
                    "source_target_pairs = {}",
                    crate::collective::dense_rows(&rows, 2)
                ));
                attrs.extend(
                    crate::collective::export_attrs(&[], *channel_id, false)
                        .into_iter()
                        .skip(1),
                );
            }
            Op::CollectiveBroadcast {
                replica_groups,
                channel_id,
                has_dynamic_root,
            } => {
                attrs.extend(crate::collective::export_attrs(
                    replica_groups,
                    *channel_id,
                    false,
                ));
                if *has_dynamic_root {
                    attrs.push("has_dynamic_root".into());
                }
            }
            Op::CollectiveReduce {
                replica_groups,
                channel_id,
                computation,
            } => {
                attrs.extend(crate::collective::export_attrs(
                    replica_groups,
                    *channel_id,
                    false,
                ));
                regions.push(self.region(computation, None, ri)?);
            }
            _ => {
                if !inst.op.kind().attr_names().is_empty() {
                    return Err(err("no StableHLO form for its attributes".into()));
                }
            }
        }
        let lhs = match inst.results.len() {
            0 => String::new(),
            1 => {
                let n = self.fresh();
                names[inst.results[0].index()] = n.clone();
                format!("{n} = ")
            }
            k => {
                let n = self.fresh();
                for (i, r) in inst.results.iter().enumerate() {
                    names[r.index()] = format!("{n}#{i}");
                }
                format!("{n}:{k} = ")
            }
        };
        let results = match &result_types[..] {
            [t] => type_name(t),
            ts => format!("({})", types(ts)),
        };
        let _ = write!(
            self.out,
            "{:indent$}{lhs}\"{name}\"({})",
            "",
            operands_shown.join(", ")
        );
        if !regions.is_empty() {
            let _ = write!(self.out, " ({})", regions.join(", "));
        }
        if !attrs.is_empty() {
            let _ = write!(self.out, " {{{}}}", attrs.join(", "));
        }
        let _ = writeln!(
            self.out,
            " : ({}) -> {results}",
            types(&operand_types_shown)
        );
        Ok(())
    }
}
