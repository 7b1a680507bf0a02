//! [`ConfigResolver`]: the route table and tiers of a configuration.

use http::Request;
use ratekeeper_core::Policy;

use super::schema::TiersConfig;
use crate::error::BuildError;
use crate::policy::{Plan, Resolve};
use crate::route::RouteTable;

/// The resolver of a configured layer: the route table, then the tiers.
#[derive(Debug, Clone)]
pub struct ConfigResolver {
    pub(super) routes: RouteTable,
    pub(super) tiers: Option<TiersConfig>,
}

impl ConfigResolver {
    /// Whether `policy` is one of the tiers' policies.
    fn tiered(&self, policy: &str) -> bool {
        self.tiers
            .as_ref()
            .is_some_and(|t| t.default == policy || t.values.values().any(|p| p == policy))
    }
}

impl Resolve for ConfigResolver {
    fn resolve<B>(&self, req: &Request<B>, plan: &mut Plan<'_>) {
        self.routes.resolve(req, plan);
        let Some(tiers) = &self.tiers else { return };
        let chosen = req
            .headers()
            .get(&tiers.header.0)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| tiers.values.get(v))
            .unwrap_or(&tiers.default);
        let names = plan.names();
        plan.retain(|index| {
            names
                .get(index as usize)
                .is_none_or(|name| !self.tiered(name) || **name == **chosen)
        });
    }

    fn check(&self, policies: &[Policy]) -> Result<(), BuildError> {
        self.routes.check(policies)?;
        if let Some(tiers) = &self.tiers {
            for name in std::iter::once(&tiers.default).chain(tiers.values.values()) {
                if !policies.iter().any(|p| p.name() == name) {
                    return Err(BuildError::UnknownPolicy(name.clone()));
                }
            }
        }
        Ok(())
    }
}
