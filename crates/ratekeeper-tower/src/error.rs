//! [`BuildError`]: why a rate limit could not be built (a misconfiguration is an error when
//! the layer is built, never at request time).

#[cfg(doc)]
use ratekeeper_core::Policy;
use ratekeeper_core::store::StoreError;

/// Why a [`RateLimitLayer`](crate::RateLimitLayer) could not be built.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BuildError {
    /// No policy was added.
    #[error("a rate limit needs at least one policy")]
    NoPolicy,
    /// Two policies share a name.
    #[error("policy name {0:?} is used twice")]
    DuplicatePolicy(String),
    /// The store refused a policy (invalid name or ban, a burst its algorithm takes none
    /// of, unsupported algorithm).
    #[error(transparent)]
    Store(#[from] StoreError),
    /// A fixed cost of 0 would make every policy unlimited.
    #[error("a fixed request cost of 0 would never limit anything")]
    ZeroCost,
    /// A fixed cost larger than a policy's capacity ([`Policy::capacity`](ratekeeper_core::Policy::capacity): the burst for
    /// GCRA and the leaky bucket, the limit for window algorithms) would deny every request.
    #[error("fixed request cost {cost} is larger than the burst {burst} of policy {policy:?}")]
    CostExceedsBurst {
        /// The policy.
        policy: String,
        /// The fixed cost.
        cost: u64,
        /// The policy's capacity.
        burst: u32,
    },
    /// A resolver or settle rule names a policy the layer does not have.
    #[error("there is no policy named {0:?}")]
    UnknownPolicy(String),
    /// A [`Algorithm::Concurrency`](ratekeeper_core::Algorithm::Concurrency) policy holds
    /// permits until released; a rate limit never releases them, so it would end up denying
    /// everything. Use a concurrency limit layer for in-flight limits.
    #[error(
        "policy {0:?} uses the concurrency algorithm, which a rate limit cannot release; \
         use a concurrency limit layer"
    )]
    ConcurrencyPolicy(String),
    /// Settings from a configuration file that do not fit together (see the `config`
    /// module, feature `serde`).
    #[error("configuration error in `{}`: {}", OneLine(field), OneLine(message))]
    Config {
        /// The field's path (`key.header`).
        field: String,
        /// What is wrong.
        message: String,
    },
    /// A [`HeaderKey`](crate::key::HeaderKey) was given a header name that is not a valid
    /// HTTP field name (RFC 9110 §5.1: a token, letters, digits and ``!#$%&'*+-.^_`|~``).
    #[error(
        "header name {0:?} is not a valid HTTP field name: use letters, digits and `-`, \
         such as \"x-api-key\" or \"Authorization\""
    )]
    InvalidHeaderName(String),
    /// A route template can never match a route (see
    /// [`route::check_template`](crate::route::check_template)): no leading `/`, or axum 0.7's
    /// `:param` / `*rest` syntax, which axum 0.8 treats as literal text.
    #[error(
        "route template \"{}\" can never match: {problem}; {}",
        OneLine(template),
        OneLine(fix)
    )]
    RouteTemplate {
        /// The template as written.
        template: String,
        /// What is wrong with it.
        problem: &'static str,
        /// How to write it instead.
        fix: String,
    },
}

/// Writes text from outside (a template, a field path, a file name) with its control
/// characters (and the Unicode line and paragraph separators) escaped as Rust writes them
/// (`\n`, `\r`, `\t`, `\u{1b}`, `\u{2028}`), so that an error message stays on one line
/// whatever the input holds. Text already escaped (a `{:?}` inside a message) is kept as
/// it is.
pub(crate) struct OneLine<'a>(pub(crate) &'a str);

impl std::fmt::Display for OneLine<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        use std::fmt::Write as _;
        for c in self.0.chars() {
            if c.is_control() || matches!(c, '\u{2028}' | '\u{2029}') {
                for e in c.escape_default() {
                    f.write_char(e)?;
                }
            } else {
                f.write_char(c)?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_holding_line_breaks_render_on_one_line() {
        let err = BuildError::RouteTemplate {
            template: "/a\n:id\r\u{1b}".to_owned(),
            problem: "it uses axum 0.7's `:param` syntax",
            fix: "write \"/a\n{id}\"".to_owned(),
        };
        let text = err.to_string();
        assert!(!text.contains(['\n', '\r', '\u{1b}']), "{text}");
        assert!(text.contains(r"/a\n:id\r\u{1b}"), "{text}");
        let err = BuildError::Config {
            field: "tiers.values.gold\nsilver".to_owned(),
            message: "there is no policy named \"x\ny\"".to_owned(),
        };
        let text = err.to_string();
        assert_eq!(
            text,
            r#"configuration error in `tiers.values.gold\nsilver`: there is no policy named "x\ny""#
        );
        assert_eq!(OneLine("a\\n").to_string(), r"a\n");
        assert_eq!(
            OneLine("caf\u{e9} \u{2028}").to_string(),
            "caf\u{e9} \\u{2028}"
        );
    }
}
