//! `lab bench`: tokens/s and the forward/backward/optimizer split of training steps.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{bail, Result};
use lab_train::backend::BackendKind;
use lab_train::bench::{BenchOptions, BenchReport, MemoryGauge};
use lab_train::op_split::OpSplit;

#[derive(clap::Args)]
pub struct Args {
    /// Config to time. Default: the embedded configs/tiny-cpu.toml.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Timed steps.
    #[arg(long, default_value_t = 10)]
    pub steps: usize,
    /// Untimed warm-up steps.
    #[arg(long, default_value_t = 2)]
    pub warmup: usize,
    /// CPU threads (sets RAYON_NUM_THREADS for the flex backend). Default: all cores.
    #[arg(long)]
    pub threads: Option<usize>,
    #[arg(long, default_value = "cpu")]
    pub backend: String,
    /// LM-head loss: `fused` (lab-ops, what training uses) or `unfused` (the plain
    /// log_softmax composition, for before/after comparisons); overrides train.lm_head_loss.
    #[arg(long, value_parser = ["fused", "unfused"])]
    pub loss: Option<String>,
    /// Overrides train.precision: `fp32`, or `bf16` (bf16 matmuls over fp32 weights).
    #[arg(long)]
    pub precision: Option<lab_config::Precision>,
    /// Overrides train.activation_checkpointing: `none` or `selective` (to time the
    /// recomputation).
    #[arg(long)]
    pub activation_checkpointing: Option<lab_config::ActivationCheckpointing>,
    /// Time decoding this many tokens with the KV cache against recomputing the sequence.
    #[arg(long, value_name = "TOKENS")]
    pub generate: Option<usize>,
    /// Time writing (temp folder, fsync, rename) and loading (verify, restore) a checkpoint
    /// of the config's initialised weights and optimizer state, in --ckpt-dir.
    #[arg(long)]
    pub checkpoint: bool,
    /// The folder on the disk --checkpoint measures (it writes into a temporary subfolder,
    /// removed afterwards).
    #[arg(long, default_value = "runs/bench-checkpoint")]
    pub ckpt_dir: std::path::PathBuf,
    /// Also write the token stream the steps draw from (little-endian u32 ids) to FILE, for
    /// scripts/reference/torch_train_ref.py to train on the same windows.
    #[arg(long, value_name = "FILE", conflicts_with_all = ["matmul", "generate", "checkpoint"])]
    pub tokens_out: Option<PathBuf>,
    /// Time the backend's matmul on the model's projection shapes (micro_batch × seq_len
    /// rows), in the run's precision, instead of training steps.
    #[arg(long, conflicts_with_all = ["generate", "checkpoint"])]
    pub matmul: bool,
    /// Also split the step's time by op class (projections, attention, RoPE, RMSNorm, SwiGLU,
    /// embedding, LM head + loss, optimizer, other): each class timed alone at the step's
    /// shapes, forward and backward, times its runs per step.
    #[arg(long, conflicts_with_all = ["matmul", "generate", "checkpoint"])]
    pub split: bool,
    /// Print the report as JSON.
    #[arg(long)]
    pub json: bool,
}

