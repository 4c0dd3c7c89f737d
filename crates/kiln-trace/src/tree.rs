//! Parameter trees: structures of tensors that functions take and return, like JAX pytrees.
//!
//! A [`Tree`] lists its tensor leaves in a fixed order and can rebuild itself with new leaves.
//! Tensors, tuples, arrays, `Vec`s and `Option`s of trees are trees; plain numbers and `()` are
//! trees without leaves; user structs derive [`Tree`] with `#[derive(kiln::Tree)]`.

use crate::tensor::Tensor;

/// A structure of tensors.
///
/// # Examples
///
/// ```
/// use kiln_trace::{Tensor, Tree};
/// let params = (Tensor::scalar(1.0f32), vec![Tensor::scalar(2.0f32), Tensor::scalar(3.0f32)]);
/// assert_eq!(params.leaf_vec().len(), 3);
/// assert_eq!(params.leaf_name_vec(), ["0", "1.0", "1.1"]);
/// let doubled = params.map_leaves(&mut |t| t * 2.0);
/// assert_eq!(doubled.1[1].item().unwrap(), 6.0);
/// ```
pub trait Tree: Sized {
    /// Appends the tensor leaves, in order.
    fn leaves<'a>(&'a self, out: &mut Vec<&'a Tensor>);

    /// The same structure with every leaf replaced by `f(leaf)`, in leaf order.
    fn map_leaves(&self, f: &mut dyn FnMut(&Tensor) -> Tensor) -> Self;

    /// Appends one name per leaf, in leaf order: `prefix` extended with the path to the leaf,
    /// segments joined by `.` (struct fields by name, tuple, `Vec` and array elements by
    /// index: `layers.0.weight`). `#[derive(Tree)]` writes field names; the default, for
    /// hand-written impls, numbers the leaves (`prefix.0`, `prefix.1`, ...).
    fn leaf_names(&self, prefix: &str, out: &mut Vec<String>) {
        for i in 0..self.leaf_vec().len() {
            out.push(join_path(prefix, &i.to_string()));
        }
    }

    /// The names of the leaves ([`Tree::leaf_names`] from the root), in leaf order. A lone
    /// tensor at the root has the empty name.
    fn leaf_name_vec(&self) -> Vec<String> {
        let mut v = Vec::new();
        self.leaf_names("", &mut v);
        v
    }

    /// The leaves, in order.
    fn leaf_vec(&self) -> Vec<&Tensor> {
        let mut v = Vec::new();
        self.leaves(&mut v);
        v
    }

    /// A one-line description of the structure and leaf types (the jit cache key).
    fn signature(&self) -> String {
        let tys: Vec<String> = self
            .leaf_vec()
            .iter()
            .map(|t| {
                t.ty()
                    .map(|t| t.to_string())
                    .unwrap_or_else(|| "failed".into())
            })
            .collect();
        format!("{}({})", std::any::type_name::<Self>(), tys.join(", "))
    }

    /// [`Tree::signature`] for messages: type names without their module paths
    /// (`(Tensor, Vec[Tensor(f32[2])])`, not `(kiln_trace::tensor::Tensor, ...)`).
    fn describe(&self) -> String {
        readable(&self.signature())
    }

    /// Rebuilds this structure from `leaves` (as many as it has).
    fn with_leaves(&self, leaves: &[Tensor]) -> Self {
        let mut it = leaves.iter();
        self.map_leaves(&mut |old| it.next().cloned().unwrap_or_else(|| old.clone()))
    }
}

/// `prefix.segment`, or `segment` when `prefix` is empty: how [`Tree::leaf_names`] builds
/// paths.
///
/// # Examples
///
/// ```
/// use kiln_trace::tree::join_path;
/// assert_eq!(join_path("layers.0", "weight"), "layers.0.weight");
/// assert_eq!(join_path("", "weight"), "weight");
/// ```
pub fn join_path(prefix: &str, segment: &str) -> String {
    if prefix.is_empty() {
        segment.to_string()
    } else {
        format!("{prefix}.{segment}")
    }
}

