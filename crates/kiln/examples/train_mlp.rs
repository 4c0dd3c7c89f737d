//! Trains a two-layer MLP classifier on a synthetic two-moons dataset, end to end.
//!
//! The whole training step (forward pass, backward pass, SGD update) is one kiln IR function,
//! built with the IR builder and run by the reference interpreter. The backward pass is
//! derived by hand here; `kiln::grad` derives it from the forward pass once autodiff lands.

use kiln::ir::random::Rng;
use kiln::ir::{
    Builder, Combiner, ComparisonDirection, DType, Func, Literal, Op, TensorType, ValueId,
};

const N: usize = 256;
const H: usize = 16;
const STEPS: usize = 400;
const LR: f32 = 0.5;

/// Small helpers over the builder, for readability.
struct G(Builder);

impl G {
    fn t(&self, v: ValueId) -> TensorType {
        self.0.ty(v).expect("defined").clone()
    }
    fn op(&mut self, op: Op, xs: &[ValueId]) -> ValueId {
        self.0.inst(op, xs).expect("well-typed step")
    }
    fn scalar(&mut self, x: f32) -> ValueId {
        self.op(
            Op::Constant {
                value: Literal::f32([], vec![x]).unwrap(),
            },
            &[],
        )
    }
    /// Broadcasts `v` into `shape`, its dimensions landing on `dims`.
    fn bcast(&mut self, v: ValueId, dims: &[i64], shape: &[usize]) -> ValueId {
        let ty = TensorType::new(DType::F32, shape);
        self.0
            .inst_typed(
                Op::BroadcastInDim {
                    broadcast_dimensions: dims.to_vec(),
                },
                &[v],
                ty,
            )
            .expect("well-typed step")
    }
    fn full(&mut self, x: f32, like: ValueId) -> ValueId {
        let s = self.scalar(x);
        let shape = self.t(like).shape;
        self.bcast(s, &[], &shape)
    }
    /// `a` contracted with `b` over `a`'s dim `ca` and `b`'s dim `cb`.
    fn dot(&mut self, a: ValueId, b: ValueId, ca: i64, cb: i64) -> ValueId {
        let op = Op::DotGeneral {
            lhs_batching_dimensions: vec![],
            rhs_batching_dimensions: vec![],
            lhs_contracting_dimensions: vec![ca],
            rhs_contracting_dimensions: vec![cb],
        };
        self.op(op, &[a, b])
    }
    fn sum(&mut self, v: ValueId, dims: &[i64]) -> ValueId {
        let zero = self.scalar(0.0);
        self.op(
            Op::Reduce {
                dimensions: dims.to_vec(),
                kind: Combiner::Add,
            },
            &[v, zero],
        )
    }
    fn bin(&mut self, op: Op, a: ValueId, b: ValueId) -> ValueId {
        self.op(op, &[a, b])
    }
    /// `p - lr * g`.
    fn sgd(&mut self, p: ValueId, g: ValueId) -> ValueId {
        let lr = self.full(LR, g);
        let step = self.bin(Op::Multiply {}, lr, g);
        self.bin(Op::Subtract {}, p, step)
    }
}

