//! `latency_*`: commit to marked sent (after the broker's confirm) at a steady 500
//! inserts a second, the relay woken by PostgreSQL's notifications.

use std::sync::Arc;
use std::time::{Duration, Instant};

use outbox_adapters_postgres::PgOutboxStore;
use outbox_relay::{CancellationToken, Dispatcher, DispatcherConfig, PgWakeupSource};

use crate::bench::{Bench, EXCHANGE};

/// Commit-to-sent latency and the producer rate it was measured at.
pub(crate) struct Latency {
    pub(crate) p50: f64,
    pub(crate) p99: f64,
    pub(crate) max: f64,
    pub(crate) achieved_rate: f64,
}

impl Bench {
    /// Commit -> marked sent after the broker's confirm, aiming at a steady 500 msg/s
    /// (one insert every 2 ms). Returns p50, p99, max and the rate the producer
    /// actually achieved (a loaded machine falls short of 500, and the latency figures
    /// mean little without it).
    pub(crate) async fn latency(&mut self, for_how_long: Duration) -> anyhow::Result<Latency> {
        let schema = self.fresh_schema("bench_latency").await?;
        let store = Arc::new(PgOutboxStore::new(self.pool.clone(), schema.clone()));
        let dispatcher = Dispatcher::new(
            store,
            self.publisher(),
            DispatcherConfig {
                idle_poll: Duration::from_millis(500),
                // As measured before the two dispatcher configurations became one.
                batch_size: 100,
                lease_ttl: Duration::from_secs(30),
                ..DispatcherConfig::default()
            },
            "bench-latency",
        )
        .with_wakeup(Box::new(PgWakeupSource::new(
            self.pool.clone(),
            schema.clone(),
            "bench-latency",
        )));
        let cancel = CancellationToken::new();
        let task = tokio::spawn(dispatcher.run(cancel.clone()));
        tokio::time::sleep(Duration::from_millis(500)).await;
        let insert = format!(
            "INSERT INTO {}.outbox_messages (exchange, routing_key, payload) VALUES ($1, 'k', convert_to(repeat('x', 1024), 'UTF8'))",
            schema.quoted()
        );
        let mut tick = tokio::time::interval(Duration::from_millis(2));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let started = Instant::now();
        let until = started + for_how_long;
        let mut sent = 0_i64;
        while Instant::now() < until {
            tick.tick().await;
            sqlx::query(sqlx::AssertSqlSafe(&*insert))
                .bind(EXCHANGE)
                .execute(&self.pool)
                .await?;
            sent += 1;
        }
        let achieved_rate = sent as f64 / started.elapsed().as_secs_f64();
        while self.count(&schema, "sent").await? < sent {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        cancel.cancel();
        task.await?;
        let (p50, p99, max): (f64, f64, f64) = sqlx::query_as(sqlx::AssertSqlSafe(format!(
            "SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY ms), percentile_cont(0.99) WITHIN GROUP (ORDER BY ms), max(ms) \
             FROM (SELECT extract(epoch FROM sent_at - created_at)::float8 * 1000 AS ms FROM {}.outbox_messages) t",
            schema.quoted()
        )))
        .fetch_one(&self.pool)
        .await?;
        self.purge().await?;
        Ok(Latency {
            p50,
            p99,
            max,
            achieved_rate,
        })
    }
}
