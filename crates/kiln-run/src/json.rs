//! The JSON forms of what an artifact was lowered with: the target ([`TargetInfo`], every
//! field) and the switches that change what the pipeline decides ([`Options`]). Reading takes
//! every field by name, so a manifest missing one (or written by a kiln with other fields) is
//! an error naming it, not a silent default.

use kiln_kernel::options::{CpuOptions, MatmulPrecision};
use kiln_kernel::target::{
    AttentionTile, FusionLimits, GemmLimits, GemmTile, Gpu, LoopLimits, SplitLimits, SumTree,
    TailTiles, TallTile, TilePrefetch,
};
use kiln_kernel::{Options, TargetInfo};
use serde_json::{Value, json};

/// A JSON object's fields, read by name with errors naming the path.
struct Obj<'a> {
    path: String,
    v: &'a Value,
}

impl<'a> Obj<'a> {
    fn new(path: &str, v: &'a Value) -> Result<Obj<'a>, String> {
        if v.is_object() {
            Ok(Obj {
                path: path.to_string(),
                v,
            })
        } else {
            Err(format!("`{path}` is not a JSON object"))
        }
    }
    fn get(&self, k: &str) -> Result<&'a Value, String> {
        self.v
            .get(k)
            .ok_or_else(|| format!("`{}` has no field `{k}`", self.path))
    }
    fn obj(&self, k: &str) -> Result<Obj<'a>, String> {
        Obj::new(&format!("{}.{k}", self.path), self.get(k)?)
    }
    /// Field `k` as an object, or `None` where it is absent or null (an artifact written
    /// before the field, or one that has none).
    fn obj_or_none(&self, k: &str) -> Result<Option<Obj<'a>>, String> {
        match self.v.get(k) {
            None | Some(Value::Null) => Ok(None),
            Some(_) => self.obj(k).map(Some),
        }
    }
    fn usize(&self, k: &str) -> Result<usize, String> {
        self.get(k)?
            .as_u64()
            .map(|n| n as usize)
            .ok_or_else(|| format!("`{}.{k}` is not a non-negative integer", self.path))
    }
    fn i64(&self, k: &str) -> Result<i64, String> {
        self.get(k)?
            .as_i64()
            .ok_or_else(|| format!("`{}.{k}` is not an integer", self.path))
    }
    /// Field `k` as an integer, or `missing` for an artifact written before the field.
    fn i64_or(&self, k: &str, missing: i64) -> Result<i64, String> {
        match self.v.get(k) {
            None | Some(Value::Null) => Ok(missing),
            Some(_) => self.i64(k),
        }
    }
    fn bool_or(&self, k: &str, missing: bool) -> Result<bool, String> {
        match self.v.get(k) {
            None | Some(Value::Null) => Ok(missing),
            Some(_) => self.bool(k),
        }
    }
    fn f64(&self, k: &str) -> Result<f64, String> {
        self.get(k)?
            .as_f64()
            .ok_or_else(|| format!("`{}.{k}` is not a number", self.path))
    }
    fn bool(&self, k: &str) -> Result<bool, String> {
        self.get(k)?
            .as_bool()
            .ok_or_else(|| format!("`{}.{k}` is not true or false", self.path))
    }
}