/// One training step: (w1, b1, w2, b2, x, y) -> (w1', b1', w2', b2', loss, accuracy).
fn train_step() -> Func {
    let mut g = G(Builder::new("train_step"));
    let f32t = |s: &[usize]| TensorType::new(DType::F32, s);
    let w1 = g.0.param(f32t(&[2, H]));
    let b1 = g.0.param(f32t(&[H]));
    let w2 = g.0.param(f32t(&[H]));
    let b2 = g.0.param(f32t(&[]));
    let x = g.0.param(f32t(&[N, 2]));
    let y = g.0.param(f32t(&[N]));
    // Forward: h = tanh(x w1 + b1); z = h w2 + b2; p = sigmoid(z).
    let xw = g.dot(x, w1, 1, 0);
    let b1b = g.bcast(b1, &[1], &[N, H]);
    let pre = g.bin(Op::Add {}, xw, b1b);
    let h = g.op(Op::Tanh {}, &[pre]);
    let hw = g.dot(h, w2, 1, 0);
    let b2b = g.bcast(b2, &[], &[N]);
    let z = g.bin(Op::Add {}, hw, b2b);
    let p = g.op(Op::Logistic {}, &[z]);
    // Loss: mean binary cross-entropy, computed stably as softplus(z) - y z.
    let absz = g.op(Op::Abs {}, &[z]);
    let negabs = g.op(Op::Negate {}, &[absz]);
    let e = g.op(Op::Exponential {}, &[negabs]);
    let l1p = g.op(Op::LogPlusOne {}, &[e]);
    let zero = g.full(0.0, z);
    let relu = g.bin(Op::Maximum {}, z, zero);
    let softplus = g.bin(Op::Add {}, relu, l1p);
    let yz = g.bin(Op::Multiply {}, y, z);
    let per = g.bin(Op::Subtract {}, softplus, yz);
    let total = g.sum(per, &[0]);
    let inv_n = g.scalar(1.0 / N as f32);
    let loss = g.bin(Op::Multiply {}, total, inv_n);
    // Backward: dz = (p - y) / N; through the two layers.
    let diff = g.bin(Op::Subtract {}, p, y);
    let inv = g.full(1.0 / N as f32, diff);
    let dz = g.bin(Op::Multiply {}, diff, inv);
    let dw2 = g.dot(h, dz, 0, 0);
    let db2 = g.sum(dz, &[0]);
    let dzb = g.bcast(dz, &[0], &[N, H]);
    let w2b = g.bcast(w2, &[1], &[N, H]);
    let dh = g.bin(Op::Multiply {}, dzb, w2b);
    let hh = g.bin(Op::Multiply {}, h, h);
    let one = g.full(1.0, hh);
    let dtanh = g.bin(Op::Subtract {}, one, hh);
    let dpre = g.bin(Op::Multiply {}, dh, dtanh);
    let dw1 = g.dot(x, dpre, 0, 0);
    let db1 = g.sum(dpre, &[0]);
    // Accuracy of the parameters before the update: mean of (z > 0) == (y > 0.5).
    let half = g.full(0.5, y);
    let pred_pos = g.op(
        Op::Compare {
            comparison_direction: ComparisonDirection::Gt,
        },
        &[z, zero],
    );
    let label_pos = g.op(
        Op::Compare {
            comparison_direction: ComparisonDirection::Gt,
        },
        &[y, half],
    );
    let hit = g.op(
        Op::Compare {
            comparison_direction: ComparisonDirection::Eq,
        },
        &[pred_pos, label_pos],
    );
    let hitf =
        g.0.inst_typed(Op::Convert {}, &[hit], f32t(&[N]))
            .expect("well-typed step");
    let hits = g.sum(hitf, &[0]);
    let acc = g.bin(Op::Multiply {}, hits, inv_n);
    // SGD update.
    let outs = [
        g.sgd(w1, dw1),
        g.sgd(b1, db1),
        g.sgd(w2, dw2),
        g.sgd(b2, db2),
        loss,
        acc,
    ];
    g.0.finish(&outs).expect("outputs are defined")
}

/// Two interleaved half circles with noise, labels 0 and 1.
fn moons(rng: &mut Rng) -> (Literal, Literal) {
    let (mut xs, mut ys) = (Vec::new(), Vec::new());
    for i in 0..N {
        let label = (i % 2) as f32;
        let t = rng.uniform(0.0, std::f64::consts::PI);
        let (cx, cy) = if label == 0.0 {
            (t.cos(), t.sin())
        } else {
            (1.0 - t.cos(), 0.5 - t.sin())
        };
        xs.push((cx + rng.uniform(-0.1, 0.1)) as f32);
        xs.push((cy + rng.uniform(-0.1, 0.1)) as f32);
        ys.push(label);
    }
    (
        Literal::f32([N, 2], xs).unwrap(),
        Literal::f32([N], ys).unwrap(),
    )
}

fn main() {
    let step = train_step();
    println!(
        "kiln demo: a 2-{H}-1 MLP on {N} two-moons points, trained by one IR function of {} instructions",
        step.insts.len()
    );
    let mut rng = Rng::new(42);
    let (x, y) = moons(&mut rng);
    let init = |n: usize, scale: f64, rng: &mut Rng| {
        (0..n)
            .map(|_| rng.uniform(-scale, scale) as f32)
            .collect::<Vec<_>>()
    };
    let mut params = vec![
        Literal::f32([2, H], init(2 * H, 1.0, &mut rng)).unwrap(),
        Literal::f32([H], vec![0.0; H]).unwrap(),
        Literal::f32([H], init(H, 0.5, &mut rng)).unwrap(),
        Literal::f32([], vec![0.0]).unwrap(),
    ];
    let (mut first, mut loss, mut acc) = (None, 0.0, 0.0);
    for s in 0..STEPS {
        let mut args = params.clone();
        args.push(x.clone());
        args.push(y.clone());
        let mut out = kiln::reference::eval(&step, &args).expect("the step verifies and runs");
        acc = out.pop().expect("accuracy output").as_f32s().expect("f32")[0];
        loss = out.pop().expect("loss output").as_f32s().expect("f32")[0];
        first.get_or_insert(loss);
        params = out;
        if s % 50 == 0 || s == STEPS - 1 {
            println!("step {s:4}  loss {loss:.4}  accuracy {:5.1}%", 100.0 * acc);
        }
    }
    println!(
        "loss {:.4} -> {loss:.4}; training accuracy {:.1}%",
        first.unwrap_or(loss),
        100.0 * acc
    );
    if !(loss < 0.5 * first.unwrap_or(loss) && acc > 0.9) {
        eprintln!("training did not converge");
        std::process::exit(1);
    }
}
