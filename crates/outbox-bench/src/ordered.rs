//! `relay_ordered`: the `relay` drain with an ordering key on every row (1,000 keys,
//! round-robin, so a key's messages are interleaved with all the others), then a
//! check of what reached the queue: per key, in `seq` order, each message once. A
//! fast figure that broke the order would be worthless, so a broken order fails
//! the bench.

use std::collections::HashMap;
use std::time::Duration;

use anyhow::Context as _;
use futures::StreamExt as _;
use lapin::options::{BasicAckOptions, BasicConsumeOptions, BasicQosOptions};
use lapin::types::FieldTable;
use outbox_adapters_postgres::PgSchema;

use crate::bench::{Bench, QUEUE};
use crate::cpu;

/// Ordering keys of the `relay_ordered` backlog.
pub(crate) const ORDERING_KEYS: i64 = 1_000;

impl Bench {
    /// Drains `n` pending rows of `keys` ordering keys with one dispatcher (batch
    /// 1,000, as [`Bench::relay`]), then reads the queue back and fails unless each
    /// key's messages arrived in `seq` order, each exactly once.
    pub(crate) async fn relay_ordered(
        &mut self,
        n: i64,
        keys: i64,
    ) -> anyhow::Result<(f64, cpu::CpuPerMessage)> {
        let schema = self.fresh_schema("bench_ordered").await?;
        self.backlog(&schema, n, Some(keys)).await?;
        let measured = self.drain(&schema, n, 1).await?;
        self.check_order(&schema, n).await?;
        self.purge().await?;
        Ok(measured)
    }

    /// Reads the `n` messages the drain left in the queue (the relay's exchange
    /// routes only to it) and checks them against the table's keys and `seq`s.
    async fn check_order(&self, schema: &PgSchema, n: i64) -> anyhow::Result<()> {
        let rows: Vec<(String, String, i64)> = sqlx::query_as(sqlx::AssertSqlSafe(format!(
            "SELECT id::text, ordering_key, seq FROM {}.outbox_messages",
            schema.quoted()
        )))
        .fetch_all(&self.pool)
        .await?;
        let by_id: HashMap<String, (String, i64)> = rows
            .into_iter()
            .map(|(id, key, seq)| (id, (key, seq)))
            .collect();
        let ch = self.amqp.create_channel().await?;
        ch.basic_qos(1_000, BasicQosOptions::default()).await?;
        let mut deliveries = ch
            .basic_consume(
                QUEUE.into(),
                "bench-order-check".into(),
                BasicConsumeOptions::default(),
                FieldTable::default(),
            )
            .await?;
        let mut last_seq: HashMap<&str, i64> = HashMap::new();
        for got in 0..n {
            let d = tokio::time::timeout(Duration::from_secs(10), deliveries.next())
                .await
                .with_context(|| format!("ordered relay: only {got} of {n} messages in the queue"))?
                .context("consumer ended")??;
            // Acked one by one: deliveries beyond the `n`th stay unacked and go back
            // to the queue when the channel closes, where the count below sees them.
            d.acker.ack(BasicAckOptions::default()).await?;
            let id = d
                .properties
                .message_id()
                .as_ref()
                .map(|s| s.as_str().to_owned())
                .context("a published message without its id")?;
            let (key, seq) = by_id
                .get(&id)
                .with_context(|| format!("message {id} is not in the table"))?;
            if let Some(before) = last_seq.insert(key, *seq) {
                anyhow::ensure!(
                    before < *seq,
                    "ORDER BROKEN: key {key}: seq {seq} published after seq {before} \
                     (message {got} of {n} read back)"
                );
            }
        }
        ch.close(200, "done".into()).await?;
        let left = self.depth(QUEUE).await?;
        anyhow::ensure!(
            left == 0,
            "ordered relay: {left} messages beyond the {n} rows in the queue (duplicates?)"
        );
        let keys = i64::try_from(last_seq.len())?;
        anyhow::ensure!(keys > 0, "no keyed message read back");
        println!("order checked: {n} messages of {keys} keys, each key in seq order");
        Ok(())
    }
}
