//! [`DataLoader`]: batches from a dataset, loaded ahead on worker threads.

use super::{Dataset, Sampler, Sequential, Shuffled, data_error, located};
use crate::ir::{Literal, Loc, TensorType};
use crate::{Result, Tensor};
use std::sync::Arc;
use std::sync::mpsc::{Receiver, SyncSender, sync_channel};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// A per-sample transform, run on the worker threads.
type Transform = Arc<dyn Fn(Vec<Tensor>) -> Result<Vec<Tensor>> + Send + Sync>;

/// Batches of a [`Dataset`] (PyTorch's `DataLoader`): indices from a [`Sampler`], a
/// per-sample transform, collation of each field into one tensor `[batch, ...]`, and loading
/// ahead on worker threads into a bounded queue.
///
/// Defaults: sequential order, the last short batch kept, 2 workers, 2 batches queued per
/// worker. Batch `b` of an epoch is loaded by worker `b % workers` and handed out in order, so
/// the batches never depend on the number of workers (0 loads on the calling thread).
///
/// # Examples
///
/// ```
/// use kiln::data::{DataLoader, TensorDataset};
/// use kiln::Tensor;
/// // The numbers 0, 1, ..., n - 1, one per sample.
/// let numbers = |n: usize| {
///     let x = Tensor::from_vec((0..n).map(|i| i as f32).collect::<Vec<_>>(), [n]).unwrap();
///     TensorDataset::new(vec![x]).unwrap()
/// };
/// let loader = DataLoader::new(numbers(5), 2).unwrap();
/// let sizes: Vec<usize> = loader.epoch(0).map(|b| b.unwrap()[0].shape()[0]).collect();
/// assert_eq!(sizes, [2, 2, 1]); // in order, the last batch short
/// assert_eq!(loader.len(), 3);
/// ```
pub struct DataLoader<D: Dataset> {
    dataset: Arc<D>,
    batch_size: usize,
    drop_last: bool,
    sampler: Arc<dyn Sampler>,
    transform: Option<Transform>,
    workers: usize,
    prefetch: usize,
}

