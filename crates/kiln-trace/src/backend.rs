//! Where tensor programs run: a [`Backend`] compiles a [`Func`] into an [`Executable`].
//!
//! This crate names no backend but the [`Reference`] interpreter: the API layer above it
//! installs one with [`set_backend`], or what picks one with [`set_default_backend`] (the
//! `kiln` facade picks its CPU backend, LLVM kernels JIT-compiled for this machine, unless
//! `KILN_BACKEND=reference`), and where the [`options`] come from with [`set_options_source`].
//! Compiled executables are cached by backend and program text, so an op or a traced function
//! of a given signature compiles once, even when several threads call it for the first time at
//! once (they wait for the first one's compile).

use crate::device::{DeviceArg, DeviceBuffer};
use crate::{Device, Error, Result};
use kiln_ir::{Func, Literal};
pub use kiln_kernel::Options;
pub use kiln_kernel::options::MatmulPrecision;
use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::{Arc, Condvar, Mutex, RwLock};

/// A compiled program.
pub trait Executable: Send + Sync {
    /// Runs the program on arguments of its parameter types (borrowed: a backend copies only
    /// what it must).
    fn run(&self, args: &[&Literal]) -> Result<Vec<Literal>>;

    /// Runs like [`Executable::run`], where the arguments passed by value are donated: a
    /// backend may write results into their buffers (compiled for it with
    /// [`Backend::compile_donating`]). By default they are only read.
    fn run_donating(&self, args: Vec<Cow<'_, Literal>>) -> Result<Vec<Literal>> {
        let refs: Vec<&Literal> = args.iter().map(|a| a.as_ref()).collect();
        self.run(&refs)
    }

    /// Peak bytes of the buffers one call writes (intermediates and results), from the
    /// program's memory plan, when the backend plans memory.
    fn peak_bytes(&self) -> Option<usize> {
        None
    }

    /// Runs the program on arguments in its backend's device memory (of its parameter types,
    /// all on one device) and returns its results there, with no copy through the host: what
    /// a compiled function called with device tensors runs. A donated argument's buffer
    /// ([`DeviceArg::donated`]) may hold a result of its size. By default (a backend whose
    /// programs run on the host) an error saying so: a backend with device memory
    /// ([`Backend::upload`]) implements both.
    ///
    /// # Examples
    ///
    /// ```
    /// use kiln_trace::backend::{Backend, Reference};
    /// use kiln_trace::{Device, DeviceArg, DeviceBuffer};
    /// use std::sync::Arc;
    /// struct InHost(Vec<u8>);
    /// impl DeviceBuffer for InHost {
    ///     fn device(&self) -> Device { Device::Cuda(0) }
    ///     fn backend(&self) -> &'static str { "in-host" }
    ///     fn len(&self) -> usize { self.0.len() }
    ///     fn read(&self) -> Result<Vec<u8>, String> { Ok(self.0.clone()) }
    ///     fn as_any(&self) -> &dyn std::any::Any { self }
    /// }
    /// let f = kiln_ir::parse_func_text(
    ///     "func @main(%0: f32[]) -> f32[] {\n  %1 = negate %0 : f32[]\n  return %1\n}\n",
    /// )
    /// .unwrap();
    /// // The reference interpreter runs on the host: device arguments are refused.
    /// let exe = Reference.compile(&f).unwrap();
    /// let arg = DeviceArg { buffer: Arc::new(InHost(vec![0; 4])), donated: false };
    /// let e = exe.run_device(vec![arg]).err().unwrap();
    /// assert!(e.message.contains("take no tensors on cuda:0"), "{e}");
    /// ```
    fn run_device(&self, args: Vec<DeviceArg>) -> Result<Vec<Arc<dyn DeviceBuffer>>> {
        let on = args
            .first()
            .map_or_else(|| "a device".to_string(), |a| a.buffer.device().to_string());
        Err(Error::internal(
            "run",
            format!("this backend's programs run on the host and take no tensors on {on}"),
        ))
    }
}

