//! What a plan is computed from: the config plus the request (CLI flags or a lab page's
//! `[plan]` table), resolved into explicit inputs with every default written down.

use anyhow::{bail, Result};
use lab_config::{hardware, HardwareSpec, LabConfig, ModelConfig, Precision};
use serde::{Deserialize, Serialize};

use crate::memory::Layout;
use crate::prices::{default_prices, Price};
use crate::units::{group, si, GB};

/// Everything a user may set; `None` takes the default written next to the field.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PlanRequest {
    /// Device name from the hardware table; default: the config's `[hardware].device`.
    pub device: Option<String>,
    /// Default 1.
    pub gpus: Option<usize>,
    /// Default 8 (or `gpus` when fewer).
    pub gpus_per_node: Option<usize>,
    /// Tokens to train; default `train.total_steps` × the global batch.
    pub tokens: Option<f64>,
    /// Wall-clock deadline (or rental period) in hours.
    pub hours: Option<f64>,
    /// Tokens per optimizer step over the whole cluster; default: the config's tokens per
    /// step (micro_batch × grad_accum × seq_len, per GPU) × `gpus`.
    pub batch_tokens: Option<f64>,
    /// Sequences per forward/backward on one replica; default `train.micro_batch`.
    pub micro_batch: Option<usize>,
    /// Model FLOP utilization(s); default 0.40.
    #[serde(default)]
    pub mfu: Vec<f64>,
    /// Default: the device's on-demand, spot and GPU-cloud prices.
    #[serde(default)]
    pub prices: Vec<Price>,
    /// Wall clock ÷ compute time (evals, restarts, stragglers); default 1.0.
    pub overhead: Option<f64>,
    pub tp: Option<usize>,
    pub pp: Option<usize>,
    /// ZeRO stage 0–3; default 3 with `fsdp`, else 0.
    pub zero: Option<u8>,
    /// Sharding degree of ZeRO/FSDP; default: every data-parallel rank.
    pub fsdp: Option<usize>,
    /// Default `train.activation_checkpointing`.
    #[serde(default)]
    pub activation_checkpointing: Option<lab_config::ActivationCheckpointing>,
    /// Default `train.ckpt_every`.
    pub ckpt_every: Option<usize>,
    /// Checkpoint storage write bandwidth, GB/s; default 1.
    pub storage_gb_per_s: Option<f64>,
    pub budget_usd: Option<f64>,
    /// Parameter count to plan with instead of the config's exact count.
    pub params: Option<f64>,
    /// A quoted $/h whose unit is unclear; priced per GPU, per node and per cluster.
    pub quote_usd_per_hour: Option<f64>,
}

/// One stated assumption: shown in the table and in `--json`.
#[derive(Debug, Clone, Serialize)]
pub struct Assumption {
    pub name: &'static str,
    pub value: String,
    /// Where the value comes from (flag, config field, default and why).
    pub source: String,
}

/// Fully resolved inputs.
#[derive(Debug, Clone)]
pub struct PlanInputs {
    pub config_name: String,
    pub model: ModelConfig,
    pub precision: Precision,
    pub device: &'static HardwareSpec,
    pub peak_flops_per_gpu: f64,
    pub gpus_per_node: usize,
    pub tokens: f64,
    pub config_total_steps: usize,
    pub global_batch_tokens: f64,
    pub layout: Layout,
    /// Exact sequences per replica per step ÷ micro_batch (may be fractional: a warning).
    pub grad_accum_exact: f64,
    pub mfus: Vec<f64>,
    pub prices: Vec<Price>,
    pub overhead: f64,
    pub ckpt_every: usize,
    pub storage_bytes_per_s: f64,
    pub deadline_hours: Option<f64>,
    pub budget_usd: Option<f64>,
    pub params_override: Option<f64>,
    pub quote_usd_per_hour: Option<f64>,
    pub assumptions: Vec<Assumption>,
}

pub const DEFAULT_MFU: f64 = 0.40;
pub const DEFAULT_STORAGE_GB_PER_S: f64 = 1.0;

fn positive(name: &str, v: f64) -> Result<f64> {
    if !(v.is_finite() && v > 0.0) {
        lab_config::bail_usage!("{name} ({v}) must be a positive number");
    }
    Ok(v)
}

