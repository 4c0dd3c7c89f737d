//! How a `while` loop runs on the host: the decision the runtime follows.
//!
//! The runtime runs a loop's condition and body as programs of their own, once per trip. Two
//! things keep a trip's cost to the body's work:
//! - carries the body returns unchanged (a `scan`'s inputs, weights a loop closes over) are
//!   *invariant*: the runtime keeps them by reference, and the body is compiled without them
//!   among its outputs ([`LoopPlan::stepped_body`]), so they are never copied; the body's
//!   program also computes the condition on the next carries, so a trip is one call;
//! - the other carries are *donated* to the body ([`LoopPlan::donated`]): the runtime passes
//!   its own buffers, so a window written into a carry (a `scan` collecting its outputs with
//!   `dynamic_update_slice`) is written in place rather than into a copy of the whole carry.

use kiln_ir::Func;

/// How a `while` with this body runs: see the module documentation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LoopPlan {
    /// Per carry: the body returns it unchanged.
    pub invariant: Vec<bool>,
}

/// The plan of a `while` whose body is `body`.
pub fn loop_plan(body: &Func) -> LoopPlan {
    LoopPlan {
        invariant: body
            .params
            .iter()
            .zip(&body.outputs)
            .map(|(p, o)| p == o)
            .collect(),
    }
}

impl LoopPlan {
    /// The body as compiled: the same parameters, returning the carries that change, in
    /// order, and then the condition on the next carries (so one call per trip both steps
    /// and tests).
    pub fn stepped_body(&self, cond: &Func, body: &Func) -> Result<Func, kiln_ir::VerifyError> {
        let mut b = kiln_ir::Builder::new(&body.name);
        let ps: Vec<kiln_ir::ValueId> =
            body.param_types().into_iter().map(|t| b.param(t)).collect();
        let next = b.inline(body, &ps)?;
        let go = b.inline(cond, &next)?;
        let mut outs: Vec<kiln_ir::ValueId> = next
            .iter()
            .zip(&self.invariant)
            .filter(|(_, inv)| !**inv)
            .map(|(&v, _)| v)
            .collect();
        outs.extend(go);
        b.finish(&outs)
    }

    /// Which of the body's parameters the runtime donates: the carries that change.
    pub fn donated(&self) -> Vec<bool> {
        self.invariant.iter().map(|&i| !i).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn invariant_carries_are_neither_returned_nor_donated() {
        let body = kiln_ir::parse_func_text(
            "func @body(%0: i32[], %1: f32[4], %2: f32[8,4]) -> (i32[], f32[4], f32[8,4]) {\n  %3 = constant {value = 1} : i32[]\n  %4 = add %0, %3 : i32[]\n  %5 = negate %1 : f32[4]\n  return %4, %5, %2\n}\n",
        )
        .unwrap();
        let cond = kiln_ir::parse_func_text(
            "func @cond(%0: i32[], %1: f32[4], %2: f32[8,4]) -> pred[] {\n  %3 = constant {value = 5} : i32[]\n  %4 = compare %0, %3 {comparison_direction = LT} : pred[]\n  return %4\n}\n",
        )
        .unwrap();
        let plan = loop_plan(&body);
        assert_eq!(plan.invariant, vec![false, false, true]);
        assert_eq!(plan.donated(), vec![true, true, false]);
        let stepped = plan.stepped_body(&cond, &body).unwrap();
        assert_eq!(
            stepped.outputs.len(),
            3,
            "the counter, the vector and the condition"
        );
        kiln_ir::verify(&stepped).unwrap();
        let args = [
            kiln_ir::Literal::i32([], vec![4]).unwrap(),
            kiln_ir::Literal::f32([4], vec![1.0; 4]).unwrap(),
            kiln_ir::Literal::zeros(kiln_ir::TensorType::new(kiln_ir::DType::F32, [8, 4])),
        ];
        let out = kiln_reference::eval(&stepped, &args).unwrap();
        assert_eq!(out[0].to_i64s(), vec![5]);
        assert_eq!(out[2].to_i64s(), vec![0], "5 < 5 is false: the loop stops");
    }
}
