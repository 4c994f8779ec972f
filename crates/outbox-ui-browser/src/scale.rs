//! Issue 49's "Done when" scenario at scale: the dashboard over the PostgreSQL
//! stores (as `outbox run` wires them) in a schema of its own, seeded by plain
//! SQL with 300,000 messages (20,000 dead across 50 causes, every dead row's
//! error text its own), a consumer's deliveries, a paused exchange and a paused
//! consumer; then, in headless chromium, the checks one after the other
//! (each reported, all run even when one fails) and the pages' server times,
//! written to `<target>/ui-scale-report.md`.
//!
//! `cargo xtask ui-test` runs it after the other scenarios; `outbox-ui-browser
//! --scale` runs it alone. The schema is dropped at the end, also on failure.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context as _, anyhow, bail, ensure};
use fantoccini::wd::TimeoutConfiguration;
use fantoccini::{Client, Locator};
use outbox_adapters_postgres::{
    PgAuditLog, PgInboxStore, PgLock, PgOutboxStore, PgPauses, PgPool, PgSchema, PgSweepState,
    PgThroughputLog,
};
use outbox_admin::{AdminAuth, AdminPorts, AdminService, AdminToken, Role, Secret, UiOptions};
use outbox_core::failure_group::failure_group;
use outbox_ports::{PauseKind, PauseStore as _};
use serde_json::{Value, json};

const READ: &str = "scale-read-token-0123456789";
const WRITE: &str = "scale-write-token-0123456789";
/// Outbox rows seeded.
const TOTAL: i64 = 300_000;
/// Every 15th row is dead: 20,000.
const DEAD_EVERY: i64 = 15;
/// Distinct causes among the dead, each on one exchange, cause `k` with
/// `204 + 8k` rows (204 to 596; 20,000 in all).
const CAUSES: usize = 50;
const EXCHANGES: [&str; 5] = [
    "orders",
    "billing",
    "shipments",
    "notifications",
    "inventory",
];
const PAUSED_EXCHANGE: &str = "notifications";
/// The consumer with dead and received deliveries (paused), and one without
/// failures.
const CONSUMER: &str = "shipping-worker";
const OTHER_CONSUMER: &str = "ledger";
/// Each cause's own word, so that its group differs from every other's once
/// numbers and quoted values are taken out (letters only: no `<n>`, no `<hex>`).
const WORDS: [&str; CAUSES] = [
    "ledger",
    "payments",
    "invoices",
    "refunds",
    "catalog",
    "pricing",
    "search",
    "reviews",
    "wishlist",
    "coupons",
    "loyalty",
    "gifting",
    "returns",
    "warehouse",
    "picking",
    "packing",
    "courier",
    "tracking",
    "customs",
    "billing",
    "taxes",
    "fraud",
    "identity",
    "sessions",
    "profiles",
    "consent",
    "mailer",
    "sms",
    "push",
    "webhooks",
    "reports",
    "exports",
    "imports",
    "archive",
    "metrics",
    "alerts",
    "scheduler",
    "quotas",
    "licensing",
    "partners",
    "affiliates",
    "marketing",
    "campaigns",
    "surveys",
    "support",
    "tickets",
    "chat",
    "forum",
    "media",
    "thumbnails",
];

/// Cause `k`'s error as a PostgreSQL `format` template: `%1$s` the row number,
/// `%2$s` another number, `%3$s` 32 hexadecimal digits, `%4$s` a UUID; every
/// row's text differs, its group does not.
fn template(k: usize) -> String {
    let w = WORDS[k];
    match k % 10 {
        0 => format!(
            "{w}: PRECONDITION_FAILED - message size 13%1$s is larger than configured max size (131072) on queue \"q-%2$s\""
        ),
        1 => format!("{w}: NOT_FOUND - no exchange \"{w}.events.%2$s\" in vhost \"/\""),
        2 => format!(
            "{w}: ACCESS_REFUSED - write access to exchange \"x-%2$s\" in vhost \"v-%1$s\" refused for user \"svc-%2$s\""
        ),
        3 => format!("{w}: connection reset by peer (os error 104) after %2$s ms on channel %1$s"),
        4 => format!("{w}: publish confirm timed out after %2$s ms (delivery tag %1$s)"),
        5 => format!(
            "{w}: channel closed: RESOURCE_LOCKED - cannot obtain exclusive access to locked queue 'lock-%1$s'"
        ),
        6 => format!("{w}: basic.return NO_ROUTE for routing key \"rk.%2$s\" (message %4$s)"),
        7 => format!("{w}: frame too large: %1$s bytes exceeds frame_max %2$s"),
        8 => format!("{w}: payload checksum 0x%3$s does not match the header's, trace %3$s"),
        _ => format!("{w}: broker nack for publish seq %1$s, correlation 'corr-%2$s'"),
    }
}

fn cause_rows(k: usize) -> i32 {
    204 + 8 * i32::try_from(k).unwrap_or(0)
}

/// `n` with a comma between each group of three digits, as the dashboard
/// writes counts.
fn thousands(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, d) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(d);
    }
    out
}

/// `path` for the report: a group's text in `error=` as `<group>`, a
/// message's id as `<id>`.
fn shown_path(path: &str) -> String {
    if let Some(id) = path.strip_prefix("/ui/messages/")
        && id.len() == 36
    {
        return "/ui/messages/<id>".to_owned();
    }
    match path.split_once("error=") {
        Some((head, tail)) => {
            let rest = tail
                .split_once('&')
                .map_or(String::new(), |(_, r)| format!("&{r}"));
            format!("{head}error=<group>{rest}")
        }
        None => path.to_owned(),
    }
}

type Http = hyper_util::client::legacy::Client<
    hyper_util::client::legacy::connect::HttpConnector,
    axum::body::Body,
>;

/// One request on a kept-alive loopback connection: (status, body).
async fn request(
    http: &Http,
    method: &str,
    url: &str,
    headers: &[(&str, &str)],
    body: Option<String>,
) -> anyhow::Result<(u16, String)> {
    let mut builder = axum::http::Request::builder().method(method).uri(url);
    for (name, value) in headers {
        builder = builder.header(*name, *value);
    }
    let request =
        builder.body(body.map_or_else(axum::body::Body::empty, axum::body::Body::from))?;
    let response = http
        .request(request)
        .await
        .with_context(|| format!("{method} {url}"))?;
    let status = response.status().as_u16();
    let bytes = axum::body::to_bytes(axum::body::Body::new(response.into_body()), 64 << 20)
        .await
        .with_context(|| format!("{method} {url}: the body"))?;
    Ok((status, String::from_utf8_lossy(&bytes).into_owned()))
}

/// The seeded database: what the checks compare the pages with.
struct Seeded {
    pool: PgPool,
    /// The schema, quoted for SQL.
    s: String,
    total: u64,
    dead: u64,
    /// Per failure group (`exchange X` or `consumer C`, the group's text): how
    /// many failing or dead rows the seed put in it.
    groups: BTreeMap<(String, String), u64>,
    /// The groups of the 50 dead causes (a subset of `groups`).
    dead_causes: BTreeSet<(String, String)>,
    paused_pending: u64,
}