fn at_least_one(name: &str, v: usize) -> Result<usize> {
    if v == 0 {
        lab_config::bail_usage!("{name} must be at least 1");
    }
    Ok(v)
}

impl PlanInputs {
    pub fn resolve(cfg: &LabConfig, req: &PlanRequest) -> Result<Self> {
        let mut assumptions = Vec::new();
        let mut note = |name: &'static str, value: String, source: String| {
            assumptions.push(Assumption {
                name,
                value,
                source,
            })
        };
        let model = cfg.model.clone();
        let precision = cfg.train.precision;

        let device_name = req.device.clone().unwrap_or(cfg.hardware.device.clone());
        let Some(device) = hardware::lookup(&device_name) else {
            let known: Vec<_> = hardware::DEVICES.iter().map(|d| d.name).collect();
            bail!(
                "--device {device_name:?} is unknown; use one of {}",
                known.join(", ")
            );
        };
        let config_peak = cfg
            .hardware
            .peak_flops
            .filter(|_| device_name == cfg.hardware.device);
        // lab trains on a GPU through CUDA, whose fp32 products run as TF32.
        let products = hardware::Products::of(precision, device.name != "cpu");
        let peak_flops_per_gpu = config_peak.unwrap_or(device.peak_flops(products));
        let precision_name = products.as_str();
        let tf32 = match products {
            hardware::Products::Tf32 => " fp32: CUDA multiplies f32 as TF32",
            _ => "",
        };
        note(
            "device",
            format!(
                "{} ({:.0} GiB, {} TFLOP/s {precision_name} peak)",
                device.name,
                device.memory_bytes / crate::units::GIB,
                peak_flops_per_gpu / 1e12
            ),
            match (&req.device, config_peak) {
                (Some(_), _) => "--device; peak from the hardware table".into(),
                (None, Some(_)) => "config [hardware]; peak from hardware.peak_flops".into(),
                (None, None) => format!(
                    "config [hardware]; dense {precision_name} peak (train.precision{tf32}) from the hardware table"
                ),
            },
        );

        // `[parallel]` is the layout the trainer launches with: the plan's defaults.
        let layout_cfg = cfg.parallel.clone();
        let planned = layout_cfg.as_ref().map(|p| p.dp * p.tp * p.pp);
        let gpus = at_least_one("--gpus", req.gpus.or(planned).unwrap_or(1))?;
        let gpus_per_node =
            at_least_one("--gpus-per-node", req.gpus_per_node.unwrap_or(gpus.min(8)))?;
        note(
            "gpus",
            format!(
                "{gpus} ({} node(s) of {gpus_per_node})",
                gpus.div_ceil(gpus_per_node)
            ),
            match (req.gpus, planned) {
                (Some(_), _) => "--gpus".into(),
                (None, Some(_)) => "config [parallel]: dp × tp × pp".into(),
                (None, None) => "default 1 (--gpus)".into(),
            },
        );

        let per_gpu_tokens = cfg.tokens_per_replica_step();
        let global_batch_tokens = match req.batch_tokens {
            Some(b) => positive("--batch-tokens", b)?,
            None => (per_gpu_tokens * gpus) as f64,
        };
        note(
            "global batch",
            format!("{} tokens/step", group(global_batch_tokens.round() as u64)),
            if req.batch_tokens.is_some() {
                "--batch-tokens".into()
            } else {
                format!(
                    "config: {} × {} × {} tokens per GPU × {gpus} GPU(s)",
                    cfg.train.micro_batch, cfg.train.grad_accum, model.seq_len
                )
            },
        );
        let tokens = match req.tokens {
            Some(t) => positive("--tokens", t)?,
            None => cfg.train.total_steps as f64 * global_batch_tokens,
        };
        note(
            "tokens",
            format!("{} ({})", si(tokens), group(tokens.round() as u64)),
            if req.tokens.is_some() {
                "--tokens".into()
            } else {
                format!(
                    "config: train.total_steps {} × global batch",
                    group(cfg.train.total_steps as u64)
                )
            },
        );

