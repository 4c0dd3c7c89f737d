//! Ahead-of-time artifacts round trip: a function compiled by `kiln::aot`, saved, loaded as
//! `kiln-run` loads it, its plan derived again and run on the GPU emulator, agrees with the
//! reference interpreter; its PTX is rendered for the target's SM.

use kiln::Tensor;
use kiln::aot::{Artifact, Target, compile};
use kiln_run::{Device, Runner};

fn scratch(name: &str) -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("kiln-aot-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

#[test]
fn an_artifact_saved_and_loaded_runs_on_the_emulator_as_the_reference() {
    let f = |(x, w): &(Tensor, Tensor)| (&x.matmul(w) * 0.5).softmax(-1);
    let x = (
        Tensor::from_vec((0..24).map(|i| i as f32 / 7.0).collect::<Vec<_>>(), [4, 6]).unwrap(),
        Tensor::from_vec(
            (0..30).map(|i| (i % 5) as f32 - 2.0).collect::<Vec<_>>(),
            [6, 5],
        )
        .unwrap(),
    );
    let a = compile(f, &x, Target::h200()).unwrap();
    assert_eq!(a.args.len(), 2);
    assert_eq!(a.results[0].ty.to_string(), "f32[4,5]");
    assert!(!a.ptx.is_empty());
    assert!(
        a.ptx
            .iter()
            .all(|p| p.contains(".target sm_90") && p.contains(".entry"))
    );
    let dir = scratch("round-trip");
    a.save(&dir).unwrap();
    let back = Artifact::load(&dir).unwrap();
    assert_eq!(back.plan, a.plan);
    assert_eq!(back.ptx, a.ptx);
    let plan = back.device_plan().unwrap();
    let runner = Runner::open(&back, plan, &Device::Emulator).unwrap();
    let args = kiln_run::exec::random_inputs(&back, 1);
    let got = runner.run(&args).unwrap();
    let traced = kiln::lower::trace_ir(f, &x).unwrap();
    kiln::reference::accuracy::check_outputs(&traced, &args, &got).unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn an_ampere_artifact_is_rendered_for_sm_80_and_a_cpu_target_is_refused() {
    let x = Tensor::from_vec(vec![1.0f32, -2.0, 3.0], [3]).unwrap();
    let a = compile(|x: &Tensor| x.exp() + x, &x, Target::a100()).unwrap();
    assert!(a.ptx.iter().all(|p| p.contains(".target sm_80")));
    assert_eq!(a.manifest()["target"]["info"]["gpu"]["sms"], 108);
    let cpu = Target {
        info: kiln_kernel::TargetInfo::reference(),
        ..Target::h200()
    };
    let e = compile(|x: &Tensor| x.exp(), &x, cpu).unwrap_err();
    assert!(e.message.contains("describes no GPU"), "{e}");
}
