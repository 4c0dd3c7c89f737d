//! The font the loss-curve pictures write their labels with, embedded so that drawing needs
//! no system fonts: a subset of DejaVu Sans (the printable ASCII characters and a few signs),
//! whose license (`assets/fonts/LICENSE-DejaVu.txt`) allows redistribution.

use plotters::style::FontStyle;
use std::sync::OnceLock;

/// The family name the font is registered under with plotters.
pub(crate) const FAMILY: &str = "kiln-dejavu-sans";

/// The font file's bytes.
static BYTES: &[u8] = include_bytes!("../../assets/fonts/DejaVuSans-subset.ttf");

/// Registers the font with plotters once; whether it is usable (a font that does not parse
/// leaves the pictures without text rather than failing them).
pub(crate) fn ready() -> bool {
    static READY: OnceLock<bool> = OnceLock::new();
    *READY.get_or_init(|| plotters::style::register_font(FAMILY, FontStyle::Normal, BYTES).is_ok())
}
