//! The overview's live numbers over server-sent events (htmx's SSE extension):
//! one stream per open overview page, all fed by one poller per dashboard, which
//! reads the numbers every [`LIVE_POLL`] while anyone watches and sends the
//! rendered fragment only when it changed. So an idle page costs nothing on the
//! wire, and ten open pages cost the stores what one does.
//!
//! A stream ends at the dashboard's shutdown signal ([`super::UiOptions::shutdown`]:
//! a graceful shutdown would otherwise wait for it forever) and after
//! [`STREAM_LIFETIME`] (the browser reconnects), so a server without that signal
//! still stops within it.

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

/// How often the poller reads the numbers while a page watches.
pub(crate) const LIVE_POLL: Duration = Duration::from_secs(2);
/// How long one stream lasts before the browser opens a new one.
pub(crate) const STREAM_LIFETIME: Duration = Duration::from_secs(300);

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

/// Waits for the next fragment to send: `None` once the stream is to end (the
/// dashboard shuts down, the stream's lifetime is over).
async fn next_fragment(
    latest: &mut watch::Receiver<Option<String>>,
    shutdown: &mut Option<watch::Receiver<bool>>,
    deadline: tokio::time::Instant,
) -> Option<String> {
    loop {
        let changed = async {
            match shutdown {
                Some(stop) => {
                    if *stop.borrow() {
                        return false;
                    }
                    tokio::select! {
                        changed = latest.changed() => changed.is_ok(),
                        _ = stop.changed() => false,
                    }
                }
                None => latest.changed().await.is_ok(),
            }
        };
        match tokio::time::timeout_at(deadline, changed).await {
            Ok(true) => {
                if let Some(html) = latest.borrow_and_update().clone() {
                    return Some(html);
                }
            }
            _ => return None,
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
    let shutdown = ui.options.shutdown.clone();
    // Never past the session's own end: the reconnect then finds no session and
    // is told to stop.
    let deadline = (tokio::time::Instant::now() + STREAM_LIFETIME)
        .min(tokio::time::Instant::from_std(session.expires()));
    let events = futures::stream::unfold(
        (latest, shutdown, first),
        move |(mut latest, mut shutdown, first)| async move {
            let html = match first {
                Some(html) => html,
                None => next_fragment(&mut latest, &mut shutdown, deadline).await?,
            };
            // A carriage return would end an SSE line inside the HTML.
            let event = Event::default()
                .event("live")
                .data(html.replace('\r', "&#13;"));
            Some((Ok::<_, Infallible>(event), (latest, shutdown, None)))
        },
    );
    Sse::new(events)
        .keep_alive(KeepAlive::default())
        .into_response()
}
