//! [`HeaderKey`]: an API key or other credential from a request header.

use http::Request;
use http::header::HeaderName;
use ratekeeper_core::Key;
use sha2::{Digest, Sha256};

use super::{KeyError, KeyExtractor};
use crate::error::BuildError;

/// Header values up to this many bytes are keyed as they are by [`HeaderKey::raw`]; longer
/// ones (a JWT bearer token, typically 800 to 2 000 bytes) are keyed by their SHA-256
/// digest.
pub const MAX_RAW_LEN: usize = 256;

/// Keys by a request header, usually an API key or a bearer token.
///
/// An absent header, an empty value or a value that is not visible ASCII / UTF-8 (`0xFF`
/// bytes) is [`KeyError::Missing`], so `.or(PeerIp::new())` falls back to the client IP
/// instead of merging everyone into one `""` bucket.
///
/// Prefer [`HeaderKey::validated`]: it maps the raw value to the principal it authenticates
/// (or `None` for an unknown key, which is then missing too), so rotating or re-spelling a key
/// never creates a fresh bucket. [`HeaderKey::raw`] keys on the header text itself
/// (`(x-api-key,<value>)`), which is only safe when something before the limiter has
/// already rejected unknown keys. A raw value longer than [`MAX_RAW_LEN`] bytes is keyed by
/// its SHA-256 digest (FIPS 180-4), `(authorization,sha256·<64 hex digits>)`: distinct
/// tokens keep distinct budgets, the store holds 80 bytes instead of the token, and no
/// digest key can equal a raw one (`·`, U+00B7, is not visible ASCII, so no header value
/// read as text holds it).
///
/// Header names are accepted in any case (`"Authorization"` is `authorization`, as HTTP
/// field names are case-insensitive, RFC 9110 §5.1). A name that is not a valid field name
/// at all (`"x api key"`) makes [`RateLimitBuilder::build`](crate::RateLimitBuilder::build)
/// fail with [`BuildError::InvalidHeaderName`]; a layer without a build step answers such a
/// request as misconfigured (500, with an error log line).
///
/// # Example
///
/// ```
/// use axum::http::Request;
/// use ratekeeper_axum::Key;
/// use ratekeeper_axum::key::{HeaderKey, KeyExtractor};
///
/// let api_key = HeaderKey::validated("X-Api-Key", |raw: &str| match raw {
///     "key-alice" => Some(Key::from("user:alice")),
///     _ => None,
/// });
/// let req = |v: &str| Request::builder().header("x-api-key", v).body(()).unwrap();
/// assert_eq!(api_key.extract(&req("key-alice")).unwrap(), Key::from("user:alice"));
/// assert!(api_key.extract(&req("rotate-0001")).unwrap_err().is_missing());
/// assert!(api_key.extract(&req("")).unwrap_err().is_missing());
/// ```
#[derive(Debug, Clone)]
pub struct HeaderKey<V = Raw> {
    name: Result<HeaderName, &'static str>,
    validate: V,
}

/// The raw-value strategy of [`HeaderKey::raw`].
#[derive(Debug, Clone, Copy, Default)]
pub struct Raw;

/// A header name in any case, or the name as written when it is not a valid field name.
fn header_name(name: &'static str) -> Result<HeaderName, &'static str> {
    HeaderName::from_bytes(name.as_bytes()).map_err(|_| name)
}

impl HeaderKey<Raw> {
    /// Keys on the raw header value, as the tuple `(<header name>,<value>)` (a value longer
    /// than [`MAX_RAW_LEN`] bytes by its digest). `name` is accepted in any case; see the
    /// type's docs for an invalid one.
    pub fn raw(name: &'static str) -> Self {
        Self {
            name: header_name(name),
            validate: Raw,
        }
    }

    /// Like [`HeaderKey::raw`] for a header name built at run time.
    pub fn raw_name(name: HeaderName) -> Self {
        Self {
            name: Ok(name),
            validate: Raw,
        }
    }
}

impl<V> HeaderKey<V> {
    /// Keys on the principal `validate` maps the header value to; `None` (an unknown or
    /// invalid credential) counts as missing. `name` is accepted in any case; see the type's
    /// docs for an invalid one.
    pub fn validated(name: &'static str, validate: V) -> Self {
        Self {
            name: header_name(name),
            validate,
        }
    }

    /// Like [`HeaderKey::validated`] for a header name built at run time.
    pub fn validated_name(name: HeaderName, validate: V) -> Self {
        Self {
            name: Ok(name),
            validate,
        }
    }

    /// The header this extractor reads (lower case), or `None` when the name given is not a
    /// valid field name.
    pub fn name(&self) -> Option<&HeaderName> {
        self.name.as_ref().ok()
    }

    fn check_name(&self) -> Result<(), BuildError> {
        match &self.name {
            Ok(_) => Ok(()),
            Err(name) => Err(BuildError::InvalidHeaderName((*name).to_owned())),
        }
    }

    fn value<'r, B>(&self, req: &'r Request<B>) -> Result<&'r str, KeyError> {
        let name = self.name.as_ref().map_err(|_| {
            KeyError::Misconfigured("the key header's name is not a valid HTTP field name")
        })?;
        let value = req
            .headers()
            .get(name)
            .ok_or(KeyError::Missing("key header absent"))?;
        let text = value
            .to_str()
            .map_err(|_| KeyError::Missing("key header is not visible ASCII"))?
            .trim();
        if text.is_empty() {
            return Err(KeyError::Missing("key header empty"));
        }
        Ok(text)
    }
}

