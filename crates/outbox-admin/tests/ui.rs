//! The dashboard through its router (tower `oneshot`, no network): login, sessions,
//! CSRF, read-only refusal, every page, filters, actions and bulk actions.

mod support;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::http::{Request, StatusCode, header};
use outbox_adapters_memory::{
    MemoryAuditLog, MemoryInboxStore, MemoryOutboxStore, MemorySweepState,
};
use outbox_admin::{
    AdminAuth, AdminPorts, AdminService, AdminToken, OneTimeLogin, Role, Secret, UiOptions,
    ui_router,
};
use outbox_ports::{AuditLog, OutboxOperator, SystemClock};
use support::{Harness, READ, WRITE, message, tokens};
use tower::ServiceExt;

fn ui_harness(tokens: Vec<AdminToken>, options: UiOptions) -> Harness {
    ui_harness_with(tokens, options, |s| s)
}

fn ui_harness_with(
    tokens: Vec<AdminToken>,
    options: UiOptions,
    configure: impl FnOnce(AdminService) -> AdminService,
) -> Harness {
    let clock = Arc::new(SystemClock);
    let outbox = Arc::new(MemoryOutboxStore::new(clock.clone()));
    let inbox = Arc::new(MemoryInboxStore::new(clock.clone()).with_pauses(&outbox.pauses()));
    let audit = Arc::new(MemoryAuditLog::new(clock.clone()));
    let state = Arc::new(MemorySweepState::new(clock));
    let service = AdminService::new(AdminPorts {
        outbox: outbox.clone(),
        inbox: inbox.clone(),
        audit: audit.clone(),
        outbox_store: outbox.clone(),
        pauses: Arc::new(outbox.pauses()),
    })
    .with_sweep_reports(state.clone(), vec!["relay-sweep".into()]);
    let service = configure(service);
    let app = Router::new().nest("/ui", ui_router(service, AdminAuth::new(tokens), options));
    Harness {
        outbox,
        inbox,
        audit,
        state,
        app,
    }
}

fn harness() -> Harness {
    ui_harness(tokens(), UiOptions::default())
}

struct Answer {
    status: StatusCode,
    headers: axum::http::HeaderMap,
    body: String,
}

impl Answer {
    fn location(&self) -> &str {
        self.headers
            .get(header::LOCATION)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
    }
}

/// A stream of server-sent events as it arrives.
struct Events {
    body: axum::body::BodyDataStream,
    buffer: String,
}

impl Events {
    /// The next event (its lines), or `None` when the stream ended or nothing came
    /// within `wait`. Keep-alive comments are skipped.
    async fn next(&mut self, wait: Duration) -> Option<String> {
        use futures::StreamExt as _;
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            if let Some(end) = self.buffer.find("\n\n") {
                let event: String = self.buffer.drain(..end + 2).collect();
                if event.lines().all(|l| l.starts_with(':')) {
                    continue;
                }
                return Some(event);
            }
            let chunk = tokio::time::timeout_at(deadline, self.body.next())
                .await
                .ok()??
                .ok()?;
            self.buffer.push_str(&String::from_utf8_lossy(&chunk));
        }
    }

    /// Whether the stream ends (the server closes it) within `wait`: what comes
    /// before that (events, keep-alives) is read and dropped.
    async fn ends_within(&mut self, wait: Duration) -> bool {
        use futures::StreamExt as _;
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            match tokio::time::timeout_at(deadline, self.body.next()).await {
                Err(_) => return false,
                Ok(None | Some(Err(_))) => return true,
                Ok(Some(Ok(_))) => {}
            }
        }
    }
}

/// A browser: keeps cookies, sends forms.
struct Browser {
    app: Router,
    cookies: HashMap<String, String>,
    /// The `Host` header sent (none by default).
    host: Option<String>,
}

impl Browser {
    fn new(h: &Harness) -> Self {
        Self {
            app: h.app.clone(),
            cookies: HashMap::new(),
            host: None,
        }
    }

    async fn send(&mut self, method: &str, path: &str, form: Option<String>) -> Answer {
        let mut request = Request::builder().method(method).uri(path);
        if let Some(host) = &self.host {
            request = request.header(header::HOST, host);
        }
        if !self.cookies.is_empty() {
            let cookie: Vec<String> = self
                .cookies
                .iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect();
            request = request.header(header::COOKIE, cookie.join("; "));
        }
        let body = match form {
            Some(form) => {
                request = request.header(header::CONTENT_TYPE, "application/x-www-form-urlencoded");
                Body::from(form)
            }
            None => Body::empty(),
        };
        let response = self
            .app
            .clone()
            .oneshot(request.body(body).expect("request"))
            .await
            .expect("infallible");
        let status = response.status();
        let headers = response.headers().clone();
        for set in headers.get_all(header::SET_COOKIE) {
            let set = set.to_str().expect("ascii");
            let pair = set.split(';').next().unwrap_or("");
            if let Some((k, v)) = pair.split_once('=') {
                if v.is_empty() {
                    self.cookies.remove(k);
                } else {
                    self.cookies.insert(k.to_owned(), v.to_owned());
                }
            }
        }
        let bytes = axum::body::to_bytes(response.into_body(), 16 << 20)
            .await
            .expect("body");
        Answer {
            status,
            headers,
            body: String::from_utf8(bytes.to_vec()).expect("utf-8"),
        }
    }

    async fn get(&mut self, path: &str) -> Answer {
        self.send("GET", path, None).await
    }

    /// A GET whose body is read as it comes (a stream of server-sent events).
    async fn open_stream(&self, path: &str) -> (StatusCode, axum::http::HeaderMap, Events) {
        let cookie: Vec<String> = self
            .cookies
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        let request = Request::builder()
            .uri(path)
            .header(header::COOKIE, cookie.join("; "))
            .header(header::ACCEPT, "text/event-stream")
            .body(Body::empty())
            .expect("request");
        let response = self.app.clone().oneshot(request).await.expect("infallible");
        let (status, headers) = (response.status(), response.headers().clone());
        let events = Events {
            body: response.into_body().into_data_stream(),
            buffer: String::new(),
        };
        (status, headers, events)
    }

    async fn post(&mut self, path: &str, form: &str) -> Answer {
        self.send("POST", path, Some(form.to_owned())).await
    }

    /// Logs in with `token` through the form (fetching its nonce first).
    async fn login(&mut self, token: &str) -> Answer {
        let form = self.get("/ui/login").await;
        let nonce = value_of(&form.body, "login_csrf").expect("the form has a nonce");
        self.post(
            "/ui/login",
            &format!("token={}&login_csrf={nonce}", encode(token)),
        )
        .await
    }

    /// This session's CSRF token, from a page's logout form.
    async fn csrf(&mut self) -> String {
        let page = self.get("/ui").await;
        value_of(&page.body, "csrf").expect("a page of a session has a csrf field")
    }
}

