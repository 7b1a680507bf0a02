//! [`UserKey`]: the authenticated principal an auth layer put in request extensions.

use std::fmt;
use std::marker::PhantomData;

use http::Request;
use ratekeeper_core::Key;

use super::{KeyError, KeyExtractor};

/// Keys by a value of type `T` that an authentication layer (running **before** the limiter)
/// inserted into the request extensions; [`KeyError::Missing`] when there is none, so
/// `.or(PeerIp::new())` limits anonymous requests by IP.
///
/// `T` is whatever the auth layer inserts; `to_key` turns it into a [`Key`].
///
/// # Example
///
/// ```
/// use axum::http::Request;
/// use ratekeeper_core::Key;
/// use ratekeeper_tower::key::{KeyExtractor, UserKey};
///
/// #[derive(Clone)]
/// struct User { id: u64 }
///
/// let user = UserKey::new(|u: &User| Key::from(format!("user:{}", u.id)));
/// let mut req = Request::new(());
/// assert!(user.extract(&req).unwrap_err().is_missing());
/// req.extensions_mut().insert(User { id: 7 });
/// assert_eq!(user.extract(&req).unwrap().to_string(), "user:7");
/// ```
pub struct UserKey<T, F> {
    to_key: F,
    _user: PhantomData<fn(&T)>,
}

impl<T, F> UserKey<T, F>
where
    F: Fn(&T) -> Key,
{
    /// Reads a `T` from the request extensions and keys it with `to_key`.
    pub fn new(to_key: F) -> Self {
        Self {
            to_key,
            _user: PhantomData,
        }
    }
}

impl<T, F: Clone> Clone for UserKey<T, F> {
    fn clone(&self) -> Self {
        Self {
            to_key: self.to_key.clone(),
            _user: PhantomData,
        }
    }
}

impl<T, F> fmt::Debug for UserKey<T, F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("UserKey")
            .field("type", &std::any::type_name::<T>())
            .finish_non_exhaustive()
    }
}

impl<T, F> KeyExtractor for UserKey<T, F>
where
    T: Clone + Send + Sync + 'static,
    F: Fn(&T) -> Key + Send + Sync + 'static,
{
    fn extract<B>(&self, req: &Request<B>) -> Result<Key, KeyError> {
        req.extensions()
            .get::<T>()
            .map(|user| (self.to_key)(user))
            .ok_or(KeyError::Missing(
                "no authenticated user in request extensions",
            ))
    }
}
