//! The symbols an ELF object file defines and the ones it leaves for the linker to resolve,
//! read from its symbol table (`SHT_SYMTAB`): enough to tell whether the objects of a kernel
//! library call anything outside themselves (`cache::link`).

use std::collections::BTreeSet;

/// The global symbols of 64-bit little-endian ELF object `bytes`: those it defines and those it
/// refers to without defining; `None` if it is not such an object or its tables do not fit.
pub(crate) fn symbols(bytes: &[u8]) -> Option<(BTreeSet<String>, BTreeSet<String>)> {
    let u16_at = |at: usize| -> Option<u16> {
        Some(u16::from_le_bytes(bytes.get(at..at + 2)?.try_into().ok()?))
    };
    let u32_at = |at: usize| -> Option<u32> {
        Some(u32::from_le_bytes(bytes.get(at..at + 4)?.try_into().ok()?))
    };
    let u64_at = |at: usize| -> Option<usize> {
        usize::try_from(u64::from_le_bytes(bytes.get(at..at + 8)?.try_into().ok()?)).ok()
    };
    // "\x7fELF", 64-bit, little-endian.
    if bytes.get(..6)? != b"\x7fELF\x02\x01" {
        return None;
    }
    let (shoff, shentsize, shnum) = (u64_at(0x28)?, u16_at(0x3a)? as usize, u16_at(0x3c)?);
    let section = |i: usize| -> Option<(u32, usize, usize, u32, usize)> {
        let at = shoff.checked_add(i.checked_mul(shentsize)?)?;
        // sh_type, sh_offset, sh_size, sh_link, sh_entsize.
        Some((
            u32_at(at + 4)?,
            u64_at(at + 0x18)?,
            u64_at(at + 0x20)?,
            u32_at(at + 0x28)?,
            u64_at(at + 0x38)?,
        ))
    };
    const SHT_SYMTAB: u32 = 2;
    const STB_LOCAL: u8 = 0;
    let (mut defined, mut undefined) = (BTreeSet::new(), BTreeSet::new());
    for i in 0..shnum as usize {
        let (kind, off, size, link, entsize) = section(i)?;
        if kind != SHT_SYMTAB || entsize < 24 {
            continue;
        }
        let (_, str_off, str_size, _, _) = section(link as usize)?;
        let strings = bytes.get(str_off..str_off.checked_add(str_size)?)?;
        for s in 0..size / entsize {
            let at = off.checked_add(s * entsize)?;
            // st_name, st_info, st_shndx.
            let name = u32_at(at)? as usize;
            let bind = *bytes.get(at + 4)? >> 4;
            let shndx = u16_at(at + 6)?;
            let name = strings.get(name..)?;
            let name = String::from_utf8_lossy(&name[..name.iter().position(|&c| c == 0)?]);
            if bind == STB_LOCAL || name.is_empty() {
                continue;
            }
            if shndx == 0 {
                undefined.insert(name.into_owned());
            } else {
                defined.insert(name.into_owned());
            }
        }
    }
    Some((defined, undefined))
}

/// Whether objects `objects` (ELF, as [`symbols`] reads them) refer to a symbol none of them
/// defines; `true` when one cannot be read.
pub(crate) fn call_outside(objects: &[Vec<u8>]) -> bool {
    let (mut defined, mut undefined) = (BTreeSet::new(), BTreeSet::new());
    for o in objects {
        let Some((d, u)) = symbols(o) else {
            return true;
        };
        defined.extend(d);
        undefined.extend(u);
    }
    undefined.iter().any(|s| !defined.contains(s))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An object compiled by LLVM for this machine: a function that calls `powf` and one that
    /// calls the other. The objects alone call outside (`powf`), with one defining it they do
    /// not, and bytes that are no ELF object count as calling outside.
    #[test]
    fn objects_tell_what_they_call_outside() {
        use inkwell::context::Context;
        use inkwell::targets::FileType;
        let object = |src: &str| -> Vec<u8> {
            let ctx = Context::create();
            let buf = inkwell::memory_buffer::MemoryBuffer::create_from_memory_range_copy(
                src.as_bytes(),
                "m",
            );
            let m = ctx.create_module_from_ir(buf).expect("valid IR");
            let tm = crate::aot_machine(None).expect("a target machine");
            tm.write_to_memory_buffer(&m, FileType::Object)
                .expect("an object")
                .as_slice()
                .to_vec()
        };
        let calls = object(
            "declare float @powf(float, float)\ndefine float @k0(float %x) {\n  %y = call float @powf(float %x, float %x)\n  ret float %y\n}\ndefine float @k1(float %x) {\n  %y = call float @k0(float %x)\n  ret float %y\n}\n",
        );
        let (defined, undefined) = symbols(&calls).expect("an ELF object");
        assert!(
            defined.contains("k0") && defined.contains("k1"),
            "{defined:?}"
        );
        assert!(
            undefined.contains("powf") && !undefined.contains("k0"),
            "{undefined:?}"
        );
        assert!(call_outside(std::slice::from_ref(&calls)));
        let powf = object("define float @powf(float %x, float %y) {\n  ret float %x\n}\n");
        assert!(!call_outside(&[calls, powf]));
        assert!(call_outside(&[b"not an object".to_vec()]));
    }
}