impl<D: Dataset + 'static> DataLoader<D> {
    /// A loader of batches of `batch_size` (at least 1) samples of `dataset`.
    ///
    /// # Examples
    ///
    /// ```
    /// use kiln::data::{DataLoader, TensorDataset};
    /// use kiln::Tensor;
    /// // The numbers 0, 1, ..., n - 1, one per sample.
    /// let numbers = |n: usize| {
    ///     let x = Tensor::from_vec((0..n).map(|i| i as f32).collect::<Vec<_>>(), [n]).unwrap();
    ///     TensorDataset::new(vec![x]).unwrap()
    /// };
    /// let first = DataLoader::new(numbers(6), 4).unwrap().epoch(0).next().unwrap().unwrap();
    /// assert_eq!(first[0].to_vec::<f32>().unwrap(), [0.0, 1.0, 2.0, 3.0]);
    /// let err = DataLoader::new(numbers(6), 0).err().unwrap();
    /// assert!(err.message.contains("batch size is 0"), "{err}");
    /// ```
    #[track_caller]
    pub fn new(dataset: D, batch_size: usize) -> Result<DataLoader<D>> {
        let loc = Loc::caller();
        if batch_size == 0 {
            return located(
                Err(data_error(
                    "DataLoader::new",
                    "the batch size is 0; a batch needs at least one sample",
                )),
                loc,
            );
        }
        Ok(DataLoader {
            dataset: Arc::new(dataset),
            batch_size,
            drop_last: false,
            sampler: Arc::new(Sequential),
            transform: None,
            workers: 2,
            prefetch: 2,
        })
    }

    /// Visits the samples in a new seeded order each epoch ([`Shuffled`]).
    ///
    /// # Examples
    ///
    /// ```
    /// use kiln::data::{DataLoader, TensorDataset};
    /// use kiln::Tensor;
    /// // The numbers 0, 1, ..., n - 1, one per sample.
    /// let numbers = |n: usize| {
    ///     let x = Tensor::from_vec((0..n).map(|i| i as f32).collect::<Vec<_>>(), [n]).unwrap();
    ///     TensorDataset::new(vec![x]).unwrap()
    /// };
    /// let batches = |l: &DataLoader<TensorDataset>, e| -> Vec<Vec<f32>> {
    ///     l.epoch(e).map(|b| b.unwrap()[0].to_vec::<f32>().unwrap()).collect()
    /// };
    /// let loader = DataLoader::new(numbers(8), 8).unwrap().shuffle(7);
    /// let (e0, e1) = (batches(&loader, 0), batches(&loader, 1));
    /// let again = DataLoader::new(numbers(8), 8).unwrap().shuffle(7);
    /// assert_eq!(e0, batches(&again, 0)); // the same seed and epoch: the same order
    /// assert_ne!(e0, e1); // a new order each epoch
    /// let mut sorted = e0[0].clone();
    /// sorted.sort_by(f32::total_cmp);
    /// assert_eq!(sorted, [0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0]); // every sample once
    /// ```
    pub fn shuffle(self, seed: u64) -> DataLoader<D> {
        self.sampler(Shuffled { seed })
    }

    /// Visits the samples `sampler` gives (for instance [`super::Distributed`]).
    ///
    /// # Examples
    ///
    /// ```
    /// use kiln::data::{DataLoader, TensorDataset};
    /// use kiln::Tensor;
    /// // The numbers 0, 1, ..., n - 1, one per sample.
    /// let numbers = |n: usize| {
    ///     let x = Tensor::from_vec((0..n).map(|i| i as f32).collect::<Vec<_>>(), [n]).unwrap();
    ///     TensorDataset::new(vec![x]).unwrap()
    /// };
    /// let batches = |l: &DataLoader<TensorDataset>, e| -> Vec<Vec<f32>> {
    ///     l.epoch(e).map(|b| b.unwrap()[0].to_vec::<f32>().unwrap()).collect()
    /// };
    /// use kiln::data::Distributed;
    /// // Rank 1 of 2 takes every other sample, from the second.
    /// let rank1 = Distributed::new(1, 2).unwrap();
    /// let loader = DataLoader::new(numbers(6), 2).unwrap().sampler(rank1);
    /// assert_eq!(batches(&loader, 0), [vec![1.0, 3.0], vec![5.0]]);
    /// ```
    pub fn sampler(mut self, sampler: impl Sampler + 'static) -> DataLoader<D> {
        self.sampler = Arc::new(sampler);
        self
    }

    /// Drops the last batch when it would be short (so every batch has the same shape, which
    /// a `jit`-compiled step then compiles once for).
    ///
    /// # Examples
    ///
    /// ```
    /// use kiln::data::{DataLoader, TensorDataset};
    /// use kiln::Tensor;
    /// // The numbers 0, 1, ..., n - 1, one per sample.
    /// let numbers = |n: usize| {
    ///     let x = Tensor::from_vec((0..n).map(|i| i as f32).collect::<Vec<_>>(), [n]).unwrap();
    ///     TensorDataset::new(vec![x]).unwrap()
    /// };
    /// let batches = |l: &DataLoader<TensorDataset>, e| -> Vec<Vec<f32>> {
    ///     l.epoch(e).map(|b| b.unwrap()[0].to_vec::<f32>().unwrap()).collect()
    /// };
    /// let loader = DataLoader::new(numbers(5), 2).unwrap().drop_last(true);
    /// assert_eq!(loader.len(), 2);
    /// assert_eq!(batches(&loader, 0), [vec![0.0, 1.0], vec![2.0, 3.0]]); // sample 4 is dropped
    /// ```
    pub fn drop_last(mut self, drop_last: bool) -> DataLoader<D> {
        self.drop_last = drop_last;
        self
    }

    /// Applies `f` to every sample (on the worker threads) before collation. An error it
    /// returns ends the epoch with that error.
    ///
    /// # Examples
    ///
    /// ```
    /// use kiln::data::{DataLoader, TensorDataset};
    /// use kiln::Tensor;
    /// // The numbers 0, 1, ..., n - 1, one per sample.
    /// let numbers = |n: usize| {
    ///     let x = Tensor::from_vec((0..n).map(|i| i as f32).collect::<Vec<_>>(), [n]).unwrap();
    ///     TensorDataset::new(vec![x]).unwrap()
    /// };
    /// let batches = |l: &DataLoader<TensorDataset>, e| -> Vec<Vec<f32>> {
    ///     l.epoch(e).map(|b| b.unwrap()[0].to_vec::<f32>().unwrap()).collect()
    /// };
    /// let loader = DataLoader::new(numbers(4), 2).unwrap().map(|s| Ok(vec![&s[0] * 10.0]));
    /// assert_eq!(batches(&loader, 0), [vec![0.0, 10.0], vec![20.0, 30.0]]);
    /// let fail = |_: Vec<Tensor>| Err(kiln::Error::new("augment", "no"));
    /// let failing = DataLoader::new(numbers(4), 2).unwrap().map(fail);
    /// assert!(failing.epoch(0).next().unwrap().is_err());
    /// ```
    pub fn map(
        mut self,
        f: impl Fn(Vec<Tensor>) -> Result<Vec<Tensor>> + Send + Sync + 'static,
    ) -> DataLoader<D> {
        self.transform = Some(Arc::new(f));
        self
    }

    /// Loads on `workers` background threads (0: on the thread that iterates).
    ///
    /// # Examples
    ///
    /// ```
    /// use kiln::data::{DataLoader, TensorDataset};
    /// use kiln::Tensor;
    /// // The numbers 0, 1, ..., n - 1, one per sample.
    /// let numbers = |n: usize| {
    ///     let x = Tensor::from_vec((0..n).map(|i| i as f32).collect::<Vec<_>>(), [n]).unwrap();
    ///     TensorDataset::new(vec![x]).unwrap()
    /// };
    /// let batches = |l: &DataLoader<TensorDataset>, e| -> Vec<Vec<f32>> {
    ///     l.epoch(e).map(|b| b.unwrap()[0].to_vec::<f32>().unwrap()).collect()
    /// };
    /// // The same batches, in the same order, whatever the number of workers.
    /// let with = |w| batches(&DataLoader::new(numbers(9), 2).unwrap().shuffle(1).workers(w), 0);
    /// assert_eq!(with(0), with(4));
    /// assert_eq!(with(0).len(), 5);
    /// ```
    pub fn workers(mut self, workers: usize) -> DataLoader<D> {
        self.workers = workers;
        self
    }

    /// How many batches each worker may load ahead (at least 1).
    ///
    /// # Examples
    ///
    /// ```
    /// use kiln::data::{DataLoader, TensorDataset};
    /// use kiln::Tensor;
    /// // The numbers 0, 1, ..., n - 1, one per sample.
    /// let numbers = |n: usize| {
    ///     let x = Tensor::from_vec((0..n).map(|i| i as f32).collect::<Vec<_>>(), [n]).unwrap();
    ///     TensorDataset::new(vec![x]).unwrap()
    /// };
    /// let batches = |l: &DataLoader<TensorDataset>, e| -> Vec<Vec<f32>> {
    ///     l.epoch(e).map(|b| b.unwrap()[0].to_vec::<f32>().unwrap()).collect()
    /// };
    /// let loader = DataLoader::new(numbers(6), 2).unwrap().workers(1).prefetch(0); // taken as 1
    /// assert_eq!(batches(&loader, 0), [vec![0.0, 1.0], vec![2.0, 3.0], vec![4.0, 5.0]]);
    /// ```
    pub fn prefetch(mut self, batches: usize) -> DataLoader<D> {
        self.prefetch = batches.max(1);
        self
    }

    /// The dataset.
    ///
    /// # Examples
    ///
    /// ```
    /// use kiln::data::{DataLoader, TensorDataset};
    /// use kiln::Tensor;
    /// // The numbers 0, 1, ..., n - 1, one per sample.
    /// let numbers = |n: usize| {
    ///     let x = Tensor::from_vec((0..n).map(|i| i as f32).collect::<Vec<_>>(), [n]).unwrap();
    ///     TensorDataset::new(vec![x]).unwrap()
    /// };
    /// use kiln::data::Dataset;
    /// let loader = DataLoader::new(numbers(5), 2).unwrap();
    /// assert_eq!(loader.dataset().len(), 5);
    /// assert_eq!(loader.dataset().get(4).unwrap()[0].item().unwrap(), 4.0);
    /// ```
    pub fn dataset(&self) -> &D {
        &self.dataset
    }

    /// How many batches an epoch has.
    ///
    /// # Examples
    ///
    /// ```
    /// use kiln::data::{DataLoader, TensorDataset};
    /// use kiln::Tensor;
    /// // The numbers 0, 1, ..., n - 1, one per sample.
    /// let numbers = |n: usize| {
    ///     let x = Tensor::from_vec((0..n).map(|i| i as f32).collect::<Vec<_>>(), [n]).unwrap();
    ///     TensorDataset::new(vec![x]).unwrap()
    /// };
    /// assert_eq!(DataLoader::new(numbers(10), 3).unwrap().len(), 4);
    /// assert_eq!(DataLoader::new(numbers(10), 3).unwrap().drop_last(true).len(), 3);
    /// ```
    pub fn len(&self) -> usize {
        let n = self.sampler.indices(self.dataset.len(), 0).len();
        if self.drop_last {
            n / self.batch_size
        } else {
            n.div_ceil(self.batch_size)
        }
    }

    /// Whether an epoch has no batch.
    ///
    /// # Examples
    ///
    /// ```
    /// use kiln::data::{DataLoader, TensorDataset};
    /// use kiln::Tensor;
    /// // The numbers 0, 1, ..., n - 1, one per sample.
    /// let numbers = |n: usize| {
    ///     let x = Tensor::from_vec((0..n).map(|i| i as f32).collect::<Vec<_>>(), [n]).unwrap();
    ///     TensorDataset::new(vec![x]).unwrap()
    /// };
    /// assert!(!DataLoader::new(numbers(3), 4).unwrap().is_empty());
    /// assert!(DataLoader::new(numbers(3), 4).unwrap().drop_last(true).is_empty());
    /// ```
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The batches of epoch `epoch` (the epoch seeds the sampler's order). Each item is the
    /// batch's fields, or the first error loading it; iteration ends after an error.
    ///
    /// # Examples
    ///
    /// ```
    /// use kiln::data::{DataLoader, TensorDataset};
    /// use kiln::Tensor;
    /// // The numbers 0, 1, ..., n - 1, one per sample.
    /// let numbers = |n: usize| {
    ///     let x = Tensor::from_vec((0..n).map(|i| i as f32).collect::<Vec<_>>(), [n]).unwrap();
    ///     TensorDataset::new(vec![x]).unwrap()
    /// };
    /// let loader = DataLoader::new(numbers(4), 2).unwrap();
    /// let mut batches = loader.epoch(0);
    /// assert_eq!(batches.next().unwrap().unwrap()[0].to_vec::<f32>().unwrap(), [0.0, 1.0]);
    /// assert_eq!(batches.next().unwrap().unwrap()[0].to_vec::<f32>().unwrap(), [2.0, 3.0]);
    /// assert!(batches.next().is_none());
    /// // Sequential order: every epoch starts over the same way.
    /// let again = loader.epoch(1).next().unwrap().unwrap();
    /// assert_eq!(again[0].to_vec::<f32>().unwrap(), [0.0, 1.0]);
    /// ```
    pub fn epoch(&self, epoch: u64) -> Batches {
        let indices = self.sampler.indices(self.dataset.len(), epoch);
        let mut batches: Vec<Vec<usize>> = indices
            .chunks(self.batch_size)
            .map(<[usize]>::to_vec)
            .collect();
        if self.drop_last && batches.last().is_some_and(|b| b.len() < self.batch_size) {
            batches.pop();
        }
        let job = Job {
            dataset: self.dataset.clone(),
            transform: self.transform.clone(),
        };
        Batches::start(job, batches, self.workers, self.prefetch)
    }
}

