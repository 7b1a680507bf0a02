use std::sync::Arc;

use axum::Router;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get};
use ratekeeper_axum::core::store::Store;
use ratekeeper_axum::rate_limit::{Admin, AdminError, PolicyState};
use ratekeeper_axum::{RateLimitLayer, core::Key};

/// The key the limiter uses for a customer (the API-key layer maps each key to it).
pub fn customer_key(customer: &str) -> Key {
    Key::from(format!("customer:{customer}"))
}

/// `GET /admin/limits/{customer}` shows a customer's usage under every policy (a peek: it
/// charges nothing); `DELETE /admin/limits/{customer}` resets all of them and
/// `DELETE /admin/limits/{customer}/{policy}` one. Every request needs
/// `Authorization: Bearer <admin_token>`, or gets 401 and touches nothing.
///
/// Merge it into the app *after* `.layer(limit)`, so admin calls are not rate limited.
pub fn admin_routes<K, C, St, R>(limit: &RateLimitLayer<K, C, St, R>, admin_token: &str) -> Router
where
    K: Send + Sync + 'static,
    C: Send + Sync + 'static,
    St: Store<Key>,
    R: Send + Sync + 'static,
{
    let state = AdminState {
        admin: limit.admin(),
        token: Arc::from(admin_token),
    };
    Router::new()
        .route("/admin/limits/{customer}", get(show).delete(reset_all))
        .route("/admin/limits/{customer}/{policy}", delete(reset_one))
        .with_state(state)
}

struct AdminState<St> {
    admin: Admin<St>,
    token: Arc<str>,
}

impl<St> Clone for AdminState<St> {
    fn clone(&self) -> Self {
        Self {
            admin: self.admin.clone(),
            token: Arc::clone(&self.token),
        }
    }
}

impl<St> AdminState<St> {
    /// Whether the request carries the admin token (compared in constant time).
    fn authorized(&self, headers: &HeaderMap) -> bool {
        let given = headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .unwrap_or_default();
        let expected = self.token.as_bytes();
        given.len() == expected.len()
            && !expected.is_empty()
            && given
                .bytes()
                .zip(expected)
                .fold(0, |acc, (a, b)| acc | (a ^ b))
                == 0
    }
}

async fn show<St: Store<Key>>(
    State(s): State<AdminState<St>>,
    headers: HeaderMap,
    Path(customer): Path<String>,
) -> Response {
    if !s.authorized(&headers) {
        return StatusCode::UNAUTHORIZED.into_response();
    }
    answer(s.admin.usage(&customer_key(&customer)).await)
}

async fn reset_all<St: Store<Key>>(
    State(s): State<AdminState<St>>,
    headers: HeaderMap,
    Path(customer): Path<String>,
) -> Response {
    if !s.authorized(&headers) {
        return StatusCode::UNAUTHORIZED.into_response();
    }
    answer(s.admin.reset_all(&customer_key(&customer)).await)
}

async fn reset_one<St: Store<Key>>(
    State(s): State<AdminState<St>>,
    headers: HeaderMap,
    Path((customer, policy)): Path<(String, String)>,
) -> Response {
    if !s.authorized(&headers) {
        return StatusCode::UNAUTHORIZED.into_response();
    }
    let after = s.admin.reset(&policy, &customer_key(&customer)).await;
    answer(after.map(|decision| vec![PolicyState::new(policy, decision)]))
}

/// The usage as JSON, one object per policy; an unknown policy is 404, a store that cannot
/// answer (Redis down) 503.
fn answer(usage: Result<Vec<PolicyState>, AdminError>) -> Response {
    match usage {
        Ok(usage) => {
            let rows: Vec<serde_json::Value> = usage
                .iter()
                .map(|u| {
                    serde_json::json!({
                        "policy": u.policy,
                        "limit": u.decision.limit(),
                        "remaining": u.decision.remaining(),
                        "reset_after_ms": u.decision.reset_after().as_millis(),
                    })
                })
                .collect();
            let body = serde_json::json!({ "policies": rows }).to_string();
            ([(header::CONTENT_TYPE, "application/json")], body).into_response()
        }
        Err(err) if err.is_unknown_policy() => StatusCode::NOT_FOUND.into_response(),
        Err(_) => StatusCode::SERVICE_UNAVAILABLE.into_response(),
    }
}
