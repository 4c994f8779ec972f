//! `raw_confirm`: RabbitMQ on its own, publishes with confirms through a sliding
//! window of 1,024 unconfirmed, no database in the way; what the relay is compared
//! with.

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
        const WINDOW: usize = 1024;
        let ch = self.amqp.create_channel().await?;
        ch.confirm_select(ConfirmSelectOptions::default()).await?;
        let body = vec![b'x'; 1024];
        let cpu_before = cpu::sample();
        let started = Instant::now();
        let mut in_flight = std::collections::VecDeque::with_capacity(WINDOW);
        let (mut sent, mut confirmed) = (0, 0);
        while confirmed < n {
            while sent < n && in_flight.len() < WINDOW {
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
