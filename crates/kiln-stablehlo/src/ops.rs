//! The op mapping: each StableHLO op kiln has becomes the kiln op of the same name, its
//! attributes renamed and converted; the static forms of the `dynamic_*` ops read their
//! shape operands as constants; an op kiln lacks is a located `unsupported` error.
//!
//! Reduction bodies (`reduce`, `reduce_window`, `scatter`, `select_and_scatter`) must be one
//! op of the two block arguments (`add`, `multiply`, `maximum`, `minimum`, `and`, `or`), or
//! return the second argument (`scatter`'s replace): kiln names the combiner instead of
//! holding a region.

use crate::ast::{AttrVal, Block, ConvDims, OpAst};
use crate::error::{Error, Pos, Result, quote};
use crate::import::{Body, push, result_types, value_type};
use crate::literal::to_literal;
use kiln_ir::attr::AttrCtx;
use kiln_ir::{
    Combiner, ComparisonDirection, FftType, Literal, Op, OpKind, Props, RngAlgorithm, TensorType,
    TransposeA, ValueId,
};

/// The attribute stored under one of `names` (generic name first, pretty aliases after).
pub fn find<'a>(op: &'a OpAst, names: &[&str]) -> Option<(&'a AttrVal, Pos)> {
    names.iter().find_map(|n| op.attr(n))
}

/// The integers of an attribute value: `array<i64: ...>`, `[1, 2]`, or a 1-D `dense<...>`.
fn ints_of(v: &AttrVal, pos: Pos, what: &str) -> Result<Vec<i64>> {
    let bad = || {
        Error::invalid(
            pos,
            format!("attribute `{what}` must be a list of integers"),
        )
    };
    match v {
        AttrVal::Array(a) => Ok(a.clone()),
        AttrVal::List(items) => items
            .iter()
            .map(|x| match x {
                AttrVal::Int(i) => Ok(*i),
                AttrVal::Bool(b) => Ok(*b as i64),
                _ => Err(bad()),
            })
            .collect(),
        AttrVal::Dense(d, _) => d
            .elems
            .iter()
            .map(|e| match e {
                crate::ast::Elem::Int(i) => i64::try_from(*i).map_err(|_| bad()),
                crate::ast::Elem::Bool(b) => Ok(*b as i64),
                _ => Err(bad()),
            })
            .collect(),
        _ => Err(bad()),
    }
}

/// An integer attribute under one of `names`, if present.
pub fn int_attr(op: &OpAst, names: &[&str]) -> Result<Option<i64>> {
    match find(op, names) {
        None => Ok(None),
        Some((AttrVal::Int(i), _)) => Ok(Some(*i)),
        Some((_, pos)) => Err(Error::invalid(
            pos,
            format!(
                "attribute `{}` of `{}` must be an integer",
                names[0], op.name
            ),
        )),
    }
}

/// A list-of-integers attribute under one of `names`, if present.
pub fn ints_attr(op: &OpAst, names: &[&str]) -> Result<Option<Vec<i64>>> {
    find(op, names)
        .map(|(v, p)| ints_of(v, p, names[0]))
        .transpose()
}

/// A required list-of-integers attribute.
pub fn need_ints(op: &OpAst, names: &[&str]) -> Result<Vec<i64>> {
    ints_attr(op, names)?.ok_or_else(|| {
        Error::invalid(
            op.pos,
            format!("`{}` needs the attribute `{}`", op.name, names[0]),
        )
    })
}

/// A required integer attribute.
fn need_int(op: &OpAst, names: &[&str]) -> Result<i64> {
    int_attr(op, names)?.ok_or_else(|| {
        Error::invalid(
            op.pos,
            format!("`{}` needs the attribute `{}`", op.name, names[0]),
        )
    })
}

/// `[[lo, hi], ...]` pairs: a dense `Nx2` literal or nested lists.
fn pairs_of(v: &AttrVal, pos: Pos, what: &str) -> Result<Vec<(i64, i64)>> {
    let bad = || Error::invalid(pos, format!("attribute `{what}` must be [low, high] pairs"));
    let flat = match v {
        AttrVal::List(items) => {
            let mut flat = Vec::new();
            for it in items {
                let p = ints_of(it, pos, what)?;
                if p.len() != 2 {
                    return Err(bad());
                }
                flat.extend(p);
            }
            flat
        }
        // A splat, `dense<0> : tensor<4x2xi64>`, as JAX prints zero padding.
        AttrVal::Dense(d, Some(t)) if d.shape.is_none() && t.rank() == 2 && t.shape[1] == 2 => {
            let one = ints_of(v, pos, what)?;
            let [x] = one[..] else {
                return Err(bad());
            };
            vec![x; t.numel()]
        }
        AttrVal::Dense(d, _) => {
            let ok = match &d.shape {
                Some(s) => s.len() == 2 && s[1] == 2 || s == &[0],
                None => false,
            };
            if !ok {
                return Err(bad());
            }
            ints_of(v, pos, what)?
        }
        _ => return Err(bad()),
    };
    Ok(flat.chunks(2).map(|c| (c[0], c[1])).collect())
}

