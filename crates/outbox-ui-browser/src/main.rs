//! The dashboard's browser tests (`cargo xtask ui-test`): serves the dashboard and
//! the JSON API over the in-memory adapters with seeded messages, starts Debian's
//! `chromedriver` and drives headless `chromium` through the issue's scenarios,
//! one after the other. On the first failure it saves a screenshot under
//! `<target>/ui-screenshots/` and exits non-zero.
//!
//! Environment: `CHROMIUM` (default `/usr/bin/chromium`), `CHROMEDRIVER` (default
//! `/usr/bin/chromedriver`), `UI_SCREENSHOTS` (default `target/ui-screenshots`),
//! `OUTBOX_TEST_DATABASE_URL` (the sessions' PostgreSQL, as `outbox run` keeps
//! them; a schema of its own, dropped at the end).
//! `--docs DIR` also saves screenshots of the overview and a message's page there.
//! Then the scale scenario (`scale`: issue 49 over 300,000 rows in PostgreSQL);
//! `--scale` runs it alone.

mod scale;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context as _, anyhow, bail, ensure};
use fantoccini::{Client, ClientBuilder, Locator};
use outbox_adapters_memory::{
    MemoryAuditLog, MemoryInboxStore, MemoryLock, MemoryOutboxStore, MemorySweepState,
    MemoryThroughputLog,
};
use outbox_admin::{AdminAuth, AdminPorts, AdminService, AdminToken, Role, Secret, UiOptions};
use outbox_core::{Decision, Message, MessageId, NewMessage};
use outbox_ports::prelude::*;
use outbox_ports::{Lease, PublishFailure, SystemClock, ThroughputKind};
use serde_json::{Value, json};

const READ: &str = "browser-read-token-0123456789";
const WRITE: &str = "browser-write-token-0123456789";
/// Dead messages seeded per exchange, and pending ones.
const DEAD_ORDERS: usize = 5;
const DEAD_BILLING: usize = 2;
const PENDING: usize = 3;

