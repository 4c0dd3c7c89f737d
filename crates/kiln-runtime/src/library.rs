//! Shared libraries of compiled kernels, loaded with `dlopen`, and the checksum that guards
//! their bytes.
//!
//! The CPU backend's kernel cache (`kiln_codegen_llvm::cache`, which decides which files it
//! trusts) and `kiln-run` (which runs the library of an ahead-of-time artifact, with no
//! compiler linked) both load kernels through [`Library`]. A library runs as part of the
//! process that loads it: callers load only libraries whose bytes they checked ([`checksum`])
//! and whose files nobody else may write.

use std::ffi::{CStr, CString, c_void};
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::Path;

/// 128-bit FNV-1a of `bytes`, as 32 hex digits (stable across runs, builds and machines).
pub fn checksum(bytes: &[u8]) -> String {
    let mut h: u128 = 0x6c62272e07bb014262b821756295c58d;
    for &b in bytes {
        h ^= b as u128;
        h = h.wrapping_mul(0x0000000001000000000000000000013B);
    }
    format!("{h:032x}")
}

/// A loaded shared library of kernels (closed when dropped).
pub struct Library {
    handle: *mut c_void,
}

// SAFETY: the handle is only used to look up symbols (thread-safe in the C library) and to
// close the library once, on drop.
unsafe impl Send for Library {}
unsafe impl Sync for Library {}

unsafe extern "C" {
    fn dlopen(filename: *const std::ffi::c_char, flag: i32) -> *mut c_void;
    fn dlsym(handle: *mut c_void, symbol: *const std::ffi::c_char) -> *mut c_void;
    fn dlclose(handle: *mut c_void) -> i32;
    fn dlerror() -> *const std::ffi::c_char;
}

const RTLD_NOW: i32 = 2;
const RTLD_LOCAL: i32 = 0;

impl Library {
    /// Loads the library at `path` (the error names it and says why the loader refused it).
    pub fn open(path: &Path) -> Result<Library, String> {
        let c = CString::new(path.as_os_str().as_encoded_bytes()).map_err(|e| e.to_string())?;
        // SAFETY: a valid NUL-terminated path; callers load only libraries of kernels that
        // kiln built, whose initializers are the compiler's own.
        let handle = unsafe { dlopen(c.as_ptr(), RTLD_NOW | RTLD_LOCAL) };
        if handle.is_null() {
            // SAFETY: dlerror returns a NUL-terminated message (or null) after a failure.
            let msg = unsafe {
                let e = dlerror();
                if e.is_null() {
                    "unknown error".to_string()
                } else {
                    CStr::from_ptr(e).to_string_lossy().into_owned()
                }
            };
            return Err(format!("loading {}: {msg}", path.display()));
        }
        Ok(Library { handle })
    }

    /// Loads the library whose bytes are `bytes` (already checked by the caller): written to
    /// a fresh file only this user may read (mode 0600, in a folder of mode 0700 under the
    /// temporary directory), loaded, and the file removed, so that what is loaded is what was
    /// checked. `name` names the library in errors.
    pub fn from_bytes(bytes: &[u8], name: &str) -> Result<Library, String> {
        use std::sync::atomic::{AtomicUsize, Ordering};
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let dir = std::env::temp_dir().join(format!(
            "kiln-lib-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        let io = |e: std::io::Error| format!("{name}: writing it to {}: {e}", dir.display());
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&dir)
            .map_err(io)?;
        let path = dir.join("kernels.so");
        let written = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&path)
            .and_then(|mut f| f.write_all(bytes));
        let lib = written
            .map_err(io)
            .and_then(|()| Library::open(&path).map_err(|e| format!("{name}: {e}")));
        let _ = std::fs::remove_file(&path);
        let _ = std::fs::remove_dir(&dir);
        lib
    }

    /// The address of `name`, if the library defines it.
    pub fn symbol(&self, name: &str) -> Option<*const c_void> {
        let c = CString::new(name).ok()?;
        // SAFETY: the handle is open; dlsym only reads the name.
        let p = unsafe { dlsym(self.handle, c.as_ptr()) };
        (!p.is_null()).then_some(p as *const c_void)
    }
}

impl Drop for Library {
    fn drop(&mut self) {
        // SAFETY: opened by `open` and closed once; nothing uses its code afterwards (whoever
        // owns it drops the program that calls its kernels first).
        unsafe { dlclose(self.handle) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_checksum_is_stable_and_sees_every_byte() {
        assert_eq!(checksum(b""), "6c62272e07bb014262b821756295c58d");
        assert_ne!(checksum(b"kiln"), checksum(b"kilm"));
    }

    #[test]
    fn bytes_that_are_no_library_are_refused_with_the_loaders_reason() {
        let e = Library::from_bytes(b"not a shared library", "kernels/000.so")
            .err()
            .expect("refused");
        assert!(e.starts_with("kernels/000.so: loading"), "{e}");
    }
}
