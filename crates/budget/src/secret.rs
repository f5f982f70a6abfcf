//! API keys and webhook URLs: read from an environment variable or a file, held in a type
//! whose `Debug` and `Display` never show the value, and scrubbed from every error message
//! (a server may echo the `Authorization` header back in an error body).

use std::fmt;
use std::path::Path;

use anyhow::{bail, Context, Result};

/// A secret string. The only way to see it is [`Secret::expose`], used when building a request.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    /// From `$env` when set and non-empty, else from `file`. Errors name the variable or the
    /// file, never the value.
    pub fn from_env_or_file(env: &str, file: Option<&Path>) -> Result<Secret> {
        check_env_name(env, "--api-key-env (budget.api_key_env)")?;
        if let Some(v) = env_nonempty(env) {
            return Secret::new(v.trim().to_string(), &format!("${env}"));
        }
        match file {
            Some(path) => Secret::from_file(path),
            None => bail!(
                "no API key: set the environment variable {env} or name a key file \
                 (--api-key-file or budget.api_key_file)"
            ),
        }
    }

    /// From `$env`, set and non-empty; `setting` names where `env` came from in errors, which
    /// never show the value.
    pub fn from_env(env: &str, setting: &str) -> Result<Secret> {
        check_env_name(env, setting)?;
        match env_nonempty(env) {
            Some(v) => Secret::new(v.trim().to_string(), &format!("${env}")),
            None => bail!("{setting} names {env}, which is not set: export {env} with the value"),
        }
    }

    /// First line of `path`, trimmed.
    pub fn from_file(path: &Path) -> Result<Secret> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read key file {}", path.display()))?;
        let first = text.lines().next().unwrap_or("").trim().to_string();
        Secret::new(first, &path.display().to_string())
    }

    /// A secret from a value the caller already holds (tests, env lookups).
    pub fn new(value: String, origin: &str) -> Result<Secret> {
        if value.is_empty() {
            bail!("the secret in {origin} is empty");
        }
        if value.chars().any(|c| c.is_control() || c == ' ') {
            // Would corrupt an HTTP header; the message must not quote the value.
            bail!("the secret in {origin} contains spaces or control characters");
        }
        Ok(Secret(value))
    }

    pub fn expose(&self) -> &str {
        &self.0
    }

    /// `text` with every occurrence of the secret replaced by `<redacted>`.
    pub fn redact(&self, text: &str) -> String {
        if self.0.len() < 4 {
            return text.to_string(); // too short to scrub without mangling ordinary text
        }
        text.replace(&self.0, "<redacted>")
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(<redacted>)")
    }
}

impl fmt::Display for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<redacted>")
    }
}

/// `$name`, when set to more than whitespace.
pub(crate) fn env_nonempty(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.trim().is_empty())
}

/// `env` must be a variable's name (letters, digits and `_`, not starting with a digit): a
/// key or a webhook URL given where its variable's name belongs is refused without being
/// shown.
pub fn check_env_name(env: &str, setting: &str) -> Result<()> {
    let is_name = env.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
        && env.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_');
    if !is_name {
        bail!(
            "{setting} takes the name of an environment variable (letters, digits and _, such as RUNPOD_API_KEY); what it was given is not one, and is not shown in case it is the secret itself"
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY: &str = "secret_PLANTED-KEY-7f3a9c";

    #[test]
    fn never_formats_the_value() {
        let s = Secret::new(KEY.into(), "test").unwrap();
        assert!(!format!("{s:?} {s} {s:#?}").contains(KEY));
        assert_eq!(s.expose(), KEY);
        assert_eq!(
            s.redact(&format!("echo: Bearer {KEY}!")),
            "echo: Bearer <redacted>!"
        );
    }

    #[test]
    fn a_value_given_for_a_variable_name_is_refused_unshown() {
        let url = "https://hooks.slack.com/services/T000/B000/XOXBSECRET42";
        for given in [KEY, url, "1ABC", ""] {
            let e = format!("{:#}", Secret::from_env_or_file(given, None).unwrap_err());
            assert!(
                e.contains("--api-key-env") && e.contains("not shown"),
                "{e}"
            );
            let e = format!(
                "{:#}",
                Secret::from_env(given, "budget.webhook_url_env").unwrap_err()
            );
            assert!(
                e.starts_with("budget.webhook_url_env takes the name"),
                "{e}"
            );
            assert!(given.is_empty() || !e.contains(given), "{e}");
        }
        let var = "LAB_BUDGET_TEST_HOOK_UNSET_7F3A";
        let e = format!(
            "{:#}",
            Secret::from_env(var, "budget.webhook_url_env").unwrap_err()
        );
        assert!(e.contains(&format!("export {var}")), "{e}");
    }

    #[test]
    fn reads_env_then_file_and_errors_name_the_source() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("key");
        std::fs::write(&f, format!("{KEY}\n")).unwrap();
        let var = "LAB_BUDGET_TEST_KEY_UNSET_7F3A";
        let s = Secret::from_env_or_file(var, Some(&f)).unwrap();
        assert_eq!(s.expose(), KEY);
        let e = format!("{:#}", Secret::from_env_or_file(var, None).unwrap_err());
        assert!(e.contains(var), "{e}");
        std::fs::write(&f, format!("{KEY} trailing words\n")).unwrap();
        let e = format!("{:#}", Secret::from_file(&f).unwrap_err());
        assert!(e.contains("spaces") && !e.contains(KEY), "{e}");
        let e = format!(
            "{:#}",
            Secret::from_file(&dir.path().join("nope")).unwrap_err()
        );
        assert!(e.contains("nope"), "{e}");
    }
}
