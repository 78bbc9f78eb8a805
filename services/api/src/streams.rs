//! Caps on the long-lived streams one client may hold open on a replica
//! (`WatchMessage`, event subscriptions), so one client cannot take every
//! task and connection slot. While authentication is off (the client
//! `local`), there is no cap.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use notify_domain::Error;
use notify_domain::auth::{Client, LOCAL_CLIENT};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// Per-client stream slots of one kind.
#[derive(Clone)]
pub struct StreamPermits {
    kind: &'static str,
    per_client: usize,
    slots: Arc<Mutex<HashMap<String, Arc<Semaphore>>>>,
}

impl StreamPermits {
    /// Allows `per_client` open streams of `kind` per client.
    pub fn new(kind: &'static str, per_client: usize) -> Self {
        Self { kind, per_client, slots: Arc::default() }
    }

    /// Takes a slot for a new stream of `client`, held until the permit is
    /// dropped (the stream ends); RESOURCE_EXHAUSTED when none is free.
    pub fn acquire(&self, client: &Client) -> Result<Option<OwnedSemaphorePermit>, Error> {
        if client.name() == LOCAL_CLIENT {
            return Ok(None);
        }
        let slots = {
            let mut slots = self.slots.lock().unwrap_or_else(|e| e.into_inner());
            slots
                .entry(client.name().to_owned())
                .or_insert_with(|| Arc::new(Semaphore::new(self.per_client)))
                .clone()
        };
        slots.try_acquire_owned().map(Some).map_err(|_| Error::ResourceExhausted {
            reason: format!(
                "client {} has {} {} streams open on this replica, the most it may",
                client.name(),
                self.per_client,
                self.kind
            ),
            retry_after: None,
        })
    }
}
