//! A command line that is wrong as given (a flag that needs another flag or a config section,
//! a value out of range) where clap cannot judge it alone. `lab` exits 2 for it, as for clap's
//! own usage errors; it lives here so that the library crates that check flags can raise it.

/// A usage error's one-line message, naming the flag and the fix.
#[derive(Debug)]
pub struct Usage(pub String);

impl std::fmt::Display for Usage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Usage {}

/// `anyhow::bail!` for a [`Usage`] error (exit 2).
#[macro_export]
macro_rules! bail_usage {
    ($($arg:tt)*) => {
        return Err(anyhow::Error::new($crate::Usage(format!($($arg)*))))
    };
}
