//! The readings taken every 10 s: each process's RSS and open file descriptors
//! (from `/proc`), the PostgreSQL connections of the processes under test, the
//! outbox and inbox backlog, the tables' sizes, the latency window and the rates.

use std::time::Duration;

use lapin::options::QueueDeclareOptions;
use lapin::types::FieldTable;

use super::latency::Window;
use super::verdict::ProcSample;
use crate::world::World;

/// One reading.
#[derive(Debug, Clone, Default)]
pub(crate) struct Sample {
    pub(crate) t_s: f64,
    pub(crate) procs: Vec<ProcSample>,
    /// Connections of the relays and consumers (their `application_name`).
    pub(crate) pg_connections: Option<u64>,
    /// Outbox messages not sent yet (`pending`, `publish_failed`).
    pub(crate) outbox_backlog: Option<u64>,
    /// Messages in the billing queue plus inbox rows not consumed yet.
    pub(crate) inbox_backlog: Option<u64>,
    pub(crate) queue_depth: Option<u64>,
    pub(crate) outbox_rows: Option<u64>,
    pub(crate) outbox_bytes: Option<u64>,
    /// Estimated (`pg_stat_user_tables.n_live_tup`).
    pub(crate) inbox_rows: Option<u64>,
    pub(crate) inbox_bytes: Option<u64>,
    /// Dead row versions not reclaimed yet (`pg_stat_user_tables.n_dead_tup`).
    pub(crate) outbox_dead_rows: Option<u64>,
    pub(crate) inbox_dead_rows: Option<u64>,
    pub(crate) latency: Window,
    pub(crate) committed_per_s: Option<f64>,
    pub(crate) consumed_per_s: f64,
}

impl Sample {
    pub(crate) fn json(&self) -> serde_json::Value {
        serde_json::json!({
            "t_s": self.t_s,
            "procs": self.procs.iter().map(|p| serde_json::json!({
                "name": p.name, "pid": p.pid, "rss_kb": p.rss_kb, "fds": p.fds,
            })).collect::<Vec<_>>(),
            "pg_connections": self.pg_connections,
            "outbox_backlog": self.outbox_backlog,
            "inbox_backlog": self.inbox_backlog,
            "queue_depth": self.queue_depth,
            "outbox_rows": self.outbox_rows,
            "outbox_bytes": self.outbox_bytes,
            "inbox_rows": self.inbox_rows,
            "inbox_bytes": self.inbox_bytes,
            "outbox_dead_rows": self.outbox_dead_rows,
            "inbox_dead_rows": self.inbox_dead_rows,
            "latency_count": self.latency.count,
            "latency_p50_ms": self.latency.p50_ms,
            "latency_p99_ms": self.latency.p99_ms,
            "committed_per_s": self.committed_per_s,
            "consumed_per_s": self.consumed_per_s,
        })
    }
}

/// RSS (KiB) and open descriptors of `pid`, from `/proc`.
pub(crate) fn proc_reading(pid: u32) -> Option<(u64, u64)> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let rss = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()?;
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd")).ok()?.count() as u64;
    Some((rss, fds))
}

/// Reads the database side of the soak.
pub(crate) struct Reader<'a> {
    pub(crate) w: &'a World,
    /// `extract(epoch from clock_timestamp())` at the start of the run.
    pub(crate) t0_epoch: f64,
    channel: Option<lapin::Channel>,
}

impl<'a> Reader<'a> {
    pub(crate) fn new(w: &'a World, t0_epoch: f64) -> Self {
        Self {
            w,
            t0_epoch,
            channel: None,
        }
    }

    /// Latency of the orders whose invoice was written in `[a_s, b_s)`.
    pub(crate) async fn window(&self, a_s: f64, b_s: f64) -> anyhow::Result<Window> {
        let s = self.w.shop.schema.quoted();
        let (count, p50, p99): (i64, Option<f64>, Option<f64>) =
            sqlx::query_as(sqlx::AssertSqlSafe(format!(
                "SELECT count(*),
                    percentile_cont(0.5) WITHIN GROUP (ORDER BY ms),
                    percentile_cont(0.99) WITHIN GROUP (ORDER BY ms)
             FROM (SELECT extract(epoch FROM i.billed_at - o.created_at)::float8 * 1000 AS ms
                   FROM {s}.invoices i JOIN {s}.orders o ON o.id = i.order_id
                   WHERE i.billed_at >= to_timestamp($1) AND i.billed_at < to_timestamp($2)) x"
            )))
            .bind(self.t0_epoch + a_s)
            .bind(self.t0_epoch + b_s)
            .fetch_one(&self.w.pool)
            .await?;
        Ok(Window {
            start_s: a_s,
            end_s: b_s,
            count: u64::try_from(count).unwrap_or(0),
            p50_ms: p50,
            p99_ms: p99,
        })
    }

