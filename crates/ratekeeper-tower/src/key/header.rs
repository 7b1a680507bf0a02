//! [`HeaderKey`]: an API key or other credential from a request header.

use http::Request;
use http::header::HeaderName;
use ratekeeper_core::Key;

use super::credential::{CredentialSecret, digest_key, is_authorization, normalize_authorization};
use super::{KeyError, KeyExtractor};
use crate::error::BuildError;

/// Header values up to this many bytes are keyed as they are by a [`HeaderKey::raw`] marked
/// [`HeaderKey::in_clear`]; longer ones are keyed by their digest. (Credentials, the
/// default, are keyed by their digest at every length.)
pub const MAX_RAW_LEN: usize = 256;

/// Keys by a request header, usually an API key or a bearer token.
///
/// An absent header, an empty value or a value that is not visible ASCII / UTF-8 (`0xFF`
/// bytes) is [`KeyError::Missing`], so `.or(PeerIp::new())` falls back to the client IP
/// instead of merging everyone into one `""` bucket.
///
/// Prefer [`HeaderKey::validated`]: it maps the raw value to the principal it authenticates
/// (or `None` for an unknown key, which is then missing too), so rotating or re-spelling a key
/// never creates a fresh bucket. [`HeaderKey::raw`] keys on the header's credential itself,
/// which is only safe when something before the limiter has already rejected unknown keys.
///
/// # Credentials are keyed by a digest
///
/// [`HeaderKey::raw`] treats the header as a credential (an API key, a bearer token): the
/// key is `(<header name>,<digest>)`, never the value, at every length, so no token reaches
/// the store, a Redis key name, a metric label or a log line in clear:
///
/// - with a [`CredentialSecret`] (set with [`HeaderKey::credential_secret`], or in the
///   `RATEKEEPER_CREDENTIAL_SECRET` environment variable, read when the extractor is made),
///   the digest is HMAC-SHA256 (RFC 2104) under the secret, `hmac-sha256·<64 hex digits>`:
///   a leaked Redis dump neither reveals nor confirms a token;
/// - without one it is SHA-256 (FIPS 180-4), `sha256·<64 hex digits>`: the token is hidden,
///   but whoever holds a candidate token can confirm it. Set a secret in production.
///
/// Distinct credentials keep distinct budgets, the store holds some 90 bytes per key
/// whatever the token's length, and no digest key can equal a header value (`·`, U+00B7, is
/// not visible ASCII). A header that is not a credential (a tenant id) can be keyed as it
/// is with [`HeaderKey::in_clear`].
///
/// `Authorization` and `Proxy-Authorization` are read by RFC 9110 §11.4
/// (`auth-scheme [ 1*SP ( token68 / #auth-param ) ]`) before the digest: the scheme is
/// case-insensitive and runs of whitespace count as one, so `Bearer abc`, `bearer abc`,
/// `Bearer  abc` and `BEARER abc` are one key; the `token68` stays case-sensitive; auth
/// parameters are compared by name (any case) and unquoted value. A value that does not
/// follow the grammar, or a scheme without credentials, is [`KeyError::Missing`].
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
/// use ratekeeper_core::Key;
/// use ratekeeper_tower::key::{HeaderKey, KeyExtractor};
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
    /// The secret of the credential digests (see [`CredentialSecret`]).
    secret: Option<CredentialSecret>,
    /// Keyed as it is (not a credential; see [`HeaderKey::in_clear`]).
    in_clear: bool,
}

/// The raw-value strategy of [`HeaderKey::raw`].
#[derive(Debug, Clone, Copy, Default)]
pub struct Raw;

