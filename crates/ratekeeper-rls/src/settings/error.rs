//! Why the settings cannot be read.

use super::StoreKind;

/// Why the settings cannot be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SettingsError {
    /// `--help` or `--version`: the text to print (then exit 0).
    #[error("{0}")]
    Help(String),
    /// Unknown flag, missing flag value: clap's message with usage.
    #[error("{0}")]
    Usage(String),
    /// A variable with a value it cannot take. (Values of `REDIS_URL` and `REDIS_AUTH` are
    /// never echoed: they can hold a password.)
    #[error("environment variable {name}={value:?}: expected {expected}")]
    InvalidEnv {
        /// The variable.
        name: &'static str,
        /// Its value.
        value: String,
        /// What it can be.
        expected: &'static str,
    },
    /// A flag with a value it cannot take.
    #[error("--{flag} {value:?}: expected {expected}")]
    InvalidFlag {
        /// The flag, without `--`.
        flag: &'static str,
        /// Its value.
        value: String,
        /// What it can be.
        expected: &'static str,
    },
    /// A mode of the reference this service does not have, and whose absence would change
    /// what it does.
    #[error("{name}={value}: {reason}")]
    Unsupported {
        /// The variable.
        name: &'static str,
        /// Its value.
        value: String,
        /// Why, and what to use instead.
        reason: &'static str,
    },
    /// A Redis-backed store with no Redis URL.
    #[error("the {store} store needs a Redis URL: set --redis or REDIS_URL")]
    MissingRedisUrl {
        /// The store asked for.
        store: StoreKind,
    },
}

impl SettingsError {
    /// `--help` / `--version`: print the text and exit 0.
    pub fn is_help(&self) -> bool {
        matches!(self, SettingsError::Help(_))
    }
}