/// What a worker needs to load a batch.
struct Job<D> {
    dataset: Arc<D>,
    transform: Option<Transform>,
}

impl<D: Dataset> Job<D> {
    fn load(&self, indices: &[usize]) -> Result<Vec<Tensor>> {
        let samples = indices
            .iter()
            .map(|&i| {
                let s = self.dataset.get(i)?;
                match &self.transform {
                    Some(f) => f(s),
                    None => Ok(s),
                }
            })
            .collect::<Result<Vec<_>>>()?;
        collate(&samples, indices)
    }
}

/// Stacks each field of `samples` into one tensor with a leading batch axis.
fn collate(samples: &[Vec<Tensor>], indices: &[usize]) -> Result<Vec<Tensor>> {
    const OP: &str = "DataLoader (collate)";
    let Some(first) = samples.first() else {
        return Ok(Vec::new());
    };
    let mut out = Vec::with_capacity(first.len());
    for field in 0..first.len() {
        let mut bytes = Vec::new();
        let mut ty: Option<TensorType> = None;
        for (s, &index) in samples.iter().zip(indices) {
            if s.len() != first.len() {
                return Err(data_error(
                    OP,
                    format!(
                        "sample {index} has {} fields, sample {} has {}",
                        s.len(),
                        indices[0],
                        first.len()
                    ),
                ));
            }
            let l = s[field].to_literal()?;
            match &ty {
                None => ty = Some(l.ty().clone()),
                Some(t) if t != l.ty() => {
                    return Err(data_error(
                        OP,
                        format!(
                            "field {field} of sample {index} is {}, of sample {} {t}: a batch \
                             stacks equal types (pad or resize in a transform)",
                            l.ty(),
                            indices[0]
                        ),
                    ));
                }
                Some(_) => {}
            }
            bytes.extend(l.to_le_bytes());
        }
        let row = ty.expect("a batch has a sample");
        let mut shape = vec![samples.len()];
        shape.extend(&row.shape);
        let lit = Literal::from_le_bytes(TensorType::new(row.dtype, shape), &bytes)
            .map_err(|e| data_error(OP, e.0))?;
        out.push(Tensor::new(lit));
    }
    Ok(out)
}

