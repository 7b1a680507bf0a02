//! [`ConfigKey`]: the key extractor a configuration names.

use http::Request;
use ratekeeper_core::Key;

use crate::key::{ForwardedIp, GlobalKey, HeaderKey, KeyError, KeyExtractor, PeerIp, Raw};

/// The key extractor of a configured layer.
#[derive(Debug, Clone)]
pub enum ConfigKey {
    /// [`PeerIp`].
    PeerIp(PeerIp),
    /// [`GlobalKey`].
    Global(GlobalKey),
    /// [`HeaderKey`] (raw value).
    Header(HeaderKey<Raw>),
    /// [`ForwardedIp`].
    Forwarded(ForwardedIp),
}

impl KeyExtractor for ConfigKey {
    #[inline]
    fn extract<B>(&self, req: &Request<B>) -> Result<Key, KeyError> {
        match self {
            Self::PeerIp(k) => k.extract(req),
            Self::Global(k) => k.extract(req),
            Self::Header(k) => k.extract(req),
            Self::Forwarded(k) => k.extract(req),
        }
    }

    fn keys_by_peer(&self) -> bool {
        matches!(self, Self::PeerIp(_))
    }

    fn trusted_proxies(&self) -> Option<&ForwardedIp> {
        match self {
            Self::Forwarded(k) => Some(k),
            Self::PeerIp(_) | Self::Global(_) | Self::Header(_) => None,
        }
    }

    fn describe(&self) -> String {
        match self {
            Self::PeerIp(k) => k.describe(),
            Self::Global(k) => k.describe(),
            Self::Header(k) => k.describe(),
            Self::Forwarded(k) => k.describe(),
        }
    }
}