/// `t` as JSON, every field.
pub fn target_to_json(t: &TargetInfo) -> Value {
    json!({
        "vector_bytes": t.vector_bytes,
        "threads": t.threads,
        "ghz": t.ghz,
        "memory_gbps": t.memory_gbps,
        "cache_line": t.cache_line,
        "l1_bytes": t.l1_bytes,
        "l2_bytes": t.l2_bytes,
        "llc_bytes": t.llc_bytes,
        "nontemporal_stores": t.nontemporal_stores,
        "fusion": {
            "row_epilogue": t.fusion.row_epilogue,
            "chain_k": t.fusion.chain_k,
            "chain_row": t.fusion.chain_row,
            "winograd_min_features": t.fusion.winograd_min_features,
            "fft_half_min": t.fusion.fft_half_min,
            "fft_direct_max": t.fusion.fft_direct_max,
            "strided_operands": t.fusion.strided_operands,
            "zero_steps": t.fusion.zero_steps,
            "unread_blocks": t.fusion.unread_blocks,
        },
        "loops": {
            "stream_bytes": t.loops.stream_bytes,
            "stream_row_lines": t.loops.stream_row_lines,
            "transpose_tile": t.loops.transpose_tile,
            "guard_cuts": t.loops.guard_cuts,
            "row_guard_cuts": t.loops.row_guard_cuts,
            "row_cache_bytes": t.loops.row_cache_bytes,
            "strip": t.loops.strip,
            "strip_vectors": t.loops.strip_vectors,
            "wide_strip_rows": t.loops.wide_strip_rows,
        },
        "sums": { "leaf": t.sums.leaf, "fanout": t.sums.fanout },
        "gemm": {
            "a_block_bytes": t.gemm.a_block_bytes,
            "b_block_bytes": t.gemm.b_block_bytes,
            "chain_block_bytes": t.gemm.chain_block_bytes,
            "kc_256": t.gemm.kc_256,
            "kc_512": t.gemm.kc_512,
            "a_in_place_panels": t.gemm.a_in_place_panels,
            "a_in_place_panels_rows": t.gemm.a_in_place_panels_rows,
            "tall_512": t.gemm.tall_512.map(|t| json!({
                "rows": t.rows,
                "min_columns": t.min_columns,
                "min_steps": t.min_steps,
                "prefetch": { "b_steps": t.prefetch.b_steps, "a_steps": t.prefetch.a_steps },
            })),
            "stream_rows": t.gemm.stream_rows,
            "stream_tile_rows": t.gemm.stream_tile_rows,
            "stream_steps": t.gemm.stream_steps,
            "stream_block_bytes": t.gemm.stream_block_bytes,
            "tail_tiles": {
                "rows": t.gemm.tail_tiles.rows,
                "count": t.gemm.tail_tiles.count,
            },
            "c_ahead": t.gemm.c_ahead,
        },
        "splits": {
            "parallel_work": t.splits.parallel_work,
            "concurrent_work": t.splits.concurrent_work,
        },
        "gpu": t.gpu.as_ref().map(gpu_to_json),
    })
}

/// The GPU's data as JSON (in two parts: one `json!` of every field passes the macro's
/// recursion limit).
fn gpu_to_json(g: &Gpu) -> Value {
    let mut v = json!({
        "warp_size": g.warp_size,
        "shared_memory_per_block": g.shared_memory_per_block,
        "static_shared_bytes": g.static_shared_bytes,
        "dynamic_shared_bytes": g.dynamic_shared_bytes,
        "tile_dynamic_bytes": g.tile_dynamic_bytes,
        "sms": g.sms,
        "tensor_core_shapes": g.tensor_core_shapes.iter().map(|&(m, n, k)| json!([m, n, k])).collect::<Vec<_>>(),
        "max_threads_per_block": g.max_threads_per_block,
        "elementwise_block": g.elementwise_block,
        "vector_bytes": g.vector_bytes,
        "blocks_per_sm": g.blocks_per_sm,
        "warp_reduce_min": g.warp_reduce_min,
        "block_reduce_min": g.block_reduce_min,
    });
    let rest = json!({
        "row_registers": g.row_registers,
        "row_shared_bytes": g.row_shared_bytes,
        "gemm_tiles": tiles_to_json(&g.gemm_tiles),
        "gemm_stages": g.gemm_stages,
        "mma_tiles": tiles_to_json(&g.mma_tiles),
        "mma_stages": g.mma_stages,
        "mma_swizzle": g.mma_swizzle,
        "tf32": g.tf32,
        "wgmma": g.wgmma,
        "wgmma_tiles": tiles_to_json(&g.wgmma_tiles),
        "wgmma_tma": g.wgmma_tma,
        "wgmma_tma_inline": g.wgmma_tma_inline,
        "attention_warps": g.attention_warps,
        "attention_tiles": attention_tiles_to_json(&g.attention_tiles),
        "mma_attention": mma_attention_to_json(g),
    });
    if let (Some(o), Value::Object(r)) = (v.as_object_mut(), rest) {
        o.extend(r);
    }
    v
}

fn tiles_to_json(tiles: &[GemmTile]) -> Value {
    Value::Array(
        tiles
            .iter()
            .map(|t| json!({"m": t.m, "n": t.n, "k": t.k, "thread_m": t.thread_m, "thread_n": t.thread_n}))
            .collect(),
    )
}