/// A named field of a struct attribute.
fn field<'a>(fields: &'a [(String, AttrVal)], name: &str) -> Option<&'a AttrVal> {
    fields.iter().find(|(n, _)| n == name).map(|(_, v)| v)
}

/// A list-of-integers field (empty when absent).
pub fn field_ints(fields: &[(String, AttrVal)], name: &str, pos: Pos) -> Result<Vec<i64>> {
    field(fields, name).map_or(Ok(Vec::new()), |v| ints_of(v, pos, name))
}

/// The struct attribute under `name`, as fields.
pub fn struct_attr<'a>(op: &'a OpAst, name: &str) -> Result<(&'a [(String, AttrVal)], Pos)> {
    match op.attr(name) {
        Some((AttrVal::Struct(_, f), p)) => Ok((f, p)),
        Some((_, p)) => Err(Error::invalid(
            p,
            format!("attribute `{name}` of `{}` has the wrong form", op.name),
        )),
        None => Err(Error::invalid(
            op.pos,
            format!("`{}` needs the attribute `{name}`", op.name),
        )),
    }
}

/// The `index_vector_dim` field.
fn index_vector_dim(fields: &[(String, AttrVal)], pos: Pos) -> Result<i64> {
    match field(fields, "index_vector_dim") {
        Some(AttrVal::Int(i)) => Ok(*i),
        None => Ok(0),
        _ => Err(Error::invalid(pos, "`index_vector_dim` must be an integer")),
    }
}

/// Fails unless `region` ends with `stablehlo.return`.
fn returns(op: &OpAst, region: &Block) -> Result<()> {
    match region.ops.last() {
        Some(last) if last.name == "stablehlo.return" => Ok(()),
        Some(last) => Err(Error::invalid(
            last.pos,
            format!(
                "a region of `{}` must end with `stablehlo.return`, not `{}`",
                op.name, last.name
            ),
        )),
        None => Err(Error::invalid(
            op.pos,
            format!("an empty region in `{}`", op.name),
        )),
    }
}

/// The combiner a reduction body computes.
pub fn combiner(op: &OpAst, region: &Block, allow_replace: bool) -> Result<Combiner> {
    returns(op, region)?;
    let bad = || {
        Error::unsupported(
            op.pos,
            format!(
                "the body of `{}`: kiln reduces with one add, multiply, maximum, minimum, and or or of the two block arguments",
                op.name
            ),
        )
    };
    let [(a, _), (b, _)] = &region.args[..] else {
        return Err(bad());
    };
    match &region.ops[..] {
        [ret] if allow_replace && ret.operands.len() == 1 && ret.operands[0].name == b.name => {
            Ok(Combiner::Replace)
        }
        [bin, ret]
            if ret.operands.len() == 1
                && bin.results.len() == 1
                && ret.operands[0].name == bin.results[0].name =>
        {
            let ops: Vec<&str> = bin.operands.iter().map(|n| n.name.as_str()).collect();
            if !(ops == [a.name.as_str(), b.name.as_str()]
                || ops == [b.name.as_str(), a.name.as_str()])
            {
                return Err(bad());
            }
            combiner_named(&bin.name).ok_or_else(bad)
        }
        _ => Err(bad()),
    }
}

/// Whether a `reduce` maps onto kiln's: one input, and `applies` or a body that is a named
/// combiner.
pub fn has_combiner(op: &OpAst, args: &[ValueId]) -> bool {
    args.len() == 2
        && (op.attr("applies").is_some()
            || matches!(&op.regions[..], [r] if combiner(op, r, false).is_ok()))
}

