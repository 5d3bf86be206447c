//! The response body of this crate's services: the inner service's own body, or one
//! the layer wrote (a problem, a replayed response), so the inner body type needs no
//! `From<String>` or `From<Bytes>` (the shape of tower-http's `limit::ResponseBody`).

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::HeaderMap;
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;

/// The error bound of the bodies the layers read (as `http_body_util`'s `BoxError`).
pub(crate) type BoxError = Box<dyn std::error::Error + Send + Sync>;

pin_project! {
    /// Response body of the services in this crate.
    ///
    /// Behavior: either the inner service's body, passed through frame by frame (after
    /// any part the layer already read from it), or a complete body the layer wrote
    /// itself (a problem+json rejection, a replayed response). It is an
    /// [`http_body::Body`] with `Data = Bytes` and the inner body's error type, so axum
    /// and hyper serve it as is.
    pub struct ResponseBody<B> {
        #[pin]
        kind: Kind<B>,
    }
}

pin_project! {
    #[project = KindProj]
    enum Kind<B> {
        Full {
            data: Option<Bytes>,
            trailers: Option<HeaderMap>,
        },
        Inner {
            #[pin]
            body: B,
        },
        // What the layer read of the inner body, then the rest of it (boxed: the layer
        // read it through a pin of its own).
        Resumed {
            read: Option<Bytes>,
            rest: Pin<Box<B>>,
        },
    }
}

impl<B> ResponseBody<B> {
    /// The inner service's body, untouched.
    pub(crate) fn inner(body: B) -> Self {
        Self {
            kind: Kind::Inner { body },
        }
    }

    /// `read` (what was already taken from `rest`), then the rest of the inner body.
    pub(crate) fn resumed(read: Bytes, rest: Pin<Box<B>>) -> Self {
        Self {
            kind: Kind::Resumed {
                read: (!read.is_empty()).then_some(read),
                rest,
            },
        }
    }

    /// A complete body the layer wrote.
    pub(crate) fn full(data: Bytes) -> Self {
        Self::with_trailers(data, None)
    }

    /// A complete body the layer wrote, `trailers` after its data.
    pub(crate) fn with_trailers(data: Bytes, trailers: Option<HeaderMap>) -> Self {
        Self {
            kind: Kind::Full {
                data: (!data.is_empty()).then_some(data),
                trailers,
            },
        }
    }
}

impl<B> From<String> for ResponseBody<B> {
    fn from(text: String) -> Self {
        Self::full(Bytes::from(text))
    }
}

impl<B> From<Bytes> for ResponseBody<B> {
    fn from(data: Bytes) -> Self {
        Self::full(data)
    }
}

impl<B> std::fmt::Debug for ResponseBody<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kind = match &self.kind {
            Kind::Full { .. } => "Full",
            Kind::Inner { .. } => "Inner",
            Kind::Resumed { .. } => "Resumed",
        };
        f.debug_struct("ResponseBody")
            .field("kind", &kind)
            .finish_non_exhaustive()
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
            KindProj::Full { data, trailers } => Poll::Ready(
                data.take()
                    .map(Frame::data)
                    .or_else(|| trailers.take().map(Frame::trailers))
                    .map(Ok),
            ),
            KindProj::Inner { body } => body.poll_frame(cx),
            KindProj::Resumed { read, rest } => match read.take() {
                Some(d) => Poll::Ready(Some(Ok(Frame::data(d)))),
                None => rest.as_mut().poll_frame(cx),
            },
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.kind {
            Kind::Full { data, trailers } => data.is_none() && trailers.is_none(),
            Kind::Inner { body } => body.is_end_stream(),
            Kind::Resumed { read, rest } => read.is_none() && rest.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.kind {
            Kind::Full { data, trailers } => {
                let len = data.as_ref().map_or(0, |d| d.len() as u64);
                // An exact size is sent as `content-length`, which has no room for
                // trailers (HTTP/1.1 sends them only after a chunked body).
                if trailers.is_some() {
                    let mut hint = SizeHint::new();
                    hint.set_lower(len);
                    hint
                } else {
                    SizeHint::with_exact(len)
                }
            }
            Kind::Inner { body } => body.size_hint(),
            Kind::Resumed { read, rest } => {
                let already = read.as_ref().map_or(0, |d| d.len() as u64);
                let rest = rest.size_hint();
                let mut hint = SizeHint::new();
                hint.set_lower(rest.lower().saturating_add(already));
                if let Some(upper) = rest.upper() {
                    hint.set_upper(upper.saturating_add(already));
                }
                hint
            }
        }
    }
}