fn tiles_from_json(path: &str, v: &Value) -> Result<Vec<GemmTile>, String> {
    v.as_array()
        .ok_or_else(|| format!("`{path}` is not a list"))?
        .iter()
        .map(|t| {
            let t = Obj::new(path, t)?;
            Ok(GemmTile {
                m: t.usize("m")?,
                n: t.usize("n")?,
                k: t.usize("k")?,
                thread_m: t.usize("thread_m")?,
                thread_n: t.usize("thread_n")?,
            })
        })
        .collect()
}

/// Attention on the tensor cores: keys per step, warps, stages of the ring.
fn mma_attention_to_json(g: &Gpu) -> Value {
    json!({
        "keys": g.mma_attention_keys,
        "warps": g.mma_attention_warps,
        "stages": g.mma_attention_stages,
    })
}

fn attention_tiles_to_json(tiles: &[AttentionTile]) -> Value {
    Value::Array(
        tiles
            .iter()
            .map(|t| {
                json!({
                    "rows": t.rows,
                    "keys": t.keys,
                    "thread_rows": t.thread_rows,
                    "thread_keys": t.thread_keys,
                    "thread_cols": t.thread_cols,
                })
            })
            .collect(),
    )
}

fn attention_tiles_from_json(v: &Value) -> Result<Vec<AttentionTile>, String> {
    let path = "target.info.gpu.attention_tiles";
    v.as_array()
        .ok_or_else(|| format!("`{path}` is not a list"))?
        .iter()
        .map(|t| {
            let t = Obj::new(path, t)?;
            Ok(AttentionTile {
                rows: t.usize("rows")?,
                keys: t.usize("keys")?,
                thread_rows: t.usize("thread_rows")?,
                thread_keys: t.usize("thread_keys")?,
                thread_cols: t.usize("thread_cols")?,
            })
        })
        .collect()
}

fn shape3(path: &str, v: &Value) -> Result<(usize, usize, usize), String> {
    let bad = || format!("`{path}` holds something other than [m, n, k] triples");
    let a = v.as_array().ok_or_else(bad)?;
    let n = |i: usize| {
        a.get(i)
            .and_then(Value::as_u64)
            .map(|x| x as usize)
            .ok_or_else(bad)
    };
    if a.len() != 3 {
        return Err(bad());
    }
    Ok((n(0)?, n(1)?, n(2)?))
}

