//! Device tensors on the emulated GPU (the `ptx-emulator` backend, installed here): moving
//! tensors to `cuda:0` and back bit for bit, compiled functions and eager ops that run on the
//! device and leave their results there, donation on the device, and every bad input a clear
//! error naming the op and this file's line. A binary of its own: it installs the backend for
//! the whole process.

use kiln::backend::{PtxEmulator, set_backend};
use kiln::ir::{DType, Literal, TensorType};
use kiln::{Device, DeviceBuffer, Error, Tensor, grad, jit};
use std::sync::{Arc, Once};

fn emulated() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| set_backend(Arc::new(PtxEmulator)));
}

fn cuda(t: &Tensor) -> Tensor {
    let d = t.to(Device::Cuda(0));
    assert!(d.error().is_none(), "{:?}", d.error());
    d
}

/// The address of a device tensor's buffer (to tell whether a result reused it).
fn buffer_id(t: &Tensor) -> usize {
    Arc::as_ptr(t.device_buffer().expect("a device tensor")) as *const u8 as usize
}

/// Asserts that `e` is `op`'s error at line `line` of this file, saying `says`.
fn expect(e: Error, op: &str, line: u32, says: &str) {
    assert_eq!(e.op, op, "{e}");
    let loc = e.loc.unwrap_or_else(|| panic!("no location: {e}"));
    assert!(loc.file.ends_with("device_tensors.rs"), "{e}");
    assert_eq!(loc.line, line, "{e}");
    assert!(e.message.contains(says), "{e}\n(wanted: {says})");
}

#[test]
fn tensors_go_to_the_device_and_back_bit_for_bit() {
    emulated();
    let mut rng = kiln::ir::random::Rng::new(11);
    let dtypes = [
        DType::F32,
        DType::F64,
        DType::F16,
        DType::BF16,
        DType::I8,
        DType::I16,
        DType::I32,
        DType::I64,
        DType::U8,
        DType::U16,
        DType::U32,
        DType::U64,
        DType::Pred,
        DType::I4,
        DType::U4,
        DType::I2,
        DType::F8E4M3FN,
        DType::F8E5M2,
        DType::C64,
    ];
    let shapes: [&[usize]; 5] = [&[], &[0], &[3, 0], &[7], &[2, 3, 5]];
    for d in dtypes {
        for &s in &shapes {
            let ty = TensorType::new(d, s.to_vec());
            let l = kiln::ir::random::random_literal(&mut rng, &ty);
            let x = Tensor::new(l.clone());
            let on = cuda(&x);
            assert_eq!(on.device(), Device::Cuda(0), "{ty}");
            assert_eq!(x.device(), Device::Cpu);
            assert_eq!(on.ty(), Some(ty.clone()));
            assert_eq!(on.shape(), s.to_vec());
            // Back through each reader: the same bytes.
            let back = on.to(Device::Cpu);
            assert_eq!(back.device(), Device::Cpu);
            assert_eq!(
                back.literal().unwrap().to_le_bytes(),
                l.to_le_bytes(),
                "{ty}"
            );
            assert_eq!(
                on.to_literal().unwrap().to_le_bytes(),
                l.to_le_bytes(),
                "{ty}"
            );
            assert_eq!(on.literal().unwrap().to_le_bytes(), l.to_le_bytes(), "{ty}");
            if ty.numel() == 1 {
                assert_eq!(on.item().unwrap().to_bits(), x.item().unwrap().to_bits());
            }
        }
    }
    // NaN payloads and signed zeros survive.
    let odd = vec![
        f32::from_bits(0x7fc0_1234),
        -0.0,
        f32::INFINITY,
        f32::MIN_POSITIVE / 2.0,
    ];
    let x = Tensor::from_vec(odd.clone(), [4]).unwrap();
    let back: Vec<u32> = cuda(&x)
        .to_vec::<f32>()
        .unwrap()
        .iter()
        .map(|v| v.to_bits())
        .collect();
    assert_eq!(back, odd.iter().map(|v| v.to_bits()).collect::<Vec<_>>());
    // Moving to where a tensor already is keeps it.
    let on = cuda(&x);
    assert_eq!(buffer_id(&on.to(Device::Cuda(0))), buffer_id(&on));
    // Printing says where it lives.
    let s = cuda(&Tensor::from_vec(vec![1.5f32, 2.0], [2]).unwrap()).to_string();
    assert_eq!(s, "[1.5, 2.0] : f32[2] on cuda:0");
}