pub fn run(args: Args) -> Result<ExitCode> {
    if args.threads == Some(0) {
        super::bail_usage!("--threads 0: give at least 1, or leave it out for all cores");
    }
    if let Some(n) = args.threads {
        // Read by rayon's global pool, which flex builds on first use (below).
        std::env::set_var("RAYON_NUM_THREADS", n.to_string());
    }
    let backend = super::backend_kind(&args.backend)?;
    let mut config = super::train::load_config(args.config.as_ref())?;
    match args.loss.as_deref() {
        Some("unfused") => config.train.lm_head_loss = lab_config::LmHeadLoss::Unfused,
        Some(_) => config.train.lm_head_loss = lab_config::LmHeadLoss::Fused,
        None => {}
    }
    if let Some(p) = args.precision {
        config.train.precision = p;
    }
    if let Some(c) = args.activation_checkpointing {
        config.train.activation_checkpointing = c;
    }
    let launch = lab_dist::Launch::from_env()?;
    let gpu = super::open_gpu(backend, &launch);
    if let Some(note) = super::measure_on_this_device(&mut config, backend, &gpu) {
        eprintln!("lab bench: {note}");
    }
    let threads = std::env::var("RAYON_NUM_THREADS").unwrap_or_else(|_| {
        std::thread::available_parallelism()
            .map(|n| n.to_string())
            .unwrap_or_default()
    });
    if args.checkpoint {
        if args.ckpt_dir.exists() && !args.ckpt_dir.is_dir() {
            bail!(
                "--ckpt-dir {} is a file: give a folder on the disk to measure",
                args.ckpt_dir.display()
            );
        }
        let r = backend.dispatch(lab_train::bench::CheckpointBench {
            config,
            dir: args.ckpt_dir.clone(),
        })?;
        if args.json {
            println!("{}", serde_json::to_string_pretty(&r)?);
        } else {
            let gb = |b: u64| b as f64 / 1e9;
            // The figures are for this folder's disk.
            println!(
                "checkpoint of {:.2} GB of state ({:.2} GB on disk) in {}: write {:.2} s ({:.2} GB/s, temp + fsync + rename), load and verify {:.2} s ({:.2} GB/s); RSS {:.2} GB before the save, peak {:.2} GB during it ({:.2}× the state)",
                gb(r.state_bytes),
                gb(r.file_bytes),
                args.ckpt_dir.display(),
                r.write_s,
                r.write_gb_per_s,
                r.load_s,
                r.load_gb_per_s,
                gb(r.rss_before_save),
                gb(r.peak_rss_save),
                r.peak_rss_save as f64 / r.state_bytes as f64
            );
        }
        return Ok(ExitCode::SUCCESS);
    }
    if args.matmul {
        let precision = config.train.precision.as_str();
        let shapes = backend.dispatch(lab_train::bench::MatmulBench {
            config,
            iters: args.steps,
        })?;
        if args.json {
            println!("{}", serde_json::to_string_pretty(&shapes)?);
        } else {
            for s in shapes {
                println!(
                    "matmul {:<12} [{} × {}] @ [{} × {}] {precision} on {}: {:.3} ms, {:.1} TFLOP/s",
                    s.name,
                    s.m,
                    s.k,
                    s.k,
                    s.n,
                    backend.name(),
                    s.ms,
                    s.tflops
                );
            }
        }
        say_vendor_blas_counts(backend);
        return Ok(ExitCode::SUCCESS);
    }
    if let Some(n) = args.generate {
        let r = backend.dispatch(lab_train::bench::GenerateBench {
            config,
            new_tokens: n,
        })?;
        if args.json {
            println!("{}", serde_json::to_string_pretty(&r)?);
        } else {
            println!(
                "generate {} tokens after {}: KV cache {:.0} tokens/s, recompute {:.0} tokens/s ({:.1}× faster), greedy tokens {}",
                r.new_tokens,
                r.prompt_tokens,
                r.cached_tokens_per_s,
                r.recompute_tokens_per_s,
                r.speedup,
                if r.identical { "identical" } else { "DIFFERENT" }
            );
        }
        return Ok(ExitCode::SUCCESS);
    }
    let r = backend.dispatch(BenchOptions {
        config,
        steps: args.steps,
        warmup: args.warmup,
        tokens_out: args.tokens_out,
        split: args.split,
        memory: memory_gauge(gpu),
    })?;
    if args.json {
        let mut v = serde_json::to_value(&r)?;
        v["backend"] = backend.name().into();
        v["threads"] = threads.into();
        if let Some((ran, declined)) = backend.vendor_blas_counts() {
            v["cublaslt"] = serde_json::json!({ "ran": ran, "declined": declined });
        }
        println!("{}", serde_json::to_string_pretty(&v)?);
    } else {
        print_report(&r, backend.name(), &threads, args.warmup + args.steps);
    }
    say_vendor_blas_counts(backend);
    Ok(ExitCode::SUCCESS)
}

