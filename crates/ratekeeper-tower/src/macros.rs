//! Crate-private macros.

/// The `get_ref`, `get_mut` and `into_inner` accessors of a middleware service whose inner
/// service is the field `inner` of type `S`, written once for every service of the crate.
///
/// Expand it inside `impl<S, ...> Service<S, ...> { ... }`. Each accessor takes optional extra
/// doc attributes (an example, say), appended to its one-line summary:
///
/// ```text
/// define_inner_service_accessors!();
/// define_inner_service_accessors! {
///     get_ref: [/// ... example ...]
///     get_mut: []
///     into_inner: []
/// }
/// ```
macro_rules! define_inner_service_accessors {
    () => {
        define_inner_service_accessors! {
            get_ref: []
            get_mut: []
            into_inner: []
        }
    };
    (
        get_ref: [$(#[$get_ref:meta])*]
        get_mut: [$(#[$get_mut:meta])*]
        into_inner: [$(#[$into_inner:meta])*]
    ) => {
        /// The inner service.
        $(#[$get_ref])*
        pub fn get_ref(&self) -> &S {
            &self.inner
        }

        /// The inner service, mutably.
        $(#[$get_mut])*
        pub fn get_mut(&mut self) -> &mut S {
            &mut self.inner
        }

        /// The inner service, consuming this one.
        $(#[$into_inner])*
        pub fn into_inner(self) -> S {
            self.inner
        }
    };
}
