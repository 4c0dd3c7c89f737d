//! A loss curve: training and held-out (step, loss) points, drawn to PNG or written as CSV.

use crate::{Error, Result};
use plotters::prelude::*;
use plotters::style::FontTransform;
use plotters::style::text_anchor::{HPos, Pos, VPos};
use std::collections::BTreeMap;
use std::io::Write;
use std::path::Path;

/// The largest width or height [`LossCurve::save_png`] draws.
const MAX_SIDE: u32 = 16384;
/// Training loss: blue.
const TRAIN: RGBColor = RGBColor(31, 119, 180);
/// Held-out loss: orange.
const HELDOUT: RGBColor = RGBColor(255, 127, 14);
/// Tick marks on each axis.
const TICKS: i32 = 5;

/// Training and optional held-out losses by step, for a picture or a table.
///
/// [`save_png`](LossCurve::save_png) draws with `plotters` into a bitmap and encodes it with
/// `png`; it needs no system fonts (its text is written with an embedded subset of DejaVu
/// Sans): the picture has axes with tick marks and their values at fifths of each range, the
/// axis names "step" and "loss", the training loss in blue, the held-out loss in orange and a
/// legend naming them. Pictures smaller than 160x120 pixels are drawn without text. For
/// numbers, [`save_csv`](LossCurve::save_csv) writes the points to plot elsewhere.
///
/// ```
/// use kiln::train::LossCurve;
/// # let dir = std::env::temp_dir().join(format!("kiln-doc-curve-{}", std::process::id()));
/// # std::fs::create_dir_all(&dir)?;
/// let mut curve = LossCurve::new();
/// for step in 0..50 {
///     curve.push(step, 2.0 / (1.0 + step as f32));
///     if step % 10 == 0 {
///         curve.push_heldout(step, 2.2 / (1.0 + step as f32));
///     }
/// }
/// curve.save_png(dir.join("loss.png"), 800, 600)?;
/// curve.save_csv(dir.join("loss.csv"))?; // step,loss,heldout
/// # assert_eq!(std::fs::read_to_string(dir.join("loss.csv"))?.lines().count(), 51);
/// # std::fs::remove_dir_all(&dir)?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Debug, Default, PartialEq)]
pub struct LossCurve {
    train: Vec<(usize, f32)>,
    heldout: Vec<(usize, f32)>,
}

impl LossCurve {
    /// An empty curve.
    ///
    /// # Examples
    ///
    /// ```
    /// let curve = kiln::train::LossCurve::new();
    /// assert!(curve.is_empty());
    /// assert!(curve.train().is_empty() && curve.heldout().is_empty());
    /// ```
    pub fn new() -> LossCurve {
        LossCurve::default()
    }

    /// Records the training loss at `step`.
    ///
    /// # Examples
    ///
    /// ```
    /// let mut curve = kiln::train::LossCurve::new();
    /// curve.push(0, 2.0);
    /// curve.push(1, 1.5);
    /// assert_eq!(curve.train(), [(0, 2.0), (1, 1.5)]);
    /// assert!(curve.heldout().is_empty() && !curve.is_empty());
    /// ```
    pub fn push(&mut self, step: usize, loss: f32) {
        self.train.push((step, loss));
    }

    /// Records a held-out loss at `step`.
    ///
    /// # Examples
    ///
    /// ```
    /// let mut curve = kiln::train::LossCurve::new();
    /// curve.push_heldout(10, 0.75);
    /// assert_eq!(curve.heldout(), [(10, 0.75)]);
    /// assert!(curve.train().is_empty() && !curve.is_empty());
    /// ```
    pub fn push_heldout(&mut self, step: usize, loss: f32) {
        self.heldout.push((step, loss));
    }

    /// The training points, in the order recorded.
    ///
    /// # Examples
    ///
    /// ```
    /// let mut curve = kiln::train::LossCurve::new();
    /// curve.push(5, 1.0);
    /// curve.push(2, 3.0); // kept as recorded, not sorted
    /// assert_eq!(curve.train(), [(5, 1.0), (2, 3.0)]);
    /// ```
    pub fn train(&self) -> &[(usize, f32)] {
        &self.train
    }

    /// The held-out points, in the order recorded.
    ///
    /// # Examples
    ///
    /// ```
    /// let mut curve = kiln::train::LossCurve::new();
    /// curve.push(0, 1.0);
    /// curve.push_heldout(0, 1.25);
    /// curve.push_heldout(8, 0.5);
    /// assert_eq!(curve.heldout(), [(0, 1.25), (8, 0.5)]);
    /// ```
    pub fn heldout(&self) -> &[(usize, f32)] {
        &self.heldout
    }

