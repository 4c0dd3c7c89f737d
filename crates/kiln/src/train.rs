//! Around a training loop: a progress bar ([`Progress`]) and a loss curve drawn to PNG or
//! written as CSV ([`LossCurve`]).
//!
//! ```no_run
//! use kiln::train::{LossCurve, Progress};
//! let steps = 100;
//! let mut progress = Progress::new(steps, 32);
//! let mut curve = LossCurve::new();
//! for i in 0..steps {
//!     let loss = 1.0 / (1.0 + i as f32); // one training step's loss
//!     progress.step(loss);
//!     curve.push(i, loss);
//! }
//! progress.finish();
//! curve.save_png("loss.png", 640, 480)?;
//! curve.save_csv("loss.csv")?;
//! # Ok::<(), kiln::Error>(())
//! ```

mod curve;
mod font;
mod progress;

pub use curve::LossCurve;
pub use progress::{Progress, plain_line, summary_line};