/// Every row, in one statement each (the error groups of rows with a last
/// error are computed by the database's trigger, as for any row written by
/// plain SQL).
async fn seed(pool: &PgPool, s: &str) -> anyhow::Result<()> {
    let ks: Vec<i32> = (0..CAUSES).map(|k| i32::try_from(k).unwrap_or(0)).collect();
    let cause_exchanges: Vec<String> = (0..CAUSES)
        .map(|k| EXCHANGES[k % EXCHANGES.len()].to_owned())
        .collect();
    let ns: Vec<i32> = (0..CAUSES).map(cause_rows).collect();
    let templates: Vec<String> = (0..CAUSES).map(template).collect();
    let exchanges: Vec<String> = EXCHANGES.iter().map(|e| (*e).to_owned()).collect();
    let dead_total: i32 = ns.iter().sum();
    ensure!(
        i64::from(dead_total) == TOTAL / DEAD_EVERY,
        "the causes' rows add up to {dead_total}, not {}",
        TOTAL / DEAD_EVERY
    );
    // Dead row d (1..20,000) takes slot (d * 7919) mod 20,000 (a permutation:
    // the causes interleave in time), the causes' slot ranges laid end to end.
    // Ids are UUIDv7 from each row's time, as the library makes them: rows made
    // within a minute share their first 8 characters.
    let sql = format!(
        "WITH causes AS (
            SELECT c.k, c.exchange, c.n, c.template,
                   (sum(c.n) OVER (ORDER BY c.k) - c.n)::int AS start
              FROM unnest($1::int[], $2::text[], $3::int[], $4::text[]) AS c(k, exchange, n, template)
         ), base AS (
            SELECT i,
                   now() - ({TOTAL} - i) * interval '2 seconds' AS at,
                   md5(i::text || '-ui-scale') AS h,
                   CASE WHEN i % {DEAD_EVERY} = 0 THEN 'dead'
                        WHEN i % 500 = 11 THEN 'publish_failed'
                        WHEN i % 200 = 3 THEN 'pending'
                        ELSE 'sent' END AS status,
                   CASE WHEN i % {DEAD_EVERY} = 0 THEN ((i / {DEAD_EVERY}) * 7919) % {dead_total} END AS slot,
                   CASE WHEN i % {DEAD_EVERY} <> 0 AND i % 1000 = 500 THEN (i / 1000) % {CAUSES} END AS sent_cause
              FROM generate_series(1, {TOTAL}) AS i
         ), rows AS (
            SELECT b.*,
                   CASE WHEN b.slot IS NOT NULL OR b.sent_cause IS NOT NULL THEN
                     (SELECT c.k FROM causes c
                       WHERE (b.slot >= c.start AND b.slot < c.start + c.n) OR b.sent_cause = c.k)
                   END AS k
              FROM base b
         ), described AS (
            SELECT r.i, r.at, r.h, r.status, r.k,
                   coalesce(c.exchange, ($5::text[])[(r.i / 7) % 5 + 1]) AS exchange,
                   CASE WHEN c.k IS NOT NULL
                          THEN format(c.template, r.i, (r.i * 37) % 100000, r.h, gen_random_uuid())
                        WHEN r.status = 'publish_failed'
                          THEN format('connection refused (os error 111) on attempt %s, broker \"rabbit-%s\"', 2, r.i % 3)
                   END AS err
              FROM rows r LEFT JOIN causes c ON c.k = r.k
         )
         INSERT INTO {s}.outbox_messages
            (id, exchange, routing_key, message_type, headers, payload, source, created_at,
             status, attempts, last_attempt_at, next_attempt_at, last_error, sent_at)
         SELECT (lpad(to_hex((extract(epoch FROM d.at) * 1000)::bigint), 12, '0') || '7'
                 || substr(d.h, 1, 3) || '8' || substr(d.h, 4, 15))::uuid,
                d.exchange, d.exchange || '.created', 'event.v1',
                CASE WHEN d.k IS NOT NULL THEN jsonb_build_object('seed-cause', d.k::text)
                     WHEN d.status = 'publish_failed' THEN jsonb_build_object('seed-cause', 'refused')
                     ELSE '{{}}'::jsonb END,
                convert_to(format('{{\"order_id\":%s,\"customer\":\"c-%s\",\"total\":%s}}',
                                  d.i, d.i % 977, (d.i * 13) % 10000), 'UTF8'),
                'ui-scale', d.at, d.status,
                CASE d.status WHEN 'dead' THEN 5 WHEN 'publish_failed' THEN 2 WHEN 'pending' THEN 0
                     ELSE CASE WHEN d.err IS NULL THEN 1 ELSE 3 END END,
                CASE WHEN d.err IS NOT NULL THEN d.at + interval '5 seconds' END,
                CASE WHEN d.status = 'publish_failed' THEN now() + interval '1 hour' END,
                d.err,
                CASE WHEN d.status = 'sent' THEN d.at + interval '1 second' END
           FROM described d ORDER BY d.i"
    );
    sqlx::query(sqlx::AssertSqlSafe(sql))
        .bind(&ks)
        .bind(&cause_exchanges)
        .bind(&ns)
        .bind(&templates)
        .bind(&exchanges)
        .execute(pool)
        .await
        .context("seeding the outbox")?;
    // Deliveries of every 100th sent message: dead ones (every 7th) of two
    // causes, some received (every 11th, waiting), the rest consumed; a second
    // consumer consumed all.
    let sql = format!(
        "INSERT INTO {s}.outbox_inbox
            (consumer, message_id, exchange, routing_key, message_type, headers, payload,
             created_at, received_at, status, attempts, last_attempt_at, last_error, consumed_at)
         SELECT '{CONSUMER}', m.id, m.exchange, m.routing_key, m.message_type,
                CASE WHEN m.st = 'dead' THEN jsonb_build_object('seed-cause',
                     CASE WHEN m.r % 14 = 0 THEN 'inbox-a' ELSE 'inbox-b' END)
                     ELSE '{{}}'::jsonb END,
                m.payload, m.created_at, m.sent_at + interval '1 second', m.st,
                CASE m.st WHEN 'dead' THEN 5 WHEN 'received' THEN 0 ELSE 1 END,
                CASE WHEN m.st = 'dead' THEN m.sent_at + interval '9 seconds' END,
                CASE WHEN m.st <> 'dead' THEN NULL
                     WHEN m.r % 14 = 0
                       THEN format('handler failed: order %s not found in warehouse ''w-%s''', m.seq, m.seq % 17)
                     ELSE format('timeout after %s ms calling \"inventory-api\" (attempt %s)', 3000 + m.seq % 1000, 5)
                END,
                CASE WHEN m.st = 'consumed' THEN m.sent_at + interval '2 seconds' END
           FROM (SELECT o.*, CASE WHEN o.r % 7 = 0 THEN 'dead'
                                  WHEN o.r % 11 = 0 THEN 'received'
                                  ELSE 'consumed' END AS st
                   FROM (SELECT x.*, row_number() OVER (ORDER BY x.seq) AS r
                           FROM {s}.outbox_messages x
                          WHERE x.status = 'sent' AND x.seq % 100 = 0) o) m
          ORDER BY m.seq"
    );
    sqlx::query(sqlx::AssertSqlSafe(sql))
        .execute(pool)
        .await
        .context("seeding the inbox")?;
    let sql = format!(
        "INSERT INTO {s}.outbox_inbox
            (consumer, message_id, exchange, routing_key, message_type, payload, created_at,
             received_at, status, attempts, consumed_at)
         SELECT '{OTHER_CONSUMER}', o.id, o.exchange, o.routing_key, o.message_type, o.payload,
                o.created_at, o.sent_at + interval '1 second', 'consumed', 1,
                o.sent_at + interval '2 seconds'
           FROM {s}.outbox_messages o
          WHERE o.status = 'sent' AND o.seq % 100 = 50
          ORDER BY o.seq"
    );
    sqlx::query(sqlx::AssertSqlSafe(sql))
        .execute(pool)
        .await
        .context("seeding the second consumer")?;
    let sql = format!(
        "INSERT INTO {s}.outbox_audit (actor, action, target, count, at)
         SELECT 'ops', CASE WHEN i % 3 = 0 THEN 'delete' ELSE 'requeue' END,
                'messages status=dead exchange=' || ($1::text[])[i % 5 + 1], i % 40 + 1,
                now() - i * interval '17 minutes'
           FROM generate_series(1, 200) AS i ORDER BY i DESC"
    );
    sqlx::query(sqlx::AssertSqlSafe(sql))
        .bind(&exchanges)
        .execute(pool)
        .await
        .context("seeding the audit log")?;
    for table in ["outbox_messages", "outbox_inbox", "outbox_audit"] {
        sqlx::query(sqlx::AssertSqlSafe(format!("VACUUM (ANALYZE) {s}.{table}")))
            .execute(pool)
            .await
            .with_context(|| format!("vacuuming {table}"))?;
    }
    Ok(())
}