/// The window attributes of a `stablehlo.reduce_window` (strides and dilations 1 and no
/// padding where absent).
pub struct WindowAttrs {
    /// `window_dimensions`.
    pub dims: Vec<i64>,
    /// `window_strides`.
    pub strides: Vec<i64>,
    /// `base_dilations`.
    pub base_dilations: Vec<i64>,
    /// `window_dilations`.
    pub window_dilations: Vec<i64>,
    /// `padding`, `[low, high]` per dimension.
    pub padding: Vec<(i64, i64)>,
}

/// The window attributes of `op`, a `stablehlo.reduce_window`.
pub fn window_attrs(op: &OpAst) -> Result<WindowAttrs> {
    let dims = need_ints(op, &["window_dimensions"])?;
    let n = dims.len();
    Ok(WindowAttrs {
        strides: ints_attr(op, &["window_strides"])?.unwrap_or_else(|| vec![1; n]),
        base_dilations: ints_attr(op, &["base_dilations"])?.unwrap_or_else(|| vec![1; n]),
        window_dilations: ints_attr(op, &["window_dilations"])?.unwrap_or_else(|| vec![1; n]),
        padding: match find(op, &["padding"]) {
            Some((v, p)) => pairs_of(v, p, "padding")?,
            None => vec![(0, 0); n],
        },
        dims,
    })
}

/// The combiner of a StableHLO op name (`stablehlo.add` ...).
fn combiner_named(name: &str) -> Option<Combiner> {
    Some(match name {
        "stablehlo.add" => Combiner::Add,
        "stablehlo.multiply" => Combiner::Mul,
        "stablehlo.maximum" => Combiner::Max,
        "stablehlo.minimum" => Combiner::Min,
        "stablehlo.and" => Combiner::And,
        "stablehlo.or" => Combiner::Or,
        _ => return None,
    })
}

/// The one region of `op`.
fn one_region(op: &OpAst) -> Result<&Block> {
    match &op.regions[..] {
        [r] => Ok(r),
        rs => Err(Error::invalid(
            op.pos,
            format!("`{}` has one region, not {}", op.name, rs.len()),
        )),
    }
}

/// A comparison direction from `EQ` or `#stablehlo<comparison_direction EQ>`.
pub fn direction(v: &AttrVal, pos: Pos) -> Result<ComparisonDirection> {
    let s = match v {
        AttrVal::Ident(s) | AttrVal::Enum(_, s) => s.as_str(),
        _ => "",
    };
    ComparisonDirection::ALL
        .iter()
        .copied()
        .find(|d| d.name() == s)
        .ok_or_else(|| Error::invalid(pos, format!("bad comparison direction {}", quote(s))))
}

/// The comparison direction of a `select_and_scatter` select region: `compare DIR, a, b`.
fn select_direction(op: &OpAst, region: &Block) -> Result<ComparisonDirection> {
    returns(op, region)?;
    let bad = || {
        Error::unsupported(
            op.pos,
            "a `select_and_scatter` select region other than one compare of its two arguments",
        )
    };
    let [(a, _), (b, _)] = &region.args[..] else {
        return Err(bad());
    };
    match &region.ops[..] {
        [cmp, ret] if cmp.name == "stablehlo.compare" => {
            let ops: Vec<&str> = cmp.operands.iter().map(|n| n.name.as_str()).collect();
            if ops != [a.name.as_str(), b.name.as_str()] || ret.operands.len() != 1 {
                return Err(bad());
            }
            let (v, p) = cmp.attr("comparison_direction").ok_or_else(bad)?;
            direction(v, p)
        }
        _ => Err(bad()),
    }
}

/// The constant value of an operand (for the shape operands of `dynamic_*` ops).
pub fn const_ints(body: &Body, v: ValueId, op: &OpAst, what: &str) -> Result<Vec<i64>> {
    body.consts.get(&v).map(Literal::to_i64s).ok_or_else(|| {
        Error::unsupported(
            op.pos,
            format!(
                "`{}` with a non-constant {what} (kiln shapes are static)",
                op.name
            ),
        )
    })
}

