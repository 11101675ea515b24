//! Nested `anyOf`s (and the `$ref` aliases, which are one-alternative `anyOf`s) flattened once at
//! compile: each `anyOf` lists the nodes a value of it may be, each once, in the order the
//! matcher's own flattening reaches them, so the matcher's per-character work is one level and the
//! alternatives a value may take are bounded by [`MOST_ANY_OF`]. Linear in the graph: `anyOf`s
//! that reach one another are one component, flattened once, after every component they reach.

use super::compile::{Compiled, Origin, err};
use super::limits::MOST_ANY_OF;
use super::{Node, SchemaError};

/// Not yet numbered or stamped.
const NONE: u32 = u32::MAX;

/// Replaces every `anyOf`'s alternatives with what they flatten to; refuses one that flattens to
/// more than [`MOST_ANY_OF`], naming the innermost `anyOf` written in the schema that does.
pub(super) fn flatten(c: &mut Compiled) -> Result<(), SchemaError> {
    let mut flat: Vec<Option<Vec<u32>>> = vec![None; c.nodes.len()];
    let (mut component, mut stamp) = (vec![NONE; c.nodes.len()], vec![NONE; c.nodes.len()]);
    for (k, members) in components(&c.nodes).into_iter().enumerate() {
        let k = k as u32;
        for &m in &members {
            component[m as usize] = k;
        }
        // A member of a loop of `anyOf`s flattens to what all of them do: one list serves.
        let entry = members.iter().copied().min().unwrap_or(0);
        let Some(leaves) = leaves(&c.nodes, &flat, &component, (k, entry), &mut stamp) else {
            // A `$ref` or definition is as wide as what it names: name the `anyOf` itself.
            let written = members.iter().find(|&&m| matches!(c.origins[m as usize], Origin::Schema(_)));
            return Err(err(
                c.origins[*written.unwrap_or(&entry) as usize].at(),
                format!(
                    "more than {MOST_ANY_OF} alternatives once nested anyOf and $ref are flattened; at most {MOST_ANY_OF}"
                ),
            ));
        };
        for &m in &members {
            flat[m as usize] = Some(leaves.clone());
        }
    }
    for (node, leaves) in c.nodes.iter_mut().zip(flat) {
        if let Some(l) = leaves {
            *node = Node::AnyOf(l);
        }
    }
    Ok(())
}

/// What a value of component `k` may be (from its `entry`), depth first as `SchemaPrefix` walks
/// them, each node once: components it reaches are spliced in already flattened. `None` past
/// [`MOST_ANY_OF`].
fn leaves(
    nodes: &[Node],
    flat: &[Option<Vec<u32>>],
    component: &[u32],
    (k, entry): (u32, u32),
    stamp: &mut [u32],
) -> Option<Vec<u32>> {
    let (mut leaves, mut todo) = (Vec::new(), vec![entry]);
    while let Some(x) = todo.pop() {
        if std::mem::replace(&mut stamp[x as usize], k) == k {
            continue;
        }
        match &nodes[x as usize] {
            Node::AnyOf(alts) if component[x as usize] == k => todo.extend(alts.iter().rev()),
            Node::AnyOf(_) => {
                for &l in flat[x as usize].as_deref()? {
                    if std::mem::replace(&mut stamp[l as usize], k) != k {
                        leaves.push(l);
                    }
                }
            }
            _ => leaves.push(x),
        }
        if leaves.len() > MOST_ANY_OF {
            return None;
        }
    }
    Some(leaves)
}

/// The strongly connected components of the `anyOf`s (Tarjan's algorithm, without recursion),
/// each after every component it reaches.
fn components(nodes: &[Node]) -> Vec<Vec<u32>> {
    let alts = |v: usize| match &nodes[v] {
        Node::AnyOf(a) => a.as_slice(),
        _ => &[],
    };
    let is_any_of = |v: usize| matches!(nodes[v], Node::AnyOf(_));
    let (mut index, mut low, mut open) = (vec![NONE; nodes.len()], vec![NONE; nodes.len()], vec![false; nodes.len()]);
    let (mut stack, mut out, mut next) = (Vec::new(), Vec::new(), 0u32);
    for root in (0..nodes.len()).filter(|&r| is_any_of(r)) {
        if index[root] != NONE {
            continue;
        }
        // Each call: a node and how many of its alternatives it has gone through.
        let mut calls = vec![(root, 0usize)];
        (index[root], low[root], open[root]) = (next, next, true);
        next += 1;
        stack.push(root);
        while let Some(top) = calls.last_mut() {
            let (v, i) = *top;
            if let Some(&w) = alts(v).get(i) {
                top.1 += 1;
                let w = w as usize;
                if !is_any_of(w) {
                    continue;
                }
                if index[w] == NONE {
                    (index[w], low[w], open[w]) = (next, next, true);
                    next += 1;
                    stack.push(w);
                    calls.push((w, 0));
                } else if open[w] {
                    low[v] = low[v].min(index[w]);
                }
                continue;
            }
            calls.pop();
            if let Some(&(u, _)) = calls.last() {
                low[u] = low[u].min(low[v]);
            }
            if low[v] == index[v] {
                let mut members = Vec::new();
                while let Some(w) = stack.pop() {
                    open[w] = false;
                    members.push(w as u32);
                    if w == v {
                        break;
                    }
                }
                out.push(members);
            }
        }
    }
    out
}
