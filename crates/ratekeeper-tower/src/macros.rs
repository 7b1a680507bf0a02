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

/// The public response future and body of a concurrency limiter: `$future<F>` over a
/// [`HeldFuture`](crate::held::HeldFuture) whose admission is `$admission`, answering
/// `$body<B>` over a [`HeldBody`](crate::held::HeldBody), so that each limiter exports its
/// own names for the one implementation in [`held`](crate::held).
///
/// ```text
/// define_held_response! {
///     /// Response future of ...
///     pub struct ResponseFuture;
///     /// The response body of ...
///     pub struct SomeBody;
///     admission: Admitted;
/// }
/// ```
///
/// The future gets `pub(crate) fn new(HeldFuture<F, $admission>)`; the body a `Debug` that
/// says whether it still holds its permit.
macro_rules! define_held_response {
    (
        $(#[$future_meta:meta])*
        pub struct $future:ident;
        $(#[$body_meta:meta])*
        pub struct $body:ident;
        admission: $admission:ty;
    ) => {
        pin_project_lite::pin_project! {
            $(#[$future_meta])*
            pub struct $future<F> {
                #[pin]
                inner: $crate::held::HeldFuture<F, $admission>,
            }
        }

        impl<F> $future<F> {
            pub(crate) fn new(inner: $crate::held::HeldFuture<F, $admission>) -> Self {
                Self { inner }
            }
        }

        impl<F, B, E> std::future::Future for $future<F>
        where
            F: std::future::Future<Output = Result<http::Response<B>, E>>,
        {
            type Output = Result<http::Response<$body<B>>, E>;

            fn poll(
                self: std::pin::Pin<&mut Self>,
                cx: &mut std::task::Context<'_>,
            ) -> std::task::Poll<Self::Output> {
                let res = std::task::ready!(self.project().inner.poll(cx))?;
                std::task::Poll::Ready(Ok(res.map(|inner| $body { inner })))
            }
        }

        pin_project_lite::pin_project! {
            $(#[$body_meta])*
            pub struct $body<B> {
                #[pin]
                inner: $crate::held::HeldBody<
                    B,
                    <$admission as $crate::held::Admission>::Permit,
                >,
            }
        }

        impl<B> std::fmt::Debug for $body<B> {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.debug_struct(stringify!($body))
                    .field("holds_permit", &self.inner.holds_permit())
                    .finish_non_exhaustive()
            }
        }

        impl<B> http_body::Body for $body<B>
        where
            B: http_body::Body<Data = bytes::Bytes>,
        {
            type Data = bytes::Bytes;
            type Error = B::Error;

            #[inline]
            fn poll_frame(
                self: std::pin::Pin<&mut Self>,
                cx: &mut std::task::Context<'_>,
            ) -> std::task::Poll<Option<Result<http_body::Frame<bytes::Bytes>, B::Error>>> {
                self.project().inner.poll_frame(cx)
            }

            #[inline]
            fn is_end_stream(&self) -> bool {
                http_body::Body::is_end_stream(&self.inner)
            }

            #[inline]
            fn size_hint(&self) -> http_body::SizeHint {
                http_body::Body::size_hint(&self.inner)
            }
        }
    };
}
