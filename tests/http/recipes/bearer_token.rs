use std::num::NonZeroU32;

use axum::Router;
use ratekeeper_axum::key::{HeaderKey, PeerIp};
use ratekeeper_axum::{BuildError, RateLimitLayer, core::Policy, core::Quota};

/// Limits `app` to 100 requests per minute per API token: the `Authorization` header's
/// credential (`Bearer <token>`, a JWT of any length; the scheme in any case and extra spaces
/// are one credential), or the client IP for a request without one.
///
/// The store holds `(authorization,hmac-sha256·<64 hex digits>)`: the HMAC-SHA256 of the
/// credential under the secret in `RATEKEEPER_CREDENTIAL_SECRET` (plain SHA-256,
/// `sha256·…`, when it is unset), never the token, whatever its length.
///
/// Add your authentication layer *after* this call, so that it runs first and refuses unknown
/// tokens: otherwise every made-up token would get a budget of its own.
pub fn limit_by_token(app: Router) -> Result<Router, BuildError> {
    let per_token = RateLimitLayer::builder()
        .policy(Policy::new(
            "per-token",
            Quota::per_minute(NonZeroU32::new(100).unwrap_or(NonZeroU32::MIN)),
        ))
        .key(HeaderKey::raw("Authorization").or(PeerIp::new()))
        .build()?;
    Ok(app.layer(per_token))
}