    /// Whether no point was recorded.
    ///
    /// # Examples
    ///
    /// ```
    /// let mut curve = kiln::train::LossCurve::new();
    /// assert!(curve.is_empty());
    /// curve.push_heldout(0, 1.0); // a held-out point alone counts
    /// assert!(!curve.is_empty());
    /// ```
    pub fn is_empty(&self) -> bool {
        self.train.is_empty() && self.heldout.is_empty()
    }

    /// Draws the curves into a `width` x `height` PNG at `path`. Non-finite losses are left
    /// out. Errors: no finite point, a side of zero or over 16384 pixels, or a file that
    /// cannot be written.
    ///
    /// # Examples
    ///
    /// ```
    /// use kiln::train::LossCurve;
    /// let name = format!("kiln-doc-curve-png-{}.png", std::process::id());
    /// let path = std::env::temp_dir().join(name);
    /// let mut curve = LossCurve::new();
    /// (0..20).for_each(|s| curve.push(s, 1.0 / (1.0 + s as f32)));
    /// curve.save_png(&path, 320, 240).unwrap();
    /// let png = png::Decoder::new(std::fs::File::open(&path).unwrap()).read_info().unwrap();
    /// assert_eq!((png.info().width, png.info().height), (320, 240));
    /// std::fs::remove_file(&path).unwrap();
    /// assert!(curve.save_png(&path, 0, 240).unwrap_err().message.contains("0x240"));
    /// assert!(LossCurve::new().save_png(&path, 320, 240).is_err()); // nothing to draw
    /// ```
    #[track_caller]
    pub fn save_png(&self, path: impl AsRef<Path>, width: u32, height: u32) -> Result<()> {
        let path = path.as_ref();
        let op = "LossCurve::save_png";
        if width == 0 || height == 0 || width > MAX_SIDE || height > MAX_SIDE {
            return Err(Error::new(
                op,
                format!(
                    "the picture is {width}x{height} pixels; each side must be 1 to {MAX_SIDE}"
                ),
            ));
        }
        let finite = |v: &[(usize, f32)]| -> Vec<(f64, f64)> {
            v.iter()
                .filter(|(_, l)| l.is_finite())
                .map(|&(s, l)| (s as f64, l as f64))
                .collect()
        };
        let (train, heldout) = (finite(&self.train), finite(&self.heldout));
        let all = || train.iter().chain(heldout.iter());
        if all().next().is_none() {
            return Err(Error::new(
                op,
                format!(
                    "the curve has no finite loss to draw ({} training and {} held-out points)",
                    self.train.len(),
                    self.heldout.len()
                ),
            ));
        }
        let span = |lo: f64, hi: f64| {
            let pad = if hi > lo {
                (hi - lo) * 0.05
            } else {
                0.5_f64.max(lo.abs() * 0.05)
            };
            (lo - pad)..(hi + pad)
        };
        let fold = |f: fn(&(f64, f64)) -> f64| {
            all()
                .map(f)
                .fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), v| {
                    (a.min(v), b.max(v))
                })
        };
        let (x0, x1) = fold(|p| p.0);
        let (y0, y1) = fold(|p| p.1);
        let mut pixels = vec![0u8; width as usize * height as usize * 3];
        // Whatever the points, a failure inside the drawing library is an error, not a panic.
        let drawn = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            draw(
                &mut pixels,
                (width, height),
                span(x0, x1),
                span(y0, y1),
                &train,
                &heldout,
            )
        }))
        .unwrap_or_else(|_| Err("the drawing library panicked".to_string()));
        drawn.map_err(|e| Error::new(op, format!("drawing failed: {e}")))?;
        let io = |e: &dyn std::fmt::Display| {
            Error::new(op, format!("cannot write {}: {e}", path.display()))
        };
        let file = std::fs::File::create(path).map_err(|e| io(&e))?;
        let mut encoder = png::Encoder::new(std::io::BufWriter::new(file), width, height);
        encoder.set_color(png::ColorType::Rgb);
        encoder.set_depth(png::BitDepth::Eight);
        let mut writer = encoder.write_header().map_err(|e| io(&e))?;
        writer.write_image_data(&pixels).map_err(|e| io(&e))?;
        writer.finish().map_err(|e| io(&e))
    }

    /// Writes the points as CSV at `path`: a header `step,loss,heldout`, then one row per
    /// step in increasing order, a field left empty where that curve has no point (the last
    /// point recorded at a step wins). Errors: an empty curve or a file that cannot be
    /// written.
    ///
    /// # Examples
    ///
    /// ```
    /// use kiln::train::LossCurve;
    /// let name = format!("kiln-doc-curve-csv-{}.csv", std::process::id());
    /// let path = std::env::temp_dir().join(name);
    /// let mut curve = LossCurve::new();
    /// curve.push(1, 1.5);
    /// curve.push(0, 2.0);
    /// curve.push_heldout(0, 2.5);
    /// curve.save_csv(&path).unwrap();
    /// assert_eq!(std::fs::read_to_string(&path).unwrap(), "step,loss,heldout\n0,2,2.5\n1,1.5,\n");
    /// std::fs::remove_file(&path).unwrap();
    /// assert!(LossCurve::new().save_csv(&path).is_err()); // an empty curve
    /// ```
    #[track_caller]
    pub fn save_csv(&self, path: impl AsRef<Path>) -> Result<()> {
        let path = path.as_ref();
        let op = "LossCurve::save_csv";
        if self.is_empty() {
            return Err(Error::new(op, "the curve has no points to write"));
        }
        let mut rows: BTreeMap<usize, (Option<f32>, Option<f32>)> = BTreeMap::new();
        for &(s, l) in &self.train {
            rows.entry(s).or_default().0 = Some(l);
        }
        for &(s, l) in &self.heldout {
            rows.entry(s).or_default().1 = Some(l);
        }
        let field = |v: Option<f32>| v.map(|l| l.to_string()).unwrap_or_default();
        let mut text = String::from("step,loss,heldout\n");
        for (s, (l, h)) in rows {
            text.push_str(&format!("{s},{},{}\n", field(l), field(h)));
        }
        std::fs::File::create(path)
            .and_then(|mut f| f.write_all(text.as_bytes()))
            .map_err(|e| Error::new(op, format!("cannot write {}: {e}", path.display())))
    }
}