fn message(exchange: &str, n: usize) -> Message {
    static COUNTER: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let c = COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let mut random = [0u8; 10];
    random[..8].copy_from_slice(&c.to_be_bytes());
    let now = time::OffsetDateTime::now_utc();
    let payload =
        format!(r#"{{"order_id":{n},"customer":"c-{n}","lines":[{{"sku":"A-{n}","qty":2}}]}}"#);
    NewMessage::new(exchange, "order.created", payload.into_bytes())
        .with_type("order.created")
        .with_source("browser-test")
        .into_message(MessageId::v7(now, random), now)
}

/// The stores with dead, pending and consumed-side rows, and the app over them.
/// The dashboard over freshly seeded memory stores, its sessions in `sessions`
/// (PostgreSQL: they outlive a restart of the server), its live streams ended by
/// `shutdown`.
async fn seeded_app(
    sessions: Arc<dyn tower_sessions_core::SessionStore>,
    shutdown: tokio::sync::watch::Receiver<bool>,
) -> anyhow::Result<axum::Router> {
    let clock = Arc::new(SystemClock);
    let outbox = Arc::new(MemoryOutboxStore::new(clock.clone()));
    let inbox = Arc::new(MemoryInboxStore::new(clock.clone()));
    let audit = Arc::new(MemoryAuditLog::new(clock.clone()));
    let state = Arc::new(MemorySweepState::new(clock.clone()));
    let lock = Arc::new(MemoryLock::new());
    let mut dead = Vec::new();
    for n in 0..DEAD_ORDERS {
        dead.push(message("orders", n));
    }
    for n in 0..DEAD_BILLING {
        dead.push(message("billing", 100 + n));
    }
    outbox.enqueue(dead.clone()).await?;
    let lease = Lease::new("browser-seed", Duration::from_secs(30));
    let claimed = outbox.claim_pending(&lease, 1000).await?;
    let failures: Vec<PublishFailure> = claimed
        .iter()
        .map(|c| PublishFailure {
            id: c.message.id,
            error: "broker said no (seeded)".into(),
            decision: Decision::Dead,
        })
        .collect();
    outbox.mark_publish_failed(&lease, &failures).await?;
    // One failing message with three failed attempts, due again in an hour.
    let flaky = message("flaky", 300);
    outbox.enqueue(vec![flaky.clone()]).await?;
    for n in 1..=3 {
        let lease = Lease::new(format!("browser-seed-{n}"), Duration::from_secs(30));
        let claimed = if n == 1 {
            outbox.claim_pending(&lease, 10).await?
        } else {
            outbox.claim_due_retries(&lease, 10).await?
        };
        ensure!(
            claimed.iter().map(|c| c.message.id).eq([flaky.id]),
            "seeding the flaky message, round {n}: {} claimed",
            claimed.len()
        );
        let delay = if n == 3 { 3600 } else { 0 };
        outbox
            .mark_publish_failed(
                &lease,
                &[PublishFailure {
                    id: flaky.id,
                    error: format!("no route (seeded {n})"),
                    decision: Decision::RetryAfter(Duration::from_secs(delay)),
                }],
            )
            .await?;
    }
    // One dead message of its own, requeued through the API while the overview is
    // open (the live-update scenario), before any scenario counts the dead.
    // Two: one for the overview, one for a list.
    let live = [message("live", 400), message("live", 401)];
    outbox.enqueue(live.to_vec()).await?;
    let lease = Lease::new("browser-seed-live", Duration::from_secs(30));
    let claimed = outbox.claim_pending(&lease, 10).await?;
    ensure!(
        claimed.len() == 2,
        "seeding the live messages: {} claimed",
        claimed.len()
    );
    let failures: Vec<PublishFailure> = live
        .iter()
        .map(|m| PublishFailure {
            id: m.id,
            error: "broker said no (seeded)".into(),
            decision: Decision::Dead,
        })
        .collect();
    outbox.mark_publish_failed(&lease, &failures).await?;
    let pending: Vec<Message> = (0..PENDING).map(|n| message("orders", 200 + n)).collect();
    outbox.enqueue(pending).await?;
    // One consumer with two dead deliveries and a consumed one.
    for (m, ok) in [(&dead[0], false), (&dead[1], true), (&dead[2], false)] {
        let lease = Lease::new(format!("c-{}", m.id), Duration::from_secs(30));
        inbox.record_arrival("shipping", m, &lease).await?;
        if ok {
            inbox.mark_consumed("shipping", m.id, &lease).await?;
        } else {
            inbox
                .mark_consume_failed(
                    "shipping",
                    m.id,
                    &lease,
                    "handler failed (seeded)",
                    Decision::Dead,
                )
                .await?;
        }
    }
    // Each exchange's and consumer's chart: what relays and workers would add.
    let past = Arc::new(PastClock::default());
    let throughput = Arc::new(MemoryThroughputLog::new(past.clone()));
    for (kind, name, count) in [
        (ThroughputKind::Published, "orders", 42),
        (ThroughputKind::PublishFailed, "orders", 5),
        (ThroughputKind::Published, "billing", 3),
        (ThroughputKind::Consumed, "shipping", 7),
    ] {
        throughput
            .add_named(kind, &[(name.to_owned(), count)])
            .await?;
    }
    // A day of `payments` (the docs' screenshot): a daily wave, and failures in
    // one hour, added as a relay would have added them.
    for minutes_ago in (0..24 * 60).step_by(5) {
        past.set_minutes_ago(minutes_ago);
        let hour = (minutes_ago / 60) as f64;
        let published = 300.0 + 200.0 * (hour / 24.0 * std::f64::consts::TAU).cos();
        throughput
            .add_named(
                ThroughputKind::Published,
                &[("payments".to_owned(), published as u64)],
            )
            .await?;
        if minutes_ago / 60 == 6 {
            throughput
                .add_named(
                    ThroughputKind::PublishFailed,
                    &[("payments".to_owned(), 40)],
                )
                .await?;
        }
    }
    // The last hour of every exchange and consumer (the overview's chart).
    for minutes_ago in 0..60_i64 {
        past.set_minutes_ago(minutes_ago);
        let wave = (minutes_ago as f64 / 60.0 * std::f64::consts::TAU).sin();
        let published = (40.0 + 15.0 * wave) as u64;
        throughput.add(ThroughputKind::Published, published).await?;
        throughput
            .add(ThroughputKind::Consumed, published.saturating_sub(3))
            .await?;
        if minutes_ago % 9 == 4 {
            throughput.add(ThroughputKind::PublishFailed, 6).await?;
            throughput.add(ThroughputKind::ConsumeFailed, 2).await?;
        }
    }
    past.set_minutes_ago(0);
    let service = AdminService::new(AdminPorts {
        outbox: outbox.clone(),
        inbox: inbox.clone(),
        audit,
        pauses: Arc::new(outbox.pauses()),
        outbox_store: outbox,
    })
    .with_throughput(throughput)
    .with_sweep_reports(state, vec!["outbox.publish-retry.last-state".into()])
    .with_locks(lock, vec!["outbox.publish-retry.run-lock".into()]);
    let auth = AdminAuth::new(vec![
        AdminToken {
            name: "viewer".into(),
            secret: Secret::new(READ),
            role: Role::Read,
        },
        AdminToken {
            name: "ops".into(),
            secret: Secret::new(WRITE),
            role: Role::Write,
        },
    ]);
    // The same stores twice: at /ui with editing on, at /plain with it off (the
    // default), so both are seen in one browser.
    Ok(axum::Router::new()
        .nest(
            "/ui",
            outbox_admin::ui_router(
                service.clone().with_edit(true),
                auth.clone(),
                UiOptions {
                    session_store: Some(Arc::clone(&sessions)),
                    shutdown: Some(shutdown.clone()),
                    ..UiOptions::default()
                },
            ),
        )
        .nest(
            "/plain",
            outbox_admin::ui_router(
                service.clone(),
                auth.clone(),
                UiOptions {
                    base: "/plain".to_owned(),
                    session_store: Some(sessions),
                    shutdown: Some(shutdown),
                    ..UiOptions::default()
                },
            ),
        )
        .nest("/api/v1", outbox_admin::router(service, auth)))
}

/// The system's clock, or as it read some minutes ago (to seed a day of charts).
#[derive(Default)]
struct PastClock {
    minutes_ago: std::sync::atomic::AtomicI64,
}

impl PastClock {
    fn set_minutes_ago(&self, minutes: i64) {
        self.minutes_ago
            .store(minutes, std::sync::atomic::Ordering::Relaxed);
    }
}

impl outbox_ports::Clock for PastClock {
    fn now(&self) -> outbox_core::Timestamp {
        let ago = self.minutes_ago.load(std::sync::atomic::Ordering::Relaxed);
        outbox_ports::Clock::now(&SystemClock) - time::Duration::minutes(ago)
    }
}

fn free_port() -> anyhow::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

/// chromedriver on a free loopback port (killed when dropped).
async fn start_chromedriver(path: &str) -> anyhow::Result<(tokio::process::Child, String)> {
    let port = free_port()?;
    let child = tokio::process::Command::new(path)
        .arg(format!("--port={port}"))
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .with_context(|| format!("cannot start {path}"))?;
    let address = format!("127.0.0.1:{port}");
    for _ in 0..100 {
        if tokio::net::TcpStream::connect(&address).await.is_ok() {
            return Ok((child, format!("http://{address}")));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    bail!("chromedriver did not listen on {address} within 10 s")
}

async fn browser(driver: &str, chromium: &str) -> anyhow::Result<Client> {
    let mut caps = serde_json::Map::new();
    caps.insert(
        "goog:chromeOptions".into(),
        json!({
            "binary": chromium,
            "args": [
                "--headless=new", "--no-sandbox", "--disable-gpu",
                "--disable-background-networking", "--disable-component-update",
                "--no-first-run", "--window-size=1280,1000", "--disable-dev-shm-usage"
            ]
        }),
    );
    let connector = hyper_util::client::legacy::connect::HttpConnector::new();
    ClientBuilder::new(connector)
        .capabilities(caps)
        .connect(driver)
        .await
        .context("cannot open a chromium session through chromedriver")
}

/// The dashboard's server: stopped and started again on the same address by the
/// restart scenario.
struct Dashboard {
    address: std::net::SocketAddr,
    sessions: Arc<dyn tower_sessions_core::SessionStore>,
    running: tokio::sync::Mutex<
        Option<(
            tokio::sync::watch::Sender<bool>,
            tokio::task::JoinHandle<()>,
        )>,
    >,
}

impl Dashboard {
    /// Serves a freshly seeded dashboard on `listener`.
    async fn serve(&self, listener: tokio::net::TcpListener) -> anyhow::Result<()> {
        let (stop, shutdown) = tokio::sync::watch::channel(false);
        let app = seeded_app(Arc::clone(&self.sessions), shutdown.clone()).await?;
        let mut until = shutdown;
        let server = tokio::spawn(async move {
            let _ = axum::serve(listener, app)
                .with_graceful_shutdown(async move {
                    let _ = until.wait_for(|stop| *stop).await;
                })
                .await;
        });
        *self.running.lock().await = Some((stop, server));
        Ok(())
    }

    /// Stops the server (open pages' live streams end with it) and starts a new
    /// one, over new stores, on the same address; the sessions stay in PostgreSQL.
    async fn restart(&self) -> anyhow::Result<()> {
        if let Some((stop, server)) = self.running.lock().await.take() {
            let _ = stop.send(true);
            tokio::time::timeout(WAIT, server)
                .await
                .context("the dashboard did not stop within 10 s")??;
        }
        let listener = tokio::net::TcpListener::bind(self.address).await?;
        self.serve(listener).await
    }
}

/// The sessions' store: the PostgreSQL session store in a schema of its own
/// (`OUTBOX_TEST_DATABASE_URL`, as every PostgreSQL test); the schema is dropped
/// at the end.
async fn session_store() -> anyhow::Result<(
    Arc<dyn tower_sessions_core::SessionStore>,
    sqlx::PgPool,
    String,
)> {
    let url = std::env::var("OUTBOX_TEST_DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into());
    let pool = outbox_adapters_postgres::connect(&url, 2, Duration::from_secs(5))
        .await
        .with_context(|| {
            format!("the session scenario needs PostgreSQL at {url} (OUTBOX_TEST_DATABASE_URL)")
        })?;
    let name = format!("obui_{}", std::process::id());
    let schema = outbox_adapters_postgres::PgSchema::new(&name)?;
    outbox_adapters_postgres::migrate(&pool, &schema).await?;
    let store = outbox_adapters_postgres::ui_sessions(pool.clone(), &schema)?;
    Ok((Arc::new(store), pool, name))
}

/// The scenarios, against the dashboard at `base` (`http://127.0.0.1:port`).
struct Scenarios<'a> {
    c: &'a Client,
    base: String,
    dashboard: &'a Dashboard,
}

const WAIT: Duration = Duration::from_secs(10);

impl Scenarios<'_> {
    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    async fn goto(&self, path: &str) -> anyhow::Result<()> {
        self.c.goto(&self.url(path)).await?;
        Ok(())
    }

    async fn path(&self) -> anyhow::Result<String> {
        let url = self.c.current_url().await?;
        Ok(match url.query() {
            Some(q) => format!("{}?{q}", url.path()),
            None => url.path().to_owned(),
        })
    }

    /// The first element `locator` finds, looked for again until [`WAIT`] runs
    /// out: while it is not there yet, and while a navigation a click started is
    /// still under way (chromedriver then answers "aborted by navigation", which
    /// fantoccini's own wait does not retry; CI failed on it under load).
    async fn find(
        &self,
        locator: Locator<'_>,
    ) -> Result<fantoccini::elements::Element, fantoccini::error::CmdError> {
        let deadline = std::time::Instant::now() + WAIT;
        loop {
            match self.c.find(locator).await {
                Err(_) if std::time::Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                found => return found,
            }
        }
    }

    async fn wait_for(&self, css: &str) -> anyhow::Result<fantoccini::elements::Element> {
        match self.find(Locator::Css(css)).await {
            Ok(element) => Ok(element),
            Err(e) => {
                let at = self.path().await.unwrap_or_default();
                Err(anyhow!(e).context(format!("no `{css}` on {at}")))
            }
        }
    }

    /// The text of the first element `css` finds, read again while the element
    /// goes stale under the read (a live update swapped it out) until [`WAIT`].
    async fn text(&self, css: &str) -> anyhow::Result<String> {
        let deadline = std::time::Instant::now() + WAIT;
        loop {
            match self.wait_for(css).await?.text().await {
                Ok(text) => return Ok(text.trim().to_owned()),
                Err(e) if std::time::Instant::now() >= deadline => return Err(e.into()),
                Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
            }
        }
    }

    /// The value of attribute `name` of the first element `css` finds, as
    /// [`Scenarios::text`] reads (again while it goes stale).
    async fn attr(&self, css: &str, name: &str) -> anyhow::Result<Option<String>> {
        let deadline = std::time::Instant::now() + WAIT;
        loop {
            match self.wait_for(css).await?.attr(name).await {
                Ok(value) => return Ok(value),
                Err(e) if std::time::Instant::now() >= deadline => return Err(e.into()),
                Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
            }
        }
    }

    /// Clicks the first element `css` finds, found again while it goes stale
    /// before the click lands (the lists' tabs are swapped as numbers change).
    async fn click(&self, css: &str) -> anyhow::Result<()> {
        let deadline = std::time::Instant::now() + WAIT;
        loop {
            match self.wait_for(css).await?.click().await {
                Ok(()) => return Ok(()),
                Err(e) if std::time::Instant::now() >= deadline => return Err(e.into()),
                Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
            }
        }
    }

    async fn button(&self, name: &str) -> anyhow::Result<fantoccini::elements::Element> {
        let xpath = format!("//button[normalize-space()='{name}']");
        self.find(Locator::XPath(&xpath))
            .await
            .with_context(|| format!("no button named `{name}`"))
    }

    /// The rows of the results table: (data-id, data-status).
    async fn rows(&self) -> anyhow::Result<Vec<(String, String)>> {
        self.wait_for("table#results tbody").await?;
        let mut rows = Vec::new();
        for row in self
            .c
            .find_all(Locator::Css("table#results tbody tr"))
            .await?
        {
            rows.push((
                row.attr("data-id").await?.unwrap_or_default(),
                row.attr("data-status").await?.unwrap_or_default(),
            ));
        }
        Ok(rows)
    }

    async fn login(&self, token: &str) -> anyhow::Result<()> {
        self.goto("/ui/login").await?;
        let field = self
            .wait_for("form input[type=password][name=token]")
            .await?;
        // Submitted with Enter, as a person would.
        field.send_keys(&format!("{token}\u{E007}")).await?;
        Ok(())
    }

    async fn logout(&self) -> anyhow::Result<()> {
        self.button("Log out").await?.click().await?;
        self.wait_for("input[name=token]").await?;
        Ok(())
    }

    /// `fetch` from the page (same origin, the session's cookie): the status.
    async fn post_from_page(&self, path: &str, form: Value) -> anyhow::Result<u64> {
        let script = "const done = arguments[arguments.length - 1];
            fetch(arguments[0], {method: 'POST', body: new URLSearchParams(arguments[1]),
                  credentials: 'same-origin', redirect: 'manual'})
              .then(r => done(r.status)).catch(e => done('error: ' + e));";
        let status = self
            .c
            .execute_async(script, vec![json!(self.url(path)), form])
            .await?;
        status
            .as_u64()
            .ok_or_else(|| anyhow!("the POST did not complete: {status}"))
    }

    /// This page's CSRF token, as htmx sends it (the body's hx-headers).
    async fn csrf(&self) -> anyhow::Result<String> {
        let headers = self
            .wait_for("body")
            .await?
            .attr("hx-headers")
            .await?
            .ok_or_else(|| anyhow!("no hx-headers on body"))?;
        let headers: Value = serde_json::from_str(&headers)?;
        headers["X-CSRF-Token"]
            .as_str()
            .map(str::to_owned)
            .ok_or_else(|| anyhow!("no X-CSRF-Token in {headers}"))
    }

    async fn api_stats(&self) -> anyhow::Result<Value> {
        let script = "const done = arguments[arguments.length - 1];
            fetch('/api/v1/stats', {headers: {Authorization: 'Bearer ' + arguments[0]}})
              .then(r => r.json()).then(done).catch(e => done({error: String(e)}));";
        Ok(self.c.execute_async(script, vec![json!(READ)]).await?)
    }

    // ------------------------------------------------------------- scenarios

    async fn wrong_token_shows_the_form_again(&self) -> anyhow::Result<()> {
        self.login("not-a-token-at-all").await?;
        let error = self.text("#login-error").await?;
        ensure!(error.contains("unknown token"), "error shown: {error}");
        self.wait_for("form input[name=token]").await?;
        Ok(())
    }

    async fn log_in(&self) -> anyhow::Result<()> {
        self.login(WRITE).await?;
        let actor = self.text("#actor").await?;
        ensure!(actor == "ops", "signed in as {actor}");
        let path = self.path().await?;
        ensure!(path == "/ui", "after login at {path}");
        Ok(())
    }

    /// A change made elsewhere (a requeue through the API) shows on the open
    /// overview without a reload: the page's own marker survives, the count moves.
    async fn a_change_shows_on_the_overview_without_a_reload(&self) -> anyhow::Result<()> {
        self.goto("/ui").await?;
        self.wait_for("#live-feed[data-live]").await?;
        self.a_requeue_elsewhere_moves("#count-dead").await
    }

    /// The same on a list: its dead tab's count moves, its rows stay.
    async fn a_change_shows_on_a_list_without_a_reload(&self) -> anyhow::Result<()> {
        self.goto("/ui/messages?exchange=orders").await?;
        self.wait_for("#tabs-feed[data-live]").await?;
        let rows = self.rows().await?;
        // Unfiltered tabs count: the list filtered by exchange shows none.
        self.goto("/ui/messages").await?;
        self.wait_for("#tabs-feed[data-live]").await?;
        self.a_requeue_elsewhere_moves("#status-tabs a[data-status=dead] .count")
            .await?;
        self.goto("/ui/messages?exchange=orders").await?;
        ensure!(self.rows().await? == rows, "the orders list changed");
        Ok(())
    }

    /// Requeues one dead `live` message through the API and waits for the number
    /// at `css` to go down by one, on this very page (not reloaded).
    async fn a_requeue_elsewhere_moves(&self, css: &str) -> anyhow::Result<()> {
        let before: u64 = self.text(css).await?.parse()?;
        self.c
            .execute("window.__outboxMarker = 'same page';", vec![])
            .await?;
        let script = "const done = arguments[arguments.length - 1];
            const auth = {Authorization: 'Bearer ' + arguments[0]};
            fetch('/api/v1/messages?status=dead&exchange=live&limit=1', {headers: auth})
              .then(r => r.json())
              .then(page => fetch('/api/v1/messages/' + page.items[0].id + '/requeue',
                                  {method: 'POST', headers: auth}))
              .then(r => done(r.status)).catch(e => done('error: ' + e));";
        let status = self.c.execute_async(script, vec![json!(WRITE)]).await?;
        ensure!(
            status.as_u64() == Some(204),
            "requeue through the API: {status}"
        );
        let deadline = std::time::Instant::now() + WAIT;
        loop {
            let shown: u64 = self.text(css).await?.parse()?;
            if shown + 1 == before {
                break;
            }
            ensure!(
                std::time::Instant::now() < deadline,
                "the page still shows {shown} dead (was {before}) after the requeue"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        let marker = self
            .c
            .execute("return window.__outboxMarker;", vec![])
            .await?;
        ensure!(
            marker == json!("same page"),
            "the page was reloaded: {marker}"
        );
        Ok(())
    }

    async fn overview_counts_match_the_api(&self) -> anyhow::Result<()> {
        self.c
            .find(Locator::LinkText("Overview"))
            .await?
            .click()
            .await?;
        let stats = self.api_stats().await?;
        for (id, key) in [
            ("count-pending", "pending"),
            ("count-publish_failed", "publish_failed"),
            ("count-dead", "dead"),
        ] {
            let shown = self.text(&format!("#{id}")).await?;
            let api = &stats["outbox"][key];
            ensure!(
                api.as_u64().map(|n| n.to_string()) == Some(shown.clone()),
                "{key}: page says {shown}, /api/v1/stats says {api}"
            );
        }
        let consumers = stats["consumers"]
            .as_array()
            .ok_or_else(|| anyhow!("no consumers in {stats}"))?;
        ensure!(!consumers.is_empty(), "seeded consumer missing: {stats}");
        for consumer in consumers {
            let name = consumer["name"].as_str().unwrap_or_default();
            for key in ["received", "consume_failed", "dead", "dead_letters"] {
                let shown = self
                    .text(&format!(
                        "tr[data-consumer='{name}'] td[data-count='{key}']"
                    ))
                    .await?;
                ensure!(
                    consumer[key].as_u64().map(|n| n.to_string()) == Some(shown.clone()),
                    "{name}.{key}: page says {shown}, API says {}",
                    consumer[key]
                );
            }
        }
        Ok(())
    }

    async fn filter_to_dead(&self) -> anyhow::Result<usize> {
        self.c
            .find(Locator::LinkText("Messages"))
            .await?
            .click()
            .await?;
        let select = self.wait_for("form select[name=status]").await?;
        select.select_by_value("dead").await?;
        self.button("Filter").await?.click().await?;
        self.c
            .wait()
            .at_most(WAIT)
            .for_url(&self.url("/ui/messages?status=dead&exchange=&q=&error=&routing_key=&type=&created_after=&created_before=&sort=newest&limit=50").parse()?)
            .await
            .context("the filter is in the URL")?;
        let rows = self.rows().await?;
        ensure!(
            rows.len() == DEAD_ORDERS + DEAD_BILLING,
            "{} rows, expected {}",
            rows.len(),
            DEAD_ORDERS + DEAD_BILLING
        );
        ensure!(rows.iter().all(|(_, s)| s == "dead"), "{rows:?}");
        Ok(rows.len())
    }

    async fn requeue_one_from_its_page(&self, dead_before: usize) -> anyhow::Result<()> {
        let first = self.wait_for("table#results tbody tr").await?;
        let id = first.attr("data-id").await?.unwrap_or_default();
        first.find(Locator::Css("a")).await?.click().await?;
        let shown = self.text("#message-id").await?;
        ensure!(shown == id, "opened {shown}, expected {id}");
        self.button("Requeue").await?.click().await?;
        let question = self.text("dialog#confirm h2").await?;
        ensure!(question.contains("Requeue"), "dialog: {question}");
        self.button("Confirm").await?.click().await?;
        self.wait_for("#notice").await?;
        let status = self.text("#status").await?;
        ensure!(status == "pending", "status after requeue: {status}");
        self.goto("/ui/messages?status=dead").await?;
        let rows = self.rows().await?;
        ensure!(
            rows.len() == dead_before - 1,
            "{} dead rows left",
            rows.len()
        );
        ensure!(rows.iter().all(|(r, _)| *r != id), "{id} still listed dead");
        Ok(())
    }

    /// Two ticked rows are requeued after a dialog that counts them; the rest of
    /// the list stays dead.
    async fn requeue_two_ticked_rows(&self) -> anyhow::Result<()> {
        self.goto("/ui/messages?status=dead&exchange=orders")
            .await?;
        let before = self.rows().await?;
        ensure!(
            before.len() >= 3,
            "{} dead orders to pick from",
            before.len()
        );
        let picked: Vec<String> = before.iter().take(2).map(|(id, _)| id.clone()).collect();
        for id in &picked {
            self.wait_for(&format!(
                "table#results tbody tr[data-id=\"{id}\"] input[type=checkbox]"
            ))
            .await?
            .click()
            .await?;
        }
        self.button("Requeue selected…").await?.click().await?;
        let question = self.text("dialog#confirm h2").await?;
        ensure!(
            question == "Requeue 2 messages, as selected?",
            "dialog: {question}"
        );
        self.button("Confirm").await?.click().await?;
        let notice = self.text("#notice").await?;
        ensure!(
            notice == "Requeued 2 of the 2 selected.",
            "notice: {notice}"
        );
        let after = self.rows().await?;
        ensure!(
            after.len() == before.len() - 2,
            "{} dead left of {}",
            after.len(),
            before.len()
        );
        ensure!(
            after.iter().all(|(id, _)| !picked.contains(id)),
            "a ticked one is still dead: {after:?}"
        );
        Ok(())
    }

    /// Every bulk dialog's dry run counts what its filtered list shows (a dialog
    /// that counted for the wrong consumer said 0 while 2 matched).
    async fn every_bulk_dialog_counts_what_the_list_shows(&self) -> anyhow::Result<()> {
        for (page, button, what) in [
            (
                "/ui/messages?status=dead",
                "Requeue all matching…",
                "messages",
            ),
            (
                "/ui/messages?status=dead",
                "Delete all matching…",
                "messages",
            ),
            (
                "/ui/consumers/shipping?status=dead",
                "Reconsume all matching…",
                "deliveries",
            ),
        ] {
            self.goto(page).await?;
            let listed = self.rows().await?.len();
            ensure!(listed > 0, "{page}: nothing listed to count");
            self.button(button).await?.click().await?;
            let text = self.text("#confirm-text").await?;
            // "1 delivery matches", "3 deliveries match".
            let said = match (listed, what) {
                (1, "deliveries") => "1 delivery matches this filter".to_owned(),
                (1, _) => "1 message matches this filter".to_owned(),
                (n, what) => format!("{n} {what} match this filter"),
            };
            ensure!(
                text.contains(&format!("Dry run: {said}")),
                "{page}, {button}: {listed} listed, the dialog says: {text}"
            );
            self.c
                .find(Locator::LinkText("Cancel"))
                .await?
                .click()
                .await?;
        }
        Ok(())
    }

    async fn bulk_requeue_after_the_dry_run(&self) -> anyhow::Result<()> {
        self.goto("/ui/messages?status=dead&exchange=orders")
            .await?;
        let matching = self.rows().await?.len();
        ensure!(matching > 0, "nothing dead in orders left to requeue");
        self.button("Requeue all matching…").await?.click().await?;
        let text = self.text("#confirm-text").await?;
        let said = if matching == 1 {
            "1 message matches this filter".to_owned()
        } else {
            format!("{matching} messages match this filter")
        };
        ensure!(
            text.contains(&format!("Dry run: {said}")),
            "dialog says: {text}"
        );
        self.button("Confirm").await?.click().await?;
        let notice = self.text("#notice").await?;
        ensure!(
            notice == format!("Requeued {matching}."),
            "notice: {notice}"
        );
        let rows = self.rows().await?;
        ensure!(rows.is_empty(), "still dead: {rows:?}");
        let path = self.path().await?;
        ensure!(
            path.contains("status=dead") && path.contains("exchange=orders"),
            "the filter is kept: {path}"
        );
        Ok(())
    }

    async fn read_only_has_no_write_buttons_and_a_forged_post_is_refused(
        &self,
    ) -> anyhow::Result<()> {
        self.logout().await?;
        self.login(READ).await?;
        let role = self.text("#role").await?;
        ensure!(role == "read", "role {role}");
        self.goto("/ui/messages?status=dead").await?;
        let rows = self.rows().await?;
        let (id, _) = rows
            .first()
            .cloned()
            .ok_or_else(|| anyhow!("no dead message left for the read-only check"))?;
        let write_buttons = "//button[normalize-space()='Requeue' or normalize-space()='Delete' or normalize-space()='Reconsume' or contains(., 'all matching')]";
        let found = self.c.find_all(Locator::XPath(write_buttons)).await?;
        ensure!(
            found.is_empty(),
            "{} write buttons on the list",
            found.len()
        );
        self.goto(&format!("/ui/messages/{id}")).await?;
        self.wait_for("#message-id").await?;
        let found = self.c.find_all(Locator::XPath(write_buttons)).await?;
        ensure!(
            found.is_empty(),
            "{} write buttons on the detail",
            found.len()
        );
        let csrf = self.csrf().await?;
        let status = self
            .post_from_page(
                &format!("/ui/messages/{id}/requeue"),
                json!({ "csrf": csrf }),
            )
            .await?;
        ensure!(status == 403, "forged POST of a read session: {status}");
        self.c.refresh().await?;
        let status = self.text("#status").await?;
        ensure!(status == "dead", "the message changed: {status}");
        Ok(())
    }

    async fn a_post_without_the_csrf_token_is_refused(&self) -> anyhow::Result<()> {
        self.logout().await?;
        self.login(WRITE).await?;
        self.text("#actor").await?;
        self.goto("/ui/messages?status=dead").await?;
        let (id, _) = self
            .rows()
            .await?
            .first()
            .cloned()
            .ok_or_else(|| anyhow!("no dead message left for the CSRF check"))?;
        let status = self
            .post_from_page(&format!("/ui/messages/{id}/requeue"), json!({}))
            .await?;
        ensure!(status == 403, "POST without CSRF token: {status}");
        self.goto(&format!("/ui/messages/{id}")).await?;
        let status = self.text("#status").await?;
        ensure!(status == "dead", "the message changed: {status}");
        Ok(())
    }

    /// A dead message edited on its page and replayed: the new message's page
    /// says so, shows the edit and links its original; the original links its
    /// replay and offers neither a requeue nor the form any more.
    async fn edit_and_replay_a_dead_message(&self) -> anyhow::Result<()> {
        self.goto("/ui/messages?status=dead&exchange=billing")
            .await?;
        let (id, _) = self
            .rows()
            .await?
            .first()
            .cloned()
            .ok_or_else(|| anyhow!("no dead billing message left to replay"))?;
        self.goto(&format!("/ui/messages/{id}")).await?;
        self.wait_for("#edit-replay summary").await?.click().await?;
        let edited = r#"{"order_id":9999,"edited":true}"#;
        let area = self.wait_for("#replay-payload").await?;
        area.clear().await?;
        area.send_keys(edited).await?;
        self.button("Replay").await?.click().await?;
        let notice = self.text("#notice").await?;
        ensure!(notice.starts_with("Replayed"), "notice: {notice}");
        let from = self.text("#replayed-from a").await?;
        ensure!(from == id, "the replay names {from}, expected {id}");
        // Shown indented: compared without the whitespace.
        let payload: String = self.text("#payload").await?.split_whitespace().collect();
        ensure!(payload == edited, "the replay's payload: {payload}");
        let new_id = self.text("#message-id").await?;
        ensure!(new_id != id, "the replay has a new id");
        self.goto(&format!("/ui/messages/{id}")).await?;
        let replayed_as = self.text("#replayed-as a").await?;
        ensure!(replayed_as == new_id, "the original names {replayed_as}");
        let status = self.text("#status").await?;
        ensure!(status == "dead", "the original stays dead: {status}");
        let found = self
            .c
            .find_all(Locator::XPath("//button[normalize-space()='Requeue']"))
            .await?;
        ensure!(found.is_empty(), "a replayed message offers a requeue");
        let forms = self.c.find_all(Locator::Css("#edit-replay")).await?;
        ensure!(forms.is_empty(), "a replayed message offers the form again");
        Ok(())
    }

    /// A consumer paused from its row behind the dialog: listed on the pauses
    /// page and marked paused on the consumers page; resumed the same way, the
    /// mark gone.
    async fn pause_and_resume_a_consumer_from_its_row(&self) -> anyhow::Result<()> {
        let row_button = |verb: &str| {
            format!("//tr[th/a[normalize-space()='shipping']]//button[normalize-space()='{verb}']")
        };
        let shipping_row = "//tr[th/a[normalize-space()='shipping']]";
        for (verb, notice, paused) in [("Pause", "paused", true), ("Resume", "resumed", false)] {
            self.goto("/ui/consumers").await?;
            self.c
                .wait()
                .for_element(Locator::XPath(&row_button(verb)))
                .await?
                .click()
                .await?;
            let question = self.text("dialog#confirm h2").await?;
            ensure!(
                question.contains(verb) && question.contains("shipping"),
                "dialog: {question}"
            );
            self.button("Confirm").await?.click().await?;
            let said = self.text("#notice").await?;
            ensure!(said.to_lowercase().contains(notice), "notice: {said}");
            self.goto("/ui/consumers").await?;
            let row = self
                .c
                .wait()
                .for_element(Locator::XPath(shipping_row))
                .await?
                .text()
                .await?;
            ensure!(
                row.contains("paused") == paused,
                "after {verb}, the row reads: {row}"
            );
        }
        Ok(())
    }

    /// The throughput page lists the exchanges; one opens its chart, whose window
    /// tabs redraw it over the day and the week, and whose link leads to its
    /// messages.
    async fn an_exchanges_chart_over_an_hour_a_day_and_a_week(&self) -> anyhow::Result<()> {
        self.goto("/ui/throughput").await?;
        self.c
            .wait()
            .for_element(Locator::XPath(
                "//table[@id='exchanges']//a[normalize-space()='orders']",
            ))
            .await?
            .click()
            .await?;
        let totals = self.text("#chart-totals").await?;
        ensure!(
            totals.contains("published (42)") && totals.contains("failed attempts (5)"),
            "totals: {totals}"
        );
        for (tab, window, said) in [
            (
                "24 h",
                "window=24h",
                "Every 15 minutes over the last 24 hours: 42 published, 5 failed attempts",
            ),
            (
                "7 d",
                "window=7d",
                "Per hour over the last 7 days: 42 published, 5 failed attempts",
            ),
            (
                "1 h",
                "window=1h",
                "Per minute over the last hour: 42 published, 5 failed attempts",
            ),
        ] {
            self.click(&format!("#window-tabs a[data-window='{tab}']"))
                .await?;
            let current = self
                .attr("#window-tabs a[aria-current='true']", "data-window")
                .await?;
            ensure!(current.as_deref() == Some(tab), "current tab: {current:?}");
            let url = self.c.current_url().await?;
            ensure!(url.as_str().contains(window), "{url}");
            let label = self
                .attr("svg.chart", "aria-label")
                .await?
                .unwrap_or_default();
            ensure!(label.contains(said), "{tab}: {label}");
            let bars = self
                .c
                .find_all(Locator::Css("svg.chart rect.published"))
                .await?;
            ensure!(bars.len() == 1, "{tab}: {} bars", bars.len());
        }
        self.click("#rows-link").await?;
        let at = self.path().await?;
        ensure!(at.starts_with("/ui/messages?"), "{at}");
        let exchange = self.attr("#f-exchange", "value").await?;
        ensure!(exchange.as_deref() == Some("orders"), "{exchange:?}");
        Ok(())
    }

    /// A failure group reconsumed from the failures page: the dialog counts its
    /// dead deliveries first, and afterwards the consumer has none dead.
    async fn reconsume_a_failure_group_after_its_count(&self) -> anyhow::Result<()> {
        self.goto("/ui/failures").await?;
        self.c
            .wait()
            .for_element(Locator::XPath(
                "//tr[contains(., 'consumer shipping')]//button[normalize-space()='Reconsume…']",
            ))
            .await?
            .click()
            .await?;
        let text = self.text("#confirm-text").await?;
        ensure!(
            text.contains("2 failing or dead deliveries of consumer shipping"),
            "dialog says: {text}"
        );
        self.button("Confirm").await?.click().await?;
        let notice = self.text("#notice").await?;
        ensure!(notice == "Reconsumed 2.", "notice: {notice}");
        self.goto("/ui/consumers/shipping?status=dead").await?;
        self.wait_for("#actor").await?;
        let rows = self.rows().await?;
        ensure!(rows.is_empty(), "still dead: {rows:?}");
        Ok(())
    }

    /// On a 420 px wide screen the list's filters, the status selector first, stay
    /// within the page (the selector was as wide as its longest status meaning).
    async fn the_filters_fit_a_narrow_screen(&self) -> anyhow::Result<()> {
        let (width, height) = self.c.get_window_size().await?;
        self.c.set_window_size(420, 800).await?;
        let result = async {
            self.goto("/ui/messages").await?;
            self.wait_for("#f-status").await?;
            let overflow = self
                .c
                .execute(
                    "const w = document.documentElement.clientWidth; \
                     return [...document.querySelectorAll('form.filters select, form.filters input')] \
                       .filter(e => e.getBoundingClientRect().right > w + 1).map(e => e.id);",
                    vec![],
                )
                .await?;
            ensure!(
                overflow.as_array().is_some_and(Vec::is_empty),
                "past the right edge at 420 px: {overflow}"
            );
            anyhow::Ok(())
        }
        .await;
        self.c
            .set_window_size(
                u32::try_from(width).unwrap_or(1280),
                u32::try_from(height).unwrap_or(800),
            )
            .await?;
        result
    }

    /// A failing message's page lists its failed attempts, newest first, each
    /// with its number, its time (UTC in the tooltip) and its error.
    async fn a_failing_message_shows_its_attempt_history(&self) -> anyhow::Result<()> {
        self.goto("/ui/messages?status=publish_failed&exchange=flaky")
            .await?;
        let row = self.wait_for("table#results tbody tr").await?;
        row.find(Locator::Css("a")).await?.click().await?;
        self.wait_for("table#attempts").await?;
        let mut seen = Vec::new();
        for tr in self
            .c
            .find_all(Locator::Css("table#attempts tbody tr"))
            .await?
        {
            let cells = tr.find_all(Locator::Css("td")).await?;
            ensure!(cells.len() == 4, "{} cells in an attempt row", cells.len());
            let tooltip = cells[1]
                .find(Locator::Css("time"))
                .await?
                .attr("title")
                .await?
                .unwrap_or_default();
            ensure!(tooltip.ends_with("(UTC)"), "time tooltip: {tooltip}");
            seen.push((cells[0].text().await?, cells[3].text().await?));
        }
        let want: Vec<(String, String)> = (1..=3)
            .rev()
            .map(|n| {
                (
                    format!("Attempt {n} failed"),
                    format!("no route (seeded {n})"),
                )
            })
            .collect();
        ensure!(seen == want, "attempt rows {seen:?}, expected {want:?}");
        Ok(())
    }

    /// The dead tab's count is what its list shows and what the navigation says;
    /// an id is copied with one click (the button says so only once the copy
    /// succeeded).
    async fn status_tabs_count_what_they_list_and_an_id_is_copied(&self) -> anyhow::Result<()> {
        self.goto("/ui/messages").await?;
        let count = self.text("#status-tabs a[data-status=dead] .count").await?;
        let nav = self.text("#nav-dead-messages").await?;
        ensure!(
            nav == format!("dead {count}"),
            "navigation {nav:?}, tab {count}"
        );
        self.click("#status-tabs a[data-status=dead]").await?;
        self.c
            .wait()
            .at_most(WAIT)
            .for_url(&self.url("/ui/messages?status=dead").parse()?)
            .await
            .context("the dead tab leads to the dead list")?;
        let current = self
            .attr("#status-tabs a[aria-current=true]", "data-status")
            .await?;
        ensure!(
            current.as_deref() == Some("dead"),
            "current tab {current:?}"
        );
        let rows = self.rows().await?;
        ensure!(
            rows.len().to_string() == count,
            "{} rows under a tab counting {count}",
            rows.len()
        );
        let button = self.wait_for("table#results tbody tr button.copy").await?;
        let id = button.attr("data-copy").await?.unwrap_or_default();
        ensure!(id.len() == 36, "the whole id is copied: {id:?}");
        button.click().await?;
        let deadline = std::time::Instant::now() + WAIT;
        while button.attr("data-copied").await?.is_none() {
            ensure!(
                std::time::Instant::now() < deadline,
                "the copy button never said copied"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Ok(())
    }

    /// With editing off (the default, the /plain mount), a write session's page of
    /// a dead message has its requeue button and no edit control.
    async fn no_edit_control_while_editing_is_off(&self) -> anyhow::Result<()> {
        self.goto("/plain/login").await?;
        let field = self
            .wait_for("form input[type=password][name=token]")
            .await?;
        field.send_keys(&format!("{WRITE}\u{E007}")).await?;
        self.wait_for("#actor").await?;
        self.goto("/plain/messages?status=dead&exchange=billing")
            .await?;
        let (id, _) = self
            .rows()
            .await?
            .into_iter()
            .next()
            .ok_or_else(|| anyhow!("no dead billing message to look at"))?;
        self.goto(&format!("/plain/messages/{id}")).await?;
        self.wait_for("#message-id").await?;
        let requeue = self
            .c
            .find_all(Locator::XPath("//button[normalize-space()='Requeue']"))
            .await?;
        ensure!(
            !requeue.is_empty(),
            "a write session sees its requeue button"
        );
        let forms = self.c.find_all(Locator::Css("#edit-replay")).await?;
        ensure!(forms.is_empty(), "an edit control while editing is off");
        // Back to /ui, whose session the next scenario ends.
        self.goto("/ui").await?;
        self.wait_for("#actor").await?;
        Ok(())
    }

    /// The server stops and starts again (new process state, the same sessions
    /// table): the open page reloads signed in as before, with its role.
    async fn a_session_survives_a_restart(&self) -> anyhow::Result<()> {
        self.goto("/ui/messages").await?;
        let before = (self.text("#actor").await?, self.text("#role").await?);
        self.dashboard.restart().await?;
        self.c.refresh().await?;
        self.wait_for("table#results").await?;
        let path = self.path().await?;
        ensure!(
            path == "/ui/messages",
            "after the restart the page went to {path}"
        );
        let after = (self.text("#actor").await?, self.text("#role").await?);
        ensure!(
            before == after,
            "signed in as {before:?} before, {after:?} after"
        );
        Ok(())
    }

    async fn logout_ends_the_session(&self) -> anyhow::Result<()> {
        self.logout().await?;
        ensure!(
            self.path().await?.starts_with("/ui/login"),
            "not on the login page"
        );
        self.goto("/ui/messages").await?;
        self.wait_for("input[name=token]").await?;
        let path = self.path().await?;
        // To the login, which returns to the page asked for once signed in.
        ensure!(
            path == "/ui/login?next=%2Fui%2Fmessages",
            "after logout, /ui/messages went to {path}"
        );
        Ok(())
    }

    async fn docs_screenshots(&self, dir: &std::path::Path) -> anyhow::Result<()> {
        self.login(WRITE).await?;
        self.text("#actor").await?;
        std::fs::create_dir_all(dir)?;
        self.goto("/ui").await?;
        self.wait_for("#live").await?;
        std::fs::write(
            dir.join("dashboard-overview.png"),
            self.c.screenshot().await?,
        )?;
        self.goto("/ui/messages?status=dead").await?;
        let first = self.wait_for("table#results tbody tr a").await?;
        first.click().await?;
        self.wait_for("#payload").await?;
        std::fs::write(
            dir.join("dashboard-message.png"),
            self.c.screenshot().await?,
        )?;
        self.goto("/ui/throughput/exchanges/payments?window=24h")
            .await?;
        self.wait_for("svg.chart").await?;
        std::fs::write(
            dir.join("dashboard-throughput.png"),
            self.c.screenshot().await?,
        )?;
        Ok(())
    }
}

async fn run(docs: Option<PathBuf>) -> anyhow::Result<()> {
    let chromium = std::env::var("CHROMIUM").unwrap_or_else(|_| "/usr/bin/chromium".into());
    let chromedriver =
        std::env::var("CHROMEDRIVER").unwrap_or_else(|_| "/usr/bin/chromedriver".into());
    let shots = PathBuf::from(
        std::env::var("UI_SCREENSHOTS").unwrap_or_else(|_| "target/ui-screenshots".into()),
    );
    for (what, path) in [("chromium", &chromium), ("chromedriver", &chromedriver)] {
        ensure!(
            std::path::Path::new(path).exists(),
            "{what} not found at {path}: install Debian's chromium and chromium-driver (`apt-get install -y chromium chromium-driver`; .ci/run does)"
        );
    }
    let (sessions, pool, schema) = session_store().await?;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let address = listener.local_addr()?;
    let base = format!("http://{address}");
    let dashboard = Dashboard {
        address,
        sessions,
        running: tokio::sync::Mutex::new(None),
    };
    dashboard.serve(listener).await?;
    let (_driver, driver_url) = start_chromedriver(&chromedriver).await?;
    let client = browser(&driver_url, &chromium).await?;
    let s = Scenarios {
        c: &client,
        base,
        dashboard: &dashboard,
    };
    let result = async {
        if let Some(dir) = &docs {
            s.docs_screenshots(dir).await.context("docs screenshots")?;
            return Ok(());
        }
        let mut passed = Vec::new();
        macro_rules! scenario {
            ($name:literal, $call:expr) => {{
                let out = $call.await.context($name)?;
                eprintln!("ui-test: ok    {}", $name);
                passed.push($name);
                out
            }};
        }
        scenario!(
            "wrong token shows the form again",
            s.wrong_token_shows_the_form_again()
        );
        scenario!("log in", s.log_in());
        scenario!(
            "a change shows on the overview without a reload",
            s.a_change_shows_on_the_overview_without_a_reload()
        );
        scenario!(
            "a change shows on a list's tabs without a reload",
            s.a_change_shows_on_a_list_without_a_reload()
        );
        scenario!(
            "overview counts match /api/v1/stats",
            s.overview_counts_match_the_api()
        );
        scenario!(
            "a failing message shows its attempt history",
            s.a_failing_message_shows_its_attempt_history()
        );
        let dead = scenario!("filter to dead messages", s.filter_to_dead());
        scenario!(
            "status tabs count what they list; an id is copied with one click",
            s.status_tabs_count_what_they_list_and_an_id_is_copied()
        );
        scenario!(
            "requeue one from its page; it leaves the dead list",
            s.requeue_one_from_its_page(dead)
        );
        scenario!(
            "requeue two ticked rows after a dialog that counts them",
            s.requeue_two_ticked_rows()
        );
        scenario!(
            "every bulk dialog's dry run counts what its list shows",
            s.every_bulk_dialog_counts_what_the_list_shows()
        );
        scenario!(
            "bulk requeue by filter after the dry-run count",
            s.bulk_requeue_after_the_dry_run()
        );
        scenario!(
            "read-only: no write buttons, forged POST refused",
            s.read_only_has_no_write_buttons_and_a_forged_post_is_refused()
        );
        scenario!(
            "POST without the CSRF token refused",
            s.a_post_without_the_csrf_token_is_refused()
        );
        scenario!(
            "the filters fit a 420 px wide screen",
            s.the_filters_fit_a_narrow_screen()
        );
        scenario!(
            "pause and resume a consumer from its row",
            s.pause_and_resume_a_consumer_from_its_row()
        );
        scenario!(
            "an exchange's chart over an hour, a day and a week",
            s.an_exchanges_chart_over_an_hour_a_day_and_a_week()
        );
        scenario!(
            "reconsume a failure group after its dry-run count",
            s.reconsume_a_failure_group_after_its_count()
        );
        // Before the replay: the message looked at is one no replay changed.
        scenario!(
            "no edit control while editing is off",
            s.no_edit_control_while_editing_is_off()
        );
        scenario!(
            "edit and replay a dead message from its page",
            s.edit_and_replay_a_dead_message()
        );
        scenario!(
            "a session survives a restart of the dashboard's server",
            s.a_session_survives_a_restart()
        );
        scenario!("logout ends the session", s.logout_ends_the_session());
        eprintln!("ui-test: {} scenarios passed", passed.len());
        anyhow::Ok(())
    }
    .await;
    if let Err(e) = &result {
        let _ = std::fs::create_dir_all(&shots);
        let file = shots.join("failure.png");
        match client.screenshot().await {
            Ok(png) if std::fs::write(&file, &png).is_ok() => {
                eprintln!(
                    "ui-test: FAILED: {e:#}\nui-test: screenshot: {}",
                    file.display()
                );
            }
            _ => eprintln!("ui-test: FAILED: {e:#} (no screenshot)"),
        }
    }
    let _ = client.close().await;
    let _ = sqlx::query(sqlx::AssertSqlSafe(format!(
        "DROP SCHEMA IF EXISTS {schema} CASCADE"
    )))
    .execute(&pool)
    .await;
    result
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    // No argument: the scenarios, then the scale scenario (`scale`); `--scale`:
    // that one alone.
    let (docs, scenarios, at_scale) = match args.as_slice() {
        [] => (None, true, true),
        [flag] if flag == "--scale" => (None, false, true),
        [flag, dir] if flag == "--docs" => (Some(PathBuf::from(dir)), true, false),
        _ => {
            eprintln!("usage: outbox-ui-browser [--docs DIR | --scale]");
            return std::process::ExitCode::from(2);
        }
    };
    let mut code = std::process::ExitCode::SUCCESS;
    if scenarios && let Err(e) = run(docs).await {
        eprintln!("ui-test: {e:#}");
        code = std::process::ExitCode::FAILURE;
    }
    if at_scale && let Err(e) = scale::run().await {
        eprintln!("ui-scale: {e:#}");
        code = std::process::ExitCode::FAILURE;
    }
    code
}