/// The target a manifest's `target.info` describes.
pub fn target_from_json(v: &Value) -> Result<TargetInfo, String> {
    let o = Obj::new("target.info", v)?;
    let fusion = o.obj("fusion")?;
    let loops = o.obj("loops")?;
    let sums = o.obj("sums")?;
    let gemm = o.obj("gemm")?;
    let splits = o.obj("splits")?;
    let gpu = match o.get("gpu")? {
        Value::Null => None,
        g => {
            let g = Obj::new("target.info.gpu", g)?;
            let shapes = g
                .get("tensor_core_shapes")?
                .as_array()
                .ok_or("`target.info.gpu.tensor_core_shapes` is not a list")?
                .iter()
                .map(|s| shape3("target.info.gpu.tensor_core_shapes", s))
                .collect::<Result<Vec<_>, _>>()?;
            Some(Gpu {
                warp_size: g.usize("warp_size")?,
                shared_memory_per_block: g.usize("shared_memory_per_block")?,
                static_shared_bytes: g.usize("static_shared_bytes")?,
                dynamic_shared_bytes: g.usize("dynamic_shared_bytes")?,
                tile_dynamic_bytes: g.usize("tile_dynamic_bytes")?,
                sms: g.usize("sms")?,
                tensor_core_shapes: shapes,
                max_threads_per_block: g.usize("max_threads_per_block")?,
                elementwise_block: g.usize("elementwise_block")?,
                vector_bytes: g.usize("vector_bytes")?,
                blocks_per_sm: g.usize("blocks_per_sm")?,
                warp_reduce_min: g.usize("warp_reduce_min")?,
                block_reduce_min: g.usize("block_reduce_min")?,
                row_registers: g.usize("row_registers")?,
                row_shared_bytes: g.usize("row_shared_bytes")?,
                gemm_tiles: tiles_from_json("target.info.gpu.gemm_tiles", g.get("gemm_tiles")?)?,
                gemm_stages: g.usize("gemm_stages")?,
                mma_tiles: tiles_from_json("target.info.gpu.mma_tiles", g.get("mma_tiles")?)?,
                mma_stages: g.usize("mma_stages")?,
                mma_swizzle: g.bool("mma_swizzle")?,
                tf32: g.bool("tf32")?,
                // Absent from manifests written before warpgroup products: none.
                wgmma: g
                    .get("wgmma")
                    .ok()
                    .and_then(Value::as_bool)
                    .unwrap_or(false),
                wgmma_tiles: match g.get("wgmma_tiles") {
                    Ok(v) => tiles_from_json("target.info.gpu.wgmma_tiles", v)?,
                    Err(_) => Vec::new(),
                },
                // Absent from manifests written before TMA loads: off.
                wgmma_tma: g
                    .get("wgmma_tma")
                    .ok()
                    .and_then(Value::as_bool)
                    .unwrap_or(false),
                wgmma_tma_inline: g
                    .get("wgmma_tma_inline")
                    .ok()
                    .and_then(Value::as_bool)
                    .unwrap_or(false),
                attention_warps: g
                    .get("attention_warps")?
                    .as_array()
                    .and_then(|a| a.iter().map(|w| w.as_u64().map(|w| w as usize)).collect())
                    .ok_or("`target.info.gpu.attention_warps` is not a list of counts")?,
                attention_tiles: attention_tiles_from_json(g.get("attention_tiles")?)?,
                mma_attention_keys: g.obj("mma_attention")?.usize("keys")?,
                mma_attention_warps: g.obj("mma_attention")?.usize("warps")?,
                mma_attention_stages: g.obj("mma_attention")?.usize("stages")?,
            })
        }
    };
    Ok(TargetInfo {
        vector_bytes: o.usize("vector_bytes")?,
        threads: o.usize("threads")?,
        ghz: o.f64("ghz")?,
        memory_gbps: o.f64("memory_gbps")?,
        cache_line: o.usize("cache_line")?,
        l1_bytes: o.usize("l1_bytes")?,
        l2_bytes: o.usize("l2_bytes")?,
        llc_bytes: o.usize("llc_bytes")?,
        nontemporal_stores: o.bool("nontemporal_stores")?,
        fusion: FusionLimits {
            row_epilogue: fusion.usize("row_epilogue")?,
            chain_k: fusion.usize("chain_k")?,
            chain_row: fusion.usize("chain_row")?,
            winograd_min_features: fusion.usize("winograd_min_features")?,
            fft_half_min: fusion.usize("fft_half_min")?,
            fft_direct_max: fusion.usize("fft_direct_max")?,
            strided_operands: fusion.bool("strided_operands")?,
            zero_steps: fusion.bool("zero_steps")?,
            unread_blocks: fusion.bool("unread_blocks")?,
        },
        loops: LoopLimits {
            stream_bytes: loops.usize("stream_bytes")?,
            stream_row_lines: loops.usize("stream_row_lines")?,
            transpose_tile: loops.usize("transpose_tile")?,
            guard_cuts: loops.usize("guard_cuts")?,
            row_guard_cuts: loops.usize("row_guard_cuts")?,
            row_cache_bytes: loops.usize("row_cache_bytes")?,
            strip: loops.usize("strip")?,
            strip_vectors: loops.usize("strip_vectors")?,
            wide_strip_rows: loops.usize("wide_strip_rows")?,
        },
        sums: SumTree {
            leaf: sums.usize("leaf")?,
            fanout: sums.usize("fanout")?,
        },
        gemm: GemmLimits {
            a_block_bytes: gemm.i64("a_block_bytes")?,
            b_block_bytes: gemm.i64("b_block_bytes")?,
            chain_block_bytes: gemm.i64("chain_block_bytes")?,
            kc_256: gemm.i64("kc_256")?,
            kc_512: gemm.i64("kc_512")?,
            a_in_place_panels: gemm.i64("a_in_place_panels")?,
            a_in_place_panels_rows: gemm.i64("a_in_place_panels_rows")?,
            // Artifacts written before the field held the reference blocks: none.
            tall_512: match gemm.obj_or_none("tall_512")? {
                None => None,
                Some(t) => Some(TallTile {
                    rows: t.i64("rows")?,
                    min_columns: t.usize("min_columns")?,
                    // Artifacts written before the field: the tall tile at any length.
                    min_steps: match t.v.get("min_steps") {
                        None | Some(Value::Null) => 0,
                        Some(_) => t.usize("min_steps")?,
                    },
                    // Artifacts written before the field: no prefetches.
                    prefetch: match t.obj_or_none("prefetch")? {
                        None => TilePrefetch::default(),
                        Some(p) => TilePrefetch {
                            b_steps: p.i64("b_steps")?,
                            a_steps: p.i64("a_steps")?,
                        },
                    },
                }),
            },
            // Artifacts written before the fields: every product packs B.
            stream_rows: gemm.i64_or("stream_rows", 0)?,
            stream_tile_rows: gemm.i64_or("stream_tile_rows", 0)?,
            stream_steps: gemm.i64_or("stream_steps", 0)?,
            stream_block_bytes: gemm.i64_or("stream_block_bytes", 0)?,
            // Artifacts written before the field: every tile runs whole.
            tail_tiles: match gemm.obj_or_none("tail_tiles")? {
                None => TailTiles::default(),
                Some(t) => TailTiles {
                    rows: t.i64("rows")?,
                    count: t.i64("count")?,
                },
            },
            // Artifacts written before the field: no tile asks for C ahead.
            c_ahead: gemm.bool_or("c_ahead", false)?,
        },
        splits: SplitLimits {
            parallel_work: splits.usize("parallel_work")?,
            concurrent_work: splits.usize("concurrent_work")?,
        },
        gpu,
    })
}