/// A seeded cause's rows in a table: its place (exchange or consumer), the
/// cause, how many, its least and greatest text, the groups the database made of
/// them, and whether all are dead.
type CauseRow = (
    String,
    Option<String>,
    i64,
    String,
    String,
    i64,
    Option<bool>,
);

/// What the seed holds, counted back by SQL per seeded cause (not by the
/// stored group): the numbers the pages must show.
async fn counted(pool: &PgPool, s: &str) -> anyhow::Result<Seeded> {
    let count = |sql: String| async move {
        let n: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(sql))
            .fetch_one(pool)
            .await?;
        anyhow::Ok(u64::try_from(n)?)
    };
    let total = count(format!("SELECT count(*) FROM {s}.outbox_messages")).await?;
    let dead = count(format!(
        "SELECT count(*) FROM {s}.outbox_messages WHERE status = 'dead'"
    ))
    .await?;
    let paused_pending = count(format!(
        "SELECT count(*) FROM {s}.outbox_messages WHERE status = 'pending' AND exchange = '{PAUSED_EXCHANGE}'"
    ))
    .await?;
    let mut groups = BTreeMap::new();
    let mut dead_causes = BTreeSet::new();
    // Per seeded cause: its rows' count, two of its texts, and how many groups
    // the database's function made of them (1, or the seed is wrong).
    for (table, place, statuses) in [
        ("outbox_messages", "exchange", "('publish_failed', 'dead')"),
        ("outbox_inbox", "consumer", "('consume_failed', 'dead')"),
    ] {
        let rows: Vec<CauseRow> = sqlx::query_as(sqlx::AssertSqlSafe(format!(
            "SELECT {place}, headers->>'seed-cause', count(*), min(last_error), max(last_error),
                        count(DISTINCT error_group), bool_and(status = 'dead')
                   FROM {s}.{table} WHERE status IN {statuses} GROUP BY 1, 2"
        )))
        .fetch_all(pool)
        .await?;
        for (name, cause, n, first, last, stored_groups, all_dead) in rows {
            let cause = cause.unwrap_or_default();
            let group = failure_group(&first);
            ensure!(
                failure_group(&last) == group,
                "seeding: cause {cause} of {place} {name} has texts of two groups: {first:?}, {last:?}"
            );
            ensure!(
                stored_groups == 1,
                "the database's trigger put cause {cause} of {place} {name} ({n} rows) in {stored_groups} error groups"
            );
            let key = (format!("{place} {name}"), group);
            ensure!(
                !groups.contains_key(&key),
                "seeding: two causes share the group {key:?}"
            );
            if place == "exchange" && all_dead == Some(true) {
                dead_causes.insert(key.clone());
            }
            groups.insert(key, u64::try_from(n)?);
        }
    }
    ensure!(
        dead_causes.len() == CAUSES,
        "seeding: {} dead causes, expected {CAUSES}",
        dead_causes.len()
    );
    let of_consumer = groups
        .keys()
        .filter(|(p, _)| p.starts_with("consumer "))
        .count();
    ensure!(
        of_consumer == 2,
        "seeding: {of_consumer} groups of {CONSUMER}, expected 2"
    );
    ensure!(
        paused_pending > 0,
        "seeding: nothing pending on {PAUSED_EXCHANGE}"
    );
    Ok(Seeded {
        pool: pool.clone(),
        s: s.to_owned(),
        total,
        dead,
        groups,
        dead_causes,
        paused_pending,
    })
}

/// The dashboard and the API over the PostgreSQL stores of `schema`, as `outbox
/// run` serves them (sessions in PostgreSQL, charts from the per-minute totals).
fn app(
    pool: &PgPool,
    schema: &PgSchema,
    shutdown: tokio::sync::watch::Receiver<bool>,
) -> anyhow::Result<axum::Router> {
    let outbox = Arc::new(PgOutboxStore::new(pool.clone(), schema.clone()));
    let inbox = Arc::new(PgInboxStore::new(pool.clone(), schema));
    let service = AdminService::new(AdminPorts {
        outbox: outbox.clone(),
        inbox,
        audit: Arc::new(PgAuditLog::new(pool.clone(), schema)),
        pauses: Arc::new(PgPauses::new(pool.clone(), schema)),
        outbox_store: outbox,
    })
    .with_throughput(Arc::new(PgThroughputLog::new(pool.clone(), schema)))
    .with_sweep_reports(
        Arc::new(PgSweepState::new(pool.clone(), schema)),
        vec!["outbox.publish-retry.last-state".into()],
    )
    .with_locks(
        Arc::new(PgLock::new(pool.clone(), schema, "ui-scale")),
        vec!["outbox.publish-retry.run-lock".into()],
    );
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
    let sessions = outbox_adapters_postgres::ui_sessions(pool.clone(), schema)?;
    Ok(axum::Router::new()
        .nest(
            "/ui",
            outbox_admin::ui_router(
                service.clone(),
                auth.clone(),
                UiOptions {
                    session_store: Some(Arc::new(sessions)),
                    shutdown: Some(shutdown),
                    ..UiOptions::default()
                },
            ),
        )
        .nest("/api/v1", outbox_admin::router(service, auth)))
}

