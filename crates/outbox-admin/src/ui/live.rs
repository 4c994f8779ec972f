//! The overview's live numbers over server-sent events (htmx's SSE extension):
//! one stream per open overview page, all fed by one poller per dashboard, which
//! reads the numbers every [`LIVE_POLL`] while anyone watches and sends the
//! rendered fragment only when it changed. So an idle page costs nothing on the
//! wire, and ten open pages cost the stores what one does.
//!
//! A stream ends at the dashboard's shutdown signal ([`super::UiOptions::shutdown`]:
//! a graceful shutdown would otherwise wait for it forever), after
//! [`STREAM_LIFETIME`] (the browser reconnects), so a server without that signal
//! still stops within it, and with its session: at once when this process ends it
//! (a logout), within [`SESSION_CHECK`] when another instance over the same store
//! does, at its expiry in any case.

use std::convert::Infallible;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use axum::Extension;
use axum::extract::State;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use tokio::sync::watch;

use super::Ui;
use super::pages::live_fragment;
use super::session::Session;
#[cfg(doc)]
use super::session_store::SessionStore;

/// How often the poller reads the numbers while a page watches.
pub(crate) const LIVE_POLL: Duration = Duration::from_secs(2);
/// How long one stream lasts before the browser opens a new one.
pub(crate) const STREAM_LIFETIME: Duration = Duration::from_secs(300);
/// How often a stream looks its session up in the store: a logout on another
/// instance over the same store ends it within this (one in this process ends
/// it at once).
pub(crate) const SESSION_CHECK: Duration = Duration::from_secs(5);

/// The latest rendered fragment, and whether a poller runs.
pub(crate) struct LiveFeed {
    latest: watch::Sender<Option<String>>,
    polling: Mutex<bool>,
}

impl LiveFeed {
    pub(crate) fn new() -> Self {
        Self {
            latest: watch::channel(None).0,
            polling: Mutex::new(false),
        }
    }
}

/// A receiver of `ui`'s fragments, starting the poller when nobody watched.
fn subscribe(ui: &Arc<Ui>) -> watch::Receiver<Option<String>> {
    // Subscribed before the flag is read: a poller about to stop sees this
    // receiver, or has cleared the flag and a new one starts here.
    let receiver = ui.live.latest.subscribe();
    let mut polling = ui
        .live
        .polling
        .lock()
        .unwrap_or_else(PoisonError::into_inner);
    if !*polling {
        *polling = true;
        // What an earlier poller left may be old: forgotten quietly, so the new
        // poller's first read goes to every stream.
        ui.live.latest.send_if_modified(|latest| {
            *latest = None;
            false
        });
        tokio::spawn(poll(Arc::clone(ui)));
    }
    receiver
}

/// Reads and renders the numbers every [`LIVE_POLL`] until nobody watches.
async fn poll(ui: Arc<Ui>) {
    loop {
        {
            let mut polling = ui
                .live
                .polling
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            if ui.live.latest.receiver_count() == 0 {
                *polling = false;
                return;
            }
        }
        match live_fragment(&ui).await {
            Ok(html) => {
                ui.live.latest.send_if_modified(|latest| {
                    if latest.as_deref() == Some(html.as_str()) {
                        false
                    } else {
                        *latest = Some(html);
                        true
                    }
                });
            }
            // The page keeps what it shows; the next read may succeed.
            Err(e) => tracing::debug!(error = ?e, "live numbers not read"),
        }
        tokio::time::sleep(LIVE_POLL).await;
    }
}

/// What one open stream watches.
struct Stream {
    ui: Arc<Ui>,
    /// The session that opened it: the stream ends when it does.
    session: Session,
    latest: watch::Receiver<Option<String>>,
    shutdown: Option<watch::Receiver<bool>>,
    /// Moves when this process ends a session (see [`SessionStore::ended`]).
    ended: watch::Receiver<u64>,
    deadline: tokio::time::Instant,
    /// When the session is next looked up in the store anyway.
    next_check: tokio::time::Instant,
}

/// Why a stream woke.
enum Wake {
    Fragment,
    Check,
}

/// Returns when `shutdown` changes (or its sender is gone); never without one.
async fn stopped(shutdown: &mut Option<watch::Receiver<bool>>) {
    match shutdown {
        Some(stop) => {
            let _ = stop.changed().await;
        }
        None => std::future::pending().await,
    }
}

impl Stream {
    /// Waits for the next fragment to send: `None` once the stream is to end (the
    /// dashboard shuts down, the stream's lifetime or its session is over).
    async fn next_fragment(&mut self) -> Option<String> {
        loop {
            if self.shutdown.as_ref().is_some_and(|stop| *stop.borrow()) {
                return None;
            }
            let wake = tokio::select! {
                changed = self.latest.changed() => {
                    changed.ok()?;
                    Wake::Fragment
                }
                () = stopped(&mut self.shutdown) => return None,
                _ = self.ended.changed() => Wake::Check,
                () = tokio::time::sleep_until(self.next_check) => Wake::Check,
                () = tokio::time::sleep_until(self.deadline) => return None,
            };
            match wake {
                Wake::Fragment => {
                    if let Some(html) = self.latest.borrow_and_update().clone() {
                        return Some(html);
                    }
                }
                Wake::Check => {
                    self.next_check = tokio::time::Instant::now() + SESSION_CHECK;
                    if !self.session_lives().await {
                        return None;
                    }
                }
            }
        }
    }

    /// Whether the stream's session is still the one stored (a logout here or on
    /// another instance over the same store removed it; a proxy user's session
    /// opened again since is another one, with another CSRF token). A store that
    /// does not answer ends nothing: the stream's lifetime still bounds it.
    async fn session_lives(&self) -> bool {
        match self.ui.sessions.get(&self.session.id, &self.ui.auth).await {
            Ok(Some(now)) => now.csrf == self.session.csrf,
            Ok(None) => false,
            Err(_) => true,
        }
    }
}

/// `GET <base>/overview/stream`: the overview's live fragment, as an SSE event
/// `live` each time it changes.
pub(crate) async fn overview_stream(
    State(ui): State<Arc<Ui>>,
    Extension(session): Extension<Session>,
) -> Response {
    let mut latest = subscribe(&ui);
    // What the poller has now goes first (at most one poll old): the page may
    // have been rendered before a change the poller already saw.
    let first = latest.borrow_and_update().clone();
    let now = tokio::time::Instant::now();
    // Never past the session's own end: the reconnect then finds no session and
    // is told to stop.
    let deadline = (now + STREAM_LIFETIME).min(tokio::time::Instant::from_std(session.expires()));
    let stream = Stream {
        shutdown: ui.options.shutdown.clone(),
        ended: ui.sessions.ended(),
        ui,
        session,
        latest,
        deadline,
        next_check: now + SESSION_CHECK,
    };
    let events = futures::stream::unfold((stream, first), |(mut stream, first)| async move {
        let html = match first {
            Some(html) => html,
            None => stream.next_fragment().await?,
        };
        // A carriage return would end an SSE line inside the HTML.
        let event = Event::default()
            .event("live")
            .data(html.replace('\r', "&#13;"));
        Some((Ok::<_, Infallible>(event), (stream, None)))
    });
    Sse::new(events)
        .keep_alive(KeepAlive::default())
        .into_response()
}