/// Maps a StableHLO op onto kiln instructions and returns its results.
pub fn map_op(body: &mut Body, op: &OpAst, args: &[ValueId]) -> Result<Vec<ValueId>> {
    let declared = result_types(op);
    let d = declared.as_deref();
    let name = op.name.as_str();
    let ty0 = |body: &Body| args.first().map(|&a| value_type(body, a)).transpose();
    let kop = match name {
        "stablehlo.constant" => {
            let (v, p) = find(op, &["value"])
                .ok_or_else(|| Error::invalid(op.pos, "`stablehlo.constant` needs a value"))?;
            let AttrVal::Dense(dense, dty) = v else {
                return Err(Error::invalid(
                    p,
                    "the value of `stablehlo.constant` must be `dense<...>`",
                ));
            };
            let ty = match (d, dty) {
                (Some([t]), _) => t.clone(),
                (_, Some(t)) => t.clone(),
                _ => {
                    return Err(Error::invalid(
                        op.pos,
                        "`stablehlo.constant` needs a result type",
                    ));
                }
            };
            let value = to_literal(dense, &ty)?;
            let r = push(
                body,
                op,
                Op::Constant {
                    value: value.clone(),
                },
                args,
                Some(&[ty]),
            )?;
            body.consts.insert(r[0], value);
            return Ok(r);
        }
        "stablehlo.iota" | "stablehlo.dynamic_iota" => {
            let iota_dimension = need_int(op, &["iota_dimension", "dim"])?;
            return push(body, op, Op::Iota { iota_dimension }, &[], d);
        }
        "stablehlo.compare" => {
            let (v, p) = find(op, &["comparison_direction"])
                .ok_or_else(|| Error::invalid(op.pos, "`stablehlo.compare` needs a direction"))?;
            let comparison_direction = direction(v, p)?;
            if let Some((t, p)) = find(op, &["compare_type"]) {
                let s = match t {
                    AttrVal::Ident(s) | AttrVal::Enum(_, s) => s.as_str(),
                    _ => "",
                };
                match s {
                    "FLOAT" | "SIGNED" | "UNSIGNED" | "NOTYPE" => {}
                    "TOTALORDER" => {
                        let keys = crate::decompose::total_order_keys(body, op, args)?;
                        return push(
                            body,
                            op,
                            Op::Compare {
                                comparison_direction,
                            },
                            &keys,
                            d,
                        );
                    }
                    _ => {
                        return Err(Error::invalid(
                            p,
                            format!("bad comparison type {}", quote(s)),
                        ));
                    }
                }
            }
            Op::Compare {
                comparison_direction,
            }
        }
        "stablehlo.broadcast_in_dim" => Op::BroadcastInDim {
            broadcast_dimensions: need_ints(op, &["broadcast_dimensions", "dims"])?,
        },
        "stablehlo.dynamic_broadcast_in_dim" => {
            let broadcast_dimensions = need_ints(op, &["broadcast_dimensions", "dims"])?;
            return push(
                body,
                op,
                Op::BroadcastInDim {
                    broadcast_dimensions,
                },
                &args[..1.min(args.len())],
                d,
            );
        }
        "stablehlo.broadcast" => {
            let sizes = need_ints(op, &["broadcast_sizes", "sizes"])?;
            let rank = ty0(body)?.map_or(0, |t| t.rank());
            let k = sizes.len() as i64;
            Op::BroadcastInDim {
                broadcast_dimensions: (0..rank as i64).map(|i| i + k).collect(),
            }
        }
        "stablehlo.dynamic_reshape" => {
            return push(body, op, Op::Reshape {}, &args[..1.min(args.len())], d);
        }
        "stablehlo.transpose" => Op::Transpose {
            permutation: need_ints(op, &["permutation", "dims"])?,
        },
        "stablehlo.reverse" => Op::Reverse {
            dimensions: need_ints(op, &["dimensions", "dims"])?,
        },
        "stablehlo.concatenate" => Op::Concatenate {
            dimension: need_int(op, &["dimension", "dim"])?,
        },
        "stablehlo.slice" => match find(op, &["ranges"]) {
            Some((AttrVal::Ranges(r), _)) => Op::Slice {
                start_indices: r.iter().map(|x| x.0).collect(),
                limit_indices: r.iter().map(|x| x.1).collect(),
                strides: r.iter().map(|x| x.2).collect(),
            },
            _ => {
                let start_indices = need_ints(op, &["start_indices"])?;
                let limit_indices = need_ints(op, &["limit_indices"])?;
                let strides =
                    ints_attr(op, &["strides"])?.unwrap_or_else(|| vec![1; start_indices.len()]);
                Op::Slice {
                    start_indices,
                    limit_indices,
                    strides,
                }
            }
        },
        "stablehlo.dynamic_slice" => Op::DynamicSlice {
            slice_sizes: need_ints(op, &["slice_sizes", "sizes"])?,
        },
        "stablehlo.pad" => Op::Pad {
            edge_padding_low: need_ints(op, &["edge_padding_low", "low"])?,
            edge_padding_high: need_ints(op, &["edge_padding_high", "high"])?,
            interior_padding: need_ints(op, &["interior_padding", "interior"])?,
        },
        "stablehlo.dynamic_pad" => {
            let [x, v, lo, hi, int] = args else {
                return Err(Error::invalid(
                    op.pos,
                    "`stablehlo.dynamic_pad` takes 5 operands",
                ));
            };
            let kop = Op::Pad {
                edge_padding_low: const_ints(body, *lo, op, "low padding")?,
                edge_padding_high: const_ints(body, *hi, op, "high padding")?,
                interior_padding: const_ints(body, *int, op, "interior padding")?,
            };
            return push(body, op, kop, &[*x, *v], d);
        }
        "stablehlo.get_dimension_size" => {
            let dim = need_int(op, &["dimension", "dim"])?;
            let t = ty0(body)?.ok_or_else(|| {
                Error::invalid(op.pos, "`stablehlo.get_dimension_size` takes one operand")
            })?;
            let size = usize::try_from(dim)
                .ok()
                .and_then(|i| t.shape.get(i))
                .copied()
                .ok_or_else(|| {
                    Error::invalid(
                        op.pos,
                        format!("dimension {dim} is out of range for rank {}", t.rank()),
                    )
                })?;
            let value = Literal::i32([], vec![size as i32])
                .map_err(|e| Error::invalid(op.pos, e.to_string()))?;
            let r = push(
                body,
                op,
                Op::Constant {
                    value: value.clone(),
                },
                &[],
                d,
            )?;
            body.consts.insert(r[0], value);
            return Ok(r);
        }
        "stablehlo.reduce_precision" => {
            let (exponent_bits, mantissa_bits) = match find(op, &["format"]) {
                Some((AttrVal::Ident(f) | AttrVal::Enum(_, f), p)) => parse_format(f, p)?,
                _ => (
                    need_int(op, &["exponent_bits"])?,
                    need_int(op, &["mantissa_bits"])?,
                ),
            };
            Op::ReducePrecision {
                exponent_bits,
                mantissa_bits,
            }
        }
        "stablehlo.dot_general" => dot_general(op)?,
        "stablehlo.dot" => {
            let rank = ty0(body)?.map_or(0, |t| t.rank() as i64);
            Op::DotGeneral {
                lhs_batching_dimensions: vec![],
                rhs_batching_dimensions: vec![],
                lhs_contracting_dimensions: vec![rank - 1],
                rhs_contracting_dimensions: vec![0],
            }
        }
        "stablehlo.convolution" => {
            let kop = convolution(op, None)?;
            let operands = crate::decompose::widen_to_result(body, op, args, d)?;
            return push(body, op, kop, &operands, d);
        }
        "stablehlo.bitcast_convert" => Op::BitcastConvert {},
        "stablehlo.dynamic_conv" => {
            let [l, r, pad] = args else {
                return Err(Error::invalid(
                    op.pos,
                    "`stablehlo.dynamic_conv` takes 3 operands",
                ));
            };
            let p = const_ints(body, *pad, op, "padding")?;
            let kop = convolution(
                op,
                Some(
                    p.chunks(2)
                        .map(|c| (c[0], c.get(1).copied().unwrap_or(0)))
                        .collect(),
                ),
            )?;
            return push(body, op, kop, &[*l, *r], d);
        }
        "stablehlo.gather" | "stablehlo.dynamic_gather" => {
            let (fields, p) = struct_attr(op, "dimension_numbers")?;
            let (slice_sizes, operands) = if name == "stablehlo.gather" {
                (need_ints(op, &["slice_sizes"])?, args.to_vec())
            } else {
                let [x, i, s] = args else {
                    return Err(Error::invalid(
                        op.pos,
                        "`stablehlo.dynamic_gather` takes 3 operands",
                    ));
                };
                (const_ints(body, *s, op, "slice sizes")?, vec![*x, *i])
            };
            if operands.len() != 2 {
                return Err(Error::invalid(
                    op.pos,
                    "`stablehlo.gather` takes 2 operands",
                ));
            }
            let kop = Op::Gather {
                offset_dims: field_ints(fields, "offset_dims", p)?,
                collapsed_slice_dims: field_ints(fields, "collapsed_slice_dims", p)?,
                start_index_map: field_ints(fields, "start_index_map", p)?,
                index_vector_dim: index_vector_dim(fields, p)?,
                slice_sizes,
                operand_batching_dims: field_ints(fields, "operand_batching_dims", p)?,
                start_indices_batching_dims: field_ints(fields, "start_indices_batching_dims", p)?,
            };
            return push(body, op, kop, &operands, d);
        }
        "stablehlo.scatter" => {
            let [x, indices, updates] = args else {
                return Err(Error::unsupported(
                    op.pos,
                    "`stablehlo.scatter` of more than one operand",
                ));
            };
            let (fields, p) = struct_attr(op, "scatter_dimension_numbers")?;
            let kop = Op::Scatter {
                update_window_dims: field_ints(fields, "update_window_dims", p)?,
                inserted_window_dims: field_ints(fields, "inserted_window_dims", p)?,
                scatter_dims_to_operand_dims: field_ints(
                    fields,
                    "scatter_dims_to_operand_dims",
                    p,
                )?,
                index_vector_dim: index_vector_dim(fields, p)?,
                kind: combiner(op, one_region(op)?, true)?,
                input_batching_dims: field_ints(fields, "input_batching_dims", p)?,
                scatter_indices_batching_dims: field_ints(
                    fields,
                    "scatter_indices_batching_dims",
                    p,
                )?,
            };
            return push(body, op, kop, &[*x, *indices, *updates], d);
        }
        "stablehlo.reduce" => {
            if args.len() != 2 {
                return Err(Error::unsupported(
                    op.pos,
                    "`stablehlo.reduce` of more than one operand",
                ));
            }
            let kind = match find(op, &["applies"]) {
                Some((AttrVal::Ident(n) | AttrVal::Enum(_, n), p)) => combiner_named(n)
                    .ok_or_else(|| Error::unsupported(p, format!("a reduction by {}", quote(n))))?,
                _ => combiner(op, one_region(op)?, false)?,
            };
            Op::Reduce {
                dimensions: need_ints(op, &["dimensions"])?,
                kind,
            }
        }
        "stablehlo.reduce_window" => {
            let w = window_attrs(op)?;
            Op::ReduceWindow {
                window_dimensions: w.dims,
                window_strides: w.strides,
                base_dilations: w.base_dilations,
                window_dilations: w.window_dilations,
                padding: w.padding,
                kind: combiner(op, one_region(op)?, false)?,
            }
        }
        "stablehlo.select_and_scatter" => {
            let [sel, sc] = &op.regions[..] else {
                return Err(Error::invalid(
                    op.pos,
                    "`stablehlo.select_and_scatter` has 2 regions",
                ));
            };
            let window_dimensions = need_ints(op, &["window_dimensions"])?;
            let n = window_dimensions.len();
            Op::SelectAndScatter {
                window_strides: ints_attr(op, &["window_strides"])?.unwrap_or_else(|| vec![1; n]),
                padding: match find(op, &["padding"]) {
                    Some((v, p)) => pairs_of(v, p, "padding")?,
                    None => vec![(0, 0); n],
                },
                select: select_direction(op, sel)?,
                kind: combiner(op, sc, false)?,
                window_dimensions,
            }
        }
        "stablehlo.rng_bit_generator" => {
            let s = match find(op, &["rng_algorithm", "algorithm"]) {
                Some((AttrVal::Ident(s) | AttrVal::Enum(_, s), _)) => s.as_str(),
                _ => "DEFAULT",
            };
            if !matches!(s, "THREE_FRY" | "DEFAULT") {
                return Err(Error::unsupported(
                    op.pos,
                    format!("the random bit algorithm {}", quote(s)),
                ));
            }
            Op::RngBitGenerator {
                algorithm: RngAlgorithm::ThreeFry,
            }
        }
        "chlo.erf" => Op::Erf {},
        "stablehlo.cholesky" => Op::Cholesky {
            lower: crate::decompose::flag(op, "lower")?,
        },
        "stablehlo.fft" => Op::Fft {
            fft_type: match find(op, &["fft_type", "type"]) {
                Some((AttrVal::Enum(_, v) | AttrVal::Ident(v), p)) => FftType::ALL
                    .iter()
                    .copied()
                    .find(|t| t.name() == v)
                    .ok_or_else(|| {
                        Error::invalid(p, format!("bad `fft_type` value {}", quote(v)))
                    })?,
                Some((_, p)) => return Err(Error::invalid(p, "bad `fft_type`")),
                None => {
                    return Err(Error::invalid(
                        op.pos,
                        "`stablehlo.fft` needs the attribute `fft_type`",
                    ));
                }
            },
            fft_length: need_ints(op, &["fft_length", "length"])?,
        },
        "stablehlo.triangular_solve" => Op::TriangularSolve {
            left_side: crate::decompose::flag(op, "left_side")?,
            lower: crate::decompose::flag(op, "lower")?,
            unit_diagonal: crate::decompose::flag(op, "unit_diagonal")?,
            transpose_a: match op.attr("transpose_a") {
                None => TransposeA::NoTranspose,
                Some((AttrVal::Enum(_, v) | AttrVal::Ident(v), p)) => TransposeA::ALL
                    .iter()
                    .copied()
                    .find(|t| t.name() == v)
                    .ok_or_else(|| {
                        Error::invalid(p, format!("bad `transpose_a` value {}", quote(v)))
                    })?,
                Some((_, p)) => return Err(Error::invalid(p, "bad `transpose_a`")),
            },
        },
        "chlo.mulhi" => return crate::decompose::mulhi(body, op, args),
        n if crate::chlo::handles(n) => return crate::chlo::lower(body, op, args),
        n if crate::special::handles(n) => return crate::special::lower(body, op, args),
        "chlo.next_after" => return crate::next_after::lower(body, op, args),
        "chlo.top_k" => return crate::top_k::lower(body, op, args),
        "chlo.ragged_dot" => return crate::ragged::ragged_dot(body, op, args, d),
        // Sharding annotations: on one device, the value they annotate.
        "sdy.sharding_constraint" | "sdy.reshard" => return sharding_identity(body, op, args, d),
        "stablehlo.custom_call" => {
            let target = match find(op, &["call_target_name", "callee"]) {
                Some((AttrVal::Str(s) | AttrVal::Symbol(s), _)) => s.clone(),
                _ => String::from("?"),
            };
            if target == "Sharding" {
                return sharding_identity(body, op, args, d);
            }
            return Err(Error::unsupported(
                op.pos,
                format!("`stablehlo.custom_call` to {}", quote(&target)),
            ));
        }
        _ => plain(op)?,
    };
    push(body, op, kop, args, d)
}

