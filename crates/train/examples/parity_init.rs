//! Writes the initial weights (seed 42) of the parity test's config, the input of
//! scripts/reference/torch_parity.py:
//!
//!     cargo run --release -p lab-train --example parity_init -- /tmp/parity-init.safetensors
//!     python scripts/reference/torch_parity.py --init /tmp/parity-init.safetensors \
//!         --out crates/train/tests/fixtures/parity.json

use std::collections::HashMap;
use std::path::Path;

use lab_config::LabConfig;
use lab_model::{weights, Llama};

fn main() -> anyhow::Result<()> {
    let out = std::env::args()
        .nth(1)
        .ok_or_else(|| anyhow::anyhow!("usage: parity_init OUT.safetensors"))?;
    let cfg = LabConfig::from_toml(include_str!("../tests/fixtures/parity.toml"))?;
    let model = Llama::<burn::backend::Flex>::new(&cfg.model, cfg.train.seed, &Default::default());
    weights::save_safetensors(
        Path::new(&out),
        &weights::tensor_map(&model),
        HashMap::new(),
    )?;
    println!("wrote {out}");
    Ok(())
}
