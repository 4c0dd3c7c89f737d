//! Assertions on import errors: where they point and what they say.

use kiln_stablehlo::{ErrorKind, parse};

/// Asserts that importing `text` fails at `at` (`line:column`) with a message containing
/// `what`, of `kind`.
#[track_caller]
pub fn fails(text: &str, kind: ErrorKind, at: &str, what: &str) {
    let e = match parse(text) {
        Ok(_) => panic!("accepted: {text}"),
        Err(e) => e,
    };
    let shown = e.to_string();
    assert!(
        shown.starts_with(&format!("{at}: ")) && shown.contains(what) && e.kind == kind,
        "expected {kind:?} at {at}: …{what}…, got {:?}: {shown}",
        e.kind
    );
}
