//! The model's shape, causality, initialization and weight round-trip, on the CPU backend.

use burn::backend::Flex;
use burn::module::Module;
use burn::tensor::{Int, Tensor, TensorData};
use lab_config::ModelConfig;
use lab_model::{weights, Llama};

type B = Flex;

fn cfg() -> ModelConfig {
    ModelConfig::llama(97, 2, 32, 4, 2, 48, 16)
}

fn tokens(rows: &[Vec<i64>]) -> Tensor<B, 2, Int> {
    let t = rows[0].len();
    let flat: Vec<i64> = rows.concat();
    Tensor::from_data(TensorData::new(flat, [rows.len(), t]), &Default::default())
}

#[test]
fn parameter_count_matches_config_arithmetic() {
    let c = cfg();
    let model = Llama::<B>::new(&c, 42, &Default::default());
    assert_eq!(model.num_params() as u64, c.param_count().total());
    let mut tied = c.clone();
    tied.tie_embeddings = true;
    let model = Llama::<B>::new(&tied, 42, &Default::default());
    assert_eq!(model.num_params() as u64, tied.param_count().total());
}

#[test]
fn initial_loss_is_near_uniform_and_logits_have_the_right_shape() {
    let model = Llama::<B>::new(&cfg(), 42, &Default::default());
    let x = tokens(&[(0..16).collect(), (16..32).collect()]);
    assert_eq!(model.logits(x.clone()).dims(), [2, 16, 97]);
    let loss: f32 = model.loss(x.clone(), x).into_scalar();
    assert!((loss - (97f32).ln()).abs() < 0.1, "loss {loss}");
}

#[test]
fn attention_is_causal() {
    // Changing a later token never changes earlier positions' logits.
    let model = Llama::<B>::new(&cfg(), 1, &Default::default());
    let a: Vec<i64> = (0..16).map(|i| (i * 7) % 97).collect();
    let mut b = a.clone();
    b[10] = 3;
    let la = model
        .logits(tokens(&[a]))
        .into_data()
        .into_vec::<f32>()
        .unwrap();
    let lb = model
        .logits(tokens(&[b]))
        .into_data()
        .into_vec::<f32>()
        .unwrap();
    let per_pos = 97;
    assert_eq!(la[..10 * per_pos], lb[..10 * per_pos]);
    assert_ne!(la[10 * per_pos..], lb[10 * per_pos..]);
}

#[test]
fn init_is_a_function_of_the_seed() {
    let dev = Default::default();
    let a = weights::tensor_map(&Llama::<B>::new(&cfg(), 7, &dev));
    let b = weights::tensor_map(&Llama::<B>::new(&cfg(), 7, &dev));
    let c = weights::tensor_map(&Llama::<B>::new(&cfg(), 8, &dev));
    assert_eq!(a, b);
    assert_ne!(a["blocks.0.attn.wq.weight"], c["blocks.0.attn.wq.weight"]);
    let w = &a["embed"].data;
    let std = (w.iter().map(|x| x * x).sum::<f32>() / w.len() as f32).sqrt();
    assert!((std - 0.02).abs() < 0.002, "std {std}");
    assert!(a["norm.weight"].data.iter().all(|&x| x == 1.0));
}

#[test]
fn safetensors_round_trip_restores_identical_outputs() {
    let dev = Default::default();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.safetensors");
    let a = Llama::<B>::new(&cfg(), 1, &dev);
    weights::save_safetensors(&path, &weights::tensor_map(&a), Default::default()).unwrap();
    let (map, _) = weights::load_safetensors(&path).unwrap();
    let b = weights::load_tensor_map(Llama::<B>::new(&cfg(), 2, &dev), &map).unwrap();
    let x = tokens(&[(0..16).collect()]);
    assert_eq!(
        a.logits(x.clone()).into_data().into_vec::<f32>().unwrap(),
        b.logits(x).into_data().into_vec::<f32>().unwrap()
    );
    // A model of another shape is refused with the tensor's name.
    let mut other = cfg();
    other.d_ff = 64;
    let err = weights::load_tensor_map(Llama::<B>::new(&other, 2, &dev), &map).unwrap_err();
    assert!(err.to_string().contains("ffn.gate.weight"), "{err}");
}

#[test]
fn depth_scaled_init_shrinks_only_the_residual_output_projections() {
    let std_of = |m: &weights::TensorMap, path: &str| {
        let d = &m[path].data;
        (d.iter().map(|&x| (x as f64).powi(2)).sum::<f64>() / d.len() as f64).sqrt()
    };
    let plain = weights::tensor_map(&Llama::<B>::new(&cfg(), 42, &Default::default()));
    let mut c = cfg();
    c.init_depth_scaled = true;
    let scaled = weights::tensor_map(&Llama::<B>::new(&c, 42, &Default::default()));
    // 0.02 / sqrt(2 · n_layer) = 0.01 for the 2-layer config.
    for path in ["blocks.1.attn.wo.weight", "blocks.0.ffn.down.weight"] {
        let s = std_of(&scaled, path);
        assert!((s - 0.01).abs() < 0.0015, "{path}: std {s}");
    }
    // Everything else is drawn exactly as without the option (same seed, same stream).
    assert_eq!(
        plain["blocks.1.attn.wq.weight"],
        scaled["blocks.1.attn.wq.weight"]
    );
    assert_eq!(plain["embed"], scaled["embed"]);
    assert!((std_of(&plain, "blocks.1.attn.wo.weight") - 0.02).abs() < 0.003);
    // The option is off in the recipe: its config hash does not mention it.
    assert!(
        !lab_config::LabConfig::from_toml(include_str!("../../../configs/tiny-cpu.toml"))
            .unwrap()
            .canonical_json()
            .contains("init_depth_scaled")
    );
}

/// ZeRO-1 in bf16 holds an untied LM head as a bf16 copy on the ranks that do not update it.
/// Evaluation's logits, per-token losses and cached decoding widen it to the fp32 hidden
/// states: the same numbers as an fp32 head holding the bf16-rounded values.
#[test]
fn a_bf16_head_reads_as_its_values_in_fp32() {
    use burn::module::Param;
    use burn::tensor::FloatDType;
    let model = Llama::<B>::new(&cfg(), 42, &Default::default());
    let set_head = |m: &Llama<B>, w: Tensor<B, 2>| {
        let mut m = m.clone();
        m.lm_head.as_mut().unwrap().weight = Param::from_tensor(w);
        m
    };
    let head = model.lm_head.as_ref().unwrap().weight.val();
    let copy = set_head(&model, head.clone().cast(FloatDType::BF16));
    let rounded = set_head(&model, head.cast(FloatDType::BF16).cast(FloatDType::F32));
    let x = tokens(&[vec![3, 1, 4, 1, 5, 9], vec![2, 6, 5, 3, 5, 8]]);
    let y = tokens(&[vec![1, 4, 1, 5, 9, 2], vec![6, 5, 3, 5, 8, 9]]);
    let same = |a: Tensor<B, 3>, b: Tensor<B, 3>| assert_eq!(a.into_data(), b.into_data());
    same(copy.logits(x.clone()), rounded.logits(x.clone()));
    same(
        copy.token_losses(x.clone(), y.clone()).unsqueeze(),
        rounded.token_losses(x.clone(), y).unsqueeze(),
    );
    let (mut c1, mut c2) = (copy.new_cache(6), rounded.new_cache(6));
    same(
        copy.forward_cached(x.clone(), &mut c1),
        rounded.forward_cached(x, &mut c2),
    );
}
