//! The billing consumer of the example shop: one invoice per order, exactly once.
//! Runs until SIGINT or SIGTERM. `BILLING_FAIL_FIRST_PERCENT` fails the first attempt
//! of that share of orders; `BILLING_POISON_ORDERS` (comma-separated ids) never bill;
//! `BILLING_SWEEP_INTERVAL` (e.g. `2s`) sets the consume-retry sweep interval;
//! `BILLING_RETENTION_CONSUMED_AFTER` (e.g. `1h`, the least) the inbox retention's age;
//! `BILLING_METRICS_ADDR` serves `/metrics`.

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    outbox_examples::billing::main_from_env().await
}
