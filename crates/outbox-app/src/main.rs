//! The `outbox` command.

use std::io::IsTerminal as _;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context as _;
use clap::{Args, Parser, Subcommand};
use outbox_app::demo::{self, DemoOptions};
use tracing_subscriber::EnvFilter;

/// Transactional outbox, idempotent inbox and retry relay for RabbitMQ.
#[derive(Debug, Parser)]
#[command(
    name = "outbox",
    version,
    about = "Transactional outbox, idempotent inbox and retry relay for RabbitMQ"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the whole flow on in-memory adapters with injected faults, and print a
    /// one-line summary.
    Demo(DemoArgs),
}

#[derive(Debug, Args)]
struct DemoArgs {
    /// Messages to enqueue.
    #[arg(long, default_value_t = 1000)]
    messages: u64,
    /// Publishes that fail as on a lost connection.
    #[arg(long, default_value_t = 50)]
    publish_failures: u64,
    /// Publishes the broker nacks.
    #[arg(long, default_value_t = 20)]
    nacks: u64,
    /// Publishes the broker returns as unroutable.
    #[arg(long, default_value_t = 10)]
    returns: u64,
    /// Share of messages whose handler fails on its first attempt.
    #[arg(long, default_value_t = 0.05)]
    handler_failure_rate: f64,
    /// Acknowledgements lost, so the broker delivers those messages twice.
    #[arg(long, default_value_t = 25)]
    redeliveries: u64,
    /// Messages whose handler always fails; they end dead.
    #[arg(long, default_value_t = 0)]
    poison: u64,
    /// Seed of the random choices.
    #[arg(long, default_value_t = 7)]
    seed: u64,
    /// Give up after this long (e.g. 60s).
    #[arg(long, default_value = "60s", value_parser = outbox_core::duration::parse)]
    timeout: Duration,
    /// Hide the progress bar.
    #[arg(long)]
    quiet: bool,
}

fn init_logging(default: &str) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .init();
}

#[allow(clippy::print_stdout)]
fn main() -> ExitCode {
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result: anyhow::Result<ExitCode> = runtime.block_on(async {
        match cli.command {
            Command::Demo(a) => {
                init_logging("warn");
                let opts = DemoOptions {
                    messages: a.messages,
                    publish_failures: a.publish_failures,
                    nacks: a.nacks,
                    returns: a.returns,
                    handler_failure_rate: a.handler_failure_rate,
                    redeliveries: a.redeliveries,
                    poison: a.poison,
                    seed: a.seed,
                    timeout: a.timeout,
                    progress: !a.quiet,
                };
                let s = demo::run(&opts).await.context("demo failed")?;
                eprintln!(
                    "demo: {} publish failures and {} handler failures retried; {} redeliveries absorbed by the inbox; {} duplicate effects; {} sweeps",
                    s.publish_failures, s.consume_failures, s.duplicates_absorbed, s.duplicate_effects, s.sweeps
                );
                println!("{s}");
                Ok(if s.lost == 0 && s.duplicate_effects == 0 {
                    ExitCode::SUCCESS
                } else {
                    ExitCode::FAILURE
                })
            }
        }
    });
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
