//! A tower layer that lets a replica decode and store at most
//! `api.max_recipient_calls` calls carrying recipient lists at once
//! (`SendMessage` and `AppendRecipients`). A batch of 25,000 recipients with
//! vars is ~2.7 MB on the wire and ~25 MB decoded: without a bound, callers
//! appending together decide the replica's memory. A call over the bound
//! waits here, before tonic decodes it, its body held back by HTTP/2 flow
//! control (a stream's window, not the whole request); its deadline runs
//! meanwhile. Other methods pass straight through.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use futures::future::Either;
use tokio::sync::Semaphore;
use tonic::body::Body;
use tower::{Layer, Service};

/// The methods whose requests carry recipient lists.
const RECIPIENT_METHODS: [&str; 2] =
    ["/notify.v1.MessageService/SendMessage", "/notify.v1.MessageService/AppendRecipients"];

/// Puts [`RecipientCalls`] around every service.
#[derive(Clone)]
pub struct RecipientCallsLayer {
    slots: Arc<Semaphore>,
}

impl RecipientCallsLayer {
    /// At most `slots` (at least one) recipient calls decoded at once.
    pub fn new(slots: usize) -> Self {
        Self { slots: Arc::new(Semaphore::new(slots.max(1))) }
    }
}

impl<S> Layer<S> for RecipientCallsLayer {
    type Service = RecipientCalls<S>;

    fn layer(&self, inner: S) -> Self::Service {
        RecipientCalls { inner, slots: self.slots.clone() }
    }
}

/// Holds a recipient call until a slot is free, then calls `inner` with
/// the slot held until the response.
#[derive(Clone)]
pub struct RecipientCalls<S> {
    inner: S,
    slots: Arc<Semaphore>,
}

type Held<F> = Pin<Box<dyn Future<Output = F> + Send>>;

impl<S> Service<http::Request<Body>> for RecipientCalls<S>
where
    S: Service<http::Request<Body>> + Clone + Send + 'static,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Either<S::Future, Held<Result<S::Response, S::Error>>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<Body>) -> Self::Future {
        if !RECIPIENT_METHODS.contains(&request.uri().path()) {
            return Either::Left(self.inner.call(request));
        }
        // The ready clone serves this call; a fresh clone waits for the next.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let slots = self.slots.clone();
        Either::Right(Box::pin(async move {
            let slot = match slots.clone().try_acquire_owned() {
                Ok(slot) => slot,
                Err(_) => {
                    // Counted while it waits, also when its caller gives up.
                    let _waiting = Waiting::new();
                    slots.acquire_owned().await.expect("the semaphore is never closed")
                }
            };
            let response = inner.call(request).await;
            drop(slot);
            response
        }))
    }
}

/// One call waiting for a slot, in `notify_recipient_calls_waiting` for as
/// long as it lives.
struct Waiting(metrics::Gauge);

impl Waiting {
    fn new() -> Self {
        let gauge = metrics::gauge!("notify_recipient_calls_waiting");
        gauge.increment(1.0);
        Self(gauge)
    }
}

impl Drop for Waiting {
    fn drop(&mut self) {
        self.0.decrement(1.0);
    }
}