/// The batches of one epoch, in order (an iterator of `Result<Vec<Tensor>>`). Dropping it
/// stops the workers.
///
/// # Examples
///
/// ```
/// use kiln::data::{DataLoader, TensorDataset};
/// use kiln::Tensor;
/// // The numbers 0, 1, ..., n - 1, one per sample.
/// let numbers = |n: usize| {
///     let x = Tensor::from_vec((0..n).map(|i| i as f32).collect::<Vec<_>>(), [n]).unwrap();
///     TensorDataset::new(vec![x]).unwrap()
/// };
/// let batches = DataLoader::new(numbers(5), 2).unwrap().epoch(0);
/// // The epoch's number of batches, known without loading any.
/// assert_eq!(batches.epoch_len(), 3);
/// let sizes: Vec<usize> = batches.map(|b| b.unwrap()[0].shape()[0]).collect();
/// assert_eq!(sizes, [2, 2, 1]);
/// ```
pub struct Batches {
    next: usize,
    count: usize,
    source: Source,
    waited: Duration,
    failed: bool,
}

enum Source {
    /// Loaded on the iterating thread.
    Inline(Box<dyn FnMut(usize) -> Result<Vec<Tensor>> + Send>),
    /// One queue per worker; batch `b` comes from queue `b % workers`.
    Workers {
        queues: Vec<Receiver<Result<Vec<Tensor>>>>,
        threads: Vec<Option<JoinHandle<()>>>,
    },
}