/// The switches of `o` that change what the pipeline decides (the rest, a kernel cache and
/// reports, do not travel with an artifact).
pub fn options_to_json(o: &Options) -> Value {
    json!({
        "optimize": o.optimize,
        "fast_math": o.fast_math,
        "fusion": o.fusion,
        "memory_schedule": o.memory_schedule,
        "winograd": o.winograd,
        "chain_products": o.chain_products,
        "band_sums": o.band_sums,
        "matmul_precision": o.matmul_precision.name(),
        "float_atomics": o.float_atomics,
        "cpu": {
            "streaming_stores": o.cpu.streaming_stores,
            "guard_splits": o.cpu.guard_splits,
            "row_caches": o.cpu.row_caches,
            "gemm_unroll": o.cpu.gemm_unroll,
            "narrow_vectors": o.cpu.narrow_vectors,
        },
    })
}

/// The options a manifest's `options` give (no kernel cache, no reports).
pub fn options_from_json(v: &Value) -> Result<Options, String> {
    let o = Obj::new("options", v)?;
    let cpu = o.obj("cpu")?;
    Ok(Options {
        optimize: o.bool("optimize")?,
        fast_math: o.bool("fast_math")?,
        fusion: o.bool("fusion")?,
        memory_schedule: o.bool("memory_schedule")?,
        winograd: o.bool("winograd")?,
        chain_products: o.bool("chain_products")?,
        // On in a manifest written before the switch existed (its compiles had no bands, but
        // a manifest's options only steer new compiles).
        band_sums: o.bool_or("band_sums", true)?,
        matmul_precision: {
            let name = o.get("matmul_precision")?;
            name.as_str()
                .and_then(MatmulPrecision::from_name)
                .ok_or_else(|| {
                    format!("`options.matmul_precision` is not `highest` or `tf32`: {name}")
                })?
        },
        // Off in a manifest written before the switch existed.
        float_atomics: o.bool_or("float_atomics", false)?,
        cpu: CpuOptions {
            streaming_stores: cpu.bool("streaming_stores")?,
            guard_splits: cpu.bool("guard_splits")?,
            row_caches: cpu.bool("row_caches")?,
            gemm_unroll: cpu.bool("gemm_unroll")?,
            narrow_vectors: cpu.bool("narrow_vectors")?,
            // The CPU an artifact was compiled for is its target's (`target.cpu`).
            machine: None,
        },
        ..Options::default()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets_and_options_round_trip() {
        let mut t = TargetInfo::h200();
        t.gpu.as_mut().unwrap().shared_memory_per_block = 48 << 10;
        assert_eq!(target_from_json(&target_to_json(&t)).unwrap(), t);
        let r = TargetInfo::reference();
        assert_eq!(target_from_json(&target_to_json(&r)).unwrap(), r);
        // An Intel host's tall 512-bit tiles.
        let x = TargetInfo {
            vector_bytes: 64,
            gemm: GemmLimits::two_fma512_ports(),
            ..TargetInfo::reference()
        };
        assert_eq!(target_to_json(&x)["gemm"]["tall_512"]["rows"], 14);
        assert_eq!(target_from_json(&target_to_json(&x)).unwrap(), x);
        assert_eq!(
            target_to_json(&x)["gemm"]["tall_512"]["prefetch"]["b_steps"],
            8
        );
        // An artifact written before products streamed B: none does.
        let mut older = target_to_json(&r);
        let gemm = older["gemm"].as_object_mut().unwrap();
        for f in [
            "stream_rows",
            "stream_tile_rows",
            "stream_steps",
            "stream_block_bytes",
        ] {
            assert!(gemm.remove(f).is_some(), "{f}");
        }
        assert_eq!(target_from_json(&older).unwrap().gemm.stream_rows, 0);
        // An artifact written before the tail tiles: none.
        assert_eq!(target_to_json(&r)["gemm"]["tail_tiles"]["rows"], 4);
        let mut older = target_to_json(&r);
        older["gemm"].as_object_mut().unwrap().remove("tail_tiles");
        assert_eq!(
            target_from_json(&older).unwrap().gemm.tail_tiles,
            TailTiles::default()
        );
        // An artifact written before the tiles asked for C ahead: none does.
        assert_eq!(target_to_json(&x)["gemm"]["c_ahead"], true);
        let mut older = target_to_json(&x);
        older["gemm"].as_object_mut().unwrap().remove("c_ahead");
        assert!(!target_from_json(&older).unwrap().gemm.c_ahead);
        // An artifact written before the tall tile's prefetches: none.
        let mut older = target_to_json(&x);
        older["gemm"]["tall_512"]
            .as_object_mut()
            .unwrap()
            .remove("prefetch");
        let none = target_from_json(&older).unwrap();
        assert_eq!(
            none.gemm.tall_512.unwrap().prefetch,
            TilePrefetch::default()
        );
        // An artifact written before the tall tile's shortest contraction: any length.
        assert_eq!(target_to_json(&x)["gemm"]["tall_512"]["min_steps"], 256);
        let mut older = target_to_json(&x);
        older["gemm"]["tall_512"]
            .as_object_mut()
            .unwrap()
            .remove("min_steps");
        assert_eq!(
            target_from_json(&older)
                .unwrap()
                .gemm
                .tall_512
                .unwrap()
                .min_steps,
            0
        );
        // An artifact written before the field: the reference blocks.
        let mut old = target_to_json(&r);
        old["gemm"].as_object_mut().unwrap().remove("tall_512");
        assert_eq!(target_from_json(&old).unwrap(), r);
        // An A100's opt-in limit, rings and tiles allowed dynamic shared memory.
        let g = t.gpu.as_mut().unwrap();
        (g.dynamic_shared_bytes, g.tile_dynamic_bytes) = (163 << 10, 160 << 10);
        let v = target_to_json(&t);
        assert_eq!(v["gpu"]["dynamic_shared_bytes"], 166912);
        assert_eq!(target_from_json(&v).unwrap(), t);
        let o = Options {
            fast_math: true,
            matmul_precision: MatmulPrecision::Tf32,
            float_atomics: true,
            cpu: CpuOptions {
                row_caches: false,
                ..CpuOptions::default()
            },
            ..Options::default()
        };
        assert_eq!(options_from_json(&options_to_json(&o)).unwrap(), o);
    }

    #[test]
    fn a_missing_field_is_named() {
        let mut v = target_to_json(&TargetInfo::h200());
        v["gpu"].as_object_mut().unwrap().remove("sms");
        let e = target_from_json(&v).unwrap_err();
        assert!(e.contains("target.info.gpu") && e.contains("sms"), "{e}");
    }
}
