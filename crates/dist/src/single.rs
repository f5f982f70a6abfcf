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
        let lengths = (out.len(), mine.len());
        check_counts("all_gather", counts, (0, 1), lengths)?;
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
        let lengths = (buf.len(), out.len());
        check_counts("reduce_scatter", counts, (0, 1), lengths)?;
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