/// A sharding annotation (`sdy.sharding_constraint`, `sdy.reshard`, `custom_call @Sharding`):
/// its one operand, which must have the declared result type.
fn sharding_identity(
    body: &Body,
    op: &OpAst,
    args: &[ValueId],
    declared: Option<&[TensorType]>,
) -> Result<Vec<ValueId>> {
    let [x] = args else {
        return Err(Error::invalid(
            op.pos,
            format!("`{}` annotates one value", op.name),
        ));
    };
    if let Some([t]) = declared
        && *t != value_type(body, *x)?
    {
        return Err(Error::invalid(
            op.pos,
            format!("`{}` must not change its operand's type", op.name),
        ));
    }
    Ok(vec![*x])
}

/// An op with no attributes whose kiln name is its StableHLO name.
fn plain(op: &OpAst) -> Result<Op> {
    let unsupported = || {
        Error::unsupported(
            op.pos,
            format!("the op {} (kiln has no such op)", quote(&op.name)),
        )
    };
    let kind = op
        .name
        .strip_prefix("stablehlo.")
        .and_then(OpKind::from_mnemonic)
        .ok_or_else(unsupported)?;
    if !kind.attr_names().is_empty() || kind.props().contains(Props::CONTROL) {
        return Err(unsupported());
    }
    Op::from_attrs(kind, &[], &AttrCtx { result_types: &[] }).map_err(|e| Error::invalid(op.pos, e))
}