/// A header name in any case, or the name as written when it is not a valid field name.
fn header_name(name: &'static str) -> Result<HeaderName, &'static str> {
    HeaderName::from_bytes(name.as_bytes()).map_err(|_| name)
}

impl HeaderKey<Raw> {
    /// Keys on the header's credential, as the tuple `(<header name>,<digest>)` (see
    /// "Credentials are keyed by a digest" above; the secret is
    /// [`CredentialSecret::from_env`] until [`HeaderKey::credential_secret`] sets one).
    /// `name` is accepted in any case; see the type's docs for an invalid one.
    pub fn raw(name: &'static str) -> Self {
        Self::with_name(header_name(name))
    }

    /// Like [`HeaderKey::raw`] for a header name built at run time.
    pub fn raw_name(name: HeaderName) -> Self {
        Self::with_name(Ok(name))
    }

    fn with_name(name: Result<HeaderName, &'static str>) -> Self {
        Self {
            name,
            validate: Raw,
            secret: CredentialSecret::from_env(),
            in_clear: false,
        }
    }

    /// Keys the digests of credentials with `secret` (HMAC-SHA256), instead of the
    /// `RATEKEEPER_CREDENTIAL_SECRET` environment variable's secret (or none).
    #[must_use]
    pub fn credential_secret(mut self, secret: CredentialSecret) -> Self {
        self.secret = Some(secret);
        self
    }

    /// Marks the header as **not** a credential (a tenant or region id): its value is the
    /// key as it is, `(<header name>,<value>)`, trimmed; a value longer than
    /// [`MAX_RAW_LEN`] bytes by its digest. Ignored for `Authorization` and
    /// `Proxy-Authorization`, which always carry credentials. Never use it for an API key:
    /// the value then reaches the store, Redis key names and (with raw key logging) logs.
    #[must_use]
    pub fn in_clear(mut self) -> Self {
        self.in_clear = true;
        self
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
            secret: None,
            in_clear: false,
        }
    }

    /// Like [`HeaderKey::validated`] for a header name built at run time.
    pub fn validated_name(name: HeaderName, validate: V) -> Self {
        Self {
            name: Ok(name),
            validate,
            secret: None,
            in_clear: false,
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

impl HeaderKey<Raw> {
    /// The key this extractor makes for a request whose header holds `value` (trimmed
    /// first): what an admin route peeks at or resets for a customer whose API key it knows
    /// (see "Credentials are keyed by a digest").
    ///
    /// # Errors
    ///
    /// [`KeyError::Missing`] for a value a request would be refused for (empty, or not an
    /// RFC 9110 credential in `Authorization`).
    ///
    /// ```
    /// use ratekeeper_tower::key::HeaderKey;
    ///
    /// let key = HeaderKey::raw("x-api-key");
    /// assert_eq!(key.key_of("k-123")?, key.key_of(" k-123 ")?);
    /// assert!(!key.key_of("k-123")?.to_string().contains("k-123"));
    /// # Ok::<(), ratekeeper_tower::key::KeyError>(())
    /// ```
    pub fn key_of(&self, value: &str) -> Result<Key, KeyError> {
        let text = value.trim();
        if text.is_empty() {
            return Err(KeyError::Missing("key header empty"));
        }
        let name = self
            .name
            .as_ref()
            .map(HeaderName::as_str)
            .unwrap_or_default();
        let secret = self.secret.as_ref();
        let value = if is_authorization(name) {
            let credential = normalize_authorization(text).ok_or(KeyError::Missing(
                "key header is not an RFC 9110 credential",
            ))?;
            digest_key(secret, &credential)
        } else if !self.in_clear || text.len() > MAX_RAW_LEN {
            digest_key(secret, text)
        } else {
            Key::from(text)
        };
        Ok(Key::tuple([Key::from(name), value]))
    }
}

impl KeyExtractor for HeaderKey<Raw> {
    fn extract<B>(&self, req: &Request<B>) -> Result<Key, KeyError> {
        self.key_of(self.value(req)?)
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
    fn credentials_are_keyed_by_their_digest_at_every_length() {
        let k = HeaderKey::raw("x-api-key");
        let key = k.extract(&req(b"abc")).unwrap().to_string();
        assert!(key.starts_with("(x-api-key,sha256\u{b7}"), "{key}");
        assert!(!key.contains("abc"), "{key}");
        assert!(k.extract(&req(b"")).unwrap_err().is_missing());
        assert!(k.extract(&req(b"\xFF\xFE")).unwrap_err().is_missing());
        assert!(k.extract(&Request::new(())).unwrap_err().is_missing());
        // With a secret: a keyed digest, different from the plain one.
        let secret = CredentialSecret::new("deployment secret").unwrap();
        let keyed = k.clone().credential_secret(secret);
        let keyed_key = keyed.extract(&req(b"abc")).unwrap().to_string();
        assert!(
            keyed_key.starts_with("(x-api-key,hmac-sha256\u{b7}"),
            "{keyed_key}"
        );
        // Not a credential: the value itself, up to MAX_RAW_LEN bytes.
        let clear = HeaderKey::raw("x-api-key").in_clear();
        assert_eq!(
            clear.extract(&req(b"abc")).unwrap().to_string(),
            "(x-api-key,abc)"
        );
        let long = vec![b'k'; MAX_RAW_LEN + 1];
        assert!(
            !clear
                .extract(&req(&long))
                .unwrap()
                .to_string()
                .contains("kkkk")
        );
    }

    /// Bearer tokens of 16 and 1 200 bytes: two tokens differing in the last byte get
    /// different keys, the same token (in any spelling of the scheme) the same key, and the
    /// key never holds the token.
    #[test]
    fn bearer_tokens_of_any_length_are_keyed_by_their_digest() {
        let k = HeaderKey::raw("Authorization");
        let with = |v: &[u8]| {
            let mut req = Request::new(());
            req.headers_mut().insert(
                http::header::AUTHORIZATION,
                http::HeaderValue::from_bytes(v).unwrap(),
            );
            k.extract(&req).map(|key| key.to_string())
        };
        for len in [16, 1200] {
            let token = |last: u8| {
                let mut t = vec![b'j'; len - 1];
                t.push(last);
                t
            };
            let spell = |scheme: &str, last: u8| {
                let mut v = scheme.as_bytes().to_vec();
                v.extend(token(last));
                with(&v).unwrap()
            };
            let a = spell("Bearer ", b'a');
            assert_ne!(a, spell("Bearer ", b'b'));
            for scheme in ["bearer ", "Bearer  ", "BEARER ", "Bearer\t"] {
                assert_eq!(a, spell(scheme, b'a'), "{scheme:?}");
            }
            assert!(a.starts_with("(authorization,sha256\u{b7}"), "{a}");
            assert_eq!(a.len(), "(authorization,sha256\u{b7}".len() + 64 + 1);
            assert!(!a.contains("jjjj"));
        }
        assert!(with(b"Bearer").unwrap_err().is_missing());
        assert!(with(b"Bearer a b").unwrap_err().is_missing());
        // `in_clear` never applies to Authorization.
        let clear = HeaderKey::raw("Authorization").in_clear();
        let mut req = Request::new(());
        req.headers_mut().insert(
            "authorization",
            http::HeaderValue::from_static("Bearer abc"),
        );
        assert!(!clear.extract(&req).unwrap().to_string().contains("abc"));
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