        // Parallel layout.
        let tp = at_least_one(
            "--tp",
            req.tp.or(layout_cfg.as_ref().map(|p| p.tp)).unwrap_or(1),
        )?;
        let pp = at_least_one(
            "--pp",
            req.pp.or(layout_cfg.as_ref().map(|p| p.pp)).unwrap_or(1),
        )?;
        if !gpus.is_multiple_of(tp * pp) {
            bail!(
                "--gpus {gpus} is not divisible by --tp {tp} × --pp {pp}; use a multiple of {}",
                tp * pp
            );
        }
        if !model.n_head.is_multiple_of(tp) {
            bail!(
                "--tp {tp} does not divide model.n_head ({}); tensor parallelism splits whole heads",
                model.n_head
            );
        }
        if pp > model.n_layer {
            bail!(
                "--pp {pp} exceeds model.n_layer ({}); use at most one stage per layer",
                model.n_layer
            );
        }
        let dp = gpus / (tp * pp);
        let zero_stage = match (req.zero, req.fsdp) {
            (Some(z), _) if z > 3 => {
                lab_config::bail_usage!("--zero {z} is not a ZeRO stage; use 0, 1, 2 or 3")
            }
            (Some(z), _) => z,
            (None, Some(_)) => 3,
            (None, None) => layout_cfg.as_ref().map_or(0, |p| p.zero),
        };
        let shard = match req.fsdp {
            Some(0) => lab_config::bail_usage!("--fsdp must be at least 1"),
            Some(s) if zero_stage == 0 && s > 1 => {
                lab_config::bail_usage!("--fsdp {s} shards with ZeRO, but --zero is 0; drop --zero 0 or use --zero 1, 2 or 3")
            }
            Some(s) if !dp.is_multiple_of(s) => bail!(
                "--fsdp {s} must divide the data-parallel degree {dp} (= --gpus {gpus} / (--tp {tp} × --pp {pp}))"
            ),
            Some(s) => s,
            None if zero_stage == 0 => 1,
            None => dp,
        };
        // --activation-checkpointing, or the config's train.activation_checkpointing.
        let activation_checkpointing = req
            .activation_checkpointing
            .unwrap_or(cfg.train.activation_checkpointing)
            == lab_config::ActivationCheckpointing::Selective;
        let micro_batch = at_least_one(
            "--micro-batch",
            req.micro_batch.unwrap_or(cfg.train.micro_batch),
        )?;
        let grad_accum_exact = global_batch_tokens / (dp * micro_batch * model.seq_len) as f64;
        let layout = Layout {
            gpus,
            dp,
            tp,
            pp,
            zero_stage,
            shard,
            micro_batch,
            grad_accum: grad_accum_exact.round().max(1.0) as usize,
            activation_checkpointing,
        };
        let zero_words = match zero_stage {
            0 => "DDP (no sharding)".to_string(),
            3 => format!("ZeRO-3 / FSDP-{shard}"),
            z => format!("ZeRO-{z} over {shard}"),
        };
        note(
            "layout",
            format!("DP {dp} × TP {tp} × PP {pp}, {zero_words}"),
            match &layout_cfg {
                Some(_) => "--tp, --pp, --zero, --fsdp (default: config [parallel])".into(),
                None => "--tp, --pp, --zero, --fsdp (default: pure data parallel)".into(),
            },
        );
        note(
            "micro-batch",
            format!(
                "{micro_batch} × {} tokens per replica, {} micro-batches per step{}",
                model.seq_len,
                if grad_accum_exact.fract() == 0.0 {
                    group(grad_accum_exact as u64)
                } else {
                    format!("{grad_accum_exact:.2}")
                },
                if activation_checkpointing {
                    ", selective activation checkpointing"
                } else {
                    ""
                }
            ),
            if req.micro_batch.is_some() {
                "--micro-batch"
            } else {
                "config train.micro_batch"
            }
            .into(),
        );

        let mfus = if req.mfu.is_empty() {
            vec![DEFAULT_MFU]
        } else {
            req.mfu.clone()
        };
        for &m in &mfus {
            if !(m > 0.0 && m <= 1.0) {
                lab_config::bail_usage!(
                    "--mfu {m} must be in (0, 1]: a fraction of peak FLOP/s, e.g. 0.45"
                );
            }
        }
        note(
            "MFU",
            mfus.iter()
                .map(|m| format!("{m:.2}"))
                .collect::<Vec<_>>()
                .join(", "),
            if req.mfu.is_empty() {
                "default 0.40, a well-tuned dense run (--mfu)".into()
            } else {
                "--mfu".into()
            },
        );

