//! Properties the issue names: cost is linear in tokens and in price; memory per GPU never
//! increases when the ZeRO stage or the sharding degree increases.

use lab_config::{LabConfig, ModelConfig, Precision};
use lab_plan::memory::{per_gpu, Layout};
use lab_plan::{plan, PlanInputs, PlanRequest, Price};
use proptest::prelude::*;

fn config(model: ModelConfig, precision: Precision) -> LabConfig {
    let text = format!(
        r#"
name = "prop"
[train]
micro_batch = 2
grad_accum = 3
total_steps = 1000
warmup_steps = 10
peak_lr = 1e-3
min_lr = 1e-4
precision = "{}"
[hardware]
device = "a100-80gb"
"#,
        match precision {
            Precision::Bf16 => "bf16",
            Precision::Fp32 => "fp32",
        }
    );
    let mut cfg: LabConfig = toml::from_str(&text.replace(
        "[train]",
        &format!(
            "[model]\nvocab_size = {}\nn_layer = {}\nd_model = {}\nn_head = {}\nn_kv_head = {}\nd_ff = {}\nseq_len = {}\n[train]",
            model.vocab_size, model.n_layer, model.d_model, model.n_head, model.n_kv_head, model.d_ff, model.seq_len
        ),
    ))
    .unwrap();
    cfg.model.tie_embeddings = model.tie_embeddings;
    cfg.validate().unwrap();
    cfg
}

prop_compose! {
    fn models()(
        vocab in 256usize..300_000,
        n_layer in 1usize..64,
        n_kv_head in 1usize..9,
        group in 1usize..5,
        head_dim in (8usize..80).prop_map(|h| h * 2),
        ff_mult in 1usize..5,
        seq_len in 16usize..8192,
        tie in any::<bool>(),
    ) -> ModelConfig {
        let n_head = n_kv_head * group;
        let d_model = n_head * head_dim;
        let d_ff = d_model * ff_mult;
        ModelConfig {
            tie_embeddings: tie,
            ..ModelConfig::llama(vocab, n_layer, d_model, n_head, n_kv_head, d_ff, seq_len)
        }
    }
}

fn precision() -> impl Strategy<Value = Precision> {
    prop_oneof![Just(Precision::Bf16), Just(Precision::Fp32)]
}

/// The divisors of n, ascending.
fn divisors(n: usize) -> Vec<usize> {
    (1..=n).filter(|d| n.is_multiple_of(*d)).collect()
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-9 * a.abs().max(b.abs())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn cost_is_linear_in_tokens_and_price(
        model in models(),
        precision in precision(),
        tokens in 1e6f64..1e13,
        k in 0.01f64..100.0,
        usd in 0.05f64..50.0,
        mfu in 0.05f64..0.9,
        gpus in 1usize..512,
        overhead in 1.0f64..2.0,
        storage in 0.1f64..100.0,
    ) {
        let cfg = config(model, precision);
        let request = |tokens: f64, usd: f64| PlanRequest {
            gpus: Some(gpus),
            tokens: Some(tokens),
            mfu: vec![mfu],
            prices: vec![Price { name: "p".into(), usd_per_gpu_hour: usd }],
            overhead: Some(overhead),
            storage_gb_per_s: Some(storage),
            ..Default::default()
        };
        let cost = |tokens: f64, usd: f64| {
            let p = plan(&PlanInputs::resolve(&cfg, &request(tokens, usd)).unwrap());
            let c = &p.scenarios[0].costs[0];
            (c.compute_usd, c.billed_usd)
        };
        let (compute, billed) = cost(tokens, usd);
        let (compute_k_tokens, billed_k_tokens) = cost(k * tokens, usd);
        let (compute_k_price, billed_k_price) = cost(tokens, k * usd);
        prop_assert!(close(compute_k_tokens, k * compute), "{compute_k_tokens} vs {}", k * compute);
        prop_assert!(close(billed_k_tokens, k * billed), "{billed_k_tokens} vs {}", k * billed);
        prop_assert!(close(compute_k_price, k * compute));
        prop_assert!(close(billed_k_price, k * billed));
        prop_assert!(billed >= compute);
    }

    #[test]
    fn memory_never_increases_with_zero_stage_or_sharding_degree(
        model in models(),
        precision in precision(),
        dp in 1usize..257,
        tp_pow in 0u32..4,
        pp in 1usize..9,
        micro_batch in 1usize..17,
        grad_accum in 1usize..33,
        params_scale in 0.5f64..2.0,
        ckpt in any::<bool>(),
    ) {
        let tp = 2usize.pow(tp_pow);
        prop_assume!(model.n_head.is_multiple_of(tp) && pp <= model.n_layer);
        let params = model.param_count().total() as f64 * params_scale;
        let memory = |stage: u8, shard: usize| {
            let layout = Layout {
                gpus: dp * tp * pp,
                dp,
                tp,
                pp,
                zero_stage: stage,
                shard,
                micro_batch,
                grad_accum,
                activation_checkpointing: ckpt,
            };
            per_gpu(&model, precision, params, &layout).total
        };
        let shards = divisors(dp);
        for &shard in &shards {
            for stage in 0..3u8 {
                let (this, next) = (memory(stage, shard), memory(stage + 1, shard));
                prop_assert!(next <= this, "stage {stage}→{} over {shard}: {this} → {next}", stage + 1);
            }
        }
        for stage in 0..=3u8 {
            for pair in shards.windows(2) {
                let (this, next) = (memory(stage, pair[0]), memory(stage, pair[1]));
                prop_assert!(next <= this, "ZeRO-{stage} shard {}→{}: {this} → {next}", pair[0], pair[1]);
            }
        }
        // And sharding actually helps from stage 1 on when there is more than one rank.
        if dp > 1 {
            prop_assert!(memory(1, dp) < memory(0, 1));
        }
    }
}