/// The smallest picture (width, height) that gets text; smaller ones get only the axes,
/// tick marks and curves.
const MIN_TEXT: (u32, u32) = (160, 120);

/// Tick label `i` of [`TICKS`] over `range`, with as many decimals as the tick spacing needs
/// (powers of ten for very large or very small numbers).
fn tick_label(range: &std::ops::Range<f64>, i: i32) -> String {
    let gap = (range.end - range.start) / TICKS as f64;
    let v = range.start + gap * i as f64;
    let big = range.start.abs().max(range.end.abs());
    if big >= 1e6 || (gap > 0.0 && gap < 1e-4) {
        return format!("{v:.2e}");
    }
    let decimals = if gap > 0.0 {
        (1.0 - gap.log10()).ceil().clamp(0.0, 6.0) as usize
    } else {
        2
    };
    let text = format!("{v:.decimals$}");
    // "-0.00" reads as zero.
    if text.starts_with('-') && text[1..].chars().all(|c| c == '0' || c == '.') {
        text[1..].to_string()
    } else {
        text
    }
}

/// Draws the picture into an RGB buffer: axes with tick marks at fifths of each range and
/// the curves; when the picture is at least [`MIN_TEXT`] and the embedded font loads, tick
/// labels, the axis names ("step", "loss") and a legend ("train", "held-out") too.
fn draw(
    pixels: &mut [u8],
    (width, height): (u32, u32),
    xs: std::ops::Range<f64>,
    ys: std::ops::Range<f64>,
    train: &[(f64, f64)],
    heldout: &[(f64, f64)],
) -> std::result::Result<(), String> {
    let text = |e: &dyn std::fmt::Display| e.to_string();
    let root = BitMapBackend::with_buffer(pixels, (width, height)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| text(&e))?;
    let small = width.min(height);
    let margin = small / 12;
    let tick = (small as i32 / 80).max(2);
    let labels = width >= MIN_TEXT.0 && height >= MIN_TEXT.1 && super::font::ready();
    let size = (small as i32 / 28).clamp(9, 24);
    let style = TextStyle::from((super::font::FAMILY, size).into_font()).color(&BLACK);
    let x_labels: Vec<String> = (0..=TICKS).map(|i| tick_label(&xs, i)).collect();
    let y_labels: Vec<String> = (0..=TICKS).map(|i| tick_label(&ys, i)).collect();
    let text_width = |s: &str| -> std::result::Result<i32, String> {
        let (w, _) = root.estimate_text_size(s, &style).map_err(|e| text(&e))?;
        Ok(w as i32)
    };
    let mut builder = ChartBuilder::on(&root);
    builder.margin(margin);
    let mut widest = 0;
    if labels {
        for l in &y_labels {
            widest = widest.max(text_width(l)?);
        }
        // Tick labels, a gap and the rotated axis name to the left; a row of tick labels
        // and the axis name below.
        builder.margin_left(margin as i32 + tick + widest + 2 * size);
        builder.margin_bottom(margin as i32 + tick + 3 * size);
    }
    let mut chart = builder.build_cartesian_2d(xs, ys).map_err(|e| text(&e))?;
    let ((left, right), (top, bottom)) = {
        let (xr, yr) = chart.plotting_area().get_pixel_range();
        ((xr.start, xr.end - 1), (yr.start, yr.end - 1))
    };
    let axes = [(left, top), (left, bottom), (right, bottom)];
    root.draw(&PathElement::new(axes.to_vec(), BLACK.stroke_width(1)))
        .map_err(|e| text(&e))?;
    for i in 0..=TICKS {
        let x = left + (right - left) * i / TICKS;
        let y = bottom - (bottom - top) * i / TICKS;
        root.draw(&PathElement::new(
            vec![(x, bottom), (x, bottom + tick)],
            BLACK,
        ))
        .map_err(|e| text(&e))?;
        root.draw(&PathElement::new(vec![(left - tick, y), (left, y)], BLACK))
            .map_err(|e| text(&e))?;
        if labels {
            let at = |h, v| style.pos(Pos::new(h, v));
            root.draw(&Text::new(
                x_labels[i as usize].as_str(),
                (x, bottom + tick + 2),
                at(HPos::Center, VPos::Top),
            ))
            .map_err(|e| text(&e))?;
            root.draw(&Text::new(
                y_labels[i as usize].as_str(),
                (left - tick - 3, y),
                at(HPos::Right, VPos::Center),
            ))
            .map_err(|e| text(&e))?;
        }
    }
    if labels {
        root.draw(&Text::new(
            "step",
            ((left + right) / 2, bottom + tick + 2 + size + size / 2),
            style.pos(Pos::new(HPos::Center, VPos::Top)),
        ))
        .map_err(|e| text(&e))?;
        root.draw(&Text::new(
            "loss",
            (left - tick - 3 - widest - size, (top + bottom) / 2),
            style
                .transform(FontTransform::Rotate270)
                .pos(Pos::new(HPos::Center, VPos::Center)),
        ))
        .map_err(|e| text(&e))?;
    }
    let stroke = (small / 300).max(1);
    for (points, color) in [(heldout, HELDOUT), (train, TRAIN)] {
        match points.len() {
            0 => {}
            1 => {
                chart
                    .draw_series(std::iter::once(Circle::new(
                        points[0],
                        stroke + 2,
                        color.filled(),
                    )))
                    .map_err(|e| text(&e))?;
            }
            _ => {
                chart
                    .draw_series(LineSeries::new(
                        points.iter().copied(),
                        color.stroke_width(stroke),
                    ))
                    .map_err(|e| text(&e))?;
            }
        }
    }
    if labels {
        // The legend: a framed box in the upper right corner of the plot.
        let entries: Vec<(&str, RGBColor)> =
            [("train", TRAIN, train), ("held-out", HELDOUT, heldout)]
                .into_iter()
                .filter(|(_, _, points)| !points.is_empty())
                .map(|(name, color, _)| (name, color))
                .collect();
        let pad = (size / 2).max(2);
        let line = 2 * size;
        let mut names = 0;
        for (name, _) in &entries {
            names = names.max(text_width(name)?);
        }
        let (w, h) = (
            3 * pad + line + names,
            pad + entries.len() as i32 * (size + pad),
        );
        let (x0, y0) = (right - pad - w, top + pad);
        let frame = [(x0, y0), (x0 + w, y0 + h)];
        root.draw(&Rectangle::new(frame, WHITE.filled()))
            .map_err(|e| text(&e))?;
        root.draw(&Rectangle::new(frame, BLACK.stroke_width(1)))
            .map_err(|e| text(&e))?;
        for (i, (name, color)) in entries.into_iter().enumerate() {
            let y = y0 + pad + i as i32 * (size + pad) + size / 2;
            root.draw(&PathElement::new(
                vec![(x0 + pad, y), (x0 + pad + line, y)],
                color.stroke_width(stroke + 1),
            ))
            .map_err(|e| text(&e))?;
            root.draw(&Text::new(
                name,
                (x0 + 2 * pad + line, y),
                style.pos(Pos::new(HPos::Left, VPos::Center)),
            ))
            .map_err(|e| text(&e))?;
        }
    }
    root.present().map_err(|e| text(&e))
}