#[test]
fn jit_on_device_tensors_runs_there_and_matches_the_cpu() {
    emulated();
    let f = |(a, b): &(Tensor, Tensor)| ((a.matmul(b) + 1.0).relu(), a.sum_all() * 0.5);
    let a = Tensor::from_vec((0..12).map(|i| i as f32 * 0.25 - 1.0).collect(), [3, 4]).unwrap();
    let b = Tensor::from_vec((0..8).map(|i| 1.0 - i as f32 * 0.5).collect(), [4, 2]).unwrap();
    // The host result, eager.
    let (want_y, want_s) = f(&(a.clone(), b.clone()));
    let g = jit(f);
    let (y, s) = g.call(&(cuda(&a), cuda(&b))).unwrap();
    assert_eq!((y.device(), s.device()), (Device::Cuda(0), Device::Cuda(0)));
    assert_eq!(y.to_vec::<f32>().unwrap(), want_y.to_vec::<f32>().unwrap());
    assert_eq!(s.item().unwrap(), want_s.item().unwrap());
    // The same program serves host calls: one compile.
    let (hy, _) = g.call(&(a.clone(), b.clone())).unwrap();
    assert_eq!(hy.device(), Device::Cpu);
    assert_eq!(hy.to_vec::<f32>().unwrap(), want_y.to_vec::<f32>().unwrap());
    assert_eq!(g.compiles(), 1);
    // A result that is an argument passed through, and one that is a constant.
    let pass = jit(|x: &Tensor| (x.clone(), Tensor::scalar(4i32), x.sum_all()));
    let (same, four, total) = pass.call(&cuda(&a)).unwrap();
    assert_eq!(
        (same.device(), four.device()),
        (Device::Cuda(0), Device::Cuda(0))
    );
    assert_eq!(same.to_vec::<f32>().unwrap(), a.to_vec::<f32>().unwrap());
    assert_eq!(
        (four.item().unwrap(), total.item().unwrap()),
        (4.0, a.sum_all().item().unwrap())
    );
    // An argument the function does not use.
    let first = jit(|(a, _b): &(Tensor, Tensor)| a * 2.0);
    let y2 = first.call(&(cuda(&a), cuda(&b))).unwrap();
    assert_eq!(
        y2.to_vec::<f32>().unwrap(),
        (&a * 2.0).to_vec::<f32>().unwrap()
    );
    // The device results feed a second compiled function, staying on the device.
    let h = jit(|(y, s): &(Tensor, Tensor)| y * s - 2.0);
    let z = h.call(&(y.clone(), s.clone())).unwrap();
    assert_eq!(z.device(), Device::Cuda(0));
    let want_z = &want_y * &want_s - 2.0;
    assert_eq!(z.to_vec::<f32>().unwrap(), want_z.to_vec::<f32>().unwrap());
}

#[test]
fn eager_ops_and_gradients_on_device_tensors_run_there() {
    emulated();
    let x = Tensor::from_vec(vec![1.0f32, -2.0, 3.0, 0.5, 4.0, -1.0], [2, 3]).unwrap();
    let y = Tensor::from_vec(vec![2.0f32, 1.0, -1.0, 3.0, 0.0, 2.0], [2, 3]).unwrap();
    let (dx, dy) = (cuda(&x), cuda(&y));
    // Host scalars go along with device tensors, as in PyTorch.
    let z = (&dx * 2.0 + &dy).relu();
    assert_eq!(z.device(), Device::Cuda(0));
    let want = (&x * 2.0 + &y).relu();
    assert_eq!(z.to_vec::<f32>().unwrap(), want.to_vec::<f32>().unwrap());
    let r = dx.reshape(&[3, 2]).matmul(&dy).sum(&[0], false);
    assert_eq!(r.device(), Device::Cuda(0));
    let want = x.reshape(&[3, 2]).matmul(&y).sum(&[0], false);
    assert_eq!(r.to_vec::<f32>().unwrap(), want.to_vec::<f32>().unwrap());
    // A gradient taken of device tensors is on the device.
    let g = grad(|x: &Tensor| (x * x).sum_all())(&dx);
    assert_eq!(g.device(), Device::Cuda(0));
    assert_eq!(
        g.to_vec::<f32>().unwrap(),
        (&x * 2.0).to_vec::<f32>().unwrap()
    );
    // A device tensor closed over: a capture of the gradient, a constant of a jitted function.
    let g = grad(|x: &Tensor| (x * &dy).sum_all())(&dx);
    assert_eq!(g.device(), Device::Cuda(0));
    assert_eq!(g.to_vec::<f32>().unwrap(), y.to_vec::<f32>().unwrap());
    let scaled = jit(|x: &Tensor| x * &dy).call(&dx).unwrap();
    assert_eq!(scaled.device(), Device::Cuda(0));
    assert_eq!(
        scaled.to_vec::<f32>().unwrap(),
        (&x * &y).to_vec::<f32>().unwrap()
    );
}