impl Batches {
    fn start<D: Dataset + 'static>(
        job: Job<D>,
        batches: Vec<Vec<usize>>,
        workers: usize,
        prefetch: usize,
    ) -> Batches {
        let count = batches.len();
        let source = if workers == 0 || count == 0 {
            Source::Inline(Box::new(move |b| job.load(&batches[b])))
        } else {
            let workers = workers.min(count);
            let job = Arc::new(job);
            let batches = Arc::new(batches);
            let mut queues = Vec::with_capacity(workers);
            let mut threads = Vec::with_capacity(workers);
            for w in 0..workers {
                let (tx, rx): (SyncSender<_>, _) = sync_channel(prefetch);
                let (job, batches) = (job.clone(), batches.clone());
                let t = std::thread::Builder::new()
                    .name(format!("kiln-data-{w}"))
                    .spawn(move || {
                        for b in (w..batches.len()).step_by(workers) {
                            let r = job.load(&batches[b]);
                            let stop = r.is_err();
                            // A closed queue means the epoch was dropped: stop.
                            if tx.send(r).is_err() || stop {
                                return;
                            }
                        }
                    });
                match t {
                    Ok(t) => threads.push(Some(t)),
                    Err(e) => {
                        // No thread: this worker's batches load inline instead.
                        let (tx, rx2) = sync_channel(1);
                        let _ = tx.send(Err(data_error(
                            "DataLoader",
                            format!("cannot start a loader thread: {e}"),
                        )));
                        queues.push(rx2);
                        threads.push(None);
                        continue;
                    }
                }
                queues.push(rx);
            }
            Source::Workers { queues, threads }
        };
        Batches {
            next: 0,
            count,
            source,
            waited: Duration::ZERO,
            failed: false,
        }
    }

    /// How long the iterating thread has waited for batches so far (time `next` spent
    /// blocked): near zero when loading keeps up with the training step.
    ///
    /// # Examples
    ///
    /// ```
    /// use kiln::data::{DataLoader, TensorDataset};
    /// use kiln::Tensor;
    /// // The numbers 0, 1, ..., n - 1, one per sample.
    /// let numbers = |n: usize| {
    ///     let x = Tensor::from_vec((0..n).map(|i| i as f32).collect::<Vec<_>>(), [n]).unwrap();
    ///     TensorDataset::new(vec![x]).unwrap()
    /// };
    /// use std::time::Duration;
    /// let slow = |s: Vec<Tensor>| -> kiln::Result<Vec<Tensor>> {
    ///     std::thread::sleep(Duration::from_millis(5));
    ///     Ok(s)
    /// };
    /// // Loading on this thread: all of the loading is waited for.
    /// let mut batches = DataLoader::new(numbers(4), 2).unwrap().workers(0).map(slow).epoch(0);
    /// assert_eq!(batches.waited(), Duration::ZERO);
    /// batches.by_ref().for_each(|b| assert!(b.is_ok()));
    /// assert!(batches.waited() >= Duration::from_millis(20)); // 4 samples of 5 ms
    /// ```
    pub fn waited(&self) -> Duration {
        self.waited
    }

    /// How many batches the epoch has.
    ///
    /// # Examples
    ///
    /// ```
    /// use kiln::data::{DataLoader, TensorDataset};
    /// use kiln::Tensor;
    /// // The numbers 0, 1, ..., n - 1, one per sample.
    /// let numbers = |n: usize| {
    ///     let x = Tensor::from_vec((0..n).map(|i| i as f32).collect::<Vec<_>>(), [n]).unwrap();
    ///     TensorDataset::new(vec![x]).unwrap()
    /// };
    /// let mut batches = DataLoader::new(numbers(7), 3).unwrap().epoch(0);
    /// batches.next().unwrap().unwrap();
    /// assert_eq!(batches.epoch_len(), 3); // the epoch's, however many were taken
    /// ```
    pub fn epoch_len(&self) -> usize {
        self.count
    }
}