fn indexed_names<'a, T: Tree + 'a>(
    items: impl Iterator<Item = &'a T>,
    prefix: &str,
    out: &mut Vec<String>,
) {
    for (i, x) in items.enumerate() {
        x.leaf_names(&join_path(prefix, &i.to_string()), out);
    }
}

impl Tree for Tensor {
    fn leaves<'a>(&'a self, out: &mut Vec<&'a Tensor>) {
        out.push(self);
    }
    fn leaf_names(&self, prefix: &str, out: &mut Vec<String>) {
        out.push(prefix.to_string());
    }
    fn map_leaves(&self, f: &mut dyn FnMut(&Tensor) -> Tensor) -> Self {
        f(self)
    }
}

macro_rules! static_leaf {
    ($($t:ty),*) => {$(
        impl Tree for $t {
            fn leaves<'a>(&'a self, _: &mut Vec<&'a Tensor>) {}
            fn leaf_names(&self, _: &str, _: &mut Vec<String>) {}
            fn map_leaves(&self, _: &mut dyn FnMut(&Tensor) -> Tensor) -> Self {
                self.clone()
            }
        }
    )*};
}
static_leaf!((), bool, usize, u32, u64, i32, i64, f32, f64, String);

impl<T: Tree> Tree for Vec<T> {
    fn leaves<'a>(&'a self, out: &mut Vec<&'a Tensor>) {
        self.iter().for_each(|x| x.leaves(out));
    }
    fn leaf_names(&self, prefix: &str, out: &mut Vec<String>) {
        indexed_names(self.iter(), prefix, out);
    }
    fn map_leaves(&self, f: &mut dyn FnMut(&Tensor) -> Tensor) -> Self {
        self.iter().map(|x| x.map_leaves(f)).collect()
    }
    fn signature(&self) -> String {
        format!(
            "Vec[{}]",
            self.iter()
                .map(|x| x.signature())
                .collect::<Vec<_>>()
                .join(", ")
        )
    }
}

impl<T: Tree> Tree for Option<T> {
    fn leaves<'a>(&'a self, out: &mut Vec<&'a Tensor>) {
        if let Some(x) = self {
            x.leaves(out);
        }
    }
    fn leaf_names(&self, prefix: &str, out: &mut Vec<String>) {
        if let Some(x) = self {
            x.leaf_names(prefix, out);
        }
    }
    fn map_leaves(&self, f: &mut dyn FnMut(&Tensor) -> Tensor) -> Self {
        self.as_ref().map(|x| x.map_leaves(f))
    }
    fn signature(&self) -> String {
        match self {
            Some(x) => format!("Some({})", x.signature()),
            None => "None".into(),
        }
    }
}

/// A traced function may return a `Result` and use `?` inside: an `Err` has no leaves and is
/// handed back as it is (`jit(f).call(x)` then returns `Ok(Err(e))`, and `call(x)??`
/// propagates it).
impl<T: Tree> Tree for Result<T, crate::Error> {
    fn leaves<'a>(&'a self, out: &mut Vec<&'a Tensor>) {
        if let Ok(x) = self {
            x.leaves(out);
        }
    }
    fn leaf_names(&self, prefix: &str, out: &mut Vec<String>) {
        if let Ok(x) = self {
            x.leaf_names(prefix, out);
        }
    }
    fn map_leaves(&self, f: &mut dyn FnMut(&Tensor) -> Tensor) -> Self {
        match self {
            Ok(x) => Ok(x.map_leaves(f)),
            Err(e) => Err(e.clone()),
        }
    }
    fn signature(&self) -> String {
        match self {
            Ok(x) => format!("Ok({})", x.signature()),
            Err(_) => "Err".into(),
        }
    }
}

impl<T: Tree, const N: usize> Tree for [T; N] {
    fn leaves<'a>(&'a self, out: &mut Vec<&'a Tensor>) {
        self.iter().for_each(|x| x.leaves(out));
    }
    fn leaf_names(&self, prefix: &str, out: &mut Vec<String>) {
        indexed_names(self.iter(), prefix, out);
    }
    fn map_leaves(&self, f: &mut dyn FnMut(&Tensor) -> Tensor) -> Self {
        std::array::from_fn(|i| self[i].map_leaves(f))
    }
}

