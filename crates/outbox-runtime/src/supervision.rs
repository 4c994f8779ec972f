//! Service tasks that stop on their own are failures, never silent outages.
//!
//! A task of a running service (a dispatch loop, a sweeper) ends only when its
//! cancellation token fires. If it panics, or returns while the token has not
//! fired, nothing would publish any more while the process stays up and looks
//! ready. [`supervise`] watches each task: such an end is recorded in the shared
//! [`ServiceHealth`], which fails `/readyz` and makes `outbox run` exit non-zero,
//! so a supervisor (systemd, Kubernetes) starts a fresh process.

use std::sync::{Arc, Mutex};

use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// Whether every supervised task of a service is still running as it should.
#[derive(Debug, Default)]
pub struct ServiceHealth {
    failure: Mutex<Option<String>>,
    failed: CancellationToken,
}

impl ServiceHealth {
    /// The first failure (`"<task>: <why>"`), if a task ended abnormally.
    #[must_use]
    pub fn failure(&self) -> Option<String> {
        self.failure
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// Returns once a task has ended abnormally.
    pub async fn failed(&self) {
        self.failed.cancelled().await;
    }

    fn fail(&self, task: &str, why: &str) {
        tracing::error!(
            task,
            reason = why,
            "a service task ended abnormally; the service is failed"
        );
        let mut f = self
            .failure
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if f.is_none() {
            *f = Some(format!("{task}: {why}"));
        }
        drop(f);
        self.failed.cancel();
    }
}

/// The text of a panic's payload (a `&str` or `String` message).
#[must_use]
pub fn panic_text(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic without a message".to_owned())
}

/// Why a task ended abnormally: its panic's text, or the join error.
fn join_error_text(e: tokio::task::JoinError) -> String {
    if e.is_panic() {
        panic_text(e.into_panic().as_ref())
    } else {
        e.to_string()
    }
}

/// Runs `task` as `name`: a panic, or an end before `cancel` fired, marks `health`
/// failed. The handle ends when the task does.
pub fn supervise<F>(
    name: &'static str,
    task: F,
    cancel: CancellationToken,
    health: Arc<ServiceHealth>,
) -> JoinHandle<()>
where
    F: std::future::Future<Output = ()> + Send + 'static,
{
    let inner = tokio::spawn(task);
    tokio::spawn(async move {
        match inner.await {
            Ok(()) if cancel.is_cancelled() => {}
            Ok(()) => health.fail(name, "stopped on its own"),
            Err(e) => health.fail(name, &format!("panicked: {}", join_error_text(e))),
        }
    })
}
