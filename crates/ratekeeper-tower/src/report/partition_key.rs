//! The `pk` (partition key) parameter of the IETF fields.

use std::fmt;
use std::sync::Arc;

use base64::Engine as _;
use ratekeeper_core::Key;
use sha2::{Digest, Sha256};

/// Adds the `pk` (partition key) parameter to the IETF fields.
///
/// The value is the first 16 bytes of `SHA-256(salt || 0x00 || key)` (FIPS 180-4, via the
/// RustCrypto `sha2` crate), written as a Byte Sequence (RFC 9651 §3.3.5, base64 between
/// colons). The raw key (an IP address, an API key) never appears. Use a secret salt: an
/// unsalted hash of an IPv4 address can be reversed by trying all 2^32 addresses. Servers
/// that share a budget should share the salt so clients see one `pk`.
///
/// ```
/// use ratekeeper_core::Key;
/// use ratekeeper_tower::report::PartitionKey;
///
/// let pk = PartitionKey::salted("s3cret");
/// let value = pk.param(&Key::from("198.51.100.7"));
/// assert!(value.starts_with(':') && value.ends_with(':'));
/// assert!(!value.contains("198.51"));
/// assert_eq!(value, pk.param(&Key::from("198.51.100.7")));
/// assert_ne!(value, pk.param(&Key::from("198.51.100.8")));
/// ```
#[derive(Clone)]
pub struct PartitionKey {
    salt: Arc<[u8]>,
}

impl PartitionKey {
    /// Hashes keys with `salt`.
    pub fn salted(salt: impl AsRef<[u8]>) -> Self {
        Self {
            salt: Arc::from(salt.as_ref()),
        }
    }

    /// The Structured Field Byte Sequence for `key`: `:<base64 of 16 bytes>:`.
    pub fn param(&self, key: &Key) -> String {
        let mut hasher = Sha256::new();
        hasher.update(&self.salt);
        hasher.update([0u8]);
        hasher.update(key.to_string().as_bytes());
        let digest = hasher.finalize();
        let mut out = String::with_capacity(26);
        out.push(':');
        base64::engine::general_purpose::STANDARD
            .encode_string(digest.get(..16).unwrap_or(&[]), &mut out);
        out.push(':');
        out
    }
}

impl fmt::Debug for PartitionKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PartitionKey").finish_non_exhaustive()
    }
}