/// A compiler from IR functions to executables.
pub trait Backend: Send + Sync {
    /// A short name, part of the compile cache key.
    fn name(&self) -> &'static str;
    /// Compiles a verified function.
    fn compile(&self, f: &Func) -> Result<Arc<dyn Executable>>;

    /// Compiles a verified function whose parameters `p` with `donated[p]` the caller gives up
    /// ([`Executable::run_donating`] passes them by value), so their buffers may hold results.
    /// By default donation is ignored.
    fn compile_donating(&self, f: &Func, donated: &[bool]) -> Result<Arc<dyn Executable>> {
        let _ = donated;
        self.compile(f)
    }

    /// Compiles like [`Backend::compile_donating`], under `opts` instead of the process's
    /// [`options`] (its kernel cache, switches and reports). By default the backend has no
    /// options, and this is [`Backend::compile_donating`].
    fn compile_with_options(
        &self,
        f: &Func,
        donated: &[bool],
        opts: &Options,
    ) -> Result<Arc<dyn Executable>> {
        let _ = opts;
        self.compile_donating(f, donated)
    }

    /// The peak bytes of the memory plan this backend would make for `f` under `opts`, without
    /// compiling its kernels (what a memory budget, [`Executable::peak_bytes`] of the compiled
    /// function, is measured on); `None` for a backend that plans no memory, as by default.
    fn planned_peak(&self, f: &Func, opts: &Options) -> Result<Option<usize>> {
        let _ = (f, opts);
        Ok(None)
    }

    /// Copies `l` into new memory on `device` that this backend's executables read
    /// ([`Executable::run_device`]): what `Tensor::to(Device::Cuda(i))` does. By default (a
    /// backend without device memory: the CPU, the reference interpreter) an error that says
    /// so and names the backends that have it.
    ///
    /// # Examples
    ///
    /// ```
    /// use kiln_trace::backend::{Backend, Reference};
    /// use kiln_trace::Device;
    /// let l = kiln_ir::Literal::f32([2], vec![1.0, 2.0]).unwrap();
    /// let e = Reference.upload(Device::Cuda(0), &l).err().unwrap();
    /// assert!(e.message.contains("`reference` keeps tensors in host memory"), "{e}");
    /// ```
    fn upload(&self, device: Device, l: &Literal) -> Result<Arc<dyn DeviceBuffer>> {
        Err(Error::internal(
            "to",
            format!(
                "cannot move a {} tensor to {device}: the installed backend `{}` keeps tensors \
                 in host memory; run with KILN_BACKEND=cuda (or cuda:N) to use a GPU, or \
                 KILN_BACKEND=ptx-emulator to emulate one",
                l.ty(),
                self.name()
            ),
        ))
    }
}

/// The reference interpreter as a backend: slow, exact, always available.
pub struct Reference;

struct Interpreted(Func);

impl Executable for Interpreted {
    fn run(&self, args: &[&Literal]) -> Result<Vec<Literal>> {
        let args: Vec<Literal> = args.iter().map(|&a| a.clone()).collect();
        kiln_reference::eval(&self.0, &args).map_err(|e| Error::internal("run", e.to_string()))
    }
}

impl Backend for Reference {
    fn name(&self) -> &'static str {
        "reference"
    }
    fn compile(&self, f: &Func) -> Result<Arc<dyn Executable>> {
        kiln_ir::verify(f).map_err(|e| Error::internal("compile", e.to_string()))?;
        Ok(Arc::new(Interpreted(f.clone())))
    }
}

static BACKEND: RwLock<Option<Arc<dyn Backend>>> = RwLock::new(None);

static OPTIONS: RwLock<Option<Options>> = RwLock::new(None);

/// Where the options come from when none were set: a function the API layer installs with
/// [`set_options_source`] (the `kiln` facade reads the process environment, see
/// [`kiln_kernel::options::SWITCHES`]), called once.
static OPTIONS_SOURCE: RwLock<Option<fn() -> Options>> = RwLock::new(None);