#[test]
fn donation_on_the_device_writes_results_into_the_donated_buffer() {
    emulated();
    let step = jit(|(p, g): &(Tensor, Tensor)| p - g * 0.5);
    let p = cuda(&Tensor::from_vec(vec![1.0f32, 2.0, 3.0], [3]).unwrap());
    let g = cuda(&Tensor::from_vec(vec![2.0f32, 2.0, 2.0], [3]).unwrap());
    let kept = g.clone(); // `g` is shared: only read
    let (pid, gid) = (buffer_id(&p), buffer_id(&g));
    let p = step.call_donating((p, g)).unwrap();
    assert_eq!(p.device(), Device::Cuda(0));
    assert_eq!(p.to_vec::<f32>().unwrap(), [0.0, 1.0, 2.0]);
    // The result took the donated parameter's buffer, not the shared gradient's.
    assert_eq!(buffer_id(&p), pid);
    assert_ne!(buffer_id(&p), gid);
    assert_eq!(kept.to_vec::<f32>().unwrap(), [2.0, 2.0, 2.0]);
    // Again, with the result donated in turn.
    let p2 = step.call_donating((p, kept.clone())).unwrap();
    assert_eq!(buffer_id(&p2), pid);
    assert_eq!(p2.to_vec::<f32>().unwrap(), [-1.0, 0.0, 1.0]);
    // A donated tensor still held elsewhere is only read.
    let held = p2.clone();
    let p3 = step.call_donating((p2, kept.clone())).unwrap();
    assert_ne!(buffer_id(&p3), pid);
    assert_eq!(held.to_vec::<f32>().unwrap(), [-1.0, 0.0, 1.0]);
    assert_eq!(p3.to_vec::<f32>().unwrap(), [-2.0, -1.0, 0.0]);
}

/// Memory of a backend that is not installed, on any device, whose reads may fail.
struct Foreign {
    device: Device,
    bytes: Vec<u8>,
    readable: bool,
}

impl DeviceBuffer for Foreign {
    fn device(&self) -> Device {
        self.device
    }
    fn backend(&self) -> &'static str {
        "foreign"
    }
    fn len(&self) -> usize {
        self.bytes.len()
    }
    fn read(&self) -> Result<Vec<u8>, String> {
        if self.readable {
            Ok(self.bytes.clone())
        } else {
            Err("the device was lost".into())
        }
    }
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

fn foreign(device: Device, readable: bool) -> Tensor {
    let l = Literal::from_f64s(TensorType::new(DType::F32, [3]), &[1.0, 2.0, 3.0]).unwrap();
    let buffer = Arc::new(Foreign {
        device,
        bytes: l.to_le_bytes(),
        readable,
    });
    Tensor::on_device(buffer, l.ty().clone()).unwrap()
}

