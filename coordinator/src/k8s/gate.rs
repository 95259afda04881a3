//! The Kubernetes client's write gate: a layer of the client's own service stack that
//! refuses every request but a read (`GET`) while this coordinator may not act, before the
//! request leaves the process.
//!
//! With several coordinators (issue 31) the store fences every write of a deposed leader by
//! its epoch, and gateways and agents refuse its fencing token; the Kubernetes API has no
//! such token. So each write asks the election's role at the moment it is sent
//! ([`crate::ha::RoleHandle::is_leading`], by the monotonic clock): a leader paused past its
//! lease that wakes in the middle of a drain or a release sends nothing more. What is left is
//! a pause between this check and the request reaching the API server (microseconds of this
//! process, then the network), which no client-side check can close.

use std::sync::Arc;
use std::task::{Context, Poll};

use futures::future::BoxFuture;
use http::{Method, Request};

/// Says why writes must not be sent now (`None`: they may).
pub type Refuse = Arc<dyn Fn() -> Option<String> + Send + Sync>;

/// The layer: wraps the client's service in [`Gated`].
#[derive(Clone)]
pub struct WriteGate {
    refuse: Refuse,
}

impl WriteGate {
    /// A gate asking `refuse` at each write.
    pub fn new(refuse: Refuse) -> Self {
        Self { refuse }
    }

    /// The gate of a coordinator's role: writes go only while it leads.
    pub fn leading(role: Arc<crate::ha::RoleHandle>) -> Self {
        Self::new(Arc::new(move || {
            (!role.is_leading()).then(|| {
                format!(
                    "this coordinator does not lead ({}): a Kubernetes write is not sent",
                    role.current().name()
                )
            })
        }))
    }
}

impl<S> tower::Layer<S> for WriteGate {
    type Service = Gated<S>;

    fn layer(&self, inner: S) -> Gated<S> {
        Gated {
            inner,
            refuse: self.refuse.clone(),
        }
    }
}

/// The client's service behind the gate.
pub struct Gated<S> {
    inner: S,
    refuse: Refuse,
}

/// A write refused by the gate.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct NotLeading(pub String);

impl<S, B> tower::Service<Request<B>> for Gated<S>
where
    S: tower::Service<Request<B>>,
    S::Response: Send + 'static,
    S::Error: Into<tower::BoxError>,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = tower::BoxError;
    type Future = BoxFuture<'static, Result<S::Response, tower::BoxError>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        if req.method() != Method::GET
            && let Some(why) = (self.refuse)()
        {
            tracing::warn!(method = %req.method(), path = req.uri().path(), reason = %why, "Kubernetes write refused before it was sent");
            return Box::pin(std::future::ready(Err(NotLeading(why).into())));
        }
        let fut = self.inner.call(req);
        Box::pin(async move { fut.await.map_err(Into::into) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, Ordering};
    use tower::{Layer, Service};

    /// A service that answers every request with its method.
    struct Echo;

    impl tower::Service<Request<()>> for Echo {
        type Response = String;
        type Error = std::convert::Infallible;
        type Future = std::future::Ready<Result<String, std::convert::Infallible>>;

        fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
            Poll::Ready(Ok(()))
        }

        fn call(&mut self, req: Request<()>) -> Self::Future {
            std::future::ready(Ok(req.method().to_string()))
        }
    }

    #[tokio::test]
    async fn reads_always_pass_and_writes_only_while_the_gate_is_open() {
        let closed = Arc::new(AtomicBool::new(false));
        let gate = WriteGate::new(Arc::new({
            let closed = closed.clone();
            move || {
                closed
                    .load(Ordering::Relaxed)
                    .then(|| "deposed".to_string())
            }
        }));
        let mut svc = gate.layer(Echo);
        let req = |m: Method| Request::builder().method(m).body(()).unwrap();
        assert_eq!(svc.call(req(Method::PATCH)).await.unwrap(), "PATCH");
        closed.store(true, Ordering::Relaxed);
        assert_eq!(svc.call(req(Method::GET)).await.unwrap(), "GET");
        for m in [Method::PATCH, Method::POST, Method::DELETE, Method::PUT] {
            let e = svc.call(req(m)).await.unwrap_err();
            assert_eq!(e.to_string(), "deposed");
        }
    }
}