impl Iterator for Batches {
    type Item = Result<Vec<Tensor>>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.failed || self.next >= self.count {
            return None;
        }
        let b = self.next;
        self.next += 1;
        let t = Instant::now();
        let r = match &mut self.source {
            Source::Inline(load) => load(b),
            Source::Workers { queues, threads } => {
                let w = b % queues.len();
                match queues[w].recv() {
                    Ok(r) => r,
                    Err(_) => {
                        // The worker ended without sending: it panicked.
                        let why = threads[w]
                            .take()
                            .and_then(|t| t.join().err())
                            .map(|p| panic_message(p.as_ref()))
                            .unwrap_or_else(|| "it stopped".into());
                        Err(data_error(
                            "DataLoader",
                            format!("the worker loading batch {b} failed: {why}"),
                        ))
                    }
                }
            }
        };
        self.waited += t.elapsed();
        self.failed = r.is_err();
        Some(r)
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let left = if self.failed {
            0
        } else {
            self.count - self.next
        };
        (0, Some(left))
    }
}

impl Drop for Batches {
    fn drop(&mut self) {
        if let Source::Workers { queues, threads } = &mut self.source {
            // Closing the queues makes every worker's next send fail, so it returns.
            queues.clear();
            for t in threads.iter_mut().filter_map(Option::take) {
                let _ = t.join();
            }
        }
    }
}

fn panic_message(p: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = p.downcast_ref::<&str>() {
        format!("it panicked: {s}")
    } else if let Some(s) = p.downcast_ref::<String>() {
        format!("it panicked: {s}")
    } else {
        "it panicked".into()
    }
}
