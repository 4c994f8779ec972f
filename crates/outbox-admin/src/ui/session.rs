//! Sessions: a login form takes an admin token (or a one-time login secret) and
//! opens a server-side session, named by a random id in an HttpOnly, SameSite=Strict
//! cookie; each session has its own CSRF token, which every write must carry (form
//! field `csrf` or header `X-CSRF-Token`). The login form has its own nonce (a
//! double-submit cookie), so no other site can log a browser in.

use std::sync::{Arc, PoisonError};

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
use crate::client::peer_of;
use crate::{Actor, AdminError};

/// The session cookie.
const SESSION_COOKIE: &str = "outbox_session";
/// The login form's nonce cookie.
const LOGIN_COOKIE: &str = "outbox_login";

/// The name `ui` gives cookie `plain` (the session's, the login nonce's) for a
/// request with `headers`: with `Secure` cookies, `__Host-` first, which makes the
/// browser refuse it unless it is Secure, for the whole host (`Path=/`) and set by
/// this host itself (no `Domain`), so no sibling subdomain can plant or shadow it
/// (a planted nonce would log the browser in as someone else). And the port the
/// browser addressed last (`outbox_session_8080`): cookies are per host, not per
/// port, so two dashboards on one host would share one session cookie and sign
/// each other out.
fn cookie_name(ui: &Ui, plain: &'static str, headers: &HeaderMap) -> String {
    let prefix = if ui.options.secure_cookies {
        "__Host-"
    } else {
        ""
    };
    match port_of(headers) {
        Some(port) => format!("{prefix}{plain}_{port}"),
        None => format!("{prefix}{plain}"),
    }
}

/// The port of the request's `Host` header (`host:8080`, `[::1]:8080`), if it
/// names one.
fn port_of(headers: &HeaderMap) -> Option<u16> {
    let host = headers.get(header::HOST)?.to_str().ok()?;
    let (name, port) = host.rsplit_once(':')?;
    // `[::1]` alone: the colon was the address's.
    if name.starts_with('[') && !name.ends_with(']') {
        return None;
    }
    port.parse().ok()
}

/// The name of `ui`'s session cookie.
fn session_cookie(ui: &Ui, headers: &HeaderMap) -> String {
    cookie_name(ui, SESSION_COOKIE, headers)
}

/// The name of `ui`'s login nonce cookie.
fn login_cookie(ui: &Ui, headers: &HeaderMap) -> String {
    cookie_name(ui, LOGIN_COOKIE, headers)
}

/// `next` when it is a page of this dashboard to return to after signing in:
/// a path under `ui`'s mount point (and nothing else: no scheme, no host, no
/// `//` or `\\` a browser would read as one, no control character), so a link
/// cannot send a signing-in operator elsewhere.
fn return_to(ui: &Ui, next: Option<&str>) -> Option<String> {
    let next = next?;
    let base = ui.options.base.as_str();
    let rest = next.strip_prefix(base)?;
    let under = rest.is_empty() || rest.starts_with('/') || rest.starts_with('?');
    let clean = next.starts_with('/')
        && !next.contains("//")
        && !next.contains('\\')
        && next.bytes().all(|b| b.is_ascii_graphic());
    (under && clean && next.len() <= 2_048).then(|| next.to_owned())
}

/// The theme cookie (`dark` or `light`; absent: follow the system).
pub(crate) const THEME_COOKIE: &str = "outbox_theme";

