//! Everything a step changes: the model, the optimizer, the step count, the data cursor, the
//! rollback count and the schedule, and how it is built fresh or from a checkpoint.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use burn::module::AutodiffModule;
use burn::optim::GradientsParams;
use lab_config::LabConfig;
use lab_model::weights::{self, TensorMap};
use lab_model::Llama;

use crate::backend::TrainBackend;
use crate::checkpoint::{self, Loaded, TrainState};
use crate::optim::AdamW;
use crate::schedule::Schedule;

use crate::stream::DataCursor;

pub struct TrainingState<B: TrainBackend> {
    pub model: Llama<B>,
    pub optim: AdamW<B::InnerBackend>,
    /// Optimizer steps completed (the 0-based index of the next step).
    pub step: u64,
    pub cursor: DataCursor,
    pub rollbacks: u32,
    /// The learning rate by step and where the run ends (`--extend-to-steps` moves it).
    pub schedule: Schedule,
}

impl<B: TrainBackend> TrainingState<B> {
    /// Step 0: weights drawn from the seed, zero moments, an empty cursor.
    pub fn fresh(cfg: &LabConfig, device: &B::Device) -> Self {
        Self {
            model: Llama::new(&cfg.model, cfg.train.seed, device)
                .with_lm_head_loss(cfg.train.lm_head_loss)
                .with_precision(cfg.train.precision),
            optim: AdamW::new(&cfg.train),
            step: 0,
            cursor: DataCursor::default(),
            rollbacks: 0,
            schedule: Schedule::new(&cfg.train, Vec::new()),
        }
    }

    /// Step 0 from given weights (`--init-from-hf`): zero moments, an empty cursor. Every
    /// parameter must be in `tensors` with its shape; none is drawn from the seed.
    pub fn from_weights(cfg: &LabConfig, tensors: TensorMap, device: &B::Device) -> Result<Self> {
        let mut state = Self::fresh(cfg, device);
        state.model = weights::load_tensor_map_owned(state.model, tensors)?;
        Ok(state)
    }

    /// The state a verified checkpoint holds. Its tensors are moved out of `ck` (a state of
    /// gigabytes is not copied twice).
    pub fn from_checkpoint(cfg: &LabConfig, ck: &mut Loaded, device: &B::Device) -> Result<Self> {
        let fresh = Self::fresh(cfg, device);
        let model = weights::load_tensor_map_owned(fresh.model, std::mem::take(&mut ck.model))
            .with_context(|| format!("{}", ck.dir.display()))?;
        let mut optim = fresh.optim;
        let moments = std::mem::take(&mut ck.optimizer);
        let (updates, counts) = (ck.state.optimizer_updates, &ck.state.param_updates);
        optim.load_state(moments, updates, counts, device)?;
        Ok(Self {
            model,
            optim,
            step: ck.state.step,
            cursor: ck.state.cursor.clone(),
            rollbacks: ck.state.rollbacks,
            schedule: Schedule::new(&cfg.train, ck.state.schedule_extensions.clone()),
        })
    }

    /// Writes this state as the checkpoint `meta` describes (see [`checkpoint::save`]).
    pub fn save(&self, run_dir: &Path, meta: TrainState) -> Result<PathBuf> {
        // The inner model: reading the weights must not add nodes to the autodiff graph.
        let model = weights::pending_tensors(&self.model.valid());
        checkpoint::save(run_dir, meta, &model, &self.optim.pending_state())
    }

    /// Applies one AdamW update (the policies have accepted the step).
    pub fn apply(mut self, grads: GradientsParams, lr: f64, clip_scale: f64) -> Self {
        self.model = self.optim.apply(self.model, grads, lr, clip_scale);
        self
    }
}