/// `e5m10` → (5, 10).
fn parse_format(f: &str, pos: Pos) -> Result<(i64, i64)> {
    let bad = || {
        Error::invalid(
            pos,
            format!("bad float format {} (expected `eXmY`)", quote(f)),
        )
    };
    let rest = f.strip_prefix('e').ok_or_else(bad)?;
    let (e, m) = rest.split_once('m').ok_or_else(bad)?;
    Ok((e.parse().map_err(|_| bad())?, m.parse().map_err(|_| bad())?))
}

/// `dot_general` from the pretty `batching_dims = [..] x [..]` or the generic
/// `#stablehlo.dot<...>`.
fn dot_general(op: &OpAst) -> Result<Op> {
    if let Some((AttrVal::Struct(_, f), p)) = op.attr("dot_dimension_numbers") {
        return Ok(Op::DotGeneral {
            lhs_batching_dimensions: field_ints(f, "lhs_batching_dimensions", p)?,
            rhs_batching_dimensions: field_ints(f, "rhs_batching_dimensions", p)?,
            lhs_contracting_dimensions: field_ints(f, "lhs_contracting_dimensions", p)?,
            rhs_contracting_dimensions: field_ints(f, "rhs_contracting_dimensions", p)?,
        });
    }
    let pair = |n: &str| -> Result<(Vec<i64>, Vec<i64>)> {
        match op.attr(n) {
            None => Ok((vec![], vec![])),
            Some((AttrVal::Pair(a, b), p)) => Ok((ints_of(a, p, n)?, ints_of(b, p, n)?)),
            Some((_, p)) => Err(Error::invalid(p, format!("`{n}` must be `[..] x [..]`"))),
        }
    };
    let (lb, rb) = pair("batching_dims")?;
    let (lc, rc) = pair("contracting_dims")?;
    if op.attr("contracting_dims").is_none() {
        return Err(Error::invalid(
            op.pos,
            "`stablehlo.dot_general` needs `contracting_dims`",
        ));
    }
    Ok(Op::DotGeneral {
        lhs_batching_dimensions: lb,
        rhs_batching_dimensions: rb,
        lhs_contracting_dimensions: lc,
        rhs_contracting_dimensions: rc,
    })
}

