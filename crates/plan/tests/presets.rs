//! The "must show" numbers, from the real presets in `configs/`.

use std::path::{Path, PathBuf};

use lab_config::LabConfig;
use lab_plan::checks::TIGHT_MEMORY_SHARE;
use lab_plan::{lab_page, plan, Plan, PlanInputs, PlanRequest, Price};

fn configs() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../configs")
}

fn preset(name: &str) -> LabConfig {
    LabConfig::load(&configs().join(name)).unwrap()
}

fn run(cfg: &LabConfig, req: &PlanRequest) -> Plan {
    plan(&PlanInputs::resolve(cfg, req).unwrap())
}

fn price(usd: f64) -> Vec<Price> {
    vec![Price {
        name: "quoted".into(),
        usd_per_gpu_hour: usd,
    }]
}

fn within(x: f64, quoted: f64, tol: f64) -> bool {
    (x / quoted - 1.0).abs() <= tol
}

/// The 7B medical plan of the case study: 200B tokens on 256 A100s at 45% MFU, $3/GPU-h.
fn med_7b_request() -> PlanRequest {
    PlanRequest {
        gpus: Some(256),
        tokens: Some(200e9),
        mfu: vec![0.45],
        prices: price(3.0),
        ..Default::default()
    }
}

#[test]
fn med_7b_exact_count_and_the_case_study_figure() {
    let cfg = preset("med-7b-256xa100.toml");
    let p = run(&cfg, &med_7b_request());
    assert_eq!(p.params.total, 6_195_253_248);
    let r = p.params.reference.as_ref().unwrap();
    assert_eq!(r.name, "LLaMA-7B");
    assert_eq!(r.params, 6_738_415_616);
    assert!(p
        .notes
        .iter()
        .any(|n| n.contains("LLaMA-7B") && n.contains("n_kv_head 8 vs 32")));
    assert!(p
        .notes
        .iter()
        .any(|n| n.contains("vocab_size 64,000 vs 32,000")));
    // The config's own batch: 1 × 4 × 4,096 per GPU × 256 = 4,194,304 tokens per step.
    assert_eq!(p.batch.global_batch_tokens, 4_194_304.0);
    assert_eq!(p.batch.steps, 47_684);
    // The exact FLOP count (LM head + attention) is above 6 × 6.2B.
    assert!(p.flops_per_token > 6.0 * 6.195e9);
    assert_eq!(p.flops_per_token, cfg.model.train_flops_per_token());
}

#[test]
fn med_7b_with_the_case_study_assumptions_reproduces_its_figures() {
    let cfg = preset("med-7b-256xa100.toml");
    let req = PlanRequest {
        params: Some(6.7e9),
        batch_tokens: Some(4e6),
        ..med_7b_request()
    };
    let p = run(&cfg, &req);
    let s = &p.scenarios[0];
    assert!(
        within(p.flops_per_token, 40.2e9, 0.02),
        "{}",
        p.flops_per_token
    );
    assert!(within(p.total_flops, 8.04e21, 0.02), "{}", p.total_flops);
    assert!(
        within(s.compute_gpu_hours, 15_950.0, 0.02),
        "{}",
        s.compute_gpu_hours
    );
    assert!(within(s.compute_hours, 62.0, 0.02), "{}", s.compute_hours);
    assert!(
        within(s.costs[0].compute_usd, 48_000.0, 0.02),
        "{}",
        s.costs[0].compute_usd
    );
    assert_eq!(p.batch.steps, 50_000);
    assert!(p
        .notes
        .iter()
        .any(|n| n.contains("--params 6.70B is LLaMA-7B's 6,738,415,616 rounded")));
    // The 4.6% between 6 × 6.7B and the exact count, term by term.
    assert!(
        p.notes.iter().any(|n| n.contains(
            "the exact count gives 42.0B (+4.6%) = 6 × 6.20B (37.2B) − 1.57B for the embedding lookup and norms + 6.44B for attention scores"
        )),
        "{:#?}",
        p.notes
    );
    // 4e6 tokens is not a whole number of 4,096-token sequences over 256 replicas.
    assert!(p.warnings.iter().any(|w| w.kind == "batch"));
}