/// Where the report goes: beside the screenshots' directory (`<target>/`).
fn report_path() -> PathBuf {
    if let Ok(path) = std::env::var("UI_SCALE_REPORT") {
        return PathBuf::from(path);
    }
    let shots = PathBuf::from(
        std::env::var("UI_SCREENSHOTS").unwrap_or_else(|_| "target/ui-screenshots".into()),
    );
    shots
        .parent()
        .map_or_else(|| PathBuf::from("target"), PathBuf::from)
        .join("ui-scale-report.md")
}

/// Runs the scenario: its own schema, server, chromedriver and browser.
pub(crate) async fn run() -> anyhow::Result<()> {
    let chromium = std::env::var("CHROMIUM").unwrap_or_else(|_| "/usr/bin/chromium".into());
    let chromedriver =
        std::env::var("CHROMEDRIVER").unwrap_or_else(|_| "/usr/bin/chromedriver".into());
    let url = std::env::var("OUTBOX_TEST_DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into());
    let pool = outbox_adapters_postgres::connect(&url, 8, Duration::from_secs(5))
        .await
        .with_context(|| {
            format!("the scale scenario needs PostgreSQL at {url} (OUTBOX_TEST_DATABASE_URL)")
        })?;
    let name = format!("obui_scale_{}", std::process::id());
    let schema = PgSchema::new(&name)?;
    let result = in_schema(&pool, &schema, &chromium, &chromedriver).await;
    let dropped = sqlx::query(sqlx::AssertSqlSafe(format!(
        "DROP SCHEMA IF EXISTS {} CASCADE",
        schema.quoted()
    )))
    .execute(&pool)
    .await;
    if let Err(e) = dropped {
        eprintln!("ui-scale: could not drop schema {name}: {e}");
    }
    result
}

async fn in_schema(
    pool: &PgPool,
    schema: &PgSchema,
    chromium: &str,
    chromedriver: &str,
) -> anyhow::Result<()> {
    let started = Instant::now();
    outbox_adapters_postgres::migrate(pool, schema).await?;
    let s = schema.quoted();
    seed(pool, &s).await?;
    let seeded = counted(pool, &s).await?;
    let pauses = PgPauses::new(pool.clone(), schema);
    pauses
        .pause(PauseKind::Exchange, PAUSED_EXCHANGE, "ui-scale")
        .await?;
    pauses
        .pause(PauseKind::Consumer, CONSUMER, "ui-scale")
        .await?;
    eprintln!(
        "ui-scale: seeded {} messages ({} dead in {} causes, {} groups in all) in {:.1} s",
        thousands(seeded.total),
        thousands(seeded.dead),
        seeded.dead_causes.len(),
        seeded.groups.len(),
        started.elapsed().as_secs_f64()
    );
    let (stop, shutdown) = tokio::sync::watch::channel(false);
    let app = app(pool, schema, shutdown.clone())?;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let base = format!("http://{}", listener.local_addr()?);
    let mut until = shutdown;
    let server = tokio::spawn(async move {
        let _ = axum::serve(listener, app)
            .with_graceful_shutdown(async move {
                let _ = until.wait_for(|stop| *stop).await;
            })
            .await;
    });
    let (_driver, driver_url) = super::start_chromedriver(chromedriver).await?;
    let client = super::browser(&driver_url, chromium).await?;
    let http: Http =
        hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
            .build_http();
    let scale = Scale {
        c: &client,
        base,
        http,
        seeded,
        cookie: String::new(),
    };
    let result = scale.checks().await;
    let _ = client.close().await;
    let _ = stop.send(true);
    let _ = tokio::time::timeout(Duration::from_secs(10), server).await;
    eprintln!("ui-scale: done in {:.1} s", started.elapsed().as_secs_f64());
    result
}

struct Scale<'a> {
    c: &'a Client,
    base: String,
    http: Http,
    seeded: Seeded,
    /// The browser's session cookies, for the timed requests.
    cookie: String,
}

/// How long a check may take before it counts as failed.
const CHECK_LIMIT: Duration = Duration::from_secs(120);
const WAIT: Duration = Duration::from_secs(10);

