//! Sessions: a login form takes an admin token (or a one-time login secret) and
//! opens a server-side session, named by a random id in an HttpOnly, SameSite=Strict
//! cookie; each session has its own CSRF token, which every write must carry (form
//! field `csrf` or header `X-CSRF-Token`). The login form has its own nonce (a
//! double-submit cookie), so no other site can log a browser in.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use askama::Template;
use axum::extract::rejection::FormRejection;
use axum::extract::{Query, Request, State};
use axum::http::{HeaderMap, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::{Extension, Form};
use serde::Deserialize;
use subtle::ConstantTimeEq;

use super::{Page, Ui, UiError};
use crate::{Actor, AdminError, Role};

/// The session cookie.
const SESSION_COOKIE: &str = "outbox_session";
/// The login form's nonce cookie.
const LOGIN_COOKIE: &str = "outbox_login";
/// The theme cookie (`dark` or `light`; absent: follow the system).
pub(crate) const THEME_COOKIE: &str = "outbox_theme";

/// `bytes` random bytes from the operating system, as lowercase hex.
///
/// # Errors
/// When the operating system has no randomness to give.
pub fn random_secret(bytes: usize) -> Result<String, getrandom::Error> {
    let mut buf = vec![0u8; bytes];
    getrandom::fill(&mut buf)?;
    Ok(buf.iter().map(|b| format!("{b:02x}")).collect())
}

fn random_or_fail() -> Result<String, UiError> {
    random_secret(32).map_err(|e| {
        tracing::error!(error = %e, "no randomness for a session id");
        UiError::Render
    })
}

/// One logged-in browser (a request extension on every page).
#[derive(Debug, Clone)]
pub(crate) struct Session {
    pub(crate) id: String,
    pub(crate) actor: Actor,
    pub(crate) csrf: String,
    pub(crate) theme: &'static str,
    expires: Instant,
}

impl Session {
    pub(crate) fn can_write(&self) -> bool {
        self.actor.role == Role::Write
    }
}

/// Sessions one token may have open at once; a further login ends its oldest.
pub(crate) const MAX_SESSIONS_PER_TOKEN: usize = 32;

/// The open sessions, in memory.
pub(crate) struct SessionStore {
    sessions: Mutex<HashMap<String, Session>>,
    ttl: Duration,
    max: usize,
}

impl SessionStore {
    pub(crate) fn new(ttl: Duration, max: usize) -> Self {
        Self {
            sessions: Mutex::default(),
            ttl,
            max: max.max(1),
        }
    }

    fn create(&self, actor: Actor) -> Result<Session, UiError> {
        let now = Instant::now();
        let session = Session {
            id: random_or_fail()?,
            actor,
            csrf: random_or_fail()?,
            theme: "auto",
            expires: now + self.ttl,
        };
        let mut sessions = self.sessions.lock().unwrap_or_else(PoisonError::into_inner);
        sessions.retain(|_, s| s.expires > now);
        // Each token's own sessions first: one token logging in over and over only
        // ever evicts its own oldest sessions, never another operator's.
        loop {
            let mut own: Vec<(&String, Instant)> = sessions
                .iter()
                .filter(|(_, s)| s.actor.name == session.actor.name)
                .map(|(id, s)| (id, s.expires))
                .collect();
            if own.len() < MAX_SESSIONS_PER_TOKEN {
                break;
            }
            own.sort_by_key(|(_, expires)| *expires);
            let oldest = own[0].0.clone();
            sessions.remove(&oldest);
        }
        while sessions.len() >= self.max {
            let Some(oldest) = sessions
                .iter()
                .min_by_key(|(_, s)| s.expires)
                .map(|(id, _)| id.clone())
            else {
                break;
            };
            sessions.remove(&oldest);
        }
        sessions.insert(session.id.clone(), session.clone());
        Ok(session)
    }

    fn get(&self, id: &str) -> Option<Session> {
        let mut sessions = self.sessions.lock().unwrap_or_else(PoisonError::into_inner);
        match sessions.get(id) {
            Some(s) if s.expires > Instant::now() => Some(s.clone()),
            Some(_) => {
                sessions.remove(id);
                None
            }
            None => None,
        }
    }

    fn remove(&self, id: &str) {
        self.sessions
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(id);
    }
}

/// The value of cookie `name` in the request's `Cookie` headers.
pub(crate) fn cookie<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(k, _)| *k == name)
        .map(|(_, v)| v)
}

fn set_cookie(ui: &Ui, name: &str, value: &str, max_age: u64) -> String {
    let path = if ui.options.base.is_empty() {
        "/"
    } else {
        &ui.options.base
    };
    let secure = if ui.options.secure_cookies {
        "; Secure"
    } else {
        ""
    };
    format!("{name}={value}; Path={path}; Max-Age={max_age}; HttpOnly; SameSite=Strict{secure}")
}

