//! A key extractor that records every key it hands out, for tests that check which key a
//! request was charged to.

use std::sync::{Arc, Mutex, PoisonError};

use axum::http::Request;
use ratekeeper_axum::core::Key;
use ratekeeper_axum::key::{KeyError, KeyExtractor};

/// `inner`, recording each key it extracts (`Display` form) or its error (`"error: ..."`)
/// in a shared log, in request order. Made by [`recording`].
#[derive(Debug)]
pub struct Recording<K> {
    inner: K,
    log: Arc<Mutex<Vec<String>>>,
}

impl<K: KeyExtractor> KeyExtractor for Recording<K> {
    fn extract<B>(&self, req: &Request<B>) -> Result<Key, KeyError> {
        let key = self.inner.extract(req);
        let shown = key
            .as_ref()
            .map_or_else(|e| format!("error: {e}"), ToString::to_string);
        self.log
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(shown);
        key
    }
}

/// `inner` wrapped in a [`Recording`], and the log it writes to.
pub fn recording<K: KeyExtractor>(inner: K) -> (Arc<Mutex<Vec<String>>>, Recording<K>) {
    let log = Arc::new(Mutex::new(Vec::new()));
    let extractor = Recording {
        inner,
        log: Arc::clone(&log),
    };
    (log, extractor)
}