/// `sha256·` and the lower-case hex SHA-256 digest of `value`.
fn digest_key(value: &str) -> Key {
    use std::fmt::Write as _;
    let digest = Sha256::digest(value.as_bytes());
    let mut text = String::with_capacity(8 + 64);
    text.push_str("sha256\u{b7}");
    for b in digest {
        // Writing to a String cannot fail.
        let _ = write!(text, "{b:02x}");
    }
    Key::from(text)
}

impl KeyExtractor for HeaderKey<Raw> {
    fn extract<B>(&self, req: &Request<B>) -> Result<Key, KeyError> {
        let text = self.value(req)?;
        let value = if text.len() > MAX_RAW_LEN {
            digest_key(text)
        } else {
            Key::from(text)
        };
        let name = self
            .name
            .as_ref()
            .map(HeaderName::as_str)
            .unwrap_or_default();
        Ok(Key::tuple([Key::from(name), value]))
    }

    fn check(&self) -> Result<(), BuildError> {
        self.check_name()
    }
}

impl<V> KeyExtractor for HeaderKey<V>
where
    V: Fn(&str) -> Option<Key> + Send + Sync + 'static,
{
    fn extract<B>(&self, req: &Request<B>) -> Result<Key, KeyError> {
        let text = self.value(req)?;
        (self.validate)(text).ok_or(KeyError::Missing("key header not recognised"))
    }

    fn check(&self) -> Result<(), BuildError> {
        self.check_name()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(v: &[u8]) -> Request<()> {
        let mut req = Request::new(());
        req.headers_mut()
            .insert("x-api-key", http::HeaderValue::from_bytes(v).unwrap());
        req
    }

    #[test]
    fn raw_values() {
        let k = HeaderKey::raw("x-api-key");
        assert_eq!(
            k.extract(&req(b"abc")).unwrap().to_string(),
            "(x-api-key,abc)"
        );
        assert!(k.extract(&req(b"")).unwrap_err().is_missing());
        assert!(k.extract(&req(b"\xFF\xFE")).unwrap_err().is_missing());
        assert!(k.extract(&Request::new(())).unwrap_err().is_missing());
    }

    /// A value longer than `MAX_RAW_LEN` (a JWT bearer token) is keyed by its digest: two
    /// tokens differing in the last byte get different keys, the same token the same key,
    /// and the key never holds the token.
    #[test]
    fn long_values_are_keyed_by_their_digest() {
        let k = HeaderKey::raw("Authorization");
        let token = |last: u8| {
            let mut t = b"Bearer ".to_vec();
            t.resize(1200 - 1, b'j');
            t.push(last);
            t
        };
        let with = |v: &[u8]| {
            let mut req = Request::new(());
            req.headers_mut().insert(
                http::header::AUTHORIZATION,
                http::HeaderValue::from_bytes(v).unwrap(),
            );
            k.extract(&req).unwrap().to_string()
        };
        let a = with(&token(b'a'));
        let b = with(&token(b'b'));
        assert_ne!(a, b);
        assert_eq!(a, with(&token(b'a')));
        assert!(a.starts_with("(authorization,sha256\u{b7}"), "{a}");
        assert_eq!(a.len(), "(authorization,sha256\u{b7}".len() + 64 + 1);
        assert!(!a.contains("jjjj"));
        // At the limit, the value itself.
        let edge = vec![b'k'; MAX_RAW_LEN];
        assert_eq!(
            with(&edge),
            format!("(authorization,{})", "k".repeat(MAX_RAW_LEN))
        );
    }

    #[test]
    fn header_names_in_any_case_are_accepted_and_invalid_ones_fail_the_build() {
        let k = HeaderKey::validated("Authorization", |v: &str| Some(Key::from(v)));
        assert_eq!(k.name().unwrap().as_str(), "authorization");
        assert!(k.check().is_ok());
        let mut req = Request::new(());
        req.headers_mut()
            .insert("authorization", http::HeaderValue::from_static("t"));
        assert_eq!(k.extract(&req).unwrap().to_string(), "t");
        let bad = HeaderKey::raw("x api key");
        assert!(bad.name().is_none());
        let err = bad.check().unwrap_err();
        assert!(matches!(err, BuildError::InvalidHeaderName(ref n) if n == "x api key"));
        assert_eq!(
            bad.extract(&req).unwrap_err().status(),
            http::StatusCode::INTERNAL_SERVER_ERROR
        );
    }
}
