//! Gradient bucketing: a flat gradient buffer is all-reduced in pieces of about `cap`
//! elements, each a run of whole parameters, so no collective needs a second buffer of the
//! model's size and the engine pipelines the pieces.

use std::ops::Range;

use anyhow::Result;

use crate::{Collectives, Reduce};

/// Splits parameters of `sizes` elements, laid out back to back, into ranges of whole
/// parameters of at most `cap` elements (a parameter larger than `cap` is a range alone).
pub fn buckets(sizes: &[usize], cap: usize) -> Vec<Range<usize>> {
    let mut out: Vec<Range<usize>> = Vec::new();
    let mut at = 0;
    for &n in sizes {
        match out.last_mut() {
            Some(last) if last.end == at && last.len() + n <= cap => last.end += n,
            _ => out.push(at..at + n),
        }
        at += n;
    }
    out.retain(|r| !r.is_empty());
    out
}

/// All-reduces `buf` one bucket at a time.
pub fn all_reduce_bucketed(
    coll: &dyn Collectives,
    buf: &mut [f32],
    buckets: &[Range<usize>],
    op: Reduce,
) -> Result<()> {
    for b in buckets {
        coll.all_reduce(&mut buf[b.clone()], op)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn whole_parameters_up_to_the_cap() {
        assert_eq!(
            buckets(&[3, 4, 2, 10, 1], 8),
            vec![0..7, 7..9, 9..19, 19..20]
        );
    }

    proptest! {
        #[test]
        fn buckets_tile_the_buffer_at_parameter_boundaries(
            sizes in proptest::collection::vec(0usize..50, 0..30),
            cap in 1usize..100,
        ) {
            let b = buckets(&sizes, cap);
            let total: usize = sizes.iter().sum();
            let mut at = 0;
            for r in &b {
                prop_assert_eq!(r.start, at);
                prop_assert!(!r.is_empty());
                at = r.end;
            }
            prop_assert_eq!(at, total);
            let mut bounds = vec![0];
            for n in &sizes { bounds.push(bounds.last().unwrap() + n); }
            for r in &b {
                prop_assert!(bounds.contains(&r.start) && bounds.contains(&r.end));
                // Over the cap only when the bucket is a single parameter.
                prop_assert!(r.len() <= cap || sizes.contains(&r.len()));
            }
        }
    }
}