#[test]
fn med_7b_fsdp_128_by_tp_2_fits_an_a100() {
    let cfg = preset("med-7b-256xa100.toml");
    let req = PlanRequest {
        tp: Some(2),
        fsdp: Some(128),
        ..med_7b_request()
    };
    let p = run(&cfg, &req);
    let l = &p.memory.layout;
    assert_eq!(
        (l.dp, l.tp, l.pp, l.zero_stage, l.shard),
        (128, 2, 1, 3, 128)
    );
    // 4,194,304 tokens / (128 replicas × 4,096) = 8 micro-batches of 1 per step.
    assert_eq!(p.batch.grad_accum, 8.0);
    // ~15.7 GiB: 0.5 GiB of sharded states, 0.7 of collective buffers, 14.7 of activations
    // (32 layers × 4,096 tokens × 220,808 B / TP 2, and the loss).
    let gib = p.memory.chosen.total / (1u64 << 30) as f64;
    assert!(gib > 10.0 && gib < 20.0, "{gib}");
    assert!(p.memory.fits);
    assert!(
        !p.warnings
            .iter()
            .any(|w| w.kind == "memory" || w.kind == "batch"),
        "{:?}",
        p.warnings
    );
    // Sharding states 256 ways: 16 bytes × 6.2B / 256.
    let c = &p.memory.chosen;
    let states = c.params + c.grads + c.master + c.moments;
    assert!(within(states, 16.0 * 6_195_253_248.0 / 256.0, 1e-9));
}

#[test]
fn x1_50m_on_an_a100_needs_twice_the_mfu_the_page_assumes() {
    let cfg = preset("x1-50m-a100.toml");
    let req = PlanRequest {
        mfu: vec![0.48],
        hours: Some(24.0),
        budget_usd: Some(35.0),
        prices: price(1.19),
        ..Default::default()
    };
    let p = run(&cfg, &req);
    let row = |key: &str| p.flops.iter().find(|f| f.convention.key == key).unwrap();
    // Non-embedding 6N: ~500K tokens/s at 0.48 × 312 TF/s.
    let naive = row("6n-non-embedding");
    assert!(
        within(naive.tokens_per_s, 495_800.0, 0.01),
        "{}",
        naive.tokens_per_s
    );
    // Counting the 38.6M LM head and attention: roughly half.
    let full = row("full");
    assert!(full.convention.used);
    let ratio = full.tokens_per_s / naive.tokens_per_s;
    assert!(ratio > 0.45 && ratio < 0.55, "{ratio}");
    assert_eq!(p.params.lm_head, 38_597_376);
    // 84,000 × 524,288 tokens in 24 h: MFU ≈ 1 (0.93 if the causal half is skipped).
    let d = p.deadline.as_ref().unwrap();
    assert!(
        d.required_mfu > 0.9 && d.required_mfu < 1.05,
        "{}",
        d.required_mfu
    );
    assert!(within(
        row("full-causal").mfu_for_deadline.unwrap(),
        0.934,
        0.01
    ));
    assert!(within(naive.mfu_for_deadline.unwrap(), 0.494, 0.01));
    let kinds: Vec<_> = p.warnings.iter().map(|w| w.kind).collect();
    assert!(
        kinds.contains(&"mfu") && kinds.contains(&"deadline") && kinds.contains(&"budget"),
        "{kinds:?}"
    );
    // What 24 h (the binding limit: $35 buys 29.4 h) buys: ~40,500 steps, ~21.2B tokens.
    let prop = p.proposal.as_ref().unwrap();
    assert!(prop.limit.contains("deadline"));
    assert!(within(prop.steps as f64, 40_516.0, 0.005), "{}", prop.steps);
    assert!(within(prop.tokens, 21.24e9, 0.005), "{}", prop.tokens);
}