fn encode(s: &str) -> String {
    s.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
                char::from(b).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

/// The `value` of the first `<input name="{name}" value="...">`.
fn value_of(html: &str, name: &str) -> Option<String> {
    let at = html.find(&format!("name=\"{name}\" value=\""))?;
    let rest = &html[at + name.len() + 15..];
    Some(rest[..rest.find('"')?].to_owned())
}

/// HTML entities as askama writes them, back to text.
fn unescape(html: &str) -> String {
    html.replace("&#38;", "&")
        .replace("&#60;", "<")
        .replace("&#62;", ">")
        .replace("&#34;", "\"")
        .replace("&#39;", "'")
        .replace("&amp;", "&")
}

fn rows(html: &str) -> usize {
    let Some(start) = html.find("<tbody>") else {
        return 0;
    };
    let end = html[start..]
        .find("</tbody>")
        .map_or(html.len(), |e| start + e);
    html[start..end].matches("<tr").count()
}

#[tokio::test]
async fn without_tokens_nobody_can_log_in_and_the_page_names_the_setting() {
    let h = ui_harness(vec![], UiOptions::default());
    let mut b = Browser::new(&h);
    let page = b.get("/ui/login").await;
    assert_eq!(page.status, StatusCode::OK);
    assert!(page.body.contains("[[admin.tokens]]"), "{}", page.body);
    assert!(!page.body.contains("name=\"token\""), "no form when closed");
    let nonce = b.cookies.get("outbox_login").cloned().unwrap_or_default();
    let answer = b
        .post("/ui/login", &format!("token={WRITE}&login_csrf={nonce}"))
        .await;
    assert_eq!(answer.status, StatusCode::FORBIDDEN);
    assert!(!b.cookies.contains_key("outbox_session"));
    let page = b.get("/ui").await;
    assert_eq!(page.status, StatusCode::SEE_OTHER);
}

#[tokio::test]
async fn login_logout_and_the_cookie_and_security_headers() {
    let h = harness();
    let mut b = Browser::new(&h);
    let page = b.get("/ui/messages").await;
    assert_eq!(page.status, StatusCode::SEE_OTHER);
    assert_eq!(page.location(), "/ui/login?next=%2Fui%2Fmessages");
    let home = b.get("/ui").await;
    assert_eq!(home.location(), "/ui/login", "home needs no way back");

    let form = b.get("/ui/login").await;
    assert!(
        form.body
            .contains(r#"type="password" id="token" name="token""#)
    );
    let csp = form
        .headers
        .get(header::CONTENT_SECURITY_POLICY)
        .expect("csp");
    assert!(
        csp.to_str()
            .expect("ascii")
            .starts_with("default-src 'self'")
    );

    let wrong = b.login("not-a-token-at-all").await;
    assert_eq!(wrong.status, StatusCode::UNAUTHORIZED);
    assert!(wrong.body.contains("unknown token") && wrong.body.contains("name=\"token\""));
    assert!(!wrong.body.contains("not-a-token-at-all"), "never echoed");

    let ok = b.login(WRITE).await;
    assert_eq!(ok.status, StatusCode::SEE_OTHER, "{}", ok.body);
    assert_eq!(ok.location(), "/ui");
    let cookie = ok
        .headers
        .get_all(header::SET_COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .find(|c| c.starts_with("outbox_session="))
        .expect("session cookie")
        .to_owned();
    for part in ["HttpOnly", "SameSite=Strict", "Path=/ui", "Max-Age=28800"] {
        assert!(cookie.contains(part), "{cookie}");
    }
    assert!(!cookie.contains("Secure"), "not over TLS here: {cookie}");
    assert!(!cookie.contains(WRITE), "the token is not the cookie");

    let overview = b.get("/ui").await;
    assert_eq!(overview.status, StatusCode::OK);
    assert!(
        overview
            .body
            .contains("Signed in as <strong id=\"actor\">ops</strong>")
    );
    assert!(
        overview.body.contains(r#"<a href="/ui/messages""#),
        "nav link"
    );

    // Logging out needs the CSRF token too.
    let refused = b.post("/ui/logout", "").await;
    assert_eq!(refused.status, StatusCode::FORBIDDEN);
    let old = b.cookies.clone();
    let csrf = b.csrf().await;
    let out = b.post("/ui/logout", &format!("csrf={csrf}")).await;
    assert_eq!(out.status, StatusCode::SEE_OTHER);
    assert_eq!(out.location(), "/ui/login?notice=logged_out");
    assert_eq!(b.get("/ui").await.status, StatusCode::SEE_OTHER);
    // The old cookie is dead on the server, not only forgotten by the browser.
    b.cookies = old;
    assert_eq!(b.get("/ui").await.status, StatusCode::SEE_OTHER);
    let post = b.post("/ui/logout", &format!("csrf={csrf}")).await;
    assert_eq!(post.status, StatusCode::UNAUTHORIZED);
}

#[tokio::test]
async fn a_login_post_without_the_forms_nonce_is_refused() {
    let h = harness();
    let mut b = Browser::new(&h);
    let answer = b
        .post("/ui/login", &format!("token={WRITE}&login_csrf=forged"))
        .await;
    assert_eq!(answer.status, StatusCode::FORBIDDEN);
    assert!(!b.cookies.contains_key("outbox_session"));
}

#[tokio::test]
async fn secure_cookies_when_configured_and_sessions_expire() {
    let h = ui_harness(
        tokens(),
        UiOptions {
            secure_cookies: true,
            session_ttl: Duration::ZERO,
            ..UiOptions::default()
        },
    );
    let mut b = Browser::new(&h);
    let ok = b.login(READ).await;
    let cookie = ok
        .headers
        .get_all(header::SET_COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .find(|c| c.starts_with("__Host-outbox_session="))
        .expect("session cookie, with the __Host- prefix when secure")
        .to_owned();
    assert!(cookie.contains("; Secure"), "{cookie}");
    assert!(
        cookie.contains("; Path=/;") && !cookie.contains("Domain"),
        "a __Host- cookie is for the whole host: {cookie}"
    );
    let form = Browser::new(&h).get("/ui/login").await;
    let nonce = form
        .headers
        .get_all(header::SET_COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .find(|c| c.starts_with("__Host-outbox_login="))
        .expect("the login nonce cookie has the __Host- prefix too");
    assert!(
        nonce.contains("; Path=/;") && nonce.contains("; Secure"),
        "{nonce}"
    );
    // A session of zero length is over at once.
    assert_eq!(b.get("/ui").await.status, StatusCode::SEE_OTHER);
}

#[tokio::test]
async fn a_one_time_login_works_once() {
    let h = ui_harness(
        vec![],
        UiOptions {
            one_time_login: Some(OneTimeLogin {
                secret: Secret::new("one-time-secret-0123456789"),
                name: "demo".into(),
                role: Role::Write,
            }),
            ..UiOptions::default()
        },
    );
    let mut b = Browser::new(&h);
    let wrong = b.get("/ui/login?token=guess").await;
    assert_eq!(wrong.status, StatusCode::UNAUTHORIZED);
    let ok = b.get("/ui/login?token=one-time-secret-0123456789").await;
    assert_eq!(ok.status, StatusCode::SEE_OTHER);
    assert!(b.get("/ui").await.body.contains("id=\"actor\">demo<"));
    let mut other = Browser::new(&h);
    let again = other
        .get("/ui/login?token=one-time-secret-0123456789")
        .await;
    assert_eq!(again.status, StatusCode::UNAUTHORIZED, "used up");
    assert!(again.body.contains("[[admin.tokens]]"), "closed once used");
}

#[tokio::test]
async fn writes_need_the_csrf_token_and_a_write_session_and_are_audited() {
    let h = harness();
    let dead = h.dead(message("orders", "a", b"{}")).await;
    let path = format!("/ui/messages/{dead}/requeue");

    let mut ops = Browser::new(&h);
    ops.login(WRITE).await;
    let no_csrf = ops.post(&path, "").await;
    assert_eq!(no_csrf.status, StatusCode::FORBIDDEN);
    assert!(no_csrf.body.contains("CSRF"), "{}", no_csrf.body);
    let wrong = ops.post(&path, "csrf=0000").await;
    assert_eq!(wrong.status, StatusCode::FORBIDDEN);

    let mut viewer = Browser::new(&h);
    viewer.login(READ).await;
    let detail = viewer.get(&format!("/ui/messages/{dead}")).await;
    assert_eq!(detail.status, StatusCode::OK);
    for verb in ["Requeue</button>", "Delete</button>", "all matching"] {
        assert!(!detail.body.contains(verb), "read-only sees no {verb}");
    }
    assert!(
        !viewer
            .get("/ui/messages")
            .await
            .body
            .contains("all matching")
    );
    // Even with its own valid CSRF token, a read session may not write.
    let viewer_csrf = viewer.csrf().await;
    let forged = viewer.post(&path, &format!("csrf={viewer_csrf}")).await;
    assert_eq!(forged.status, StatusCode::FORBIDDEN);
    assert!(forged.body.contains("read role"), "{}", forged.body);
    let unchanged = h
        .outbox
        .get_message(dead)
        .await
        .expect("get")
        .expect("there");
    assert_eq!(unchanged.status, outbox_core::OutboxStatus::Dead);

    // Another session's token is not this one's.
    let other = ops.post(&path, &format!("csrf={viewer_csrf}")).await;
    assert_eq!(other.status, StatusCode::FORBIDDEN);

    let detail = ops.get(&format!("/ui/messages/{dead}")).await;
    assert!(detail.body.contains(">Requeue</button>"));
    let confirm = ops
        .get(&format!("/ui/messages/{dead}?confirm=requeue"))
        .await;
    assert!(confirm.body.contains("<dialog open"), "{}", confirm.body);
    assert!(confirm.body.contains(">Confirm</button>"));
    assert!(confirm.body.contains(&format!("action=\"{path}\"")));
    let csrf = value_of(&confirm.body, "csrf").expect("csrf");
    let done = ops.post(&path, &format!("csrf={csrf}")).await;
    assert_eq!(done.status, StatusCode::SEE_OTHER, "{}", done.body);
    assert_eq!(
        done.location(),
        format!("/ui/messages/{dead}?notice=requeued")
    );
    let now = h
        .outbox
        .get_message(dead)
        .await
        .expect("get")
        .expect("there");
    assert_eq!(now.status, outbox_core::OutboxStatus::Pending);
    let page = h.audit.list(None, 10).await.expect("audit");
    let entry = &page.items[0];
    assert_eq!(
        (entry.actor.as_str(), entry.action.as_str()),
        ("token:ops", "requeue")
    );
    // The header works too (what htmx sends).
    let again = h.dead(message("orders", "b", b"{}")).await;
    let request = Request::post(format!("/ui/messages/{again}/requeue"))
        .header(
            header::COOKIE,
            format!("outbox_session={}", ops.cookies["outbox_session"]),
        )
        .header("x-csrf-token", &csrf)
        .body(Body::empty())
        .expect("request");
    let answer = h.app.clone().oneshot(request).await.expect("infallible");
    assert_eq!(answer.status(), StatusCode::SEE_OTHER);
}

#[tokio::test]
async fn the_messages_page_filters_by_the_query_and_pages_by_keyset() {
    let h = harness();
    for n in 0..3 {
        h.dead(message("orders", &format!("k{n}"), b"{}")).await;
    }
    h.pending(message("billing", "x", b"pending one")).await;
    let mut b = Browser::new(&h);
    b.login(READ).await;

    let all = b.get("/ui/messages").await;
    assert_eq!(all.status, StatusCode::OK);
    assert_eq!(rows(&all.body), 4);
    assert!(all.body.contains(r#"<select id="f-status" name="status">"#));
    for status in ["pending", "sent", "publish_failed", "dead"] {
        assert!(
            all.body.contains(&format!("<option value=\"{status}\"")),
            "{status}"
        );
    }
    let dead = b.get("/ui/messages?status=dead").await;
    assert_eq!(rows(&dead.body), 3);
    assert!(dead.body.contains(r#"<option value="dead" selected>"#));
    assert!(!dead.body.contains("pending one"));
    let by_exchange = b.get("/ui/messages?exchange=billing&status=").await;
    assert_eq!(rows(&by_exchange.body), 1);
    assert!(by_exchange.body.contains("pending one"));

    let first = b.get("/ui/messages?status=dead&limit=2").await;
    assert_eq!(rows(&first.body), 2);
    let at = first.body.find("rel=\"next\"").expect("a next page");
    let href_start = first.body[..at].rfind("href=\"").expect("href") + 6;
    let href = &first.body[href_start..at - 2];
    let href = unescape(href);
    assert!(
        href.contains("status=dead") && href.contains("cursor="),
        "{href}"
    );
    let second = b.get(&href).await;
    assert_eq!(rows(&second.body), 1);
    assert!(!second.body.contains("rel=\"next\""));

    let bad = b.get("/ui/messages?status=queued").await;
    assert_eq!(bad.status, StatusCode::BAD_REQUEST);
    assert!(bad.body.contains("unknown status `queued`"), "{}", bad.body);
    let bad = b.get("/ui/messages?created_after=yesterday").await;
    assert_eq!(bad.status, StatusCode::BAD_REQUEST);
    let bad = b.get("/ui/messages?cursor=!!").await;
    assert_eq!(bad.status, StatusCode::BAD_REQUEST);
    let bad = b.get("/ui/messages/not-a-uuid").await;
    assert_eq!(bad.status, StatusCode::BAD_REQUEST);
    let missing = b
        .get("/ui/messages/00000000-0000-7000-8000-000000000000")
        .await;
    assert_eq!(missing.status, StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn bulk_requeue_confirms_with_the_dry_run_count_then_acts_on_the_filter() {
    let h = harness();
    for n in 0..3 {
        h.dead(message("orders", &format!("k{n}"), b"{}")).await;
    }
    h.dead(message("billing", "x", b"{}")).await;
    let mut b = Browser::new(&h);
    b.login(WRITE).await;
    let confirm = b
        .get("/ui/messages?status=dead&exchange=orders&confirm=requeue")
        .await;
    assert!(
        confirm
            .body
            .contains("Dry run: 3 messages match this filter"),
        "{}",
        confirm.body
    );
    assert!(confirm.body.contains(r#"action="/ui/messages/requeue""#));
    let one = b
        .get("/ui/messages?status=dead&exchange=billing&confirm=requeue")
        .await;
    assert!(
        one.body.contains("Dry run: 1 message matches this filter")
            && one.body.contains("every matching message?"),
        "one is singular: {}",
        one.body
    );
    let csrf = value_of(&confirm.body, "csrf").expect("csrf");
    let done = b
        .post(
            "/ui/messages/requeue",
            &format!("status=dead&exchange=orders&csrf={csrf}"),
        )
        .await;
    assert_eq!(done.status, StatusCode::SEE_OTHER);
    assert!(
        done.location().contains("notice=requeued-3"),
        "{}",
        done.location()
    );
    let after = b.get(done.location()).await;
    assert!(after.body.contains("Requeued 3."));
    assert_eq!(rows(&after.body), 0, "none of them is dead now");
    assert_eq!(
        h.outbox.count(outbox_core::OutboxStatus::Dead),
        1,
        "billing's is untouched"
    );
    let entry = &h.audit.list(None, 10).await.expect("audit").items[0];
    assert_eq!(entry.action, "requeue_matching");
    assert_eq!(entry.target, r#"{"status":"dead","exchange":"orders"}"#);
    assert_eq!(entry.count, 3);
    // No CSRF token, no bulk action.
    let refused = b.post("/ui/messages/delete", "status=dead").await;
    assert_eq!(refused.status, StatusCode::FORBIDDEN);
    assert_eq!(h.outbox.count(outbox_core::OutboxStatus::Dead), 1);
}

/// The dashboard reconsumes a consumed delivery only because it showed it
/// consumed: its confirm dialog carries `again`, and a post without it (a failed
/// delivery's dialog, say, once its retry consumed it) is refused.
#[tokio::test]
async fn a_consumed_delivery_is_reconsumed_only_from_a_dialog_that_showed_it_consumed() {
    let h = harness();
    let m = message("orders", "created", b"{}");
    h.delivered("billing", &m, true).await;
    let mut b = Browser::new(&h);
    b.login(WRITE).await;
    let here = format!("/ui/consumers/billing/deliveries/{}", m.id);
    let dialog = b.get(&format!("{here}?confirm=reconsume")).await;
    assert_eq!(dialog.status, StatusCode::OK);
    assert!(
        dialog.body.contains(r#"name="again" value="true""#),
        "{}",
        dialog.body
    );
    assert!(dialog.body.contains("runs once more"), "{}", dialog.body);
    let csrf = value_of(&dialog.body, "csrf").expect("csrf");
    let refused = b
        .post(&format!("{here}/reconsume"), &format!("csrf={csrf}"))
        .await;
    assert_eq!(refused.status, StatusCode::CONFLICT, "{}", refused.body);
    let done = b
        .post(
            &format!("{here}/reconsume"),
            &format!("csrf={csrf}&again=true"),
        )
        .await;
    assert_eq!(done.status, StatusCode::SEE_OTHER, "{}", done.body);
    let shown = b.get(&here).await;
    assert!(
        shown.body.contains("received") || shown.body.contains("in progress"),
        "{}",
        shown.body
    );
}

/// A keyed message shows its ordering key and the head it waits behind; the delete
/// dialog of a dead head says what deleting it releases.
#[tokio::test]
async fn a_keyed_message_shows_its_head_and_a_heads_delete_what_it_releases() {
    let h = harness();
    let keyed = || {
        let mut m = message("orders", "created", b"{}");
        m.ordering_key = Some("customer-7".into());
        m
    };
    let (k1, k2, k3) = (keyed(), keyed(), keyed());
    h.dead(k1.clone()).await;
    h.pending(k2.clone()).await;
    h.pending(k3.clone()).await;
    let mut b = Browser::new(&h);
    b.login(WRITE).await;
    let waiting = b.get(&format!("/ui/messages/{}", k2.id)).await;
    assert!(
        waiting.body.contains(r#"id="ordering-key">customer-7<"#),
        "{}",
        waiting.body
    );
    assert!(
        waiting
            .body
            .contains(&format!("/ui/messages/{}\">{}</a>", k1.id, k1.id)),
        "{}",
        waiting.body
    );
    let dialog = b
        .get(&format!("/ui/messages/{}?confirm=delete", k1.id))
        .await;
    assert!(
        dialog.body.contains(
            "It heads ordering key customer-7: the 2 message(s) waiting behind it are released"
        ),
        "{}",
        dialog.body
    );
}

#[tokio::test]
async fn every_page_renders_and_what_users_sent_is_escaped() {
    let h = harness();
    let m = message(
        "orders",
        "<b>key</b>",
        br#"{"note":"<script>alert(1)</script>","n":1}"#,
    );
    let id = h.dead(m.clone()).await;
    h.delivered("billing", &m, false).await;
    h.dead_letter("billing", b"\xff\xfe not utf-8").await;
    let mut b = Browser::new(&h);
    b.login(WRITE).await;

    let overview = b.get("/ui").await;
    assert_eq!(overview.status, StatusCode::OK);
    assert!(overview.body.contains(r#"id="count-dead">"#));
    assert!(overview.body.contains("data-live=\"/ui/overview/stream\""));
    assert!(overview.body.contains("<svg class=\"chart\""));
    assert!(overview.body.contains("data-consumer=\"billing\""));
    let paused = b.get("/ui?paused=1").await;
    assert!(!paused.body.contains("data-live="), "paused: no stream");
    assert!(paused.body.contains("Resume live refresh"));
    let live = b.get("/ui/overview/live").await;
    assert!(
        live.body.starts_with("<section id=\"live\""),
        "{}",
        live.body
    );

    let detail = b.get(&format!("/ui/messages/{id}")).await;
    assert_eq!(detail.status, StatusCode::OK);
    assert!(!detail.body.contains("<script>alert"), "escaped");
    let text = unescape(&detail.body);
    assert!(text.contains("<script>alert(1)</script>"), "shown as text");
    assert!(text.contains("<b>key</b>"));
    assert!(!detail.body.contains("<b>key"), "escaped");
    assert!(detail.body.contains("(json, "), "pretty JSON");
    assert!(text.contains("\n  \"n\": 1"), "{}", detail.body);
    assert!(detail.body.contains("/ui/consumers/billing/deliveries/"));
    let list = b.get("/ui/messages").await;
    assert!(!list.body.contains("<script>alert"));

    let delivery = b
        .get(&format!("/ui/consumers/billing/deliveries/{id}"))
        .await;
    assert_eq!(delivery.status, StatusCode::OK);
    assert!(delivery.body.contains(">Reconsume</button>"));
    let csrf = value_of(&delivery.body, "csrf").expect("csrf");
    let done = b
        .post(
            &format!("/ui/consumers/billing/deliveries/{id}/reconsume"),
            &format!("csrf={csrf}"),
        )
        .await;
    assert_eq!(done.status, StatusCode::SEE_OTHER, "{}", done.body);

    for (path, expect) in [
        ("/ui/consumers", "billing"),
        ("/ui/consumers/billing", "Deliveries of billing"),
        ("/ui/consumers/billing?status=pending", "unknown status"),
        ("/ui/dead-letters", "billing"),
        ("/ui/dead-letters/1", "(hex, "),
        ("/ui/audit", "reconsume"),
        ("/ui/assets/style.css", "prefers-color-scheme"),
        ("/ui/assets/htmx.min.js", "htmx"),
        ("/ui/assets/favicon.svg", "<svg"),
        ("/ui", "assets/favicon.svg"),
        ("/ui/no-such-page", "no such page"),
    ] {
        let page = b.get(path).await;
        assert!(page.body.contains(expect), "{path}: {}", page.body);
        assert!(
            page.headers.contains_key(header::CONTENT_SECURITY_POLICY),
            "{path}"
        );
    }
    assert_eq!(
        b.get("/ui/consumers/billing?status=pending").await.status,
        StatusCode::BAD_REQUEST
    );
    assert_eq!(
        b.get("/ui/dead-letters/x").await.status,
        StatusCode::BAD_REQUEST
    );
    assert_eq!(
        b.get("/ui/dead-letters/99").await.status,
        StatusCode::NOT_FOUND
    );
    assert_eq!(
        b.get("/ui/no-such-page").await.status,
        StatusCode::NOT_FOUND
    );

    // A NUL in a consumer name is refused before any store sees it (PostgreSQL
    // text cannot hold one: it would be a store error, a 5xx).
    for path in [
        "/ui/consumers/a%00b",
        &format!("/ui/consumers/a%00b/deliveries/{id}"),
        "/ui/dead-letters?consumer=a%00b",
    ] {
        let page = b.get(path).await;
        assert_eq!(
            page.status,
            StatusCode::BAD_REQUEST,
            "{path}: {}",
            page.body
        );
    }
    // Pages of a consumer named "assets" are pages: not cacheable.
    let assets_consumer = b
        .get(&format!("/ui/consumers/assets/deliveries/{id}"))
        .await;
    assert_eq!(
        assets_consumer
            .headers
            .get(header::CACHE_CONTROL)
            .and_then(|v| v.to_str().ok()),
        Some("no-store"),
        "a consumer's page is never cached, whatever its name"
    );

    let dark = b.get("/ui/theme?set=dark").await;
    assert_eq!(dark.status, StatusCode::SEE_OTHER);
    assert!(b.get("/ui").await.body.contains("data-theme=\"dark\""));
}

#[tokio::test]
async fn deleting_a_dead_letter_and_a_message_go_through_the_service() {
    let h = harness();
    let id = h.dead(message("orders", "a", b"x")).await;
    h.dead_letter("billing", b"junk").await;
    let mut b = Browser::new(&h);
    b.login(WRITE).await;
    let confirm = b.get("/ui/dead-letters/1?confirm=delete").await;
    assert!(confirm.body.contains(">Confirm</button>"));
    let csrf = value_of(&confirm.body, "csrf").expect("csrf");
    let done = b
        .post("/ui/dead-letters/1/delete", &format!("csrf={csrf}"))
        .await;
    assert_eq!(done.status, StatusCode::SEE_OTHER);
    assert_eq!(
        b.get("/ui/dead-letters/1").await.status,
        StatusCode::NOT_FOUND
    );
    let done = b
        .post(
            &format!("/ui/messages/{id}/delete"),
            &format!("csrf={csrf}"),
        )
        .await;
    assert_eq!(done.status, StatusCode::SEE_OTHER);
    assert!(h.outbox.get_message(id).await.expect("get").is_none());
    let again = b
        .post(
            &format!("/ui/messages/{id}/delete"),
            &format!("csrf={csrf}"),
        )
        .await;
    assert_eq!(again.status, StatusCode::NOT_FOUND);
    let actions: Vec<String> = h
        .audit
        .list(None, 10)
        .await
        .expect("audit")
        .items
        .into_iter()
        .map(|e| format!("{} {}", e.actor, e.action))
        .collect();
    assert_eq!(
        actions,
        ["token:ops delete", "token:ops delete_dead_letter"]
    );
}

#[tokio::test]
async fn a_delayed_message_is_scheduled_and_can_be_published_now() {
    let h = harness();
    let mut m = message("orders", "later", b"{}");
    let due = outbox_core::Timestamp::now_utc() + time::Duration::hours(3);
    m.not_before = Some(due);
    let id = h.pending(m).await;
    let mut b = Browser::new(&h);
    b.login(WRITE).await;
    let overview = b.get("/ui").await;
    assert!(
        overview.body.contains(r#"id="count-scheduled">1<"#),
        "{}",
        overview.body
    );
    let list = b.get("/ui/messages?status=pending").await;
    assert!(
        list.body
            .contains(&format!(r#"data-id="{id}" data-status="scheduled""#)),
        "{}",
        list.body
    );
    let detail = b.get(&format!("/ui/messages/{id}")).await;
    assert!(detail.body.contains(r#"id="due-at""#), "{}", detail.body);
    assert!(
        detail.body.contains(">Publish now</button>"),
        "{}",
        detail.body
    );
    let confirm = b
        .get(&format!("/ui/messages/{id}?confirm=publish%20now"))
        .await;
    assert!(
        confirm
            .body
            .contains(&format!(r#"action="/ui/messages/{id}/publish-now""#)),
        "{}",
        confirm.body
    );
    let csrf = value_of(&confirm.body, "csrf").expect("csrf");
    let done = b
        .post(
            &format!("/ui/messages/{id}/publish-now"),
            &format!("csrf={csrf}"),
        )
        .await;
    assert_eq!(done.status, StatusCode::SEE_OTHER, "{}", done.body);
    let record = h.outbox.get_message(id).await.expect("get").expect("there");
    assert_eq!(record.message.not_before, None, "due now");
    let after = b.get(&format!("/ui/messages/{id}")).await;
    assert!(!after.body.contains(">Publish now</button>"));
    let mut viewer = Browser::new(&h);
    viewer.login(READ).await;
    let mut other = message("orders", "later2", b"{}");
    other.not_before = Some(due);
    let other = h.pending(other).await;
    let seen = viewer.get(&format!("/ui/messages/{other}")).await;
    assert!(!seen.body.contains(">Publish now</button>"), "read-only");
}

/// The overview's blocked-keys count links to the list of blocked keys, where
/// each key links to its head message (requeue and delete are there); keys are
/// escaped and a read session sees the list too.
#[tokio::test]
async fn the_blocked_keys_count_links_to_the_keys_and_their_heads() {
    let h = harness();
    let keyed = |k: &str| {
        let mut m = message("orders", "order.created", b"{}");
        m.ordering_key = Some(k.to_owned());
        m
    };
    let head = h.dead(keyed("<i>acct-7</i>")).await;
    h.pending(keyed("<i>acct-7</i>")).await;
    h.pending(keyed("acct-9")).await; // a pending head: not blocked
    let mut b = Browser::new(&h);
    b.login(READ).await;

    let overview = b.get("/ui").await;
    assert!(
        overview
            .body
            .contains(r#"id="count-blocked-keys"><a href="/ui/ordering/blocked-keys">1</a>"#),
        "{}",
        overview.body
    );
    let page = b.get("/ui/ordering/blocked-keys").await;
    assert_eq!(page.status, StatusCode::OK, "{}", page.body);
    assert!(
        page.body
            .contains(&format!(r#"<a href="/ui/messages/{head}">{head}</a>"#))
    );
    assert!(!page.body.contains("<i>acct-7"), "the key is escaped");
    assert!(unescape(&page.body).contains("<i>acct-7</i>"));
    assert!(
        !page.body.contains("acct-9"),
        "a pending head blocks nothing"
    );
    assert!(page.body.contains("broker said no"));
    assert!(page.body.contains(">dead<"));
    let head_page = b.get(&format!("/ui/messages/{head}")).await;
    assert_eq!(head_page.status, StatusCode::OK);
    let bad = b.get("/ui/ordering/blocked-keys?after=%00").await;
    assert_eq!(bad.status, StatusCode::BAD_REQUEST);
    assert!(
        !page.body.contains("Requeue every head"),
        "a read session has no write button"
    );

    // More blocked keys (making one dead claims what is pending: acct-9's head
    // is dead too now); a write session requeues every head after a dialog that
    // counts the keys; the keys' later messages then follow their heads.
    let other = h.dead(keyed("acct-11")).await;
    let mut ops = Browser::new(&h);
    ops.login(WRITE).await;
    let list = ops.get("/ui/ordering/blocked-keys").await;
    assert!(list.body.contains("Requeue every head…"), "{}", list.body);
    let dialog = ops.get("/ui/ordering/blocked-keys?confirm=requeue").await;
    assert!(
        unescape(&dialog.body).contains("Dry run: 3 keys are blocked."),
        "{}",
        dialog.body
    );
    let forged = ops.post("/ui/ordering/blocked-keys/requeue", "").await;
    assert_eq!(forged.status, StatusCode::FORBIDDEN, "no CSRF token");
    let csrf = ops.csrf().await;
    let done = ops
        .post("/ui/ordering/blocked-keys/requeue", &format!("csrf={csrf}"))
        .await;
    assert_eq!(done.status, StatusCode::SEE_OTHER, "{}", done.body);
    assert_eq!(
        done.location(),
        "/ui/ordering/blocked-keys?notice=requeued-3"
    );
    for id in [head, other] {
        let record = outbox_ports::OutboxOperator::get_message(&*h.outbox, id)
            .await
            .expect("get")
            .expect("kept");
        assert_eq!(record.status, outbox_core::OutboxStatus::Pending, "{id}");
    }
    let after = ops.get("/ui/ordering/blocked-keys").await;
    assert!(after.body.contains(r#"id="empty""#), "{}", after.body);
    let audit = outbox_ports::AuditLog::list(&*h.audit, None, 50)
        .await
        .expect("audit")
        .items;
    assert!(
        audit
            .iter()
            .any(|e| e.action == "requeue_blocked_heads" && e.count == 3),
        "{audit:?}"
    );
}

/// The failures page groups failing and dead ones by error, per exchange and per
/// consumer, each linking to its dead ones; what users sent is escaped; the
/// navigation leads there; a read session sees it.
#[tokio::test]
async fn the_failures_page_groups_by_error_and_links_to_the_dead_ones() {
    let h = harness();
    h.dead(message("<b>orders</b>", "order.created", b"{}"))
        .await;
    h.dead(message("<b>orders</b>", "order.created", b"{}"))
        .await;
    h.delivered("billing", &message("orders", "order.created", b"{}"), false)
        .await;
    let mut b = Browser::new(&h);
    b.login(READ).await;
    let page = b.get("/ui/failures").await;
    assert_eq!(page.status, StatusCode::OK, "{}", page.body);
    assert!(
        page.body
            .contains(r#"href="/ui/failures" aria-current="page""#)
    );
    assert!(!page.body.contains("<b>orders"), "escaped");
    let text = unescape(&page.body);
    assert!(text.contains("exchange <b>orders</b>"), "{text}");
    // Each group links to its own members (the group's error in the filter),
    // all of them and its dead ones.
    assert!(
        page.body.contains(
            r#"href="/ui/messages?exchange=%3Cb%3Eorders%3C%2Fb%3E&#38;error=broker%20said%20no""#
        ),
        "{}",
        page.body
    );
    assert!(
        page.body.contains(
            r#"href="/ui/messages?exchange=%3Cb%3Eorders%3C%2Fb%3E&#38;error=broker%20said%20no&#38;status=dead""#
        ),
        "{}",
        page.body
    );
    assert!(
        page.body
            .contains(r#"href="/ui/consumers/billing?error=handler%20failed&#38;status=dead""#),
        "{}",
        page.body
    );
    assert!(page.body.contains("broker said no") && page.body.contains("handler failed"));
    let rows: Vec<&str> = page
        .body
        .split("<tr><td class=\"num\" data-label=\"Count\">")
        .skip(1)
        .collect();
    assert_eq!(rows.len(), 2, "{}", page.body);
    assert!(
        rows[0].starts_with("2<"),
        "the exchange's group of two first"
    );
}

#[tokio::test]
async fn a_consumer_is_paused_and_resumed_from_the_page_behind_the_dialog() {
    let h = harness();
    h.delivered("billing", &message("orders", "order.created", b"{}"), true)
        .await;
    let mut reader = Browser::new(&h);
    reader.login(READ).await;
    let page = reader.get("/ui/consumers").await;
    assert!(
        !page.body.contains(">Pause<"),
        "a reader is offered no pause"
    );
    let page = reader
        .get("/ui/pauses?confirm=pause&kind=consumer&name=billing")
        .await;
    assert!(!page.body.contains("<dialog"), "no dialog for a reader");
    assert!(!page.body.contains("pause-form"));

    let mut b = Browser::new(&h);
    b.login(WRITE).await;
    let page = b.get("/ui/consumers").await;
    assert!(page.body.contains(">Pause<"), "{}", page.body);
    assert!(!page.body.contains(">paused<"));
    let dialog = b
        .get("/ui/pauses?confirm=pause&kind=consumer&name=billing")
        .await;
    assert_eq!(dialog.status, StatusCode::OK, "{}", dialog.body);
    assert!(
        dialog.body.contains("Pause consumer billing?"),
        "{}",
        dialog.body
    );
    assert!(
        dialog.body.contains(r#"action="/ui/pauses/pause""#),
        "{}",
        dialog.body
    );
    let csrf = b.csrf().await;
    // Without the session's token nothing is paused.
    let refused = b
        .post("/ui/pauses/pause", "kind=consumer&name=billing")
        .await;
    assert_eq!(refused.status, StatusCode::FORBIDDEN);
    assert!(
        !outbox_ports::InboxConsumerPath::consumer_paused(&*h.inbox, "billing")
            .await
            .expect("read")
    );
    let done = b
        .post(
            "/ui/pauses/pause",
            &format!("csrf={csrf}&kind=consumer&name=billing"),
        )
        .await;
    assert_eq!(done.status, StatusCode::SEE_OTHER, "{}", done.body);
    assert_eq!(done.location(), "/ui/pauses?notice=paused");
    assert!(
        outbox_ports::InboxConsumerPath::consumer_paused(&*h.inbox, "billing")
            .await
            .expect("read")
    );
    let page = b.get("/ui/pauses?notice=paused").await;
    assert!(page.body.contains("id=\"notice\""));
    assert_eq!(rows(&page.body), 1, "{}", page.body);
    assert!(page.body.contains(">paused<") && page.body.contains(">Resume<"));
    let page = b.get("/ui/consumers").await;
    assert!(page.body.contains(">paused<"), "the badge: {}", page.body);
    assert!(page.body.contains(">Resume<"));

    let done = b
        .post(
            "/ui/pauses/resume",
            &format!("csrf={csrf}&kind=consumer&name=billing"),
        )
        .await;
    assert_eq!(done.location(), "/ui/pauses?notice=resumed");
    assert!(
        !outbox_ports::InboxConsumerPath::consumer_paused(&*h.inbox, "billing")
            .await
            .expect("read")
    );
    let page = b.get("/ui/pauses").await;
    assert!(page.body.contains("Nothing is paused."), "{}", page.body);
    let audit: Vec<String> = outbox_ports::AuditLog::list(&*h.audit, None, 10)
        .await
        .expect("audit")
        .items
        .into_iter()
        .map(|e| format!("{} {}", e.action, e.target))
        .collect();
    assert_eq!(audit, ["resume consumer billing", "pause consumer billing"]);
}

#[tokio::test]
async fn a_failure_group_is_requeued_from_the_page_after_its_dry_run_count() {
    let h = harness();
    let mut ids = Vec::new();
    for error in ["order 17 rejected", "order 42 rejected", "broker said no"] {
        let id = h.pending(message("orders", "k", b"{}")).await;
        let lease = outbox_ports::Lease::new(format!("t-{id}"), std::time::Duration::from_secs(30));
        outbox_ports::OutboxRelayPath::claim_pending(&*h.outbox, &lease, 10)
            .await
            .expect("claim");
        let failure = outbox_ports::PublishFailure {
            id,
            error: error.to_owned(),
            decision: outbox_core::Decision::Dead,
        };
        outbox_ports::OutboxRelayPath::mark_publish_failed(&*h.outbox, &lease, &[failure])
            .await
            .expect("mark");
        ids.push(id);
    }
    let mut reader = Browser::new(&h);
    reader.login(READ).await;
    let page = reader.get("/ui/failures").await;
    assert!(
        !page.body.contains("Requeue…"),
        "a reader is offered no action"
    );

    let mut b = Browser::new(&h);
    b.login(WRITE).await;
    let page = b.get("/ui/failures").await;
    assert!(page.body.contains("Requeue…") && page.body.contains("Delete dead…"));
    let dialog = b
        .get("/ui/failures?confirm=requeue&exchange=orders&error=order%20%3Cn%3E%20rejected")
        .await;
    assert_eq!(dialog.status, StatusCode::OK, "{}", dialog.body);
    let text = unescape(&dialog.body);
    assert!(
        text.contains("2 failing or dead messages of exchange orders: back to pending"),
        "{text}"
    );
    let csrf = b.csrf().await;
    let done = b
        .post(
            "/ui/failures/requeue",
            &format!(
                "csrf={csrf}&exchange=orders&error={}",
                encode("order <n> rejected")
            ),
        )
        .await;
    assert_eq!(done.status, StatusCode::SEE_OTHER, "{}", done.body);
    assert_eq!(done.location(), "/ui/failures?notice=requeued-2");
    let status = async |id| {
        outbox_ports::OutboxOperator::get_message(&*h.outbox, id)
            .await
            .expect("get")
            .expect("kept")
            .status
    };
    assert_eq!(status(ids[0]).await, outbox_core::OutboxStatus::Pending);
    assert_eq!(status(ids[1]).await, outbox_core::OutboxStatus::Pending);
    assert_eq!(
        status(ids[2]).await,
        outbox_core::OutboxStatus::Dead,
        "another group's"
    );
}

/// With editing off (the default) a dead message's page has no edit control and
/// the form's address answers 404; with it on, a write session edits the payload
/// and a header, the replay's page says so and links back, and the original
/// shows its replay with neither a requeue button nor the form any more.
#[tokio::test]
async fn a_dead_message_is_edited_and_replayed_from_its_page_only_when_editing_is_on() {
    let h = harness();
    let id = h.dead(message("orders", "a", br#"{"amount":5}"#)).await;
    let mut b = Browser::new(&h);
    b.login(WRITE).await;
    let page = b.get(&format!("/ui/messages/{id}")).await;
    assert!(page.body.contains(">Requeue</button>"));
    assert!(
        !page.body.contains("edit-replay"),
        "no edit control by default"
    );
    let csrf = b.csrf().await;
    let refused = b
        .post(
            &format!("/ui/messages/{id}/replay"),
            &format!("csrf={csrf}&payload=%7B%7D"),
        )
        .await;
    assert_eq!(refused.status, StatusCode::NOT_FOUND);

    let h = ui_harness_with(tokens(), UiOptions::default(), |s| s.with_edit(true));
    let id = h.dead(message("orders", "a", br#"{"amount":5}"#)).await;
    let mut reader = Browser::new(&h);
    reader.login(READ).await;
    let page = reader.get(&format!("/ui/messages/{id}")).await;
    assert!(
        !page.body.contains("edit-replay"),
        "a reader gets no edit control"
    );
    let mut b = Browser::new(&h);
    b.login(WRITE).await;
    let page = b.get(&format!("/ui/messages/{id}")).await;
    assert!(page.body.contains("id=\"edit-replay\""), "{}", page.body);
    // Before replaying, the form says whether the original reached a consumer.
    assert!(
        page.body
            .contains("No consumer&#39;s inbox here has recorded this message")
            || page
                .body
                .contains("No consumer's inbox here has recorded this message"),
        "{}",
        page.body
    );
    let original = h
        .outbox
        .get_message(id)
        .await
        .expect("get")
        .expect("there")
        .message;
    h.delivered("billing", &original, true).await;
    let page = b.get(&format!("/ui/messages/{id}")).await;
    assert!(
        page.body
            .contains("yet 1 consumer(s) here recorded it (billing: consumed)"),
        "{}",
        page.body
    );
    assert!(page.body.contains("x-outbox-replay-of"));
    let csrf = value_of(&page.body, "csrf").expect("csrf");
    let no_csrf = b
        .post(&format!("/ui/messages/{id}/replay"), "payload=%7B%7D")
        .await;
    assert_eq!(no_csrf.status, StatusCode::FORBIDDEN);
    let done = b
        .post(
            &format!("/ui/messages/{id}/replay"),
            &format!(
                "csrf={csrf}&payload={}&headers={}",
                encode(r#"{"amount":6}"#),
                encode(r#"{"x-fixed":"yes"}"#)
            ),
        )
        .await;
    assert_eq!(done.status, StatusCode::SEE_OTHER, "{}", done.body);
    let replay_page = b.get(done.location()).await;
    assert!(
        replay_page
            .body
            .contains("Replayed: this is the new message")
    );
    assert!(replay_page.body.contains("id=\"replayed-from\""));
    assert!(replay_page.body.contains(&id.to_string()));
    let original = b.get(&format!("/ui/messages/{id}")).await;
    assert!(original.body.contains("id=\"replayed-as\""));
    assert!(
        !original.body.contains(">Requeue</button>"),
        "a replayed message is not requeued"
    );
    assert!(!original.body.contains("edit-replay"), "nor replayed again");
    let stored = h.outbox.get_message(id).await.expect("get").expect("kept");
    let new = stored.replayed_as.expect("replayed");
    let replay = h
        .outbox
        .get_message(new)
        .await
        .expect("get")
        .expect("stored");
    assert_eq!(replay.message.payload, br#"{"amount":6}"#);
    assert_eq!(replay.message.headers["x-fixed"], "yes");
    let actions: Vec<String> = h
        .audit
        .list(None, 10)
        .await
        .expect("audit")
        .items
        .into_iter()
        .map(|e| format!("{} {}", e.actor, e.action))
        .collect();
    assert_eq!(actions, ["token:ops replay"]);
}

/// A dead delivery's page offers the same form when editing is on; the replay's
/// page is the consumer's new delivery, linking back, and the original offers no
/// reconsume any more.
#[tokio::test]
async fn a_dead_delivery_is_edited_and_replayed_from_its_page() {
    let h = ui_harness_with(tokens(), UiOptions::default(), |s| s.with_edit(true));
    let m = message("orders", "a", br#"{"amount":5}"#);
    h.delivered("billing", &m, false).await;
    let mut b = Browser::new(&h);
    b.login(WRITE).await;
    // A consumer's list follows arrival: its time column is when each was received.
    let list = b.get("/ui/consumers/billing").await;
    assert!(
        list.body.contains("<th scope=\"col\">Received</th>"),
        "{}",
        list.body
    );
    let messages = b.get("/ui/messages").await;
    assert!(messages.body.contains("<th scope=\"col\">Created</th>"));
    // Dense rows: the id short, whole in its tooltip; the time as how long ago,
    // the UTC time in its tooltip.
    let id = m.id.to_string();
    assert!(
        list.body
            .contains(&format!("title=\"{id}\">…{}</a>", &id[id.len() - 8..])),
        "{}",
        list.body
    );
    assert!(list.body.contains(" s ago</time>"), "{}", list.body);
    let page = b
        .get(&format!("/ui/consumers/billing/deliveries/{}", m.id))
        .await;
    assert!(page.body.contains("id=\"edit-replay\""), "{}", page.body);
    assert!(page.body.contains(">Reconsume</button>"));
    let csrf = value_of(&page.body, "csrf").expect("csrf");
    let done = b
        .post(
            &format!("/ui/consumers/billing/deliveries/{}/replay", m.id),
            &format!("csrf={csrf}&payload={}", encode(r#"{"amount":6}"#)),
        )
        .await;
    assert_eq!(done.status, StatusCode::SEE_OTHER, "{}", done.body);
    assert!(
        done.location()
            .starts_with("/ui/consumers/billing/deliveries/")
    );
    let replay = b.get(done.location()).await;
    assert!(replay.body.contains("Replayed: this is the new delivery"));
    assert!(replay.body.contains("id=\"replayed-from\""));
    let original = b
        .get(&format!("/ui/consumers/billing/deliveries/{}", m.id))
        .await;
    assert!(original.body.contains("id=\"replayed-as\""));
    assert!(!original.body.contains(">Reconsume</button>"));
    assert!(!original.body.contains("edit-replay"));
}

/// The secret the tests' trusted proxy shares with the dashboard.
const PROXY_SECRET: &str = "proxy-secret-0123456789";
/// The header the tests' trusted proxy sends it in.
const SECRET_HEADER: (&str, &str) = ("x-outbox-proxy-secret", PROXY_SECRET);

/// Behind a trusted proxy: a request from the proxy's address naming a user with
/// a role is signed in as that user (a session and its cookie, writes still need
/// the CSRF token); the same header from another address is ignored (off to the
/// login); a user without a role is refused; a token session gives way to the
/// user the proxy names (with the secret it shares on every request).
#[tokio::test]
async fn a_trusted_proxy_signs_in_the_user_it_names_and_only_from_its_address() {
    use axum::extract::connect_info::MockConnectInfo;
    use outbox_admin::TrustedProxy;
    use std::collections::BTreeMap;

    let proxy = TrustedProxy {
        user_header: "x-forwarded-user".into(),
        groups_header: Some("x-forwarded-groups".into()),
        from: vec!["10.0.0.0/8".parse().expect("net")],
        users: BTreeMap::from([("alice".to_owned(), Role::Write)]),
        groups: BTreeMap::from([("viewers".to_owned(), Role::Read)]),
        secret_header: "x-outbox-proxy-secret".into(),
        secret: Secret::new(PROXY_SECRET),
    };
    let options = UiOptions {
        trusted_proxy: Some(proxy),
        ..UiOptions::default()
    };
    let h = ui_harness(tokens(), options);
    let id = h.dead(message("orders", "a", b"{}")).await;
    let from = |ip: &str, app: &Router| {
        app.clone().layer(MockConnectInfo(std::net::SocketAddr::new(
            ip.parse().expect("ip"),
            4711,
        )))
    };
    async fn get(app: Router, path: &str, headers: &[(&str, &str)]) -> Answer {
        let mut request = Request::builder().uri(path);
        for (k, v) in headers {
            request = request.header(*k, *v);
        }
        let response = app
            .oneshot(request.body(Body::empty()).expect("request"))
            .await
            .expect("infallible");
        let status = response.status();
        let headers = response.headers().clone();
        let bytes = axum::body::to_bytes(response.into_body(), 16 << 20)
            .await
            .expect("body");
        Answer {
            status,
            headers,
            body: String::from_utf8(bytes.to_vec()).expect("utf-8"),
        }
    }

    let proxied = from("10.1.2.3", &h.app);
    let page = get(
        proxied.clone(),
        "/ui/messages",
        &[("x-forwarded-user", "alice"), SECRET_HEADER],
    )
    .await;
    assert_eq!(page.status, StatusCode::OK, "{}", page.body);
    assert!(page.body.contains("alice"), "signed in as alice");
    let cookie = page
        .headers
        .get(header::SET_COOKIE)
        .and_then(|v| v.to_str().ok())
        .expect("a session cookie is set")
        .split(';')
        .next()
        .expect("pair")
        .to_owned();
    // Writes still need the session's CSRF token, taken from a page.
    let csrf = value_of(&page.body, "csrf").expect("csrf");
    let post = |form: String| {
        Request::builder()
            .method("POST")
            .uri(format!("/ui/messages/{id}/requeue"))
            .header(header::COOKIE, &cookie)
            .header("x-forwarded-user", "alice")
            .header(SECRET_HEADER.0, SECRET_HEADER.1)
            .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded")
            .body(Body::from(form))
            .expect("request")
    };
    let refused = proxied
        .clone()
        .oneshot(post(String::new()))
        .await
        .expect("ok");
    assert_eq!(refused.status(), StatusCode::FORBIDDEN, "no CSRF token");
    let done = proxied
        .clone()
        .oneshot(post(format!("csrf={csrf}")))
        .await
        .expect("ok");
    assert_eq!(done.status(), StatusCode::SEE_OTHER);
    let audit = h.audit.list(None, 10).await.expect("audit").items;
    assert_eq!(
        audit[0].actor, "sso:alice",
        "the audit names the proxy's user"
    );

    // The proxy's session holds only while the proxy vouches: its cookie sent
    // from elsewhere (or without the proxy's header) opens nothing.
    let elsewhere = get(
        from("192.168.1.9", &h.app),
        "/ui/messages",
        &[("cookie", cookie.as_str())],
    )
    .await;
    assert_eq!(
        elsewhere.status,
        StatusCode::SEE_OTHER,
        "{}",
        elsewhere.body
    );
    let unvouched = get(
        proxied.clone(),
        "/ui/messages",
        &[("cookie", cookie.as_str())],
    )
    .await;
    assert_eq!(
        unvouched.status,
        StatusCode::SEE_OTHER,
        "{}",
        unvouched.body
    );
    // Login attempts through the proxy count per client it forwarded for.
    for n in 0..10 {
        let form = get(proxied.clone(), "/ui/login", &[]).await;
        let nonce = value_of(&form.body, "login_csrf").expect("nonce");
        let login_cookie = form
            .headers
            .get(header::SET_COOKIE)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.split(';').next())
            .expect("nonce cookie")
            .to_owned();
        let attempt = |xff: &'static str| {
            Request::builder()
                .method("POST")
                .uri("/ui/login")
                .header(header::COOKIE, &login_cookie)
                .header("x-forwarded-for", xff)
                .header(SECRET_HEADER.0, SECRET_HEADER.1)
                .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded")
                .body(Body::from(format!(
                    "token=wrong-token-0123456789&login_csrf={nonce}"
                )))
                .expect("request")
        };
        let status = proxied
            .clone()
            .oneshot(attempt("203.0.113.7"))
            .await
            .expect("ok")
            .status();
        assert_eq!(status, StatusCode::UNAUTHORIZED, "attempt {n}");
        if n == 9 {
            let limited = proxied
                .clone()
                .oneshot(attempt("203.0.113.7"))
                .await
                .expect("ok");
            assert_eq!(limited.status(), StatusCode::TOO_MANY_REQUESTS);
            let another = proxied
                .clone()
                .oneshot(attempt("203.0.113.8"))
                .await
                .expect("ok");
            assert_eq!(
                another.status(),
                StatusCode::UNAUTHORIZED,
                "another client behind the proxy"
            );
        }
    }

    // The same header from elsewhere is anyone's: ignored, off to the login.
    let spoofed = get(
        from("192.168.1.9", &h.app),
        "/ui/messages",
        &[("x-forwarded-user", "alice"), SECRET_HEADER],
    )
    .await;
    assert_eq!(spoofed.status, StatusCode::SEE_OTHER);
    assert!(
        spoofed.location().contains("/ui/login"),
        "{}",
        spoofed.location()
    );
    // No peer known at all (a server without connect info): not believed either.
    let unknown = get(
        h.app.clone(),
        "/ui/messages",
        &[("x-forwarded-user", "alice")],
    )
    .await;
    assert_eq!(unknown.status, StatusCode::SEE_OTHER);

    // By group, read only; and a user with no role is refused, not let in.
    let viewer = get(
        proxied.clone(),
        "/ui/messages",
        &[
            ("x-forwarded-user", "vic"),
            ("x-forwarded-groups", "viewers"),
            SECRET_HEADER,
        ],
    )
    .await;
    assert_eq!(viewer.status, StatusCode::OK);
    assert!(
        !viewer.body.contains("all matching…"),
        "a reader gets no bulk buttons"
    );
    let nobody = get(
        proxied.clone(),
        "/ui/messages",
        &[("x-forwarded-user", "mallory"), SECRET_HEADER],
    )
    .await;
    assert_eq!(nobody.status, StatusCode::FORBIDDEN);
    assert!(nobody.body.contains("mallory") && nobody.body.contains("no role"));

    // A token session gives way to the user the proxy names.
    let mut b = Browser::new(&h);
    b.login(READ).await;
    let token_cookie: Vec<String> = b.cookies.iter().map(|(k, v)| format!("{k}={v}")).collect();
    let switched = get(
        proxied,
        "/ui/messages",
        &[
            ("x-forwarded-user", "alice"),
            ("cookie", &token_cookie.join("; ")),
            SECRET_HEADER,
        ],
    )
    .await;
    assert_eq!(switched.status, StatusCode::OK);
    assert!(
        switched.headers.contains_key(header::SET_COOKIE),
        "a new session"
    );
    assert!(switched.body.contains("alice"));
    // The session that gave way is ended, not left open for whoever holds it.
    let old = get(
        from("192.168.1.9", &h.app),
        "/ui/messages",
        &[("cookie", &token_cookie.join("; "))],
    )
    .await;
    assert_eq!(
        old.status,
        StatusCode::SEE_OTHER,
        "the replaced session is gone"
    );

    // A POST (perhaps cross-site) never opens a session.
    let posted = from("10.1.2.3", &h.app)
        .oneshot(
            Request::builder()
                .method("POST")
                .uri(format!("/ui/messages/{id}/delete"))
                .header("x-forwarded-user", "alice")
                .header(SECRET_HEADER.0, SECRET_HEADER.1)
                .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded")
                .body(Body::from("csrf=x"))
                .expect("request"),
        )
        .await
        .expect("ok");
    assert_eq!(posted.status(), StatusCode::UNAUTHORIZED);
    assert!(!posted.headers().contains_key(header::SET_COOKIE));
}

/// A message's page lists its failed attempts, newest first, each with its number,
/// time and error (escaped); a message that never failed has no such table.
#[tokio::test]
async fn a_message_page_shows_its_failed_attempts_newest_first() {
    use outbox_core::Decision;
    use outbox_ports::{Lease, OutboxRelayPath, PublishFailure};
    let h = harness();
    let id = h.pending(message("orders", "created", b"{}")).await;
    for n in 1..=3 {
        let lease = Lease::new(format!("t-{n}"), Duration::from_secs(30));
        let claimed = if n == 1 {
            h.outbox.claim_pending(&lease, 10).await
        } else {
            h.outbox.claim_due_retries(&lease, 10).await
        }
        .expect("claim");
        assert_eq!(claimed.len(), 1, "round {n}");
        let failure = PublishFailure {
            id,
            error: format!("<i>no route</i> {n}"),
            decision: if n == 3 {
                Decision::Dead
            } else {
                Decision::RetryAfter(Duration::ZERO)
            },
        };
        h.outbox
            .mark_publish_failed(&lease, &[failure])
            .await
            .expect("mark");
    }
    let fine = h.pending(message("orders", "created", b"{}")).await;
    let mut b = Browser::new(&h);
    b.login(READ).await;
    let page = b.get(&format!("/ui/messages/{id}")).await;
    assert_eq!(page.status, StatusCode::OK, "{}", page.body);
    let table = page
        .body
        .split(r#"<table id="attempts">"#)
        .nth(1)
        .and_then(|t| t.split("</table>").next())
        .expect("an attempts table");
    assert!(!table.contains("<i>"), "escaped: {table}");
    let rows: Vec<(String, String)> = table
        .split("<tr><td>Attempt ")
        .skip(1)
        .map(|r| {
            let n = r.split(' ').next().unwrap_or_default().to_owned();
            let error = unescape(r)
                .split("<td class=\"wrap\">")
                .nth(1)
                .and_then(|e| e.split("</td>").next())
                .unwrap_or_default()
                .to_owned();
            (n, error)
        })
        .collect();
    assert_eq!(
        rows,
        [3, 2, 1].map(|n| (n.to_string(), format!("<i>no route</i> {n}"))),
        "{table}"
    );
    assert!(table.contains("<time datetime=\""), "{table}");
    let clean = b.get(&format!("/ui/messages/{fine}")).await;
    assert!(!clean.body.contains(r#"id="attempts""#));

    // Requeued by an operator: the action is in the history, above the run it
    // ended; the attempts count says it starts again; the last error shown is
    // an earlier attempt's.
    let mut ops = Browser::new(&h);
    ops.login(WRITE).await;
    let csrf = ops.csrf().await;
    let done = ops
        .post(
            &format!("/ui/messages/{id}/requeue"),
            &format!("csrf={csrf}"),
        )
        .await;
    assert_eq!(done.status, StatusCode::SEE_OTHER, "{}", done.body);
    let page = b.get(&format!("/ui/messages/{id}")).await;
    let text = unescape(&page.body);
    let table = text
        .split(r#"<table id="attempts">"#)
        .nth(1)
        .and_then(|t| t.split("</table>").next())
        .expect("the history");
    let whats: Vec<&str> = table
        .split("<td>")
        .skip(1)
        .filter_map(|c| c.split("</td>").next())
        .filter(|c| c.starts_with("Attempt") || c.starts_with("Requeued"))
        .collect();
    assert_eq!(
        whats,
        [
            "Requeued by token:ops",
            "Attempt 3 failed",
            "Attempt 2 failed",
            "Attempt 1 failed"
        ],
        "{table}"
    );
    assert!(
        table.contains(r#"class="run-start" data-action"#),
        "{table}"
    );
    assert!(
        text.contains("since it was last requeued or reconsumed; 3 failed before"),
        "{text}"
    );
    assert!(text.contains(r#"id="last-error-earlier""#), "{text}");
}

/// Status tabs above each list: every status with its count while the list is
/// not otherwise filtered, the current one marked, each keeping the other
/// filters; the navigation says how many are dead.
#[tokio::test]
async fn lists_have_status_tabs_with_counts_and_the_navigation_counts_the_dead() {
    let h = harness();
    for _ in 0..3 {
        h.dead(message("orders", "created", b"{}")).await;
    }
    h.pending(message("orders", "created", b"{}")).await;
    h.pending(message("billing", "created", b"{}")).await;
    let m = message("orders", "created", b"{}");
    h.delivered("billing", &m, false).await;
    h.delivered("billing", &message("orders", "x", b"{}"), true)
        .await;
    let mut b = Browser::new(&h);
    b.login(READ).await;

    let tab = |body: &str, status: &str| -> Option<String> {
        let at = body.find(&format!("data-status=\"{status}\""))?;
        let start = body[..at].rfind("<a ")?;
        let rest = &body[start..];
        let end = rest.find("</a>")?;
        Some(rest[..end].to_owned())
    };
    let list = b.get("/ui/messages?status=dead").await;
    assert_eq!(list.status, StatusCode::OK, "{}", list.body);
    let dead = tab(&list.body, "dead").expect("a dead tab");
    assert!(dead.contains("aria-current=\"true\""), "{dead}");
    assert!(dead.contains(r#"<span class="count">3</span>"#), "{dead}");
    let pending = tab(&list.body, "pending").expect("a pending tab");
    assert!(
        pending.contains(r#"<span class="count">2</span>"#),
        "{pending}"
    );
    assert!(!pending.contains("aria-current"), "{pending}");
    let sent = tab(&list.body, "sent").expect("a sent tab");
    assert!(
        !sent.contains("class=\"count\""),
        "sent is not counted: {sent}"
    );
    assert!(
        list.body
            .contains(r#"id="nav-dead-messages" href="/ui/messages?status=dead" aria-label="3 dead messages">dead 3</a>"#),
        "{}",
        list.body
    );
    assert!(
        list.body
            .contains(r#"aria-label="1 dead deliveries">dead 1</a>"#)
    );

    // Another filter set: the tabs keep it and show no whole-outbox count.
    let filtered = b.get("/ui/messages?exchange=billing").await;
    let pending = tab(&filtered.body, "pending").expect("a pending tab");
    assert!(
        pending.contains(r#"href="/ui/messages?exchange=billing&#38;status=pending""#),
        "{pending}"
    );
    assert!(!pending.contains("class=\"count\""), "{pending}");
    let all = tab(&filtered.body, "all").expect("an all tab");
    assert!(all.contains("aria-current=\"true\""), "{all}");

    // A consumer's deliveries: its own counts.
    let deliveries = b.get("/ui/consumers/billing").await;
    let dead = tab(&deliveries.body, "dead").expect("a dead tab");
    assert!(dead.contains(r#"<span class="count">1</span>"#), "{dead}");
    assert!(
        dead.contains(r#"href="/ui/consumers/billing?status=dead""#),
        "{dead}"
    );
    let consumed = tab(&deliveries.body, "consumed").expect("a consumed tab");
    assert!(
        consumed.contains(r#"<span class="count">1</span>"#),
        "{consumed}"
    );

    // The tabs follow the live feed: read again, alone, when a number changes
    // (the rows stay, an operator may be ticking them).
    assert!(
        list.body
            .contains(r#"<div id="tabs-feed" data-live="/ui/overview/stream">"#),
        "{}",
        list.body
    );
    assert!(
        list.body.contains(
            r#"hx-get="/ui/messages/tabs?status=dead" hx-trigger="outbox-live from:body""#
        ),
        "{}",
        list.body
    );
    // (`dead` fails every pending message with it: the two pending ones too.)
    h.dead(message("orders", "created", b"{}")).await;
    let fresh = b.get("/ui/messages/tabs?status=dead").await;
    assert_eq!(fresh.status, StatusCode::OK);
    assert!(
        fresh.body.starts_with("<nav class=\"tabs\""),
        "{}",
        fresh.body
    );
    let dead = tab(&fresh.body, "dead").expect("a dead tab");
    assert!(dead.contains(r#"<span class="count">6</span>"#), "{dead}");
    let theirs = b.get("/ui/consumers/billing/tabs").await;
    assert!(
        tab(&theirs.body, "dead").is_some_and(|t| t.contains(r#"<span class="count">1</span>"#)),
        "{}",
        theirs.body
    );
}

/// Rows ticked in a list are acted on after a dialog that counts them: each one
/// through the single-row action (checked and audited on its own), those whose
/// status does not allow it passed over and said so; no token, no action.
#[tokio::test]
async fn ticked_rows_are_requeued_after_a_dialog_that_counts_them() {
    let h = harness();
    let mut dead = Vec::new();
    for n in 0..3 {
        dead.push(h.dead(message("orders", &format!("k{n}"), b"{}")).await);
    }
    let pending = h.pending(message("orders", "p", b"{}")).await;
    let mut b = Browser::new(&h);
    b.login(WRITE).await;
    let list = b.get("/ui/messages?status=dead").await;
    for id in &dead {
        assert!(
            list.body.contains(&format!(
                r#"<input type="checkbox" name="id" value="{id}" form="selection""#
            )),
            "{}",
            list.body
        );
    }
    assert!(
        list.body
            .contains(r#"<form id="selection" method="post" action="/ui/messages/selected""#)
    );
    let csrf = value_of(&list.body, "csrf").expect("csrf");
    let picked = format!("id={}&id={}&id={pending}", dead[0], dead[1]);

    let dialog = b
        .post(
            "/ui/messages/selected",
            &format!("csrf={csrf}&verb=requeue&{picked}&status=dead"),
        )
        .await;
    assert_eq!(dialog.status, StatusCode::OK, "{}", dialog.body);
    assert!(
        dialog.body.contains("Requeue 3 messages, as selected?"),
        "{}",
        dialog.body
    );
    assert_eq!(
        h.outbox.count(outbox_core::OutboxStatus::Dead),
        3,
        "nothing yet"
    );
    for id in [dead[0], dead[1], pending] {
        assert!(dialog.body.contains(&format!(r#"name="id" value="{id}""#)));
    }

    let done = b
        .post(
            "/ui/messages/selected",
            &format!("csrf={csrf}&verb=requeue&confirmed=1&{picked}&status=dead"),
        )
        .await;
    assert_eq!(done.status, StatusCode::SEE_OTHER, "{}", done.body);
    assert_eq!(
        done.location(),
        "/ui/messages?status=dead&notice=requeued-2-of-3"
    );
    let after = b.get(done.location()).await;
    assert!(
        after.body.contains(
            "Requeued 2 of the 3 selected. The other one was left as it was: its status does not allow it, or it is gone or busy."
        ),
        "{}",
        after.body
    );
    assert_eq!(
        h.outbox.count(outbox_core::OutboxStatus::Dead),
        1,
        "the unticked one stays dead"
    );
    let audit = h.audit.list(None, 10).await.expect("audit").items;
    let requeued: Vec<&str> = audit
        .iter()
        .filter(|e| e.action == "requeue")
        .map(|e| e.target.as_str())
        .collect();
    assert_eq!(requeued.len(), 2, "{audit:?}");

    // Nothing ticked: back to the list, saying so.
    let none = b
        .post("/ui/messages/selected", &format!("csrf={csrf}&verb=delete"))
        .await;
    // A notice from a URL whose counts do not add up is no notice (no underflow).
    let odd = b.get("/ui/messages?notice=requeued-5-of-3").await;
    assert_eq!(odd.status, StatusCode::OK);
    assert!(!odd.body.contains("id=\"notice\""), "{}", odd.body);
    assert_eq!(none.location(), "/ui/messages?notice=none-selected");
    // No token, no action; a consumer's list takes reconsume only.
    let refused = b
        .post(
            "/ui/messages/selected",
            &format!("verb=delete&confirmed=1&id={}", dead[2]),
        )
        .await;
    assert_eq!(refused.status, StatusCode::FORBIDDEN);
    let wrong = b
        .post(
            "/ui/consumers/billing/selected",
            &format!("csrf={csrf}&verb=delete&confirmed=1&id={}", dead[2]),
        )
        .await;
    assert_eq!(wrong.status, StatusCode::BAD_REQUEST);
    assert_eq!(h.outbox.count(outbox_core::OutboxStatus::Dead), 1);

    // A read session has no selection.
    let mut reader = Browser::new(&h);
    reader.login(READ).await;
    let page = reader.get("/ui/messages").await;
    assert!(!page.body.contains(r#"id="selection""#));
    assert!(!page.body.contains(r#"type="checkbox""#));
}

/// The overview's chart has a count axis, a time axis and a failures series from
/// the per-minute totals; its sweeps read under human names with their lock.
#[tokio::test]
async fn the_overview_charts_failures_with_axes_and_names_the_sweeps() {
    use outbox_adapters_memory::{MemoryLock, MemoryThroughputLog};
    use outbox_ports::{DistributedLock, ThroughputKind, ThroughputLog};
    let log = Arc::new(MemoryThroughputLog::new(Arc::new(SystemClock)));
    log.add(ThroughputKind::Published, 40).await.expect("add");
    log.add(ThroughputKind::PublishFailed, 6)
        .await
        .expect("add");
    log.add(ThroughputKind::ConsumeFailed, 2)
        .await
        .expect("add");
    let lock = Arc::new(MemoryLock::new());
    let _guard = lock
        .acquire(
            "outbox.retry.run-lock",
            Duration::from_secs(60),
            Duration::ZERO,
        )
        .await
        .expect("lock")
        .expect("free");
    let (log_for, lock_for) = (log.clone(), lock.clone());
    let h = ui_harness_with(tokens(), UiOptions::default(), move |s| {
        s.with_throughput(log_for)
            .with_sweep_reports(
                Arc::new(MemorySweepState::new(Arc::new(SystemClock))),
                vec!["outbox.retry.last-state".into()],
            )
            .with_locks(lock_for, vec!["outbox.retry.run-lock".into()])
    });
    let mut b = Browser::new(&h);
    b.login(READ).await;
    let page = b.get("/ui").await;
    assert_eq!(page.status, StatusCode::OK, "{}", page.body);
    let svg = page
        .body
        .split("<svg class=\"chart\"")
        .nth(1)
        .expect("a chart");
    assert!(
        svg.contains("40 published, 0 consumed, 8 failed attempts"),
        "{svg}"
    );
    assert!(svg.contains(r#"<rect class="failed""#), "{svg}");
    for tick in [">40</text>", ">20</text>", "60 min ago", ">now<"] {
        assert!(svg.contains(tick), "{tick}: {svg}");
    }
    assert!(
        page.body.contains("■ failed attempts</span> (8)"),
        "{}",
        page.body
    );
    let sweeps = page
        .body
        .split(r#"<table id="sweeps">"#)
        .nth(1)
        .expect("sweeps");
    assert!(
        sweeps.contains(r#"title="outbox.retry.last-state and outbox.retry.run-lock">The relay&#39;s retry sweep</span>"#),
        "{sweeps}"
    );
    assert!(
        sweeps.contains("<td data-lock>running now</td>"),
        "{sweeps}"
    );
    assert!(
        sweeps.contains("<td class=\"nowrap\">never</td>"),
        "{sweeps}"
    );

    // Without per-minute totals, the failures series says it is not recorded.
    let plain = harness();
    let mut b = Browser::new(&plain);
    b.login(READ).await;
    let page = b.get("/ui").await;
    assert!(
        page.body
            .contains("■ failed attempts</span> (not recorded here)")
    );
}

/// The overview's live numbers come as server-sent events: the current fragment
/// first, then a new one when a number changed, nothing while none did; the page
/// connects to the stream instead of polling; the stream ends at shutdown.
#[tokio::test]
async fn the_overview_pushes_its_numbers_when_they_change_and_stops_at_shutdown() {
    let (stop, shutdown) = tokio::sync::watch::channel(false);
    let h = ui_harness(
        tokens(),
        UiOptions {
            shutdown: Some(shutdown),
            ..UiOptions::default()
        },
    );
    h.dead(message("orders", "created", b"{}")).await;
    let mut b = Browser::new(&h);
    b.login(READ).await;
    let page = b.get("/ui").await;
    assert!(
        page.body
            .contains(r#"<div id="live-feed" data-live="/ui/overview/stream">"#),
        "{}",
        page.body
    );
    // The shared stream's script (one stream per browser, whatever the tabs).
    assert!(
        page.body
            .contains(r#"<script src="/ui/assets/live.js" defer></script>"#)
    );
    assert!(!page.body.contains("hx-trigger"), "no polling");

    let (status, headers, mut events) = b.open_stream("/ui/overview/stream").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(headers[header::CONTENT_TYPE], "text/event-stream");
    let first = events
        .next(Duration::from_secs(10))
        .await
        .expect("an event");
    assert!(first.starts_with("event: live\n"), "{first}");
    assert!(
        first.contains(r#"data: <section id="live""#) && first.contains(r#"id="count-dead">"#),
        "{first}"
    );
    assert!(first.contains(r#"/messages?status=dead">1</a>"#), "{first}");
    // Nothing changes: nothing is sent (only keep-alives, skipped).
    assert_eq!(events.next(Duration::from_secs(3)).await, None);
    h.dead(message("orders", "created", b"{}")).await;
    let second = events
        .next(Duration::from_secs(10))
        .await
        .expect("a change");
    assert!(
        second.contains(r#"/messages?status=dead">2</a>"#),
        "{second}"
    );

    // A second page shares the poller and gets the numbers too.
    let (_, _, mut other) = b.open_stream("/ui/overview/stream").await;
    let seen = other.next(Duration::from_secs(10)).await.expect("an event");
    assert!(seen.contains(r#"/messages?status=dead">2</a>"#), "{seen}");

    stop.send(true).expect("send");
    for stream in [&mut events, &mut other] {
        let ended = tokio::time::timeout(Duration::from_secs(5), async {
            while stream.next(Duration::from_secs(5)).await.is_some() {}
        })
        .await;
        assert!(ended.is_ok(), "the stream ends at shutdown");
    }

    // No session, no stream: 204 tells the browser's EventSource to stop
    // reconnecting (a login page would make it retry forever).
    let stranger = Browser::new(&h);
    let (status, _, _) = stranger.open_stream("/ui/overview/stream").await;
    assert_eq!(status, StatusCode::NO_CONTENT);
}

/// Sessions in a shared store (PostgreSQL under `outbox run`; a map here).
#[derive(Debug, Default)]
struct SharedSessions(
    std::sync::Mutex<
        HashMap<tower_sessions_core::session::Id, tower_sessions_core::session::Record>,
    >,
);

#[async_trait::async_trait]
impl tower_sessions_core::SessionStore for SharedSessions {
    async fn save(
        &self,
        record: &tower_sessions_core::session::Record,
    ) -> tower_sessions_core::session_store::Result<()> {
        self.0
            .lock()
            .expect("lock")
            .insert(record.id, record.clone());
        Ok(())
    }

    async fn load(
        &self,
        id: &tower_sessions_core::session::Id,
    ) -> tower_sessions_core::session_store::Result<Option<tower_sessions_core::session::Record>>
    {
        Ok(self.0.lock().expect("lock").get(id).cloned())
    }

    async fn delete(
        &self,
        id: &tower_sessions_core::session::Id,
    ) -> tower_sessions_core::session_store::Result<()> {
        self.0.lock().expect("lock").remove(id);
        Ok(())
    }
}

/// With a shared session store, a session opened on one instance (or before a
/// restart) is good on another; it is stored under a hash, never the cookie; it
/// ends with its token (removed or given another secret) and takes the token's
/// role now; a logout anywhere ends it everywhere.
#[tokio::test]
async fn a_session_in_a_shared_store_survives_a_restart_and_follows_its_token() {
    let store = Arc::new(SharedSessions::default());
    let with = |tokens: Vec<AdminToken>| {
        ui_harness(
            tokens,
            UiOptions {
                session_store: Some(store.clone()),
                ..UiOptions::default()
            },
        )
    };
    let first = with(tokens());
    let mut b = Browser::new(&first);
    b.login(WRITE).await;
    let cookie = b
        .cookies
        .get("outbox_session")
        .cloned()
        .expect("a session cookie");
    let keys: Vec<String> = store
        .0
        .lock()
        .expect("lock")
        .keys()
        .map(ToString::to_string)
        .collect();
    assert_eq!(keys.len(), 1);
    assert!(
        !keys[0].contains(&cookie) && !cookie.contains(&keys[0]),
        "stored under a hash"
    );

    // "Restarted": another instance over the same store and tokens.
    let restarted = with(tokens());
    let mut again = Browser::new(&restarted);
    again
        .cookies
        .insert("outbox_session".into(), cookie.clone());
    let page = again.get("/ui").await;
    assert_eq!(
        page.status,
        StatusCode::OK,
        "still signed in: {}",
        page.body
    );
    assert!(page.body.contains(r#"id="role">write<"#), "{}", page.body);

    // The token's role now, not the stored one.
    let demoted = with(vec![AdminToken {
        name: "ops".into(),
        secret: Secret::new(WRITE),
        role: Role::Read,
    }]);
    let mut reader = Browser::new(&demoted);
    reader
        .cookies
        .insert("outbox_session".into(), cookie.clone());
    let page = reader.get("/ui").await;
    assert!(page.body.contains(r#"id="role">read<"#), "{}", page.body);

    // Another secret under the same name: the session ends.
    let rotated = with(vec![AdminToken {
        name: "ops".into(),
        secret: Secret::new("another-secret-0123456789"),
        role: Role::Write,
    }]);
    let mut stale = Browser::new(&rotated);
    stale
        .cookies
        .insert("outbox_session".into(), cookie.clone());
    assert_eq!(stale.get("/ui").await.status, StatusCode::SEE_OTHER);
    assert!(store.0.lock().expect("lock").is_empty(), "and is deleted");

    // A logout on one instance ends the session on the other.
    let mut b = Browser::new(&first);
    b.login(READ).await;
    let cookie = b
        .cookies
        .get("outbox_session")
        .cloned()
        .expect("a session cookie");
    let mut other = Browser::new(&restarted);
    other.cookies.insert("outbox_session".into(), cookie);
    assert_eq!(other.get("/ui").await.status, StatusCode::OK);
    let page = b.get("/ui").await;
    let csrf = value_of(&page.body, "csrf").expect("csrf");
    let out = b.post("/ui/logout", &format!("csrf={csrf}")).await;
    assert_eq!(out.status, StatusCode::SEE_OTHER);
    assert_eq!(other.get("/ui").await.status, StatusCode::SEE_OTHER);
}

/// Failed login attempts are limited per client address: ten in a burst, then 429
/// with Retry-After (even for the right token) while another address still logs in.
#[tokio::test]
async fn login_attempts_are_limited_per_client_address() {
    use axum::extract::connect_info::MockConnectInfo;
    let h = harness();
    let at = |ip: &str| {
        let mut b = Browser::new(&h);
        b.app = h
            .app
            .clone()
            .layer(MockConnectInfo(std::net::SocketAddr::new(
                ip.parse().expect("ip"),
                4711,
            )));
        b
    };
    let mut guesser = at("10.1.1.1");
    for n in 0..10 {
        let answer = guesser.login("not-a-token-0123456789").await;
        assert_eq!(answer.status, StatusCode::UNAUTHORIZED, "attempt {n}");
    }
    let limited = guesser.login(WRITE).await;
    assert_eq!(
        limited.status,
        StatusCode::TOO_MANY_REQUESTS,
        "{}",
        limited.body
    );
    assert!(
        limited.body.contains("too many failed login attempts"),
        "{}",
        limited.body
    );
    let wait: u64 = limited.headers[header::RETRY_AFTER]
        .to_str()
        .expect("ascii")
        .parse()
        .expect("seconds");
    assert!((1..=6).contains(&wait), "{wait}");
    let mut other = at("10.1.1.2");
    assert_eq!(other.login(WRITE).await.status, StatusCode::SEE_OTHER);
}

/// The throughput page lists each exchange and consumer with its totals over the
/// window asked for; each one's chart page draws its buckets with the window's
/// axis, says whether it is paused, offers the pause to a writer only, and links
/// to its rows. Names are escaped; a bad window is a 400; a service without a
/// throughput log says so.
#[tokio::test]
async fn each_exchange_and_consumer_has_a_chart_over_an_hour_a_day_and_a_week() {
    use outbox_adapters_memory::MemoryThroughputLog;
    use outbox_ports::{PauseKind, PauseStore, ThroughputKind, ThroughputLog};
    let log = Arc::new(MemoryThroughputLog::new(Arc::new(SystemClock)));
    let n = |name: &str, c: u64| vec![(name.to_owned(), c)];
    log.add_named(ThroughputKind::Published, &n("orders", 30))
        .await
        .expect("add");
    log.add_named(ThroughputKind::PublishFailed, &n("orders", 4))
        .await
        .expect("add");
    log.add_named(ThroughputKind::Published, &n("<i>odd</i>", 1))
        .await
        .expect("add");
    log.add_named(ThroughputKind::Consumed, &n("billing", 12))
        .await
        .expect("add");
    let log_for = log.clone();
    let h = ui_harness_with(tokens(), UiOptions::default(), move |s| {
        s.with_throughput(log_for)
    });
    h.delivered("billing", &message("orders", "order.created", b"{}"), true)
        .await;
    h.outbox
        .pauses()
        .pause(PauseKind::Exchange, "orders", "ops")
        .await
        .expect("pause");
    let mut reader = Browser::new(&h);
    reader.login(READ).await;
    let page = reader.get("/ui/throughput?window=24h").await;
    assert_eq!(page.status, StatusCode::OK, "{}", page.body);
    let exchanges = page
        .body
        .split(r#"<table id="exchanges">"#)
        .nth(1)
        .expect("exchanges");
    assert!(
        exchanges.contains(
            r#"<a href="/ui/throughput/exchanges/orders?window=24h">orders</a> <span class="badge warn">paused</span></th><td class="num">30</td><td class="num">4</td>"#
        ),
        "{exchanges}"
    );
    assert!(!page.body.contains("<i>odd"), "escaped");
    assert!(
        page.body
            .contains(r#"href="/ui/throughput/consumers/billing?window=24h">billing</a>"#)
    );
    assert!(
        page.body
            .contains(r#"data-window="24 h" aria-current="true""#)
    );

    for (window, tick) in [("1h", "45 min ago"), ("24h", "18 h ago"), ("7d", "6 d ago")] {
        let chart = reader
            .get(&format!("/ui/throughput/exchanges/orders?window={window}"))
            .await;
        assert_eq!(chart.status, StatusCode::OK, "{}", chart.body);
        assert!(
            chart.body.contains(r#"id="paused">paused<"#),
            "{}",
            chart.body
        );
        let svg = chart
            .body
            .split("<svg class=\"chart\"")
            .nth(1)
            .expect("svg");
        assert!(svg.contains("30 published, 4 failed attempts"), "{svg}");
        assert!(svg.contains(tick), "{window}: {svg}");
        assert!(
            chart.body.contains("■ published</span> (30)"),
            "{}",
            chart.body
        );
        assert!(
            chart
                .body
                .contains(r#"href="/ui/messages?exchange=orders""#)
        );
        assert!(
            !chart.body.contains("pause-toggle"),
            "a reader is offered no pause"
        );
    }
    let consumer = reader
        .get("/ui/throughput/consumers/billing?window=7d")
        .await;
    assert_eq!(consumer.status, StatusCode::OK);
    assert!(
        consumer.body.contains("12 consumed, 0 failed attempts"),
        "{}",
        consumer.body
    );
    assert!(consumer.body.contains(r#"href="/ui/consumers/billing""#));
    assert!(!consumer.body.contains(r#"id="paused""#));
    let odd = reader
        .get("/ui/throughput/exchanges/%3Ci%3Eodd%3C%2Fi%3E")
        .await;
    assert_eq!(odd.status, StatusCode::OK);
    assert!(!odd.body.contains("<i>odd"), "escaped");
    for bad in [
        "/ui/throughput?window=1w",
        "/ui/throughput/exchanges/orders?window=",
        "/ui/throughput/consumers/a%00b",
    ] {
        assert_eq!(
            reader.get(bad).await.status,
            StatusCode::BAD_REQUEST,
            "{bad}"
        );
    }

    let mut writer = Browser::new(&h);
    writer.login(WRITE).await;
    let chart = writer.get("/ui/throughput/exchanges/orders").await;
    assert!(
        chart.body.contains(">Resume exchange…</button>"),
        "{}",
        chart.body
    );
    let chart = writer.get("/ui/throughput/consumers/billing").await;
    assert!(
        chart.body.contains(">Pause consumer…</button>"),
        "{}",
        chart.body
    );
    let consumers = writer.get("/ui/consumers").await;
    assert!(
        consumers
            .body
            .contains(r#"href="/ui/throughput/consumers/billing""#),
        "{}",
        consumers.body
    );
    let pauses = writer.get("/ui/pauses").await;
    assert!(
        pauses
            .body
            .contains(r#"href="/ui/throughput/exchanges/orders""#)
    );

    let plain = harness();
    let mut b = Browser::new(&plain);
    b.login(READ).await;
    let page = b.get("/ui/throughput").await;
    assert_eq!(page.status, StatusCode::NOT_FOUND);
    assert!(page.body.contains("not recorded here"), "{}", page.body);
}

/// A body redaction cannot reach (binary, JSON keys hidden) is withheld on the
/// page too: no hex dump, no base64, a word saying why (issue 47).
#[tokio::test]
async fn a_binary_body_is_withheld_from_its_page_while_json_keys_are_hidden() {
    let h = ui_harness_with(tokens(), UiOptions::default(), |s| {
        s.with_redaction(outbox_admin::Redaction::new(
            Vec::<String>::new(),
            ["password"],
        ))
    });
    let mut m = message("orders", "a", b"\x0a\x07hunter2\x10\x01\xff");
    m.content_type = "application/x-protobuf".into();
    let id = h.pending(m).await;
    let mut b = Browser::new(&h);
    b.login(READ).await;
    let page = b.get(&format!("/ui/messages/{id}")).await;
    assert_eq!(page.status, StatusCode::OK);
    assert!(
        !page.body.contains("68 75 6e 74") && !page.body.contains("hunter2"),
        "{}",
        page.body
    );
    assert!(page.body.contains("withheld"), "{}", page.body);
    let list = b.get("/ui/messages").await;
    assert!(!list.body.contains("hunter2"), "{}", list.body);
}

/// A browser at `ip` (the TCP peer the server sees), its requests carrying
/// `extra` headers (a proxy's `X-Forwarded-For`, ...).
fn browser_at(h: &Harness, ip: &str, extra: &'static [(&'static str, &'static str)]) -> Browser {
    use axum::extract::connect_info::MockConnectInfo;
    let mut b = Browser::new(h);
    b.app = h
        .app
        .clone()
        .layer(axum::middleware::from_fn(
            move |mut request: axum::extract::Request, next: axum::middleware::Next| async move {
                for (k, v) in extra {
                    request
                        .headers_mut()
                        .insert(*k, v.parse().expect("header value"));
                }
                next.run(request).await
            },
        ))
        .layer(MockConnectInfo(std::net::SocketAddr::new(
            ip.parse().expect("ip"),
            4711,
        )));
    b
}

/// Anonymous garbage never locks out a valid login: posts that are no login
/// (no form, no nonce, a wrong nonce) cost no allowance, so after any number of
/// them from the address everyone shares behind a plain TLS proxy, the right
/// token still logs in (issue 47).
#[tokio::test]
async fn garbage_login_posts_never_lock_out_a_valid_login() {
    let h = harness();
    let mut garbage = browser_at(&h, "10.1.1.1", &[]);
    for n in 0..50 {
        let form = match n % 3 {
            0 => String::new(),
            1 => "token=x".to_owned(),
            _ => "token=not-a-token-0123456789&login_csrf=forged".to_owned(),
        };
        let answer = garbage.post("/ui/login", &form).await;
        assert!(
            answer.status == StatusCode::FORBIDDEN || answer.status == StatusCode::BAD_REQUEST,
            "post {n}: {}",
            answer.status
        );
    }
    let mut operator = browser_at(&h, "10.1.1.1", &[]);
    let answer = operator.login(WRITE).await;
    assert_eq!(answer.status, StatusCode::SEE_OTHER, "{}", answer.body);
    assert_eq!(answer.location(), "/ui");
}

/// A proxy declared a forwarder (`UiOptions::forwarders`) is believed for
/// `X-Forwarded-For` only: failed logins count per client it forwards for (one
/// client's guesses do not lock out another behind it), and its user header
/// signs nobody in (issue 47).
#[tokio::test]
async fn a_forwarder_counts_failures_per_client_it_forwards_for_and_signs_in_nobody() {
    let options = UiOptions {
        forwarders: vec!["10.9.9.9/32".parse().expect("net")],
        ..UiOptions::default()
    };
    let h = ui_harness(tokens(), options);
    let mut guesser = browser_at(&h, "10.9.9.9", &[("x-forwarded-for", "203.0.113.7")]);
    for n in 0..10 {
        let answer = guesser.login("not-a-token-0123456789").await;
        assert_eq!(answer.status, StatusCode::UNAUTHORIZED, "attempt {n}");
    }
    let limited = guesser.login(WRITE).await;
    assert_eq!(limited.status, StatusCode::TOO_MANY_REQUESTS);
    let mut other = browser_at(&h, "10.9.9.9", &[("x-forwarded-for", "203.0.113.8")]);
    assert_eq!(other.login(WRITE).await.status, StatusCode::SEE_OTHER);
    let mut sso = browser_at(
        &h,
        "10.9.9.9",
        &[
            ("x-forwarded-user", "alice"),
            ("x-forwarded-for", "203.0.113.9"),
        ],
    );
    let page = sso.get("/ui/messages").await;
    assert_eq!(
        page.status,
        StatusCode::SEE_OTHER,
        "no sign-in by a forwarder"
    );
}

/// A trusted proxy on loopback (the documented `from = ["127.0.0.1/32"]`) is any
/// local process: its headers are believed only with the secret shared with the
/// proxy, never without it or with another (issue 47).
#[tokio::test]
async fn sso_headers_without_the_proxys_secret_are_refused() {
    use outbox_admin::TrustedProxy;
    use std::collections::BTreeMap;
    let options = UiOptions {
        trusted_proxy: Some(TrustedProxy {
            user_header: "x-forwarded-user".into(),
            groups_header: None,
            from: vec!["127.0.0.1/32".parse().expect("net")],
            users: BTreeMap::from([("alice".to_owned(), Role::Write)]),
            groups: BTreeMap::new(),
            secret_header: "x-outbox-proxy-secret".into(),
            secret: Secret::new(PROXY_SECRET),
        }),
        ..UiOptions::default()
    };
    let h = ui_harness(tokens(), options);
    let mut local = browser_at(&h, "127.0.0.1", &[("x-forwarded-user", "alice")]);
    let page = local.get("/ui/messages").await;
    assert_eq!(page.status, StatusCode::SEE_OTHER, "{}", page.body);
    assert!(page.location().contains("/ui/login"), "{}", page.location());
    assert!(local.cookies.keys().all(|k| !k.contains("session")));
    let mut forged = browser_at(
        &h,
        "127.0.0.1",
        &[
            ("x-forwarded-user", "alice"),
            ("x-outbox-proxy-secret", "proxy-secret-0123456788"),
        ],
    );
    assert_eq!(
        forged.get("/ui/messages").await.status,
        StatusCode::SEE_OTHER
    );
    let mut proxy = browser_at(
        &h,
        "127.0.0.1",
        &[("x-forwarded-user", "alice"), SECRET_HEADER],
    );
    let page = proxy.get("/ui/messages").await;
    assert_eq!(page.status, StatusCode::OK, "{}", page.body);
    assert!(page.body.contains("alice"));
}

/// A live stream ends when its session is logged out by another request (or in
/// another instance over the same store), not only when the browser closes it
/// (issue 47).
#[tokio::test]
async fn the_overview_stream_ends_when_its_session_is_logged_out() {
    let store = Arc::new(SharedSessions::default());
    for shared in [false, true] {
        let options = || UiOptions {
            session_store: shared.then(|| store.clone() as _),
            ..UiOptions::default()
        };
        let h = ui_harness(tokens(), options());
        h.dead(message("orders", "created", b"{}")).await;
        let mut b = Browser::new(&h);
        b.login(READ).await;
        let (status, _, mut events) = b.open_stream("/ui/overview/stream").await;
        assert_eq!(status, StatusCode::OK);
        events
            .next(Duration::from_secs(10))
            .await
            .expect("an event");
        // Another session of the same token is not ended by this logout.
        let mut colleague = Browser::new(&h);
        colleague.login(READ).await;
        let (_, _, mut theirs) = colleague.open_stream("/ui/overview/stream").await;
        theirs
            .next(Duration::from_secs(10))
            .await
            .expect("an event");

        let csrf = b.csrf().await;
        let out = b.post("/ui/logout", &format!("csrf={csrf}")).await;
        assert_eq!(out.status, StatusCode::SEE_OTHER);
        assert!(
            events.ends_within(Duration::from_secs(3)).await,
            "the stream ends at its session's logout (shared store: {shared})"
        );
        assert!(
            !theirs.ends_within(Duration::from_secs(1)).await,
            "another session's stream goes on"
        );

        if shared {
            // Logged out on another instance over the same store: this one sees
            // it at its next look at the store.
            let other_instance = ui_harness(tokens(), options());
            let mut there = Browser::new(&other_instance);
            there.cookies.clone_from(&colleague.cookies);
            let csrf = there.csrf().await;
            let out = there.post("/ui/logout", &format!("csrf={csrf}")).await;
            assert_eq!(out.status, StatusCode::SEE_OTHER);
            assert!(
                theirs.ends_within(Duration::from_secs(8)).await,
                "a logout on another instance ends the stream within the session check"
            );
        }
    }
}

/// Single sign-on keeps one session per user the proxy names, reused by every
/// cookieless page load, so a script (or many browsers) loading pages through the
/// proxy leaves a bounded number of stored sessions; the pages and their CSRF
/// tokens keep working (issue 47).
#[tokio::test]
async fn cookieless_sso_page_loads_leave_one_session_per_user() {
    use outbox_admin::TrustedProxy;
    use std::collections::BTreeMap;
    let store = Arc::new(SharedSessions::default());
    let options = UiOptions {
        trusted_proxy: Some(TrustedProxy {
            user_header: "x-forwarded-user".into(),
            groups_header: Some("x-forwarded-groups".into()),
            from: vec!["10.0.0.0/8".parse().expect("net")],
            users: BTreeMap::from([("alice".to_owned(), Role::Write)]),
            groups: BTreeMap::from([("viewers".to_owned(), Role::Read)]),
            secret_header: "x-outbox-proxy-secret".into(),
            secret: Secret::new(PROXY_SECRET),
        }),
        session_store: Some(store.clone()),
        ..UiOptions::default()
    };
    let h = ui_harness(tokens(), options);
    let id = h.dead(message("orders", "a", b"{}")).await;
    let mut first_csrf = None;
    for n in 0..40 {
        let mut alice = browser_at(
            &h,
            "10.1.2.3",
            &[("x-forwarded-user", "alice"), SECRET_HEADER],
        );
        let page = alice.get("/ui/messages").await;
        assert_eq!(page.status, StatusCode::OK, "load {n}: {}", page.body);
        first_csrf.get_or_insert(value_of(&page.body, "csrf").expect("csrf"));
        let mut vic = browser_at(
            &h,
            "10.1.2.4",
            &[
                ("x-forwarded-user", "vic"),
                ("x-forwarded-groups", "viewers"),
                SECRET_HEADER,
            ],
        );
        assert_eq!(vic.get("/ui/messages").await.status, StatusCode::OK);
    }
    assert_eq!(
        store.0.lock().expect("lock").len(),
        2,
        "one stored session per user, whatever the page loads"
    );
    // A browser that loaded the first page still writes with its CSRF token.
    let mut alice = browser_at(
        &h,
        "10.1.2.3",
        &[("x-forwarded-user", "alice"), SECRET_HEADER],
    );
    alice.get("/ui/messages").await;
    let done = alice
        .post(
            &format!("/ui/messages/{id}/requeue"),
            &format!("csrf={}", first_csrf.expect("csrf")),
        )
        .await;
    assert_eq!(done.status, StatusCode::SEE_OTHER, "{}", done.body);
    // A logout ends it; the next page load through the proxy opens it again.
    let csrf = alice.csrf().await;
    assert_eq!(
        alice
            .post("/ui/logout", &format!("csrf={csrf}"))
            .await
            .status,
        StatusCode::SEE_OTHER
    );
    assert_eq!(store.0.lock().expect("lock").len(), 1);
    assert_eq!(alice.get("/ui/messages").await.status, StatusCode::OK);
    assert_eq!(store.0.lock().expect("lock").len(), 2);
}

/// Audit actors name their kind: `token:<name>` (an API token or a token's
/// session), `sso:<user>` (the trusted proxy's user), `once:<name>` (the one-time
/// login); the CLI's are `cli:<user>`. So an SSO user named `cli:root` or
/// `token:ops` is audited as `sso:cli:root` and `sso:token:ops`, never as the CLI
/// or the token (issue 47).
#[tokio::test]
async fn audit_actors_name_their_kind_and_no_user_passes_for_another_kind() {
    use outbox_admin::TrustedProxy;
    use std::collections::BTreeMap;
    let options = UiOptions {
        trusted_proxy: Some(TrustedProxy {
            user_header: "x-forwarded-user".into(),
            groups_header: None,
            from: vec!["10.0.0.0/8".parse().expect("net")],
            users: BTreeMap::from([
                ("cli:root".to_owned(), Role::Write),
                ("token:ops".to_owned(), Role::Write),
            ]),
            groups: BTreeMap::new(),
            secret_header: "x-outbox-proxy-secret".into(),
            secret: Secret::new(PROXY_SECRET),
        }),
        one_time_login: Some(OneTimeLogin {
            secret: Secret::new("one-time-secret-0123456789"),
            name: "demo".into(),
            role: Role::Write,
        }),
        ..UiOptions::default()
    };
    let mut api = None;
    let h = ui_harness_with(tokens(), options, |service| {
        api = Some(outbox_admin::router(
            service.clone(),
            AdminAuth::new(tokens()),
        ));
        service
    });
    let api = api.expect("the API router");
    let mut ids = Vec::new();
    for n in 0..5 {
        ids.push(h.dead(message("orders", &format!("k{n}"), b"{}")).await);
    }
    // An API token.
    let response = api
        .oneshot(
            Request::post(format!("/messages/{}/requeue", ids[0]))
                .header(header::AUTHORIZATION, format!("Bearer {WRITE}"))
                .body(Body::empty())
                .expect("request"),
        )
        .await
        .expect("infallible");
    assert_eq!(response.status(), StatusCode::NO_CONTENT);
    // A token's session.
    let mut token = Browser::new(&h);
    token.login(WRITE).await;
    // SSO users whose names start with another kind's prefix.
    let mut cli = browser_at(
        &h,
        "10.1.2.3",
        &[("x-forwarded-user", "cli:root"), SECRET_HEADER],
    );
    let mut fake_token = browser_at(
        &h,
        "10.1.2.3",
        &[("x-forwarded-user", "token:ops"), SECRET_HEADER],
    );
    // The one-time login.
    let mut once = Browser::new(&h);
    let opened = once.get("/ui/login?token=one-time-secret-0123456789").await;
    assert_eq!(opened.status, StatusCode::SEE_OTHER);
    for (b, id) in [&mut token, &mut cli, &mut fake_token, &mut once]
        .into_iter()
        .zip(&ids[1..])
    {
        let csrf = b.csrf().await;
        let done = b
            .post(
                &format!("/ui/messages/{id}/requeue"),
                &format!("csrf={csrf}"),
            )
            .await;
        assert_eq!(done.status, StatusCode::SEE_OTHER, "{}", done.body);
    }
    let mut actors: Vec<String> = h
        .audit
        .list(None, 10)
        .await
        .expect("audit")
        .items
        .into_iter()
        .map(|e| e.actor)
        .collect();
    actors.reverse();
    assert_eq!(
        actors,
        [
            "token:ops",
            "token:ops",
            "sso:cli:root",
            "sso:token:ops",
            "once:demo"
        ]
    );
}

/// A pause shows on the overview and in the navigation: the paused exchange's
/// row says it holds its pending messages, the pending card how many pauses
/// hold, a paused consumer's row says so; each exchange with unsent or dead
/// messages has its counts; `/api/v1/stats` lists the same.
#[tokio::test]
async fn pauses_and_counts_per_exchange_show_on_the_overview() {
    use outbox_ports::{PauseKind, PauseStore as _};
    let h = harness();
    // The dead first: making one dead claims what is pending.
    h.dead(message("payments", "p", b"{}")).await;
    for _ in 0..3 {
        h.pending(message("orders", "order.created", b"{}")).await;
    }
    h.pending(message("payments", "p", b"{}")).await;
    h.delivered("billing", &message("orders", "order.created", b"{}"), true)
        .await;
    let mut b = Browser::new(&h);
    b.login(READ).await;
    let before = b.get("/ui").await;
    assert!(!before.body.contains("id=\"nav-pauses\""), "no pause yet");
    assert!(!before.body.contains("data-paused"));
    h.outbox
        .pauses()
        .pause(PauseKind::Exchange, "orders", "ops")
        .await
        .expect("pause");
    h.outbox
        .pauses()
        .pause(PauseKind::Consumer, "billing", "ops")
        .await
        .expect("pause");
    let page = b.get("/ui").await;
    assert_eq!(page.status, StatusCode::OK, "{}", page.body);
    let text = unescape(&page.body);
    assert!(
        text.contains(r#"id="nav-pauses""#) && text.contains("paused 2"),
        "{text}"
    );
    assert!(
        text.contains(r#"<strong id="held-by-pauses">3 held by a pause</strong>"#),
        "{text}"
    );
    let exchanges = text
        .split(r#"<table id="exchanges">"#)
        .nth(1)
        .expect("the exchanges table");
    let orders = exchanges
        .split(r#"<tr data-exchange="orders">"#)
        .nth(1)
        .and_then(|r| r.split("</tr>").next())
        .expect("orders' row");
    assert!(
        orders.contains(r#"<td class="num" data-count="pending">3</td>"#),
        "{orders}"
    );
    assert!(orders.contains("paused: holds its 3 pending"), "{orders}");
    let payments = exchanges
        .split(r#"<tr data-exchange="payments">"#)
        .nth(1)
        .and_then(|r| r.split("</tr>").next())
        .expect("payments' row");
    assert!(
        payments.contains(
            r#"data-count="dead"><a href="/ui/messages?exchange=payments&status=dead">1</a>"#
        ),
        "{payments}"
    );
    assert!(payments.contains("publishing"), "{payments}");
    let consumers = text
        .split(r#"<table id="consumers">"#)
        .nth(1)
        .expect("consumers");
    assert!(consumers.contains("paused: holds its"), "{consumers}");
    // Every page's navigation shows the pauses.
    let messages = b.get("/ui/messages").await;
    assert!(messages.body.contains(r#"id="nav-pauses""#));
}

/// A deep link (an alert's, with its filter) survives the sign-in: the login
/// redirect carries it, the form keeps it, the session opens on it. Only a page
/// of this dashboard is returned to.
#[tokio::test]
async fn signing_in_returns_to_the_page_asked_for() {
    let h = harness();
    let mut b = Browser::new(&h);
    let asked = "/ui/messages?status=dead&exchange=orders";
    let page = b.get(asked).await;
    assert_eq!(
        page.location(),
        "/ui/login?next=%2Fui%2Fmessages%3Fstatus%3Ddead%26exchange%3Dorders"
    );
    let form = b.get(page.location()).await;
    assert_eq!(form.status, StatusCode::OK);
    assert_eq!(
        value_of(&form.body, "next")
            .map(|v| unescape(&v))
            .as_deref(),
        Some(asked),
        "{}",
        form.body
    );
    let nonce = value_of(&form.body, "login_csrf").expect("nonce");
    let done = b
        .post(
            "/ui/login",
            &format!(
                "token={}&login_csrf={nonce}&next={}",
                encode(READ),
                encode(asked)
            ),
        )
        .await;
    assert_eq!(done.status, StatusCode::SEE_OTHER);
    assert_eq!(done.location(), asked);
    // Anywhere else is the home page.
    for evil in [
        "https://evil.example/ui",
        "//evil.example/ui",
        "/ui\\@evil.example",
        "/other",
        "/uix",
        "/ui/messages\u{7f}",
    ] {
        let mut other = Browser::new(&h);
        let form = other.get(&format!("/ui/login?next={}", encode(evil))).await;
        assert!(value_of(&form.body, "next").is_none(), "{evil}");
        let nonce = value_of(&form.body, "login_csrf").expect("nonce");
        let done = other
            .post(
                "/ui/login",
                &format!(
                    "token={}&login_csrf={nonce}&next={}",
                    encode(READ),
                    encode(evil)
                ),
            )
            .await;
        assert_eq!(done.location(), "/ui", "{evil}");
    }
}

/// Two dashboards on one host, on two ports: cookies are per host, so each
/// names its cookies after the port it is addressed on, and signing in to one
/// neither uses nor ends the other's session.
#[tokio::test]
async fn two_dashboards_on_one_host_keep_their_own_sessions() {
    let h = harness();
    let mut b = Browser::new(&h);
    b.host = Some("127.0.0.1:8080".to_owned());
    let done = b.login(READ).await;
    assert_eq!(done.status, StatusCode::SEE_OTHER);
    let set: Vec<String> = done
        .headers
        .get_all(header::SET_COOKIE)
        .iter()
        .map(|v| v.to_str().unwrap_or_default().to_owned())
        .collect();
    assert!(
        set.iter().any(|c| c.starts_with("outbox_session_8080=")),
        "{set:?}"
    );
    assert_eq!(b.get("/ui").await.status, StatusCode::OK);
    // The same browser (its cookies) at the other port: not signed in there.
    b.host = Some("127.0.0.1:8081".to_owned());
    assert_eq!(b.get("/ui").await.status, StatusCode::SEE_OTHER);
    b.login(WRITE).await;
    assert_eq!(b.get("/ui").await.status, StatusCode::OK);
    b.host = Some("127.0.0.1:8080".to_owned());
    let first = b.get("/ui").await;
    assert_eq!(first.status, StatusCode::OK, "the first session holds");
    assert!(first.body.contains(r#"<span id="role">read</span>"#));
}

/// Depths the broker "reports", or an error.
struct FixedDepths(Result<Vec<outbox_ports::QueueDepth>, String>);

#[async_trait::async_trait]
impl outbox_ports::QueueDepths for FixedDepths {
    async fn queue_depths(&self) -> Result<Vec<outbox_ports::QueueDepth>, outbox_ports::PortError> {
        self.0
            .clone()
            .map_err(|e| outbox_ports::PortError::transient("queue depths", e))
    }
}

/// What waits in the consumers' queues shows on the overview beside what waits
/// in the outbox: never "nothing unsent" alone while a queue holds 1,520; a
/// queue the broker cannot report is unknown; a broker that does not answer is
/// said, and the page still renders.
#[tokio::test]
async fn the_overview_shows_the_queues_depths_from_the_broker() {
    let depths = vec![
        outbox_ports::QueueDepth {
            queue: "billing-q".into(),
            messages: Some(1_520),
            consumers: Some(2),
        },
        outbox_ports::QueueDepth {
            queue: "gone-q".into(),
            messages: None,
            consumers: None,
        },
    ];
    let depths_again = depths.clone();
    let h = ui_harness_with(tokens(), UiOptions::default(), move |s| {
        s.with_queue_depths(std::sync::Arc::new(FixedDepths(Ok(depths.clone()))))
    });
    let mut b = Browser::new(&h);
    b.login(READ).await;
    let page = b.get("/ui").await;
    assert_eq!(page.status, StatusCode::OK, "{}", page.body);
    let text = unescape(&page.body);
    assert!(
        text.contains("nothing unsent; 1,520 messages wait in queues"),
        "{text}"
    );
    assert!(
        text.contains(r#"<tr data-queue="billing-q"><th scope="row">billing-q</th><td class="num" data-count="messages">1,520</td><td class="num" data-count="consumers">2</td></tr>"#),
        "{text}"
    );
    assert!(text.contains(r#"<tr data-queue="gone-q"><th scope="row">gone-q</th><td class="num" data-count="messages">unknown</td>"#));
    // /api/v1/stats: the same service's numbers.
    let service = |h: &Harness, depths: FixedDepths| {
        AdminService::new(AdminPorts {
            outbox: h.outbox.clone(),
            inbox: h.inbox.clone(),
            audit: h.audit.clone(),
            outbox_store: h.outbox.clone(),
            pauses: Arc::new(h.outbox.pauses()),
        })
        .with_queue_depths(Arc::new(depths))
    };
    let stats = service(&h, FixedDepths(Ok(depths_again)))
        .stats()
        .await
        .expect("stats");
    assert_eq!(stats.precision.queues, "broker");
    assert_eq!(stats.queues[0].messages, Some(1_520));
    assert_eq!(stats.queues[1].messages, None);

    let down = ui_harness_with(tokens(), UiOptions::default(), |s| {
        s.with_queue_depths(std::sync::Arc::new(FixedDepths(Err(
            "connection refused".into()
        ))))
    });
    let mut b = Browser::new(&down);
    b.login(READ).await;
    let page = b.get("/ui").await;
    assert_eq!(
        page.status,
        StatusCode::OK,
        "a broker that does not answer fails no page"
    );
    assert!(
        page.body.contains(r#"id="queues-unavailable""#),
        "{}",
        page.body
    );
    let stats = service(&down, FixedDepths(Err("connection refused".into())))
        .stats()
        .await
        .expect("stats without the broker");
    assert!(
        stats.precision.queues.starts_with("unavailable: "),
        "{}",
        stats.precision.queues
    );
    assert!(stats.queues.is_empty());
}
