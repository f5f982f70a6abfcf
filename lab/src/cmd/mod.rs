//! One module per subcommand: parse flags, call the library, map the outcome to an exit code.

pub mod bench;
pub mod budget;
pub mod compare;
pub mod data;
pub mod deid_probe;
pub mod dod;
pub mod eval;
pub mod export;
pub mod generate;
pub mod plan;
pub mod postmortem;
pub mod run;
pub mod status;
pub mod supervise;
pub mod tokenizer;
pub mod train;
