//! A progress bar for a training loop: steps done, the latest loss, samples per second and
//! the time left.

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use std::io::{IsTerminal, Write};
use std::time::{Duration, Instant};

/// Lines a run prints when stderr is not a terminal (besides the summary).
const PLAIN_LINES: usize = 10;

/// Where the progress goes.
enum Output {
    /// An `indicatif` bar drawn on stderr (a terminal).
    Bar(ProgressBar),
    /// Plain lines, one every `every` steps, and a summary (CI logs, pipes, a given writer).
    Lines {
        out: Box<dyn Write + Send>,
        every: usize,
    },
    /// Nothing.
    Quiet,
}

/// Progress of a training loop of a known number of steps.
///
/// On a terminal it draws an `indicatif` bar on stderr with the steps done, the latest
/// loss, the throughput in samples per second and the time left. When stderr is not a
/// terminal (CI, pipes) it draws no bar; it prints one plain line (see [`plain_line`]) every
/// `max(1, steps / 10)` steps, about ten lines a run, and a summary line (see
/// [`summary_line`]) at [`finish`](Progress::finish).
///
/// ```
/// use kiln::train::Progress;
/// // Plain lines into a writer of the caller's (here a buffer that is dropped).
/// let mut p = Progress::with_writer(20, 8, Box::new(Vec::new()));
/// for i in 0..20 {
///     p.step(1.0 / (1.0 + i as f32));
/// }
/// p.finish();
/// ```
pub struct Progress {
    output: Output,
    steps: usize,
    samples_per_step: usize,
    done: usize,
    loss: Option<f32>,
    start: Instant,
}

impl Progress {
    /// Progress of `steps` steps of `samples_per_step` samples each: a bar on stderr when it is
    /// a terminal, else plain lines on stderr.
    ///
    /// # Examples
    ///
    /// ```
    /// let mut p = kiln::train::Progress::new(4, 32);
    /// p.step(0.5);
    /// assert_eq!((p.done(), p.loss()), (1, Some(0.5)));
    /// p.finish();
    /// ```
    pub fn new(steps: usize, samples_per_step: usize) -> Progress {
        if std::io::stderr().is_terminal() {
            let bar =
                ProgressBar::with_draw_target(Some(steps as u64), ProgressDrawTarget::stderr());
            let style = ProgressStyle::with_template(
                "{bar:40} {pos}/{len} [{elapsed_precise} < {eta_precise}] {msg}",
            )
            .unwrap_or_else(|_| ProgressStyle::default_bar());
            bar.set_style(style);
            Progress::with_output(Output::Bar(bar), steps, samples_per_step)
        } else {
            Progress::with_writer(steps, samples_per_step, Box::new(std::io::stderr()))
        }
    }

    /// Progress as plain lines into `out` (no bar is drawn), whatever stderr is.
    ///
    /// # Examples
    ///
    /// ```
    /// use kiln::train::Progress;
    /// let name = format!("kiln-doc-progress-{}.txt", std::process::id());
    /// let path = std::env::temp_dir().join(name);
    /// let mut p = Progress::with_writer(20, 8, Box::new(std::fs::File::create(&path).unwrap()));
    /// (0..20).for_each(|i| p.step(1.0 / (1.0 + i as f32)));
    /// p.finish();
    /// let text = std::fs::read_to_string(&path).unwrap();
    /// let lines: Vec<&str> = text.lines().collect();
    /// assert_eq!(lines.len(), 11); // a line every 2 steps, then the summary
    /// assert!(lines[0].starts_with("step 2/20  loss 0.5000"), "{text}");
    /// assert!(lines[10].starts_with("done: 20 steps in"), "{text}");
    /// std::fs::remove_file(&path).unwrap();
    /// ```
    pub fn with_writer(
        steps: usize,
        samples_per_step: usize,
        out: Box<dyn Write + Send>,
    ) -> Progress {
        let every = (steps / PLAIN_LINES).max(1);
        Progress::with_output(Output::Lines { out, every }, steps, samples_per_step)
    }

    /// Progress that shows nothing (a quiet run: tests, benchmarks).
    ///
    /// # Examples
    ///
    /// ```
    /// let mut p = kiln::train::Progress::quiet(100, 1);
    /// (0..3).for_each(|_| p.step(0.25));
    /// assert_eq!((p.done(), p.loss()), (3, Some(0.25))); // still counted
    /// p.finish();
    /// ```
    pub fn quiet(steps: usize, samples_per_step: usize) -> Progress {
        Progress::with_output(Output::Quiet, steps, samples_per_step)
    }

    fn with_output(output: Output, steps: usize, samples_per_step: usize) -> Progress {
        Progress {
            output,
            steps,
            samples_per_step,
            done: 0,
            loss: None,
            start: Instant::now(),
        }
    }

    /// Steps done so far.
    ///
    /// # Examples
    ///
    /// ```
    /// let mut p = kiln::train::Progress::quiet(10, 1);
    /// assert_eq!(p.done(), 0);
    /// p.step(1.0);
    /// p.step(0.5);
    /// assert_eq!(p.done(), 2);
    /// ```
    pub fn done(&self) -> usize {
        self.done
    }

    /// The latest loss, if a step was recorded.
    ///
    /// # Examples
    ///
    /// ```
    /// let mut p = kiln::train::Progress::quiet(10, 1);
    /// assert_eq!(p.loss(), None);
    /// p.step(1.0);
    /// p.step(0.5);
    /// assert_eq!(p.loss(), Some(0.5));
    /// ```
    pub fn loss(&self) -> Option<f32> {
        self.loss
    }

