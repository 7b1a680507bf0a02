//! Credentials in keys: the normal form of an `Authorization` credential (RFC 9110 §11.4)
//! and the digest a credential is keyed by, keyed with a deployment secret
//! ([`CredentialSecret`]) when the operator sets one.

use std::fmt;
use std::fmt::Write as _;

use hmac::{Hmac, Mac};
use ratekeeper_core::Key;
use sha2::{Digest, Sha256};

/// The environment variable [`CredentialSecret::from_env`] reads:
/// `RATEKEEPER_CREDENTIAL_SECRET`.
pub const CREDENTIAL_SECRET_ENV: &str = "RATEKEEPER_CREDENTIAL_SECRET";

/// A deployment secret that keys the digests of credentials: with one, a credential header
/// is keyed by HMAC-SHA256 (RFC 2104, FIPS 198-1) of its value under the secret, so whoever
/// reads the store (a Redis dump, a log line with raw keys) can neither recover a token nor
/// confirm a guessed one without the secret. Without one, the digest is plain SHA-256,
/// which hides the token but lets someone holding a candidate token confirm it.
///
/// Use the same secret on every instance that shares a store (they must agree on the keys),
/// at least 32 random bytes. Changing it starts every credential's budget afresh (the old
/// keys expire on their own). The secret is never printed (`Debug` shows
/// `CredentialSecret(..)`).
///
/// ```
/// use ratekeeper_tower::key::{CredentialSecret, HeaderKey};
///
/// let secret = CredentialSecret::new(b"0123456789abcdef0123456789abcdef").unwrap();
/// let per_token = HeaderKey::raw("Authorization").credential_secret(secret);
/// # let _ = per_token;
/// ```
#[derive(Clone)]
pub struct CredentialSecret {
    /// The HMAC state after the key block: cloned per digest, so each costs the message's
    /// blocks and the outer block, not the key's.
    mac: Hmac<Sha256>,
}

impl CredentialSecret {
    /// A secret from its bytes; `None` for an empty one.
    pub fn new(secret: impl AsRef<[u8]>) -> Option<Self> {
        let secret = secret.as_ref();
        if secret.is_empty() {
            return None;
        }
        // HMAC takes a key of any length (RFC 2104 §2), so this cannot fail.
        Hmac::<Sha256>::new_from_slice(secret)
            .ok()
            .map(|mac| Self { mac })
    }

    /// The secret in [`CREDENTIAL_SECRET_ENV`] (`RATEKEEPER_CREDENTIAL_SECRET`), its bytes as
    /// they are; `None` when it is unset, empty or not valid Unicode.
    pub fn from_env() -> Option<Self> {
        std::env::var(CREDENTIAL_SECRET_ENV)
            .ok()
            .and_then(|s| Self::new(s.trim()))
    }
}

impl fmt::Debug for CredentialSecret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("CredentialSecret(..)")
    }
}

/// The key of a credential: `hmac-sha256·<64 hex digits>` under `secret`, else
/// `sha256·<64 hex digits>` (lower-case hex). `·` (U+00B7) is not visible ASCII, so no
/// header value read as text equals a digest key.
pub(super) fn digest_key(secret: Option<&CredentialSecret>, value: &str) -> Key {
    let (prefix, bytes): (&str, [u8; 32]) = match secret {
        Some(secret) => {
            let mut mac = secret.mac.clone();
            mac.update(value.as_bytes());
            ("hmac-sha256\u{b7}", mac.finalize().into_bytes().into())
        }
        None => ("sha256\u{b7}", Sha256::digest(value.as_bytes()).into()),
    };
    let mut text = String::with_capacity(prefix.len() + 64);
    text.push_str(prefix);
    for b in bytes {
        // Writing to a String cannot fail.
        let _ = write!(text, "{b:02x}");
    }
    Key::from(text)
}

/// Whether `name` (lower case) carries RFC 9110 §11 credentials (`auth-scheme` and
/// `token68` or auth parameters): `authorization` and `proxy-authorization`.
pub(super) fn is_authorization(name: &str) -> bool {
    name == "authorization" || name == "proxy-authorization"
}

/// The normal form of an `Authorization` value (RFC 9110 §11.4,
/// `credentials = auth-scheme [ 1*SP ( token68 / #auth-param ) ]`): the scheme in lower
/// case (it is case-insensitive), one space, then the `token68` as sent (it is
/// case-sensitive) or the auth parameters as `name="value"` pairs (names in lower case,
/// values unquoted and requoted) joined by `,`. Runs of spaces and tabs anywhere the
/// grammar allows whitespace count as one. `None` when the value does not follow the
/// grammar or carries no credentials (a scheme alone).
pub(super) fn normalize_authorization(value: &str) -> Option<String> {
    let value = value.trim_matches([' ', '\t']);
    let split = value.find([' ', '\t'])?;
    let (scheme, rest) = value.split_at(split);
    if !is_token(scheme) {
        return None;
    }
    let rest = rest.trim_start_matches([' ', '\t']);
    if rest.is_empty() {
        return None;
    }
    let mut out = String::with_capacity(value.len());
    out.push_str(&scheme.to_ascii_lowercase());
    out.push(' ');
    if is_token68(rest) {
        out.push_str(rest);
        return Some(out);
    }
    auth_params(rest, &mut out)?;
    Some(out)
}