macro_rules! tuple_tree {
    ($($n:tt $t:ident),+) => {
        impl<$($t: Tree),+> Tree for ($($t,)+) {
            fn leaves<'a>(&'a self, out: &mut Vec<&'a Tensor>) {
                $(self.$n.leaves(out);)+
            }
            fn leaf_names(&self, prefix: &str, out: &mut Vec<String>) {
                $(self.$n.leaf_names(&join_path(prefix, stringify!($n)), out);)+
            }
            fn map_leaves(&self, f: &mut dyn FnMut(&Tensor) -> Tensor) -> Self {
                ($(self.$n.map_leaves(f),)+)
            }
        }
    };
}
tuple_tree!(0 A);
tuple_tree!(0 A, 1 B);
tuple_tree!(0 A, 1 B, 2 C);
tuple_tree!(0 A, 1 B, 2 C, 3 D);
tuple_tree!(0 A, 1 B, 2 C, 3 D, 4 E);
tuple_tree!(0 A, 1 B, 2 C, 3 D, 4 E, 5 F);

/// Applies `f` to corresponding leaves of two trees of the same structure; the error names
/// both structures when they differ.
///
/// # Examples
///
/// ```
/// use kiln_trace::{Tensor, tree::zip_map};
/// let a = (Tensor::scalar(1.0f32), Tensor::scalar(2.0f32));
/// let b = (Tensor::scalar(10.0f32), Tensor::scalar(20.0f32));
/// let s = zip_map(&a, &b, |x, y| x + y).unwrap();
/// assert_eq!((s.0.item().unwrap(), s.1.item().unwrap()), (11.0, 22.0));
/// assert!(zip_map(&a, &(Tensor::scalar(1.0f32), Tensor::scalar(1i32)), |x, _| x.clone()).is_err());
/// ```
#[track_caller]
pub fn zip_map<T: Tree>(
    a: &T,
    b: &T,
    mut f: impl FnMut(&Tensor, &Tensor) -> Tensor,
) -> crate::Result<T> {
    let lb: Vec<Tensor> = b.leaf_vec().into_iter().cloned().collect();
    let la = a.leaf_vec();
    let same = la.len() == lb.len() && la.iter().zip(&lb).all(|(x, y)| x.ty() == y.ty());
    if !same {
        return Err(crate::Error::new(
            "tree",
            format!(
                "tree structures differ: {} and {}",
                a.describe(),
                b.describe()
            ),
        ));
    }
    let mut it = lb.into_iter();
    Ok(a.map_leaves(&mut |x| f(x, &it.next().expect("checked: same number of leaves"))))
}

/// `text` with every Rust path shortened to its last segment (`alloc::vec::Vec<kiln::Mlp>`
/// becomes `Vec<Mlp>`).
///
/// # Examples
///
/// ```
/// use kiln_trace::tree::readable;
/// assert_eq!(readable("alloc::vec::Vec<kiln::nn::Mlp>"), "Vec<Mlp>");
/// ```
pub fn readable(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut word = String::new();
    let flush = |word: &mut String, out: &mut String| {
        out.push_str(word.rsplit("::").next().unwrap_or(""));
        word.clear();
    };
    for c in text.chars() {
        if c.is_alphanumeric() || c == '_' || c == ':' {
            word.push(c);
        } else {
            flush(&mut word, &mut out);
            out.push(c);
        }
    }
    flush(&mut word, &mut out);
    out
}

#[cfg(test)]
mod tests {
    use super::Tree;
    use crate::tensor::Tensor;

    #[test]
    fn leaves_are_named_by_their_paths() {
        let t = Tensor::scalar(1.0f32);
        let tree = (
            vec![t.clone(), t.clone()],
            Some([t.clone()]),
            None::<Tensor>,
            3usize,
        );
        assert_eq!(tree.leaf_name_vec(), ["0.0", "0.1", "1.0"]);
        assert_eq!(t.leaf_name_vec(), [""]);
    }

    #[test]
    fn paths_are_shortened_to_their_last_segment() {
        assert_eq!(
            super::readable("(kiln_trace::tensor::Tensor, alloc::vec::Vec<my::Mlp>)(f32[1])"),
            "(Tensor, Vec<Mlp>)(f32[1])"
        );
    }
}
