//! The web dashboard: server-rendered pages (askama templates, checked at compile
//! time) over the same [`AdminService`] as the JSON API, under the same tokens.
//!
//! ```no_run
//! # fn mount(service: outbox_admin::AdminService, auth: outbox_admin::AdminAuth) {
//! use outbox_admin::{UiOptions, ui_router};
//! let app: axum::Router = axum::Router::new().nest("/ui", ui_router(service, auth, UiOptions::default()));
//! # }
//! ```
//!
//! - `session`: login with an admin token into a server-side session (cookie
//!   HttpOnly, SameSite=Strict, Secure and `__Host-` when configured), logout,
//!   expiry, CSRF; `session_store`: where sessions live (memory, or a shared
//!   store such as PostgreSQL, keyed by a hash of the cookie).
//! - `pages`: one module per area (overview, lists of messages and deliveries,
//!   detail, consumers, blocked keys, dead letters, audit log, and the actions:
//!   requeue, delete, reconsume, bulk), sharing the page frame.
//! - `render`: HTML responses from templates, and the error page, for `pages` and
//!   `session` alike.
//! - `filters`: the list filters as they travel in URLs and forms.
//! - `view`: status badges and payload views.
//! - `chart`: the charts as inline SVG (the overview's, each exchange's and
//!   consumer's).
//! - `live`: the overview's numbers pushed over server-sent events as they change.
//! - `assets`: the vendored htmx (and its SSE extension) and the stylesheet,
//!   embedded in the binary.
//!
//! Every response carries `Content-Security-Policy: default-src 'self'`: no inline
//! script or style, nothing loaded from elsewhere.

mod assets;
mod chart;
mod filters;
mod live;
mod pages;
mod proxy;
mod render;
mod session;
mod session_store;
mod view;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::extract::Request;
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::{Next, from_fn, from_fn_with_state};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};

use crate::{AdminAuth, AdminError, AdminService, Role, Secret};

pub use proxy::TrustedProxy;
pub use session_store::random_secret;

/// How the dashboard is served.
#[derive(Debug, Clone)]
pub struct UiOptions {
    /// The path the router is nested at (`/ui`): links, redirects and cookie paths
    /// start with it. Empty when mounted at the root.
    pub base: String,
    /// Mark the cookies `Secure`: set it when the dashboard is reached over HTTPS
    /// (directly or through a proxy that terminates TLS).
    pub secure_cookies: bool,
    /// How long a session lasts after login.
    pub session_ttl: Duration,
    /// The most sessions kept; beyond it, the one closest to expiry is dropped.
    pub max_sessions: usize,
    /// A login that works once, for a URL printed to whoever started the process
    /// (`outbox demo --serve`): `<base>/login?token=<secret>`.
    pub one_time_login: Option<OneTimeLogin>,
    /// What follows a used one-time login: a fresh one (which whoever started
    /// the process is shown), so a second browser or a sign-in after logout is
    /// not met by a closed dashboard. `None`: the one-time login is the only one.
    pub one_time_renewal: Option<OneTimeRenewal>,
    /// Sign-in by a trusted proxy (single sign-on in front of the dashboard);
    /// `None`: the login form only.
    pub trusted_proxy: Option<TrustedProxy>,
    /// Addresses of proxies that only forward (a TLS terminator, a load
    /// balancer): their `X-Forwarded-For` names the client whose failed logins
    /// are counted, so one client's failures do not lock out everyone behind the
    /// proxy. Nobody is signed in by them (that is `trusted_proxy`).
    pub forwarders: Vec<ipnet::IpNet>,
    /// Turns `true` (or is dropped) when the server shuts down: the overview's
    /// live streams end then, so a graceful shutdown does not wait for open
    /// pages. `None`: each stream still ends within 5 minutes.
    pub shutdown: Option<tokio::sync::watch::Receiver<bool>>,
    /// Where sessions are kept: `None`, this process's memory (a restart signs
    /// everyone out); a shared store (PostgreSQL under `outbox run`), so a
    /// restart or a second instance keeps operators signed in.
    pub session_store: Option<Arc<dyn tower_sessions_core::SessionStore>>,
}