pub(crate) use super::session_store::{Session, SessionStore, Via, random_or_fail};

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
    // A `__Host-` cookie must have `Path=/`.
    let path = if ui.options.base.is_empty() || name.starts_with("__Host-") {
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
    let session_name = session_cookie(&ui, request.headers());
    let session = match cookie(request.headers(), &session_name) {
        Some(id) => match ui.sessions.get(id, &ui.auth).await {
            Ok(session) => session,
            Err(e) => return e.into_response(),
        },
        None => None,
    };
    // The peer as the server saw it (`into_make_service_with_connect_info`), or as
    // a test's `MockConnectInfo` layer sets it; none: no proxy is believed.
    let peer = peer_of(request.extensions());
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
        (Some(s), super::proxy::Proxied::As(actor)) if s.is(Via::Proxy, &actor) => (Some(s), false),
        // A session is opened by a page load only: a POST (perhaps cross-site)
        // never replaces the browser's session, and finds none if it has none.
        (old, super::proxy::Proxied::As(actor))
            if request.method() == Method::GET || request.method() == Method::HEAD =>
        {
            tracing::info!(actor = %actor.name, "dashboard sign-in through the proxy");
            if let Some(old) = old.filter(|old| old.via != Via::Proxy) {
                // Given way to the user the proxy names: ended, not left open. (A
                // proxy's session is its user's one session, which their other
                // browsers use: it holds only while the proxy vouches anyway.)
                ui.sessions.remove(&old.id).await;
            }
            // Only a configured proxy names a user (`Proxied::As`).
            let Some(proxy) = ui.options.trusted_proxy.as_ref() else {
                return StatusCode::INTERNAL_SERVER_ERROR.into_response();
            };
            match ui
                .sessions
                .for_proxy_user(actor, &proxy.secret, &ui.auth)
                .await
            {
                Ok(s) => (Some(s), true),
                Err(e) => return e.into_response(),
            }
        }
        (_, super::proxy::Proxied::As(_)) => (None, false),
        // A proxy's session holds only while the proxy vouches for it: reached
        // without it (another address, the proxy gone from the configuration, no
        // header), it is no session, whatever role it was opened with.
        (Some(s), super::proxy::Proxied::No) if s.via == Via::Proxy => (None, false),
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
                if let Ok(v) = set_cookie(&ui, &session_name, &id, max_age).parse() {
                    response.headers_mut().append(header::SET_COOKIE, v);
                }
            }
            response
        }
        None => {
            let login = ui.at("/login");
            let wants_events = request
                .headers()
                .get(header::ACCEPT)
                .and_then(|v| v.to_str().ok())
                .is_some_and(|v| v.contains("text/event-stream"));
            if wants_events {
                // 204 tells an EventSource to stop reconnecting (a login page would
                // only make it retry forever).
                StatusCode::NO_CONTENT.into_response()
            } else if request.headers().contains_key("hx-request") {
                // htmx follows this header with a full page load.
                let mut r = StatusCode::UNAUTHORIZED.into_response();
                if let Ok(v) = login.parse() {
                    r.headers_mut().insert("hx-redirect", v);
                }
                r
            } else if request.method() == Method::GET || request.method() == Method::HEAD {
                // Back to the page asked for (an alert's deep link keeps its
                // filter) once signed in.
                // The router is nested at the mount point, which the path seen
                // here has lost.
                let asked = request
                    .uri()
                    .path_and_query()
                    .map(|p| p.as_str())
                    .filter(|p| *p != "/")
                    .map(|p| format!("{}{p}", ui.options.base));
                match asked.and_then(|p| return_to(&ui, Some(&p))) {
                    Some(p) => redirect(&format!("{login}?next={}", super::filters::encode(&p))),
                    None => redirect(&login),
                }
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
    /// The page to return to once signed in (`?next=`), checked.
    next: Option<String>,
    nonce: String,
    error: Option<String>,
    notice: Option<&'static str>,
    closed: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
pub(crate) struct LoginQuery {
    token: Option<String>,
    notice: Option<String>,
    next: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
pub(crate) struct LoginForm {
    token: Option<String>,
    login_csrf: Option<String>,
    next: Option<String>,
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

/// Where a login page is asked from: the request's headers (the cookies' names
/// go by its port) and the page to return to.
struct Asked<'a> {
    headers: &'a HeaderMap,
    next: Option<String>,
}

fn login_page(
    ui: &Ui,
    asked: &Asked<'_>,
    status: StatusCode,
    error: Option<String>,
    notice: Option<&'static str>,
) -> Page {
    let nonce = random_or_fail()?;
    let page = LoginPage {
        base: &ui.options.base,
        next: asked.next.clone(),
        nonce: nonce.clone(),
        error,
        notice,
        closed: (!is_open(ui)).then(|| match &ui.options.one_time_renewal {
            Some(renewal) => format!("its one-time login was used: {}", renewal.hint),
            None => AdminError::NotConfigured.to_string(),
        }),
    };
    let body = page.render().map_err(|_| UiError::Render)?;
    let mut response = (status, super::render::html(body)).into_response();
    if let Ok(v) = set_cookie(ui, &login_cookie(ui, asked.headers), &nonce, 3600).parse() {
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
    let used = slot.take();
    // The next one, shown to whoever started the process (the demo prints it).
    if let Some(renewal) = &ui.options.one_time_renewal {
        *slot = (renewal.next)();
    }
    used.map(|login| Actor {
        name: login.name,
        role: login.role,
    })
}

/// What the login page says of a one-time login link that did not open a
/// session: used or wrong, and where a fresh one is, if one follows.
fn spent_link(ui: &Ui) -> String {
    let mut text =
        "this login link was already used or is not valid; log in with a token".to_owned();
    if let Some(renewal) = &ui.options.one_time_renewal {
        text = format!(
            "this login link was already used or is not valid: {}",
            renewal.hint
        );
    }
    text
}

async fn open_session(ui: &Ui, asked: &Asked<'_>, actor: Actor, via: Via) -> Page {
    tracing::info!(actor = %actor.name, "dashboard login");
    let session = ui.sessions.create(actor, via, &ui.auth).await?;
    let mut response = redirect(&asked.next.clone().unwrap_or_else(|| ui.home()));
    let max_age = ui.options.session_ttl.as_secs();
    let (session_name, login_name) = (
        session_cookie(ui, asked.headers),
        login_cookie(ui, asked.headers),
    );
    let headers = response.headers_mut();
    if let Ok(v) = set_cookie(ui, &session_name, &session.id, max_age).parse() {
        headers.append(header::SET_COOKIE, v);
    }
    if let Ok(v) = set_cookie(ui, &login_name, "", 0).parse() {
        headers.append(header::SET_COOKIE, v);
    }
    Ok(response)
}

/// `GET <base>/login`: the form; `?token=` a one-time login.
pub(crate) async fn login_form(
    State(ui): State<Arc<Ui>>,
    headers: HeaderMap,
    query: Result<Query<LoginQuery>, axum::extract::rejection::QueryRejection>,
) -> Page {
    let query = query.map(|Query(q)| q).unwrap_or_default();
    let asked = Asked {
        headers: &headers,
        next: return_to(&ui, query.next.as_deref()),
    };
    if let Some(token) = query.token.as_deref() {
        return match take_one_time(&ui, token) {
            Some(actor) => open_session(&ui, &asked, actor, Via::Once).await,
            None => login_page(
                &ui,
                &asked,
                StatusCode::UNAUTHORIZED,
                Some(spent_link(&ui)),
                None,
            ),
        };
    }
    let notice = match query.notice.as_deref() {
        Some("logged_out") => Some("You are logged out."),
        _ => None,
    };
    login_page(&ui, &asked, StatusCode::OK, None, notice)
}

/// `POST <base>/login`: a token (or the one-time secret) opens a session.
pub(crate) async fn login(
    State(ui): State<Arc<Ui>>,
    headers: HeaderMap,
    extensions: axum::http::Extensions,
    form: Result<Form<LoginForm>, FormRejection>,
) -> Page {
    // Garbage (no form, no nonce, another page's nonce) is refused before the
    // limit is asked and costs no allowance: only a failed token counts.
    let Ok(Form(form)) = form else {
        let asked = Asked {
            headers: &headers,
            next: None,
        };
        return login_page(
            &ui,
            &asked,
            StatusCode::BAD_REQUEST,
            Some("the login form was not understood".into()),
            None,
        );
    };
    let asked = Asked {
        headers: &headers,
        next: return_to(&ui, form.next.as_deref()),
    };
    let login_name = login_cookie(&ui, &headers);
    let nonce = cookie(&headers, &login_name).unwrap_or("");
    let sent = form.login_csrf.as_deref().unwrap_or("");
    if nonce.is_empty() || !bool::from(nonce.as_bytes().ct_eq(sent.as_bytes())) {
        return login_page(
            &ui,
            &asked,
            StatusCode::FORBIDDEN,
            Some("the login form expired or did not come from this page; try again".into()),
            None,
        );
    }
    let client = client_of(&ui, peer_of(&extensions), &headers);
    if let Err(wait) = ui.login_limit.check(client) {
        // Rounded up: a client that waits what it is told is not refused again.
        let seconds = wait.as_secs() + u64::from(wait.subsec_nanos() > 0);
        tracing::warn!(client = ?client, "dashboard login attempts limited");
        let mut page = login_page(
            &ui,
            &asked,
            StatusCode::TOO_MANY_REQUESTS,
            Some(format!(
                "too many failed login attempts from your address; try again in {seconds} s"
            )),
            None,
        )?;
        if let Ok(v) = seconds.to_string().parse() {
            page.headers_mut().insert(header::RETRY_AFTER, v);
        }
        return Ok(page);
    }
    let token = form.token.unwrap_or_default();
    if let Some(actor) = take_one_time(&ui, &token) {
        return open_session(&ui, &asked, actor, Via::Once).await;
    }
    match ui.auth.token(token.as_bytes()) {
        Ok(token) => {
            let who = Actor {
                name: token.name.clone(),
                role: token.role,
            };
            open_session(&ui, &asked, who, Via::Token).await
        }
        Err(AdminError::NotConfigured) => login_page(
            &ui,
            &asked,
            StatusCode::FORBIDDEN,
            Some(AdminError::NotConfigured.to_string()),
            None,
        ),
        Err(_) => {
            ui.login_limit.failed(client);
            login_page(
                &ui,
                &asked,
                StatusCode::UNAUTHORIZED,
                Some("unknown token".into()),
                None,
            )
        }
    }
}

/// The client a login came from, whose failures are counted: the TCP peer, or
/// when the peer is a declared forwarder or the trusted proxy (vouching with its
/// secret) the address it says it forwarded for (else every client would share
/// the proxy's allowance).
fn client_of(
    ui: &Ui,
    peer: Option<std::net::IpAddr>,
    headers: &HeaderMap,
) -> Option<std::net::IpAddr> {
    let vouched = ui
        .options
        .trusted_proxy
        .as_ref()
        .is_some_and(|p| p.vouches(peer, headers));
    if vouched {
        super::proxy::forwarded_for(headers).or(peer)
    } else {
        crate::client::client_of(peer, headers, &ui.options.forwarders)
    }
}

#[derive(Debug, Default, Deserialize)]
pub(crate) struct CsrfForm {
    pub(crate) csrf: Option<String>,
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
    ui.sessions.remove(&session.id).await;
    tracing::info!(actor = %session.actor.name, "dashboard logout");
    let mut response = redirect(&ui.at("/login?notice=logged_out"));
    if let Ok(v) = set_cookie(&ui, &session_cookie(&ui, &headers), "", 0).parse() {
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
