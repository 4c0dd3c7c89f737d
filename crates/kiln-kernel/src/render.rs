//! Rendering Graphviz text (such as [`crate::pipeline::fusion_dot`]'s) to an SVG or PNG
//! picture by running Graphviz's `dot` program.
//!
//! The `.dot` text is always written next to the requested picture first (`graph.svg` gets
//! `graph.dot`), so the graph is kept even where `dot` is missing or fails. The program is a
//! parameter (`dot` from the `PATH` by default at the command lines), never read from the
//! environment here.

use std::io::ErrorKind;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The program the command lines run unless told otherwise.
pub const DEFAULT_DOT_PROGRAM: &str = "dot";

/// How to get Graphviz's `dot`, for the message when it is missing.
pub const INSTALL_HINT: &str = "install Graphviz (`apt-get install graphviz` on Debian or Ubuntu, \
     `brew install graphviz` on macOS) or name the program with --dot-program";

/// The picture formats [`render_dot`] writes, chosen by the output's extension.
pub const FORMATS: &[&str] = &["svg", "png"];

/// What [`render_dot`] wrote.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rendered {
    /// The picture.
    pub picture: PathBuf,
    /// The Graphviz text next to it.
    pub dot: PathBuf,
}

/// The format `out` asks for (`svg` or `png`, from its extension, in any case).
pub fn format_of(out: &Path) -> Result<&'static str, String> {
    let ext = out
        .extension()
        .and_then(|e| e.to_str())
        .map(str::to_ascii_lowercase);
    match ext
        .as_deref()
        .and_then(|e| FORMATS.iter().find(|f| **f == e))
    {
        Some(f) => Ok(f),
        None => Err(format!(
            "render: cannot tell the picture format of `{}`; name a file ending in {}",
            out.display(),
            FORMATS
                .iter()
                .map(|f| format!(".{f}"))
                .collect::<Vec<_>>()
                .join(" or ")
        )),
    }
}

