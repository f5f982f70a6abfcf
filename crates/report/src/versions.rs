//! What built this binary: lab, burn, rustc and the git commit (from build.rs).

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Versions {
    pub lab: String,
    pub burn: String,
    pub rustc: String,
    pub git_commit: String,
}

impl Versions {
    pub fn of_this_build() -> Versions {
        Versions {
            lab: env!("CARGO_PKG_VERSION").into(),
            burn: env!("LAB_BURN_VERSION").into(),
            rustc: env!("LAB_RUSTC_VERSION").into(),
            git_commit: env!("LAB_GIT_COMMIT").into(),
        }
    }
}
