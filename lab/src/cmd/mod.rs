//! One module per subcommand: parse flags, call the library, map the outcome to an exit code.

pub mod bench;
pub mod budget;
pub mod plan;
pub mod train;
