//! ZeRO-1's partition: each parameter's optimizer state lives on one rank, parameters dealt
//! out largest first to the least-loaded rank so every rank holds about `1/world` of it.

use std::ops::Range;

/// Which rank owns each parameter (by index), balanced by size. Deterministic: every rank
/// computes the same answer from the same sizes.
pub fn balance(sizes: &[usize], world: usize) -> Vec<usize> {
    let mut order: Vec<usize> = (0..sizes.len()).collect();
    // Largest first, ties by index: the greedy bound max - min ≤ the largest parameter.
    order.sort_by_key(|&i| (std::cmp::Reverse(sizes[i]), i));
    let mut load = vec![0usize; world];
    let mut owner = vec![0; sizes.len()];
    for i in order {
        let r = (0..world).min_by_key(|&r| (load[r], r)).expect("world ≥ 1");
        owner[i] = r;
        load[r] += sizes[i];
    }
    owner
}

/// The flat layout of a ZeRO-1 step: parameters grouped by owner (rank 0's first, each group
/// in parameter order), so a reduce-scatter hands each rank exactly its parameters' gradient
/// and an all-gather returns every rank's updated parameters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Shards {
    pub owner: Vec<usize>,
    /// Parameter indices in flat-buffer order.
    pub order: Vec<usize>,
    /// Where each parameter sits in the flat buffer (indexed by parameter).
    pub span: Vec<Range<usize>>,
    /// Elements per rank.
    pub counts: Vec<usize>,
}

impl Shards {
    pub fn new(sizes: &[usize], world: usize) -> Self {
        Self::from_owner(sizes, balance(sizes, world), world)
    }

    /// The layout for a given assignment of parameters to ranks.
    pub fn from_owner(sizes: &[usize], owner: Vec<usize>, world: usize) -> Self {
        let mut order: Vec<usize> = (0..sizes.len()).collect();
        order.sort_by_key(|&i| (owner[i], i));
        let mut span = vec![0..0; sizes.len()];
        let mut counts = vec![0; world];
        let mut at = 0;
        for &i in &order {
            span[i] = at..at + sizes[i];
            counts[owner[i]] += sizes[i];
            at += sizes[i];
        }
        Shards {
            owner,
            order,
            span,
            counts,
        }
    }

    /// Where rank `r`'s block starts in the flat buffer.
    pub fn offset(&self, r: usize) -> usize {
        self.counts[..r].iter().sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn every_parameter_has_one_owner_and_loads_are_balanced(
            sizes in proptest::collection::vec(1usize..1000, 1..60),
            world in 1usize..9,
        ) {
            let s = Shards::new(&sizes, world);
            prop_assert_eq!(s.counts.iter().sum::<usize>(), sizes.iter().sum::<usize>());
            let max = *s.counts.iter().max().unwrap();
            let min = *s.counts.iter().min().unwrap();
            prop_assert!(max - min <= *sizes.iter().max().unwrap());
            for (i, r) in s.span.iter().enumerate() {
                prop_assert_eq!(r.len(), sizes[i]);
                // Inside its owner's block.
                let start = s.offset(s.owner[i]);
                prop_assert!(r.start >= start && r.end <= start + s.counts[s.owner[i]]);
            }
        }
    }

    #[test]
    fn two_ranks_split_a_model_about_in_half() {
        let sizes = [1000, 1000, 10, 10, 500, 500, 8];
        let s = Shards::new(&sizes, 2);
        assert_eq!(s.counts, vec![1518, 1510]);
    }
}