impl Scale<'_> {
    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    async fn goto(&self, path: &str) -> anyhow::Result<()> {
        self.c
            .goto(&self.url(path))
            .await
            .with_context(|| format!("opening {path}"))
    }

    async fn path(&self) -> String {
        match self.c.current_url().await {
            Ok(url) => match url.query() {
                Some(q) => format!("{}?{q}", url.path()),
                None => url.path().to_owned(),
            },
            Err(e) => format!("<no url: {e}>"),
        }
    }

    /// The first element `css` finds, looked for again until `wait` runs out.
    async fn wait_for_within(
        &self,
        css: &str,
        wait: Duration,
    ) -> anyhow::Result<fantoccini::elements::Element> {
        let deadline = Instant::now() + wait;
        loop {
            match self.c.find(Locator::Css(css)).await {
                Ok(found) => return Ok(found),
                Err(e) if Instant::now() >= deadline => {
                    let at = self.path().await;
                    return Err(anyhow!(e).context(format!("no `{css}` on {at}")));
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
            }
        }
    }

    async fn wait_for(&self, css: &str) -> anyhow::Result<fantoccini::elements::Element> {
        self.wait_for_within(css, WAIT).await
    }

    /// The text of the first element `css` finds, read again while a live
    /// update swaps the element out under the read.
    async fn text(&self, css: &str) -> anyhow::Result<String> {
        let deadline = Instant::now() + WAIT;
        loop {
            match self.wait_for(css).await?.text().await {
                Ok(text) => return Ok(text.trim().to_owned()),
                Err(e) if Instant::now() >= deadline => return Err(e.into()),
                Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
            }
        }
    }

    async fn click_button(&self, label: &str) -> anyhow::Result<()> {
        let xpath = format!("//button[normalize-space()='{label}']");
        let deadline = Instant::now() + WAIT;
        loop {
            match self.c.find(Locator::XPath(&xpath)).await {
                Ok(button) => {
                    button.click().await?;
                    return Ok(());
                }
                Err(e) if Instant::now() >= deadline => {
                    let at = self.path().await;
                    return Err(anyhow!(e).context(format!("no button `{label}` on {at}")));
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
            }
        }
    }

    async fn js(&self, script: &str, args: Vec<Value>) -> anyhow::Result<Value> {
        Ok(self.c.execute(script, args).await?)
    }

    async fn api(&self, method: &str, path: &str, body: Option<Value>) -> anyhow::Result<Value> {
        let token = format!("Bearer {}", if method == "GET" { READ } else { WRITE });
        let mut headers = vec![("authorization", token.as_str())];
        if body.is_some() {
            headers.push(("content-type", "application/json"));
        }
        let (status, text) = request(
            &self.http,
            method,
            &self.url(path),
            &headers,
            body.map(|b| b.to_string()),
        )
        .await?;
        ensure!(
            status == 200,
            "{method} {path}: status {status}: {}",
            text.chars().take(300).collect::<String>()
        );
        serde_json::from_str(&text).with_context(|| format!("{method} {path}: not JSON"))
    }

    async fn checks(mut self) -> anyhow::Result<()> {
        self.log_in().await.context("log in")?;
        let shots = PathBuf::from(
            std::env::var("UI_SCREENSHOTS").unwrap_or_else(|_| "target/ui-screenshots".into()),
        );
        let mut failed: Vec<String> = Vec::new();
        let mut timings = None;
        // The browser checks first; the timings with no page open (no live
        // stream polling meanwhile); the tabs last (they may leave loads hanging).
        for n in [1, 2, 3, 4, 6, 7, 8, 5] {
            let name = match n {
                1 => "every cause is a failure group with its exact count (page and API)",
                2 => "bulk dry runs count the true number (dialogs and API)",
                3 => "the short ids of a page differ",
                4 => "the paused exchange and consumer show on the overview and in the nav",
                5 => "eight tabs all render",
                6 => "a failure group's members list holds only that cause",
                7 => "every page fits 390 px and its actions are reachable",
                _ => "page timings at this scale",
            };
            let run = async {
                match n {
                    1 => self.failure_groups_are_exact().await,
                    2 => self.dry_runs_count_the_true_number().await,
                    3 => self.short_ids_differ().await,
                    4 => self.pauses_show_on_the_overview().await,
                    5 => self.eight_tabs_render().await,
                    6 => self.members_hold_only_their_cause().await,
                    7 => self.pages_fit_a_phone().await,
                    _ => {
                        timings = Some(self.timings().await?);
                        Ok(())
                    }
                }
            };
            let outcome = match tokio::time::timeout(CHECK_LIMIT, run).await {
                Ok(outcome) => outcome,
                Err(_) => Err(anyhow!("took longer than {} s", CHECK_LIMIT.as_secs())),
            };
            match outcome {
                Ok(()) => eprintln!("ui-scale: ok    {n}. {name}"),
                Err(e) => {
                    let _ = std::fs::create_dir_all(&shots);
                    let file = shots.join(format!("scale-{n}.png"));
                    let shot = match self.c.screenshot().await {
                        Ok(png) if std::fs::write(&file, &png).is_ok() => {
                            format!(" (screenshot: {})", file.display())
                        }
                        _ => String::new(),
                    };
                    eprintln!("ui-scale: FAIL  {n}. {name}: {e:#}{shot}");
                    failed.push(format!("{n}. {name}"));
                }
            }
            if n == 4 {
                // The cookie the timed requests send (after the overview's
                // check, signed in and on a page of the mount point).
                self.cookie = self.session_cookie().await?;
            }
        }
        if let Some(report) = timings {
            let path = report_path();
            if let Some(dir) = path.parent() {
                let _ = std::fs::create_dir_all(dir);
            }
            match std::fs::write(&path, &report) {
                Ok(()) => eprintln!("ui-scale: timings written to {}", path.display()),
                Err(e) => eprintln!("ui-scale: cannot write {}: {e}", path.display()),
            }
        }
        if failed.is_empty() {
            eprintln!("ui-scale: all 8 checks passed");
            Ok(())
        } else {
            bail!(
                "{} of 8 scale checks failed: {}",
                failed.len(),
                failed.join("; ")
            )
        }
    }

    async fn log_in(&self) -> anyhow::Result<()> {
        self.goto("/ui/login").await?;
        let field = self
            .wait_for("form input[type=password][name=token]")
            .await?;
        field.send_keys(&format!("{WRITE}\u{E007}")).await?;
        let actor = self.text("#actor").await?;
        ensure!(actor == "ops", "signed in as {actor}");
        Ok(())
    }

    async fn session_cookie(&self) -> anyhow::Result<String> {
        self.goto("/ui/pauses").await?;
        self.wait_for("#actor").await?;
        let cookies = self.c.get_all_cookies().await?;
        ensure!(!cookies.is_empty(), "no cookie after signing in");
        Ok(cookies
            .iter()
            .map(|c| format!("{}={}", c.name(), c.value()))
            .collect::<Vec<_>>()
            .join("; "))
    }

    /// The failures page's groups: (place, group text) -> count, from each row's
    /// count cell and its members link (`error=<group>`, and the exchange or the
    /// consumer it lists).
    async fn failures_page_groups(
        &self,
    ) -> anyhow::Result<(BTreeMap<(String, String), u64>, Vec<Value>)> {
        self.goto("/ui/failures").await?;
        self.wait_for("table#results").await?;
        let rows = self
            .js(
                "return [...document.querySelectorAll('table#results tbody tr')].map(tr => {
                   const a = tr.querySelector('a.members');
                   const num = tr.querySelector('td.num');
                   if (!a) return {error: 'no a.members in ' + tr.innerText};
                   const u = new URL(a.href);
                   const m = u.pathname.match(/\\/consumers\\/([^/]+)$/);
                   return {
                     href: u.pathname + u.search,
                     count: num ? num.textContent.trim() : null,
                     group: u.searchParams.get('error'),
                     place: m ? 'consumer ' + decodeURIComponent(m[1])
                              : 'exchange ' + (u.searchParams.get('exchange') || ''),
                   };
                 });",
                vec![],
            )
            .await?;
        let rows = rows.as_array().cloned().unwrap_or_default();
        let mut groups = BTreeMap::new();
        for row in &rows {
            if let Some(e) = row["error"].as_str() {
                bail!("{e}");
            }
            let count = row["count"].as_str().unwrap_or_default();
            let n: u64 = count
                .replace(',', "")
                .parse()
                .with_context(|| format!("a group's count reads {count:?}: {row}"))?;
            let key = (
                row["place"].as_str().unwrap_or_default().to_owned(),
                row["group"].as_str().unwrap_or_default().to_owned(),
            );
            if groups.insert(key.clone(), n).is_some() {
                bail!("the group {key:?} is listed twice");
            }
        }
        Ok((groups, rows))
    }

    /// Compares the groups shown with the seeded ones: every seeded group with
    /// its count, none else.
    fn compare_groups(
        &self,
        what: &str,
        shown: &BTreeMap<(String, String), u64>,
    ) -> anyhow::Result<()> {
        let want = &self.seeded.groups;
        let mut wrong = Vec::new();
        for (key, n) in want {
            match shown.get(key) {
                None => wrong.push(format!(
                    "missing: {} {:?} ({n}){}",
                    key.0,
                    key.1,
                    if self.seeded.dead_causes.contains(key) {
                        ", a dead cause"
                    } else {
                        ""
                    }
                )),
                Some(m) if m != n => {
                    wrong.push(format!("{} {:?}: shows {m}, seeded {n}", key.0, key.1));
                }
                Some(_) => {}
            }
        }
        for (key, m) in shown {
            if !want.contains_key(key) {
                wrong.push(format!("not seeded: {} {:?} ({m})", key.0, key.1));
            }
        }
        let dead_shown = self
            .seeded
            .dead_causes
            .iter()
            .filter(|k| shown.get(*k) == want.get(*k))
            .count();
        ensure!(
            wrong.is_empty(),
            "{what}: {dead_shown} of the {CAUSES} dead causes right; {} differences: {}",
            wrong.len(),
            wrong
                .iter()
                .take(12)
                .cloned()
                .collect::<Vec<_>>()
                .join("; ")
        );
        Ok(())
    }

    /// Check 1: every cause a group with its exact count, on the page and in the API.
    async fn failure_groups_are_exact(&self) -> anyhow::Result<()> {
        let (shown, _) = self.failures_page_groups().await?;
        self.compare_groups("the Failures page", &shown)?;
        let api = self.api("GET", "/api/v1/failures", None).await?;
        ensure!(
            api.get("capped").is_none_or(|c| c == &json!(false)),
            "/api/v1/failures says its counts are capped: {}",
            api["capped"]
        );
        let mut from_api = BTreeMap::new();
        for g in api["groups"].as_array().cloned().unwrap_or_default() {
            let place = match (g["exchange"].as_str(), g["consumer"].as_str()) {
                (Some(x), _) => format!("exchange {x}"),
                (None, Some(c)) => format!("consumer {c}"),
                (None, None) => String::new(),
            };
            let key = (place, g["error"].as_str().unwrap_or_default().to_owned());
            from_api.insert(key, g["count"].as_u64().unwrap_or(u64::MAX));
        }
        self.compare_groups("GET /api/v1/failures", &from_api)
    }

    /// The number a bulk dialog's dry run says (`Dry run: 20,000 messages ...`).
    async fn dialog_count(&self, page: &str, button: &str) -> anyhow::Result<(u64, String)> {
        self.goto(page).await?;
        self.wait_for("table#results").await?;
        self.click_button(button).await?;
        let text = self.text("#confirm-text").await?;
        let after = text
            .split_once("Dry run:")
            .map(|(_, rest)| rest.trim_start())
            .ok_or_else(|| anyhow!("{page}, {button}: no dry run in the dialog: {text}"))?;
        let digits: String = after
            .chars()
            .take_while(|c| c.is_ascii_digit() || *c == ',')
            .collect();
        let n = digits
            .replace(',', "")
            .parse()
            .with_context(|| format!("{page}, {button}: no number after `Dry run:`: {text}"))?;
        Ok((n, text))
    }

    /// Check 2: the dialogs' and the API's dry runs say the true number.
    async fn dry_runs_count_the_true_number(&self) -> anyhow::Result<()> {
        let (dead, total) = (self.seeded.dead, self.seeded.total);
        let (n, text) = self
            .dialog_count("/ui/messages?status=dead", "Requeue all matching…")
            .await?;
        ensure!(
            n == dead && text.contains(&format!("{} messages", thousands(dead))),
            "requeue of the dead: {} dead, the dialog says: {text}",
            thousands(dead)
        );
        let (n, text) = self
            .dialog_count("/ui/messages", "Delete all matching…")
            .await?;
        ensure!(
            n == total && text.contains(&format!("{} messages", thousands(total))),
            "delete without a filter: {} messages, the dialog says: {text}",
            thousands(total)
        );
        let api = self
            .api(
                "POST",
                "/api/v1/messages/delete",
                Some(json!({"filter": {}, "dry_run": true})),
            )
            .await?;
        ensure!(
            api["matched"].as_u64() == Some(total) && api["changed"].as_u64() == Some(0),
            "POST /api/v1/messages/delete dry run: {api}, {total} messages"
        );
        let api = self
            .api(
                "POST",
                "/api/v1/messages/requeue",
                Some(json!({"filter": {"status": "dead"}, "dry_run": true})),
            )
            .await?;
        ensure!(
            api["matched"].as_u64() == Some(dead) && api["changed"].as_u64() == Some(0),
            "POST /api/v1/messages/requeue dry run of the dead: {api}, {dead} dead"
        );
        Ok(())
    }

    /// Check 3: the ids shown on the first page of messages differ (the seeded ids are
    /// UUIDv7: their first 8 characters are alike).
    async fn short_ids_differ(&self) -> anyhow::Result<()> {
        self.goto("/ui/messages").await?;
        self.wait_for("table#results tbody tr").await?;
        let rows = self
            .js(
                "return [...document.querySelectorAll('table#results tbody tr')].map(tr => {
                   const id = tr.getAttribute('data-id') || '';
                   const a = [...tr.querySelectorAll('a')].find(a => a.href.endsWith('/' + id));
                   return [id, a ? a.textContent.trim() : null];
                 });",
                vec![],
            )
            .await?;
        let rows: Vec<(String, Option<String>)> = serde_json::from_value(rows)?;
        ensure!(
            rows.len() >= 20,
            "only {} rows on the first page",
            rows.len()
        );
        let mut shown = BTreeSet::new();
        let mut prefixes = BTreeSet::new();
        for (id, text) in &rows {
            let text = text
                .clone()
                .ok_or_else(|| anyhow!("row {id} has no link to its page"))?;
            let bare = text.trim_start_matches('…');
            ensure!(
                !bare.is_empty() && id.contains(bare),
                "row {id} shows {text:?}, not a part of its id"
            );
            shown.insert(text);
            prefixes.insert(id.chars().take(8).collect::<String>());
        }
        ensure!(
            shown.len() == rows.len(),
            "{} rows show only {} distinct ids: {shown:?}",
            rows.len(),
            shown.len()
        );
        eprintln!(
            "ui-scale:       ({} rows, {} distinct short ids; the ids' first 8 characters take {} values)",
            rows.len(),
            shown.len(),
            prefixes.len()
        );
        Ok(())
    }

    /// Check 4: the overview shows the paused exchange (with the pending it holds) and
    /// the paused consumer; the navigation counts the pauses.
    async fn pauses_show_on_the_overview(&self) -> anyhow::Result<()> {
        self.goto("/ui").await?;
        let badge = self
            .text(&format!(
                "table#exchanges tr[data-exchange='{PAUSED_EXCHANGE}'] [data-paused]"
            ))
            .await?;
        let want = format!(
            "paused: holds its {} pending",
            thousands(self.seeded.paused_pending)
        );
        ensure!(
            badge == want,
            "exchange {PAUSED_EXCHANGE}'s badge: {badge:?}, expected {want:?}"
        );
        for other in EXCHANGES.iter().filter(|e| **e != PAUSED_EXCHANGE) {
            let marked = self
                .c
                .find_all(Locator::Css(&format!(
                    "table#exchanges tr[data-exchange='{other}'] [data-paused]"
                )))
                .await?;
            ensure!(marked.is_empty(), "exchange {other} is shown paused");
        }
        self.wait_for(&format!(
            "table#consumers tr[data-consumer='{CONSUMER}'] [data-paused]"
        ))
        .await?;
        let marked = self
            .c
            .find_all(Locator::Css(&format!(
                "table#consumers tr[data-consumer='{OTHER_CONSUMER}'] [data-paused]"
            )))
            .await?;
        ensure!(
            marked.is_empty(),
            "consumer {OTHER_CONSUMER} is shown paused"
        );
        let nav = self.text("#nav-pauses").await?;
        ensure!(nav.contains('2'), "the navigation's pauses: {nav:?}");
        Ok(())
    }

    /// Check 6: a group's members link lists only rows of its cause: checked for
    /// several dead causes (numbers, a UUID, hex), the retried group and a
    /// consumer's group, each listed row's stored last error grouped again.
    async fn members_hold_only_their_cause(&self) -> anyhow::Result<()> {
        let (_, rows) = self.failures_page_groups().await?;
        let by_key: BTreeMap<(String, String), String> = rows
            .iter()
            .map(|r| {
                (
                    (
                        r["place"].as_str().unwrap_or_default().to_owned(),
                        r["group"].as_str().unwrap_or_default().to_owned(),
                    ),
                    r["href"].as_str().unwrap_or_default().to_owned(),
                )
            })
            .collect();
        // Causes 0 (a size), 6 (a UUID), 8 (hex), 49 (the largest), then a
        // group of retried ones and the consumer's two.
        let mut picked: Vec<(String, String)> = Vec::new();
        for marker in [
            format!("{}: PRECONDITION_FAILED", WORDS[0]),
            format!("{}: basic.return", WORDS[6]),
            format!("{}: payload checksum", WORDS[8]),
            format!("{}: broker nack", WORDS[49]),
        ] {
            let key = self
                .seeded
                .dead_causes
                .iter()
                .find(|(_, g)| g.starts_with(&marker))
                .ok_or_else(|| anyhow!("seeding: no cause starts with {marker:?}"))?;
            picked.push(key.clone());
        }
        picked.extend(
            self.seeded
                .groups
                .keys()
                .filter(|(p, g)| {
                    p.starts_with("consumer ")
                        || (g.starts_with("connection refused") && p == "exchange orders")
                })
                .cloned(),
        );
        for (place, group) in picked {
            let href = by_key.get(&(place.clone(), group.clone())).ok_or_else(|| {
                anyhow!("the Failures page has no members link for {place} {group:?}")
            })?;
            self.goto(href).await?;
            self.wait_for("table#results").await?;
            let ids: Vec<String> = serde_json::from_value(
                self.js(
                    "return [...document.querySelectorAll('table#results tbody tr')]
                       .map(tr => tr.getAttribute('data-id'));",
                    vec![],
                )
                .await?,
            )?;
            ensure!(!ids.is_empty(), "{place} {group:?}: {href} lists nothing");
            let s = &self.seeded.s;
            let stored: Vec<(String, String, Option<String>)> =
                if let Some(consumer) = place.strip_prefix("consumer ") {
                    sqlx::query_as(sqlx::AssertSqlSafe(format!(
                        "SELECT message_id::text, consumer, last_error FROM {s}.outbox_inbox
                          WHERE consumer = $1 AND message_id = ANY($2::text[]::uuid[])"
                    )))
                    .bind(consumer)
                    .bind(&ids)
                    .fetch_all(&self.seeded.pool)
                    .await?
                } else {
                    sqlx::query_as(sqlx::AssertSqlSafe(format!(
                        "SELECT id::text, exchange, last_error FROM {s}.outbox_messages
                          WHERE id = ANY($1::text[]::uuid[])"
                    )))
                    .bind(&ids)
                    .fetch_all(&self.seeded.pool)
                    .await?
                };
            ensure!(
                stored.len() == ids.len(),
                "{place} {group:?}: {} rows listed, {} of them found in {place}",
                ids.len(),
                stored.len()
            );
            let name = place.split_once(' ').map(|(_, n)| n).unwrap_or_default();
            for (id, at, error) in stored {
                let error = error.unwrap_or_default();
                ensure!(
                    at == name && failure_group(&error) == group,
                    "{place} {group:?}: its members list ({href}) holds {id} of {at} whose last error is {error:?}"
                );
            }
        }
        Ok(())
    }

    /// Check 7: at 390x844: nothing wider than the page; every Requeue, Delete,
    /// Reconsume, Pause and Resume button can be scrolled to and is then within
    /// the viewport, not covered.
    async fn pages_fit_a_phone(&self) -> anyhow::Result<()> {
        let dead_id: String = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
            "SELECT id::text FROM {}.outbox_messages WHERE status = 'dead' ORDER BY seq DESC LIMIT 1",
            self.seeded.s
        )))
        .fetch_one(&self.seeded.pool)
        .await?;
        let (width, height) = self.c.get_window_size().await?;
        self.c.set_window_size(390, 844).await?;
        let result = async {
            let inner = self.js("return window.innerWidth;", vec![]).await?;
            if let Some(inner) = inner.as_u64().filter(|w| *w != 390) {
                // Whatever the window's frame takes, a viewport 390 wide.
                let outer = u32::try_from(390 + 390_u64.saturating_sub(inner)).unwrap_or(390);
                self.c.set_window_size(outer, 844).await?;
            }
            let mut problems = Vec::new();
            for (path, actions) in [
                ("/ui".to_owned(), false),
                ("/ui/messages?status=dead".to_owned(), true),
                (format!("/ui/messages/{dead_id}"), true),
                ("/ui/failures".to_owned(), true),
                ("/ui/consumers".to_owned(), true),
                ("/ui/pauses".to_owned(), true),
            ] {
                self.goto(&path).await?;
                self.wait_for("h1").await?;
                let seen = self
                    .js(
                        "const w = window.innerWidth;
                         const sw = document.documentElement.scrollWidth;
                         const re = /^(Requeue|Delete|Reconsume|Pause|Resume)/;
                         const buttons = [];
                         for (const b of document.querySelectorAll('button')) {
                           const t = b.textContent.trim();
                           if (!re.test(t) || b.getClientRects().length === 0) continue;
                           b.scrollIntoView({block: 'center', inline: 'nearest'});
                           const r = b.getBoundingClientRect();
                           const hit = document.elementFromPoint(r.left + r.width / 2, r.top + r.height / 2);
                           const ok = r.width > 0 && r.left >= -1 && r.right <= w + 1
                                      && hit !== null && (hit === b || b.contains(hit));
                           if (!ok) buttons.push(t + ' at ' + Math.round(r.left) + '..' + Math.round(r.right)
                                                 + (hit === null || hit === b || b.contains(hit) ? '' : ' (covered)'));
                           else buttons.push('');
                         }
                         window.scrollTo(0, 0);
                         return {w, sw, count: buttons.length, bad: buttons.filter(x => x !== '')};",
                        vec![],
                    )
                    .await?;
                let w = seen["w"].as_u64().unwrap_or(0);
                let sw = seen["sw"].as_u64().unwrap_or(0);
                if w != 390 {
                    problems.push(format!("{path}: the viewport is {w} px wide, not 390"));
                }
                if sw > w + 1 {
                    problems.push(format!("{path}: {sw} px wide in a {w} px viewport"));
                }
                let bad = seen["bad"].as_array().cloned().unwrap_or_default();
                if !bad.is_empty() {
                    problems.push(format!(
                        "{path}: {} of {} action buttons out of reach: {}",
                        bad.len(),
                        seen["count"],
                        bad.iter()
                            .take(4)
                            .map(|b| b.as_str().unwrap_or_default().to_owned())
                            .collect::<Vec<_>>()
                            .join(", ")
                    ));
                }
                if actions && seen["count"].as_u64() == Some(0) {
                    problems.push(format!("{path}: no action button shown"));
                }
            }
            ensure!(problems.is_empty(), "{}", problems.join("; "));
            anyhow::Ok(())
        }
        .await;
        self.c
            .set_window_size(
                u32::try_from(width).unwrap_or(1280),
                u32::try_from(height).unwrap_or(1000),
            )
            .await?;
        result
    }

    /// Check 5: eight tabs of list pages and the overview, opened one after the other
    /// (each page holding what it holds open), all render their main content.
    async fn eight_tabs_render(&self) -> anyhow::Result<()> {
        let original = self.c.window().await?;
        let pages: [(String, &str); 8] = [
            ("/ui/messages".to_owned(), "table#results"),
            ("/ui/messages?status=dead".to_owned(), "table#results"),
            ("/ui/messages?status=pending".to_owned(), "table#results"),
            (format!("/ui/consumers/{CONSUMER}"), "table#results"),
            (
                format!("/ui/consumers/{CONSUMER}?status=dead"),
                "table#results",
            ),
            ("/ui".to_owned(), "#count-pending"),
            ("/ui/messages?exchange=orders".to_owned(), "table#results"),
            (format!("/ui/consumers/{OTHER_CONSUMER}"), "table#results"),
        ];
        self.c
            .update_timeouts(TimeoutConfiguration::new(
                None,
                Some(Duration::from_secs(6)),
                None,
            ))
            .await?;
        let mut tabs = Vec::new();
        let result = async {
            for (path, _) in &pages {
                let tab = self.c.new_window(true).await?;
                self.c.switch_to_window(tab.handle.clone()).await?;
                tabs.push(tab.handle);
                // A page that cannot load times out here; it is judged below.
                let _ = self.c.goto(&self.url(path)).await;
            }
            let mut blank = Vec::new();
            for (n, ((path, css), handle)) in pages.iter().zip(&tabs).enumerate() {
                self.c.switch_to_window(handle.clone()).await?;
                if self
                    .wait_for_within(css, Duration::from_secs(3))
                    .await
                    .is_err()
                {
                    blank.push(format!("tab {} ({path}) has no `{css}`", n + 1));
                }
            }
            ensure!(
                blank.is_empty(),
                "{} of 8 tabs did not render: {}",
                blank.len(),
                blank.join("; ")
            );
            anyhow::Ok(())
        }
        .await;
        if result.is_err() {
            // The screenshot of the first tab that did not render.
            for handle in &tabs {
                if self.c.switch_to_window(handle.clone()).await.is_ok()
                    && self.c.find(Locator::Css("#actor")).await.is_err()
                {
                    break;
                }
            }
            if let Ok(png) = self.c.screenshot().await {
                let shots = PathBuf::from(
                    std::env::var("UI_SCREENSHOTS")
                        .unwrap_or_else(|_| "target/ui-screenshots".into()),
                );
                let _ = std::fs::create_dir_all(&shots);
                let _ = std::fs::write(shots.join("scale-5-blank-tab.png"), png);
            }
        }
        for handle in tabs {
            if self.c.switch_to_window(handle).await.is_ok() {
                let _ = self.c.close_window().await;
            }
        }
        self.c.switch_to_window(original).await?;
        self.c
            .update_timeouts(TimeoutConfiguration::new(
                None,
                Some(Duration::from_secs(60)),
                None,
            ))
            .await?;
        result
    }

    /// Check 8: each page's server time (whole HTTP requests with the session's
    /// cookie, or the read token for the API): median of 5 after a warm-up.
    async fn timings(&self) -> anyhow::Result<String> {
        // No page open: no live stream polls meanwhile.
        self.c.goto("about:blank").await?;
        let s = &self.seeded.s;
        let dead_id: String = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
            "SELECT id::text FROM {s}.outbox_messages WHERE status = 'dead' ORDER BY seq DESC LIMIT 1"
        )))
        .fetch_one(&self.seeded.pool)
        .await?;
        let (_, rows) = self.failures_page_groups().await?;
        self.c.goto("about:blank").await?;
        let members = rows
            .iter()
            .find(|r| {
                r["place"]
                    .as_str()
                    .is_some_and(|p| p.starts_with("exchange "))
            })
            .and_then(|r| r["href"].as_str())
            .ok_or_else(|| anyhow!("no group's members link on the Failures page"))?
            .to_owned();
        let pages: Vec<(&str, String, &str)> = vec![
            ("overview", "/ui".into(), "id=\"count-pending\""),
            ("messages", "/ui/messages".into(), "id=\"results\""),
            (
                "messages, dead",
                "/ui/messages?status=dead".into(),
                "id=\"results\"",
            ),
            ("failures", "/ui/failures".into(), "id=\"results\""),
            ("a group's members", members, "id=\"results\""),
            ("consumers", "/ui/consumers".into(), "id=\"consumers\""),
            (
                "a consumer's deliveries",
                format!("/ui/consumers/{CONSUMER}"),
                "id=\"results\"",
            ),
            ("pauses", "/ui/pauses".into(), "id=\"pauses\""),
            ("audit", "/ui/audit".into(), "<table"),
            (
                "a message",
                format!("/ui/messages/{dead_id}"),
                "id=\"message-id\"",
            ),
            ("API stats", "/api/v1/stats".into(), "\"outbox\""),
            ("API failures", "/api/v1/failures".into(), "\"groups\""),
        ];
        let bearer = format!("Bearer {READ}");
        let mut table = String::from(
            "| page | path | median ms | min ms | max ms | KiB | < 300 ms |\n|---|---|---:|---:|---:|---:|---|\n",
        );
        for (name, path, marker) in &pages {
            let headers: Vec<(&str, &str)> = if path.starts_with("/api/") {
                vec![("authorization", bearer.as_str())]
            } else {
                vec![("cookie", self.cookie.as_str())]
            };
            let mut ms = Vec::new();
            let mut size = 0;
            for round in 0..6 {
                let t = Instant::now();
                let (status, body) =
                    request(&self.http, "GET", &self.url(path), &headers, None).await?;
                let took = t.elapsed().as_secs_f64() * 1000.0;
                ensure!(
                    status == 200 && body.contains(marker),
                    "GET {path}: status {status}, {} bytes, no {marker:?} in it",
                    body.len()
                );
                size = body.len();
                if round > 0 {
                    ms.push(took);
                }
            }
            ms.sort_by(f64::total_cmp);
            let median = ms[ms.len() / 2];
            let _ = writeln!(
                table,
                "| {name} | `{}` | {median:.1} | {:.1} | {:.1} | {:.1} | {} |",
                shown_path(path),
                ms[0],
                ms[ms.len() - 1],
                size as f64 / 1024.0,
                if median < 300.0 { "yes" } else { "**no**" }
            );
        }
        let cpus = std::thread::available_parallelism().map_or(0, std::num::NonZero::get);
        let report = format!(
            "# Dashboard page timings at scale (issue 49)\n\n\
             Written by `cargo xtask ui-test` (`outbox-ui-browser`, scale scenario; debug build) \
             on {cpus} CPUs: the dashboard and API over the PostgreSQL stores, {} messages \
             ({} dead in {CAUSES} causes, every dead row's error text its own), {} failure groups, \
             one exchange and one consumer paused. Each page: whole HTTP GETs on a kept-alive \
             loopback connection (session cookie, or the read token for the API), \
             one warm-up then the median of 5.\n\n{table}",
            thousands(self.seeded.total),
            thousands(self.seeded.dead),
            self.seeded.groups.len(),
        );
        eprintln!("ui-scale: page timings\n{table}");
        Ok(report)
    }
}
