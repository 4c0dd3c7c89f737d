//! The fused graph drawn by Graphviz itself (`dot`; `cargo xtask test` installs Graphviz):
//! the picture holds every kernel and parameter of the program, as SVG and as PNG. Without
//! `dot` the test says so and passes, except in CI (`CI` set), where Graphviz is part of the
//! toolchain and its absence is an error.

use kiln_kernel::options::Options;
use kiln_kernel::pipeline::fusion_dot;
use kiln_kernel::render::{DEFAULT_DOT_PROGRAM, render_dot};

const SOFTMAX_MLP: &str = "func @main(%0: f32[8,16], %1: f32[16,4], %2: f32[4]) -> f32[8,4] {\n  %3 = dot_general %0, %1 {lhs_batching_dimensions = [], rhs_batching_dimensions = [], lhs_contracting_dimensions = [1], rhs_contracting_dimensions = [0]} : f32[8,4]\n  %4 = broadcast_in_dim %2 {broadcast_dimensions = [1]} : f32[8,4]\n  %5 = add %3, %4 : f32[8,4]\n  %6 = constant {value = -inf} : f32[]\n  %7 = reduce %5, %6 {dimensions = [1], kind = max} : f32[8]\n  %8 = broadcast_in_dim %7 {broadcast_dimensions = [0]} : f32[8,4]\n  %9 = subtract %5, %8 : f32[8,4]\n  %10 = exponential %9 : f32[8,4]\n  %11 = constant {value = 0.0} : f32[]\n  %12 = reduce %10, %11 {dimensions = [1], kind = add} : f32[8]\n  %13 = broadcast_in_dim %12 {broadcast_dimensions = [0]} : f32[8,4]\n  %14 = divide %10, %13 : f32[8,4]\n  return %14\n}\n";

fn graphviz() -> bool {
    let found = std::process::Command::new(DEFAULT_DOT_PROGRAM)
        .arg("-V")
        .output()
        .is_ok_and(|o| o.status.success());
    if !found && std::env::var_os("CI").is_some() {
        panic!("Graphviz's `dot` is not installed in CI (cargo xtask test installs it)");
    }
    found
}

#[test]
fn graphviz_draws_the_fused_graph_as_svg_and_png() {
    if !graphviz() {
        println!("Graphviz's `dot` is not installed: the fused graph is not drawn");
        return;
    }
    let f = kiln_ir::parse_func_text(SOFTMAX_MLP).unwrap();
    let dot = fusion_dot(&f, &Options::default()).unwrap();
    // Every box of the text: the kernels (`n<i>`) and the parameters (`p<i>`).
    let nodes: Vec<&str> = dot
        .lines()
        .filter(|l| l.contains("[") && l.contains("label="))
        .filter_map(|l| l.split_whitespace().next())
        .collect();
    assert!(nodes.iter().any(|n| n.starts_with('n')), "{dot}");
    assert_eq!(
        nodes.iter().filter(|n| n.starts_with('p')).count(),
        3,
        "{dot}"
    );
    let d = tempfile::tempdir().unwrap();
    let svg = d.path().join("fused.svg");
    let r = render_dot(&dot, &svg, DEFAULT_DOT_PROGRAM).unwrap();
    assert_eq!(std::fs::read_to_string(&r.dot).unwrap(), dot);
    let text = std::fs::read_to_string(&svg).unwrap();
    assert!(text.contains("<svg"), "{text}");
    for n in &nodes {
        // Graphviz titles each node's group with its name.
        assert!(
            text.contains(&format!("<title>{n}</title>")),
            "{n} missing:\n{text}"
        );
    }
    // The kernels' member ops are in the picture's text.
    for op in ["dot_general", "exponential", "divide"] {
        assert!(text.contains(op), "{op} missing:\n{text}");
    }
    let png = d.path().join("fused.png");
    render_dot(&dot, &png, DEFAULT_DOT_PROGRAM).unwrap();
    let bytes = std::fs::read(&png).unwrap();
    assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n");
    // IHDR: width and height, big-endian, after the chunk's length and type.
    let width = u32::from_be_bytes(bytes[16..20].try_into().unwrap());
    let height = u32::from_be_bytes(bytes[20..24].try_into().unwrap());
    assert!(width > 50 && height > 50, "{width} x {height}");
}
