//! Incremental decoding with the KV cache against recomputing the whole sequence.

use burn::backend::Flex;
use burn::tensor::{Int, Tensor, TensorData};
use lab_config::ModelConfig;
use lab_model::generate::{generate, generate_recompute, Sampling};
use lab_model::Llama;

type B = Flex;

fn cfg() -> ModelConfig {
    ModelConfig {
        // Wide weights: logits far apart, so greedy choices are not float ties.
        init_std: 0.3,
        ..ModelConfig::llama(97, 2, 48, 6, 2, 64, 40)
    }
}

#[test]
fn greedy_with_the_cache_gives_exactly_the_tokens_of_recomputing() {
    let model = Llama::<B>::new(&cfg(), 11, &Default::default());
    for prompt in [
        vec![5u32],
        vec![1, 2, 3, 4, 5, 6, 7],
        (0..19).map(|i| (i * 7) % 97).collect(),
    ] {
        // Past seq_len / 2, up to the end of the context.
        let new = 40 - prompt.len();
        let mut streamed = Vec::new();
        let (cached, _) = generate(&model, &prompt, new, &Sampling::greedy(), None, &mut |t| {
            streamed.push(t)
        });
        let (full, _) = generate_recompute(&model, &prompt, new, &Sampling::greedy(), None);
        assert_eq!(cached, full, "prompt of {}", prompt.len());
        assert_eq!(cached.len(), new);
        assert_eq!(streamed, cached, "every token is streamed as it is chosen");
    }
    // Sampling is deterministic for a seed, and the same with or without the cache.
    let s = Sampling {
        temperature: 1.0,
        top_k: Some(20),
        top_p: Some(0.9),
        seed: 4,
    };
    let (a, _) = generate(&model, &[3, 1, 4], 25, &s, None, &mut |_| {});
    let (b, _) = generate_recompute(&model, &[3, 1, 4], 25, &s, None);
    assert_eq!(a, b);
}

/// `lab generate --max-new-tokens` past the context decodes to the end of it and says so,
/// rather than sizing a cache from a count no power of two holds.
#[test]
fn asking_for_more_tokens_than_the_context_stops_when_it_is_full() {
    let model = Llama::<B>::new(&cfg(), 11, &Default::default());
    let (out, stop) = generate(
        &model,
        &[5, 6],
        usize::MAX,
        &Sampling::greedy(),
        None,
        &mut |_| {},
    );
    assert_eq!(stop, lab_model::generate::Stop::ContextFull);
    assert_eq!(
        out.len(),
        40 - 2 + 1,
        "the context's free positions, and the token after them"
    );
}

#[test]
fn the_cache_holds_the_kv_heads_only_and_matches_the_full_forward() {
    let c = cfg();
    let model = Llama::<B>::new(&c, 3, &Default::default());
    let ids: Vec<i32> = (0..30).map(|i| i * 13 % 97).collect();
    let tokens = |r: std::ops::Range<usize>| {
        Tensor::<B, 2, Int>::from_data(
            TensorData::new(ids[r.clone()].to_vec(), [1, r.len()]),
            &Default::default(),
        )
    };
    let full: Vec<f32> = model
        .logits(tokens(0..30))
        .into_data()
        .convert::<f32>()
        .into_vec()
        .unwrap();
    let mut cache = model.new_cache(30);
    let first: Vec<f32> = model
        .forward_cached(tokens(0..20), &mut cache)
        .into_data()
        .convert::<f32>()
        .into_vec()
        .unwrap();
    let rest: Vec<f32> = model
        .forward_cached(tokens(20..30), &mut cache)
        .into_data()
        .convert::<f32>()
        .into_vec()
        .unwrap();
    let max_diff = full
        .iter()
        .zip(first.iter().chain(&rest))
        .map(|(a, b)| (a - b).abs())
        .fold(0.0f32, f32::max);
    assert!(max_diff < 1e-4, "cached logits differ by {max_diff}");
    assert_eq!(cache.len(), 30);
    // 30 tokens rounded up to a power of two, within the context of 40.
    assert_eq!(cache.capacity(), 32);
    let k = cache.layers[0].keys().unwrap();
    assert_eq!(
        k.dims(),
        [1, c.n_kv_head, 32, c.head_dim()],
        "n_kv_head heads cached, not n_head, in a buffer of the cache's capacity"
    );
}

/// Decoding on a GPU backend (lavapipe in CI; CUDA when built with only `--features cuda`):
/// the cache's writes into its buffers and the attention masked past what they hold give the
/// CPU's greedy tokens, up to the end of the context.
#[cfg(any(feature = "wgpu", feature = "cuda"))]
#[test]
fn decoding_on_the_gpu_gives_the_cpus_tokens() {
    #[cfg(feature = "wgpu")]
    type Gpu = burn::backend::Wgpu;
    #[cfg(not(feature = "wgpu"))]
    type Gpu = burn::backend::Cuda;
    let _gpu = crate::common::gpu_alone();
    let cpu = Llama::<B>::new(&cfg(), 11, &Default::default());
    let gpu = Llama::<Gpu>::new(&cfg(), 11, &Default::default());
    for prompt in [vec![5u32], (0..19).map(|i| (i * 7) % 97).collect()] {
        let new = 40 - prompt.len();
        let greedy = Sampling::greedy();
        let (on_cpu, _) = generate(&cpu, &prompt, new, &greedy, None, &mut |_| {});
        let (on_gpu, _) = generate(&gpu, &prompt, new, &greedy, None, &mut |_| {});
        assert_eq!(on_gpu.len(), new);
        assert_eq!(on_gpu, on_cpu, "prompt of {}", prompt.len());
    }
}