impl Default for UiOptions {
    fn default() -> Self {
        Self {
            base: "/ui".to_owned(),
            secure_cookies: false,
            session_ttl: Duration::from_secs(8 * 3600),
            max_sessions: 10_000,
            one_time_login: None,
            one_time_renewal: None,
            trusted_proxy: None,
            forwarders: Vec::new(),
            shutdown: None,
            session_store: None,
        }
    }
}

/// A secret that opens one session, once, as `name` with `role`. `Debug` hides the
/// secret.
#[derive(Debug, Clone)]
pub struct OneTimeLogin {
    /// What the login URL carries.
    pub secret: Secret,
    /// The actor the session acts as (recorded in the audit log).
    pub name: String,
    /// What the session may do.
    pub role: Role,
}

/// A fresh one-time login after each one used (see
/// [`UiOptions::one_time_renewal`]).
#[derive(Clone)]
pub struct OneTimeRenewal {
    /// Where the login page says the fresh login is (`the terminal running
    /// outbox demo --serve printed a fresh login link`).
    pub hint: String,
    /// Makes (and shows whoever started the process) the next one-time login;
    /// `None`: none follows.
    pub next: Arc<dyn Fn() -> Option<OneTimeLogin> + Send + Sync>,
}

impl std::fmt::Debug for OneTimeRenewal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OneTimeRenewal")
            .field("hint", &self.hint)
            .finish_non_exhaustive()
    }
}

/// The dashboard's state, shared by every handler.
pub(crate) struct Ui {
    pub(crate) service: AdminService,
    pub(crate) auth: AdminAuth,
    pub(crate) options: UiOptions,
    pub(crate) sessions: session::SessionStore,
    pub(crate) one_time: Mutex<Option<OneTimeLogin>>,
    /// The overview's live numbers, shared by every open overview page.
    pub(crate) live: live::LiveFeed,
    /// Failed login attempts per client address.
    pub(crate) login_limit: crate::failure_limit::FailureLimit,
}

impl Ui {
    /// `path` under the mount point.
    pub(crate) fn at(&self, path: &str) -> String {
        format!("{}{path}", self.options.base)
    }

    /// Consumer `name`'s deliveries under the mount point (the name encoded).
    pub(crate) fn consumer_at(&self, name: &str) -> String {
        self.at(&format!("/consumers/{}", filters::encode(name)))
    }

    /// The overview: the mount point itself (axum's `nest` serves `/ui`, not
    /// `/ui/`).
    pub(crate) fn home(&self) -> String {
        if self.options.base.is_empty() {
            "/".to_owned()
        } else {
            self.options.base.clone()
        }
    }
}

/// Why a page cannot be shown or an action was refused.
#[derive(Debug)]
pub(crate) enum UiError {
    /// What the admin service said (4xx for bad input, 503 when a store is down).
    Admin(AdminError),
    /// A write without this session's CSRF token.
    Csrf,
    /// A write by a read-only session (its actor as the audit log names it).
    ReadOnly(String),
    /// A page that cannot be rendered (a template bug; never an input).
    Render,
}

impl From<AdminError> for UiError {
    fn from(e: AdminError) -> Self {
        Self::Admin(e)
    }
}

impl UiError {
    fn status_and_message(&self) -> (StatusCode, String) {
        match self {
            Self::Admin(e) => (e.status_and_code().0, e.to_string()),
            Self::Csrf => (
                StatusCode::FORBIDDEN,
                "refused: the form's CSRF token is missing or is not this session's; reload the page and try again".to_owned(),
            ),
            Self::ReadOnly(actor) => (
                StatusCode::FORBIDDEN,
                format!("refused: `{actor}` has the read role; this action needs the write role"),
            ),
            Self::Render => (
                StatusCode::INTERNAL_SERVER_ERROR,
                "the page could not be rendered".to_owned(),
            ),
        }
    }
}

impl IntoResponse for UiError {
    fn into_response(self) -> Response {
        let (status, message) = self.status_and_message();
        if status.is_server_error() {
            tracing::warn!(%status, error = %message, "dashboard request failed");
        }
        render::error_page(status, &message)
    }
}

/// What a page handler answers.
pub(crate) type Page = Result<Response, UiError>;