/// `convolution` from the pretty (`dim_numbers`, `window = {...}`) or the generic form;
/// `padding` overrides the written padding (`dynamic_conv`).
fn convolution(op: &OpAst, padding: Option<Vec<(i64, i64)>>) -> Result<Op> {
    let dims: &ConvDims = match find(op, &["dimension_numbers", "dim_numbers"]) {
        Some((AttrVal::ConvDims(c), _)) => c,
        Some((_, p)) => return Err(Error::invalid(p, "bad convolution dimension numbers")),
        None => {
            return Err(Error::invalid(
                op.pos,
                "`stablehlo.convolution` needs dimension numbers",
            ));
        }
    };
    let n = dims.input_spatial.len();
    if dims.kernel_spatial.len() != n || dims.output_spatial.len() != n {
        return Err(Error::invalid(
            op.pos,
            "convolution layouts with different numbers of spatial dimensions",
        ));
    }
    let window: &[(String, AttrVal)] = match op.attr("window") {
        Some((AttrVal::Struct(_, f), _)) => f,
        _ => &[],
    };
    let get = |pretty: &str, generic: &str| -> Result<Option<Vec<i64>>> {
        match field(window, pretty) {
            Some(v) => ints_of(v, op.pos, pretty).map(Some),
            None => ints_attr(op, &[generic]),
        }
    };
    if let Some(rev) = get("reverse", "window_reversal")?
        && rev.iter().any(|&r| r != 0)
    {
        return Err(Error::unsupported(
            op.pos,
            "`stablehlo.convolution` with window reversal",
        ));
    }
    let padding = match padding {
        Some(p) => p,
        None => match field(window, "pad") {
            Some(v) => pairs_of(v, op.pos, "pad")?,
            None => match find(op, &["padding"]) {
                Some((v, p)) => pairs_of(v, p, "padding")?,
                None => vec![(0, 0); n],
            },
        },
    };
    let cat = |a: i64, b: i64, rest: &[i64]| -> Vec<i64> {
        [a, b].into_iter().chain(rest.iter().copied()).collect()
    };
    Ok(Op::Convolution {
        window_strides: get("stride", "window_strides")?.unwrap_or_else(|| vec![1; n]),
        padding,
        lhs_dilation: get("lhs_dilate", "lhs_dilation")?.unwrap_or_else(|| vec![1; n]),
        rhs_dilation: get("rhs_dilate", "rhs_dilation")?.unwrap_or_else(|| vec![1; n]),
        feature_group_count: int_attr(op, &["feature_group_count"])?.unwrap_or(1),
        input_dims: cat(dims.input_batch, dims.input_feature, &dims.input_spatial),
        kernel_dims: cat(
            dims.kernel_output_feature,
            dims.kernel_input_feature,
            &dims.kernel_spatial,
        ),
        output_dims: cat(dims.output_batch, dims.output_feature, &dims.output_spatial),
        batch_group_count: int_attr(op, &["batch_group_count"])?.unwrap_or(1),
    })
}