    fn samples_per_sec(&self, elapsed: Duration) -> f64 {
        let secs = elapsed.as_secs_f64();
        if secs > 0.0 {
            (self.done * self.samples_per_step) as f64 / secs
        } else {
            0.0
        }
    }

    /// Records one step and its loss.
    ///
    /// # Examples
    ///
    /// ```
    /// use kiln::train::Progress;
    /// let name = format!("kiln-doc-progress-step-{}.txt", std::process::id());
    /// let path = std::env::temp_dir().join(name);
    /// // 3 steps: a line for each.
    /// let mut p = Progress::with_writer(3, 16, Box::new(std::fs::File::create(&path).unwrap()));
    /// p.step(0.25);
    /// assert_eq!((p.done(), p.loss()), (1, Some(0.25)));
    /// drop(p);
    /// let text = std::fs::read_to_string(&path).unwrap();
    /// assert!(text.starts_with("step 1/3  loss 0.2500  "), "{text}");
    /// std::fs::remove_file(&path).unwrap();
    /// ```
    pub fn step(&mut self, loss: f32) {
        self.done += 1;
        self.loss = Some(loss);
        let elapsed = self.start.elapsed();
        let rate = self.samples_per_sec(elapsed);
        let (done, steps) = (self.done, self.steps);
        match &mut self.output {
            Output::Bar(bar) => {
                bar.set_message(format!("loss {loss:.4}  {rate:.0} samples/s"));
                bar.inc(1);
            }
            Output::Lines { out, every } => {
                if done % *every == 0 || done == steps {
                    let eta = eta(elapsed, done, steps);
                    // Progress is advisory: a closed pipe does not stop training.
                    let _ = writeln!(out, "{}", plain_line(done, steps, loss, rate, eta));
                }
            }
            Output::Quiet => {}
        }
    }

    /// Ends the run: the bar is finished (left on screen); plain output gets a summary line.
    ///
    /// # Examples
    ///
    /// ```
    /// use kiln::train::Progress;
    /// let name = format!("kiln-doc-progress-end-{}.txt", std::process::id());
    /// let path = std::env::temp_dir().join(name);
    /// let mut p = Progress::with_writer(100, 1, Box::new(std::fs::File::create(&path).unwrap()));
    /// p.step(0.125); // step 1 of 100: no line yet (one every 10 steps)
    /// p.finish();
    /// let text = std::fs::read_to_string(&path).unwrap();
    /// assert!(text.starts_with("done: 1 step in "), "{text}");
    /// assert!(text.contains("final loss 0.1250"), "{text}");
    /// std::fs::remove_file(&path).unwrap();
    /// ```
    pub fn finish(mut self) {
        let elapsed = self.start.elapsed();
        let rate = self.samples_per_sec(elapsed);
        let (done, loss) = (self.done, self.loss);
        match &mut self.output {
            Output::Bar(bar) => bar.finish(),
            Output::Lines { out, .. } => {
                let _ = writeln!(out, "{}", summary_line(done, loss, elapsed, rate));
                let _ = out.flush();
            }
            Output::Quiet => {}
        }
    }
}

/// The time left at the mean pace so far.
fn eta(elapsed: Duration, done: usize, steps: usize) -> Duration {
    if done == 0 || done >= steps {
        return Duration::ZERO;
    }
    elapsed.mul_f64((steps - done) as f64 / done as f64)
}

/// Whole seconds, rounded.
fn seconds(d: Duration) -> u64 {
    d.as_secs_f64().round() as u64
}

/// One plain progress line: `step 40/400  loss 0.1234  1520 samples/s  eta 3s`.
///
/// ```
/// use std::time::Duration;
/// let line = kiln::train::plain_line(40, 400, 0.12345, 1520.4, Duration::from_millis(2600));
/// assert_eq!(line, "step 40/400  loss 0.1235  1520 samples/s  eta 3s");
/// ```
pub fn plain_line(
    step: usize,
    steps: usize,
    loss: f32,
    samples_per_sec: f64,
    eta: Duration,
) -> String {
    format!(
        "step {step}/{steps}  loss {loss:.4}  {samples_per_sec:.0} samples/s  eta {}s",
        seconds(eta)
    )
}

/// The plain summary line: `done: 400 steps in 12s, final loss 0.0456, 3200 samples/s`.
///
/// ```
/// use std::time::Duration;
/// let line = kiln::train::summary_line(400, Some(0.0456), Duration::from_secs(12), 3200.0);
/// assert_eq!(line, "done: 400 steps in 12s, final loss 0.0456, 3200 samples/s");
/// assert_eq!(
///     kiln::train::summary_line(0, None, Duration::ZERO, 0.0),
///     "done: 0 steps in 0s, no loss recorded"
/// );
/// assert!(kiln::train::summary_line(1, None, Duration::ZERO, 0.0).starts_with("done: 1 step in"));
/// ```
pub fn summary_line(
    steps: usize,
    loss: Option<f32>,
    elapsed: Duration,
    samples_per_sec: f64,
) -> String {
    let unit = if steps == 1 { "step" } else { "steps" };
    match loss {
        Some(l) => format!(
            "done: {steps} {unit} in {}s, final loss {l:.4}, {samples_per_sec:.0} samples/s",
            seconds(elapsed)
        ),
        None => format!(
            "done: {steps} {unit} in {}s, no loss recorded",
            seconds(elapsed)
        ),
    }
}