/// The options compiles run under: those given to [`set_options`], else those of the source
/// installed with [`set_options_source`] (read once), else [`Options::default`]. This crate
/// reads no environment variable: the API layer above it does.
pub fn options() -> Options {
    if let Some(o) = OPTIONS.read().unwrap_or_else(|e| e.into_inner()).as_ref() {
        return o.clone();
    }
    let source = *OPTIONS_SOURCE.read().unwrap_or_else(|e| e.into_inner());
    let o = source.map_or_else(Options::default, |read| read());
    OPTIONS
        .write()
        .unwrap_or_else(|e| e.into_inner())
        .get_or_insert(o)
        .clone()
}

/// Installs where [`options`] comes from while none were set: `read` is called once, at the
/// first compile (the `kiln` facade installs its reading of the environment).
pub fn set_options_source(read: fn() -> Options) {
    *OPTIONS_SOURCE.write().unwrap_or_else(|e| e.into_inner()) = Some(read);
}

/// Sets the options every compile from now on runs under (compiled executables are cached
/// by options too, so a change compiles again).
pub fn set_options(o: Options) {
    *OPTIONS.write().unwrap_or_else(|e| e.into_inner()) = Some(o);
}

/// One signature's compile: empty while its first caller compiles it, then the outcome.
#[derive(Default)]
struct Slot {
    outcome: Mutex<Option<Result<Arc<dyn Executable>>>>,
    done: Condvar,
}

impl Slot {
    /// Records the outcome and wakes every caller waiting for it.
    fn finish(&self, outcome: Result<Arc<dyn Executable>>) {
        *self.outcome.lock().unwrap_or_else(|e| e.into_inner()) = Some(outcome);
        self.done.notify_all();
    }

    /// Waits for the outcome.
    fn wait(&self) -> Result<Arc<dyn Executable>> {
        let mut outcome = self.outcome.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            if let Some(o) = outcome.as_ref() {
                return o.clone();
            }
            outcome = self.done.wait(outcome).unwrap_or_else(|e| e.into_inner());
        }
    }
}

/// The compile cache: one slot per key (backend, donation, program text). The map's lock is
/// held only to find or insert a slot, never while compiling, so different keys compile in
/// parallel.
type Cache = Mutex<Option<HashMap<String, Arc<Slot>>>>;
static CACHE: Cache = Mutex::new(None);

/// The first caller's compile of a key. [`Compiling::finish`] hands its outcome to the
/// waiters (forgetting the key if it failed); dropped without an outcome (the backend
/// panicked), it gives them an error and forgets the key, so a later call compiles again.
struct Compiling<'a> {
    key: &'a str,
    slot: &'a Arc<Slot>,
    finished: bool,
}

impl Compiling<'_> {
    fn finish(mut self, outcome: Result<Arc<dyn Executable>>) -> Result<Arc<dyn Executable>> {
        self.finished = true;
        if outcome.is_err() {
            forget(self.key, self.slot);
        }
        self.slot.finish(outcome.clone());
        outcome
    }
}

impl Drop for Compiling<'_> {
    fn drop(&mut self) {
        if !self.finished {
            forget(self.key, self.slot);
            self.slot.finish(Err(Error::internal(
                "compile",
                "the backend panicked while compiling",
            )));
        }
    }
}

/// Removes `key` from the cache if it still maps to `slot` (a failed compile is not cached).
fn forget(key: &str, slot: &Arc<Slot>) {
    let mut cache = CACHE.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(map) = cache.as_mut()
        && map.get(key).is_some_and(|s| Arc::ptr_eq(s, slot))
    {
        map.remove(key);
    }
}

/// Installs the backend used by eager ops and compiled functions from now on.
pub fn set_backend(b: Arc<dyn Backend>) {
    *BACKEND.write().unwrap_or_else(|e| e.into_inner()) = Some(b);
}

/// A choice of backend by the [`options`] (see [`set_default_backend`]).
pub type Pick = fn(&Options) -> Arc<dyn Backend>;

/// What picks the backend while none was set with [`set_backend`].
static DEFAULT_BACKEND: RwLock<Option<Pick>> = RwLock::new(None);

/// Installs what picks the backend while none was set with [`set_backend`]: `pick` is called
/// once, with the [`options`], at the first compile. The `kiln` facade installs its choice
/// (the CPU backend, or the reference interpreter under `KILN_BACKEND=reference`) when the
/// program loads.
pub fn set_default_backend(pick: Pick) {
    *DEFAULT_BACKEND.write().unwrap_or_else(|e| e.into_inner()) = Some(pick);
}

