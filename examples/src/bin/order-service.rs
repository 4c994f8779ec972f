//! The order service of the example shop: `setup` creates tables and topology,
//! `create --count N` writes N orders, each with its `order.created` message in the
//! same transaction (`--roll-back-every K` rolls every K-th one back instead).

#![allow(clippy::print_stdout)] // the created message ids are the program's output

use clap::{Parser, Subcommand};
use outbox_examples::{Shop, orders};

#[derive(Parser)]
#[command(about = "Example order service: orders and their messages, one transaction each")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Create the tables (business, outbox, inbox) and the broker topology.
    Setup,
    /// Create orders.
    Create {
        /// How many.
        #[arg(long, default_value_t = 10)]
        count: i64,
        /// First order id.
        #[arg(long, default_value_t = 1)]
        first_id: i64,
        /// Roll back every K-th transaction (0: never).
        #[arg(long, default_value_t = 0)]
        roll_back_every: i64,
    },
}

use tracing::Instrument as _;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let telemetry = outbox_examples::telemetry("order-service")?;
    let result = run(cli).await;
    // Short commands too: the spans of `create` go out before the process ends.
    telemetry.shutdown().await;
    result
}

async fn run(cli: Cli) -> anyhow::Result<()> {
    let shop = Shop::from_env()?;
    let pool = shop.pool().await?;
    match cli.command {
        Command::Setup => {
            shop.setup(&pool).await?;
            eprintln!(
                "shop ready: schema {}, outbox schema {}, queue {}",
                shop.schema, shop.outbox_schema, shop.queue
            );
        }
        Command::Create {
            count,
            first_id,
            roll_back_every,
        } => {
            let (mut committed, mut rolled_back) = (0, 0);
            for id in first_id..first_id + count {
                let roll_back = roll_back_every > 0 && id % roll_back_every == 0;
                // Each order in a span of its own: the enqueue's `create` span and
                // the message's trace hang under it.
                let span = tracing::info_span!("place order", order.id = id);
                let message_id = orders::create(&shop, &pool, id, 100 + id % 10_000, roll_back)
                    .instrument(span)
                    .await?;
                if roll_back {
                    rolled_back += 1;
                } else {
                    committed += 1;
                    println!("{message_id}");
                }
            }
            eprintln!("orders: {committed} committed, {rolled_back} rolled back");
        }
    }
    Ok(())
}
