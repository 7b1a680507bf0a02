//! The response body of a rate-limited service: the inner service's body, or a body the
//! layer wrote itself (a 429 problem+json document). A body whose cost is settled as it
//! streams (see [`usage`](crate::usage)) carries that settlement until it ends or is dropped.

use std::pin::Pin;
use std::task::{Context, Poll, ready};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;

use crate::usage::{BodyEvent, Metered};

pin_project! {
    /// The inner service's body, or a complete body written by the layer.
    #[derive(Debug)]
    pub struct ResponseBody<B> {
        #[pin]
        kind: Kind<B>,
    }
}

pin_project! {
    #[project = KindProj]
    #[derive(Debug)]
    enum Kind<B> {
        Inner { #[pin] body: B },
        Full { data: Option<Bytes> },
        // The inner service's body, counted for a charge settled when it ends.
        Metered { #[pin] body: B, meter: Box<Metered> },
    }
}

impl<B> ResponseBody<B> {
    /// Wraps the inner service's body.
    pub fn inner(body: B) -> Self {
        Self {
            kind: Kind::Inner { body },
        }
    }

    /// The inner service's body, counted until it ends for the charges `meter` settles.
    pub(crate) fn metered(body: B, meter: Box<Metered>) -> Self {
        Self {
            kind: Kind::Metered { body, meter },
        }
    }

    /// The inner service's body, or (`Err`) the complete body the layer wrote. Lets a
    /// framework with one body type unwrap instead of boxing again (for axum, the `From`
    /// impl below does this).
    ///
    /// A body whose true cost is counted as it streams ([`Usage::trailer`] or
    /// [`Usage::body`]) is no longer counted once unwrapped: its charges keep their
    /// estimates.
    ///
    /// [`Usage::trailer`]: crate::usage::Usage::trailer
    /// [`Usage::body`]: crate::usage::Usage::body
    pub fn into_inner(self) -> Result<B, Bytes> {
        match self.kind {
            Kind::Inner { body } => Ok(body),
            Kind::Full { data } => Err(data.unwrap_or_default()),
            Kind::Metered { body, mut meter } => {
                meter.keep_estimates();
                Ok(body)
            }
        }
    }

    /// Whether the body is counted for a charge settled when it ends (see
    /// [`usage`](crate::usage)): unwrapping it with [`ResponseBody::into_inner`] would stop
    /// the count.
    pub fn is_metered(&self) -> bool {
        matches!(self.kind, Kind::Metered { .. })
    }

    /// A complete body (empty when `data` is empty).
    pub fn full(data: Bytes) -> Self {
        Self {
            kind: Kind::Full {
                data: (!data.is_empty()).then_some(data),
            },
        }
    }
}

impl<B> Body for ResponseBody<B>
where
    B: Body<Data = Bytes>,
{
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        match self.project().kind.project() {
            KindProj::Inner { body } => body.poll_frame(cx),
            KindProj::Full { data } => Poll::Ready(data.take().map(|d| Ok(Frame::data(d)))),
            KindProj::Metered { mut body, meter } => {
                let frame = ready!(body.as_mut().poll_frame(cx));
                match &frame {
                    Some(Ok(frame)) => {
                        if let Some(data) = frame.data_ref() {
                            meter.data(data);
                        } else if let Some(trailers) = frame.trailers_ref() {
                            meter.trailers(trailers);
                        }
                        // A consumer may stop polling (and drop the body) once it says it
                        // ended: that is its end, not a drop.
                        if body.is_end_stream() {
                            meter.finish(BodyEvent::End);
                        }
                    }
                    Some(Err(_)) => meter.finish(BodyEvent::Error),
                    None => meter.finish(BodyEvent::End),
                }
                Poll::Ready(frame)
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.kind {
            Kind::Inner { body } => body.is_end_stream(),
            Kind::Full { data } => data.is_none(),
            Kind::Metered { body, .. } => body.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.kind {
            Kind::Inner { body } => body.size_hint(),
            Kind::Full { data } => {
                SizeHint::with_exact(data.as_ref().map_or(0, |d| d.len() as u64))
            }
            Kind::Metered { body, .. } => body.size_hint(),
        }
    }
}

/// axum's body without a second box: the inner body as it was, or the layer's bytes.
/// `Body::new` would box the wrapper; use this when a whole `Router` is wrapped and served
/// with `axum::serve`, which wants axum's body:
/// `svc.map_response(|res| res.map(axum::body::Body::from))`. A body counted for a charge
/// settled when it ends ([`ResponseBody::is_metered`]) is boxed, so the count goes on.
#[cfg(feature = "axum")]
impl From<ResponseBody<axum::body::Body>> for axum::body::Body {
    fn from(body: ResponseBody<axum::body::Body>) -> Self {
        if body.is_metered() {
            return axum::body::Body::new(body);
        }
        body.into_inner().unwrap_or_else(axum::body::Body::from)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn into_inner_gives_back_the_inner_body_or_the_layer_bytes() {
        let inner = ResponseBody::inner(String::from("handler"));
        assert_eq!(inner.into_inner(), Ok(String::from("handler")));
        let full = ResponseBody::<String>::full(Bytes::from_static(b"{\"status\":429}"));
        assert_eq!(
            full.into_inner(),
            Err(Bytes::from_static(b"{\"status\":429}"))
        );
        let empty = ResponseBody::<String>::full(Bytes::new());
        assert_eq!(empty.into_inner(), Err(Bytes::new()));
    }

    #[cfg(feature = "axum")]
    #[tokio::test]
    async fn axum_body_from_the_layer_body_keeps_the_bytes() {
        let body = axum::body::Body::from(ResponseBody::<axum::body::Body>::full(
            Bytes::from_static(b"limited"),
        ));
        let bytes = axum::body::to_bytes(body, 64).await.unwrap();
        assert_eq!(&bytes[..], b"limited");
        let body = axum::body::Body::from(ResponseBody::inner(axum::body::Body::from("ok")));
        let bytes = axum::body::to_bytes(body, 64).await.unwrap();
        assert_eq!(&bytes[..], b"ok");
    }
}