pub(crate) fn theme_of(headers: &HeaderMap) -> &'static str {
    match cookie(headers, THEME_COOKIE) {
        Some("dark") => "dark",
        Some("light") => "light",
        _ => "auto",
    }
}

/// In front of every page but the login: a valid session, or off to the login.
/// Behind a trusted proxy, the user it names signs in as it says (a session is
/// opened for them, or replaced when the proxy names someone else), and one it
/// names without a role here is refused.
pub(crate) async fn require_session(
    State(ui): State<Arc<Ui>>,
    mut request: Request,
    next: Next,
) -> Response {
    let session = cookie(request.headers(), SESSION_COOKIE).and_then(|id| ui.sessions.get(id));
    // The peer as the server saw it (`into_make_service_with_connect_info`), or as
    // a test's `MockConnectInfo` layer sets it; none: no proxy is believed.
    let extensions = request.extensions();
    let peer = extensions
        .get::<axum::extract::ConnectInfo<std::net::SocketAddr>>()
        .map(|c| c.0.ip())
        .or_else(|| {
            extensions
                .get::<axum::extract::connect_info::MockConnectInfo<std::net::SocketAddr>>()
                .map(|c| c.0.ip())
        });
    let proxied = ui
        .options
        .trusted_proxy
        .as_ref()
        .map_or(super::proxy::Proxied::No, |p| {
            p.identify(peer, request.headers())
        });
    let (session, opened) = match (session, proxied) {
        (_, super::proxy::Proxied::NoRole(user)) => {
            tracing::warn!(user = %user, "dashboard sign-in through the proxy refused: no role for this user");
            return super::render::error_page(
                StatusCode::FORBIDDEN,
                &format!(
                    "signed in at the proxy as {user}, who has no role on this dashboard (ask for one in [admin.trusted_proxy])"
                ),
            );
        }
        (Some(s), super::proxy::Proxied::As(actor)) if s.actor == actor => (Some(s), false),
        // A session is opened by a page load only: a POST (perhaps cross-site)
        // never replaces the browser's session, and finds none if it has none.
        (old, super::proxy::Proxied::As(actor))
            if request.method() == Method::GET || request.method() == Method::HEAD =>
        {
            tracing::info!(actor = %actor.name, "dashboard sign-in through the proxy");
            if let Some(old) = old {
                // Given way to the user the proxy names: ended, not left open.
                ui.sessions.remove(&old.id);
            }
            match ui.sessions.create(actor) {
                Ok(s) => (Some(s), true),
                Err(e) => return e.into_response(),
            }
        }
        (_, super::proxy::Proxied::As(_)) => (None, false),
        (s, super::proxy::Proxied::No) => (s, false),
    };
    match session {
        Some(mut session) => {
            session.theme = theme_of(request.headers());
            let id = session.id.clone();
            request.extensions_mut().insert(session);
            let mut response = next.run(request).await;
            if opened {
                let max_age = ui.options.session_ttl.as_secs();
                if let Ok(v) = set_cookie(&ui, SESSION_COOKIE, &id, max_age).parse() {
                    response.headers_mut().append(header::SET_COOKIE, v);
                }
            }
            response
        }
        None => {
            let login = ui.at("/login");
            if request.headers().contains_key("hx-request") {
                // htmx follows this header with a full page load.
                let mut r = StatusCode::UNAUTHORIZED.into_response();
                if let Ok(v) = login.parse() {
                    r.headers_mut().insert("hx-redirect", v);
                }
                r
            } else if request.method() == Method::GET || request.method() == Method::HEAD {
                redirect(&login)
            } else {
                super::render::error_page(
                    StatusCode::UNAUTHORIZED,
                    "no session: log in again (sessions end at logout and expire)",
                )
            }
        }
    }
}

/// A 303 to `location`.
pub(crate) fn redirect(location: &str) -> Response {
    let mut r = StatusCode::SEE_OTHER.into_response();
    if let Ok(v) = location.parse() {
        r.headers_mut().insert(header::LOCATION, v);
    }
    r
}

/// A write may proceed: this session's CSRF token came with it (form field or
/// header), and the session may write.
pub(crate) fn check_write(
    session: &Session,
    headers: &HeaderMap,
    form_csrf: Option<&str>,
) -> Result<(), UiError> {
    let sent = form_csrf
        .filter(|t| !t.is_empty())
        .or_else(|| headers.get("x-csrf-token").and_then(|v| v.to_str().ok()))
        .unwrap_or("");
    if !bool::from(sent.as_bytes().ct_eq(session.csrf.as_bytes())) {
        return Err(UiError::Csrf);
    }
    if !session.can_write() {
        return Err(UiError::ReadOnly(session.actor.name.clone()));
    }
    Ok(())
}