/// Writes `dot` (Graphviz text) to `out` with the `.dot` extension, then runs
/// `program -T<format> -o <out> <out.dot>` to draw it as `out` (SVG or PNG by its
/// extension). Errors, each naming the `.dot` file kept: an extension other than `.svg` or
/// `.png` (nothing written), a `.dot` file that cannot be written, a program that is not
/// installed (with how to install Graphviz), or one that fails or writes no picture (with
/// its own message).
pub fn render_dot(dot: &str, out: &Path, program: &str) -> Result<Rendered, String> {
    let format = format_of(out)?;
    let dot_path = out.with_extension("dot");
    std::fs::write(&dot_path, dot)
        .map_err(|e| format!("render: cannot write {}: {e}", dot_path.display()))?;
    let kept = format!("the graph's text is in {}", dot_path.display());
    // A picture left from an earlier run must not pass for this one.
    match std::fs::remove_file(out) {
        Ok(()) => {}
        Err(e) if e.kind() == ErrorKind::NotFound => {}
        Err(e) => return Err(format!("render: cannot replace {}: {e}", out.display())),
    }
    let result = Command::new(program)
        .arg(format!("-T{format}"))
        .arg("-o")
        .arg(out)
        .arg(&dot_path)
        .output();
    let output = match result {
        Ok(o) => o,
        Err(e) if e.kind() == ErrorKind::NotFound => {
            return Err(format!(
                "render: Graphviz's `dot` is needed to draw {} and `{program}` was not found; \
                 {INSTALL_HINT}; {kept}",
                out.display()
            ));
        }
        Err(e) => return Err(format!("render: cannot run `{program}`: {e}; {kept}")),
    };
    if !output.status.success() {
        return Err(format!(
            "render: `{program}` failed ({}) drawing {}: {}; {kept}",
            output.status,
            out.display(),
            String::from_utf8_lossy(&output.stderr).trim()
        ));
    }
    if !out.is_file() {
        return Err(format!(
            "render: `{program}` succeeded but wrote no {}; {kept}",
            out.display()
        ));
    }
    Ok(Rendered {
        picture: out.to_path_buf(),
        dot: dot_path,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const GRAPH: &str = "digraph g {\n  a -> b;\n}\n";

    fn dir() -> tempfile::TempDir {
        tempfile::tempdir().expect("a temporary directory")
    }

    #[test]
    fn the_format_comes_from_the_extension() {
        assert_eq!(format_of(Path::new("g.svg")), Ok("svg"));
        assert_eq!(format_of(Path::new("g.PNG")), Ok("png"));
        for bad in ["g.pdf", "g", "g.dot"] {
            let e = format_of(Path::new(bad)).unwrap_err();
            assert!(e.contains(".svg or .png"), "{e}");
        }
    }

    #[test]
    fn a_missing_program_says_how_to_install_graphviz_and_keeps_the_text() {
        let d = dir();
        let out = d.path().join("graph.svg");
        let missing = d.path().join("no-such-dot");
        let e = render_dot(GRAPH, &out, missing.to_str().unwrap()).unwrap_err();
        assert!(e.contains("Graphviz's `dot` is needed"), "{e}");
        assert!(e.contains("apt-get install graphviz"), "{e}");
        assert!(e.contains("brew install graphviz"), "{e}");
        let kept = d.path().join("graph.dot");
        assert!(e.contains(&kept.display().to_string()), "{e}");
        assert_eq!(std::fs::read_to_string(kept).unwrap(), GRAPH);
        assert!(!out.exists());
    }

    #[cfg(unix)]
    fn script(d: &Path, name: &str, body: &str) -> PathBuf {
        use std::os::unix::fs::PermissionsExt;
        let p = d.join(name);
        std::fs::write(&p, format!("#!/bin/sh\n{body}\n")).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
        p
    }

    /// A stand-in for `dot`: `-T<format> -o OUT IN` copies IN to OUT after the format.
    #[cfg(unix)]
    #[test]
    fn the_program_draws_the_picture_with_the_format_of_the_extension() {
        let d = dir();
        let fake = script(
            d.path(),
            "fake-dot",
            r#"[ "$2" = "-o" ] || exit 3; { echo "format $1"; cat "$4"; } > "$3""#,
        );
        for (name, format) in [("graph.svg", "-Tsvg"), ("graph.png", "-Tpng")] {
            let out = d.path().join(name);
            let r = render_dot(GRAPH, &out, fake.to_str().unwrap()).unwrap();
            assert_eq!(r.picture, out);
            assert_eq!(r.dot, d.path().join("graph.dot"));
            assert_eq!(
                std::fs::read_to_string(&out).unwrap(),
                format!("format {format}\n{GRAPH}")
            );
        }
    }

    #[cfg(unix)]
    #[test]
    fn a_failing_program_reports_its_message_and_leaves_no_stale_picture() {
        let d = dir();
        let out = d.path().join("graph.svg");
        std::fs::write(&out, "old picture").unwrap();
        let failing = script(
            d.path(),
            "bad-dot",
            "echo 'syntax error in line 2' >&2; exit 1",
        );
        let e = render_dot(GRAPH, &out, failing.to_str().unwrap()).unwrap_err();
        assert!(e.contains("syntax error in line 2"), "{e}");
        assert!(e.contains("graph.dot"), "{e}");
        assert!(!out.exists(), "the earlier picture is not left in place");
        let silent = script(d.path(), "silent-dot", "exit 0");
        let e = render_dot(GRAPH, &out, silent.to_str().unwrap()).unwrap_err();
        assert!(e.contains("wrote no"), "{e}");
    }

    #[test]
    fn an_unknown_extension_writes_nothing() {
        let d = dir();
        let out = d.path().join("graph.pdf");
        assert!(render_dot(GRAPH, &out, DEFAULT_DOT_PROGRAM).is_err());
        assert!(!d.path().join("graph.dot").exists());
    }
}
