//! The e-graph language, generated from the op declaration.
//!
//! There is no second op list: an op node's head is a [`kiln_ir::OpKind`], its text name is the
//! op's mnemonic ([`OpKind::mnemonic`], [`OpKind::from_mnemonic`]), and its attributes and result
//! types ride in a [`Meta`] leaf, always the node's first child. Rules therefore see attributes
//! as ordinary pattern variables: `(transpose ?p (transpose ?q ?x))` binds both permutations.
//!
//! Ops with several results (`rng_bit_generator`, `optimization_barrier`) are tuple nodes whose
//! results are read by `get<i>` nodes.

use egg::{FromOp, Id, Language};
use kiln_ir::attr::AttrCtx;
use kiln_ir::{Attr, Op, OpKind, ResultCount, TensorType};
use std::fmt::{self, Write as _};
use std::sync::Arc;

/// An op's attributes and result types: the payload of a meta leaf.
///
/// Two metas are equal when their attribute texts (names and values; a constant's bytes) and
/// result types are equal; the op kind itself is the node's head, so `(add ?m ?x ?y)` and
/// `(subtract ?m ?x ?y)` may share `?m`.
#[derive(Clone, Debug)]
pub struct Meta {
    /// The op the attributes came from (its kind may differ from the node that uses it).
    pub op: Op,
    /// The result types, one per result.
    pub types: Vec<TensorType>,
    key: Vec<u8>,
}

impl Meta {
    /// The meta of `op` with `types` as its results.
    pub fn new(op: Op, types: Vec<TensorType>) -> Meta {
        let key = meta_key(&op, &types);
        Meta { op, types, key }
    }

    /// A meta with no attributes and one result type (for elementwise ops).
    pub fn plain(ty: TensorType) -> Meta {
        Meta::new(Op::Add {}, vec![ty])
    }

    /// The first result type.
    pub fn ty(&self) -> &TensorType {
        &self.types[0]
    }

    /// The op of `kind` with these attributes, if they fit it.
    pub fn op_as(&self, kind: OpKind) -> Option<Op> {
        if self.op.kind() == kind {
            return Some(self.op.clone());
        }
        let attrs: Vec<(String, Attr)> = self
            .op
            .attrs()
            .into_iter()
            .map(|(n, a)| (n.to_string(), a))
            .collect();
        let ctx = AttrCtx {
            result_types: &self.types,
        };
        Op::from_attrs(kind, &attrs, &ctx).ok()
    }
}

/// What makes two metas equal: the attribute texts (a constant's bytes) and the result types.
pub(crate) fn meta_key(op: &Op, types: &[TensorType]) -> Vec<u8> {
    let mut key = String::new();
    match op {
        Op::Constant { value } => {
            key.push_str("value=");
            for b in value.to_le_bytes() {
                let _ = write!(key, "{b:02x}");
            }
        }
        _ => {
            for (name, a) in op.attrs() {
                let _ = write!(key, "{name}={a};");
            }
        }
    }
    for t in types {
        let _ = write!(key, "->{t}");
    }
    key.into_bytes()
}

impl PartialEq for Meta {
    fn eq(&self, other: &Meta) -> bool {
        self.key == other.key
    }
}
impl Eq for Meta {}
impl std::hash::Hash for Meta {
    fn hash<H: std::hash::Hasher>(&self, h: &mut H) {
        self.key.hash(h)
    }
}
impl PartialOrd for Meta {
    fn partial_cmp(&self, other: &Meta) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Meta {
    fn cmp(&self, other: &Meta) -> std::cmp::Ordering {
        self.key.cmp(&other.key)
    }
}

/// What a node is, without its children.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Head {
    /// The function's parameter with this index and type (a leaf).
    Param(u32, TensorType),
    /// Attributes and result types (a leaf).
    Meta(Arc<Meta>),
    /// An op; child 0 is its meta, the rest are its operands.
    Op(OpKind),
    /// Result `i` of a multi-result op (one child: the op).
    Get(u32),
}

/// An e-node: a head and its children.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Node {
    /// What the node is.
    pub head: Head,
    /// Its children (meta first for ops).
    pub children: Vec<Id>,
}

impl Node {
    /// A node without children.
    pub fn leaf(head: Head) -> Node {
        Node {
            head,
            children: Vec::new(),
        }
    }

    /// The op kind, for op nodes.
    pub fn kind(&self) -> Option<OpKind> {
        match self.head {
            Head::Op(k) => Some(k),
            _ => None,
        }
    }

    /// The operand classes of an op node (its children after the meta).
    pub fn operands(&self) -> &[Id] {
        match self.head {
            Head::Op(_) => &self.children[1..],
            _ => &[],
        }
    }
}

/// True when ops of `kind` produce a tuple read through `get` nodes.
pub fn is_tuple(kind: OpKind) -> bool {
    kind.results() != ResultCount::Fixed(1)
}

impl Language for Node {
    type Discriminant = Head;

    fn discriminant(&self) -> Head {
        self.head.clone()
    }

    fn matches(&self, other: &Node) -> bool {
        self.head == other.head && self.children.len() == other.children.len()
    }

    fn children(&self) -> &[Id] {
        &self.children
    }

    fn children_mut(&mut self) -> &mut [Id] {
        &mut self.children
    }
}

impl fmt::Display for Node {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.head {
            Head::Param(i, _) => write!(f, "param{i}"),
            Head::Meta(m) => write!(f, "{{{}}}", String::from_utf8_lossy(&m.key)),
            Head::Op(k) => f.write_str(k.mnemonic()),
            Head::Get(i) => write!(f, "get{i}"),
        }
    }
}

/// Why a pattern's operator did not parse.
#[derive(Debug)]
pub struct UnknownOp(pub String);

impl FromOp for Node {
    type Error = UnknownOp;

    fn from_op(op: &str, children: Vec<Id>) -> Result<Node, UnknownOp> {
        let head = if let Some(k) = OpKind::from_mnemonic(op) {
            Head::Op(k)
        } else if let Some(i) = op.strip_prefix("get").and_then(|i| i.parse().ok()) {
            Head::Get(i)
        } else {
            return Err(UnknownOp(op.to_string()));
        };
        Ok(Node { head, children })
    }
}