    /// Windows of 10 s starting every second from `from_s`, `n` of them.
    pub(crate) async fn sliding(&self, from_s: f64, n: i32) -> anyhow::Result<Vec<Window>> {
        let s = self.w.shop.schema.quoted();
        let rows: Vec<(i32, i64, Option<f64>)> = sqlx::query_as(sqlx::AssertSqlSafe(format!(
            "SELECT g.k, x.n, x.p99
             FROM generate_series(0, $2 - 1) AS g(k)
             CROSS JOIN LATERAL (
               SELECT count(*) AS n,
                      percentile_cont(0.99) WITHIN GROUP (ORDER BY ms) AS p99
               FROM (SELECT extract(epoch FROM i.billed_at - o.created_at)::float8 * 1000 AS ms
                     FROM {s}.invoices i JOIN {s}.orders o ON o.id = i.order_id
                     WHERE i.billed_at >= to_timestamp($1 + g.k)
                       AND i.billed_at < to_timestamp($1 + g.k + {win})) y) x
             ORDER BY g.k",
            win = super::latency::WINDOW_S
        )))
        .bind(self.t0_epoch + from_s)
        .bind(n)
        .fetch_all(&self.w.pool)
        .await?;
        Ok(rows
            .into_iter()
            .map(|(k, count, p99)| Window {
                start_s: from_s + f64::from(k),
                end_s: from_s + f64::from(k) + super::latency::WINDOW_S,
                count: u64::try_from(count).unwrap_or(0),
                p50_ms: None,
                p99_ms: p99,
            })
            .collect())
    }

    async fn scalar(&self, sql: &str) -> Option<u64> {
        sqlx::query_scalar::<_, i64>(sqlx::AssertSqlSafe(sql))
            .fetch_one(&self.w.pool)
            .await
            .ok()
            .and_then(|v| u64::try_from(v).ok())
    }

    /// Messages ready in the billing queue (`None` while the broker is away).
    pub(crate) async fn queue_depth(&mut self, queue: &str) -> Option<u64> {
        if !self
            .channel
            .as_ref()
            .is_some_and(|c| c.status().connected())
        {
            self.channel = tokio::time::timeout(Duration::from_secs(3), self.w.channel())
                .await
                .ok()
                .and_then(Result::ok);
        }
        let ch = self.channel.as_ref()?;
        let q = tokio::time::timeout(
            Duration::from_secs(3),
            ch.queue_declare(
                queue.into(),
                QueueDeclareOptions {
                    passive: true,
                    ..QueueDeclareOptions::default()
                },
                FieldTable::default(),
            ),
        )
        .await;
        match q {
            Ok(Ok(q)) => Some(u64::from(q.message_count())),
            _ => {
                self.channel = None;
                None
            }
        }
    }

    /// One reading at `t_s` of `procs` (name, pid); the latency window is the 10 s
    /// before it.
    pub(crate) async fn sample(&mut self, t_s: f64, procs: &[(String, u32)]) -> Sample {
        let (s, o) = (
            self.w.shop.schema.quoted(),
            self.w.shop.outbox_schema.quoted(),
        );
        let procs = procs
            .iter()
            .filter_map(|(name, pid)| {
                proc_reading(*pid).map(|(rss_kb, fds)| ProcSample {
                    t_s,
                    name: name.clone(),
                    pid: *pid,
                    rss_kb,
                    fds,
                })
            })
            .collect();
        let a = (t_s - super::latency::WINDOW_S).max(0.0);
        let latency = self.window(a, t_s).await.unwrap_or(Window {
            start_s: a,
            end_s: t_s,
            count: 0,
            p50_ms: None,
            p99_ms: None,
        });
        let committed = self
            .scalar(&format!(
                "SELECT count(*) FROM {s}.orders WHERE created_at >= to_timestamp({}) AND created_at < to_timestamp({})",
                self.t0_epoch + a,
                self.t0_epoch + t_s
            ))
            .await;
        let span = (t_s - a).max(1.0);
        let pg_connections = self
            .scalar(&format!(
                "SELECT count(*) FROM pg_stat_activity WHERE application_name = '{}'",
                self.w.proc_app
            ))
            .await;
        let outbox_backlog = self
            .scalar(&format!(
                "SELECT count(*) FROM {o}.outbox_messages WHERE status IN ('pending', 'publish_failed')"
            ))
            .await;
        let unfinished = self
            .scalar(&format!(
                "SELECT count(*) FROM {o}.outbox_inbox WHERE consumer = '{}' AND status IN ('received', 'consume_failed')",
                outbox_examples::billing::CONSUMER
            ))
            .await;
        let queue = self.w.shop.queue.clone();
        let queue_depth = self.queue_depth(&queue).await;
        let size = |table: &str| {
            format!(
                "SELECT pg_total_relation_size(to_regclass('{}.{table}'))",
                o.replace('\'', "''")
            )
        };
        let outbox_rows = self
            .scalar(&format!("SELECT count(*) FROM {o}.outbox_messages"))
            .await;
        let inbox_rows = self
            .scalar(&format!(
                "SELECT coalesce(max(n_live_tup), 0) FROM pg_stat_user_tables WHERE schemaname = '{}' AND relname = 'outbox_inbox'",
                self.w.shop.outbox_schema.as_str()
            ))
            .await;
        let dead = |table: &str| {
            format!(
                "SELECT coalesce(max(n_dead_tup), 0) FROM pg_stat_user_tables WHERE schemaname = '{}' AND relname = '{table}'",
                self.w.shop.outbox_schema.as_str()
            )
        };
        Sample {
            outbox_dead_rows: self.scalar(&dead("outbox_messages")).await,
            inbox_dead_rows: self.scalar(&dead("outbox_inbox")).await,
            t_s,
            procs,
            pg_connections,
            outbox_backlog,
            inbox_backlog: unfinished.map(|u| u + queue_depth.unwrap_or(0)),
            queue_depth,
            outbox_rows,
            outbox_bytes: self.scalar(&size("outbox_messages")).await,
            inbox_rows,
            inbox_bytes: self.scalar(&size("outbox_inbox")).await,
            consumed_per_s: latency.count as f64 / span,
            latency,
            committed_per_s: committed.map(|c| c as f64 / span),
        }
    }
}