#[derive(Template)]
#[template(path = "login.html")]
struct LoginPage<'a> {
    base: &'a str,
    nonce: String,
    error: Option<String>,
    notice: Option<&'static str>,
    closed: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
pub(crate) struct LoginQuery {
    token: Option<String>,
    notice: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
pub(crate) struct LoginForm {
    token: Option<String>,
    login_csrf: Option<String>,
}

/// Whether anybody could log in: tokens configured, or a one-time login pending.
fn is_open(ui: &Ui) -> bool {
    !ui.auth.is_empty()
        || ui
            .one_time
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .is_some()
}

fn login_page(
    ui: &Ui,
    status: StatusCode,
    error: Option<String>,
    notice: Option<&'static str>,
) -> Page {
    let nonce = random_or_fail()?;
    let page = LoginPage {
        base: &ui.options.base,
        nonce: nonce.clone(),
        error,
        notice,
        closed: (!is_open(ui)).then(|| AdminError::NotConfigured.to_string()),
    };
    let body = page.render().map_err(|_| UiError::Render)?;
    let mut response = (status, super::render::html(body)).into_response();
    if let Ok(v) = set_cookie(ui, LOGIN_COOKIE, &nonce, 3600).parse() {
        response.headers_mut().append(header::SET_COOKIE, v);
    }
    Ok(response)
}

/// The one-time login's actor, if `presented` is its secret (which it consumes).
fn take_one_time(ui: &Ui, presented: &str) -> Option<Actor> {
    let mut slot = ui.one_time.lock().unwrap_or_else(PoisonError::into_inner);
    let matches = slot.as_ref().is_some_and(|login| {
        bool::from(login.secret.expose().as_bytes().ct_eq(presented.as_bytes()))
    });
    if !matches {
        return None;
    }
    slot.take().map(|login| Actor {
        name: login.name,
        role: login.role,
    })
}

fn open_session(ui: &Ui, actor: Actor) -> Page {
    tracing::info!(actor = %actor.name, "dashboard login");
    let session = ui.sessions.create(actor)?;
    let mut response = redirect(&ui.home());
    let max_age = ui.options.session_ttl.as_secs();
    let headers = response.headers_mut();
    if let Ok(v) = set_cookie(ui, SESSION_COOKIE, &session.id, max_age).parse() {
        headers.append(header::SET_COOKIE, v);
    }
    if let Ok(v) = set_cookie(ui, LOGIN_COOKIE, "", 0).parse() {
        headers.append(header::SET_COOKIE, v);
    }
    Ok(response)
}

/// `GET <base>/login`: the form; `?token=` a one-time login.
pub(crate) async fn login_form(
    State(ui): State<Arc<Ui>>,
    query: Result<Query<LoginQuery>, axum::extract::rejection::QueryRejection>,
) -> Page {
    let query = query.map(|Query(q)| q).unwrap_or_default();
    if let Some(token) = query.token.as_deref() {
        return match take_one_time(&ui, token) {
            Some(actor) => open_session(&ui, actor),
            None => login_page(
                &ui,
                StatusCode::UNAUTHORIZED,
                Some(
                    "this login link was already used or is not valid; log in with a token".into(),
                ),
                None,
            ),
        };
    }
    let notice = match query.notice.as_deref() {
        Some("logged_out") => Some("You are logged out."),
        _ => None,
    };
    login_page(&ui, StatusCode::OK, None, notice)
}

/// `POST <base>/login`: a token (or the one-time secret) opens a session.
pub(crate) async fn login(
    State(ui): State<Arc<Ui>>,
    headers: HeaderMap,
    form: Result<Form<LoginForm>, FormRejection>,
) -> Page {
    let Ok(Form(form)) = form else {
        return login_page(
            &ui,
            StatusCode::BAD_REQUEST,
            Some("the login form was not understood".into()),
            None,
        );
    };
    let nonce = cookie(&headers, LOGIN_COOKIE).unwrap_or("");
    let sent = form.login_csrf.as_deref().unwrap_or("");
    if nonce.is_empty() || !bool::from(nonce.as_bytes().ct_eq(sent.as_bytes())) {
        return login_page(
            &ui,
            StatusCode::FORBIDDEN,
            Some("the login form expired or did not come from this page; try again".into()),
            None,
        );
    }
    let token = form.token.unwrap_or_default();
    if let Some(actor) = take_one_time(&ui, &token) {
        return open_session(&ui, actor);
    }
    let bearer = format!("Bearer {token}");
    match ui.auth.authorize(&Method::GET, Some(bearer.as_bytes())) {
        Ok(actor) => open_session(&ui, actor),
        Err(AdminError::NotConfigured) => login_page(
            &ui,
            StatusCode::FORBIDDEN,
            Some(AdminError::NotConfigured.to_string()),
            None,
        ),
        Err(_) => login_page(
            &ui,
            StatusCode::UNAUTHORIZED,
            Some("unknown token".into()),
            None,
        ),
    }
}

#[derive(Debug, Default, Deserialize)]
pub(crate) struct CsrfForm {
    csrf: Option<String>,
}

/// `POST <base>/logout`: ends the session.
pub(crate) async fn logout(
    State(ui): State<Arc<Ui>>,
    Extension(session): Extension<Session>,
    headers: HeaderMap,
    form: Result<Form<CsrfForm>, FormRejection>,
) -> Page {
    let form = form.map(|Form(f)| f).unwrap_or_default();
    // Logging out needs the CSRF token (no other site may end a session), not the
    // write role.
    let sent = form
        .csrf
        .as_deref()
        .or_else(|| headers.get("x-csrf-token").and_then(|v| v.to_str().ok()))
        .unwrap_or("");
    if !bool::from(sent.as_bytes().ct_eq(session.csrf.as_bytes())) {
        return Err(UiError::Csrf);
    }
    ui.sessions.remove(&session.id);
    tracing::info!(actor = %session.actor.name, "dashboard logout");
    let mut response = redirect(&ui.at("/login?notice=logged_out"));
    if let Ok(v) = set_cookie(&ui, SESSION_COOKIE, "", 0).parse() {
        response.headers_mut().append(header::SET_COOKIE, v);
    }
    Ok(response)
}

#[derive(Debug, Default, Deserialize)]
pub(crate) struct ThemeQuery {
    set: Option<String>,
}

/// `GET <base>/theme?set=dark|light|auto`: the colour scheme, in a cookie.
pub(crate) async fn theme(
    State(ui): State<Arc<Ui>>,
    query: Result<Query<ThemeQuery>, axum::extract::rejection::QueryRejection>,
) -> Response {
    let set = query.ok().and_then(|Query(q)| q.set);
    let (value, max_age) = match set.as_deref() {
        Some("dark") => ("dark", 365 * 24 * 3600),
        Some("light") => ("light", 365 * 24 * 3600),
        _ => ("", 0),
    };
    let mut response = redirect(&ui.home());
    if let Ok(v) = set_cookie(&ui, THEME_COOKIE, value, max_age).parse() {
        response.headers_mut().append(header::SET_COOKIE, v);
    }
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sessions_expire_and_the_store_stays_bounded() {
        let store = SessionStore::new(Duration::from_secs(60), 2);
        let actor = Actor {
            name: "ops".into(),
            role: Role::Write,
        };
        let a = store.create(actor.clone()).expect("session");
        let b = store.create(actor.clone()).expect("session");
        assert_ne!(a.id, b.id);
        assert_ne!(a.csrf, b.csrf);
        assert_eq!(a.id.len(), 64);
        let c = store.create(actor.clone()).expect("session");
        let alive = [&a, &b, &c]
            .iter()
            .filter(|s| store.get(&s.id).is_some())
            .count();
        assert_eq!(alive, 2, "at most two sessions are kept");
        assert!(store.get(&c.id).is_some(), "the newest survives");
        store.remove(&c.id);
        assert!(store.get(&c.id).is_none());

        let expired = SessionStore::new(Duration::ZERO, 10);
        let s = expired.create(actor).expect("session");
        assert!(
            expired.get(&s.id).is_none(),
            "a session past its ttl is gone"
        );
    }

    #[test]
    fn one_token_logging_in_again_and_again_never_evicts_another() {
        let store = SessionStore::new(Duration::from_secs(60), 100);
        let actor = |name: &str| Actor {
            name: name.into(),
            role: Role::Read,
        };
        let alice = store.create(actor("alice")).expect("session");
        for _ in 0..200 {
            store.create(actor("script")).expect("session");
        }
        assert!(
            store.get(&alice.id).is_some(),
            "another token's session is kept"
        );
        let scripts = store
            .sessions
            .lock()
            .expect("lock")
            .values()
            .filter(|s| s.actor.name == "script")
            .count();
        assert_eq!(scripts, MAX_SESSIONS_PER_TOKEN);
    }

    #[test]
    fn cookies_are_found_by_exact_name() {
        let mut headers = HeaderMap::new();
        headers.insert(
            header::COOKIE,
            "xoutbox_session=no; outbox_session=yes; other=1"
                .parse()
                .expect("header"),
        );
        assert_eq!(cookie(&headers, SESSION_COOKIE), Some("yes"));
        assert_eq!(cookie(&headers, LOGIN_COOKIE), None);
    }
}
