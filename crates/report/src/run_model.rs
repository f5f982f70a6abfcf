//! A run's model as `lab eval` and `lab generate` load it: a verified checkpoint's weights in
//! the run's own config, with the data the run trained on.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use burn::tensor::backend::Backend;
use lab_config::LabConfig;
use lab_data::Meta;
use lab_model::{weights, Llama};
use lab_train::checkpoint;

use crate::export::{choose_checkpoint, CheckpointChoice};

pub struct RunModel<B: Backend> {
    pub cfg: LabConfig,
    pub model: Llama<B>,
    /// The checkpoint's step.
    pub step: u64,
    /// The data dir and meta.json the run recorded (data.json).
    pub data_dir: Option<PathBuf>,
    pub meta: Option<Meta>,
}

pub fn load_run_model<B: Backend>(
    run: &Path,
    choice: CheckpointChoice,
    device: &B::Device,
) -> Result<RunModel<B>> {
    let config = run.join(lab_run::CONFIG);
    let Ok(text) = std::fs::read_to_string(&config) else {
        bail!(
            "--run {}: no config.toml (not a run folder of this lab)",
            run.display()
        );
    };
    let cfg = LabConfig::from_toml(&text).with_context(|| config.display().to_string())?;
    let (dir, state) = choose_checkpoint(run, choice)?;
    let (tensors, _) = weights::load_safetensors(&checkpoint::model_file(&dir))?;
    let model =
        weights::load_tensor_map_owned(Llama::new(&cfg.model, cfg.train.seed, device), tensors)
            .with_context(|| dir.display().to_string())?;
    let data: serde_json::Value = std::fs::read_to_string(run.join(lab_train::run::DATA))
        .ok()
        .and_then(|t| serde_json::from_str(&t).ok())
        .unwrap_or_default();
    Ok(RunModel {
        cfg,
        model,
        step: state.step,
        data_dir: data["data_dir"].as_str().map(PathBuf::from),
        meta: serde_json::from_value(data["meta"].clone()).ok(),
    })
}
