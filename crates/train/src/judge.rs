//! What the trainer measures at each evaluation: the validation loss, and with `[eval]` the
//! loss by document type, a multiple-choice probe and a few generated samples.

use std::collections::BTreeMap;

use anyhow::{Context, Result};
use lab_config::{EvalConfig, LabConfig};
use lab_corpus::tokenize::Tokenizer;
use lab_eval::mc::{self, McItem, McOptions};
use lab_model::generate::{generate, Sampling};
use lab_model::{FusedOps, Llama};
use serde_json::{json, Value};

use crate::eval::evaluate;
use crate::stream::TrainData;

/// One evaluation's numbers (for the metrics row) and events.
pub struct Judgement {
    pub val_loss: f64,
    /// `val_loss.<type>`, `mc_acc`, `mc_acc_norm`.
    pub extra: BTreeMap<String, f64>,
    pub events: Vec<(&'static str, Value)>,
}

pub struct Judge {
    eval: EvalConfig,
    tokenizer: Option<Tokenizer>,
    items: Vec<McItem>,
    /// val.bin has document types (meta.json spans).
    typed: bool,
}

impl Judge {
    /// Loads the probe and the tokenizer up front: a missing probe file fails before training.
    pub fn new(cfg: &LabConfig, data: &TrainData) -> Result<Judge> {
        let eval = cfg.eval.clone().unwrap_or_default();
        let items = match &eval.mc_file {
            Some(f) => mc::load_items(std::path::Path::new(f)).context("eval.mc_file")?,
            None => Vec::new(),
        };
        let needs_tokenizer = !items.is_empty() || !eval.prompts.is_empty();
        let tokenizer = match needs_tokenizer {
            true => Some(
                Tokenizer::of_data(&data.meta.tokenizer, &data.dir)
                    .context("the data's tokenizer (for [eval])")?,
            ),
            false => None,
        };
        let typed = data
            .meta
            .spans
            .get("val.bin")
            .is_some_and(|s| !s.is_empty());
        Ok(Judge {
            eval,
            tokenizer,
            items,
            typed,
        })
    }

    pub fn judge<B: FusedOps>(
        &self,
        model: &Llama<B>,
        data: &TrainData,
        cfg: &LabConfig,
    ) -> Result<Judgement> {
        let val_loss = evaluate(model, &data.val, cfg)?;
        let mut extra = BTreeMap::new();
        let mut events = Vec::new();
        let (rows, batches) = (cfg.train.micro_batch, cfg.train.eval_batches);
        if self.eval.by_type && self.typed {
            let p = lab_eval::perplexity::eval_windows(
                model,
                &data.val,
                &data.meta,
                cfg.model.seq_len,
                rows,
                batches,
            )?;
            for t in &p.by_type {
                extra.insert(format!("val_loss.{}", t.doc_type), t.loss);
            }
            events.push((
                "eval",
                json!({ "by_type": p.by_type, "overall": p.overall }),
            ));
        }
        if let (Some(tok), false) = (&self.tokenizer, self.items.is_empty()) {
            let opts = McOptions {
                shots: self.eval.mc_shots,
                dev: None,
                limit: Some(self.eval.mc_items),
                batch_rows: rows,
            };
            let (r, _) = mc::score(model, tok, &self.items, &opts)?;
            extra.insert("mc_acc".into(), r.acc);
            extra.insert("mc_acc_norm".into(), r.acc_norm);
            events.push(("mc_probe", serde_json::to_value(&r)?));
        }
        if let (Some(tok), false) = (&self.tokenizer, self.eval.prompts.is_empty()) {
            let samples: Vec<Value> = self
                .eval
                .prompts
                .iter()
                .map(|p| {
                    let (ids, _) = generate(
                        model,
                        &tok.encode(p),
                        self.eval.sample_tokens,
                        &Sampling::greedy(),
                        Some(tok.eot()),
                        &mut |_| {},
                    );
                    json!({ "prompt": p, "completion": tok.decode(&ids) })
                })
                .collect();
            events.push(("samples", json!({ "samples": samples })));
        }
        Ok(Judgement {
            val_loss,
            extra,
            events,
        })
    }
}
