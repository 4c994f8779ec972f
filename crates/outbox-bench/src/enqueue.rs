//! `enqueue*`: producer transactions committing a business row and a message,
//! through `PgOutbox::enqueue` against plain INSERTs into a table of the same
//! columns, alternating.

use std::time::{Duration, Instant};

use outbox_adapters_postgres::{PgOutbox, PgSchema};
use outbox_core::NewMessage;

use crate::bench::{Bench, EXCHANGE, Sizes, time_now};

impl Bench {
    /// Rows/s of 16 tasks committing a business row plus a message per transaction.
    async fn enqueue_rate(
        &self,
        schema: &PgSchema,
        plain: bool,
        for_how_long: Duration,
    ) -> anyhow::Result<f64> {
        let outbox = PgOutbox::new(schema.clone());
        let business = format!(
            "INSERT INTO {}.business (note) VALUES ('order')",
            schema.quoted()
        );
        let plain_insert = format!(
            "INSERT INTO {}.plain_messages (id, exchange, routing_key, message_type, headers, payload, content_type, source, correlation_id, created_at) \
             VALUES ($1, $2, $3, $4, '{{}}'::jsonb, $5, $6, NULL, NULL, $7)",
            schema.quoted()
        );
        let until = Instant::now() + for_how_long;
        let mut tasks = Vec::new();
        for _ in 0..16 {
            let (pool, outbox, business, plain_insert) = (
                self.pool.clone(),
                outbox.clone(),
                business.clone(),
                plain_insert.clone(),
            );
            tasks.push(tokio::spawn(async move {
                let mut n = 0_u64;
                while Instant::now() < until {
                    let mut tx = pool.begin().await?;
                    sqlx::query(sqlx::AssertSqlSafe(&*business))
                        .execute(&mut *tx)
                        .await?;
                    let m = NewMessage::new(EXCHANGE, "order.created", vec![b'x'; 1024])
                        .with_type("order.created");
                    if plain {
                        let m = m.into_message(
                            outbox_core::MessageId::from_uuid(uuid::Uuid::now_v7()),
                            time_now(),
                        );
                        sqlx::query(sqlx::AssertSqlSafe(&*plain_insert))
                            .bind(m.id.as_uuid())
                            .bind(&m.exchange)
                            .bind(&m.routing_key)
                            .bind(&m.message_type)
                            .bind(&m.payload)
                            .bind(&m.content_type)
                            .bind(m.created_at)
                            .execute(&mut *tx)
                            .await?;
                    } else {
                        outbox.enqueue(&mut tx, m).await?;
                    }
                    tx.commit().await?;
                    n += 1;
                }
                anyhow::Ok(n)
            }));
        }
        let mut total = 0;
        for t in tasks {
            total += t.await??;
        }
        Ok(total as f64 / for_how_long.as_secs_f64())
    }

    async fn enqueue(&mut self, for_how_long: Duration) -> anyhow::Result<(f64, f64)> {
        let schema = self.fresh_schema("bench_enqueue").await?;
        let s = schema.quoted();
        sqlx::query(sqlx::AssertSqlSafe(format!("CREATE TABLE {s}.business (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, note text)")))
            .execute(&self.pool)
            .await?;
        // The same message columns, without our trigger, partial indexes or defaults.
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "CREATE TABLE {s}.plain_messages (seq bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, id uuid NOT NULL UNIQUE, \
             exchange text NOT NULL, routing_key text NOT NULL, message_type text, headers jsonb NOT NULL, payload bytea NOT NULL, \
             content_type text NOT NULL, source text, correlation_id text, created_at timestamptz NOT NULL)"
        )))
        .execute(&self.pool)
        .await?;
        let (mut plain, mut ours) = (Vec::new(), Vec::new());
        for _ in 0..2 {
            plain.push(self.enqueue_rate(&schema, true, for_how_long).await?);
            ours.push(self.enqueue_rate(&schema, false, for_how_long).await?);
        }
        let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len() as f64;
        Ok((mean(&plain), mean(&ours)))
    }
}

/// Producer commits through `PgOutbox::enqueue` against plain INSERTs, alternating.
pub(crate) async fn record_enqueue(b: &mut Bench, sizes: &Sizes) -> anyhow::Result<()> {
    let (plain, ours) = b.enqueue(sizes.enqueue_for).await?;
    b.record("enqueue_plain", plain, "rows/s");
    b.record("enqueue", ours, "rows/s");
    b.record("enqueue/enqueue_plain", ours / plain, "ratio");
    Ok(())
}