/// With `LAB_MATMUL=cublaslt`, how many products cuBLASLt took: a bench where it declined them
/// all timed cubecl's matmul.
fn say_vendor_blas_counts(backend: BackendKind) {
    if let Some((ran, declined)) = backend.vendor_blas_counts() {
        eprintln!(
            "lab bench: cuBLASLt ran {ran} products; {declined} it declined ran on cubecl's matmul"
        );
    }
}

/// The training-step report as text; `last_step` is the step the loss is from.
fn print_report(r: &BenchReport, backend: &str, threads: &str, last_step: usize) {
    println!(
        "{} on {backend} ({threads} threads, {} loss, {}, checkpointing {}): {:.0} tokens/s, {:.1} ms/step ({} tokens/step, {} steps)",
        r.config,
        r.lm_head_loss,
        r.precision,
        r.activation_checkpointing,
        r.tokens_per_s,
        r.ms_per_step,
        r.tokens_per_step,
        r.steps
    );
    println!(
        "  MFU {:.1}% of the {} peak, {} | loss at step {last_step} {:.4}",
        r.mfu * 100.0,
        r.products,
        lab_train::device::format_flops(r.peak_flops),
        r.last_loss
    );
    println!(
        "  with a sync ending each phase: forward {:.1} ms | backward {:.1} ms | optimizer {:.1} ms = {:.1} ms/step ({:+.1} ms against a whole step)",
        r.forward_ms,
        r.backward_ms,
        r.optimizer_ms,
        r.phased_ms_per_step,
        r.phased_ms_per_step - r.ms_per_step
    );
    let gib = |b: u64| b as f64 / lab_plan::units::GIB;
    println!(
        "  peak memory {:.2} GiB ({})",
        gib(r.peak_memory_bytes),
        r.memory_gauge
    );
    if let Some(busy) = r.gpu_util_pct {
        println!("  GPU busy {busy:.0} % (NVML's last sample period after each whole step; under 100 % the GPU waited on the host)");
    }
    if let (Some(tensors), Some(pool)) = (r.device_tensor_bytes, r.device_pool_bytes) {
        println!(
            "  device tensors after the first forward {:.2} GiB (weights, moments, activations kept) | memory pool {:.2} GiB",
            gib(tensors),
            gib(pool)
        );
    }
    if let Some(split) = &r.split {
        print_split(split);
    }
}

/// The GPU's used memory through NVML on CUDA; the process's peak RSS elsewhere (or when
/// NVML cannot be opened, with a warning).
fn memory_gauge(gpu: super::Gpu) -> MemoryGauge {
    match gpu {
        Ok(Some(probe)) => MemoryGauge::Gpu(probe),
        Ok(None) => MemoryGauge::ProcessPeak,
        Err(e) => {
            eprintln!("warning: {e}; reporting the process's peak RSS instead");
            MemoryGauge::ProcessPeak
        }
    }
}

fn print_split(split: &OpSplit) {
    println!("  time by op class (each alone at the step's shapes, forward + backward, × runs per step):");
    for c in &split.classes {
        let rate = c
            .tflops
            .map(|t| format!("  {t:.2} TFLOP/s"))
            .unwrap_or_default();
        println!(
            "    {:<22} {:>9.1} ms {:>5.1} %  ({} × {:.2} ms){rate}",
            c.class.name(),
            c.ms_per_step,
            c.share * 100.0,
            c.runs_per_step,
            c.ms_per_run
        );
    }
    let rest = [
        ("optimizer", split.optimizer_ms, ""),
        (
            "other",
            split.other_ms,
            "  (residual adds, casts, reshapes, accumulation, fusion across classes)",
        ),
    ];
    for (name, ms, what) in rest {
        let share = ms / split.step_ms * 100.0;
        println!("    {name:<22} {ms:>9.1} ms {share:>5.1} %{what}");
    }
}
