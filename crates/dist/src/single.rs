//! One process: every collective is the identity.

use anyhow::Result;

use crate::{check_counts, Blocks, Collectives, Reduce};

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
        let (total, own) = (out.len(), mine.len());
        check_counts(
            "all_gather",
            Blocks {
                counts,
                rank: 0,
                world: 1,
                total,
                own,
            },
        )?;
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
        let (total, own) = (buf.len(), out.len());
        check_counts(
            "reduce_scatter",
            Blocks {
                counts,
                rank: 0,
                world: 1,
                total,
                own,
            },
        )?;
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