        let prices = if req.prices.is_empty() {
            default_prices(device.name)
        } else {
            req.prices.clone()
        };
        for p in &prices {
            p.validate()?;
        }
        note(
            "prices",
            prices
                .iter()
                .map(|p| format!("{} ${:.2}", p.name, p.usd_per_gpu_hour))
                .collect::<Vec<_>>()
                .join(", ")
                + " per GPU-hour",
            if req.prices.is_empty() {
                "indicative table (AWS on-demand/spot, GPU clouds); not a quote (--price)".into()
            } else {
                "--price".into()
            },
        );

        let overhead = positive("--overhead", req.overhead.unwrap_or(1.0))?;
        if overhead < 1.0 {
            lab_config::bail_usage!(
                "--overhead {overhead} must be at least 1 (wall clock ÷ compute time)"
            );
        }
        note(
            "overhead",
            format!("× {overhead:.2} on compute time, plus checkpoint writes"),
            if req.overhead.is_some() {
                "--overhead".into()
            } else {
                "default 1.0: evals, restarts and stragglers not counted (--overhead)".into()
            },
        );

        let ckpt_every = at_least_one(
            "--ckpt-every",
            req.ckpt_every.unwrap_or(cfg.train.ckpt_every),
        )?;
        let storage_gb_per_s = positive(
            "--storage-gbps",
            req.storage_gb_per_s.unwrap_or(DEFAULT_STORAGE_GB_PER_S),
        )?;
        note(
            "checkpoints",
            format!(
                "every {} steps, written at {storage_gb_per_s} GB/s",
                group(ckpt_every as u64)
            ),
            format!(
                "{}; {}",
                if req.ckpt_every.is_some() {
                    "--ckpt-every"
                } else {
                    "config train.ckpt_every"
                },
                if req.storage_gb_per_s.is_some() {
                    "--storage-gbps"
                } else {
                    "default 1 GB/s, a network volume (--storage-gbps)"
                }
            ),
        );

        let block_bytes = |selective| {
            crate::memory::block_bytes_per_token(
                &model,
                precision,
                crate::memory::AttentionKind::Flash,
                selective,
            )
        };
        let states = match precision {
            Precision::Bf16 => {
                "bf16 weights 2 + bf16 grads 2 + fp32 master 4 + Adam m, v 8 = 16 B/param"
            }
            Precision::Fp32 => "fp32 weights 4 + grads 4 + Adam m, v 8 = 16 B/param",
        };
        note(
            "memory model",
            format!(
                "{states}, sharded by ZeRO stage; activations per layer {} B/token ({} with selective checkpointing), split over TP (sequence parallel), pp micro-batches in flight; the fused LM-head loss (d hidden, d head, one ≤ 1 GiB chunk of logits; no [tokens, V] logits); comm buffers 2 × one block at 4 B/param",
                group(block_bytes(false) as u64),
                group(block_bytes(true) as u64),
            ),
            "ZeRO paper (Rajbhandari et al. 2020); what lab's model keeps under burn's autodiff with flash attention, counted op by op and measured on the CPU (crates/plan/tests/activation_memory.rs)".into(),
        );
        let deadline_hours = req.hours.map(|h| positive("--hours", h)).transpose()?;
        if let Some(h) = deadline_hours {
            note("deadline", crate::units::hours(h), "--hours".into());
        }
        let budget_usd = req
            .budget_usd
            .map(|b| positive("--budget-usd", b))
            .transpose()?;
        if let Some(b) = budget_usd {
            note("budget", crate::units::usd(b), "--budget-usd".into());
        }
        let params_override = req.params.map(|p| positive("--params", p)).transpose()?;
        if let Some(p) = params_override {
            note(
                "parameters",
                format!("{} instead of the config's {}", si(p), group(model.param_count().total())),
                "--params: FLOPs = 6N, model states scale with N; activations keep the config's shape".into(),
            );
        }
        let quote_usd_per_hour = req
            .quote_usd_per_hour
            .map(|q| positive("--quote", q))
            .transpose()?;

