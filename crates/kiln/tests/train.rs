//! `kiln::train`: plain progress lines off a terminal, loss curves as PNG and CSV, and clear
//! errors on bad input.

use kiln::train::{LossCurve, Progress, plain_line, summary_line};
use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// A writer whose bytes the test reads afterwards.
#[derive(Clone, Default)]
struct Shared(Arc<Mutex<Vec<u8>>>);

impl Write for Shared {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn lines(steps: usize) -> Vec<String> {
    let out = Shared::default();
    let mut p = Progress::with_writer(steps, 16, Box::new(out.clone()));
    for i in 0..steps {
        p.step(1.0 / (1.0 + i as f32));
    }
    assert_eq!(p.done(), steps);
    p.finish();
    let text = String::from_utf8(out.0.lock().unwrap().clone()).unwrap();
    text.lines().map(str::to_string).collect()
}

/// "step 40/400  loss ..." -> (40, 400, loss).
fn parse(line: &str) -> (usize, usize, f32) {
    let f: Vec<&str> = line.split_whitespace().collect();
    assert_eq!(
        (f[0], f[2], f[5], f[6]),
        ("step", "loss", "samples/s", "eta"),
        "{line}"
    );
    let (s, n) = f[1].split_once('/').unwrap();
    (
        s.parse().unwrap(),
        n.parse().unwrap(),
        f[3].parse().unwrap(),
    )
}

#[test]
fn plain_progress_prints_about_ten_lines_and_a_summary() {
    let l = lines(400);
    assert_eq!(l.len(), 11, "{l:#?}");
    let steps: Vec<usize> = l[..10].iter().map(|x| parse(x).0).collect();
    assert_eq!(steps, (1..=10).map(|i| 40 * i).collect::<Vec<_>>());
    let (_, total, loss) = parse(&l[9]);
    assert_eq!(total, 400);
    assert_eq!(loss, 0.0025);
    assert!(l[10].starts_with("done: 400 steps in "), "{}", l[10]);
    assert!(l[10].contains("final loss 0.0025"), "{}", l[10]);
}

#[test]
fn plain_progress_with_few_steps_prints_each_and_the_last() {
    // 7 steps: every step (7 / 10 rounds to 0, at least 1).
    let l = lines(7);
    assert_eq!(l.len(), 8, "{l:#?}");
    assert_eq!(parse(&l[6]).0, 7);
    // 25 steps: every 2nd, and the last.
    let l = lines(25);
    let steps: Vec<usize> = l[..l.len() - 1].iter().map(|x| parse(x).0).collect();
    let mut want: Vec<usize> = (1..=12).map(|i| 2 * i).collect();
    want.push(25);
    assert_eq!(steps, want);
    // No step at all: only the summary.
    assert_eq!(
        lines(0),
        vec!["done: 0 steps in 0s, no loss recorded".to_string()]
    );
}

#[test]
fn line_formats_are_fixed() {
    assert_eq!(
        plain_line(3, 10, 0.5, 99.6, Duration::from_millis(7400)),
        "step 3/10  loss 0.5000  100 samples/s  eta 7s"
    );
    assert_eq!(
        summary_line(10, Some(f32::NAN), Duration::from_secs(2), 12.0),
        "done: 10 steps in 2s, final loss NaN, 12 samples/s"
    );
}

fn curve() -> LossCurve {
    let mut c = LossCurve::new();
    for s in 0..60 {
        c.push(s, 2.0 / (1.0 + s as f32));
        if s % 20 == 0 {
            c.push_heldout(s, 2.5 / (1.0 + s as f32));
        }
    }
    c
}

fn read_png(path: &std::path::Path) -> (u32, u32, Vec<u8>, png::ColorType) {
    let decoder = png::Decoder::new(std::fs::File::open(path).unwrap());
    let mut reader = decoder.read_info().unwrap();
    let mut buf = vec![0; reader.output_buffer_size()];
    let info = reader.next_frame(&mut buf).unwrap();
    buf.truncate(info.buffer_size());
    (info.width, info.height, buf, info.color_type)
}

#[test]
fn loss_curve_png_has_the_size_and_draws_the_curves() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("loss.png");
    curve().save_png(&path, 320, 200).unwrap();
    let (w, h, px, color) = read_png(&path);
    assert_eq!((w, h, color), (320, 200, png::ColorType::Rgb));
    let rgb: Vec<&[u8]> = px.chunks(3).collect();
    assert_eq!(rgb[0], [255, 255, 255], "background is white");
    let count = |f: &dyn Fn(&[u8]) -> bool| rgb.iter().filter(|p| f(p)).count();
    // Lines are anti-aliased: count pixels of each curve's hue (blended with white).
    let blue = count(&|p| p[2] > p[0].saturating_add(40));
    let orange = count(&|p| p[0] > p[2].saturating_add(40) && p[1] > p[2]);
    assert!(blue > 150, "training curve drawn: {blue} pixels");
    assert!(orange > 60, "held-out curve drawn: {orange} pixels");
    assert!(count(&|p| p == [0, 0, 0]) > 300, "axes drawn");
    // Deterministic: the same curve gives the same bytes.
    let again = dir.path().join("again.png");
    curve().save_png(&again, 320, 200).unwrap();
    assert_eq!(
        std::fs::read(&path).unwrap(),
        std::fs::read(&again).unwrap()
    );
    // One point, a flat line and tiny pictures draw too.
    let mut one = LossCurve::new();
    one.push(5, 1.0);
    one.save_png(dir.path().join("one.png"), 64, 64).unwrap();
    one.push(6, 1.0);
    one.save_png(dir.path().join("tiny.png"), 1, 1).unwrap();
    assert_eq!(read_png(&dir.path().join("tiny.png")).0, 1);
}