/// `tchar` (RFC 9110 §5.6.2).
fn is_tchar(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

fn is_token(s: &str) -> bool {
    !s.is_empty() && s.bytes().all(is_tchar)
}

/// `token68 = 1*( ALPHA / DIGIT / "-" / "." / "_" / "~" / "+" / "/" ) *"="`.
fn is_token68(s: &str) -> bool {
    let body = s.trim_end_matches('=');
    !body.is_empty()
        && body
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-._~+/".contains(&b))
}

/// `#auth-param` (`auth-param = token BWS "=" BWS ( token / quoted-string )`, list
/// elements separated by `OWS "," OWS`, empty elements allowed) appended to `out` in normal
/// form; `None` on a syntax error or an empty list.
fn auth_params(mut rest: &str, out: &mut String) -> Option<()> {
    let ows = |s: &str| s.trim_start_matches([' ', '\t']).len();
    let mut first = true;
    loop {
        rest = rest.trim_start_matches([' ', '\t', ',']);
        if rest.is_empty() {
            return (!first).then_some(());
        }
        let name_end = rest
            .bytes()
            .position(|b| !is_tchar(b))
            .unwrap_or(rest.len());
        let (name, after) = rest.split_at(name_end);
        if name.is_empty() {
            return None;
        }
        let after = &after[after.len() - ows(after)..];
        let after = after.strip_prefix('=')?;
        let after = &after[after.len() - ows(after)..];
        if !first {
            out.push(',');
        }
        first = false;
        out.push_str(&name.to_ascii_lowercase());
        out.push_str("=\"");
        rest = if let Some(quoted) = after.strip_prefix('"') {
            let mut chars = quoted.char_indices();
            let mut end = None;
            while let Some((i, c)) = chars.next() {
                match c {
                    '"' => {
                        end = Some(i + 1);
                        break;
                    }
                    '\\' => {
                        let (_, escaped) = chars.next()?;
                        push_quoted(out, escaped);
                    }
                    c => push_quoted(out, c),
                }
            }
            &quoted[end?..]
        } else {
            let end = after
                .bytes()
                .position(|b| !is_tchar(b))
                .unwrap_or(after.len());
            if end == 0 {
                return None;
            }
            for c in after[..end].chars() {
                push_quoted(out, c);
            }
            &after[end..]
        };
        out.push('"');
        // After a value: OWS, then a comma or the end.
        let trimmed = rest.trim_start_matches([' ', '\t']);
        if !trimmed.is_empty() && !trimmed.starts_with(',') {
            return None;
        }
        rest = trimmed;
    }
}

/// `c` inside a quoted-string, escaped when it must be.
fn push_quoted(out: &mut String, c: char) {
    if c == '"' || c == '\\' {
        out.push('\\');
    }
    out.push(c);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schemes_and_whitespace_normalise() {
        let n = |v: &str| normalize_authorization(v);
        let one = n("Bearer abc");
        assert_eq!(one.as_deref(), Some("bearer abc"));
        for v in [
            "bearer abc",
            "Bearer  abc",
            "BEARER abc",
            "Bearer\tabc",
            " Bearer abc ",
        ] {
            assert_eq!(n(v), one, "{v:?}");
        }
        // token68 is case-sensitive, padding kept.
        assert_eq!(
            n("Basic QWxhZGRpbjpvcGVu").as_deref(),
            Some("basic QWxhZGRpbjpvcGVu")
        );
        assert_ne!(n("Bearer ABC"), one);
        assert_eq!(n("Bearer abc==").as_deref(), Some("bearer abc=="));
    }

    #[test]
    fn auth_params_normalise() {
        let a = normalize_authorization(r#"Digest username="Mufasa", realm=testrealm"#);
        let b = normalize_authorization(r#"digest  Username = "Mufasa" ,realm="testrealm""#);
        assert_eq!(
            a.as_deref(),
            Some(r#"digest username="Mufasa",realm="testrealm""#)
        );
        assert_eq!(a, b);
        assert_eq!(
            normalize_authorization(r#"X q="a\"b\\c""#).as_deref(),
            Some(r#"x q="a\"b\\c""#)
        );
    }

    #[test]
    fn malformed_or_empty_credentials_are_refused() {
        for v in [
            "",
            "Bearer",
            "Bearer   ",
            "Bearer a b",
            "Bearer =abc",
            "Bear\u{e9}r abc",
            r#"X q="open"#,
            "X q= ,",
            "(x) abc",
        ] {
            assert_eq!(normalize_authorization(v), None, "{v:?}");
        }
    }

    #[test]
    fn digests_are_keyed_by_the_secret() {
        let plain = digest_key(None, "abc");
        let a = CredentialSecret::new("secret-a").unwrap();
        let b = CredentialSecret::new("secret-b").unwrap();
        let ka = digest_key(Some(&a), "abc");
        assert_ne!(ka, plain);
        assert_ne!(ka, digest_key(Some(&b), "abc"));
        assert_eq!(ka, digest_key(Some(&a.clone()), "abc"));
        // RFC 4231 test case 2 (key "Jefe").
        let jefe = CredentialSecret::new("Jefe").unwrap();
        assert_eq!(
            digest_key(Some(&jefe), "what do ya want for nothing?"),
            Key::from(
                "hmac-sha256\u{b7}5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
            )
        );
        assert!(CredentialSecret::new("").is_none());
        assert_eq!(format!("{a:?}"), "CredentialSecret(..)");
    }
}