/// The dashboard's router, to nest at `options.base` into any axum service. The
/// pages need a session (from `<base>/login`, with a token of `auth`); without
/// tokens (and no one-time login) nobody can log in.
pub fn ui_router(service: AdminService, auth: AdminAuth, options: UiOptions) -> Router {
    let mut options = options;
    options.base = options.base.trim_end_matches('/').to_owned();
    let ui = Arc::new(Ui {
        service,
        auth,
        sessions: session::SessionStore::new(
            options.session_ttl,
            options.max_sessions,
            options.session_store.clone(),
        ),
        one_time: Mutex::new(options.one_time_login.take()),
        live: live::LiveFeed::new(),
        login_limit: crate::failure_limit::FailureLimit::new(),
        options,
    });
    let private = Router::new()
        .route("/", get(pages::overview))
        .route("/overview/live", get(pages::overview_live))
        .route("/overview/stream", get(live::overview_stream))
        .route("/messages", get(pages::messages))
        .route("/messages/tabs", get(pages::message_tabs))
        .route("/messages/requeue", post(pages::bulk_requeue))
        .route("/messages/delete", post(pages::bulk_delete))
        .route("/messages/selected", post(pages::messages_selected))
        .route("/messages/{id}", get(pages::message))
        .route("/messages/{id}/requeue", post(pages::requeue))
        .route("/messages/{id}/publish-now", post(pages::publish_now))
        .route("/messages/{id}/delete", post(pages::delete))
        .route("/messages/{id}/replay", post(pages::replay))
        .route("/ordering/blocked-keys", get(pages::blocked_keys))
        .route("/ordering/blocked-keys/requeue", post(pages::requeue_heads))
        .route("/failures", get(pages::failures))
        .route("/failures/requeue", post(pages::requeue_group))
        .route("/failures/delete", post(pages::delete_group))
        .route("/failures/reconsume", post(pages::reconsume_group))
        .route("/throughput", get(pages::throughput))
        .route("/throughput/exchanges/{name}", get(pages::exchange_chart))
        .route("/throughput/consumers/{name}", get(pages::consumer_chart))
        .route("/pauses", get(pages::pauses))
        .route("/pauses/pause", post(pages::pause))
        .route("/pauses/resume", post(pages::resume))
        .route("/consumers", get(pages::consumers))
        .route("/consumers/{name}", get(pages::deliveries))
        .route("/consumers/{name}/tabs", get(pages::delivery_tabs))
        .route("/consumers/{name}/reconsume", post(pages::bulk_reconsume))
        .route(
            "/consumers/{name}/selected",
            post(pages::deliveries_selected),
        )
        .route("/consumers/{name}/deliveries/{id}", get(pages::delivery))
        .route(
            "/consumers/{name}/deliveries/{id}/reconsume",
            post(pages::reconsume),
        )
        .route(
            "/consumers/{name}/deliveries/{id}/replay",
            post(pages::replay_delivery),
        )
        .route("/dead-letters", get(pages::dead_letters))
        .route("/dead-letters/{id}", get(pages::dead_letter))
        .route("/dead-letters/{id}/delete", post(pages::delete_dead_letter))
        .route("/audit", get(pages::audit))
        .route("/logout", post(session::logout))
        .route_layer(from_fn_with_state(
            Arc::clone(&ui),
            session::require_session,
        ));
    Router::new()
        .route("/login", get(session::login_form).post(session::login))
        .route("/theme", get(session::theme))
        .route("/assets/{file}", get(assets::serve))
        .merge(private)
        .fallback(not_found)
        .layer(from_fn(security_headers))
        .with_state(ui)
}

async fn not_found() -> Response {
    render::error_page(StatusCode::NOT_FOUND, "no such page")
}

/// The headers of every dashboard response: nothing from elsewhere, no framing,
/// no sniffing, no referrer (a login URL may carry a one-time token), and no
/// caching of pages.
async fn security_headers(request: Request, next: Next) -> Response {
    // The path as this router sees it (a nest's prefix is stripped): a consumer
    // named "assets" must not make its pages cacheable.
    let is_asset = request.uri().path().starts_with("/assets/");
    let mut response = next.run(request).await;
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(
            "default-src 'self'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'",
        ),
    );
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    headers.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    headers.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    if !is_asset {
        headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    }
    response
}
