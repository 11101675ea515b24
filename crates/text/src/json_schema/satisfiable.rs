//! Whether any finite JSON text satisfies each node, and how short the shortest is (in bytes,
//! saturating). Both are one least fixpoint over the graph, computed as Knuth's generalization of
//! Dijkstra's algorithm (1977) to and/or graphs: a node is settled, shortest first, once it has
//! its value: a literal, number, string or dictionary at once; an `anyOf` by its first settled
//! alternative; an object once every required property's node is settled, an array of at least
//! one item once its items' node is. A node never settled is satisfied by nothing: its schema
//! refers to itself with nothing that can end it. Every node must be satisfiable (as the schema
//! `false` is refused anywhere), or generation could write its way into a value it cannot finish;
//! and the shortest answer of every node must fit in the context.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use super::compile::{Compiled, Origin, err};
use super::{Node, SchemaError, SchemaLimits};

/// What a node's shortest answer is made of.
enum Rule {
    /// Known at once.
    Bytes(u64),
    /// The shortest of these (`anyOf`).
    Shortest(Vec<u32>),
    /// Made of all of these (an object's required properties, an array's items).
    All(Vec<u32>),
}

fn rule(node: &Node) -> Rule {
    match node {
        Node::Pending => Rule::Shortest(Vec::new()),
        Node::AnyOf(alts) => Rule::Shortest(alts.clone()),
        Node::Object { props, .. } if props.iter().any(|p| p.required) => {
            Rule::All(props.iter().filter(|p| p.required).map(|p| p.node).collect())
        }
        Node::Object { .. } | Node::Map(_) => Rule::Bytes(2),
        &Node::Array { items, min, .. } if min > 0 => Rule::All(vec![items]),
        Node::Array { .. } => Rule::Bytes(2),
        Node::String { min, .. } => Rule::Bytes(2 + u64::from(*min)),
        Node::Number { .. } => Rule::Bytes(1),
        Node::Lits(texts) => Rule::Bytes(texts.iter().map(|t| t.len() as u64).min().unwrap_or(u64::MAX)),
    }
}

/// The shortest answer of an object or array whose parts are settled (`shortest`).
fn combined(node: &Node, shortest: &[Option<u64>]) -> u64 {
    let of = |n: u32| shortest[n as usize].unwrap_or(u64::MAX);
    match node {
        Node::Object { props, .. } => {
            let required = props.iter().filter(|p| p.required);
            // `{`, `}`, a comma between properties, and each `"key":value`.
            let commas = required.clone().count().saturating_sub(1) as u64;
            required.fold(2 + commas, |sum, p| sum.saturating_add(p.key.len() as u64 + 1).saturating_add(of(p.node)))
        }
        &Node::Array { items, min, .. } => {
            let min = u64::from(min);
            (2 + min - 1).saturating_add(min.saturating_mul(of(items)))
        }
        _ => u64::MAX,
    }
}

/// Each node's shortest answer in bytes (`None`: nothing satisfies it), and the nodes in the
/// order they were settled (nondecreasing length; parts before what they make).
fn settle(nodes: &[Node]) -> (Vec<Option<u64>>, Vec<u32>) {
    let rules: Vec<Rule> = nodes.iter().map(rule).collect();
    let mut parents: Vec<Vec<u32>> = vec![Vec::new(); nodes.len()];
    let mut waiting = vec![0usize; nodes.len()];
    let mut heap = BinaryHeap::new();
    for (i, r) in rules.iter().enumerate() {
        match r {
            Rule::Bytes(b) => heap.push(Reverse((*b, i as u32))),
            Rule::Shortest(parts) | Rule::All(parts) => {
                waiting[i] = parts.len();
                for &p in parts {
                    parents[p as usize].push(i as u32);
                }
            }
        }
    }
    let (mut shortest, mut order) = (vec![None; nodes.len()], Vec::with_capacity(nodes.len()));
    while let Some(Reverse((bytes, n))) = heap.pop() {
        if shortest[n as usize].is_some() {
            continue;
        }
        shortest[n as usize] = Some(bytes);
        order.push(n);
        for &p in &parents[n as usize] {
            if shortest[p as usize].is_some() {
                continue;
            }
            match &rules[p as usize] {
                // Settled shortest first: the first alternative settled is the shortest.
                Rule::Shortest(_) => heap.push(Reverse((bytes, p))),
                Rule::All(_) => {
                    waiting[p as usize] -= 1;
                    if waiting[p as usize] == 0 {
                        heap.push(Reverse((combined(&nodes[p as usize], &shortest), p)));
                    }
                }
                Rule::Bytes(_) => {}
            }
        }
    }
    (shortest, order)
}