#[test]
fn medgemma_27b_zero_3_on_320_h200_and_the_quote() {
    let cfg = preset("medgemma-27b-320xh200.toml");
    let req = PlanRequest {
        gpus: Some(320),
        zero: Some(3),
        hours: Some(14.0 * 24.0),
        quote_usd_per_hour: Some(125.0),
        ..Default::default()
    };
    let p = run(&cfg, &req);
    assert!(
        within(p.params.total as f64, 27.0e9, 0.01),
        "{}",
        p.params.total
    );
    assert_eq!(p.batch.global_batch_tokens, 15_728_640.0);
    let c = &p.memory.chosen;
    let states = c.params + c.grads + c.master + c.moments;
    assert!(within(states, 16.0 * p.params.total as f64 / 320.0, 1e-9));
    // It fits with room because the config trains with selective activation checkpointing:
    // keeping every activation of 62 layers × 8,192 tokens would leave under a tenth of the
    // device for the CUDA context and fragmentation.
    assert!(p.memory.layout.activation_checkpointing);
    assert_eq!(c.total, c.total_with_checkpointing);
    let device = p.memory.device_memory_bytes;
    assert!(c.total_with_checkpointing <= TIGHT_MEMORY_SHARE * device);
    assert!(c.total_without_checkpointing > TIGHT_MEMORY_SHARE * device);
    assert!(p.memory.fits);
    assert!(!p.warnings.iter().any(|w| w.kind.starts_with("memory")));
    let q = p.quote.as_ref().unwrap();
    assert_eq!(q.readings[0].total_usd, 42_000.0);
    assert_eq!(q.readings[2].total_usd, 13_440_000.0);
    assert_eq!(q.consistent, vec!["per 8-GPU node".to_string()]);
    // Two weeks of 320 H200s at the table's GPU-cloud $3.50: $376,320.
    let d = p.deadline.as_ref().unwrap();
    let cloud = d.rental.iter().find(|r| r.price == "gpu-cloud").unwrap();
    assert!((cloud.usd - 376_320.0).abs() < 1e-6);
    // The config's 157B tokens take ~66 h; two weeks would buy ~5× that.
    assert!(d.met[0] && d.buys[0].tokens > 4.0 * p.scenarios[0].tokens);
    assert!(p.warnings.iter().any(|w| w.kind == "quote"));
}

/// `--activation-checkpointing none` overrides a config's `selective`: MedGemma's preset
/// then keeps every activation and is too tight on an H200 (the "memory-tight" warning).
#[test]
fn the_flag_turns_the_configs_selective_checkpointing_off() {
    let cfg = preset("medgemma-27b-320xh200.toml");
    let plan = |mode| {
        let req = PlanRequest {
            gpus: Some(320),
            zero: Some(3),
            activation_checkpointing: mode,
            ..Default::default()
        };
        run(&cfg, &req)
    };
    use lab_config::ActivationCheckpointing::{None as Kept, Selective};
    for (mode, selective) in [(None, true), (Some(Selective), true), (Some(Kept), false)] {
        let p = plan(mode);
        assert_eq!(
            p.memory.layout.activation_checkpointing, selective,
            "{mode:?}"
        );
        let tight = p.warnings.iter().any(|w| w.kind == "memory-tight");
        assert_eq!(tight, !selective, "{mode:?}");
        assert!(p.memory.fits, "{mode:?}");
    }
}