/// Every bad input on the device path: an error naming the op (or the jitted function) and
/// the caller's line, never a panic.
#[test]
#[rustfmt::skip]
fn bad_device_inputs_name_the_op_and_the_line() {
    emulated();
    let h3 = Tensor::from_vec(vec![1.0f32, 2.0, 3.0], [3]).unwrap();
    let d3 = cuda(&h3);
    let hm = Tensor::ones(DType::F32, [3, 3]);
    let mut n = 0;

    // 1. A host tensor and a device tensor in one eager op.
    let e = (&d3 + &h3).error().cloned().unwrap();
    expect(e, "add", line!() - 1, "host and device tensors mixed in one add");
    n += 1;
    // 2. The same, the other way round, in a matrix product.
    let e = hm.matmul(&d3).error().cloned().unwrap();
    expect(e, "matmul", line!() - 1, "is on cuda:0");
    n += 1;
    // 3. A jitted function called with host and device arguments.
    let f = jit(|(a, b): &(Tensor, Tensor)| a + b);
    let e = f.call(&(d3.clone(), h3.clone())).err().unwrap();
    expect(e.clone(), "jit", line!() - 1, "host and device tensors mixed in one jit");
    assert!(e.message.contains("argument 1 (f32[3]) on cpu"), "{e}");
    assert!(e.message.contains("the function jitted at"), "{e}");
    n += 1;
    // 4. The same, donating.
    let e = f.call_donating((h3.clone(), d3.clone())).err().unwrap();
    expect(e, "jit", line!() - 1, "host and device tensors mixed in one jit");
    n += 1;
    // 5. A device index the emulator does not have.
    let e = h3.to(Device::Cuda(1)).error().cloned().unwrap();
    expect(e, "to", line!() - 1, "no GPU cuda:1");
    n += 1;
    // 6. Tensors on two devices in one op.
    let other = foreign(Device::Cuda(1), true);
    let e = (&d3 * &other).error().cloned().unwrap();
    expect(e, "mul", line!() - 1, "tensors on two devices in one mul");
    n += 1;
    // 7. ... and in one jitted call.
    let e = f.call(&(d3.clone(), other.clone())).err().unwrap();
    expect(e, "jit", line!() - 1, "argument 1 (f32[3]) on cuda:1");
    n += 1;
    // 8. Memory the installed backend does not own.
    let alien = foreign(Device::Cuda(0), true);
    let e = f.call(&(d3.clone(), alien.clone())).err().unwrap();
    expect(e, "jit", line!() - 1, "of the `foreign` backend, not of the installed `ptx-emulator`");
    n += 1;
    // 9. ... used by an eager op.
    let e = (&d3 - &alien).error().cloned().unwrap();
    expect(e, "sub", line!() - 1, "of the `foreign` backend");
    n += 1;
    // 10. A device tensor that cannot be read back.
    let lost = foreign(Device::Cuda(0), false);
    let e = lost.to_vec::<f32>().err().unwrap();
    expect(e, "to_literal", line!() - 1, "the device was lost");
    n += 1;
    let e = lost.to(Device::Cpu).error().cloned().unwrap();
    expect(e, "to", line!() - 1, "cannot read a f32[3] tensor back from cuda:0");
    n += 1;
    // 11. A shape mismatch on the device is the op's usual error.
    let d2 = cuda(&Tensor::ones(DType::F32, [2]));
    let e = (&d3 + &d2).error().cloned().unwrap();
    expect(e, "add", line!() - 1, "cannot broadcast");
    n += 1;
    // 12. The wrong element type read back.
    let e = d3.to_vec::<i32>().err().unwrap();
    expect(e, "to_vec", line!() - 1, "the tensor is f32[3], not i32");
    n += 1;
    // 13. A buffer of the wrong size for its type.
    let buffer = Arc::new(Foreign {
        device: Device::Cuda(0),
        bytes: vec![0; 5],
        readable: true,
    });
    let e = Tensor::on_device(buffer, TensorType::new(DType::F32, [2]))
        .err()
        .unwrap();
    assert!(
        e.message
            .contains("needs 8 bytes, the buffer on cuda:0 holds 5"),
        "{e}"
    );
    n += 1;
    // 14. A backend without device memory says which backends have it.
    let l = h3.literal().unwrap();
    let e = kiln::backend::Cpu.upload(Device::Cuda(0), l).err().unwrap();
    assert!(e.message.contains("KILN_BACKEND=ptx-emulator"), "{e}");
    assert!(
        e.message.contains("`cpu` keeps tensors in host memory"),
        "{e}"
    );
    n += 1;
    // 15. A host-only executable given device tensors.
    let prog = kiln::lower::trace_ir(|x: &Tensor| x * 2.0, &h3).unwrap();
    use kiln::backend::Backend;
    let exe = kiln::backend::Cpu.compile(&prog).unwrap();
    let dev_arg = kiln::DeviceArg {
        buffer: d3.device_buffer().unwrap().clone(),
        donated: false,
    };
    let e = exe.run_device(vec![dev_arg]).err().unwrap();
    assert!(
        e.message
            .contains("run on the host and take no tensors on cuda:0"),
        "{e}"
    );
    n += 1;
    assert_eq!(n, 16);
}
