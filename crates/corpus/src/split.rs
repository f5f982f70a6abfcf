//! Seeded document-level train/val split: a document goes to val when a hash of (seed, its
//! text) falls below `val_fraction`. It depends on nothing else (not the order, not the
//! worker count, not which other documents were filtered), so it reproduces exactly.

use crate::hash::{hash64, unit_interval};

pub fn is_val(text: &str, seed: u64, val_fraction: f64) -> bool {
    unit_interval(hash64(text.as_bytes(), seed ^ 0x7a1_5b117)) < val_fraction
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn split_is_a_pure_function_of_seed_and_text(text in "\\PC{0,50}", seed: u64, f in 0.0f64..1.0) {
            prop_assert_eq!(is_val(&text, seed, f), is_val(&text.clone(), seed, f));
            prop_assert!(!is_val(&text, seed, 0.0));
            prop_assert!(is_val(&text, seed, 1.0));
        }
    }

    #[test]
    fn val_share_is_close_to_the_fraction_and_seeds_differ() {
        let docs: Vec<String> = (0..20_000).map(|i| format!("document {i}")).collect();
        let share = |seed| docs.iter().filter(|d| is_val(d, seed, 0.1)).count();
        let (a, b) = (share(1), share(2));
        assert!((1_800..2_200).contains(&a), "{a}");
        let same = docs
            .iter()
            .filter(|d| is_val(d, 1, 0.1) && is_val(d, 2, 0.1))
            .count();
        assert!(
            same < a / 4,
            "seeds 1 and 2 pick {same} of the same val docs ({a}, {b})"
        );
    }
}
