//! A response body that ends its lease when the last byte has passed.
//!
//! The lease is held while the body streams, so concurrency caps count whole exchanges, and the
//! outcome is recorded when the exchange is really over: `reset` when the upstream broke off,
//! `cancelled` when the client went away.
//!
//! The outcome goes to the exchange's own lease, or — for a request relayed inside an inspected
//! tunnel, which shares the tunnel's lease — to an [`Exchange`] of that lease.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;
use pin_project_lite::pin_project;

use crate::health::classify::Sniffer;
use crate::outcome::Outcome;
use crate::pool::lease::{Exchange, Lease};

pin_project! {
    pub struct Observed<B = Incoming> {
        #[pin]
        inner: B,
        lease: Option<Ending>,
        outcome: Outcome,
        sniffer: Option<Sniffer>,
    }
}

/// Who hears how the exchange ended.
pub enum Ending {
    /// The exchange's own lease, released with the outcome.
    Lease(Lease),
    /// One exchange of a shared lease (an inspected tunnel).
    Exchange(Exchange),
}

impl Ending {
    fn finish(self, outcome: Outcome) {
        match self {
            Ending::Lease(l) => l.finish(outcome),
            Ending::Exchange(x) => x.finish(outcome),
        }
    }
}

impl From<Lease> for Ending {
    fn from(l: Lease) -> Self {
        Ending::Lease(l)
    }
}

impl From<Exchange> for Ending {
    fn from(x: Exchange) -> Self {
        Ending::Exchange(x)
    }
}

impl<B: Body<Data = Bytes, Error = hyper::Error>> Observed<B> {
    /// Wraps `inner`; `outcome` is what the exchange counts as if the body completes, unless the
    /// `sniffer` finds a challenge page in it.
    pub fn new(
        inner: B,
        lease: impl Into<Ending>,
        outcome: Outcome,
        sniffer: Option<Sniffer>,
    ) -> Self {
        let mut lease = Some(lease.into());
        if inner.is_end_stream() {
            // No body (HEAD, 204, 304): hyper may never poll it, so the exchange is over now.
            if let Some(l) = lease.take() {
                l.finish(outcome);
            }
        }
        Observed {
            inner,
            lease,
            outcome,
            sniffer,
        }
    }
}

impl<B: Body<Data = Bytes, Error = hyper::Error>> Body for Observed<B> {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        let mut this = self.project();
        let polled = this.inner.as_mut().poll_frame(cx);
        if let (Poll::Ready(Some(Ok(frame))), Some(sniffer)) = (&polled, this.sniffer.as_mut()) {
            if let Some(data) = frame.data_ref() {
                if sniffer.feed(data) {
                    *this.outcome = Outcome::Captcha;
                }
            }
        }
        let end = match &polled {
            Poll::Ready(None) => Some(*this.outcome),
            Poll::Ready(Some(Err(_))) => Some(Outcome::Reset),
            Poll::Ready(Some(Ok(_))) if this.inner.is_end_stream() => Some(*this.outcome),
            _ => None,
        };
        if let Some(outcome) = end {
            if let Some(lease) = this.lease.take() {
                lease.finish(outcome);
            }
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
