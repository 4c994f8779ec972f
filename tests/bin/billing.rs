//! The example billing consumer, built inside this package so its tests can run it
//! (`CARGO_BIN_EXE_outbox-e2e-billing`).

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    outbox_examples::billing::main_from_env().await
}
