//! Delayed messages: what a claim pays for delayed rows still waiting
//! (`delayed_claim_ms`), and how late the relay publishes a message after its due
//! time (`delayed_lateness_*_ms`).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::Context as _;
use futures::StreamExt as _;
use lapin::options::{BasicConsumeOptions, QueueDeleteOptions};
use lapin::types::FieldTable;
use outbox_adapters_postgres::{PgOutbox, PgOutboxStore};
use outbox_adapters_rabbitmq::{BindingSpec, QueueSpec, Topology};
use outbox_core::NewMessage;
use outbox_relay::{CancellationToken, Dispatcher, DispatcherConfig};

use crate::bench::{Bench, EXCHANGE, Sizes};

/// The queue the lateness phase reads (bound to the relay's exchange by its own
/// routing key, so nothing else lands there).
const DELAYED_QUEUE: &str = "outbox-bench.delayed";
const DELAYED_KEY: &str = "delayed";

/// Publish lateness of delayed messages, in ms: arrival at a consumer minus due time.
pub(crate) struct Lateness {
    pub(crate) p50: f64,
    pub(crate) p99: f64,
    pub(crate) max: f64,
}

impl Bench {
    /// Median of seven claims of 500 with `rows` delayed rows (due in 30 days and
    /// more) in the table, inserted first so they hold the lowest `seq`s (in front
    /// of the due rows in any index by `seq`, such as `outbox_pending`), then 1,000
    /// due rows interleaved: every other one without a due time, the others delayed
    /// by a due time a minute past (in `outbox_scheduled`, right beside the waiting
    /// ones). Vacuumed and analyzed, as `claim_1k_ms` is; 1-byte payloads as there.
    pub(crate) async fn delayed_claim(&self, rows: i64) -> anyhow::Result<f64> {
        let schema = self.fresh_schema("bench_delayed_claim").await?;
        let t = format!("{}.outbox_messages", schema.quoted());
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "INSERT INTO {t} (exchange, routing_key, payload, not_before) \
             SELECT 'x', 'k', '\\x00'::bytea, now() + interval '30 days' + g * interval '1 second' \
             FROM generate_series(1, $1) AS g"
        )))
        .bind(rows)
        .execute(&self.pool)
        .await?;
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "INSERT INTO {t} (exchange, routing_key, payload, not_before) \
             SELECT 'x', 'k', '\\x00'::bytea, \
               CASE WHEN g % 2 = 0 THEN now() - interval '1 minute' + g * interval '1 millisecond' END \
             FROM generate_series(1, 1000) AS g ORDER BY g"
        )))
        .execute(&self.pool)
        .await?;
        sqlx::query(sqlx::AssertSqlSafe(format!("VACUUM ANALYZE {t}")))
            .execute(&self.pool)
            .await?;
        let store = PgOutboxStore::new(self.pool.clone(), schema.clone());
        let (_, median) = self.claim_times(&store).await?;
        Ok(median)
    }

    /// Enqueues `n` messages through `PgOutbox::enqueue`, evenly over `over`, each
    /// with `deliver_after` of 1 to 3 s (spread), while one dispatcher runs on the
    /// schema and a plain lapin consumer takes them off a queue of their own.
    /// Lateness is arrival at the consumer minus the row's `not_before` (one machine,
    /// one clock).
    ///
    /// The dispatcher has no NOTIFY wake-up and polls at 1 s (`outbox run`'s default
    /// `dispatch.idle_poll`): the producer's commits would otherwise wake it every few
    /// milliseconds and hide whether its timer for the next due time works. With the
    /// timer, lateness is milliseconds; without it, up to the poll.
    pub(crate) async fn delayed_lateness(
        &mut self,
        n: usize,
        over: Duration,
    ) -> anyhow::Result<Lateness> {
        let schema = self.fresh_schema("bench_delayed_lateness").await?;
        Topology {
            exchanges: vec![],
            queues: vec![QueueSpec::durable(DELAYED_QUEUE)],
            bindings: vec![BindingSpec {
                queue: DELAYED_QUEUE.into(),
                exchange: EXCHANGE.into(),
                routing_key: DELAYED_KEY.into(),
            }],
        }
        .declare(&self.amqp)
        .await?;
        let ch = self.amqp.create_channel().await?;
        ch.queue_purge(DELAYED_QUEUE.into(), Default::default())
            .await?;
        let mut deliveries = ch
            .basic_consume(
                DELAYED_QUEUE.into(),
                "bench-delayed".into(),
                BasicConsumeOptions {
                    no_ack: true,
                    ..BasicConsumeOptions::default()
                },
                FieldTable::default(),
            )
            .await?;
        let deadline = over + Duration::from_secs(30);
        let consumer = tokio::spawn(async move {
            let mut arrivals = Vec::with_capacity(n);
            while arrivals.len() < n {
                let d = tokio::time::timeout(deadline, deliveries.next())
                    .await
                    .with_context(|| {
                        format!("delayed: only {} of {n} messages arrived", arrivals.len())
                    })?
                    .context("consumer ended")??;
                let at = SystemTime::now().duration_since(UNIX_EPOCH)?.as_secs_f64();
                let id = d
                    .properties
                    .message_id()
                    .as_ref()
                    .map(|s| s.as_str().to_owned())
                    .context("a published message without its id")?;
                arrivals.push((id, at));
            }
            anyhow::Ok(arrivals)
        });

        let store = Arc::new(PgOutboxStore::new(self.pool.clone(), schema.clone()));
        let dispatcher = Dispatcher::new(
            store,
            self.publisher(),
            DispatcherConfig {
                idle_poll: Duration::from_secs(1),
                // As measured before the two dispatcher configurations became one.
                batch_size: 100,
                lease_ttl: Duration::from_secs(30),
                ..DispatcherConfig::default()
            },
            "bench-delayed",
        );
        let cancel = CancellationToken::new();
        let relay = tokio::spawn(dispatcher.run(cancel.clone()));

        let outbox = PgOutbox::new(schema.clone());
        let mut conn = self.pool.acquire().await?;
        let mut tick = tokio::time::interval(over.div_f64(n as f64));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let started = Instant::now();
        for i in 0..n {
            tick.tick().await;
            // 1,000 to 3,000 ms, spread over the range by a stride prime to 2,001.
            let delay = Duration::from_millis(1_000 + (i as u64 * 7_919) % 2_001);
            let m = NewMessage::new(EXCHANGE, DELAYED_KEY, vec![b'x'; 1024])
                .with_type("bench.delayed")
                .deliver_after(delay);
            outbox.enqueue(&mut conn, m).await?;
        }
        drop(conn);
        let enqueued_for = started.elapsed();
        let arrivals = consumer.await??;
        cancel.cancel();
        relay.await?;
        ch.close(200, "done".into()).await?;
        let _ = self
            .amqp
            .create_channel()
            .await?
            .queue_delete(DELAYED_QUEUE.into(), QueueDeleteOptions::default())
            .await;

        let due: HashMap<String, f64> =
            sqlx::query_as::<_, (String, f64)>(sqlx::AssertSqlSafe(format!(
                "SELECT id::text, extract(epoch FROM not_before)::float8 FROM {}.outbox_messages",
                schema.quoted()
            )))
            .fetch_all(&self.pool)
            .await?
            .into_iter()
            .collect();
        anyhow::ensure!(due.len() == n, "delayed: {} rows, not {n}", due.len());
        let mut late = Vec::with_capacity(n);
        for (id, at) in &arrivals {
            let due_at = due
                .get(id)
                .with_context(|| format!("delayed: message {id} is not in the table"))?;
            late.push((at - due_at) * 1000.0);
        }
        late.sort_by(f64::total_cmp);
        let distinct: std::collections::HashSet<_> = arrivals.iter().map(|(id, _)| id).collect();
        anyhow::ensure!(
            distinct.len() == n,
            "delayed: {} distinct of {n} arrivals",
            distinct.len()
        );
        // Arrival comes after the claim, whose now() was past the due time: a
        // negative lateness is a message published before it was due.
        anyhow::ensure!(
            late[0] >= 0.0,
            "delayed: a message arrived {:.1} ms before its due time",
            -late[0]
        );
        let at = |q: f64| late[((late.len() - 1) as f64 * q).round() as usize];
        println!(
            "delayed: {n} messages enqueued over {:.1} s, due 1-3 s later",
            enqueued_for.as_secs_f64()
        );
        Ok(Lateness {
            p50: at(0.5),
            p99: at(0.99),
            max: late[late.len() - 1],
        })
    }
}

/// How late delayed messages are published after their due time.
pub(crate) async fn record_delayed_lateness(b: &mut Bench, sizes: &Sizes) -> anyhow::Result<()> {
    let d = b
        .delayed_lateness(sizes.delayed, sizes.delayed_over)
        .await?;
    b.record("delayed_lateness_p50_ms", d.p50, "ms");
    b.record("delayed_lateness_p99_ms", d.p99, "ms");
    b.record("delayed_lateness_max_ms", d.max, "ms");
    let _ = sqlx::query("DROP SCHEMA IF EXISTS bench_delayed_lateness CASCADE")
        .execute(&b.pool)
        .await;
    Ok(())
}