/// The installed backend: the one set with [`set_backend`], else the one the default picks
/// (see [`set_default_backend`]). With neither (this crate used without the `kiln` facade
/// and without installing a backend), an error that says so: nothing runs on a backend the
/// program did not choose.
pub fn backend() -> Result<Arc<dyn Backend>> {
    if let Some(b) = BACKEND.read().unwrap_or_else(|e| e.into_inner()).clone() {
        return Ok(b);
    }
    let pick = (*DEFAULT_BACKEND.read().unwrap_or_else(|e| e.into_inner())).ok_or_else(|| {
        Error::internal(
            "compile",
            "no backend is installed: the `kiln` crate installs the CPU backend; \
             without it, call `kiln_trace::backend::set_backend`",
        )
    })?;
    let b = pick(&options());
    Ok(BACKEND
        .write()
        .unwrap_or_else(|e| e.into_inner())
        .get_or_insert(b)
        .clone())
}

/// Compiles `f` with the installed backend, or returns the cached executable for the same
/// backend and program text. Each key compiles once: callers that ask for it while its first
/// compile runs (other threads calling the same function for the first time) wait for that
/// compile and share its result; a failed compile is reported to all of them and not cached.
pub fn compile_cached(f: &Func) -> Result<Arc<dyn Executable>> {
    compile_cached_donating(f, &[])
}

/// [`compile_cached`] for a function whose parameters `p` with `donated[p]` are donated (see
/// [`Backend::compile_donating`]); the donation is part of the cache key.
pub fn compile_cached_donating(f: &Func, donated: &[bool]) -> Result<Arc<dyn Executable>> {
    compile_cached_with(f, donated, &options())
}

/// [`compile_cached_donating`] under the options `opts` (part of the cache key).
pub fn compile_cached_with(
    f: &Func,
    donated: &[bool],
    opts: &Options,
) -> Result<Arc<dyn Executable>> {
    compile_cached_text(f, &kiln_ir::print_func(f), donated, opts)
}

/// [`compile_cached_with`] for `f` whose text ([`kiln_ir::print_func`]) is `text`: a caller
/// that runs one function many times keeps its text instead of printing it on every call
/// (the eager transforms' derived functions, see `kiln`'s `transformed` module).
pub fn compile_cached_text(
    f: &Func,
    text: &str,
    donated: &[bool],
    opts: &Options,
) -> Result<Arc<dyn Executable>> {
    let b = backend()?;
    let mask: String = donated.iter().map(|&d| if d { 'd' } else { '-' }).collect();
    let key = format!("{}\n{opts:?}\n{mask}\n{text}", b.name());
    // The first caller for a key inserts its slot and compiles; callers that come while it
    // compiles wait for its outcome, an error included. A failed compile leaves the cache, so
    // a later call tries again.
    let (slot, first) = {
        let mut cache = CACHE.lock().unwrap_or_else(|e| e.into_inner());
        let map = cache.get_or_insert_with(HashMap::new);
        match map.get(&key) {
            Some(slot) => (slot.clone(), false),
            None => {
                let slot = Arc::new(Slot::default());
                map.insert(key.clone(), slot.clone());
                (slot, true)
            }
        }
    };
    if !first {
        return slot.wait();
    }
    let compiling = Compiling {
        key: &key,
        slot: &slot,
        finished: false,
    };
    compiling.finish(b.compile_with_options(f, donated, opts))
}

/// Compiles `f` with the installed backend without the in-process compile cache (neither
/// reusing an executable compiled earlier nor keeping this one for later), under `opts`: with
/// a new kernel cache directory (or none), everything is compiled anew. For measuring cold
/// compiles (the `compile_chain_*` benchmarks); programs use [`compile_cached`].
pub fn compile_uncached(f: &Func, donated: &[bool], opts: &Options) -> Result<Arc<dyn Executable>> {
    backend()?.compile_with_options(f, donated, opts)
}
