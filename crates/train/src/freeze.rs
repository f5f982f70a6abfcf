//! `train.freeze_non_embedding_steps` (`--freeze-non-embedding-steps K`): for the first K steps
//! of a continued pretraining only the embedding and the LM head train, so rows a tokenizer swap
//! composed settle before the network they feed moves. The other gradients are dropped before
//! the norm is taken: clipping sees what trains, and AdamW neither updates those parameters
//! nor their moments (each parameter counts its own updates, so it starts at `t = 1` later).

use burn::optim::GradientsParams;
use lab_config::LabConfig;
use lab_model::Llama;

use crate::backend::TrainBackend;

/// True while step `step` (0-based) trains the embedding and the LM head only.
pub fn is_frozen(cfg: &LabConfig, step: u64) -> bool {
    step < cfg.train.freeze_non_embedding_steps as u64
}

/// The gradients step `step` applies: all of them, or while frozen the embedding's and the LM
/// head's only.
pub fn trainable_grads<B: TrainBackend>(
    cfg: &LabConfig,
    step: u64,
    model: &Llama<B>,
    grads: GradientsParams,
) -> GradientsParams {
    if is_frozen(cfg, step) {
        embedding_grads_only(model, grads)
    } else {
        grads
    }
}

/// `grads` with the embedding's and the LM head's gradients only.
pub fn embedding_grads_only<B: TrainBackend>(
    model: &Llama<B>,
    mut grads: GradientsParams,
) -> GradientsParams {
    let mut kept = GradientsParams::new();
    let ids = std::iter::once(model.embed.id).chain(model.lm_head.as_ref().map(|h| h.weight.id));
    for id in ids {
        if let Some(g) = grads.remove::<B::InnerBackend, 2>(id) {
            kept.register(id, g);
        }
    }
    kept
}

#[cfg(test)]
mod tests {
    use burn::module::AutodiffModule;
    use lab_data::Batch;
    use lab_model::weights::{tensor_map, TensorMap};

    use super::*;
    use crate::state::TrainingState;
    use crate::step::forward_backward;

    type B = burn::backend::Autodiff<burn::backend::Flex>;

    fn cfg() -> LabConfig {
        LabConfig::from_toml(
            "name='t'\n[model]\nvocab_size=32\nn_layer=1\nd_model=8\nn_head=2\nn_kv_head=1\nd_ff=16\nseq_len=4\n\
             [train]\nmicro_batch=2\ntotal_steps=4\nwarmup_steps=0\npeak_lr=1e-2\nmin_lr=1e-3\nfreeze_non_embedding_steps=2\n",
        )
        .unwrap()
    }

    fn batch() -> Batch {
        Batch {
            inputs: vec![1, 5, 9, 3, 7, 2, 8, 4],
            targets: vec![5, 9, 3, 1, 2, 8, 4, 6],
            rows: 2,
            seq_len: 4,
        }
    }

    /// One step as the trainer takes it (frozen or not).
    fn step(cfg: &LabConfig, s: TrainingState<B>) -> TrainingState<B> {
        let device = Default::default();
        let (grads, _) = forward_backward(&s.model, &[batch()], &device, None);
        let grads = trainable_grads(cfg, s.step, &s.model, grads);
        let mut s = s.apply(grads, 1e-2, 1.0);
        s.step += 1;
        s
    }

    fn weights(s: &TrainingState<B>) -> TensorMap {
        tensor_map(&s.model.valid())
    }

    #[test]
    fn frozen_steps_move_only_the_embedding_and_the_head_and_thawed_moments_start_at_one() {
        let cfg = cfg();
        let device = Default::default();
        let mut s = TrainingState::<B>::fresh(&cfg, &device);
        let start = weights(&s);
        for _ in 0..2 {
            s = step(&cfg, s);
        }
        let frozen = weights(&s);
        for (name, t) in &frozen {
            let moved = *t != start[name];
            let trains = name == "embed" || name == "lm_head.weight";
            assert_eq!(moved, trains, "{name}");
        }
        let (moments, updates) = s.optim.state();
        assert_eq!(updates, 2);
        let names: Vec<&str> = moments.keys().map(String::as_str).collect();
        assert_eq!(
            names,
            ["m.embed", "m.lm_head.weight", "v.embed", "v.lm_head.weight"]
        );
        assert!(s.optim.param_updates().is_empty(), "both counted 2");

        s = step(&cfg, s);
        assert!(weights(&s).iter().all(|(name, t)| *t != frozen[name]));
        let counts = s.optim.param_updates();
        assert_eq!(counts.len(), 10, "every block parameter and the final norm");
        assert!(counts.values().all(|&t| t == 1), "{counts:?}");
        assert!(!counts.contains_key("embed"));
    }

    #[test]
    fn thawed_counts_survive_a_checkpoint_round_trip() {
        let cfg = cfg();
        let device = Default::default();
        let mut s = TrainingState::<B>::fresh(&cfg, &device);
        for _ in 0..3 {
            s = step(&cfg, s);
        }
        let (moments, updates) = s.optim.state();
        let counts = s.optim.param_updates();
        let mut back = crate::optim::AdamW::<burn::backend::Flex>::new(&cfg.train);
        back.load_state(moments, updates, &counts, &device).unwrap();
        assert_eq!(back.param_updates(), counts);
        let mut bogus = counts.clone();
        bogus.insert("nowhere".into(), 1);
        let (moments, _) = s.optim.state();
        let e = back
            .load_state(moments, updates, &bogus, &device)
            .unwrap_err();
        assert!(e.to_string().contains("nowhere"), "{e}");
    }
}