/// Refuses a schema with a node nothing satisfies (naming the `$ref` that closes the cycle) or
/// whose shortest answer cannot fit in the context (naming the count that makes it so).
pub(super) fn check(c: &Compiled, limits: &SchemaLimits) -> Result<(), SchemaError> {
    let (shortest, order) = settle(&c.nodes);
    if let Some(n) = first_unsatisfiable(c, &shortest) {
        return Err(cycle(c, &shortest, n));
    }
    match order.into_iter().find(|&n| shortest[n as usize].is_some_and(|b| b > limits.room())) {
        Some(n) => Err(too_long(c, &shortest, n, limits)),
        None => Ok(()),
    }
}

/// The nodes `n` refers to: alternatives, properties, items, a dictionary's values.
fn parts(node: &Node) -> Vec<u32> {
    match node {
        Node::AnyOf(alts) => alts.clone(),
        Node::Object { props, .. } => props.iter().map(|p| p.node).collect(),
        &Node::Map(value) => vec![value],
        &Node::Array { items, .. } => vec![items],
        _ => Vec::new(),
    }
}

/// The first node nothing satisfies, breadth first from the root.
fn first_unsatisfiable(c: &Compiled, shortest: &[Option<u64>]) -> Option<u32> {
    let mut seen = vec![false; c.nodes.len()];
    let mut queue = std::collections::VecDeque::from([c.root]);
    seen[c.root as usize] = true;
    while let Some(n) = queue.pop_front() {
        if shortest[n as usize].is_none() {
            return Some(n);
        }
        for p in parts(&c.nodes[n as usize]) {
            if !std::mem::replace(&mut seen[p as usize], true) {
                queue.push_back(p);
            }
        }
    }
    None
}

/// Why nothing satisfies `n`: following what it cannot do without (the first unsatisfiable
/// alternative, required property or item) must come back to a node already passed, and the
/// last `$ref` on that loop is the one that closes it.
fn cycle(c: &Compiled, shortest: &[Option<u64>], n: u32) -> SchemaError {
    let unsatisfied = |p: u32| shortest[p as usize].is_none();
    let mut path: Vec<u32> = Vec::new();
    let mut at = n;
    let start = loop {
        if let Some(i) = path.iter().position(|&p| p == at) {
            break i;
        }
        path.push(at);
        let next = match &c.nodes[at as usize] {
            Node::AnyOf(alts) => alts.iter().copied().find(|&a| unsatisfied(a)),
            Node::Object { props, .. } => props.iter().filter(|p| p.required).map(|p| p.node).find(|&p| unsatisfied(p)),
            &Node::Array { items, .. } => Some(items).filter(|&i| unsatisfied(i)),
            _ => None,
        };
        match next {
            Some(next) => at = next,
            // Only a node left pending has no part to blame (compile fills them all).
            None => return err(c.origins[at as usize].at(), "nothing satisfies this schema"),
        }
    };
    let names: Vec<(&str, &str)> = path[start..]
        .iter()
        .filter_map(|&p| match &c.origins[p as usize] {
            Origin::Ref { at, name } => Some((at.as_str(), name.as_str())),
            _ => None,
        })
        .collect();
    let Some(&(at, name)) = names.last() else {
        return err(c.origins[n as usize].at(), "nothing satisfies this schema");
    };
    if names.len() == 1 {
        return err(at, format!("`{name}` refers to itself with nothing that can end it"));
    }
    let chain: Vec<String> =
        std::iter::once(name).chain(names.iter().map(|(_, n)| *n)).map(|n| format!("`{n}`")).collect();
    err(at, format!("`{name}` refers back to itself ({}) with nothing that can end it", chain.join(" → ")))
}

/// Why the shortest answer of `n` (whose parts all fit) does not fit.
fn too_long(c: &Compiled, shortest: &[Option<u64>], n: u32, limits: &SchemaLimits) -> SchemaError {
    let at = c.origins[n as usize].at();
    let bytes = shortest[n as usize].unwrap_or(u64::MAX);
    let room = limits.said();
    match &c.nodes[n as usize] {
        &Node::Array { items, min, .. } => {
            let item = shortest[items as usize].unwrap_or(u64::MAX);
            err(
                &format!("{at}/minItems"),
                format!(
                    "{min} items of at least {item} bytes each take at least {bytes} bytes, more than {room} holds"
                ),
            )
        }
        Node::String { min, .. } => err(
            &format!("{at}/minLength"),
            format!("a string of at least {min} characters takes at least {bytes} bytes, more than {room} holds"),
        ),
        Node::Object { .. } => {
            err(at, format!("the required properties take at least {bytes} bytes together, more than {room} holds"))
        }
        _ => err(at, format!("the shortest value takes {bytes} bytes, more than {room} holds")),
    }
}
