//! `raw_confirm`: RabbitMQ on its own, publishes with confirms through a sliding
//! window of 1,024 unconfirmed, no database in the way; what the relay is compared
//! with. `raw_confirm_batched`: the same in batches of the relay's size, each
//! batch's confirms all awaited before the next is published; what a relay that
//! does not publish the next batch during the previous one's confirm tail could
//! reach at most (the ceiling of a relay without that overlap).

use std::time::Instant;

use anyhow::Context as _;
use lapin::options::{BasicPublishOptions, ConfirmSelectOptions};
use lapin::{BasicProperties, Confirmation};

use crate::bench::{Bench, EXCHANGE};
use crate::cpu;

impl Bench {
    /// Publishes `n` messages with confirms through a sliding window of 1,024
    /// unconfirmed publishes (a new publish for each confirm), the most the broker
    /// does on its own; returns the rate and the CPU per message.
    pub(crate) async fn raw_confirm(
        &mut self,
        n: usize,
    ) -> anyhow::Result<(f64, cpu::CpuPerMessage)> {
        self.raw_confirm_in(n, Window::Sliding(1024)).await
    }

    /// Publishes `n` messages with confirms in batches of `batch`, every confirm of
    /// a batch awaited before the next batch is published.
    pub(crate) async fn raw_confirm_batched(
        &mut self,
        n: usize,
        batch: usize,
    ) -> anyhow::Result<(f64, cpu::CpuPerMessage)> {
        self.raw_confirm_in(n, Window::Batches(batch)).await
    }

    async fn raw_confirm_in(
        &mut self,
        n: usize,
        window: Window,
    ) -> anyhow::Result<(f64, cpu::CpuPerMessage)> {
        let (capacity, refill_below) = match window {
            Window::Sliding(w) => (w, w),
            // Refilled only once the whole batch is confirmed.
            Window::Batches(b) => (b, 1),
        };
        let ch = self.amqp.create_channel().await?;
        ch.confirm_select(ConfirmSelectOptions::default()).await?;
        let body = vec![b'x'; 1024];
        let cpu_before = cpu::sample();
        let started = Instant::now();
        let mut in_flight = std::collections::VecDeque::with_capacity(capacity);
        let (mut sent, mut confirmed) = (0, 0);
        while confirmed < n {
            let refill = in_flight.len() < refill_below;
            while refill && sent < n && in_flight.len() < capacity {
                in_flight.push_back(
                    ch.basic_publish(
                        EXCHANGE.into(),
                        "k".into(),
                        BasicPublishOptions {
                            mandatory: true,
                            ..BasicPublishOptions::default()
                        },
                        &body,
                        BasicProperties::default().with_delivery_mode(2),
                    )
                    .await?,
                );
                sent += 1;
            }
            let oldest = in_flight.pop_front().context("a publish in flight")?;
            anyhow::ensure!(
                matches!(oldest.await?, Confirmation::Ack(None)),
                "raw publish not confirmed"
            );
            confirmed += 1;
        }
        let rate = n as f64 / started.elapsed().as_secs_f64();
        let cpu = cpu::per_message(cpu_before, cpu::sample(), n as u64);
        self.purge().await?;
        Ok((rate, cpu))
    }
}

/// How many publishes may wait for their confirms.
#[derive(Clone, Copy)]
enum Window {
    /// Up to this many; one published for each confirm.
    Sliding(usize),
    /// Batches of this many; the next batch once every confirm of this one is in.
    Batches(usize),
}