#[test]
fn lab00_page_fails_its_own_arithmetic() {
    let path = configs().join("lab/lab00-a100.toml");
    let check = lab_page::check(&path, &PlanRequest::default()).unwrap();
    assert!(!check.holds);
    let failed: Vec<_> = check.failed().iter().map(|c| c.promise).collect();
    assert_eq!(failed, ["throughput", "time", "MFU", "budget"]);
    let ok: Vec<_> = check
        .checks
        .iter()
        .filter(|c| c.holds)
        .map(|c| c.promise)
        .collect();
    assert_eq!(ok, ["recipe", "memory"]);
    let prop = check.proposal.as_ref().unwrap();
    assert!(within(prop.steps as f64, 40_516.0, 0.005), "{}", prop.steps);
    let text = lab_page::render(&check);
    assert!(
        text.contains("verdict: 4 of 6 promises do not add up"),
        "{text}"
    );
    // A price override reaches the plan; the promises do not move.
    let cheap = PlanRequest {
        prices: price(0.5),
        ..Default::default()
    };
    let check = lab_page::check(&path, &cheap).unwrap();
    assert!(
        check
            .checks
            .iter()
            .find(|c| c.promise == "budget")
            .unwrap()
            .holds
    );
}

#[test]
fn execute_prints_tables_or_json_and_fails_broken_pages() {
    use lab_plan::{execute, Target};
    let x1 = configs().join("x1-50m-a100.toml");
    let table = execute(Target::Config(&x1), &PlanRequest::default(), false).unwrap();
    assert!(table.text.contains("Memory per GPU") && table.failure.is_none());
    let json = execute(Target::Config(&x1), &PlanRequest::default(), true).unwrap();
    let v: serde_json::Value = serde_json::from_str(&json.text).unwrap();
    assert_eq!(v["params"]["total"], 127_539_456);
    assert_eq!(v["flops"].as_array().unwrap().len(), 4);

    let page = configs().join("lab/lab00-a100.toml");
    let out = execute(Target::LabPage(&page), &PlanRequest::default(), true).unwrap();
    let v: serde_json::Value = serde_json::from_str(&out.text).unwrap();
    assert_eq!(v["holds"], false);
    let failure = out.failure.unwrap();
    assert!(!failure.contains('\n'));
    assert!(failure.contains("4 of 6 promises do not add up (throughput, time, MFU, budget)"));
    assert!(failure.contains("40,491 steps"), "{failure}");

    // Bad input names the file or the flag.
    let missing = configs().join("nope.toml");
    let e = execute(Target::Config(&missing), &PlanRequest::default(), false).unwrap_err();
    assert!(format!("{e:#}").contains("nope.toml"));
    let bad = PlanRequest {
        gpus: Some(6),
        tp: Some(4),
        ..Default::default()
    };
    let e = execute(Target::Config(&x1), &bad, false).unwrap_err();
    assert!(
        e.to_string()
            .contains("--gpus 6 is not divisible by --tp 4"),
        "{e}"
    );
    let e = execute(Target::LabPage(&x1), &PlanRequest::default(), false).unwrap_err();
    assert!(
        e.to_string().contains("lab page") && e.to_string().contains("[promises]"),
        "{e}"
    );
}

#[test]
fn print_reports() {
    // Not an assertion: `cargo test -- --nocapture print_reports` shows the tables.
    let cfg = preset("med-7b-256xa100.toml");
    let req = PlanRequest {
        tp: Some(2),
        fsdp: Some(128),
        ..med_7b_request()
    };
    println!("{}", lab_plan::report::render(&run(&cfg, &req)));
    let req = PlanRequest {
        params: Some(6.7e9),
        batch_tokens: Some(4e6),
        ..med_7b_request()
    };
    println!("{}", lab_plan::report::render(&run(&cfg, &req)));
    let cfg = preset("medgemma-27b-320xh200.toml");
    let req = PlanRequest {
        gpus: Some(320),
        zero: Some(3),
        hours: Some(336.0),
        quote_usd_per_hour: Some(125.0),
        ..Default::default()
    };
    println!("{}", lab_plan::report::render(&run(&cfg, &req)));
    let path = configs().join("lab/lab00-a100.toml");
    println!(
        "{}",
        lab_page::render(&lab_page::check(&path, &PlanRequest::default()).unwrap())
    );
}
