//! The span tree of a profile, walked in display order.
//!
//! [`Profile::spans`](crate::Profile::spans) is a flat list whose entries name their parent by
//! index. A profile read from disk may be damaged or hostile (a parent out of range, a node its
//! own ancestor, chains deeper than any stack), so the walk here is iterative, visits every node
//! exactly once and treats a node whose parent cannot be followed as a root.

use super::SpanMetrics;

/// One node of the span tree in display order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct TreeRow {
    /// Index into the span list.
    pub index: usize,
    /// Distance from the root (0 for top-level spans).
    pub depth: usize,
}

/// Orders `spans` depth first, parents before children, siblings in list order.
///
/// Every node appears exactly once. Nodes whose parent is missing, out of range or themselves,
/// and nodes caught in a parent cycle, are shown as roots.
pub fn span_tree(spans: &[SpanMetrics]) -> Vec<TreeRow> {
    let n = spans.len();
    let mut children: Vec<Vec<usize>> = vec![Vec::new(); n];
    let mut roots = Vec::new();
    for (index, span) in spans.iter().enumerate() {
        match span.parent.map(|p| p as usize) {
            Some(parent) if parent < n && parent != index => children[parent].push(index),
            _ => roots.push(index),
        }
    }
    let mut visited = vec![false; n];
    let mut rows = Vec::with_capacity(n);
    let mut stack: Vec<TreeRow> = Vec::new();
    let mut walk = |root: usize, rows: &mut Vec<TreeRow>, visited: &mut Vec<bool>| {
        stack.push(TreeRow {
            index: root,
            depth: 0,
        });
        while let Some(row) = stack.pop() {
            if visited[row.index] {
                continue;
            }
            visited[row.index] = true;
            rows.push(row);
            for &child in children[row.index].iter().rev() {
                if !visited[child] {
                    stack.push(TreeRow {
                        index: child,
                        depth: row.depth + 1,
                    });
                }
            }
        }
    };
    for root in roots {
        walk(root, &mut rows, &mut visited);
    }
    // Whatever is left hangs off a parent cycle: show it rather than lose it.
    for index in 0..n {
        if !visited[index] {
            walk(index, &mut rows, &mut visited);
        }
    }
    rows
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(id: u32, parent: Option<u32>) -> SpanMetrics {
        SpanMetrics {
            id,
            parent,
            name: format!("s{id}"),
            ..SpanMetrics::default()
        }
    }

    #[test]
    fn children_follow_their_parent_in_order() {
        let spans = [
            node(0, None),
            node(1, Some(0)),
            node(2, Some(1)),
            node(3, Some(0)),
        ];
        let rows = span_tree(&spans);
        let order: Vec<_> = rows.iter().map(|r| (r.index, r.depth)).collect();
        assert_eq!(order, [(0, 0), (1, 1), (2, 2), (3, 1)]);
    }

    #[test]
    fn broken_parents_and_cycles_still_show_every_node_once() {
        let spans = [
            node(0, Some(0)),
            node(1, Some(99)),
            node(2, Some(3)),
            node(3, Some(2)),
        ];
        let mut seen: Vec<_> = span_tree(&spans).iter().map(|r| r.index).collect();
        seen.sort();
        assert_eq!(seen, [0, 1, 2, 3]);
    }

    #[test]
    fn a_very_deep_chain_does_not_overflow_the_stack() {
        let spans: Vec<_> = (0..200_000u32).map(|i| node(i, i.checked_sub(1))).collect();
        let rows = span_tree(&spans);
        assert_eq!(rows.len(), 200_000);
        assert_eq!(rows.last().unwrap().depth, 199_999);
    }
}
