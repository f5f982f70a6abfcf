//! One process: every collective is the identity.

use anyhow::Result;

use crate::{check_counts, Collectives, Reduce};

/// The world of one rank.
pub struct Single;

impl Collectives for Single {
    fn rank(&self) -> usize {
        0
    }
    fn world(&self) -> usize {
        1
    }
    fn engine(&self) -> &'static str {
        "single"
    }
    fn all_reduce(&self, _: &mut [f32], _: Reduce) -> Result<()> {
        Ok(())
    }
    fn all_gather(&self, mine: &[f32], counts: &[usize], out: &mut [f32]) -> Result<()> {
        check_counts("all_gather", counts, 1, out.len())?;
        out.copy_from_slice(mine);
        Ok(())
    }
    fn reduce_scatter(
        &self,
        buf: &[f32],
        counts: &[usize],
        out: &mut [f32],
        _: Reduce,
    ) -> Result<()> {
        check_counts("reduce_scatter", counts, 1, buf.len())?;
        out.copy_from_slice(buf);
        Ok(())
    }
    fn broadcast(&self, _: &mut [f32], _: usize) -> Result<()> {
        Ok(())
    }
    fn broadcast_bytes(&self, _: &mut Vec<u8>, _: usize) -> Result<()> {
        Ok(())
    }
    fn barrier(&self) -> Result<()> {
        Ok(())
    }
}
