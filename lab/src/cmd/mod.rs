//! One module per subcommand: parse flags, call the library, map the outcome to an exit code.

pub mod bench;
pub mod budget;
pub mod data;
pub mod plan;
pub mod postmortem;
pub mod tokenizer;
pub mod train;