        Ok(PlanInputs {
            config_name: cfg.name.clone(),
            model,
            precision,
            device,
            peak_flops_per_gpu,
            gpus_per_node,
            tokens,
            config_total_steps: cfg.train.total_steps,
            global_batch_tokens,
            layout,
            grad_accum_exact,
            mfus,
            prices,
            overhead,
            ckpt_every,
            storage_bytes_per_s: storage_gb_per_s * GB,
            deadline_hours,
            budget_usd,
            params_override,
            quote_usd_per_hour,
            assumptions,
        })
    }
}

impl PlanRequest {
    /// `self` with every field that `over` sets replaced (CLI flags over a file's `[plan]`).
    pub fn merged_with(mut self, over: &PlanRequest) -> PlanRequest {
        macro_rules! take {
            ($($field:ident),*) => {$(
                if over.$field.is_some() {
                    self.$field = over.$field.clone();
                }
            )*};
        }
        take!(
            device,
            gpus,
            gpus_per_node,
            tokens,
            hours,
            batch_tokens,
            micro_batch,
            overhead,
            tp,
            pp,
            zero,
            fsdp,
            activation_checkpointing,
            ckpt_every,
            storage_gb_per_s,
            budget_usd,
            params,
            quote_usd_per_hour
        );
        if !over.mfu.is_empty() {
            self.mfu = over.mfu.clone();
        }
        if !over.prices.is_empty() {
            self.prices = over.prices.clone();
        }
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn x1() -> LabConfig {
        let path =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../configs/x1-50m-a100.toml");
        LabConfig::load(&path).unwrap()
    }

    fn resolve(req: PlanRequest) -> Result<PlanInputs> {
        PlanInputs::resolve(&x1(), &req)
    }

    #[test]
    fn defaults_come_from_the_config_and_are_stated() {
        let i = resolve(PlanRequest {
            gpus: Some(4),
            ..Default::default()
        })
        .unwrap();
        assert_eq!(i.global_batch_tokens, 4.0 * 524_288.0);
        assert_eq!(i.tokens, 84_000.0 * 4.0 * 524_288.0);
        assert_eq!(i.peak_flops_per_gpu, 312e12);
        assert_eq!(i.mfus, vec![DEFAULT_MFU]);
        assert_eq!(i.prices.len(), 3);
        assert_eq!(i.ckpt_every, 1000);
        assert_eq!(
            (i.layout.dp, i.layout.zero_stage, i.layout.shard),
            (4, 0, 1)
        );
        assert_eq!(i.grad_accum_exact, 16.0);
        let names: Vec<_> = i.assumptions.iter().map(|a| a.name).collect();
        for n in [
            "device",
            "gpus",
            "global batch",
            "tokens",
            "layout",
            "MFU",
            "prices",
            "overhead",
            "checkpoints",
        ] {
            assert!(names.contains(&n), "{n} missing from {names:?}");
        }
        // --fsdp alone means ZeRO-3; a ZeRO stage alone shards over every DP rank.
        let i = resolve(PlanRequest {
            gpus: Some(8),
            fsdp: Some(4),
            ..Default::default()
        })
        .unwrap();
        assert_eq!((i.layout.zero_stage, i.layout.shard), (3, 4));
        let i = resolve(PlanRequest {
            gpus: Some(8),
            zero: Some(2),
            ..Default::default()
        })
        .unwrap();
        assert_eq!((i.layout.zero_stage, i.layout.shard), (2, 8));
        // fp32 configs plan a GPU against its TF32 peak (CUDA multiplies their f32 as TF32),
        // the CPU against its fp32 peak.
        let mut cfg = x1();
        cfg.train.precision = Precision::Fp32;
        for (device, peak, named) in [
            ("a100-80gb", 156e12, "tf32 peak"),
            ("cpu", 160e9, "fp32 peak"),
        ] {
            cfg.hardware.device = device.into();
            let i = PlanInputs::resolve(&cfg, &PlanRequest::default()).unwrap();
            assert_eq!(i.peak_flops_per_gpu, peak, "{device}");
            let note = i.assumptions.iter().find(|a| a.name == "device").unwrap();
            assert!(note.value.contains(named), "{note:?}");
        }
    }

    /// `[parallel]` is the layout the trainer launches: the plan reads its defaults there,
    /// and plans the same global batch the trainer steps with.
    #[test]
    fn the_parallel_section_sets_the_layout_defaults() {
        let mut cfg = x1();
        cfg.parallel = Some(lab_config::ParallelConfig {
            dp: 4,
            zero: 1,
            ..Default::default()
        });
        let i = PlanInputs::resolve(&cfg, &PlanRequest::default()).unwrap();
        assert_eq!(i.layout.gpus, 4);
        assert_eq!(
            (i.layout.dp, i.layout.zero_stage, i.layout.shard),
            (4, 1, 4)
        );
        assert_eq!(i.global_batch_tokens, cfg.tokens_per_step() as f64);
        let gpus = i.assumptions.iter().find(|a| a.name == "gpus").unwrap();
        assert!(gpus.source.contains("[parallel]"), "{}", gpus.source);
        // A flag still wins over the config.
        let req = PlanRequest {
            zero: Some(0),
            gpus: Some(8),
            ..Default::default()
        };
        let i = PlanInputs::resolve(&cfg, &req).unwrap();
        assert_eq!((i.layout.gpus, i.layout.zero_stage), (8, 0));
    }

    #[test]
    fn bad_requests_name_the_flag_and_the_fix() {
        let err = |req: PlanRequest| resolve(req).unwrap_err().to_string();
        let e = err(PlanRequest {
            device: Some("tpu".into()),
            ..Default::default()
        });
        assert!(e.contains("--device") && e.contains("a100-80gb"), "{e}");
        let e = err(PlanRequest {
            gpus: Some(0),
            ..Default::default()
        });
        assert!(e.contains("--gpus must be at least 1"), "{e}");
        let e = err(PlanRequest {
            gpus: Some(6),
            tp: Some(4),
            ..Default::default()
        });
        assert!(e.contains("use a multiple of 4"), "{e}");
        let e = err(PlanRequest {
            gpus: Some(8),
            tp: Some(8),
            ..Default::default()
        });
        assert!(e.contains("model.n_head (12)"), "{e}");
        let e = err(PlanRequest {
            gpus: Some(16),
            pp: Some(16),
            ..Default::default()
        });
        assert!(e.contains("model.n_layer (8)"), "{e}");
        let e = err(PlanRequest {
            gpus: Some(8),
            fsdp: Some(3),
            ..Default::default()
        });
        assert!(
            e.contains("--fsdp 3 must divide the data-parallel degree 8"),
            "{e}"
        );
        let e = err(PlanRequest {
            gpus: Some(8),
            zero: Some(0),
            fsdp: Some(4),
            ..Default::default()
        });
        assert!(e.contains("--zero is 0"), "{e}");
        let e = err(PlanRequest {
            zero: Some(7),
            ..Default::default()
        });
        assert!(e.contains("use 0, 1, 2 or 3"), "{e}");
        let e = err(PlanRequest {
            mfu: vec![1.5],
            ..Default::default()
        });
        assert!(e.contains("--mfu 1.5"), "{e}");
        let e = err(PlanRequest {
            overhead: Some(0.5),
            ..Default::default()
        });
        assert!(e.contains("--overhead 0.5 must be at least 1"), "{e}");
        let e = err(PlanRequest {
            hours: Some(-1.0),
            ..Default::default()
        });
        assert!(e.contains("--hours"), "{e}");
        let e = err(PlanRequest {
            params: Some(f64::NAN),
            ..Default::default()
        });
        assert!(e.contains("--params"), "{e}");
    }

    #[test]
    fn flags_override_a_page_plan() {
        let page = PlanRequest {
            gpus: Some(2),
            mfu: vec![0.3],
            overhead: Some(1.2),
            ..Default::default()
        };
        let cli = PlanRequest {
            mfu: vec![0.5],
            tp: Some(2),
            ..Default::default()
        };
        let merged = page.merged_with(&cli);
        assert_eq!(merged.gpus, Some(2));
        assert_eq!(merged.mfu, vec![0.5]);
        assert_eq!(merged.overhead, Some(1.2));
        assert_eq!(merged.tp, Some(2));
    }
}