#[test]
fn loss_curve_csv_reads_back() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("loss.csv");
    let c = curve();
    c.save_csv(&path).unwrap();
    let text = std::fs::read_to_string(&path).unwrap();
    let mut rows = text.lines();
    assert_eq!(rows.next(), Some("step,loss,heldout"));
    let mut train = vec![];
    let mut heldout = vec![];
    for row in rows {
        let f: Vec<&str> = row.split(',').collect();
        assert_eq!(f.len(), 3, "{row}");
        let s: usize = f[0].parse().unwrap();
        train.push((s, f[1].parse::<f32>().unwrap()));
        if !f[2].is_empty() {
            heldout.push((s, f[2].parse::<f32>().unwrap()));
        }
    }
    assert_eq!(train, c.train());
    assert_eq!(heldout, c.heldout());
}

#[test]
fn bad_input_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let png = dir.path().join("x.png");
    let e = LossCurve::new().save_png(&png, 100, 100).unwrap_err();
    assert_eq!(e.op, "LossCurve::save_png");
    assert!(e.message.contains("no finite loss"), "{e}");
    assert!(
        e.to_string().contains("tests/train.rs"),
        "names the caller's line: {e}"
    );
    let mut nan = LossCurve::new();
    nan.push(0, f32::NAN);
    assert!(
        nan.save_png(&png, 100, 100)
            .unwrap_err()
            .message
            .contains("no finite loss")
    );
    for (w, h) in [(0, 100), (100, 0), (100_000, 10)] {
        let e = curve().save_png(&png, w, h).unwrap_err();
        assert!(e.message.contains(&format!("{w}x{h} pixels")), "{e}");
    }
    assert!(!png.exists());
    let e = LossCurve::new()
        .save_csv(dir.path().join("x.csv"))
        .unwrap_err();
    assert_eq!(e.op, "LossCurve::save_csv");
    assert!(e.message.contains("no points"), "{e}");
    let missing = dir.path().join("no/such/dir/loss");
    let e = curve()
        .save_png(missing.with_extension("png"), 10, 10)
        .unwrap_err();
    assert!(
        e.message.contains("cannot write") && e.message.contains("no/such/dir"),
        "{e}"
    );
    let e = curve().save_csv(missing.with_extension("csv")).unwrap_err();
    assert!(
        e.message.contains("cannot write") && e.message.contains("no/such/dir"),
        "{e}"
    );
}

