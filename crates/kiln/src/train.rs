//! Around a training loop: a progress bar ([`Progress`]) and a loss curve drawn to PNG or
//! written as CSV ([`LossCurve`]).
//!
//! ```
//! use kiln::train::{LossCurve, Progress};
//! # let dir = std::env::temp_dir().join(format!("kiln-doc-train-{}", std::process::id()));
//! # std::fs::create_dir_all(&dir)?;
//! let steps = 100;
//! let mut progress = Progress::new(steps, 32);
//! let mut curve = LossCurve::new();
//! for i in 0..steps {
//!     let loss = 1.0 / (1.0 + i as f32); // one training step's loss
//!     progress.step(loss);
//!     curve.push(i, loss);
//! }
//! progress.finish();
//! curve.save_png(dir.join("loss.png"), 640, 480)?;
//! curve.save_csv(dir.join("loss.csv"))?;
//! # assert_eq!(std::fs::read_to_string(dir.join("loss.csv"))?.lines().count(), 101);
//! # std::fs::remove_dir_all(&dir)?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod curve;
mod font;
mod progress;

pub use curve::LossCurve;
pub use progress::{Progress, plain_line, summary_line};
