//! The store's errors as the decision path reports them: a Redis failure written as a
//! sentence, and a reply the scripts' protocol does not allow.

use std::fmt;

use crate::store::StoreError;

/// A protocol problem in a script answer (never turned into "allowed").
#[derive(Debug, thiserror::Error)]
#[error("unexpected answer from the rate-limit script: {0}")]
pub(super) struct BadReply(pub(super) &'static str);

/// A store-unavailable [`StoreError`] for `err`.
pub(super) fn unavailable(err: impl std::error::Error + Send + Sync + 'static) -> StoreError {
    StoreError::Unavailable(Box::new(err))
}

/// A `redis` error as a sentence: its `Display` writes error kinds with `Debug`
/// (`... - Server(ResponseError): DB index is out of range`, `ResponseError: ...`); this
/// keeps the description and the server's message. The error itself is the `source`.
#[derive(Debug)]
pub(super) struct RedisFailure(pub(super) redis::RedisError);

impl fmt::Display for RedisFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let text = self.0.to_string();
        // The server's own error: its code (`ERR`, `WRONGTYPE`...) and message.
        if let Some(code) = self.0.code() {
            if !text.contains(" - ") {
                return match self.0.detail() {
                    Some(detail) => write!(f, "Redis answered {code} {detail}"),
                    None => write!(f, "Redis answered {code}"),
                };
            }
        }
        // `<description> - <Kind>[: <detail>]`: the description and the detail.
        match text.split_once(" - ") {
            Some((description, kind)) => match kind.split_once(": ") {
                Some((_, detail)) => write!(f, "{description}: {detail}"),
                None => f.write_str(description),
            },
            None => f.write_str(&text),
        }
    }
}

impl std::error::Error for RedisFailure {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.0)
    }
}

/// [`unavailable`] for a `redis` error, written as a sentence ([`RedisFailure`]).
pub(super) fn redis_failure(err: redis::RedisError) -> StoreError {
    unavailable(RedisFailure(err))
}

#[cfg(test)]
mod tests {
    use super::*;
    use redis::ErrorKind;

    #[test]
    fn a_redis_error_reads_as_a_sentence() {
        let err = redis_failure(redis::RedisError::from((
            ErrorKind::InvalidClientConfig,
            "Redis server refused to switch database",
            "DB index is out of range".to_owned(),
        )));
        assert_eq!(
            err.to_string(),
            "the store is unavailable: Redis server refused to switch database: DB index is \
             out of range"
        );
        let err = redis_failure(redis::RedisError::from((
            ErrorKind::Io,
            "connection closed",
        )));
        assert_eq!(
            err.to_string(),
            "the store is unavailable: connection closed"
        );
        // The redis error stays the source.
        let source = std::error::Error::source(&err).and_then(std::error::Error::source);
        assert!(source.is_some_and(|s| s.is::<redis::RedisError>()));
    }
}