/// Pixels of text: grey (neither white nor black, no hue), which only the anti-aliased
/// glyphs draw (the axes are pure black, the curves blue and orange).
fn is_text(p: &[u8]) -> bool {
    let (lo, hi) = (p[0].min(p[1]).min(p[2]), p[0].max(p[1]).max(p[2]));
    hi < 230 && lo > 0 && hi - lo < 12
}

/// (text pixels in the left margin, below the plot, in the legend's corner), found from the
/// axes: the column and the row with the most pure-black pixels.
fn text_regions(path: &std::path::Path) -> (usize, usize, usize) {
    let (w, h, px, _) = read_png(path);
    let (w, h) = (w as usize, h as usize);
    let at = |x: usize, y: usize| &px[(y * w + x) * 3..(y * w + x) * 3 + 3];
    let black = |x, y| at(x, y) == [0, 0, 0];
    let axis_x = (0..w)
        .max_by_key(|&x| (0..h).filter(|&y| black(x, y)).count())
        .unwrap();
    let axis_y = (0..h)
        .max_by_key(|&y| (0..w).filter(|&x| black(x, y)).count())
        .unwrap();
    let count = |xs: std::ops::Range<usize>, ys: std::ops::Range<usize>| {
        ys.flat_map(|y| xs.clone().map(move |x| (x, y)))
            .filter(|&(x, y)| is_text(at(x, y)))
            .count()
    };
    (
        count(0..axis_x, 0..axis_y),
        count(axis_x..w, axis_y..h),
        count(w * 3 / 4..w, 0..h / 3),
    )
}

#[test]
fn loss_curve_png_has_tick_labels_axis_names_and_a_legend() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("loss.png");
    curve().save_png(&path, 640, 400).unwrap();
    let (left, below, legend) = text_regions(&path);
    // Six tick values and "loss" to the left, six values and "step" below, "train" and
    // "held-out" in the upper right corner.
    assert!(left > 250, "labels left of the plot: {left} text pixels");
    assert!(below > 250, "labels below the plot: {below} text pixels");
    assert!(legend > 100, "legend: {legend} text pixels");
    // Below 160x120 pixels there is no room for text: none drawn.
    let small = dir.path().join("small.png");
    curve().save_png(&small, 150, 110).unwrap();
    let (l, b, g) = text_regions(&small);
    assert_eq!(l + b + g, 0, "no text in a small picture");
    // Only a training curve: the legend still has its entry, fewer text pixels.
    let mut train_only = LossCurve::new();
    for s in 0..60 {
        train_only.push(s, 2.0 / (1.0 + s as f32));
    }
    let one = dir.path().join("train-only.png");
    train_only.save_png(&one, 640, 400).unwrap();
    let (_, _, legend_one) = text_regions(&one);
    assert!(
        legend_one > 30 && legend_one < legend,
        "one legend entry: {legend_one} text pixels, two: {legend}"
    );
}

#[test]
fn loss_curve_png_draws_any_finite_numbers_without_panicking() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("x.png");
    let mut curves = vec![];
    for values in [
        vec![f32::MAX, -f32::MAX],
        vec![f32::MIN_POSITIVE, 2.0 * f32::MIN_POSITIVE],
        vec![1e-30, 1e30],
        vec![0.0, -0.0],
        vec![-5.0, f32::INFINITY, f32::NAN, -7.5],
    ] {
        let mut c = LossCurve::new();
        for (i, v) in values.iter().enumerate() {
            c.push(i * (usize::MAX / 4), *v);
            c.push_heldout(i, -v);
        }
        curves.push(c);
    }
    for c in &curves {
        for (w, h) in [(160, 120), (161, 3000), (3000, 161), (1, 1), (200, 2)] {
            c.save_png(&path, w, h)
                .unwrap_or_else(|e| panic!("{w}x{h} {c:?}: {e}"));
        }
    }
}
